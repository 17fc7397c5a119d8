"""The record for SGLang 0.5.22's fix of EAGLE/MTP draft extend on XQA (the pull request that
made it was not found: docs/records.md says how it was looked for). Repaired on 0.5.21 by running
0.5.22's statements in SGLang's ``forward_extend`` (``code_edit``); recognised and reported on 0.5.14
to 0.5.20, where 0.5.22's change does not apply as written.

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

The repair, on 0.5.21: the method's own code with 0.5.22's three statements (the binding, the cast's
condition, the mask), compiled into SGLang's function. 0.5.21 already makes the mask buffer
(``_xqa_spec_dec_mask``) and passes it to target verify, so 0.5.22's change applies as upstream wrote
it. Before 0.5.21 the buffer does not exist (0.5.14 to 0.5.20): 0.5.22's ``mask=`` would read an
attribute the release never sets, so there the record only recognises the code, and ``status`` says
NOT PROTECTED on it, naming the release that fixes it.

Verdicts, from the live ``forward_extend``: ``affected`` for 0.5.21's fingerprint (``AFFECTED``);
``unrepairable`` when it is, by fingerprint, the code of 0.5.14 to 0.5.20 (``UNREPAIRABLE``);
``fixed`` when it holds 0.5.22's three statements in their roles (``uses_decode_kernel`` bound once
in the method's body, the FP8 cast's test with the condition on it, every ``mask=`` passing the mask
on ``max_seq_len_q > 1``); ``not-applicable`` when draft extend has no route to the decode kernel
(the method never asks ``is_draft_extend_v2``, calls no decode helper, reaches ``flashinfer.decode``
only under ``if forward_batch.forward_mode.is_target_verify():``, and every name it reads is bound:
0.5.13.post1 and earlier); ``unknown`` otherwise. The releases with the bug: 0.5.14 to 0.5.21. Every
single-statement mutant of 0.5.14's and 0.5.21's method is ``unknown`` (test_reported_records): the
verdict pins the method by fingerprint.
"""

import ast
import builtins
import os

from .. import code_edit, detect
from . import trtllm_backend
from ..record import Hotfix, Verdict
from ..release_table import ReleaseTable

NAME = "xqa_draft_extend"
CLASS_NAME = trtllm_backend.CLASS_NAME
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
}
# forward_extend of the release this record repairs: 0.5.21 has 0.5.22's mask buffer
# (``_xqa_spec_dec_mask``, passed to target verify already), so 0.5.22's change applies as it is.
AFFECTED = {"ast1:a639d577cfcfba4f": "0.5.21"}

# 0.5.22's statements, as ``ast.unparse`` writes them, and the release's (0.5.21) they replace.
USES_DECODE_KERNEL = (
    "uses_decode_kernel = forward_batch.forward_mode.is_target_verify() or "
    "forward_batch.forward_mode.is_draft_extend_v2()"
)
CAST_CONDITION = "not self.is_xqa_impl or not uses_decode_kernel"
FP8_KV_TEST = "self.data_type == torch.float8_e4m3fn"  # the cast's other term, as in every release
MASK = "self._xqa_spec_dec_mask if self.forward_metadata.max_seq_len_q > 1 else None"
RELEASE_CAST_CONDITION = "not self.is_xqa_impl or not forward_batch.forward_mode.is_target_verify()"
RELEASE_MASK = (
    "self._xqa_spec_dec_mask if forward_batch.forward_mode.is_target_verify() and "
    "self.forward_metadata.max_seq_len_q > 1 else None"
)

WHAT = (
    "EAGLE/MTP with a trtllm_mha draft on SM90/SM120 (XQA): draft extend reaches XQA with an FP8-cast query "
    "(FP8 KV cache) and no spec-decoding mask, and FlashInfer's asserts stop the server at CUDA-graph capture"
)
REASON = WHAT + (
    ". Not repaired on this release: the spec-decoding mask 0.5.22 passes (self._xqa_spec_dec_mask, a buffer "
    "0.5.21 made) does not exist in it, so 0.5.22's change does not apply as upstream wrote it (this version "
    "repairs 0.5.21 only); upgrade to SGLang 0.5.22 if you run speculative decoding with trtllm_mha on Hopper or "
    "SM120 (other deployments do not reach this code)"
)


# --------------------------------------------------------------------------
# The repair (0.5.21): upstream's change, as an edit of the release's own method


