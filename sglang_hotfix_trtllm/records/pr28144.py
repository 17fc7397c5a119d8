"""The hotfix record for SGLang PR #28144, as upstream revised it in PR #29423: the TRT-LLM MHA
backend passes FlashInfer the FP8 KV cache's scales.

Standard library only at import; torch is reached at call time, from the process that already
runs it.

The bug (SGLang 0.5.1 to 0.5.13.post1): ``forward_decode`` and ``forward_extend`` call
FlashInfer's TRT-LLM kernels with::

    q_scale = 1.0
    k_scale = layer.k_scale_float if getattr(layer, "k_scale_float", None) is not None else 1.0
    bmm1_scale = q_scale * k_scale * layer.scaling
    bmm2_scale = 1.0

An FP8 KV cache stores V divided by its scale, so ``bmm2_scale = 1.0`` leaves the output scaled
wrong, and a checkpoint's K scale multiplies the logits even when the cache is BF16 (the cache
then holds K unscaled).

Which upstream state this record reproduces: the newest, what an upgrade gives. SGLang 0.5.14
(PR #28144) quantized Q with a dynamic per-tensor scale and passed a float32 tensor
``bmm1_scale``; 0.5.15 (PR #29423, "Avoid dynamic Q quantization in trtllm_mha", unchanged up to
0.5.23) went back to ``q_scale = 1.0`` and the plain FP8 cast of Q, and keeps of #28144 the
scales as Python floats: ``bmm1_scale, bmm2_scale = self._get_bmm_scales(layer, q_scale)``, which
is ``(q_scale * k_scale * layer.scaling, v_scale)`` for an FP8 cache and ``(layer.scaling, 1)``
for any other. Its one change to Q: target verify on XQA keeps BF16 Q
(``not self.is_xqa_impl or not forward_batch.forward_mode.is_target_verify()``), where 0.5.10 to
0.5.13.post1 cast it. Floats are what every pinned FlashInfer takes, so every release with the
bug is repaired, 0.5.1 to 0.5.5.post3 included (their FlashInfer takes no tensor scale).

What the kernel receives, exactly: ``bmm1_scale`` and ``bmm2_scale`` as 0.5.15 computes them; the
query SGLang's own object, except on XQA target verify with an FP8 cache (0.5.10 to 0.5.13.post1),
where it is the method's BF16 ``q`` shaped by the release's own statement (``.contiguous().view``
in 0.5.10.x, ``.reshape`` from 0.5.11): upstream's operations on upstream's starting object, so
dtype, shape, strides and storage offset are upstream's (FlashInfer's XQA reads only
``q.data_ptr()``: a layout is part of the value). Every other argument is SGLang's own object.

How: upstream's code (``code_edit``). Each method, compiled from the installed file with the bug's
four scale statements replaced by 0.5.15's ``q_scale = 1.0`` and ``_get_bmm_scales`` call, and its
FP8 cast of Q by 0.5.15's, runs as SGLang's function; 0.5.15's ``_get_scalar_scale`` and
``_get_bmm_scales`` are added to the class first. Two adaptations of upstream's text, each needed
by the release, not by taste: releases up to 0.5.9 never set ``is_xqa_impl`` (SGLang's XQA path
arrived in 0.5.10), so there the cast reads ``getattr(self, "is_xqa_impl", False)``, "not XQA", as
those releases' own cast does; and 0.5.15's ``logger.warning_once`` (no affected release's module
has it) becomes one warning per message on the module's logger.

``classify`` accepts a source as ``affected`` only when the live ``forward_decode`` and
``forward_extend`` are, as a pair, exactly the code of an affected release: the code the edit
changes. The rest of the module is not examined: it runs alike with the repair and with upstream's
change applied to it (until 0.13 a gate on the module's ``flashinfer`` had to see every kernel call,
and the module was checked for other routes to FlashInfer). ``fixed``: both live methods take their
scales from a ``_get_bmm_scales`` of a known fingerprint (0.5.14 on).
"""

import ast
import os

from .. import code_edit, detect
from . import trtllm_backend
from ..fingerprint import of_node
from ..record import Classification, Hotfix, Verdict
from ..release_table import ReleaseTable

CLASS_NAME = trtllm_backend.CLASS_NAME
METHODS = ("forward_decode", "forward_extend")
UPSTREAM = "SGLang 0.5.15 (PR #28144 as revised by PR #29423)"


# --------------------------------------------------------------------------
# The repair: upstream's change, as an edit of the release's own methods

