"""The hotfix record for SGLang PR #17732 ("Canonicalize the strides when num_head = 1"): with one
KV head per rank, FlashInfer's TRT-LLM-GEN kernels get K/V cache views with canonical strides.

Standard library only at import; torch is reached at call time, from the process that already
runs it.

The bug (SGLang 0.5.1 to 0.5.8.post1): ``forward_decode`` and ``forward_extend`` hand FlashInfer's
TRT-LLM kernels ``kv_cache = (k_cache, v_cache)``, each the pool's per-layer buffer viewed as
``[pages, page_size, heads, head_dim]`` and permuted to ``[pages, heads, page_size, head_dim]``.
With one KV head on the rank (an 8-KV-head model at TP 8: Llama 4, many GQA models) the head
dimension has size 1 and the same stride as the page-size dimension (``[ps*D, D, D, 1]``), and
TRT-LLM-GEN's TMA descriptor, which takes the head stride as it is, rejects it: the server dies
at start with ``buildNdTmaDescriptor ... Check failed: false`` (FlashInfer issue #2232). Every
FlashInfer those releases pin (0.2.11.post3 to 0.6.1) passes the strides to the kernel
unchanged; only SM100 runs TRT-LLM-GEN (before 0.5.10, ``trtllm_mha`` is Blackwell-only).

Upstream's fix, in 0.5.9, after the two views in both methods::

    if layer.tp_k_head_num == 1:
        k_cache = canonicalize_stride(k_cache)
    if layer.tp_v_head_num == 1:
        v_cache = canonicalize_stride(v_cache)

where ``canonicalize_stride`` (``sglang.srt.layers.attention.utils``, absent before 0.5.9) returns
the tensor itself unless some size-1 dimension has the stride of the dimension after it, and
otherwise the same storage viewed with the strides of a contiguous tensor of its sizes
(``as_strided``).

The repair is upstream's code (``code_edit``): each method, compiled from the installed file with
0.5.9's two statements inserted right before its ``kv_cache = (k_cache, v_cache)``, runs as
SGLang's function; the affected releases do not ship ``canonicalize_stride``, so 0.5.9's own
definition (``UPSTREAM_CANONICALIZE_STRIDE``; a test holds it equal to the one in 0.5.9's wheel)
becomes a global of the backend module first.

Verdicts, from the live ``forward_decode`` and ``forward_extend`` together: ``affected`` when they
are, by fingerprint, the code of 0.5.1 to 0.5.8.post1 (the methods the edit changes; the rest of
the module runs alike with the repair and with upstream's change applied to it);
``fixed`` when each method, or the ``_reshape_paged_kv_cache`` it calls (0.5.16 on), holds
upstream's two statements and the module imports ``canonicalize_stride``; ``unknown`` otherwise.
"""

import ast
import os

from .. import code_edit, detect
from . import pr28144
from . import trtllm_backend
from ..fingerprint import of_node
from ..record import Classification, Hotfix, Verdict
from ..release_table import ReleaseTable

CLASS_NAME = trtllm_backend.CLASS_NAME
METHODS = ("forward_decode", "forward_extend")
RESHAPE_HELPER = "_reshape_paged_kv_cache"  # 0.5.16 on: the views and upstream's statements, in one helper
UPSTREAM = "SGLang 0.5.9 (PR #17732)"
UPSTREAM_FUNCTION = "canonicalize_stride"
UPSTREAM_STATEMENTS = {
    side: "if layer.tp_%s_head_num == 1:\n    %s_cache = %s(%s_cache)" % (side, side, UPSTREAM_FUNCTION, side)
    for side in "kv"
}


# --------------------------------------------------------------------------
# The repair: upstream's change, as an edit of the release's own methods

KV_PAIR = "kv_cache = (k_cache, v_cache)"
# SGLang 0.5.9's canonicalize_stride, verbatim (sglang/srt/layers/attention/utils.py), which the
# affected releases do not ship.
UPSTREAM_CANONICALIZE_STRIDE = '''\
def canonicalize_stride(tensor: torch.Tensor) -> torch.Tensor:
    """
    Adjust degenerate strides for a tensor, make it canonical.
    """
    sizes = tensor.size()
    strides = tensor.stride()
    ndim = tensor.dim()

    need_fix = any(
        sizes[i] == 1 and strides[i] == strides[i + 1] for i in range(ndim - 1)
    )

    if not need_fix:
        return tensor

    # canonicalize the stride
    # Example:
    # - shape: [num_pages, 1, 64, 128]
    # - stride: [8192, 128, 128, 1] (wrong!)
    # Gives new stride: [8192, 8192, 128 ,1] (correct!)
    new_strides = [0] * ndim
    new_strides[-1] = 1
    for i in range(ndim - 2, -1, -1):
        new_strides[i] = new_strides[i + 1] * sizes[i + 1]

    return tensor.as_strided(sizes, new_strides)
'''


def canonicalize_one_head_views(method, tree):
    """PR #17732 on one of the release's two methods: 0.5.9's two statements right before its one
    ``kv_cache = (k_cache, v_cache)``, where 0.5.9 has them."""
    places = [
        (body, index)
        for body in code_edit.statement_lists(method)
        for index, statement in enumerate(body)
        if ast.unparse(statement) == KV_PAIR
    ]
    if len(places) != 1:
        raise code_edit.EditMismatch(
            "%d statements `%s` in %s (upstream's change has one)" % (len(places), KV_PAIR, method.name)
        )
    body, index = places[0]
    line = body[index].lineno
    body[index:index] = [code_edit.statement_at(UPSTREAM_STATEMENTS[side], line) for side in "kv"]


