"""The fourth record, pr31667: on XQA, FlashInfer's decode kernel gets a packed query (PR #31667),
and the records of FlashInfer's kernel call site composing on ``forward_decode``.

Verdicts: every release of the shipped table from its own source, and hand-made variants of the
affected code (refused). Differential, on CPU: every affected release's own ``forward_decode``
(``fp8_cases``: compiled from the release's file, FlashInfer's kernels recorded) against the
oracle, the same release with upstream's changes applied by AST for the records that are on:
PR #31667 from 0.5.16's file, and, where pr28144 is affected too (0.5.11 to 0.5.13.post1), PR
#28144 as #29423 revised it from 0.5.15's file. Every on/off assignment of the two, applied in
both orders, packed and strided queries, XQA on and off, BF16 and FP8 caches; what the kernel
receives is compared in dtype, shape, strides, storage offset and values.
"""

import ast
import functools
import itertools

import pytest
from packaging.version import Version

import fp8_cases
import release_selection
from sglang_hotfix_trtllm import detect, patch
from sglang_hotfix_trtllm.record import Verdict
from sglang_hotfix_trtllm.records import pr28144, pr31667

HOTFIX = pr31667.HOTFIX
TABLE = release_selection.table(HOTFIX)
PACKED_QUERY_RELEASE = "0.5.16"
AFFECTED = release_selection.with_verdict(HOTFIX)
QUICK = ("0.5.11", "0.5.13", "0.5.14", "0.5.15")
RELEASES = release_selection.selected(AFFECTED, QUICK)
RECORDS = {"pr28144": pr28144.HOTFIX, "pr31667": HOTFIX}


def expected_verdict(release):
    """REFERENCE.md: `.contiguous().view` up to 0.5.10.post1 (XQA from 0.5.10), `reshape` from 0.5.11
    (PR #22517) to 0.5.15.post1, upstream's XQA choice from 0.5.16."""
    version = Version(release)
    if version < Version("0.5.10"):
        return Verdict.NOT_APPLICABLE
    if version < Version("0.5.11") or version >= Version("0.5.16"):
        return Verdict.FIXED
    return Verdict.AFFECTED


def test_shipped_table_gives_every_release_its_verdict():
    assert HOTFIX.known_fingerprints.problem is None
    assert len([r for r in TABLE if Version(r) <= Version("0.5.23")]) == 42
    assert {r: row["verdict"] for r, row in TABLE.items() if row["verdict"] != expected_verdict(r).value} == {}
    assert AFFECTED[0] == "0.5.11" and AFFECTED[-1] == "0.5.15.post1" and len(AFFECTED) == 8


@pytest.mark.parametrize(
    "release", release_selection.selected(TABLE, ("0.5.9", "0.5.10", "0.5.12", "0.5.14", "0.5.16", "0.5.23"))
)
def test_release_gets_its_verdict_from_its_own_source(release):
    path = release_selection.release_dir(release) / fp8_cases.BACKEND
    assessment = detect.assess_source(HOTFIX, str(path))
    assert assessment.verdict is expected_verdict(release), assessment.reason


def _edited(text, edit):
    tree = ast.parse(text)
    edit(tree)
    return ast.unparse(tree)


def _method(tree, name):
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == pr31667.CLASS_NAME)
    return [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name][-1]


