"""Issue 50, item 3: the records of FlashInfer's own kernel bugs, flashinfer4161 (multi-block XQA
output race, first fixed in FlashInfer 0.6.17) and flashinfer4382 (TRT-LLM-GEN separate reduction,
first fixed in 0.6.18). Recognised, never patched; docs/records.md says who each concerns.

Verdicts: whether the release's code reaches the kernel path, from its own source (XQA decode:
``__init__`` sets ``is_xqa_impl``; target verify on the decode kernel), then the FlashInfer that
runs: the shipped tables with each release's pin (its metadata's, checked here against the index),
``status`` with the files of real FlashInfer releases installed beside a real SGLang release.
``status --pid`` names the FlashInfer the process imported.
"""

import ast
import shutil
import subprocess
import sys

import pytest
from packaging.version import Version

import flashinfer_cases
import release_selection
import scan_releases
from conftest import clean_env, run_cli, status_json
from sglang_hotfix_trtllm import detect, flashinfer_install
from sglang_hotfix_trtllm.record import Verdict
from sglang_hotfix_trtllm.records import catalog, flashinfer4161, flashinfer4382

BACKEND = "sglang/srt/layers/attention/trtllm_mha_backend.py"
# What SGLang's metadata pins (Requires-Dist: flashinfer_python==X; 0.5.1 to 0.5.2 in the srt extra),
# read from the index for every release: the facts the tables' verdicts rest on.
PINS = {
    "0.5.1": "0.2.11.post3",
    "0.5.1.post1": "0.2.11.post3",
    "0.5.1.post2": "0.2.14.post1",
    "0.5.1.post3": "0.2.14.post1",
    "0.5.2": "0.3.1",
    "0.5.3": "0.4.0rc3",
    "0.5.3.post1": "0.4.0",
    "0.5.3.post2": "0.4.0",
    "0.5.3.post3": "0.4.0",
    "0.5.4": "0.4.1",
    "0.5.4.post1": "0.4.1",
    "0.5.4.post2": "0.4.1",
    "0.5.4.post3": "0.5.0",
    "0.5.5": "0.5.0",
    "0.5.5.post1": "0.5.0",
    "0.5.5.post2": "0.5.0",
    "0.5.5.post3": "0.5.2",
    "0.5.6": "0.5.3",
    "0.5.6.post1": "0.5.3",
    "0.5.6.post2": "0.5.3",
    "0.5.7": "0.5.3",
    "0.5.8": "0.6.1",
    "0.5.8.post1": "0.6.1",
    "0.5.9": "0.6.3",
    "0.5.10": "0.6.7.post2",
    "0.5.10.post1": "0.6.7.post3",
    "0.5.11": "0.6.8.post1",
    "0.5.12": "0.6.11.post1",
    "0.5.12.post1": "0.6.11.post1",
    "0.5.13": "0.6.12",
    "0.5.13.post1": "0.6.12",
    "0.5.14": "0.6.12",
    "0.5.15": "0.6.12",
    "0.5.15.post1": "0.6.12",
    "0.5.16": "0.6.14",
    "0.5.17": "0.6.15.post1",
    "0.5.18": "0.6.17",
    "0.5.19": "0.6.18",
    "0.5.20": "0.6.18",
    "0.5.21": "0.6.18",
    "0.5.22": "0.7.1",
    "0.5.23": "0.7.2",
}
# record -> (first release whose code reaches the kernel path, first FlashInfer with the fix)
FACTS = {
    flashinfer4161: ("0.5.10", "0.6.17"),  # XQA decode on SM90/SM120 (is_xqa_impl) from 0.5.10
    flashinfer4382: ("0.5.6", "0.6.18"),  # target verify on the decode kernel from 0.5.6
}
RECORDS = {record.NAME: record for record in FACTS}


def reaches(record, release):
    return Version(release) >= Version(FACTS[record][0])


def expected_verdict(record, release):
    if not reaches(record, release):
        return Verdict.NOT_APPLICABLE
    return Verdict.FIXED if Version(PINS[release]) >= Version(FACTS[record][1]) else Verdict.UNREPAIRABLE


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_shipped_table_gives_every_release_its_verdict_with_its_own_flashinfer(name):
    record = RECORDS[name]
    table = release_selection.table(record.HOTFIX)
    assert record.HOTFIX.known_fingerprints.problem is None
    assert len([r for r in table if Version(r) <= Version("0.5.23")]) == 42
    assert {r: row["flashinfer"] for r, row in table.items()} == PINS
    wrong = {r: row["verdict"] for r, row in table.items() if row["verdict"] != expected_verdict(record, r).value}
    assert wrong == {}