EDITS = tuple(code_edit.Edit(name, canonicalize_one_head_views) for name in METHODS)
NEW_NAMES = (code_edit.NewName(UPSTREAM_FUNCTION, UPSTREAM_CANONICALIZE_STRIDE, UPSTREAM, scope="module"),)


# --------------------------------------------------------------------------
# Recognising the code

# (forward_decode, forward_extend) fingerprints of the affected releases: pr28144's pins of the
# same releases (both records pin the pair of methods as a whole).
AFFECTED = {
    pair: releases
    for pair, releases in pr28144.AFFECTED.items()
    if releases in ("0.5.1 to 0.5.4.post1", "0.5.4.post2 to 0.5.5.post3", "0.5.6", "0.5.6.post1 to 0.5.8.post1")
}


def _holds_upstreams_statements(function):
    """Upstream's two statements, k's then v's, next to each other in the function's own body (not
    under another statement) and before it returns or calls a kernel: where 0.5.9's methods and
    0.5.16's helper have them. Anywhere else they may not run, or run too late."""
    texts = [ast.unparse(statement) for statement in function.body]
    pair = [UPSTREAM_STATEMENTS["k"], UPSTREAM_STATEMENTS["v"]]
    starts = [i for i in range(len(texts) - 1) if texts[i : i + 2] == pair]
    if len(starts) != 1:
        return False
    ends = [
        i
        for i, statement in enumerate(function.body)
        if any(
            isinstance(node, ast.Return)
            or (isinstance(node, ast.Attribute) and node.attr in trtllm_backend.KERNELS.values())
            for node in ast.walk(statement)
        )
    ]
    return not ends or starts[0] < ends[0]


def _calls_self(function, name):
    return any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == name
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "self"
        for node in ast.walk(function)
    )


def _imports_upstream_function(tree):
    return any(
        isinstance(node, ast.ImportFrom)
        and (node.module or "").startswith("sglang.")
        and any(alias.name == UPSTREAM_FUNCTION and alias.asname is None for alias in node.names)
        for node in tree.body
    )


def classify(tree):
    """Classify the source of ``trtllm_mha_backend`` (an ``ast.Module``)."""
    refusal, cls, live, methods, fingerprint, first_lines = pr28144.kernel_callers(tree, (RESHAPE_HELPER,))
    if refusal:
        return refusal

    def verdict(value, reason):
        return Classification(value, reason, fingerprint, first_lines)

    pair = tuple(of_node(m) for m in methods)
    if pair in AFFECTED:
        return verdict(
            Verdict.AFFECTED,
            "forward_decode and forward_extend pass FlashInfer's TRT-LLM kernels K/V cache views whose head "
            "dimension, with one KV head on the rank, has the page dimension's stride (TRT-LLM-GEN's TMA "
            "descriptor rejects it). Repaired: the two methods run 0.5.9's statements, compiled into SGLang's "
            "functions",
        )
    helper, helper_problem = live[RESHAPE_HELPER]
    fixed = [
        _holds_upstreams_statements(m)
        or (
            helper is not None
            and not helper_problem
            and _calls_self(m, RESHAPE_HELPER)
            and _holds_upstreams_statements(helper)
        )
        for m in methods
    ]
    if all(fixed) and _imports_upstream_function(tree):
        return verdict(
            Verdict.FIXED,
            "forward_decode and forward_extend canonicalize a one-head K/V cache view's strides (SGLang 0.5.9, "
            "PR #17732)",
        )
    if all(fixed):
        # A fork with upstream's statements whose canonicalize_stride is not SGLang's import: the
        # statements are the fix only if the function is upstream's, which this analysis cannot see.
        return verdict(
            Verdict.UNKNOWN,
            "forward_decode and forward_extend hold upstream's %s statements (SGLang 0.5.9, PR #17732), but the "
            "module does not import %s from SGLang's attention utils as every release does (defined or bound "
            "here otherwise): whether it is upstream's function is not known" % (UPSTREAM_FUNCTION, UPSTREAM_FUNCTION),
        )
    return verdict(
        Verdict.UNKNOWN,
        "forward_decode / forward_extend are not the code of a release this hotfix knows (fingerprints %s / %s)" % pair,
    )


HOTFIX = Hotfix(
    gpu_proof="none: its kernels (TRT-LLM-GEN) run on Blackwell (SM100) only, and no Blackwell card was at hand",
    name="pr17732",
    upstream=UPSTREAM,
    summary="TRT-LLM MHA decode and extend pass TRT-LLM-GEN K/V cache views with canonical strides when the "
    "rank holds one KV head (the server no longer dies in buildNdTmaDescriptor)",
    effect="FlashInfer's TRT-LLM kernels receive one-head K/V cache views with canonical strides",
    distribution="sglang",
    target="%s.%s.%s" % (trtllm_backend.MODULE, CLASS_NAME, METHODS[0]),
    also=METHODS[1:],
    classify=detect.walked_once(classify),
    edits=EDITS,
    new_names=NEW_NAMES,
    known_fingerprints=ReleaseTable(os.path.join(os.path.dirname(os.path.abspath(__file__)), "pr17732_releases.json")),
)
