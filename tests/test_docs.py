"""The docs cannot go stale (issue 30, items 1, 8 and 9): every list of records, release range,
verdict, count and version string they state is generated from the catalog and the shipped
release tables (``tools/docs_tables.py``), or checked here against them."""

import configparser
import re
import subprocess
import sys

import pytest
from packaging.version import Version

import docs_tables
import release_selection
import scan_releases
import sglang_hotfix_trtllm
from conftest import REPO
from sglang_hotfix_trtllm import detect
from sglang_hotfix_trtllm.record import Verdict
from sglang_hotfix_trtllm.records import catalog

NAMES = [hotfix.name for hotfix in catalog.HOTFIXES]
# The records that patch some release (a record that only reported would log no "patched" line and
# export no sample; since 0.14.0 every record patches some release).
PATCHING = [h.name for h in catalog.HOTFIXES if any(row["verdict"] == "affected" for row in h.known_fingerprints.rows)]
# A record's name: an upstream pull request's number (pr26521), the fix's own name where the
# pull request was not found (xqa_workspace, encoder_only_mask, xqa_draft_extend), or FlashInfer's
# pull request's number for a bug of FlashInfer's own kernels (flashinfer4161).
RECORD_ID = re.compile(r"\b(?:pr\d{5}|flashinfer\d{4}|xqa_workspace|encoder_only_mask|xqa_draft_extend)\b")
# The records of FlashInfer's own kernel bugs: reported, never patched.
KERNEL_BUGS = [h.name for h in catalog.HOTFIXES if h.flashinfer_fix is not None]


def read(page):
    return (REPO / page).read_text(encoding="utf-8")


def section(text, heading):
    """The text of a ``## heading`` section, up to the next one."""
    start = text.index("\n## " + heading)
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


@pytest.mark.parametrize("page", docs_tables.PAGES)
def test_every_generated_block_is_what_the_tool_writes(page):
    text = read(page)
    assert docs_tables.rendered(text, docs_tables.blocks()) == text, (
        "%s is stale: run `python tools/docs_tables.py`" % page
    )


def test_every_generated_block_has_a_place_in_the_docs():
    pages = "".join(read(page) for page in docs_tables.PAGES)
    missing = [name for name in docs_tables.blocks() if "<!-- %s:begin -->" % name not in pages]
    assert missing == []


def test_the_tables_cover_every_record_of_the_catalog():
    assert [hotfix.name for hotfix in docs_tables.records()] == NAMES
    for hotfix in catalog.HOTFIXES:
        assert hotfix.known_fingerprints.problem is None and len(hotfix.known_fingerprints) > 0, hotfix.name


RELEASES = release_selection.selected(
    docs_tables.verdicts_by_release(), ("0.5.1", "0.5.9", "0.5.11", "0.5.13", "0.5.14", "0.5.16", "0.5.23")
)


@pytest.mark.parametrize("release", RELEASES)
def test_the_status_table_is_what_status_says_on_the_releases_own_source(release):
    """Item 1: the README's advice came from one record's table. Each release's verdicts as
    `status --source` gives them, from the release's own file, and the first line status's own
    code makes of them, equal what the generated table states."""
    path = str(release_selection.release_dir(release) / "sglang/srt/layers/attention/trtllm_mha_backend.py")
    pin = docs_tables.flashinfer_pins()[release]
    with detect.shared_parses():
        live = {hotfix.name: detect.assess_source(hotfix, path).verdict for hotfix in catalog.HOTFIXES}
    for hotfix in catalog.HOTFIXES:
        # a FlashInfer kernel bug the code reaches: what the release's own FlashInfer makes of it (`status
        # --source` judges it with the FlashInfer beside the file: none beside the release's cached file)
        if hotfix.flashinfer_fix is not None and live[hotfix.name] is Verdict.UNREPAIRABLE:
            live[hotfix.name] = scan_releases.with_pin(hotfix, pin)[0]
    live = {name: verdict.value for name, verdict in live.items()}
    # a repair that needs something of FlashInfer (nothing beside the cached file: judged repairable):
    # the table's version rule for the pin, which test_encoder_only_mask holds to what the product
    # reads from the real 0.6.8.post1 and 0.6.11.post1
    for hotfix in catalog.HOTFIXES:
        live[hotfix.name] = docs_tables.with_pinned_flashinfer(hotfix, live[hotfix.name], pin)
    assert live == docs_tables.verdicts_by_release()[release]
    line, code = docs_tables.status_first_line(release, live)
    (row,) = [key for group, key in docs_tables.status_rows() if release in group]
    assert (line.split(":")[0], code) == (row[0], row[3])