def test_the_releases_with_each_bug_are_those_the_issue_names():
    """flashinfer4161: from XQA decode on SM90 (0.5.10) while the pin is older than 0.6.17 (0.5.17);
    flashinfer4382: from target verify on the decode kernel (0.5.6) to 0.5.18 (0.5.19 pins 0.6.18)."""
    spans = {
        name: [r for r, row in release_selection.table(record.HOTFIX).items() if row["verdict"] == "unrepairable"]
        for name, record in RECORDS.items()
    }
    assert (spans["flashinfer4161"][0], spans["flashinfer4161"][-1]) == ("0.5.10", "0.5.17")
    assert (spans["flashinfer4382"][0], spans["flashinfer4382"][-1]) == ("0.5.6", "0.5.18")


QUICK = ("0.5.5.post3", "0.5.6", "0.5.9", "0.5.10", "0.5.12", "0.5.17", "0.5.18", "0.5.19", "0.5.23")


@pytest.mark.parametrize("name", sorted(RECORDS))
@pytest.mark.parametrize("release", release_selection.selected(PINS, QUICK))
def test_release_reaches_the_kernel_path_by_its_own_source(name, release):
    """The code alone (`status --source`): unrepairable wherever the route is there, whatever the
    pin (a file judged alone has no FlashInfer); the pin then gives the table's verdict."""
    record = RECORDS[name]
    assessment = detect.assess_source(record.HOTFIX, str(release_selection.release_dir(release) / BACKEND))
    route = Verdict.UNREPAIRABLE if reaches(record, release) else Verdict.NOT_APPLICABLE
    assert assessment.verdict is route, assessment.reason
    assert assessment.fingerprint == release_selection.table(record.HOTFIX)[release]["fingerprint"]
    if route is Verdict.UNREPAIRABLE:
        assert "FlashInfer %s" % FACTS[record][1] in assessment.reason and "upgrade FlashInfer" in assessment.reason
        assert scan_releases.with_pin(record.HOTFIX, PINS[release])[0] is expected_verdict(record, release)


@pytest.mark.parametrize("release", ("0.5.1", "0.5.12", "0.5.18", "0.5.23"))
def test_the_pins_are_read_from_the_releases_metadata(tmp_path, release):
    """The scan reads each release's pin from its metadata on the index (nothing installed)."""
    (tmp_path / release).mkdir()
    assert scan_releases.pinned_flashinfer(tmp_path, release) == PINS[release]
    assert (tmp_path / release / "flashinfer-pin").read_text() == PINS[release]


@pytest.mark.parametrize(
    "version, first, newer",
    [
        ("0.6.17", "0.6.17", True),
        ("0.6.16", "0.6.17", False),
        ("0.6.15.post1", "0.6.17", False),
        ("0.6.17.post1", "0.6.17", True),
        ("0.7.0rc2", "0.6.18", True),
        ("0.6.17rc1", "0.6.17", None),  # a pre-release of the fixing release: cannot tell
        ("0.6.17.dev3", "0.6.17", None),
        ("0.6.16+cu130", "0.6.17", False),
        ("0.10.0", "0.6.17", True),  # not a string comparison
        (None, "0.6.17", None),
        ("main", "0.6.17", None),
    ],
)
def test_flashinfer_versions_compare_as_releases(version, first, newer):
    assert flashinfer_install.has_release(version, first) is newer


def _environment(tmp_path, release, flashinfer):
    """SGLang ``release``'s files with FlashInfer ``flashinfer``'s (None: no FlashInfer), for PYTHONPATH."""
    environment = tmp_path / "site"
    shutil.copytree(release_selection.release_dir(release), environment)
    if flashinfer:
        shutil.copytree(flashinfer_cases.flashinfer_dir(flashinfer), environment, dirs_exist_ok=True)
    for package in ("sglang", "sglang/srt", "sglang/srt/layers", "sglang/srt/layers/attention"):
        (environment / package / "__init__.py").touch()  # a regular package, found before the venv's 0.5.12
    return environment


