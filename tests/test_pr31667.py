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
from sglang_hotfix_trtllm import code_edit, detect, patch
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


# A change of the method the record edits: not a known release's code, refused. (Code outside it
# was refused too until 0.14.0, as a route around the gate: repaired now, proven exact by
# test_mutants' test_code_outside_the_edited_methods_is_repaired_exactly.)
VARIANTS = {
    "forward_decode_changed": lambda tree: _method(tree, "forward_decode").body.append(ast.parse("q = q").body[0]),
    "forward_decode_defined_again_below": lambda tree: next(
        n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == pr31667.CLASS_NAME
    ).body.append(
        ast.parse("def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True):\n    return q").body[0]
    ),
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
def test_the_records_compile_into_sglangs_own_function_and_no_global_is_replaced(release):
    """Records as upstream's code: forward_decode stays SGLang's function object, its code is one
    compile holding every record's edit, the module's ``flashinfer`` is never replaced, and
    ``remove()`` puts back the very code objects."""
    module = fp8_cases.load_backend_module(release_selection.release_dir(release))
    cls, own = module.TRTLLMHAAttnBackend, module.flashinfer
    functions = {name: cls.__dict__[name] for name in ("forward_decode", "forward_extend")}
    originals = {name: f.__code__ for name, f in functions.items()}
    records = [RECORDS[name] for name in _affected_records(release)]
    try:
        for hotfix in records:
            assert patch.wrap(hotfix, module, detect.assess_module(hotfix, module)) == "wrapped"
        assert {name: cls.__dict__[name] for name in functions} == functions
        assert functions["forward_decode"].__code__ is not originals["forward_decode"]
        strided_xqa = next(
            c
            for c in _decode_cases(release).values()
            if c.xqa and c.layout == "strided" and c.kv == "fp8" and c.scales == "float"
        )
        fp8_cases.kernel_calls(module, strided_xqa)
        assert module.flashinfer is own
    finally:
        assert patch.remove_all() == (2 if "pr28144" in [h.name for h in records] else 1)
    assert all(functions[name].__code__ is originals[name] for name in functions)
    assert module.flashinfer is own


@pytest.mark.parametrize("release", RELEASES)
def test_the_order_of_the_edits_on_forward_decode_is_free(release):
    """The engine applies records in catalog order (pr28144's scales, then pr31667's query); applied
    the other way round, the two edits compile to the very same code (they change different
    statements), so the order is free there, and decided once, not left to import order."""
    on = tuple(_affected_records(release))
    if len(on) < 2:
        pytest.skip("one record on forward_decode here")
    codes = []
    for order in (on, tuple(reversed(on))):
        module = fp8_cases.load_backend_module(release_selection.release_dir(release))
        try:
            for name in order:
                patch.wrap(RECORDS[name], module, detect.assess_module(RECORDS[name], module))
            codes.append(module.TRTLLMHAAttnBackend.__dict__["forward_decode"].__code__)
        finally:
            patch.remove_all()
    assert code_edit.code_difference(*codes) is None


@pytest.mark.parametrize("release", RELEASES)
def test_calls_that_need_no_repair_get_the_releases_arguments(release):
    """pr31667 alone: a packed query, or a strided one off XQA, gets the release's arguments (which
    are 0.5.16's there); a strided query on XQA is packed. The module's globals are never touched."""
    module = fp8_cases.load_backend_module(release_selection.release_dir(release))
    own = module.flashinfer
    unpatched = _oracle_calls(release, ())
    try:
        patch.wrap(HOTFIX, module, detect.assess_module(HOTFIX, module))
        for name, case in _decode_cases(release).items():
            if case.layout == "packed" or not case.xqa:
                assert fp8_cases.kernel_calls(module, case) == unpatched[name], name
        strided = next(c for c in _decode_cases(release).values() if c.layout == "strided" and c.xqa)
        assert fp8_cases.kernel_calls(module, strided) != unpatched[strided.name]  # repaired
        assert module.flashinfer is own
    finally:
        patch.remove_all()


def test_a_method_that_is_not_the_installed_files_code_is_refused_naming_the_field():
    """Proof before change: forward_decode's code moved three lines (as a file changed since import
    would leave it) is not what a fresh compile of the file gives: the record stands aside and says
    which field differs, and nothing is changed."""
    module = fp8_cases.load_backend_module(release_selection.release_dir("0.5.12"))
    function = module.TRTLLMHAAttnBackend.__dict__["forward_decode"]
    moved = function.__code__.replace(co_firstlineno=function.__code__.co_firstlineno + 3)
    function.__code__ = moved
    try:
        with pytest.raises(patch.NotWrappable, match="co_firstlineno"):
            patch.wrap(HOTFIX, module, detect.assess_module(HOTFIX, module))
        assert function.__code__ is moved
    finally:
        patch.remove_all()