VARIANTS = {
    "forward_decode_changed": lambda tree: _method(tree, "forward_decode").body.append(ast.parse("q = q").body[0]),
    "a_helper_it_calls_changed": lambda tree: _method(tree, "_get_layer_page_table").body.insert(
        0, ast.parse("layer = layer").body[0]
    ),
    "a_kernel_imported_by_alias": lambda tree: tree.body.insert(
        0, ast.parse("from flashinfer.decode import trtllm_batch_decode_with_kv_cache as k").body[0]
    ),
    "flashinfer_imported_twice": lambda tree: tree.body.append(ast.parse("import flashinfer").body[0]),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_hand_made_variants_of_affected_code_are_unknown(variant):
    text = (release_selection.release_dir("0.5.12") / fp8_cases.BACKEND).read_text(encoding="utf-8")
    assert detect.assess_source(HOTFIX, "trtllm_mha_backend.py", text=text).verdict is Verdict.AFFECTED
    assessment = detect.assess_source(HOTFIX, "trtllm_mha_backend.py", text=_edited(text, VARIANTS[variant]))
    assert assessment.verdict is Verdict.UNKNOWN, assessment.reason


# --------------------------------------------------------------------------
# Composition: every assignment of the records on forward_decode, against upstream's changes


def _affected_records(release):
    return [
        name for name, hotfix in RECORDS.items() if release_selection.table(hotfix)[release]["verdict"] == "affected"
    ]


def _decode_cases(release):
    """Decode cases without a KV write, both KV dtypes, absent and float scales, both layouts, XQA
    on and off. 0.5.14's own ``_maybe_quantize_q`` quantizes Q off XQA with SGLang's
    ``scaled_fp8_quant``, which needs CUDA: FP8 off XQA is left out there."""
    quantizes_itself = "_maybe_quantize_q" in (release_selection.release_dir(release) / fp8_cases.BACKEND).read_text()
    return {
        name: case
        for name, case in fp8_cases.cases(release).items()
        if case.mode == "decode"
        and not case.save_kv_cache
        and case.scales in ("absent", "float")
        and not (quantizes_itself and case.kv == "fp8" and not case.xqa)
    }


@functools.lru_cache(maxsize=None)
def _oracle_calls(release, on):
    release_dir = release_selection.release_dir(release)
    module = fp8_cases.upstream_module(
        release_dir,
        release_selection.release_dir(fp8_cases.FIXED_RELEASE),
        scales="pr28144" in on,
        packed_query_dir=release_selection.release_dir(PACKED_QUERY_RELEASE) if "pr31667" in on else None,
    )
    return {name: fp8_cases.kernel_calls(module, case) for name, case in _decode_cases(release).items()}


def _assignments(release):
    records = _affected_records(release)
    return [tuple(r for r, bit in zip(records, bits) if bit) for bits in itertools.product((0, 1), repeat=len(records))]


@pytest.mark.parametrize("release", RELEASES)
def test_the_oracle_tells_the_records_apart(release):
    """Strided queries on XQA differ with #31667 on; the harness can fail where it should."""
    on = _oracle_calls(release, ("pr31667",))
    off = _oracle_calls(release, ())
    differing = sorted(n for n in on if on[n] != off[n])
    expected = sorted(n for n, c in _decode_cases(release).items() if c.xqa and c.layout == "strided")
    assert differing == expected and expected


@pytest.mark.parametrize("reverse", [False, True], ids=["catalog-order", "reversed-apply-order"])
@pytest.mark.parametrize("release", RELEASES)
def test_every_assignment_of_the_records_equals_upstreams_changes(release, reverse):
    module = fp8_cases.load_backend_module(release_selection.release_dir(release))
    mismatches = {}
    for on in _assignments(release):
        expected = _oracle_calls(release, on)
        order = [RECORDS[name] for name in on]
        try:
            for hotfix in reversed(order) if reverse else order:
                assert patch.wrap(hotfix, module, detect.assess_module(hotfix, module)) in ("wrapped", "already")
            assert all(patch.is_patched(hotfix, module.TRTLLMHAAttnBackend) for hotfix in order)
            for name, case in _decode_cases(release).items():
                got = fp8_cases.kernel_calls(module, case)
                if got != expected[name]:
                    mismatches["%s %s" % ("+".join(on) or "none", name)] = "differs"
        finally:
            patch.remove_all()
    assert mismatches == {}


@pytest.mark.parametrize("release", RELEASES)
def test_the_records_share_one_wrapper_and_one_gate(release):
    module = fp8_cases.load_backend_module(release_selection.release_dir(release))
    records = [RECORDS[name] for name in _affected_records(release)]
    try:
        for hotfix in records:
            patch.wrap(hotfix, module, detect.assess_module(hotfix, module))
        wrapper = module.TRTLLMHAAttnBackend.__dict__["forward_decode"]
        assert type(wrapper).__name__ == "HotfixWrapper" and type(wrapper.__wrapped__).__name__ == "function"
        assert wrapper._self_joined.active == tuple(h.name for h in records)
        strided_xqa = next(
            c
            for c in _decode_cases(release).values()
            if c.xqa and c.layout == "strided" and c.kv == "fp8" and c.scales == "float"
        )
        fp8_cases.kernel_calls(module, strided_xqa)  # pr31667 repairs it, and pr28144 where it is on
        gate = module.flashinfer
        if "pr28144" in [h.name for h in records]:  # the scales: at the kernel call, through the gate
            assert type(gate).__name__ == "FlashInferGate" and type(gate.__wrapped__).__name__ != "FlashInferGate"
        else:  # pr31667's packed query is given to SGLang's method: no gate
            assert type(gate).__name__ == "SimpleNamespace"
    finally:
        assert patch.remove_all() == (2 if "pr28144" in [h.name for h in records] else 1)
    assert type(module.TRTLLMHAAttnBackend.__dict__["forward_decode"]).__name__ == "function"
    assert type(module.flashinfer).__name__ != "FlashInferGate"


@pytest.mark.parametrize("release", RELEASES)
def test_the_repairs_order_is_free_on_forward_decode(release, monkeypatch):
    """The site applies repairs in catalog order (pr28144's scales, then pr31667's query). Reversed
    once, the kernel gets the same arguments: on ``forward_decode`` the two repairs touch different
    arguments, so the order is free there (it is decided once, not left to import order)."""
    on = tuple(_affected_records(release))
    if len(on) < 2:
        pytest.skip("one record on forward_decode here")
    original_refresh = patch.Joined.refresh

    def reversed_refresh(joined):
        original_refresh(joined)
        joined.active = tuple(reversed(joined.active))

    monkeypatch.setattr(patch.Joined, "refresh", reversed_refresh)
    module = fp8_cases.load_backend_module(release_selection.release_dir(release))
    expected = _oracle_calls(release, on)
    try:
        for name in on:
            patch.wrap(RECORDS[name], module, detect.assess_module(RECORDS[name], module))
        assert module.TRTLLMHAAttnBackend.__dict__["forward_decode"]._self_joined.active == tuple(reversed(on))
        wrong = [n for n, c in _decode_cases(release).items() if fp8_cases.kernel_calls(module, c) != expected[n]]
    finally:
        patch.remove_all()
    assert wrong == []


@pytest.mark.parametrize("release", RELEASES)
def test_calls_the_record_needs_not_repair_leave_the_module_alone(release):
    """pr31667 alone: a packed query, or a strided one off XQA, runs SGLang's method alone (the
    release's arguments, which are 0.5.16's there); a strided query on XQA is packed before SGLang's
    method runs. No call puts a gate in the module (the repair is made on the method's argument)."""
    module = fp8_cases.load_backend_module(release_selection.release_dir(release))
    own = module.flashinfer
    unpatched = _oracle_calls(release, ())
    try:
        patch.wrap(HOTFIX, module, detect.assess_module(HOTFIX, module))
        for name, case in _decode_cases(release).items():
            if case.layout == "packed" or not case.xqa:
                assert fp8_cases.kernel_calls(module, case) == unpatched[name], name
                assert module.flashinfer is own, name
        strided = next(c for c in _decode_cases(release).values() if c.layout == "strided" and c.xqa)
        assert fp8_cases.kernel_calls(module, strided) != unpatched[strided.name]  # repaired
        assert module.flashinfer is own
    finally:
        patch.remove_all()
    assert module.flashinfer is own


def test_a_record_joining_the_sites_wrapper_checks_the_running_method_as_wrapping_does():
    """A record that joins another's wrapper must refuse, as it would alone, a method that is not
    the analysed one (here: compiled at another line than the file on disk says)."""
    release = "0.5.12"
    module = fp8_cases.load_backend_module(release_selection.release_dir(release))
    try:
        patch.wrap(pr28144.HOTFIX, module, detect.assess_module(pr28144.HOTFIX, module))
        assessment = detect.assess_module(HOTFIX, module)
        moved = type(assessment)(
            *[getattr(assessment, f) for f in assessment.__slots__[:-1]], assessment.method_first_line + 3
        )
        with pytest.raises(patch.NotWrappable, match="starts at line"):
            patch.wrap(HOTFIX, module, moved)
    finally:
        patch.remove_all()