# The bug's four statements, in this order, the first and last assigning 1.0.
SCALE_BLOCK = ("q_scale", "k_scale", "bmm1_scale", "bmm2_scale")
# 0.5.15's two statements in their place (each method has them once).
UPSTREAM_SCALES = ("q_scale = 1.0", "bmm1_scale, bmm2_scale = self._get_bmm_scales(layer, q_scale)")
# 0.5.15's FP8 cast of Q, per method, in place of the release's (0.5.1 to 0.5.4.post1 cast none).
UPSTREAM_CASTS = {
    "forward_decode": "if self.data_type == torch.float8_e4m3fn and not self.is_xqa_impl:\n"
    "    q = q.to(torch.float8_e4m3fn)",
    "forward_extend": "if self.data_type == torch.float8_e4m3fn and (\n"
    "    not self.is_xqa_impl or not forward_batch.forward_mode.is_target_verify()\n"
    "):\n"
    "    q = q.to(torch.float8_e4m3fn)",
}
# The name through which the adapted _get_scalar_scale warns (see UPSTREAM_SCALAR_SCALE).
WARNING_ONCE = "_sglang_hotfix_trtllm_warning_once"
# SGLang 0.5.15's _get_scalar_scale, with one adaptation: 0.5.15 warns through
# ``logger.warning_once``, which no affected release's module has (0.5.1 to 0.5.8.post1 have no
# ``logger`` at all); here the same message goes, once, to the module's own logger.
UPSTREAM_SCALAR_SCALE = """\
@staticmethod
def _get_scalar_scale(
    layer: RadixAttention,
    float_attr: str,
    scale_attr: str,
) -> float:
    scale = getattr(layer, float_attr, None)
    if scale is None:
        scale = getattr(layer, scale_attr, None)
    if scale is None:
        return 1.0
    if isinstance(scale, torch.Tensor):
        _sglang_hotfix_trtllm_warning_once(
            "Ignoring tensor %s for TRT-LLM MHA FP8 KV cache scale. "
            "Expected %s to be populated with a Python scalar.",
            scale_attr,
            float_attr,
        )
        return 1.0
    scale = float(scale)
    return scale if scale > 0.0 else 1.0
"""
# The adaptation's warning: once per message and arguments, to the logger named as the module.
WARNING_ONCE_DEFINITION = """\
def _sglang_hotfix_trtllm_warning_once(msg, *args, _said=set()):
    if (msg, args) not in _said:
        _said.add((msg, args))
        __import__("logging").getLogger(__name__).warning(msg, *args)
"""
# SGLang 0.5.15's _get_bmm_scales, verbatim (unchanged to 0.5.23).
UPSTREAM_BMM_SCALES = '''\
def _get_bmm_scales(
    self, layer: RadixAttention, q_scale: float | torch.Tensor = 1.0
) -> tuple[float | torch.Tensor, float]:
    """Return FlashInfer TRT-LLM MHA BMM scales.

    The FP8 paths store Q/K/V as values divided by their per-tensor scales.
    FlashInfer applies bmm1_scale to QK and bmm2_scale to PV, so FP8 reads
    need Q and K descales in BMM1 and V descale in BMM2. Non-FP8 KV cache
    entries are already in model dtype.
    """
    if self.data_type != torch.float8_e4m3fn:
        return layer.scaling, 1.0

    k_scale = self._get_scalar_scale(layer, "k_scale_float", "k_scale")
    v_scale = self._get_scalar_scale(layer, "v_scale_float", "v_scale")
    return q_scale * k_scale * layer.scaling, v_scale
'''


def _assigned_name(statement):
    if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
        target = statement.targets[0]
        return target.id if isinstance(target, ast.Name) else None
    return None


def _is_scale_block(statements, index):
    block = statements[index : index + len(SCALE_BLOCK)]
    if tuple(_assigned_name(s) for s in block) != SCALE_BLOCK:
        return False
    return all(isinstance(block[j].value, ast.Constant) and block[j].value.value == 1.0 for j in (0, 3))


def _is_self_attribute(node, attr):
    return (
        isinstance(node, ast.Attribute)
        and node.attr == attr
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    )


def _is_fp8_cast(statement):
    """``if self.data_type == torch.float8_e4m3fn [and ...]: q = q.to(torch.float8_e4m3fn)``."""
    if not (isinstance(statement, ast.If) and not statement.orelse and len(statement.body) == 1):
        return False
    (inner,) = statement.body
    return any(_is_self_attribute(n, "data_type") for n in ast.walk(statement.test)) and (
        _assigned_name(inner) == "q" and ast.unparse(inner.value) == "q.to(torch.float8_e4m3fn)"
    )


