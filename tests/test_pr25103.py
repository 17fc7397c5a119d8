"""The second record, pr25103: EAGLE drafts and the sliding-window KV pool.

Every release from the shipped table gets its verdict from its own source;
every affected release's own ``__init__`` and helpers run on SGLang's real
pools (``swa_cases``), unpatched and patched, against SGLang 0.5.13's
``_resolve_swa_kv_pool`` and helpers compiled from the 0.5.13 file. Which
releases: as in test_releases.py (``SGLANG_HOTFIX_RELEASES``).
"""

import gc
import types

import pytest
import torch
from packaging.version import Version

import release_selection
import swa_cases
from conftest import applied_record_names, clean_env, run_python
from sglang_hotfix_trtllm import detect, engine, patch, switches
from sglang_hotfix_trtllm.records import catalog, pr25103
from sglang_hotfix_trtllm.record import Verdict

HOTFIX = pr25103.HOTFIX
TABLE = release_selection.table(HOTFIX)
QUICK = ("0.5.8.post1", "0.5.9", "0.5.12.post1", "0.5.13", "0.5.23")
# The cases where the affected releases read the wrong slots: drafts that own
# their KV pool, on an SWA target.
WRONG_WITHOUT_THE_FIX = {"eagle3_draft", "eagle3_draft_before_0_5_12", "mtp_draft_own_swa_pool"}


def expected_verdict(release):
    """From the sources: SWA handling came to this backend in 0.5.9; 0.5.13 resolves from the active pool."""
    if Version(release) < Version("0.5.9"):
        return Verdict.NOT_APPLICABLE
    return Verdict.AFFECTED if Version(release) < Version("0.5.13") else Verdict.FIXED


RELEASES = release_selection.selected(TABLE, QUICK)
AFFECTED = [r for r in RELEASES if expected_verdict(r) is Verdict.AFFECTED]


def test_shipped_table_gives_every_release_its_verdict():
    assert HOTFIX.known_fingerprints.problem is None
    up_to_0_5_23 = [r for r in TABLE if Version(r) <= Version("0.5.23")]
    assert len(up_to_0_5_23) == 42
    assert {r: TABLE[r]["verdict"] for r in TABLE if TABLE[r]["verdict"] != expected_verdict(r).value} == {}
    assert sorted((r for r in up_to_0_5_23 if TABLE[r]["verdict"] == "affected"), key=Version) == [
        "0.5.9",
        "0.5.10",
        "0.5.10.post1",
        "0.5.11",
        "0.5.12",
        "0.5.12.post1",
    ]


def test_the_catalog_holds_every_record_on_one_watched_module():
    import sglang_hotfix_trtllm_autoload as autoload

    assert [h.name for h in catalog.HOTFIXES] == [
        "pr26521",
        "pr25103",
        "pr28144",
        "pr31667",
        "pr17732",
        "pr19107",
        "xqa_workspace",
        "encoder_only_mask",
        "xqa_draft_extend",
        "flashinfer4161",
        "flashinfer4382",
    ]
    assert autoload.WATCHED_MODULES == {h.module for h in catalog.HOTFIXES} == {HOTFIX.module}


@pytest.mark.parametrize("release", RELEASES)
def test_release_gets_its_verdict_from_its_own_source(release):
    assessment = detect.assess_source(HOTFIX, str(release_selection.release_dir(release) / swa_cases.BACKEND))
    assert assessment.verdict is expected_verdict(release), assessment.reason
    assert release in assessment.known_releases
    assert assessment.fingerprint == TABLE[release]["fingerprint"]


@pytest.fixture(scope="module")
def upstream():
    return swa_cases.upstream(release_selection.release_dir("0.5.13"))


