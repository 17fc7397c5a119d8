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

How, without replacing SGLang's method body: through FlashInfer's kernel call site
(``trtllm_kernel_site``, shared with pr31667), which owns the wrapper and the gate. This record
gives the site its test, ``needs_repair`` (could upstream's arguments differ from the release's for
this call? a K scale other than None and 1.0, or an FP8 cache with scales, or FP8 extend on XQA),
and its repair, ``upstream_arguments``. A call no record needs to repair runs SGLang's method and
nothing else; one that needs it is noted, and the kernel call made inside it gets upstream's
arguments; what the kernel then raises propagates, as upstream's call would.

Releases up to 0.5.9 never set ``is_xqa_impl`` (SGLang's XQA path arrived in 0.5.10): there its
absence reads as "not XQA", as those releases' own FP8 cast does.

``classify`` accepts a source as ``affected`` only when the live ``forward_decode`` and
``forward_extend`` are, as a pair, exactly the code of an affected release, the module binds
``flashinfer`` once, by ``import flashinfer``, and no other code of the module reaches
FlashInfer's kernels (by name, attribute, alias import or string). ``fixed``: both live methods
take their scales from a ``_get_bmm_scales`` of a known fingerprint (0.5.14 on).
"""

import ast
import logging
import os

from .. import detect, logs
from . import trtllm_kernel_routes as routes
from . import trtllm_kernel_site as site
from ..fingerprint import of_node
from ..record import Classification, Hotfix, Verdict
from ..release_table import ReleaseTable

CLASS_NAME = site.CLASS_NAME
METHODS = ("forward_decode", "forward_extend")
GATED_GLOBAL = site.GATED_GLOBAL
UPSTREAM = "SGLang 0.5.15 (PR #28144 as revised by PR #29423)"


# --------------------------------------------------------------------------
# Does this call need a repair? (asked on every call: attribute reads only)

_fp8 = None  # torch.float8_e4m3fn, looked up at the first call (torch is imported by then)


def _fp8_dtype():
    global _fp8
    import torch

    _fp8 = torch.float8_e4m3fn
    return _fp8


def needs_repair(backend, layer, q, wrapped):
    """False only where upstream's arguments are provably the release's. A KV cache that is not
    FP8: the layer's ``k_scale_float`` None or 1.0 (the release's ``1.0 * 1.0 * layer.scaling``
    and ``bmm2_scale = 1.0`` are then 0.5.15's ``layer.scaling`` and 1). An FP8 cache: the scales
    0.5.15 reads (``k_scale_float``, else ``k_scale``; ``v_scale_float``, else ``v_scale``) absent
    or 1.0, and not ``forward_extend`` on XQA (where target verify keeps BF16 Q): the common FP8
    cache without checkpoint scales. May say True where nothing differs, never the reverse."""
    k_scale = getattr(layer, "k_scale_float", None)
    unit_k = k_scale is None or (k_scale.__class__ is float and k_scale == 1.0)
    if getattr(backend, "data_type", None) is not (_fp8 or _fp8_dtype()):
        return not unit_k
    if not unit_k or (k_scale is None and getattr(layer, "k_scale", None) is not None):
        return True
    v_scale = getattr(layer, "v_scale_float", None)
    if v_scale is None:
        if getattr(layer, "v_scale", None) is not None:
            return True
    elif not (v_scale.__class__ is float and v_scale == 1.0):
        return True
    return wrapped.__name__ == "forward_extend" and bool(getattr(backend, "is_xqa_impl", False))


# --------------------------------------------------------------------------
# The repair: 0.5.15's helpers, as functions of the noted call


def scalar_scale(layer, float_attr, scale_attr):
    """0.5.15's ``_get_scalar_scale``: the layer's scale as a positive Python float, else 1.0."""
    scale = getattr(layer, float_attr, None)
    if scale is None:
        scale = getattr(layer, scale_attr, None)
    if scale is None:
        return 1.0
    if scale.__class__ is not float:  # a checkpoint's float scale (SGLang's loader) needs no import
        import torch

        if isinstance(scale, torch.Tensor):
            logs.say(
                logging.WARNING,
                "%s: ignoring tensor %s for the TRT-LLM MHA FP8 KV cache scale, as SGLang 0.5.15 does: "
                "expected %s to be populated with a Python scalar",
                HOTFIX.name,
                scale_attr,
                float_attr,
                once_key=("pr28144-tensor-scale", scale_attr),
            )
            return 1.0
        scale = float(scale)
    return scale if scale > 0.0 else 1.0


def bmm_scales(backend, layer, q_scale=1.0):
    """0.5.15's ``_get_bmm_scales(layer, q_scale)`` with its ``q_scale = 1.0``: (bmm1, bmm2)."""
    if backend.data_type != (_fp8 or _fp8_dtype()):
        return layer.scaling, 1.0
    k_scale = scalar_scale(layer, "k_scale_float", "k_scale")
    v_scale = scalar_scale(layer, "v_scale_float", "v_scale")
    return q_scale * k_scale * layer.scaling, v_scale


def keeps_bf16_query(call):
    """0.5.15 casts Q to FP8 in ``forward_extend`` only ``if not self.is_xqa_impl or not
    forward_batch.forward_mode.is_target_verify()``; 0.5.10 to 0.5.13.post1 always do. True
    where upstream passes the kernel the un-cast query and the release a cast one.
    (The PRs change no other cast: ``forward_decode``'s is the release's own, also in 0.5.1 to
    0.5.4.post1, which cast no Q at all; ``is_xqa_impl`` absent reads as False.)"""
    return (
        call.method == "forward_extend"
        and call.backend.data_type == (_fp8 or _fp8_dtype())
        and bool(getattr(call.backend, "is_xqa_impl", False))
        and bool(call.forward_batch.forward_mode.is_target_verify())
    )


def shaped_as_the_release_does(function, q, layer):
    """``q`` shaped by the release's own statement: ``q.reshape(-1, H, D)`` in 0.5.11 on (PR
    #22517), ``q.contiguous().view(-1, H, D)`` before. Which one: the live method's names
    (``classify`` pinned it to a known release's code, and only those two shapes exist there)."""
    if "reshape" in function.__code__.co_names:
        return q.reshape(-1, layer.tp_q_head_num, layer.head_dim)
    return q.contiguous().view(-1, layer.tp_q_head_num, layer.head_dim)


def upstream_arguments(call, kwargs):
    """The kernel's keyword arguments as upstream's change applied to the release passes them for
    the noted call: SGLang's own objects, with the two scales (and, on XQA target verify, the
    query) upstream gives."""
    bmm1_scale, bmm2_scale = bmm_scales(call.backend, call.layer)
    repaired = dict(kwargs, bmm1_scale=bmm1_scale, bmm2_scale=bmm2_scale)
    if keeps_bf16_query(call):
        query = shaped_as_the_release_does(call.function, call.q, call.layer)
        if query.shape != kwargs["query"].shape:  # not the query this call prepared
            raise ValueError(
                "the kernel's query is %s, upstream's %s" % (tuple(kwargs["query"].shape), tuple(query.shape))
            )
        repaired["query"] = query
    return repaired


site.register("pr28144", needs_repair, lambda call, kwargs: upstream_arguments(call, kwargs))
make_gate = site.make_gate


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
# The methods of the class the two call before the kernel, by the fingerprints of the affected
# releases: a helper is run during a noted call, so it must not reach the kernel first.
HELPERS = {
    "_should_use_fused_fp8_path": frozenset(("ast1:967d4c50b64228ea",)),
    "_fused_fp8_set_kv_buffer": frozenset(
        ("ast1:87f5ec275018621e", "ast1:b14b8f5f2151432b", "ast1:1b341078429b8f0b", "ast1:bb51a4e04957ea7b")
    ),
    "_get_layer_page_table": frozenset(("ast1:493eaef90bae8bfe",)),
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
    refusal, cls, live, methods, fingerprint, first_lines = kernel_callers(tree, (BMM_SCALES,) + tuple(HELPERS))
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
    problem = routes.problem(tree, cls, live, methods, HELPERS)
    if problem:
        return verdict(Verdict.UNKNOWN, problem)
    return verdict(
        Verdict.AFFECTED,
        "forward_decode and forward_extend pass bmm2_scale=1.0 (the FP8 KV cache's V scale ignored) and apply the K "
        "scale to a BF16 cache. Repaired: kernel calls through the module's flashinfer (a mock or HookRegistry hook "
        "on a kernel included); a positional kernel call stands aside with one warning",
    )


HOTFIX = Hotfix(
    name="pr28144",
    upstream=UPSTREAM,
    summary="TRT-LLM MHA decode and extend pass FlashInfer the FP8 KV cache's scales (K scale in bmm1, V scale "
    "as bmm2) and no K scale for a BF16 cache",
    effect="FlashInfer's TRT-LLM kernels receive the BMM scales of the FP8 KV cache (and BF16 Q in XQA target verify)",
    distribution="sglang",
    target="sglang.srt.layers.attention.trtllm_mha_backend.%s.%s" % (CLASS_NAME, METHODS[0]),
    also=METHODS[1:],
    gates=((GATED_GLOBAL, site.make_gate),),  # armed by the first call that needs a repair
    classify=classify,
    wrapper=site.note_the_call,
    site=site.SITE,
    known_fingerprints=ReleaseTable(os.path.join(os.path.dirname(os.path.abspath(__file__)), "pr28144_releases.json")),
)
