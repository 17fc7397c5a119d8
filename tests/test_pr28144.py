"""The third record, pr28144: FlashInfer's TRT-LLM kernels get the FP8 KV cache's scales.

Verdicts: every release of the shipped table from its own source, and hand-made variants of
the affected code (each must be refused). The record's own machinery (the two wrappers and the
``flashinfer`` gate) on a release's own module: applied, removed, composed, never raising.
Whether the kernel receives upstream's arguments, case by case and release by release, is
test_pr28144_differential.py's question.
"""

import ast

import pytest
from packaging.version import Version

import release_selection
from sglang_hotfix_trtllm import detect
from sglang_hotfix_trtllm.record import Verdict
from sglang_hotfix_trtllm.records import pr28144, trtllm_kernel_routes

HOTFIX = pr28144.HOTFIX
TABLE = release_selection.table(HOTFIX)
QUICK = ("0.5.4.post1", "0.5.5.post3", "0.5.6", "0.5.8", "0.5.9", "0.5.10", "0.5.12", "0.5.13", "0.5.14", "0.5.23")
BACKEND = "sglang/srt/layers/attention/trtllm_mha_backend.py"


def expected_verdict(release):
    """From the sources (REFERENCE.md): the bug from 0.5.1 to 0.5.13.post1, every pinned FlashInfer
    taking the float scales of upstream's revised fix; 0.5.14 on, fixed."""
    return Verdict.AFFECTED if Version(release) < Version("0.5.14") else Verdict.FIXED


RELEASES = release_selection.selected(TABLE, QUICK)


def source_of(release):
    return (release_selection.release_dir(release) / BACKEND).read_text(encoding="utf-8")


def classify(text):
    return detect.assess_source(HOTFIX, "trtllm_mha_backend.py", text=text)


def test_shipped_table_gives_every_release_its_verdict():
    assert HOTFIX.known_fingerprints.problem is None
    up_to_0_5_23 = [r for r in TABLE if Version(r) <= Version("0.5.23")]
    assert len(up_to_0_5_23) == 42
    assert {r: TABLE[r]["verdict"] for r in TABLE if TABLE[r]["verdict"] != expected_verdict(r).value} == {}


@pytest.mark.parametrize("release", RELEASES)
def test_release_gets_its_verdict_from_its_own_source(release):
    assessment = detect.assess_source(HOTFIX, str(release_selection.release_dir(release) / BACKEND))
    assert assessment.verdict is expected_verdict(release), assessment.reason
    assert assessment.fingerprint == TABLE[release]["fingerprint"]
    if assessment.verdict is Verdict.UNKNOWN:
        assert "cannot take the tensor bmm1_scale" in assessment.reason


def _edit(text, edit):
    tree = ast.parse(text)
    edit(tree)
    return ast.unparse(ast.fix_missing_locations(tree))


def _method(tree, name):
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == pr28144.CLASS_NAME)
    return next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name)


def _append_to(method_name, statement):
    def edit(tree):
        _method(tree, method_name).body.append(ast.parse(statement).body[0])

    return edit


def _helper_calling_a_kernel(tree):
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == pr28144.CLASS_NAME)
    cls.body.append(
        ast.parse(
            "def _other(self, **kw):\n    return flashinfer.decode.%s(**kw)" % trtllm_kernel_routes.KERNELS["decode"]
        ).body[0]
    )


def _rebinding_flashinfer(tree):
    tree.body.append(ast.parse("flashinfer = None").body[0])


def _aliased_import(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "flashinfer":
                    alias.asname = "fi"
    tree.body.append(ast.parse("flashinfer = fi").body[0])


def _a_second_flashinfer_import(tree):
    tree.body.append(ast.parse("import flashinfer").body[0])


def _upstream_helper_changed(tree):
    """0.5.14's code with its _get_bmm_scales edited: fixed no more, unknown."""
    method = _method(tree, pr28144.BMM_SCALES)
    method.body.insert(0, ast.parse("layer = layer").body[0])


def _helper_reaching_the_kernel_by_a_computed_name(tree):
    """A helper forward_decode calls reaches the kernel through getattr: the gate would repair
    that call, not SGLang's (the reviewer's case)."""
    method = _method(tree, "_get_layer_page_table")
    probe = "getattr(flashinfer.decode, 'trtllm_batch_%s_with_kv_cache' % 'decode')"
    method.body.insert(0, ast.parse("_ = " + probe).body[0])


def _earlier_definition_kept_callable(tree):
    """An earlier `def forward_decode` Python replaces, kept callable under another name."""
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == pr28144.CLASS_NAME)
    live = _method(tree, "forward_decode")
    index = cls.body.index(live)
    cls.body.insert(index, ast.parse("_kept = forward_decode").body[0])
    cls.body.insert(index, ast.parse(ast.unparse(live)).body[0])


def _import_adding(statement):
    def edit(tree):
        tree.body.insert(0, ast.parse(statement).body[0])

    return edit


def _helper_changed(tree):
    _method(tree, "_should_use_fused_fp8_path").body.insert(0, ast.parse("k = k").body[0])


VARIANTS_OF_AFFECTED = {
    "a_helper_reaching_the_kernel_by_a_computed_name": _helper_reaching_the_kernel_by_a_computed_name,
    "an_earlier_definition_kept_callable": _earlier_definition_kept_callable,
    "a_helper_the_methods_call_changed": _helper_changed,
    "forward_decode_changed": _append_to("forward_decode", "q = q"),
    "forward_extend_changed": _append_to("forward_extend", "bmm2_scale = 2.0"),
    "a_helper_names_a_kernel": _helper_calling_a_kernel,
    "flashinfer_rebound": _rebinding_flashinfer,
    "flashinfer_imported_under_another_name": _aliased_import,
    "flashinfer_imported_twice": _a_second_flashinfer_import,
    # Kernels bound by alias: a route the gate cannot see (issue 28, item 5).
    "a_kernel_imported_by_alias": _import_adding(
        "from flashinfer.decode import trtllm_batch_decode_with_kv_cache as k"
    ),
    "a_kernel_imported_by_its_name": _import_adding(
        "from flashinfer.prefill import trtllm_batch_context_with_kv_cache"
    ),
    "a_kernel_submodule_imported": _import_adding("from flashinfer import decode"),
    "a_kernel_submodule_imported_as": _import_adding("import flashinfer.decode as fd"),
    "a_star_import_of_a_kernel_submodule": _import_adding("from flashinfer.decode import *"),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS_OF_AFFECTED))
def test_hand_made_variants_of_affected_code_are_unknown(variant):
    text = source_of("0.5.12")
    assert classify(text).verdict is Verdict.AFFECTED
    assessment = classify(_edit(text, VARIANTS_OF_AFFECTED[variant]))
    assert assessment.verdict is Verdict.UNKNOWN, assessment.reason


def test_fixed_code_whose_helper_differs_from_0_5_14s_is_unknown():
    text = source_of("0.5.14")
    assert classify(text).verdict is Verdict.FIXED
    assert classify(_edit(text, _upstream_helper_changed)).verdict is Verdict.UNKNOWN


def test_the_record_wraps_both_methods_and_names_both_in_its_line():
    assert HOTFIX.method_names == ("forward_decode", "forward_extend")
    assert HOTFIX.targets_text.endswith("TRTLLMHAAttnBackend.forward_decode and forward_extend")
