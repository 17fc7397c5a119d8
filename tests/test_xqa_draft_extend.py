"""Record xqa_draft_extend repairs SGLang 0.5.21 (issue 47, item 7): draft extend and target verify on
the decode kernel (XQA on SM90/SM120) keep BF16 Q and get the spec-decoding mask, as 0.5.22 does.

Differential, on CPU: 0.5.21's own ``forward_extend`` (``fp8_cases``: compiled from the release's
file, FlashInfer's kernels recorded) with the record's edit, against the same release with 0.5.22's
three statements put in by the tests' own AST change taken from 0.5.22's file
(``fp8_cases._apply_draft_extend``); alone and with encoder_only_mask, which edits the same method
there. Cases: every extend case of the harness, plus draft extend (``DRAFT_EXTEND_V2``, two and more
query tokens a request) on XQA and off, BF16 and FP8 caches; what the kernels receive is compared
in dtype, shape, strides, storage offset and values. 0.5.14 to 0.5.20 stay reported
(test_reported_records).
"""

import dataclasses

import pytest

import fp8_cases
import release_selection
from sglang_hotfix_trtllm import detect, patch
from sglang_hotfix_trtllm.record import Verdict
from sglang_hotfix_trtllm.records import encoder_only_mask, xqa_draft_extend

HOTFIX = xqa_draft_extend.HOTFIX
RELEASE, FIXED_IN = "0.5.21", "0.5.22"


def _cases():
    chosen = {}
    for name, case in fp8_cases.cases(RELEASE).items():
        if case.mode == "decode" or case.layout != "packed" or case.scales not in ("absent", "float"):
            continue
        chosen[name] = case
        if case.mode == "extend" and not case.save_kv_cache:
            draft = dataclasses.replace(case, name=name + "-draft", mode="draft_extend_v2")
            chosen[draft.name] = draft
    return chosen


def _calls(module):
    return {name: fp8_cases.kernel_calls(module, case) for name, case in _cases().items()}


def _oracle(draft_extend=True, encoder_only=False):
    module = fp8_cases.upstream_module(
        release_selection.release_dir(RELEASE),
        release_selection.release_dir(fp8_cases.FIXED_RELEASE),
        scales=False,
        draft_extend_dir=release_selection.release_dir(FIXED_IN) if draft_extend else None,
        encoder_only_dir=release_selection.release_dir(FIXED_IN) if encoder_only else None,
    )
    return _calls(module)


def _patched(records):
    module = fp8_cases.load_backend_module(release_selection.release_dir(RELEASE))
    try:
        for hotfix in records:
            assessment = detect.assess_module(hotfix, module)
            assert assessment.verdict is Verdict.AFFECTED, (hotfix.name, assessment.reason)
            assert patch.wrap(hotfix, module, assessment) == "wrapped"
        return _calls(module)
    finally:
        patch.remove_all()


def test_the_bug_bites_where_the_record_says_and_the_harness_can_tell():
    """Without the change, draft extend gets no mask (0.5.22 passes it on every kernel whenever a
    request has more than one query token) and, on XQA with an FP8 cache, an FP8 query; target
    verify and plain extend get what 0.5.22 gives them."""
    unpatched, oracle = _patched(()), _oracle()
    cases = _cases()
    differing = sorted(n for n in cases if unpatched[n] != oracle[n])
    expected = sorted(n for n, c in cases.items() if c.mode == "draft_extend_v2")
    assert expected and differing == expected
    fp8_on_xqa = [n for n, c in cases.items() if c.mode == "draft_extend_v2" and c.xqa and c.kv == "fp8"]
    assert fp8_on_xqa and all(_query_dtype(unpatched[n]) != _query_dtype(oracle[n]) for n in fp8_on_xqa)


def _query_dtype(calls):
    (arguments,) = [a for name, a in calls if name != "returned" and "query" in a]
    return arguments["query"][1]


def test_the_repaired_release_equals_upstreams_change_on_every_case():
    patched, oracle = _patched((HOTFIX,)), _oracle()
    assert [n for n in oracle if patched[n] != oracle[n]] == []


@pytest.mark.parametrize("order", ["catalog", "reversed"])
def test_with_encoder_only_mask_on_the_same_method_both_upstream_changes_arrive(order):
    records = [encoder_only_mask.HOTFIX, HOTFIX]
    patched = _patched(records if order == "catalog" else records[::-1])
    oracle = _oracle(encoder_only=True)
    assert [n for n in oracle if patched[n] != oracle[n]] == []


def test_the_releases_before_0_5_21_stay_reported_naming_what_is_missing():
    for release in ("0.5.14", "0.5.20"):
        path = release_selection.release_dir(release) / fp8_cases.BACKEND
        assessment = detect.assess_source(HOTFIX, str(path))
        assert assessment.verdict is Verdict.UNREPAIRABLE, release
        assert "_xqa_spec_dec_mask" in assessment.reason and "0.5.22" in assessment.reason