def keep_bf16_query_and_pass_the_mask(extend, tree):
    """0.5.22's change of 0.5.21's ``forward_extend``: ``uses_decode_kernel`` bound right before
    ``q_scale = 1.0``, the FP8 cast's condition on it, and the spec-decoding mask passed whenever
    ``max_seq_len_q > 1`` (not only in target verify). (0.5.22 also folds 0.5.21's ``is_decode_mode``,
    the same expression, into ``uses_decode_kernel``; that rename changes nothing and is left out.)"""
    (at,) = [i for i, s in enumerate(extend.body) if ast.unparse(s) == "q_scale = 1.0"] or [None]
    if at is None:
        raise code_edit.EditMismatch("forward_extend has no `q_scale = 1.0` of its own")
    conditions = [n for n in ast.walk(extend) if ast.unparse(n) == RELEASE_CAST_CONDITION]
    masks = [n for n in ast.walk(extend) if isinstance(n, ast.Assign) and ast.unparse(n.value) == RELEASE_MASK]
    if len(conditions) != 1 or len(masks) != 1:
        raise code_edit.EditMismatch(
            "%d FP8-cast conditions and %d masks as 0.5.21 writes them (upstream's change has one each)"
            % (len(conditions), len(masks))
        )
    extend.body.insert(at, code_edit.statement_at(USES_DECODE_KERNEL, extend.body[at].lineno))
    parents = [n for n in ast.walk(extend) if isinstance(n, ast.BoolOp) and conditions[0] in n.values]
    if len(parents) != 1:
        raise code_edit.EditMismatch("the FP8 cast's condition is not one term of its test")
    condition = ast.parse(CAST_CONDITION, mode="eval").body
    ast.increment_lineno(condition, conditions[0].lineno - 1)
    parents[0].values[parents[0].values.index(conditions[0])] = condition
    mask = ast.parse(MASK, mode="eval").body
    ast.increment_lineno(mask, masks[0].value.lineno - 1)
    masks[0].value = mask


EDITS = (code_edit.Edit(METHOD, keep_bf16_query_and_pass_the_mask),)


def _fixed_in_substance(extend):
    """0.5.22's three statements in the roles 0.5.22 gives them: ``uses_decode_kernel`` bound once,
    in the method's own body, to 0.5.22's expression; every FP8 cast of the query under an ``if``
    whose test has 0.5.22's condition and the FP8 cache's test among its ``and`` terms; and every call that passes
    ``mask=`` passing 0.5.22's expression, inline or through a name bound to it just before, in
    the same block."""
    bindings = [
        n
        for n in ast.walk(extend)
        if isinstance(n, ast.Assign) and "uses_decode_kernel" in {ast.unparse(t) for t in n.targets}
    ]
    if len(bindings) != 1 or bindings[0] not in extend.body or ast.unparse(bindings[0]) != USES_DECODE_KERNEL:
        return False
    casts = 0
    masks = 0
    for node in ast.walk(extend):
        if isinstance(node, ast.If) and _asks_kv_dtype(node.test) and any(_is_query_fp8_cast(s) for s in node.body):
            terms = node.test.values if isinstance(node.test, ast.BoolOp) and isinstance(node.test.op, ast.And) else []
            if not {FP8_KV_TEST, CAST_CONDITION} <= {ast.unparse(term) for term in terms}:
                return False
            casts += 1
        for block in (getattr(node, field, None) for field in ("body", "orelse")):
            if not isinstance(block, list):
                continue
            for index, statement in enumerate(block):
                for call in (c for c in _own_expressions(statement) if isinstance(c, ast.Call)):
                    for keyword in (k for k in call.keywords if k.arg == "mask"):
                        if not _passes_mask(keyword.value, block[index - 1] if index else None):
                            return False
                        masks += 1
    return casts > 0 and masks > 0


def _own_expressions(statement):
    """The nodes of a statement that no statement nested in it holds (its calls, not its body's)."""
    pending = [child for child in ast.iter_child_nodes(statement) if not isinstance(child, ast.stmt)]
    while pending:
        node = pending.pop()
        yield node
        pending.extend(child for child in ast.iter_child_nodes(node) if not isinstance(child, ast.stmt))


def _asks_kv_dtype(test):
    """The cast for an FP8 KV cache, not native FP4's (``if uses_native_fp4:``, its own route)."""
    return any(ast.unparse(n) == "self.data_type" for n in ast.walk(test))


def _is_query_fp8_cast(statement):
    return ast.unparse(statement) == "q = q.to(torch.float8_e4m3fn)"


