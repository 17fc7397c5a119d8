"""The record of FlashInfer PR #4382 (first in FlashInfer 0.6.18), a bug of the separate reduction
kernel of FlashInfer's TRT-LLM-GEN attention that SGLang's ``trtllm_mha`` target verify reaches on
SM100. Recognised and reported, never patched: the bug is in FlashInfer's CUDA code
(``flashinfer_kernel_bugs``).

Standard library only.

The bug: when TRT-LLM-GEN splits the KV of a generation kernel across CTAs and merges the parts in
its separate reduction kernel (``csrc/fmhaReduction.cu``), that kernel placed a request's query rows
by the padded CTA stride rather than by the query length, and took the causal KV extent from the
CTA's index instead of its last query token: with several query tokens per request (target verify
of speculative decoding) rows are read from the wrong place and masked with the wrong extent.
Fixed in FlashInfer 0.6.18. FlashInfer sends grouped-query generation to that kernel for head_dim
512 (its split-V head_dim-512 kernels, ``fmhaKernels.cuh``): Gemma 4's global layers. Plain decode
(one query token) is not touched.

Who: speculative decoding (EAGLE, EAGLE3, MTP) whose target runs on ``trtllm_mha`` on SM100
(B200/B300), with head_dim-512 layers (Gemma 4, which SGLang serves from 0.5.11): target verify
gets wrong attention, so fewer draft tokens are accepted or wrong ones are.

Verdicts, from the code: ``unrepairable`` where ``forward_extend`` asks ``is_target_verify`` and
reaches FlashInfer's decode kernel, itself or through a method of the class (0.5.6 on; on SM90/SM120
that call runs XQA from 0.5.10, on SM100 TRT-LLM-GEN); ``not-applicable`` where it does not (0.5.1 to
0.5.5.post3: target verify runs the context kernel). Then the FlashInfer that runs
(``Hotfix.flashinfer_fix``): ``fixed`` from 0.6.18 on, ``not-applicable`` without FlashInfer. The
releases with the bug with their own pins: 0.5.6 to 0.5.18 (0.5.19 pins 0.6.18).
"""

import ast

from ..record import Verdict
from . import flashinfer_kernel_bugs as bugs

NAME = "flashinfer4382"
METHOD = "forward_extend"
FIRST_FIXED = "0.6.18"
REFERENCE = "FlashInfer PR #4382"
# What of this record depends on FlashInfer, for the README (tools/docs_tables.py).
FLASHINFER = "is a bug of FlashInfer before %s" % FIRST_FIXED
TARGET_VERIFY = "forward_batch.forward_mode.is_target_verify"

REASON = bugs.reason(
    "speculative decoding whose target runs on trtllm_mha on SM100 (B200/B300) with head_dim-512 layers (Gemma 4's "
    "global layers): target verify reaches TRT-LLM-GEN's separate reduction kernel, which reads the query rows and "
    "the causal extent of the wrong token",
    REFERENCE,
    FIRST_FIXED,
    "if you serve such a model with speculative decoding on SM100",
)


def classify(tree):
    """Classify the source of ``trtllm_mha_backend`` (an ``ast.Module``)."""
    refusal, cls, extend, verdict = bugs.live_class_and_method(tree, METHOD)
    if refusal:
        return refusal
    asks = any(isinstance(n, ast.Attribute) and ast.unparse(n) == TARGET_VERIFY for n in ast.walk(extend))
    if not asks or METHOD not in bugs.methods_reaching(cls):
        return verdict(
            Verdict.NOT_APPLICABLE,
            "forward_extend does not send target verify to FlashInfer's decode kernel (before SGLang 0.5.6 it runs "
            "the context kernel, which has no separate reduction)",
        )
    return verdict(Verdict.UNREPAIRABLE, REASON)


HOTFIX = bugs.hotfix(
    NAME,
    summary="FlashInfer's TRT-LLM-GEN separate reduction (SM100, head_dim 512: Gemma 4) indexes target verify's "
    "query rows and causal extent right (reported, never patched: FlashInfer's kernel)",
    effect="reported: FlashInfer's TRT-LLM-GEN reduction indexing",
    method=METHOD,
    classify=classify,
    first=FIRST_FIXED,
    reference=REFERENCE,
)