def test_a_flashinfer_that_cannot_be_read_is_named_with_why_and_no_folder(tmp_path):
    """A FlashInfer whose package cannot be read (here a folder without ``__init__.py``, with 0.6.16's
    metadata) is there: its verdicts come from its version, and ``status`` says why it cannot be
    read, in ``flashinfer_problem``. ``flashinfer_location`` stays what reference.md says it is, a
    folder or null (0.16.2 put the reason there)."""
    environment = _environment(tmp_path, "0.5.12", "0.6.16")
    (environment / "flashinfer" / "__init__.py").unlink()
    ran = status_json(env=clean_env(PYTHONPATH=str(environment)))
    report = ran.report
    why = "flashinfer is a namespace package (a folder without __init__.py)"
    assert (report["flashinfer_version"], report["flashinfer_location"]) == ("0.6.16", None), report
    assert report["flashinfer_problem"] == why
    got = {r["hotfix"]: r for r in report["hotfixes"]}
    assert got["flashinfer4161"]["verdict"] == "unrepairable"
    reason = got["flashinfer4161"]["reason"]
    assert reason.startswith("FlashInfer 0.6.16 (%s) has the bug;" % why), reason
    assert ran.returncode == 1
    plain = run_cli("status", env=clean_env(PYTHONPATH=str(environment)))
    assert "FlashInfer 0.6.16 (%s)" % why in plain.stdout, plain.stdout


def test_an_unreadable_flashinfers_tile_counter_is_told_by_its_version_alone():
    from sglang_hotfix_trtllm.flashinfer_install import Installed, fmha_v2_leaves_its_tile_counter

    def told(version):
        return fmha_v2_leaves_its_tile_counter(Installed(version, None, problem="flashinfer is a namespace package"))

    assert told("0.7.1") == (
        True,
        "FlashInfer 0.7.1 (flashinfer is a namespace package), by its version (no fmha_v2 source read)",
    )
    assert told("0.7.2")[0] is False
    assert told(None) == (
        None,
        "FlashInfer (version unknown) (flashinfer is a namespace package): "
        "no fmha_v2 source read and no version to read",
    )
    assert fmha_v2_leaves_its_tile_counter(Installed(None, None)) == (None, "FlashInfer is not installed")


@pytest.mark.parametrize(
    "flashinfer, verdicts",
    [
        ("0.6.16", {"flashinfer4161": "unrepairable", "flashinfer4382": "unrepairable"}),
        ("0.6.17", {"flashinfer4161": "fixed", "flashinfer4382": "unrepairable"}),
        ("0.6.18", {"flashinfer4161": "fixed", "flashinfer4382": "fixed"}),
        (None, {"flashinfer4161": "not-applicable", "flashinfer4382": "not-applicable"}),
    ],
)
def test_status_on_0_5_12_judges_the_installed_flashinfer(tmp_path, flashinfer, verdicts):
    """SGLang 0.5.12 (both routes there) with the files of real FlashInfer releases: each record's
    verdict is the installed FlashInfer's, said with its version; a reported bug fails the check
    (exit 1) unless accepted by name, and an accepted one is still named."""
    environment = _environment(tmp_path, "0.5.12", flashinfer)
    ran = status_json(env=clean_env(PYTHONPATH=str(environment)))
    report = ran.report
    got = {r["hotfix"]: r for r in report["hotfixes"] if r["hotfix"] in verdicts}
    assert {name: r["verdict"] for name, r in got.items()} == verdicts, report
    reported = [name for name, verdict in verdicts.items() if verdict == "unrepairable"]
    for name, record in got.items():
        assert not record["would_patch"]
        if record["verdict"] == "fixed":
            assert record["reason"].startswith("fixed in the installed FlashInfer %s (" % flashinfer), record
        elif record["verdict"] == "unrepairable":
            assert record["reason"].startswith(
                "FlashInfer %s at %s has the bug;" % (flashinfer, environment / "flashinfer")
            )
            assert "upgrade FlashInfer to %s" % FACTS[RECORDS[name]][1] in record["reason"], record
        else:
            assert record["reason"] == "FlashInfer is not installed: no FlashInfer kernel runs here"
    if reported:
        # (the release's files carry no metadata: "SGLang (version unknown)")
        assert ran.returncode == 1 and report["headline"].startswith("NOT PROTECTED: SGLang "), report["headline"]
        named = ("records " if len(reported) > 1 else "record ") + ", ".join(reported)
        assert ": %s would run unpatched" % named in report["headline"]
        accepted = status_json("--accept", ",".join(reported), env=clean_env(PYTHONPATH=str(environment)))
        assert accepted.returncode == 0, accepted.report["headline"]
        runs = "their bugs run" if len(reported) > 1 else "its bug runs"
        assert "%s: %s unrepaired" % (named, runs) in accepted.report["headline"], accepted.report["headline"]
        # the first line names what accepted them: the argument here, the variable below
        assert accepted.report["headline"].endswith("), accepted by --accept"), accepted.report["headline"]
        by_variable = status_json(
            env=clean_env(PYTHONPATH=str(environment), SGLANG_HOTFIX_TRTLLM_ACCEPT=",".join(reported))
        )
        assert by_variable.returncode == 0, by_variable.report["headline"]
        assert by_variable.report["headline"].endswith("), accepted by SGLANG_HOTFIX_TRTLLM_ACCEPT")
    else:
        assert ran.returncode == 0 and report["headline"].startswith("PROTECTED: SGLang "), report["headline"]


