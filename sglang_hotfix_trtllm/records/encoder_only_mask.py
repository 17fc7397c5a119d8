"""The hotfix record for SGLang 0.5.22's fix of bidirectional (``ENCODER_ONLY``) layers prefilled
with a causal mask by the TRT-LLM MHA backend (the pull request that made it was not found:
docs/records.md says how it was looked for).

Standard library only at import; FlashInfer's source is read (never imported) by
``flashinfer_problem``.

The bug (SGLang 0.5.1 to 0.5.21): ``TRTLLMHAAttnBackend.forward_extend`` prefills every layer with
a causal mask, an ``ENCODER_ONLY`` one included: TRT-LLM-GEN's context kernel
(``flashinfer.prefill.trtllm_batch_context_with_kv_cache``, SM100) gets no ``causal`` and runs its
default, causal; from 0.5.19 fmha_v2 (SM90/SM120) gets ``mask_mode="causal"``. 0.5.22 passes
``causal=layer.attn_type != AttentionType.ENCODER_ONLY`` and ``mask_mode=("padding" if
layer.attn_type == AttentionType.ENCODER_ONLY else "causal")``. Who: BERT-family embedding models
(BERT, XLM-R, Contriever), which declare ``ENCODER_ONLY`` layers and which SGLang serves on
``trtllm_mha`` by default on SM100 from 0.5.7 (any release with ``--attention-backend
trtllm_mha``): each token attends only to those before it, so embeddings and scores are wrong.

Repaired on SGLang 0.5.11 to 0.5.21's code (``AFFECTED``) by upstream's code (``code_edit``):
``forward_extend``, compiled from the installed file with 0.5.22's arguments in its prefill-kernel
calls, runs as SGLang's function: the context kernel's call gets 0.5.22's ``causal=`` keyword, and
fmha_v2's (0.5.19 on, SM90/SM120) 0.5.22's ``mask_mode=`` in place of the release's ``"causal"``.
From 0.5.16 the context kernel is called from ``_trtllm_context_attn``, a function nested in
``forward_extend``: the edit changes that call, so 0.5.16's context parallelism (its zigzag
strategy calls the nested function once per half of the batch) passes the argument on both calls,
as 0.5.22's code does. Every other argument and statement is the release's. The decode kernel
(target verify, draft extend, 0.5.19's ``_run_fixed_q_len_decode``) gets nothing new, as in 0.5.22.
Where 0.5.11 to 0.5.16 do not import ``AttentionType``, 0.5.22's import adds it to the module first.
On 0.5.19 to 0.5.21 record xqa_workspace edits the same method (fmha_v2's workspace): the method
runs both changes.

FlashInfer must take the argument: the FlashInfer that 0.5.12 to 0.5.21 pin does (0.6.11.post1 on;
0.5.16 to 0.5.18 pin 0.6.14, 0.6.15.post1 and 0.6.17, 0.5.19 to 0.5.21 0.6.18, each with ``causal:
bool = True``; 0.6.18's fmha_v2 takes ``mask_mode="padding"`` as non-causal), 0.5.11's (0.6.8.post1)
does not (its launcher hard-codes the causal mask). So for the installed SGLang the verdict also
reads the installed FlashInfer's ``prefill.py`` (``Hotfix.environment``): where its context kernel
has no ``causal`` parameter the verdict is ``unrepairable``, naming it (fmha_v2's ``mask_mode`` is
not read there: every FlashInfer with the fmha_v2 call these releases make takes it).

Not repaired (``unrepairable``, the release that fixes it named): 0.5.1 to 0.5.10, whose pinned
FlashInfer has no non-causal context kernel.

Verdicts, from the live ``forward_extend`` (the method the edit changes; the rest of the module
runs alike with the repair and with upstream's change applied to it): ``affected`` for 0.5.11 to
0.5.21's fingerprints; ``unrepairable`` for the fingerprints of 0.5.1 to 0.5.10
(``UNREPAIRABLE``); ``fixed`` when every context-kernel call passes 0.5.22's ``causal`` and every
fmha_v2 call its ``mask_mode`` (0.5.22 on); ``unknown`` otherwise.
"""

