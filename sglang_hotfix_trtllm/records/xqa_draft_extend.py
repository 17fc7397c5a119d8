"""The record for SGLang 0.5.22's fix of EAGLE/MTP draft extend on XQA (the pull request that
made it was not found: docs/records.md says how it was looked for). A record that recognises
the bug and says so: no wrapper reproduces upstream's change exactly, so it never patches.

Standard library only.

The bug: speculative decoding (EAGLE, EAGLE3, MTP/NEXTN) with a ``trtllm_mha`` draft on SM90/SM120,
where ``TRTLLMHAAttnBackend.forward_extend`` sends draft extend (``DRAFT_EXTEND_V2``) to FlashInfer's
decode kernel, which runs XQA there:

* with an FP8 KV cache the method casts the query to FP8 first (``q = q.to(torch.float8_e4m3fn)``
  unless ``self.is_xqa_impl and is_target_verify()``; in 0.5.14 ``_maybe_quantize_q(q,
  force_fp8=not is_target_verify())``), and XQA asserts ``output.dtype == q.dtype``;
* draft extend has several query tokens per request and the call passes no mask (``mask`` only for
  target verify from 0.5.21; no mask at all in 0.5.14 to 0.5.20, where target verify with several
  tokens per request stops at the same assert), and XQA asserts a mask whenever ``q_seq_len > 1``.

The server dies at the draft-extend CUDA-graph capture (or at the first draft extend without
graphs). 0.5.22 keeps BF16 Q for every call on the decode kernel (``uses_decode_kernel =
is_target_verify() or is_draft_extend_v2()``; the cast only ``if not self.is_xqa_impl or not
uses_decode_kernel``) and passes ``self._xqa_spec_dec_mask if self.forward_metadata.max_seq_len_q >
1 else None``.

Why no repair: the FP8 cast is a statement inside ``forward_extend``, before any kernel call; at
the kernel the query is already rounded to FP8, and casting it back is not upstream's BF16 query.
Avoiding the cast from outside would mean changing ``self.data_type`` for the call, which the same
method also reads for the KV write and the K/V scales. Before 0.5.21 the static mask buffer does not
exist either. So this record only recognises the code, and ``status`` says NOT PROTECTED on it,
naming the release that fixes it.

Verdicts, from the live ``forward_extend``: ``unrepairable`` when it is, by fingerprint, the code of
a release that carries the bug (``UNREPAIRABLE``), the module binding ``flashinfer`` once;
``fixed`` when it holds 0.5.22's three statements (``uses_decode_kernel``, the cast's condition on
it, the mask on ``max_seq_len_q > 1``); ``not-applicable`` when the method never tells draft extend
apart (``is_draft_extend_v2``), so it has no draft-extend route to the decode kernel (0.5.13.post1
and earlier); ``unknown`` otherwise. The releases with the bug: 0.5.14 to 0.5.21.
"""

import ast
import os

from .. import detect
from . import trtllm_kernel_site as site
from ..record import Hotfix, Verdict, reports_only
from ..release_table import ReleaseTable

NAME = "xqa_draft_extend"
CLASS_NAME = site.CLASS_NAME
METHOD = "forward_extend"
UPSTREAM = "SGLang 0.5.22"

# forward_extend of the releases that carry the bug (the scan of their sources: draft extend on
# the decode kernel, with the FP8 query cast and without a mask).
UNREPAIRABLE = {
    "ast1:23f0c5516073f00a": "0.5.14",  # the cast through _maybe_quantize_q(q, force_fp8=not is_target_verify())
    "ast1:2b30e4d3df0ce7c1": "0.5.15 to 0.5.15.post1",
    "ast1:4ad5c50d4b93e383": "0.5.16",
    "ast1:23f9337ee95778ca": "0.5.17",
    "ast1:b67ea40bc44f7dcd": "0.5.18",
    "ast1:6431b3b2463a8083": "0.5.19",
    "ast1:586829385e017f50": "0.5.20",
    "ast1:a639d577cfcfba4f": "0.5.21",
}

# 0.5.22's statements, as ``ast.unparse`` writes them.
USES_DECODE_KERNEL = (
    "uses_decode_kernel = forward_batch.forward_mode.is_target_verify() or "
    "forward_batch.forward_mode.is_draft_extend_v2()"
)
CAST_CONDITION = "not self.is_xqa_impl or not uses_decode_kernel"
MASK = "self._xqa_spec_dec_mask if self.forward_metadata.max_seq_len_q > 1 else None"

REASON = (
    "EAGLE/MTP with a trtllm_mha draft on SM90/SM120 (XQA): draft extend reaches XQA with an FP8-cast query "
    "(FP8 KV cache) and no spec-decoding mask, and FlashInfer's asserts stop the server at CUDA-graph capture. "
    "The cast is inside forward_extend, before the kernel call, so no wrapper gives upstream's BF16 query "
    "(and before 0.5.21 the mask buffer is missing too); "
    "upgrade to SGLang 0.5.22 if you run speculative decoding with trtllm_mha on Hopper or SM120 "
    "(other deployments do not reach this code)"
)


def _fixed_in_substance(extend):
    """0.5.22's three statements in the method: BF16 Q and the mask for every call on the decode kernel."""
    texts = {ast.unparse(node) for node in ast.walk(extend) if isinstance(node, (ast.stmt, ast.expr))}
    return USES_DECODE_KERNEL in texts and CAST_CONDITION in texts and MASK in texts


def _tells_draft_extend_apart(extend):
    return any(isinstance(n, ast.Attribute) and n.attr == "is_draft_extend_v2" for n in ast.walk(extend))


def classify(tree):
    """Classify the source of ``trtllm_mha_backend`` (an ``ast.Module``)."""
    refusal, _, extend, fingerprint, verdict = detect.live_method_classified(tree, CLASS_NAME, METHOD)
    if refusal:
        return refusal

    if not _tells_draft_extend_apart(extend):
        return verdict(
            Verdict.NOT_APPLICABLE,
            "forward_extend has no draft-extend route to the decode kernel (is_draft_extend_v2 is never asked)",
        )
    if _fixed_in_substance(extend):
        return verdict(
            Verdict.FIXED, "draft extend and target verify on the decode kernel keep BF16 Q and get the mask on XQA"
        )
    if fingerprint not in UNREPAIRABLE:
        return verdict(Verdict.UNKNOWN, "forward_extend is not the code of a release this hotfix knows")
    return verdict(Verdict.UNREPAIRABLE, REASON)


HOTFIX = Hotfix(
    name=NAME,
    upstream=UPSTREAM,
    summary="EAGLE/MTP draft extend on XQA (SM90/SM120) keeps BF16 Q and gets the spec-decoding mask; "
    "recognised and reported, never patched",
    effect="reported only",
    distribution="sglang",
    target="%s.%s.%s" % (site.MODULE, CLASS_NAME, METHOD),
    classify=classify,
    wrapper=reports_only,
    known_fingerprints=ReleaseTable(os.path.join(os.path.dirname(os.path.abspath(__file__)), NAME + "_releases.json")),
)