def test_the_removal_advice_names_the_release_from_which_status_says_nothing_to_do():
    advice = section(read("README.md"), "Removing it")
    first = docs_tables.removable_from()
    assert first is not None
    assert "SGLang %s or later" % first in advice
    later = [r for r in docs_tables.releases() if Version(r) >= Version(first)]
    assert all(
        status_word == "NOTHING TO DO"
        for group, (status_word, _, _, _, _) in docs_tables.status_rows()
        if set(group) & set(later)
    )


def test_the_dockerfile_recipe_passes_on_every_release_where_everything_repairable_is_repaired():
    """Issue 48, item 2: the recipe (`&& sglang-hotfix-trtllm status`) failed the build on 35 of the
    table's 42 releases, every one where a bug is reported, not repaired, and the advice to turn
    those records off made encoder_only_mask run unpatched where it is repaired. The recipe now
    accepts, by name, exactly the records reported somewhere; with it every row of the table exits
    0 (status's own code), and without it the rows with a reported bug still exit 1."""
    recipe = section(read("README.md"), "Install")
    (accepted,) = re.findall(r"sglang-hotfix-trtllm status --accept ([a-z0-9_,]+)", recipe)
    assert accepted.split(",") == docs_tables.reported_somewhere()
    rows = docs_tables.status_rows()
    assert all(accepted_code == 0 for _, (_, _, _, _, accepted_code) in rows)
    assert all(code == (1 if reported else 0) for _, (_, _, reported, code, _) in rows)
    assert "SGLANG_HOTFIX_TRTLLM_DISABLE=encoder_only_mask" not in read("README.md")


def test_the_readme_says_who_needs_each_record():
    who = section(read("README.md"), "What it fixes, and who needs it")
    assert re.findall(r"^\* `([a-z][a-z0-9_]*)`", who, re.M) == NAMES


def test_the_readme_is_short():
    assert len(read("README.md").splitlines()) <= 300


def test_the_switches_table_names_every_record():
    row = next(line for line in read("README.md").splitlines() if "turn off the records named" in line)
    assert RECORD_ID.findall(row.split("comma-separated:")[1]) == NAMES


def test_the_readmes_examples_show_one_line_per_record():
    shown = section(read("README.md"), "Am I protected?")
    # SGLang's logging set-up shows the message ("sglang-hotfix-trtllm: patched"), the hotfix's own
    # fallback its format ("sglang-hotfix-trtllm INFO: patched"): both name the package.
    log_lines = [line for line in shown.splitlines() if re.search(r"sglang-hotfix-trtllm(:| INFO:) patched", line)]
    # one line per record; a real server's lines come in the order its records ran, so order is not asked
    assert sorted(next(h.name for h in catalog.HOTFIXES if h.effect in line) for line in log_lines) == sorted(PATCHING)
    samples = re.findall(r'sglang_hotfix_trtllm_applied\{.*record="([a-z][a-z0-9_]*)"', shown)
    assert samples == PATCHING
    assert set(NAMES) - set(PATCHING) == set(KERNEL_BUGS)  # FlashInfer's kernel bugs are only reported
    (first_line,) = re.findall(r"^PROTECTED: SGLang 0\.5\.12 has the bugs of records ([^;]+);", shown, re.M)
    assert first_line.split(", ") == [
        name for name, verdict in docs_tables.verdicts_by_release()["0.5.12"].items() if verdict == "affected"
    ]