class _XqaAttributeOptional(ast.NodeTransformer):
    """The adaptation for 0.5.1 to 0.5.9, whose backend never sets ``is_xqa_impl`` (XQA arrived in
    0.5.10): ``self.is_xqa_impl`` reads ``getattr(self, "is_xqa_impl", False)``, "not XQA", as those
    releases' own cast treats every kernel."""

    def visit_Attribute(self, node):
        if _is_self_attribute(node, "is_xqa_impl") and isinstance(node.ctx, ast.Load):
            call = ast.Call(
                func=ast.Name(id="getattr", ctx=ast.Load()),
                args=[node.value, ast.Constant("is_xqa_impl"), ast.Constant(False)],
                keywords=[],
            )
            return ast.copy_location(call, node)
        return self.generic_visit(node)


def _sets_xqa_impl(tree):
    return any(
        _is_self_attribute(node, "is_xqa_impl") and isinstance(node.ctx, ast.Store) for node in detect.nodes(tree)
    )


def take_upstreams_scales(method, tree):
    """PR #28144 as #29423 revised it (0.5.15) on one of the release's two methods: the bug's four
    scale statements become 0.5.15's ``q_scale = 1.0`` and ``_get_bmm_scales`` call, and the
    release's FP8 cast of Q becomes 0.5.15's (the two PRs add none where the release has none)."""
    blocks = [(b, i) for b in code_edit.statement_lists(method) for i in range(len(b)) if _is_scale_block(b, i)]
    casts = [(b, i) for b in code_edit.statement_lists(method) for i, s in enumerate(b) if _is_fp8_cast(s)]
    if len(blocks) != 1 or len(casts) > 1:
        raise code_edit.EditMismatch(
            "%s has %d scale blocks and %d FP8 casts of Q (upstream's change has 1 and at most 1)"
            % (method.name, len(blocks), len(casts))
        )
    for body, index in casts:
        cast = code_edit.statement_at(UPSTREAM_CASTS[method.name], body[index].lineno)
        body[index] = cast if _sets_xqa_impl(tree) else _XqaAttributeOptional().visit(cast)
    body, index = blocks[0]
    line = body[index].lineno
    body[index : index + len(SCALE_BLOCK)] = [code_edit.statement_at(text, line) for text in UPSTREAM_SCALES]


EDITS = tuple(code_edit.Edit(name, take_upstreams_scales) for name in METHODS)
NEW_NAMES = (
    code_edit.NewName(WARNING_ONCE, WARNING_ONCE_DEFINITION, "sglang-hotfix-trtllm (logger.warning_once)", "module"),
    code_edit.NewName("_get_scalar_scale", UPSTREAM_SCALAR_SCALE, UPSTREAM + ", adapted"),
    code_edit.NewName("_get_bmm_scales", UPSTREAM_BMM_SCALES, UPSTREAM),
)


# --------------------------------------------------------------------------
# Recognising the code

# (forward_decode, forward_extend) fingerprints of the affected releases. Every pinned FlashInfer
# (0.2.11.post3 to 0.6.12, pinned by 0.5.13.x and by 0.5.15 itself) takes the Python float scales 0.5.15 passes.
AFFECTED = {
    ("ast1:f983dd819b9de1a0", "ast1:7d36278b2fb2e186"): "0.5.1 to 0.5.4.post1",
    ("ast1:f05b9eff1d1c2b21", "ast1:9e5cb0ada11f2286"): "0.5.4.post2 to 0.5.5.post3",
    ("ast1:f05b9eff1d1c2b21", "ast1:698b90cde1f1e457"): "0.5.6",
    ("ast1:280de058f9d3aee7", "ast1:6d6c1481adb5e890"): "0.5.6.post1 to 0.5.8.post1",
    ("ast1:5ff28f46acb388fb", "ast1:abb1c23985dd016b"): "0.5.9",
    ("ast1:d3c79e75d45feb0a", "ast1:0aed86372ee6cb44"): "0.5.10 to 0.5.10.post1",
    ("ast1:cc7da69ada8dbf71", "ast1:52036f0a3a55c1e1"): "0.5.11 to 0.5.12.post1",
    ("ast1:f770ae4e23ceb6fc", "ast1:a230c20003012edf"): "0.5.13 to 0.5.13.post1",
}
# 0.5.14's _get_bmm_scales (identical in 0.5.14 to 0.5.23), and its call.
BMM_SCALES = "_get_bmm_scales"
BMM_SCALES_FINGERPRINTS = frozenset(("ast1:1adea0f046f5ab58",))
UPSTREAM_STATEMENT = "bmm1_scale, bmm2_scale = self._get_bmm_scales(layer, q_scale)"