import ast
import os
import re

from .. import code_edit, detect, source
from . import trtllm_backend
from ..record import Hotfix, Verdict
from ..release_table import ReleaseTable

NAME = "encoder_only_mask"
# The oldest FlashInfer known to take ``causal`` on its context kernel (0.5.12's pin; 0.5.11's, 0.6.8.post1,
# does not). The product reads the installed kernel's signature; the README's release table, which has
# only each release's pinned version, compares it with this.
FLASHINFER_REPAIRABLE_FROM = "0.6.11.post1"
# What of this record depends on FlashInfer, for the README (tools/docs_tables.py).
FLASHINFER = (
    "is repaired only with a FlashInfer whose context kernel takes `causal` (%s does, 0.5.11's pin "
    "0.6.8.post1 does not)" % FLASHINFER_REPAIRABLE_FROM
)
CLASS_NAME = trtllm_backend.CLASS_NAME
METHOD = "forward_extend"
UPSTREAM = "SGLang 0.5.22"
CONTEXT_KERNEL = "trtllm_batch_context_with_kv_cache"
FMHA_V2_KERNEL = "trtllm_fmha_v2_prefill"
# 0.5.22's arguments, as ``ast.unparse`` writes them.
UPSTREAM_ARGUMENTS = {
    CONTEXT_KERNEL: ("causal", "layer.attn_type != AttentionType.ENCODER_ONLY"),
    FMHA_V2_KERNEL: ("mask_mode", "'padding' if layer.attn_type == AttentionType.ENCODER_ONLY else 'causal'"),
}

_PINNED_CAUSAL_ONLY = (
    "with the FlashInfer this release pins (no causal argument; its launcher hard-codes the causal mask) no "
    "argument gives upstream's attention, and this version repairs only SGLang 0.5.11 to 0.5.21's code"
)
# forward_extend of the releases with the bug this version repairs (SGLang 0.5.11's pinned FlashInfer
# lacks the argument: ``flashinfer_problem`` says so for the installed one).
AFFECTED = {
    "ast1:52036f0a3a55c1e1": "0.5.11 to 0.5.12.post1",
    "ast1:a230c20003012edf": "0.5.13 to 0.5.13.post1",
    "ast1:23f0c5516073f00a": "0.5.14 (FlashInfer 0.6.12; the query quantized by _maybe_quantize_q)",
    "ast1:2b30e4d3df0ce7c1": "0.5.15 to 0.5.15.post1",
    # The context kernel called from _trtllm_context_attn, nested in forward_extend (the edit changes
    # the call in the nested function).
    "ast1:4ad5c50d4b93e383": "0.5.16 (FlashInfer 0.6.14; under context parallelism the nested function runs twice)",
    "ast1:23f9337ee95778ca": "0.5.17 (FlashInfer 0.6.15.post1)",
    "ast1:b67ea40bc44f7dcd": "0.5.18 (FlashInfer 0.6.17)",
    # 0.5.19 on: on SM90/SM120 fmha_v2 prefills (the edit changes its mask_mode)
    "ast1:6431b3b2463a8083": "0.5.19 (FlashInfer 0.6.18)",
    "ast1:586829385e017f50": "0.5.20 (FlashInfer 0.6.18)",
    "ast1:a639d577cfcfba4f": "0.5.21 (FlashInfer 0.6.18)",
}
# forward_extend of the other releases with the bug -> why this version does not repair it there.
UNREPAIRABLE = {
    "ast1:7d36278b2fb2e186": _PINNED_CAUSAL_ONLY,  # 0.5.1 to 0.5.4.post1 (FlashInfer 0.2.11.post3 on)
    "ast1:9e5cb0ada11f2286": _PINNED_CAUSAL_ONLY,  # 0.5.4.post2 to 0.5.5.post3 (0.5.0)
    "ast1:698b90cde1f1e457": _PINNED_CAUSAL_ONLY,  # 0.5.6
    "ast1:6d6c1481adb5e890": _PINNED_CAUSAL_ONLY,  # 0.5.6.post1 to 0.5.8.post1
    "ast1:abb1c23985dd016b": _PINNED_CAUSAL_ONLY,  # 0.5.9 (0.6.3)
    "ast1:0aed86372ee6cb44": _PINNED_CAUSAL_ONLY,  # 0.5.10 to 0.5.10.post1 (0.6.7.post2 / .post3)
}

