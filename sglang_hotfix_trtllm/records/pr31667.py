"""The hotfix record for SGLang PR #31667 ("Make Q contiguous before TRT-LLM MHA decode"): on
XQA, FlashInfer's decode kernel gets a packed query.

Standard library only at import.

The bug (SGLang 0.5.11 to 0.5.15.post1): ``forward_decode`` prepares the query with
``q = q.reshape(-1, layer.tp_q_head_num, layer.head_dim)`` (PR #22517 replaced
``.contiguous().view(...)``) and passes it to ``flashinfer.decode.trtllm_batch_decode_with_kv_cache``.
On SM90/SM120 that kernel is XQA, whose wrapper reads only ``q.data_ptr()`` and assumes packed rows
(FlashInfer 0.6.7.post2 to 0.6.14; TRT-LLM-GEN on SM100 honours strides). The query is a strided
view in every Llama-family model, EAGLE3 Llama draft and gpt-oss (a split of the fused QKV
projection, rotated in place), so every row after the first of a decode batch attends with the
wrong query. Upstream's fix, in 0.5.16::

    if self.is_xqa_impl:
        q = q.contiguous().view(-1, layer.tp_q_head_num, layer.head_dim)
    else:
        q = q.reshape(-1, layer.tp_q_head_num, layer.head_dim)

The repair is upstream's code (``code_edit``): the release's own ``forward_decode``, compiled from
the installed file with its ``q = q.reshape(...)`` replaced by 0.5.16's statement above, runs as
SGLang's function (with the other records' edits of the method, when they are in force). The
kernel gets what 0.5.16's statement makes, because it is 0.5.16's statement.

Verdicts, from the live ``forward_decode``: ``affected`` when it is, by fingerprint, the code of
0.5.11 to 0.5.15.post1 (the method the edit changes; the rest of the module runs alike with the
repair and with upstream's change applied to it); ``fixed`` when XQA gets a packed query:
upstream's statement above (0.5.16 on), or an XQA path with ``.contiguous().view`` and no
``reshape`` of ``q`` (0.5.10.x); ``not-applicable`` when the method has no XQA path and packs its
query (0.5.1 to 0.5.9); ``unknown`` otherwise.
"""

import ast
import os

from .. import code_edit, detect
from . import trtllm_backend
from ..fingerprint import of_node
from ..record import Classification, Hotfix, Verdict
from ..release_table import ReleaseTable

CLASS_NAME = trtllm_backend.CLASS_NAME
METHOD = "forward_decode"
UPSTREAM = "SGLang 0.5.16 (PR #31667)"
PACKED = "q = q.contiguous().view(-1, layer.tp_q_head_num, layer.head_dim)"
RESHAPED = "q = q.reshape(-1, layer.tp_q_head_num, layer.head_dim)"
UPSTREAM_STATEMENT = "if self.is_xqa_impl:\n    %s\nelse:\n    %s" % (PACKED, RESHAPED)


# --------------------------------------------------------------------------
# The repair: upstream's change, as an edit of the release's own method


def pack_the_query_on_xqa(method, tree):
    """PR #31667 on the release's ``forward_decode``: its one ``q = q.reshape(...)`` becomes 0.5.16's
    ``if self.is_xqa_impl: ... else: ...`` (every affected release sets ``is_xqa_impl``)."""
    code_edit.replace_statement(method, RESHAPED, UPSTREAM_STATEMENT)


EDITS = (code_edit.Edit(METHOD, pack_the_query_on_xqa),)


# --------------------------------------------------------------------------
# Recognising the code

# forward_decode fingerprints of the affected releases.
AFFECTED = {
    "ast1:cc7da69ada8dbf71": "0.5.11 to 0.5.12.post1",
    "ast1:f770ae4e23ceb6fc": "0.5.13 to 0.5.13.post1",
    "ast1:408cfdc71c08e784": "0.5.14",
    "ast1:310a46c669f7e1c9": "0.5.15 to 0.5.15.post1",
}


def _statements(method):
    return [ast.unparse(node) for node in ast.walk(method) if isinstance(node, ast.stmt)]


def _reads_xqa(method):
    return any(
        isinstance(node, ast.Attribute)
        and node.attr == "is_xqa_impl"
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
        for node in ast.walk(method)
    )


def classify(tree):
    """Classify the source of ``trtllm_mha_backend`` (an ``ast.Module``)."""
    cls, class_problem = detect.live_class(tree, CLASS_NAME)
    if cls is None:
        return Classification(Verdict.UNKNOWN, class_problem, of_node(tree))
    live = detect.live_methods(tree, cls, (METHOD,))
    method, problem = live[METHOD]
    if method is None:
        return Classification(Verdict.UNKNOWN, problem or "%s.%s not found" % (CLASS_NAME, METHOD), of_node(cls))
    fingerprint = of_node(method)

    def verdict(value, reason):
        return Classification(value, reason, fingerprint, detect.first_line_of(method))

    statements = _statements(method)
    if fingerprint in AFFECTED:
        return verdict(
            Verdict.AFFECTED,
            "forward_decode passes FlashInfer's XQA decode kernel `q.reshape(...)`, a strided view of a split QKV "
            "projection, which XQA reads as packed rows. Repaired: forward_decode runs 0.5.16's statement, "
            "compiled into SGLang's function",
        )
    if statements.count(UPSTREAM_STATEMENT) == 1:
        return verdict(
            Verdict.FIXED, "on XQA forward_decode packs the query (`.contiguous().view`, SGLang 0.5.16, PR #31667)"
        )
    if statements.count(PACKED) == 1 and RESHAPED not in statements:
        if _reads_xqa(method):
            return verdict(
                Verdict.FIXED, "forward_decode packs the query for XQA (`.contiguous().view`, as 0.5.16 does)"
            )
        return verdict(
            Verdict.NOT_APPLICABLE,
            "forward_decode has no XQA path (SGLang's XQA decode arrived in 0.5.10) and packs its query",
        )
    return verdict(
        Verdict.UNKNOWN, "forward_decode is not the code of a release this hotfix knows (fingerprint %s)" % fingerprint
    )


HOTFIX = Hotfix(
    gpu_proof=(
        "on an H200, SGLang 0.5.12's forward_decode into FlashInfer 0.6.11.post1's XQA with a strided query, "
        "and a real 0.5.12 server; again on an H100 with 0.14.0 (docs/gpu.md)"
    ),
    name="pr31667",
    upstream=UPSTREAM,
    summary="TRT-LLM MHA decode on XQA (Hopper, SM120) passes FlashInfer a packed query, not a strided view",
    effect="FlashInfer's XQA decode kernel receives the query packed",
    distribution="sglang",
    target="%s.%s.%s" % (trtllm_backend.MODULE, CLASS_NAME, METHOD),
    classify=detect.walked_once(classify),
    edits=EDITS,
    known_fingerprints=ReleaseTable(os.path.join(os.path.dirname(os.path.abspath(__file__)), "pr31667_releases.json")),
)
