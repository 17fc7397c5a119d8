"""The third record, pr28144: FlashInfer's TRT-LLM kernels get the FP8 KV cache's scales.

Verdicts: every release of the shipped table from its own source, and hand-made variants of
the methods the record edits (each must be refused). The record's own machinery (the two wrappers and the
``flashinfer`` gate) on a release's own module: applied, removed, composed, never raising.
Whether the kernel receives upstream's arguments, case by case and release by release, is
test_pr28144_differential.py's question.
"""

import ast

import pytest
from packaging.version import Version

import code_variants
import release_selection
from sglang_hotfix_trtllm import detect
from sglang_hotfix_trtllm.record import Verdict
from sglang_hotfix_trtllm.records import pr28144

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


# Changes of the methods the record edits: not the code of a known release, refused. (Until 0.14.0
# code outside them was refused too, where it could reach a kernel around the gate on ``flashinfer``:
# those variants are repaired now, and proven exact in test_mutants.)
VARIANTS_OF_AFFECTED = {
    "forward_decode_changed": code_variants.append_to("forward_decode", "q = q"),
    "forward_extend_changed": code_variants.append_to("forward_extend", "bmm2_scale = 2.0"),
    "an_upstream_helper_of_another_value": code_variants.upstream_helper_added,
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
    assert classify(_edit(text, code_variants.upstream_helper_changed)).verdict is Verdict.UNKNOWN


def test_the_record_wraps_both_methods_and_names_both_in_its_line():
    assert HOTFIX.method_names == ("forward_decode", "forward_extend")
    assert HOTFIX.targets_text.endswith("TRTLLMHAAttnBackend.forward_decode and forward_extend")