@pytest.mark.parametrize(
    "flashinfer, verdicts",
    [
        ("0.6.16", {"flashinfer4161": "unrepairable", "flashinfer4382": "unrepairable"}),
        ("0.6.18", {"flashinfer4161": "fixed", "flashinfer4382": "fixed"}),
        # none beside the code: which FlashInfer runs with it cannot be told, the bugs stay reported
        (None, {"flashinfer4161": "unrepairable", "flashinfer4382": "unrepairable"}),
    ],
)
def test_status_source_judges_the_flashinfer_beside_the_code(tmp_path, flashinfer, verdicts):
    """``status --source`` on an image's site-packages judges the kernel bugs with the FlashInfer
    installed there (not this Python's), as ``status`` does an installed SGLang. Where none is beside
    the code (a backend file alone, an SGLang installed away from FlashInfer) it cannot tell which
    runs with it: reported, never "all is well"."""
    environment = _environment(tmp_path, "0.5.12", flashinfer)
    alone = tmp_path / "alone" / "trtllm_mha_backend.py"
    alone.parent.mkdir()
    shutil.copyfile(environment / BACKEND, alone)
    for target in (environment, environment / BACKEND, alone):
        if target == alone:
            verdicts = dict.fromkeys(verdicts, "unrepairable")
        ran = status_json("--source", str(target))
        rows = {r["hotfix"]: _one_source(r) for r in ran.report["hotfixes"] if r["hotfix"] in verdicts}
        assert {name: row["verdict"] for name, row in rows.items()} == verdicts, ran.report
        expected = 1 if "unrepairable" in verdicts.values() else 0
        assert ran.returncode == ran.report["exit_status"] == expected, ran.report["headline"]
        if flashinfer is None or target == alone:
            for row in rows.values():
                assert row["reason"].startswith("cannot tell which FlashInfer runs with this code ("), row


def _one_source(row):
    """A record's report on the one backend file a ``status --source`` found (given a folder: under
    ``sources``; given the file: the row itself)."""
    if "sources" not in row:
        return row
    (found,) = row["sources"]
    return found


def test_status_on_0_5_9_reports_only_the_route_it_has(tmp_path):
    """0.5.9 decodes on TRT-LLM-GEN only (no is_xqa_impl): flashinfer4161 is not-applicable even with
    FlashInfer 0.6.16; its target verify reaches the decode kernel: flashinfer4382 is reported."""
    environment = _environment(tmp_path, "0.5.9", "0.6.16")
    ran = status_json(env=clean_env(PYTHONPATH=str(environment)))
    verdicts = {r["hotfix"]: r["verdict"] for r in ran.report["hotfixes"]}
    assert (verdicts["flashinfer4161"], verdicts["flashinfer4382"]) == ("not-applicable", "unrepairable")


def _variant(release, edit):
    tree = ast.parse((release_selection.release_dir(release) / BACKEND).read_text(encoding="utf-8"))
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TRTLLMHAAttnBackend"]
    edit({f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)})
    return tree


def _drop_xqa_choice(methods):
    init = methods["__init__"]
    init.body = [s for s in init.body if "self.is_xqa_impl =" not in ast.unparse(s)]


def _decode_without_kernel(methods):
    for node in ast.walk(methods["forward_decode"]):
        if isinstance(node, ast.Attribute) and node.attr == "trtllm_batch_decode_with_kv_cache":
            node.attr = "another_kernel"


def _verify_without_kernel(methods):
    for node in ast.walk(methods["forward_extend"]):
        if isinstance(node, ast.Attribute) and node.attr == "trtllm_batch_decode_with_kv_cache":
            node.attr = "trtllm_batch_context_with_kv_cache"


