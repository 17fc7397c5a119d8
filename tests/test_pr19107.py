"""The sixth record, pr19107: the fused FP8 KV write of a sliding-window layer writes at the
sliding-window pool's indices (PR #19107, SGLang 0.5.10), for the one release with the bug, 0.5.9.

TRT-LLM-GEN runs on SM100 only, and SGLang's fused write is a Triton kernel: the proof is on CPU.
Verdicts: every release of the shipped table from its own source, hand-made variants refused.
Differential: 0.5.9's own module (``fp8_cases``: compiled from the release's file, FlashInfer's
kernels and SGLang's fused write recorded) on SGLang's real ``SWAKVPool`` (a sliding-window and a
full-attention layer, the pool's own full-to-SWA mapping), against the oracle: the same release
with 0.5.10's ``_get_layer_cache_loc`` and statement inserted by AST. What the fused write and the
kernels receive is compared in dtype, shape, strides, storage offset and values, for the helper
called directly (by keyword, positionally, through the class) and inside ``forward_decode`` and
``forward_extend``; and with pr25103 on ``__init__`` (both records of 0.5.9's SWA code).
"""

import ast
import types

import pytest
import torch
from packaging.version import Version

import fp8_cases
import release_selection
import swa_write_cases
from sglang_hotfix_trtllm import detect, patch
from sglang_hotfix_trtllm.record import Verdict
from sglang_hotfix_trtllm.records import pr19107

HOTFIX = pr19107.HOTFIX
TABLE = release_selection.table(HOTFIX)
RELEASE, SWA_LAYER, FULL_LAYER = swa_write_cases.RELEASE, swa_write_cases.SWA_LAYER, swa_write_cases.FULL_LAYER


def expected_verdict(release):
    version = Version(release)
    if version < Version("0.5.9"):
        return Verdict.NOT_APPLICABLE  # no fused FP8 write (before 0.5.6.post1), or no SWA pools (before 0.5.9)
    return Verdict.AFFECTED if version < Version("0.5.10") else Verdict.FIXED


def test_shipped_table_gives_every_release_its_verdict():
    assert HOTFIX.known_fingerprints.problem is None
    assert len([r for r in TABLE if Version(r) <= Version("0.5.23")]) == 42
    assert {r: row["verdict"] for r, row in TABLE.items() if row["verdict"] != expected_verdict(r).value} == {}
    assert [r for r, row in TABLE.items() if row["verdict"] == "affected"] == [RELEASE]


@pytest.mark.parametrize(
    "release",
    release_selection.selected(TABLE, ("0.5.6", "0.5.6.post1", "0.5.8.post1", "0.5.9", "0.5.10", "0.5.16", "0.5.23")),
)
def test_release_gets_its_verdict_from_its_own_source(release):
    assessment = detect.assess_source(HOTFIX, str(release_selection.release_dir(release) / fp8_cases.BACKEND))
    assert assessment.verdict is expected_verdict(release), assessment.reason
    assert assessment.fingerprint == TABLE[release]["fingerprint"]


def _method(tree, name):
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == pr19107.CLASS_NAME)
    return next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name)


def _variant(edit):
    tree = ast.parse((release_selection.release_dir(RELEASE) / fp8_cases.BACKEND).read_text())
    edit(tree)
    return ast.unparse(tree)


def _translate_the_wrong_way(tree):
    """0.5.10's statement without its helper: the fix half-applied."""
    write = _method(tree, pr19107.METHOD)
    for node in ast.walk(write):
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "cache_loc":
            node.value = ast.parse("self._get_layer_cache_loc(layer, forward_batch.out_cache_loc)").body[0].value


def _translate_through_a_helper_that_does_not(tree):
    """0.5.10's statement with a helper that returns the locations as they are (said fixed by 0.7.0's first cut)."""
    _translate_the_wrong_way(tree)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == pr19107.CLASS_NAME)
    cls.body.append(ast.parse("def _get_layer_cache_loc(self, layer, cache_loc):\n    return cache_loc").body[0])


def _rename(old, new):
    def edit(tree):
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == old:
                node.attr = new
            elif isinstance(node, ast.FunctionDef) and node.name == old:
                node.name = new

    return edit


