"""Every published SGLang release from 0.5.1 on: its verdict, and for every
affected one, the plugin's wrapper on that release's own method against the
same method with PR #26521's statement inserted.

Which releases: ``SGLANG_HOTFIX_RELEASES`` = ``all`` (default: every release in
the shipped table), ``quick`` (one per code variant, plus the first and last
fixed), or a comma-separated list. Fetched files are cached under
``.cache/releases`` (or ``$SGLANG_HOTFIX_TEST_CACHE/releases``).
"""

import pytest
from packaging.version import Version

import isolated_release
import release_selection
import scan_releases
import variants
from capture_harness import BRANCH_NAMES, compare_with_oracle
from upstream_fix import upstream_fixed_method
from sglang_hotfix_trtllm import detect, engine, patch
from sglang_hotfix_trtllm.records import pr26521
from sglang_hotfix_trtllm.record import Verdict

HOTFIX = pr26521.HOTFIX
QUICK = ("0.5.1", "0.5.3", "0.5.8.post1", "0.5.9", "0.5.12.post1", "0.5.13", "0.5.23")
TABLE = release_selection.table(HOTFIX)


def expected_verdict(release):
    """REFERENCE.md: 0.5.1 to 0.5.12.post1 carry the bug; 0.5.13 and later are fixed."""
    return Verdict.AFFECTED if Version(release) < Version("0.5.13") else Verdict.FIXED


RELEASES = release_selection.selected(TABLE, QUICK)
AFFECTED = [r for r in RELEASES if expected_verdict(r) is Verdict.AFFECTED]


def test_shipped_table_gives_every_release_its_reference_verdict():
    assert len(TABLE) >= 42, "the shipped release table is missing or short"
    wrong = {r: row["verdict"] for r, row in TABLE.items() if row["verdict"] != expected_verdict(r).value}
    assert wrong == {}
    up_to_0_5_23 = [r for r in TABLE if Version(r) <= Version("0.5.23")]
    assert len(up_to_0_5_23) == 42
    assert sum(TABLE[r]["verdict"] == "affected" for r in up_to_0_5_23) == 29


def test_shipped_table_loads_without_a_problem():
    # A damaged table would read as empty (detection still works from the source);
    # here it must fail loudly.
    assert HOTFIX.known_fingerprints.problem is None and len(HOTFIX.known_fingerprints) >= 4


def test_shipped_table_covers_every_published_release_it_could_know():
    newest = max(TABLE, key=Version)
    published = [r for r in scan_releases.list_releases() if Version(r) <= Version(newest)]
    assert sorted(set(published) - set(TABLE), key=Version) == []


@pytest.mark.parametrize("release", RELEASES)
def test_release_gets_its_verdict_from_its_own_source(release):
    path = release_selection.release_dir(release) / isolated_release.BACKEND
    assessment = detect.assess_source(HOTFIX, str(path))
    assert assessment.verdict is expected_verdict(release), assessment.reason
    assert release in assessment.known_releases
    assert assessment.fingerprint == TABLE[release]["fingerprint"]


@pytest.mark.parametrize("release", AFFECTED)
def test_wrapped_release_method_equals_its_upstream_fix(release):
    module = isolated_release.load_backend_module(release_selection.release_dir(release))
    cls = module.TRTLLMHAAttnBackend
    original = cls.__dict__["init_forward_metadata_capture_cuda_graph"]
    oracle = upstream_fixed_method(module)
    # The plugin's real path: the engine's handler, as the import hook calls it.
    assert engine.handle(HOTFIX, module) == "patched"
    assert patch.is_patched(HOTFIX, cls)
    try:
        written, mismatches, unpatched_differs = compare_with_oracle(cls, module.ForwardMode, oracle, original)
    finally:
        patch.remove_all()
    assert cls.__dict__["init_forward_metadata_capture_cuda_graph"] is original
    assert written == BRANCH_NAMES and mismatches == []
    assert unpatched_differs == {"draft_decode": 30, "idle_draft_decode": 30}


@pytest.mark.parametrize("release", AFFECTED)
def test_each_releases_hand_made_variants_get_the_verdict_their_code_earns(release):
    text = (release_selection.release_dir(release) / isolated_release.BACKEND).read_text(encoding="utf-8")

    def verdict(source_text):
        return detect.assess_source(HOTFIX, "trtllm_mha_backend.py", text=source_text).verdict

    assert verdict(variants.fixed_source_text(text)) is Verdict.FIXED
    for variant in (
        variants.with_renamed_key,
        variants.without_draft_branch,
        variants.with_extra_write,
        variants.with_write_after_use,
    ):
        assert verdict(variant(text)) is Verdict.UNKNOWN, variant.__name__
    # The live definition decides (Python binds the last one).
    for live, expected in (("buggy", Verdict.AFFECTED), ("fixed", Verdict.FIXED)):
        assert verdict(variants.with_method_defined_twice(text, live)) is expected, ("method", live)
        assert verdict(variants.with_class_defined_twice(text, live)) is expected, ("class", live)
    for name, rebinding in variants.REBINDINGS.items():
        assert verdict(rebinding(text)) is Verdict.UNKNOWN, name
    # Any other write to the buffer, and anything merely similar to upstream's statement.
    for name, statement in variants.OTHER_WRITES.items():
        assert verdict(variants.with_extra_write(text, statement)) is Verdict.UNKNOWN, name


# Issue 37 item 5: pre-releases that ship the backend (every version on the package index was
# looked at; none before 0.5.0rc0 ships it). 0.5.2rc0 to 0.5.2rc2, 0.5.3rc0 and 0.5.3rc2 hold the code
# of a release (0.5.1 … 0.5.2, 0.5.3) and get its answer; 0.5.0rc0 to rc2 and 0.5.10rc0 hold code no
# release has, and the README says they are not covered: record -> verdict as `status --source`
# gives it, with the exit status.
PRE_RELEASES = {
    # no draft decode, its own kernel arguments (max_seq_len_k): pr26521, pr28144, pr17732 and
    # encoder_only_mask unknown, nothing patched
    "0.5.0rc2": (
        {"pr26521": "unknown", "pr28144": "unknown", "pr17732": "unknown", "encoder_only_mask": "unknown"},
        2,
    ),
    # 0.5.10's methods but forward_decode without one argument: pr28144 unknown, pr26521/pr25103 patched
    "0.5.10rc0": ({"pr26521": "affected", "pr25103": "affected", "pr28144": "unknown"}, 2),
    # 0.5.1's code: 0.5.1's answer
    "0.5.2rc0": ({"pr26521": "affected", "pr28144": "affected", "pr17732": "affected"}, 1),
}


@pytest.mark.parametrize("release", sorted(PRE_RELEASES))
def test_a_pre_release_shipping_the_backend_gets_what_the_readme_says(release):
    import json
    import subprocess
    import sys

    expected, code = PRE_RELEASES[release]
    path = release_selection.release_dir(release) / isolated_release.BACKEND
    ran = subprocess.run(
        [sys.executable, "-m", "sglang_hotfix_trtllm", "status", "--source", str(path), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd="/",
    )
    document = json.loads(ran.stdout)
    verdicts = {r["hotfix"]: r["verdict"] for r in document["hotfixes"]}
    assert ran.returncode == code, document["headline"]
    assert {name: verdicts[name] for name in expected} == expected
    others = set(verdicts) - set(expected)
    assert {verdicts[name] for name in others} <= {"not-applicable", "fixed", "unrepairable"}