def _as_0_5_13_runs_it(runner):
    """The same runner, with the installed enum's member of the algorithm's name:
    0.5.13 asks ``is_frozen_kv_mtp()``, which releases before 0.5.12 lack."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    twin = types.SimpleNamespace(**vars(runner))
    twin.spec_algorithm = SpeculativeAlgorithm[runner.spec_algorithm.name]
    return twin


def _same_reads(got, want, with_cache_loc):
    for layer in want:
        assert torch.equal(got[layer]["page_table"], want[layer]["page_table"]), layer
        assert swa_cases.same(got[layer]["keys"], want[layer]["keys"]), layer
        if with_cache_loc:
            assert torch.equal(got[layer]["cache_loc"], want[layer]["cache_loc"]), layer
    return True


def _differs(got, want):
    return any(
        not torch.equal(got[layer]["page_table"], want[layer]["page_table"])
        or not swa_cases.same(got[layer]["keys"], want[layer]["keys"])
        for layer in want
    )


@pytest.mark.parametrize("release", AFFECTED)
def test_patched_backend_reads_what_0_5_13_reads_in_every_case(release, upstream):
    module = swa_cases.load_backend_module(release_selection.release_dir(release))
    cls = module.TRTLLMHAAttnBackend
    original_init = cls.__dict__["__init__"]
    with_cache_loc = hasattr(cls, "_get_layer_cache_loc")
    cases = swa_cases.cases(release_selection.release_dir("0.5.11"))
    # The plugin's real path: the engine's handler, as the import hook calls it.
    assert engine.handle(HOTFIX, module) == "patched"
    try:
        patched = {name: cls(runner) for name, (world, runner) in cases.items()}
    finally:
        patch.remove_all()
    assert cls.__dict__["__init__"] is original_init
    unpatched = {name: cls(runner) for name, (world, runner) in cases.items()}

    wrong_unpatched = set()
    for name, (world, runner) in cases.items():
        pool = upstream._resolve_swa_kv_pool(_as_0_5_13_runs_it(runner))
        backend = patched[name]
        assert backend._swa_kv_pool is pool, name
        assert backend.use_sliding_window_kv_pool is (pool is not None), name  # 0.5.13 asks `_swa_kv_pool is None`
        want = swa_cases.reads(types.SimpleNamespace(_swa_kv_pool=pool), upstream, world, runner)
        assert _same_reads(swa_cases.reads(backend, cls, world, runner), want, with_cache_loc), name
        if _differs(swa_cases.reads(unpatched[name], cls, world, runner), want):
            wrong_unpatched.add(name)
        if name == "target":
            assert backend._swa_kv_pool is unpatched[name]._swa_kv_pool is runner.token_to_kv_pool
    # The test shows the bug: without the hotfix, drafts with a KV pool of their own read other slots.
    assert wrong_unpatched == WRONG_WITHOUT_THE_FIX


def test_unpatched_eagle3_draft_reads_the_targets_sliding_window_slots():
    """The bug, spelled out on 0.5.12: the draft's layer 0 goes through the
    target's mapping, so its page table holds sliding-window indices into the
    draft's own (full) buffer."""
    module = swa_cases.load_backend_module(release_selection.release_dir("0.5.12"))
    world, runner = swa_cases.cases(release_selection.release_dir("0.5.11"))["eagle3_draft"]
    backend = module.TRTLLMHAAttnBackend(runner)
    assert backend._swa_kv_pool is world.target_pool and backend.use_sliding_window_kv_pool
    reads = swa_cases.reads(backend, module.TRTLLMHAAttnBackend, world, runner)[0]
    true_slots = world.req_to_token[:, : max(swa_cases.REQUEST_LENGTHS)].to(torch.int64)
    assert not torch.equal(reads["page_table"], true_slots)


def test_a_draft_backend_built_before_a_late_apply_makes_the_record_stand_aside(caplog):
    """Issue 49, item 2: an EAGLE3 draft backend built before ``apply()`` keeps the target's
    sliding-window pool (the release's ``__init__`` made it); 0.13.1 said "patched" and PROTECTED.
    The record now stands aside while such a backend lives, says why, and the process's record says
    it is not patched; once the backend is gone, it goes in force."""
    from sglang_hotfix_trtllm import process_state

    module = swa_cases.load_backend_module(release_selection.release_dir("0.5.12"))
    world, runner = swa_cases.cases(release_selection.release_dir("0.5.11"))["eagle3_draft"]
    early = module.TRTLLMHAAttnBackend(runner)
    try:
        with caplog.at_level("WARNING", logger="sglang_hotfix_trtllm"):
            assert engine.handle(HOTFIX, module) == "refused"
        assert "1 TRTLLMHAAttnBackend object(s) built before the record was in force" in caplog.text
        noted = process_state._records["pr25103"]
        assert noted["patched"] is False and "built before the record was in force" in noted["why"]
        assert early._swa_kv_pool is world.target_pool  # what the release made, kept: the bug
        del early
        gc.collect()
        assert engine.handle(HOTFIX, module) == "patched"
    finally:
        patch.remove_all()