VARIANTS = {
    "0.5.9 with a helper that does not translate": _translate_through_a_helper_that_does_not,
    "0.5.9 with the pool attributes renamed": lambda t: [
        _rename(a, a + "_x")(t) for a in ("use_sliding_window_kv_pool", "_swa_kv_pool")
    ],
    "0.5.9 with the fused write renamed": _rename(pr19107.METHOD, "_fused_fp8_write"),
    "0.5.9 with the statement but no helper": _translate_the_wrong_way,
    "0.5.9 with one more statement in the write": lambda t: _method(t, pr19107.METHOD).body.insert(
        0, ast.parse("forward_batch = forward_batch").body[0]
    ),
    "0.5.9 with another __init__": lambda t: _method(t, "__init__").body.append(ast.parse("self.x = 1").body[0]),
    "0.5.9 with another forward_decode": lambda t: _method(t, "forward_decode").body.insert(
        0, ast.parse("layer = layer").body[0]
    ),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_hand_made_variants_are_unknown(variant):
    classification = HOTFIX.classify(ast.parse(_variant(VARIANTS[variant])))
    assert classification.verdict is Verdict.UNKNOWN, classification.reason


# --------------------------------------------------------------------------
# Differential on SGLang's real SWAKVPool


def test_the_oracle_tells_the_bug_from_the_fix():
    module, oracle = swa_write_cases.modules(release_selection.release_dir(RELEASE))
    got, want = swa_write_cases.helper_calls(module, True), swa_write_cases.helper_calls(oracle, True)
    differing = sorted(n for n in got if got[n] != want[n])
    assert differing == sorted(n for n in got if n.startswith("layer%d" % SWA_LAYER)) and differing
    assert swa_write_cases.helper_calls(module, False) == swa_write_cases.helper_calls(
        oracle, False
    )  # no SWA pool: nothing to translate


@pytest.mark.parametrize("swa", [True, False], ids=["swa-pool", "no-swa-pool"])
def test_the_patched_fused_write_equals_upstreams(swa):
    module, oracle = swa_write_cases.modules(release_selection.release_dir(RELEASE))
    want = swa_write_cases.helper_calls(oracle, swa)
    try:
        assert patch.wrap(HOTFIX, module, detect.assess_module(HOTFIX, module)) == "wrapped"
        got = swa_write_cases.helper_calls(module, swa)
    finally:
        patch.remove_all()
    assert {n: got[n] == want[n] for n in want} == {n: True for n in want}


def test_the_patched_methods_equal_upstreams_on_the_sliding_window_pool():
    module, oracle = swa_write_cases.modules(release_selection.release_dir(RELEASE))
    want = swa_write_cases.method_calls(oracle)
    try:
        patch.wrap(HOTFIX, module, detect.assess_module(HOTFIX, module))
        got = swa_write_cases.method_calls(module)
    finally:
        patch.remove_all()
    assert want and [n for n in want if got[n] != want[n]] == []
    assert any(
        got[n] != swa_write_cases.method_calls(fp8_cases.load_backend_module(release_selection.release_dir(RELEASE)))[n]
        for n in got
        if "layer%d" % SWA_LAYER in n
    )


def test_a_full_attention_layer_gets_sglangs_own_batch():
    """Where upstream translates nothing, the fused write reads SGLang's own forward batch."""
    module, _ = swa_write_cases.modules(release_selection.release_dir(RELEASE))
    seen = []
    original = module.fused_fp8_set_kv_buffer
    module.fused_fp8_set_kv_buffer = lambda **kwargs: seen.append(kwargs["cache_loc"]) or original(**kwargs)
    pool = swa_write_cases.swa_pool()
    backend = object.__new__(module.TRTLLMHAAttnBackend)
    backend.page_size, backend.use_sliding_window_kv_pool, backend._swa_kv_pool = fp8_cases.PAGE_SIZE, True, pool
    batch = types.SimpleNamespace(out_cache_loc=torch.tensor([5, 9]), token_to_kv_pool=pool)
    k = torch.zeros(2, 1, fp8_cases.HEAD_DIM, dtype=torch.bfloat16)
    try:
        patch.wrap(HOTFIX, module, detect.assess_module(HOTFIX, module))
        backend._fused_fp8_set_kv_buffer(
            q=k, k=k, v=k, layer=swa_write_cases.layer_of(FULL_LAYER, "absent"), forward_batch=batch
        )
        backend._fused_fp8_set_kv_buffer(
            q=k, k=k, v=k, layer=swa_write_cases.layer_of(SWA_LAYER, "absent"), forward_batch=batch
        )
    finally:
        patch.remove_all()
    assert seen[0] is batch.out_cache_loc
    assert (
        seen[1].dtype == torch.int32
        and seen[1].tolist() == pool.translate_loc_from_full_to_swa(batch.out_cache_loc).tolist()
    )


def test_a_pool_without_upstreams_mapping_raises_as_upstreams_code_does():
    """A pool that cannot translate (no mapping for the layer): the repaired method raises where
    0.5.10's code raises, the same error, and never writes at the untranslated locations."""
    release_dir = release_selection.release_dir(RELEASE)
    module, oracle = swa_write_cases.modules(release_dir)

    def outcome(of):
        backend = object.__new__(of.TRTLLMHAAttnBackend)
        backend.page_size, backend.use_sliding_window_kv_pool = fp8_cases.PAGE_SIZE, True
        backend._swa_kv_pool = types.SimpleNamespace(layers_mapping={})  # no mapping for the layer
        batch = types.SimpleNamespace(out_cache_loc=torch.tensor([5, 9]), token_to_kv_pool=swa_write_cases.swa_pool())
        k = torch.zeros(2, 1, fp8_cases.HEAD_DIM, dtype=torch.bfloat16)
        layer = swa_write_cases.layer_of(SWA_LAYER, "absent")
        return swa_write_cases.record(
            of, lambda: backend._fused_fp8_set_kv_buffer(q=k, k=k, v=k, layer=layer, forward_batch=batch)
        )

    unpatched = outcome(module)
    try:
        patch.wrap(HOTFIX, module, detect.assess_module(HOTFIX, module))
        got = outcome(module)
    finally:
        patch.remove_all()
    assert got == outcome(oracle) == "raised KeyError: %d" % SWA_LAYER
    assert unpatched != got  # the release wrote at full-pool indices


def test_the_new_method_is_upstreams_own_definition():
    """The record carries 0.5.10's ``_get_layer_cache_loc`` text: it parses to 0.5.10's definition."""
    path = release_selection.release_dir(swa_write_cases.TRANSLATED_RELEASE) / fp8_cases.BACKEND
    tree = ast.parse(path.read_text(encoding="utf-8"))
    upstream = _method(tree, pr19107.TRANSLATOR)
    (carried,) = ast.parse(pr19107.UPSTREAM_TRANSLATOR).body
    assert ast.dump(carried) == ast.dump(upstream)


def test_the_patched_method_is_upstreams_code_and_remove_restores_the_identical_object():
    """No wrapper: the class keeps SGLang's function, whose code is the release's file with 0.5.10's
    statement, compiled as the file is; remove() puts the very code object back and takes the new
    method away."""
    module, _ = swa_write_cases.modules(release_selection.release_dir(RELEASE))
    cls = module.TRTLLMHAAttnBackend
    function = cls.__dict__[pr19107.METHOD]
    original = function.__code__
    try:
        assert patch.wrap(HOTFIX, module, detect.assess_module(HOTFIX, module)) == "wrapped"
        assert cls.__dict__[pr19107.METHOD] is function and function.__code__ is not original
        # SGLang's file, named as the hotfix's edit of it (a traceback shows upstream's lines)
        assert function.__code__.co_filename == original.co_filename + (
            " (sglang-hotfix-trtllm: with upstream's change of record pr19107)"
        )
        assert function.__code__.co_firstlineno == original.co_firstlineno
        assert "_get_layer_cache_loc" in function.__code__.co_names
        assert cls.__dict__[pr19107.TRANSLATOR].__globals__ is vars(module)
        assert patch.is_patched(HOTFIX, cls)
    finally:
        assert patch.remove_all() == 1
    assert function.__code__ is original and pr19107.TRANSLATOR not in cls.__dict__
    assert not patch.is_patched(HOTFIX, cls)


@pytest.mark.parametrize("reverse", [False, True], ids=["catalog-order", "reversed-apply-order"])
def test_with_pr28144_on_the_methods_that_call_it_both_equal_upstreams_changes(reverse):
    """0.5.9 has pr28144's bug too: its wrapper of forward_decode / forward_extend calls into the
    fused write this record wraps. Both on, in either order, against 0.5.9 with both upstream
    changes inserted (#28144 as #29423 revised it from 0.5.15's file, #19107 from 0.5.10's)."""
    from sglang_hotfix_trtllm.records import pr28144

    release_dir = release_selection.release_dir(RELEASE)
    oracle = fp8_cases.upstream_module(
        release_dir,
        release_selection.release_dir(fp8_cases.FIXED_RELEASE),
        scales=True,
        swa_locations_dir=release_selection.release_dir(swa_write_cases.TRANSLATED_RELEASE),
    )
    want = swa_write_cases.method_calls(oracle)
    module = fp8_cases.load_backend_module(release_dir)
    order = [pr28144.HOTFIX, HOTFIX][:: -1 if reverse else 1]
    try:
        for hotfix in order:
            assert patch.wrap(hotfix, module, detect.assess_module(hotfix, module)) == "wrapped"
        got = swa_write_cases.method_calls(module)
    finally:
        assert patch.remove_all() == 3
    assert want and [n for n in want if got[n] != want[n]] == []


@pytest.mark.parametrize(
    "release, releases",
    [("0.5.9", ("0.5.9",)), ("0.5.7", ("0.5.6.post1", "0.5.6.post2", "0.5.7", "0.5.8", "0.5.8.post1"))],
)
def test_the_releases_named_are_those_with_this_code_and_this_verdict(release, releases):
    """Issue 36, item 5: 0.5.6.post1 to 0.5.9 share the write's fingerprint, but only 0.5.9 is
    affected: 0.5.9 named no release, and the others named 0.5.9 among theirs."""
    assessment = detect.assess_source(HOTFIX, str(release_selection.release_dir(release) / fp8_cases.BACKEND))
    assert assessment.known_releases == releases, assessment.reason
    assert ("as in SGLang %s" % releases[0]) in assessment.reason