def kernel_callers(tree, other_names):
    """What records that pin ``forward_decode`` and ``forward_extend`` as a pair (this one, pr17732)
    read first: ``(refusal, cls, live, methods, fingerprint, first_lines)``, where ``refusal`` is an
    ``unknown`` Classification when the live class or one of the two is missing (the rest is then
    None), ``live`` the live definitions of the two and of ``other_names``, ``fingerprint`` the
    pair's, ``first_lines`` the two methods' first lines."""
    cls, class_problem = detect.live_class(tree, CLASS_NAME)
    if cls is None:
        return Classification(Verdict.UNKNOWN, class_problem, of_node(tree)), None, None, None, None, None
    live = detect.live_methods(tree, cls, METHODS + tuple(other_names))
    for name in METHODS:
        function, problem = live[name]
        if function is None:
            refusal = Classification(Verdict.UNKNOWN, problem or "%s.%s not found" % (CLASS_NAME, name), of_node(cls))
            return refusal, None, None, None, None, None
    methods = [live[name][0] for name in METHODS]
    fingerprint = of_node(ast.Module(body=list(methods), type_ignores=[]))
    return None, cls, live, methods, fingerprint, {name: detect.first_line_of(live[name][0]) for name in METHODS}


def classify(tree):
    """Classify the source of ``trtllm_mha_backend`` (an ``ast.Module``)."""
    refusal, cls, live, methods, fingerprint, first_lines = kernel_callers(tree, (BMM_SCALES,))
    if refusal:
        return refusal

    def verdict(value, reason):
        return Classification(value, reason, fingerprint, first_lines)

    helper, problem = live[BMM_SCALES]
    if problem:
        return verdict(Verdict.UNKNOWN, problem)
    if helper is not None:
        calls = [
            sum(ast.unparse(s) == UPSTREAM_STATEMENT for s in ast.walk(m) if isinstance(s, ast.stmt)) for m in methods
        ]
        if of_node(helper) in BMM_SCALES_FINGERPRINTS and calls == [1, 1]:
            return verdict(
                Verdict.FIXED,
                "forward_decode and forward_extend take their BMM scales from %s (SGLang 0.5.14, PR #28144)"
                % BMM_SCALES,
            )
        return verdict(Verdict.UNKNOWN, "%s is there, but not as SGLang 0.5.14 wrote it or called it" % BMM_SCALES)
    pair = tuple(of_node(m) for m in methods)
    if pair not in AFFECTED:
        return verdict(
            Verdict.UNKNOWN,
            "forward_decode / forward_extend are not the code of a release this hotfix knows "
            "(fingerprints %s / %s)" % pair,
        )
    return verdict(
        Verdict.AFFECTED,
        "forward_decode and forward_extend pass bmm2_scale=1.0 (the FP8 KV cache's V scale ignored) and apply the K "
        "scale to a BF16 cache. Repaired: the two methods run 0.5.15's statements, compiled into SGLang's functions",
    )


HOTFIX = Hotfix(
    gpu_proof=(
        "on an H200, SGLang 0.5.12's forward_decode and target verify into FlashInfer's XQA with an FP8 KV "
        "cache, again on an H100 with 0.14.0 (docs/gpu.md)"
    ),
    name="pr28144",
    upstream=UPSTREAM,
    summary="TRT-LLM MHA decode and extend pass FlashInfer the FP8 KV cache's scales (K scale in bmm1, V scale "
    "as bmm2) and no K scale for a BF16 cache",
    effect="FlashInfer's TRT-LLM kernels receive the BMM scales of the FP8 KV cache (and BF16 Q in XQA target verify)",
    distribution="sglang",
    target="sglang.srt.layers.attention.trtllm_mha_backend.%s.%s" % (CLASS_NAME, METHODS[0]),
    also=METHODS[1:],
    classify=detect.walked_once(classify),
    edits=EDITS,
    new_names=NEW_NAMES,
    known_fingerprints=ReleaseTable(os.path.join(os.path.dirname(os.path.abspath(__file__)), "pr28144_releases.json")),
)
