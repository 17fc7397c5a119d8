"""The record of FlashInfer PR #4161 (first in FlashInfer 0.6.17), a bug of FlashInfer's generic XQA
decode kernel that SGLang's ``trtllm_mha`` decode reaches on Hopper and SM120. Recognised and
reported, never patched: the bug is in FlashInfer's CUDA code (``flashinfer_kernel_bugs``).

Standard library only.

The bug: in multi-block mode (XQA splits one sequence across CTAs, at small batch) every CTA of a
sub-sequence writes its own tile to the output, not only the last one, which merges them: the
partial writes race the merged one (under a sliding window an empty sub-sequence writes zeros).
Fixed in FlashInfer 0.6.17 (``csrc/xqa/mha.cu``: the output write gated on the last CTA, as
``mha_sm90.cu`` already did). The generic kernel runs on SM120 for every KV dtype and on SM90 for a
BF16/FP16 KV cache (FlashInfer's ``xqa`` sends an FP8 cache on SM90 to ``mha_sm90.cu``, which
writes once). SM100 decodes on TRT-LLM-GEN, not XQA.

Who: ``trtllm_mha`` decode on H100/H200 (BF16/FP16 KV cache) or SM120 GPUs, any model, at batch
sizes small enough for multi-block XQA; sliding-window layers (gpt-oss, Gemma) most. On an
H100 a 64 s stress of FlashInfer 0.6.16's XQA did not show it (docs/gpu.md): it is a race.

Verdicts, from the code: ``unrepairable`` where the backend's ``__init__`` sets ``is_xqa_impl`` (its
choice of XQA for decode on SM90/SM120: 0.5.10 on) and ``forward_decode`` reaches FlashInfer's
decode kernel; ``not-applicable`` where ``__init__`` never sets it (0.5.9 and earlier: decode runs on
TRT-LLM-GEN, SM100 only); ``unknown`` where it sets it but decode reaches no decode kernel. Then the
FlashInfer that runs (``Hotfix.flashinfer_fix``): ``fixed`` from 0.6.17 on, ``not-applicable``
without FlashInfer. The releases with the bug with their own pins: 0.5.10 to 0.5.17 (0.5.18 pins
0.6.17).
"""

from ..record import Verdict
from . import flashinfer_kernel_bugs as bugs

NAME = "flashinfer4161"
METHOD = "forward_decode"
FIRST_FIXED = "0.6.17"
REFERENCE = "FlashInfer PR #4161"
# What of this record depends on FlashInfer, for the README (tools/docs_tables.py).
FLASHINFER = "is a bug of FlashInfer before %s" % FIRST_FIXED
XQA_CHOICE = "is_xqa_impl"

REASON = bugs.reason(
    "trtllm_mha decode on Hopper (BF16/FP16 KV cache) or SM120 runs FlashInfer's XQA kernel, whose multi-block "
    "mode lets every CTA of a split sequence write the output, racing the merged write (zeros under a sliding "
    "window): at small batch, any model",
    REFERENCE,
    FIRST_FIXED,
    "where you decode on trtllm_mha on Hopper or SM120",
)


def classify(tree):
    """Classify the source of ``trtllm_mha_backend`` (an ``ast.Module``)."""
    refusal, cls, decode, verdict = bugs.live_class_and_method(tree, METHOD)
    if refusal:
        return refusal
    init = [f for f in cls.body if getattr(f, "name", None) == "__init__"]
    if not init or not bugs.sets_attribute(init[-1], XQA_CHOICE):
        return verdict(
            Verdict.NOT_APPLICABLE,
            "decode never runs on XQA: __init__ sets no is_xqa_impl (trtllm_mha decodes on Hopper and SM120, through "
            "XQA, from SGLang 0.5.10)",
        )
    if METHOD not in bugs.methods_reaching(cls):
        return verdict(
            Verdict.UNKNOWN, "forward_decode reaches no FlashInfer decode kernel: code this record does not know"
        )
    return verdict(Verdict.UNREPAIRABLE, REASON)


HOTFIX = bugs.hotfix(
    NAME,
    summary="FlashInfer's XQA decode (Hopper with a BF16/FP16 KV cache, SM120) writes each multi-block output once, "
    "from the last CTA (reported, never patched: FlashInfer's kernel)",
    effect="reported: FlashInfer's multi-block XQA output race",
    method=METHOD,
    classify=classify,
    first=FIRST_FIXED,
    reference=REFERENCE,
)