WHAT = (
    "ENCODER_ONLY (bidirectional) layers are prefilled with a causal mask: BERT-family embedding models (served on "
    "trtllm_mha by default on SM100 from SGLang 0.5.7) get wrong embeddings and scores. Not repaired: %s; upgrade "
    "to SGLang 0.5.22 if you serve encoder-only models with trtllm_mha"
)


# --------------------------------------------------------------------------
# The repair: upstream's change, as an edit of the release's own method

# 0.5.22 imports the name its arguments compare with; 0.5.11 to 0.5.16 do not (0.5.17 on do).
UPSTREAM_IMPORT = "from sglang.srt.layers.radix_attention import AttentionType"


def pass_the_layers_mask(method, tree):
    """0.5.22's change of ``forward_extend`` (and of ``_trtllm_context_attn``, nested in it from
    0.5.16): its one context-kernel call gets 0.5.22's ``causal=`` keyword, and its fmha_v2 call
    (0.5.19 on) 0.5.22's ``mask_mode=`` in place of the release's."""
    calls = kernel_calls(method)
    context = [call for name, call in calls if name == CONTEXT_KERNEL]
    fmha_v2 = [call for name, call in calls if name == FMHA_V2_KERNEL]
    if len(context) != 1 or len(fmha_v2) > 1:
        raise code_edit.EditMismatch(
            "%d context-kernel and %d fmha_v2 calls in %s (upstream's change has 1 and at most 1)"
            % (len(context), len(fmha_v2), method.name)
        )
    (call,) = context
    if any(k.arg == "causal" for k in call.keywords):
        raise code_edit.EditMismatch("the release already passes causal")
    call.keywords.append(_keyword(CONTEXT_KERNEL, call))
    for call in fmha_v2:
        given = [i for i, k in enumerate(call.keywords) if k.arg == "mask_mode"]
        if len(given) != 1:
            raise code_edit.EditMismatch("fmha_v2's call passes mask_mode %d times" % len(given))
        call.keywords[given[0]] = _keyword(FMHA_V2_KERNEL, call.keywords[given[0]])


def _keyword(kernel, beside):
    """0.5.22's keyword for ``kernel``, numbered from the line of ``beside`` (the call or the keyword
    it replaces)."""
    name, text = UPSTREAM_ARGUMENTS[kernel]
    value = ast.parse(text, mode="eval").body
    ast.increment_lineno(value, beside.end_lineno - 1)
    keyword = ast.keyword(arg=name, value=value)
    return ast.copy_location(keyword, value)


EDITS = (code_edit.Edit(METHOD, pass_the_layers_mask),)
NEW_NAMES = (code_edit.NewName("AttentionType", UPSTREAM_IMPORT, UPSTREAM, scope="module"),)


# --------------------------------------------------------------------------
# FlashInfer must take the argument


_CONTEXT_SIGNATURE = re.compile(r"\ndef %s\((.*?)\)\s*(?:->[^:]*)?:" % CONTEXT_KERNEL, re.S)