VARIANTS = {  # name -> (text in 0.5.12's file, what replaces it)
    "helper_writes_flag": (
        '        """Allocate a SWA page_table buffer, or return None for non-SWA models."""\n',
        '        """Allocate a SWA page_table buffer, or return None for non-SWA models."""\n'
        "        self.use_sliding_window_kv_pool = True\n",
    ),
    "unknown_reader": (
        "    def _bind_swa_page_table(\n",
        "    def _peek(self):\n        return self._swa_kv_pool\n\n    def _bind_swa_page_table(\n",
    ),
    "reads_after_resolution": (
        "        # Forward metadata\n",
        "        self.keep = self._swa_kv_pool\n        # Forward metadata\n",
    ),
    "signature": ("        speculative_step_id: int = 0,\n", "        speculative_step_id: int = 1,\n"),
    "resolver_not_upstreams": (
        "    def _maybe_translate_swa(\n",
        "    @staticmethod\n    def _resolve_swa_kv_pool(model_runner):\n"
        "        return None\n\n    def _maybe_translate_swa(\n",
    ),
    "pool_class_rebound": ("\nlogger = ", "\nSWAKVPool = object\nlogger = "),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_hand_made_variants_are_unknown(variant):
    text = (release_selection.release_dir("0.5.12") / swa_cases.BACKEND).read_text(encoding="utf-8")
    old, new = VARIANTS[variant]
    assert text.count(old) == 1, variant
    assessment = detect.assess_source(HOTFIX, "trtllm_mha_backend.py", text=text.replace(old, new))
    assert assessment.verdict is Verdict.UNKNOWN, assessment.reason


def test_disable_switch_names_one_record():
    both = switches.read({})
    assert not both.disables("pr26521") and not both.disables("pr25103")
    one = switches.read({switches.DISABLE: "pr25103"})
    assert one.disables("pr25103") and not one.disables("pr26521") and one.problems == ()
    every = switches.read({switches.DISABLE: "1"})
    assert every.disables("pr25103") and every.disables("pr26521")
    wrong = switches.read({switches.DISABLE: "pr2"})  # fails safe: everything off, and says why
    assert wrong.disables("pr25103") and wrong.disables("pr26521") and "'pr2' is no record" in wrong.problems[0]


def test_one_record_disabled_in_a_real_process_leaves_the_other_applied(tmp_path):
    code = (
        "import json, sglang.srt.layers.attention.trtllm_mha_backend as b; c = b.TRTLLMHAAttnBackend;"
        " print('RESULT:' + json.dumps({n: type(c.__dict__[n]).__name__ for n in"
        " ('__init__', 'init_forward_metadata_capture_cuda_graph')}))"
    )
    ran = run_python(["-c", code], cwd=tmp_path, env=clean_env(SGLANG_HOTFIX_TRTLLM_DISABLE="pr25103"))
    assert ran.returncode == 0, ran
    assert ran.result == {"__init__": "function", "init_forward_metadata_capture_cuda_graph": "HotfixWrapper"}
    ran = run_python(["-c", code], cwd=tmp_path, env=clean_env())
    assert ran.result == {"__init__": "HotfixWrapper", "init_forward_metadata_capture_cuda_graph": "HotfixWrapper"}
    lines = ran.hotfix_lines(record=None)
    patched = [line for line in lines if any("INFO: patched %s (" % h.targets_text in line for h in catalog.HOTFIXES)]
    assert len(patched) == len(applied_record_names()), ran