def _passes_mask(value, previous):
    if ast.unparse(value) == MASK:
        return True
    return (
        isinstance(value, ast.Name)
        and isinstance(previous, ast.Assign)
        and [ast.unparse(t) for t in previous.targets] == [value.id]
        and ast.unparse(previous.value) == MASK
    )


TARGET_VERIFY_TEST = "forward_batch.forward_mode.is_target_verify()"


def _module_level_nodes(tree):
    """The nodes of the module's own statements, not those inside its functions and classes
    (whose names only their own scope binds); a def or class itself is kept."""
    pending = list(tree.body)
    while pending:
        node = pending.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            pending.extend(ast.iter_child_nodes(node))


def _unbound_names(function, tree):
    """Names the method reads that nothing binds: not a parameter, not assigned or imported in
    the method, not a module-level name, not a builtin (a method that would raise NameError is
    not code whose routes this record can tell)."""
    bound = set()
    for node in (*ast.walk(function), *_module_level_nodes(tree)):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            bound.add(node.id)
        elif isinstance(node, ast.arg):  # the method's parameters, and those of functions inside it
            bound.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    loaded = {n.id for n in ast.walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return sorted(loaded - bound - set(dir(builtins)))


def _no_draft_extend_route(extend, tree):
    """True when draft extend cannot reach the decode kernel: the method never asks
    ``is_draft_extend_v2``, calls no decode helper of the backend, and reaches
    ``flashinfer.decode`` only inside ``if forward_batch.forward_mode.is_target_verify():``
    (0.5.9 to 0.5.13.post1; 0.5.1 to 0.5.8.post1 never reach it). Anything else, a name or
    another question standing in that test included, is code this record does not know."""
    if _unbound_names(extend, tree):
        return False
    guarded = set()
    for node in ast.walk(extend):
        if isinstance(node, ast.If) and ast.unparse(node.test) == TARGET_VERIFY_TEST:
            guarded.update(id(inner) for statement in node.body for inner in ast.walk(statement))
    for node in ast.walk(extend):
        if isinstance(node, ast.Attribute) and node.attr == "is_draft_extend_v2":
            return False
        if isinstance(node, ast.Attribute) and "decode" in node.attr and ast.unparse(node.value) == "self":
            return False
        is_decode_module = ast.unparse(node) == "flashinfer.decode" if isinstance(node, ast.Attribute) else False
        if is_decode_module and id(node) not in guarded:
            return False
    return True


def classify(tree):
    """Classify the source of ``trtllm_mha_backend`` (an ``ast.Module``)."""
    refusal, _, extend, fingerprint, verdict = detect.live_method_classified(tree, CLASS_NAME, METHOD)
    if refusal:
        return refusal

    if _no_draft_extend_route(extend, tree):
        return verdict(
            Verdict.NOT_APPLICABLE,
            "forward_extend has no draft-extend route to the decode kernel (is_draft_extend_v2 is never asked; only "
            "target verify, if anything, reaches flashinfer.decode)",
        )
    if _fixed_in_substance(extend):
        return verdict(
            Verdict.FIXED, "draft extend and target verify on the decode kernel keep BF16 Q and get the mask on XQA"
        )
    if fingerprint in AFFECTED:
        return verdict(
            Verdict.AFFECTED,
            WHAT + ". Repaired: forward_extend runs 0.5.22's statements, compiled into SGLang's function",
        )
    if fingerprint not in UNREPAIRABLE:
        return verdict(Verdict.UNKNOWN, "forward_extend is not the code of a release this hotfix knows")
    return verdict(Verdict.UNREPAIRABLE, REASON)


HOTFIX = Hotfix(
    gpu_proof="none: its CPU proof only (docs/records.md)",
    name=NAME,
    upstream=UPSTREAM,
    summary="EAGLE/MTP draft extend on XQA (SM90/SM120) keeps BF16 Q and gets the spec-decoding mask "
    "(repaired on 0.5.21, reported on 0.5.14 to 0.5.20)",
    effect="draft extend and target verify on XQA keep BF16 Q and get the spec-decoding mask",
    distribution="sglang",
    target="%s.%s.%s" % (trtllm_backend.MODULE, CLASS_NAME, METHOD),
    classify=detect.walked_once(classify),
    edits=EDITS,
    known_fingerprints=ReleaseTable(os.path.join(os.path.dirname(os.path.abspath(__file__)), NAME + "_releases.json")),
)