@pytest.mark.parametrize(
    "where, text",
    [
        ("setup.cfg's summary (pip show)", lambda: _setup_cfg()["metadata"]["description"]),
        ("the package docstring", lambda: sglang_hotfix_trtllm.__doc__),
        (
            "docs/reference.md's hotfix key",
            lambda: next(row for row in read("docs/reference.md").splitlines() if row.startswith("| `hotfix` |")),
        ),
        ("docs/development.md", lambda: read("docs/development.md").split("## Refreshing the release table")[1]),
    ],
)
def test_texts_that_are_not_generated_name_no_list_of_records(where, text):
    """Item 8: each of these named the first two records long after a third came."""
    assert RECORD_ID.findall(text()) == [] or set(RECORD_ID.findall(text())) >= set(NAMES), where


def _setup_cfg():
    parser = configparser.ConfigParser()
    parser.read(REPO / "setup.cfg")
    return parser


def test_version_strings_are_the_packages():
    version = sglang_hotfix_trtllm.__version__
    wheels = set(re.findall(r"sglang_hotfix_trtllm-([0-9][^-]*)-py3-none-any\.whl", read("README.md")))
    assert wheels == {version}
    released = re.findall(r"^## \[(\d[^\]]*)\]", read("CHANGELOG.md"), re.M)
    assert released[0] == version


def test_no_count_of_records_or_bugs_in_words():
    """A number of records written as a word goes stale with the next record (item 8: "two")."""
    words = r"\b(one|two|three|four|five|six|seven|eight)\s+(records|bugs|fixes)\b"
    for page in ("README.md", "docs/reference.md", "docs/design.md", "docs/development.md", "docs/records.md"):
        assert re.findall(words, read(page), re.I) == [], page


def test_the_time_of_status_is_quoted_in_one_place():
    """Item 8: 0.2 s, 0.095 s and 0.115 s in three pages. The figure lives in docs/costs.md."""
    for page in ("README.md", "docs/reference.md"):
        assert (
            re.findall(
                r"\b\d+\.\d+ s\b",
                section(
                    read(page),
                    "Am I protected?" if page == "README.md" else "Log lines, `status`, `/metrics`, `verify`",
                ),
            )
            == []
        ), page
    assert re.search(
        r"`sglang-hotfix-trtllm status --json` \(every record of %s" % re.escape(sglang_hotfix_trtllm.__version__),
        read("docs/costs.md"),
    )


def test_the_fault_matrix_count_is_what_pytest_collects():
    files = [
        "tests/test_faults.py",
        "tests/test_faults_trust.py",
        "tests/test_faults_composition.py",
        "tests/test_faults_routes.py",
    ]
    stated = re.search(r"\((\d+) cases as `pytest --collect-only` counts\s+them", read("docs/faults.md"))
    assert stated, "docs/faults.md no longer states the count the way this test reads it"
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist"] + files,
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=600,
    )
    count = re.search(r"(\d+) tests? collected", collected.stdout)
    assert count, collected.stdout[-2000:]
    assert int(stated.group(1)) == int(count.group(1))


def test_the_install_section_opens_with_a_quick_start():
    """Issue 37 item 9: build the wheel, install it, check; the container caveat and the upgrade."""
    install = section(read("README.md"), "Install")
    first_block = install.split("```")[1].strip().splitlines()
    assert [line.split()[:2] for line in first_block] == [
        ["pip", "wheel"],
        ["pip", "install"],
        ["sglang-hotfix-trtllm", "status"],
    ]
    wheel = "dist/sglang_hotfix_trtllm-%s-py3-none-any.whl" % sglang_hotfix_trtllm.__version__
    assert wheel in first_block[0] and first_block[1].split()[2] == wheel
    assert "To upgrade" in install and "gone when the container is recreated" in install