@pytest.mark.parametrize(
    "record, edit, verdict",
    [
        (flashinfer4161, _drop_xqa_choice, Verdict.NOT_APPLICABLE),
        (flashinfer4161, _decode_without_kernel, Verdict.UNKNOWN),
        (flashinfer4382, _verify_without_kernel, Verdict.NOT_APPLICABLE),
        (flashinfer4382, _drop_xqa_choice, Verdict.UNREPAIRABLE),  # SM100's route does not need XQA
    ],
)
def test_hand_made_variants_of_0_5_12_get_the_verdict_their_routes_earn(record, edit, verdict):
    assert record.classify(_variant("0.5.12", edit)).verdict is verdict


def test_both_records_are_in_the_catalog_reported_only():
    for record in RECORDS.values():
        assert record.HOTFIX in catalog.HOTFIXES and record.HOTFIX.flashinfer_fix.first == FACTS[record][1]
        rows = record.HOTFIX.known_fingerprints.rows
        assert {row["verdict"] for row in rows} <= {"not-applicable", "unrepairable", "fixed"}


CHILD = """
import sys
import flashinfer  # as SGLang's backend imports it where CUDA is there
import sglang.srt.layers.attention.trtllm_mha_backend
print("ready", flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("imports", [True, False])
def test_status_pid_names_the_flashinfer_the_process_imported(tmp_path, imports):
    """A process that imported FlashInfer (a stand-in of 0.6.16's package, with that release's
    metadata, on its PYTHONPATH) records it, and `status --pid` names it, and its own verdicts come
    from it (0.6.16: both bugs). A process that imported none (none on its path) is answered with
    the FlashInfer installed where `status` runs, labelled as such."""
    site = tmp_path / "site"
    shutil.copytree(flashinfer_cases.flashinfer_dir("0.6.16"), site)
    (site / "flashinfer" / "__init__.py").write_text('__version__ = "0.6.16"\n')
    state = str(tmp_path / "state")
    child_env = clean_env(SGLANG_HOTFIX_TRTLLM_STATE_DIR=state, **({"PYTHONPATH": str(site)} if imports else {}))
    code = CHILD if imports else CHILD.replace("import flashinfer  #", "#")
    process = subprocess.Popen(
        [sys.executable, "-c", code], env=child_env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    asking = clean_env(SGLANG_HOTFIX_TRTLLM_STATE_DIR=state, PYTHONPATH=str(site))  # 0.6.16 "installed" here
    try:
        assert process.stdout.readline().strip() == "ready"
        asked = status_json("--pid", str(process.pid), env=asking)
        report = asked.report
        verdicts = {r["hotfix"]: r["verdict"] for r in report["hotfixes"]}
        assert (report["flashinfer_version"], report["flashinfer_location"]) == ("0.6.16", str(site / "flashinfer"))
        if imports:
            assert report["flashinfer_source"] == "imported", report
            assert (verdicts["flashinfer4161"], verdicts["flashinfer4382"]) == ("unrepairable", "unrepairable")
            assert asked.returncode == 1 and report["headline"].startswith("NOT PROTECTED: process %d" % process.pid)
            said = "FlashInfer 0.6.16 at %s (imported by that process)" % (site / "flashinfer")
        else:
            assert report["flashinfer_source"] == "installed", report
            assert (verdicts["flashinfer4161"], verdicts["flashinfer4382"]) == ("not-applicable", "not-applicable")
            said = "FlashInfer 0.6.16 at %s (the one installed here: that process recorded none it imported)" % (
                site / "flashinfer"
            )
        plain = subprocess.run(
            [sys.executable, "-m", "sglang_hotfix_trtllm", "status", "--pid", str(process.pid)],
            env=asking,
            capture_output=True,
            text=True,
        )
        assert said in plain.stdout.splitlines(), plain.stdout
    finally:
        process.stdin.close()
        process.wait(timeout=60)


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_a_release_whose_pin_cannot_be_read_is_not_called_free_of_the_bug(name):
    """The release tables judge a reached kernel bug with the release's pin: a pin that could not be
    read (not `==`) is "cannot tell", still reported, never "FlashInfer is not installed"."""
    verdict, reason = scan_releases.with_pin(RECORDS[name].HOTFIX, None)
    assert verdict is Verdict.UNREPAIRABLE and reason.startswith("cannot tell"), reason