def flashinfer_problem():
    """None when the FlashInfer this Python would import takes ``causal`` on its context kernel (or
    there is none: no kernel runs), else why not. Reads ``flashinfer/prefill.py`` (found as the
    import system would, never imported); the text of the signature only, not a parse."""
    located = source.locate("flashinfer.prefill")
    if located.path is None:
        return None if not located.package_found else "FlashInfer's prefill module cannot be read: %s" % located.reason
    try:
        text = source.read_text(located.path)
    except (OSError, UnicodeDecodeError, ValueError) as error:
        return "cannot read %s: %s" % (located.path, error)
    found = _CONTEXT_SIGNATURE.search(text)
    if found is None:
        return "%s defines no %s" % (located.path, CONTEXT_KERNEL)
    if not re.search(r"\bcausal\b", found.group(1)):
        return (
            "the installed FlashInfer's %s takes no causal argument (%s; FlashInfer %s and later take "
            "it): no argument gives upstream's attention" % (CONTEXT_KERNEL, located.path, FLASHINFER_REPAIRABLE_FROM)
        )
    return None


def environment_problem():
    """``Hotfix.environment``: the unrepairable reason where the installed FlashInfer cannot take the repair."""
    problem = flashinfer_problem()
    return None if problem is None else WHAT % problem


# --------------------------------------------------------------------------
# Recognising the code


def kernel_calls(extend):
    """(kernel name, call node) for every call of the two prefill kernels in the method."""
    return [
        (node.func.attr, node)
        for node in ast.walk(extend)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in UPSTREAM_ARGUMENTS
    ]


def _passes_upstreams_argument(name, call):
    keyword, text = UPSTREAM_ARGUMENTS[name]
    given = [k for k in call.keywords if k.arg == keyword]
    return len(given) == 1 and ast.unparse(given[0].value) == text


def classify(tree):
    """Classify the source of ``trtllm_mha_backend`` (an ``ast.Module``)."""
    refusal, cls, extend, fingerprint, verdict = detect.live_method_classified(tree, CLASS_NAME, METHOD)
    if refusal:
        return refusal

    calls = kernel_calls(extend)
    if calls and all(_passes_upstreams_argument(name, call) for name, call in calls):
        return verdict(Verdict.FIXED, "every prefill kernel call passes the layer's mask (causal unless ENCODER_ONLY)")
    if fingerprint in AFFECTED:
        return verdict(
            Verdict.AFFECTED,
            "forward_extend prefills ENCODER_ONLY (bidirectional) layers with a causal mask (the context kernel's "
            "default; fmha_v2's mask_mode where the release calls it). Repaired: forward_extend runs 0.5.22's "
            "arguments, compiled into SGLang's function",
        )
    if fingerprint in UNREPAIRABLE:
        return verdict(Verdict.UNREPAIRABLE, WHAT % UNREPAIRABLE[fingerprint])
    return verdict(Verdict.UNKNOWN, "forward_extend is not the code of a release this hotfix knows")


HOTFIX = Hotfix(
    gpu_proof=(
        "on an H100 with 0.14.0, SGLang 0.5.19's ENCODER_ONLY prefill on Hopper's fmha_v2 (docs/gpu.md); not "
        "on Blackwell, whose TRT-LLM-GEN context kernel (SM100) no card at hand runs"
    ),
    name=NAME,
    upstream=UPSTREAM,
    summary="TRT-LLM MHA prefills ENCODER_ONLY (bidirectional) layers without a causal mask",
    effect="FlashInfer's TRT-LLM context kernel receives causal=False for ENCODER_ONLY layers",
    distribution="sglang",
    target="%s.%s.%s" % (trtllm_backend.MODULE, CLASS_NAME, METHOD),
    classify=detect.walked_once(classify),
    edits=EDITS,
    new_names=NEW_NAMES,
    environment=environment_problem,
    known_fingerprints=ReleaseTable(os.path.join(os.path.dirname(os.path.abspath(__file__)), NAME + "_releases.json")),
)
