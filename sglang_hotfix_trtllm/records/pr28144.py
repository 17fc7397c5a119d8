"""The hotfix record for SGLang PR #28144: the TRT-LLM MHA backend passes
FlashInfer the FP8 KV cache's scales.

Standard library only at import; torch and SGLang's FP8 quantizer are reached
at call time, from the process that already runs them.

The bug (SGLang 0.5.1 to 0.5.13.post1): ``forward_decode`` and
``forward_extend`` call FlashInfer's TRT-LLM kernels with::

    q_scale = 1.0
    k_scale = layer.k_scale_float if getattr(layer, "k_scale_float", None) is not None else 1.0
    bmm1_scale = q_scale * k_scale * layer.scaling
    bmm2_scale = 1.0

An FP8 KV cache stores V divided by its scale, so ``bmm2_scale = 1.0`` leaves
the output scaled wrong; where Q is cast to FP8 it is cast without a scale; and
a checkpoint's K scale multiplies the logits even when the cache is BF16 (the
cache then holds K unscaled).

Upstream's fix, as SGLang 0.5.14 ships it (PR #28144, cherry-picked as
#29245): three helpers, ``_get_scalar_scale``, ``_get_bmm_scales`` and
``_maybe_quantize_q``, replace the FP8 cast and the four statements above:
``q, q_scale = self._maybe_quantize_q(q[, force_fp8=not target_verify])`` and
``bmm1_scale, bmm2_scale = self._get_bmm_scales(layer, q_scale)``. For an FP8
cache, Q is quantized with a dynamic per-tensor scale where the TRT-LLM-GEN
kernel needs FP8 Q (XQA decode, and XQA target verify, keep BF16 Q), bmm1 is
``q_scale * k_scale * layer.scaling`` (a float32 tensor when Q was quantized)
and bmm2 is ``v_scale``; for any other cache, bmm1 is ``layer.scaling`` and
bmm2 is 1.

The repair cannot change what SGLang's method computes without replacing its
body, so it changes what reaches the kernel, and only that: the wrapper of
each method notes the call (the backend, the layer, the query *before* SGLang
casts it, the forward batch) for the duration of the call; the module's global
``flashinfer`` is, while the hotfix is applied, a gate (``FlashInferGate``)
through which the module reaches FlashInfer. The gate passes every attribute
through, except the two kernels: a kernel call made inside a wrapped call gets
the query, ``bmm1_scale`` and ``bmm2_scale`` 0.5.14 would pass for the same
inputs, computed from the noted call exactly as 0.5.14's helpers compute them;
every other argument is SGLang's own. Outside a wrapped call (any other
caller of the module's ``flashinfer``) the gate passes the call through.

Releases up to 0.5.9 never set ``is_xqa_impl`` (SGLang's XQA path arrived in
0.5.10): there its absence reads as "not XQA", as those releases' own FP8
cast does (they cast Q for every kernel).

``classify`` accepts a source as ``affected`` only when the live
``forward_decode`` and ``forward_extend`` are, as a pair, exactly the code of
an affected release whose pinned FlashInfer takes a tensor ``bmm1_scale``
(0.5.6 to 0.5.13.post1, FlashInfer 0.5.3 and later), the module binds
``flashinfer`` once, by ``import flashinfer``, and no other code of the module
names the two kernels. Releases 0.5.1 to 0.5.5.post3 have the bug, but the
FlashInfer they pin cannot take upstream's tensor scale (0.2.x to 0.4.0rc3
take a float only; 0.4.0 to 0.5.2 turn a tensor into a host sync, which a
CUDA-graph capture forbids): ``unknown``, never patched. ``fixed``: both live
methods take their scales from a ``_get_bmm_scales`` of a known fingerprint.
"""

import ast
import contextvars
import logging
import os

from .. import detect, logs
from ..fingerprint import of_node
from ..record import Classification, Hotfix, Verdict
from ..release_table import ReleaseTable

CLASS_NAME = "TRTLLMHAAttnBackend"
METHODS = ("forward_decode", "forward_extend")
GATED_GLOBAL = "flashinfer"
# FlashInfer's kernels as the backend reaches them: flashinfer.<submodule>.<function>.
KERNELS = {"decode": "trtllm_batch_decode_with_kv_cache", "prefill": "trtllm_batch_context_with_kv_cache"}
QUANTIZER_MODULE = "sglang.srt.layers.quantization.fp8_kernel"  # where 0.5.14 imports scaled_fp8_quant from


# --------------------------------------------------------------------------
# The repair: 0.5.14's helpers, as functions of the noted call


class Call:
    """One wrapped call of ``forward_decode`` or ``forward_extend``, as the gate needs it."""

    __slots__ = ("method", "backend", "q", "layer", "forward_batch", "used")

    def __init__(self, method, backend, q, layer, forward_batch):
        self.method, self.backend, self.q, self.layer, self.forward_batch = method, backend, q, layer, forward_batch
        self.used = False  # one kernel call per method call: a second one passes through


_current_call = contextvars.ContextVar("sglang_hotfix_trtllm_pr28144_call", default=None)


def _arguments(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
    """Binds a call exactly as both methods' parameter lists do (classify() pins them by fingerprint)."""
    return self, q, layer, forward_batch


def scalar_scale(layer, float_attr, scale_attr):
    """0.5.14's ``_get_scalar_scale``: the layer's scale as a positive Python float, else 1.0."""
    import torch

    scale = getattr(layer, float_attr, None)
    if scale is None:
        scale = getattr(layer, scale_attr, None)
    if scale is None:
        return 1.0
    if isinstance(scale, torch.Tensor):
        logs.say(
            logging.WARNING,
            "%s: ignoring tensor %s for the TRT-LLM MHA FP8 KV cache scale, as SGLang 0.5.14 does: "
            "expected %s to be populated with a Python scalar",
            HOTFIX.name,
            scale_attr,
            float_attr,
            once_key=("pr28144-tensor-scale", scale_attr),
        )
        return 1.0
    scale = float(scale)
    return scale if scale > 0.0 else 1.0


def bmm_scales(backend, layer, q_scale):
    """0.5.14's ``_get_bmm_scales``: (bmm1_scale, bmm2_scale)."""
    import torch

    if backend.data_type != torch.float8_e4m3fn:
        return layer.scaling, 1.0
    k_scale = scalar_scale(layer, "k_scale_float", "k_scale")
    v_scale = scalar_scale(layer, "v_scale_float", "v_scale")
    return q_scale * k_scale * layer.scaling, v_scale


def maybe_quantize_q(backend, q, force_fp8=False):
    """0.5.14's ``_maybe_quantize_q``: (query, q_scale). ``is_xqa_impl`` absent (releases
    up to 0.5.9) reads as False."""
    import torch

    if backend.data_type != torch.float8_e4m3fn:
        return q, 1.0
    if getattr(backend, "is_xqa_impl", False) and not force_fp8:
        return q, 1.0
    scaled_fp8_quant = _quantizer()
    q_2d, q_scale = scaled_fp8_quant(q.reshape(-1, q.shape[-1]).contiguous(), None)
    return q_2d.reshape(q.shape), q_scale


def _target(method):
    return "%s.%s.%s" % (HOTFIX.module, CLASS_NAME, method)


def _quantizer():
    import importlib

    return importlib.import_module(QUANTIZER_MODULE).scaled_fp8_quant


def upstream_arguments(call, kwargs):
    """The kernel's keyword arguments as 0.5.14 passes them for the noted call:
    SGLang's own, with the query and the two scales upstream's helpers give."""
    if call.method == "forward_extend":
        force_fp8 = not call.forward_batch.forward_mode.is_target_verify()
    else:
        force_fp8 = False
    q, q_scale = maybe_quantize_q(call.backend, call.q, force_fp8=force_fp8)
    bmm1_scale, bmm2_scale = bmm_scales(call.backend, call.layer, q_scale)
    query = kwargs["query"]
    if q.numel() != query.numel():  # not the query this call prepared: leave the call alone
        raise ValueError("the kernel's query has %d elements, the method's q %d" % (query.numel(), q.numel()))
    # 0.5.14 reshapes the (quantized) q as the release reshapes its q: same shape, same values.
    return dict(kwargs, query=q.reshape(query.shape), bmm1_scale=bmm1_scale, bmm2_scale=bmm2_scale)


def note_the_call(module, wrapped, instance, args, kwargs):
    """wrapt wrapper of ``forward_decode`` and ``forward_extend``: SGLang's method runs
    unchanged, with the call noted for the gate until it returns. A call the method
    rejects raises SGLang's own error (binding here fails quietly first)."""
    try:
        backend, q, layer, forward_batch = (
            _arguments(*args, **kwargs) if instance is None else _arguments(instance, *args, **kwargs)
        )
    except TypeError:
        return wrapped(*args, **kwargs)  # SGLang's method raises its own TypeError
    call = Call(wrapped.__name__, backend, q, layer, forward_batch)
    token = _current_call.set(call)
    try:
        result = wrapped(*args, **kwargs)
    finally:
        _current_call.reset(token)
    if not call.used:
        # Every release this record accepts calls one kernel per call, through the module's
        # ``flashinfer``: a call that returned without passing the gate reached the kernel some
        # other way (the global replaced after the hotfix was applied), unrepaired.
        logs.repair_skipped(
            _target(call.method), HOTFIX.name, LookupError("the kernel call did not pass the gate"), kind="no-gate"
        )
    return result


class _GatedKernel:
    """A FlashInfer kernel as the gated module reaches it."""

    __slots__ = ("kernel", "gate", "__weakref__")

    def __init__(self, kernel, gate):
        self.kernel, self.gate = kernel, gate

    def __call__(self, *args, **kwargs):
        if not self.gate.__dict__["_hotfix_on"]:  # remove() turned the record off
            return self.kernel(*args, **kwargs)
        call = _current_call.get()
        if call is None:
            # The only code of an accepted module that reaches the kernels is the two wrapped
            # methods: one run without its wrapper (replaced since by another patcher) is unrepaired.
            logs.repair_skipped(
                "%s.%s" % (HOTFIX.module, CLASS_NAME),
                HOTFIX.name,
                LookupError("a kernel call reached the gate outside the record's wrappers"),
                kind="outside-the-wrappers",
            )
            return self.kernel(*args, **kwargs)
        if call.used or args:
            return self.kernel(*args, **kwargs)
        call.used = True
        try:
            repaired = upstream_arguments(call, kwargs)
        except Exception as error:
            logs.repair_skipped(_target(call.method), HOTFIX.name, error, kind="not-computed")
            return self.kernel(**kwargs)
        try:
            return self.kernel(**repaired)
        except Exception as error:
            # The kernel refused upstream's arguments (an older FlashInfer than the release pins, or
            # XQA asking target verify for a mask SGLang does not pass): SGLang's own call decides,
            # so the hotfix never raises where SGLang would not.
            logs.repair_skipped(_target(call.method), HOTFIX.name, error, kind="kernel-refused")
            return self.kernel(**kwargs)

    def __getattr__(self, name):
        return getattr(self.kernel, name)


def _gate_class():
    from .. import patch  # imported only when wrapping, as patch itself

    class FlashInferSubmoduleGate(patch.GateProxy):
        """``flashinfer.decode`` / ``flashinfer.prefill`` as the gated module reaches them: the
        submodule, its kernel looked up at each access as SGLang's own code looks it up (so a
        kernel replaced later, by a profiler or a mock, is the one called), and gated. The gated
        kernel is kept while the submodule holds the same kernel: no allocation per call."""

        def __init__(self, submodule, kernel_name, gate):
            super().__init__(submodule)
            self.__dict__.update(_kernel_name=kernel_name, _gate=gate, _kernel=None, _gated=None)

        def __getattr__(self, name):
            found = getattr(self._hotfix_gated, name)
            if name != self._kernel_name:
                return found
            if found is not self._kernel:
                self.__dict__.update(_kernel=found, _gated=_GatedKernel(found, self._gate))
            return self._gated

    class FlashInferGate(patch.GateProxy):
        """The module's global ``flashinfer`` while pr28144 is applied: FlashInfer itself, looked
        up at each access, but for the kernels' submodules (a gate kept per submodule object)."""

        def __init__(self, gated):
            super().__init__(gated)
            self.__dict__["_submodule_gates"] = {}

        def __getattr__(self, name):
            submodule = getattr(self._hotfix_gated, name)
            if name not in KERNELS:
                return submodule
            kept = self._submodule_gates.get(name)
            if kept is None or kept._hotfix_gated is not submodule:
                kept = self._submodule_gates[name] = FlashInferSubmoduleGate(submodule, KERNELS[name], self)
            return kept

        def __repr__(self):
            return "<pr28144 gate of %r>" % (self._hotfix_gated,)

    return FlashInferGate


def make_gate(module, flashinfer):
    return _gate_class()(flashinfer)


# --------------------------------------------------------------------------
# Recognising the code

# (forward_decode, forward_extend) fingerprints of the affected releases whose pinned FlashInfer
# takes upstream's arguments (a float32 tensor bmm1_scale: FlashInfer 0.5.3 and later).
AFFECTED = {
    ("ast1:f05b9eff1d1c2b21", "ast1:698b90cde1f1e457"): "0.5.6",
    ("ast1:280de058f9d3aee7", "ast1:6d6c1481adb5e890"): "0.5.6.post1 to 0.5.8.post1",
    ("ast1:5ff28f46acb388fb", "ast1:abb1c23985dd016b"): "0.5.9",
    ("ast1:d3c79e75d45feb0a", "ast1:0aed86372ee6cb44"): "0.5.10 to 0.5.10.post1",
    ("ast1:cc7da69ada8dbf71", "ast1:52036f0a3a55c1e1"): "0.5.11 to 0.5.12.post1",
    ("ast1:f770ae4e23ceb6fc", "ast1:a230c20003012edf"): "0.5.13 to 0.5.13.post1",
}
# The same bug, on a FlashInfer that cannot take upstream's arguments: refused.
UNREPAIRABLE = {
    ("ast1:f983dd819b9de1a0", "ast1:7d36278b2fb2e186"): ("0.5.1 to 0.5.4.post1", "0.2.11.post3 to 0.4.1"),
    ("ast1:f05b9eff1d1c2b21", "ast1:9e5cb0ada11f2286"): ("0.5.4.post2 to 0.5.5.post3", "0.4.1 to 0.5.2"),
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


def _pair_fingerprint(methods):
    return of_node(ast.Module(body=list(methods), type_ignores=[]))


def _flashinfer_problem(tree):
    """None when the module binds ``flashinfer`` only by ``import flashinfer`` at its top level
    (SGLang guards it with ``if is_flashinfer_available():``), once."""
    imports = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                bound = alias.asname or alias.name.split(".")[0]
                if bound == GATED_GLOBAL:
                    imports.append((node, alias))
        elif isinstance(node, ast.Name) and node.id == GATED_GLOBAL and not isinstance(node.ctx, ast.Load):
            return "the module rebinds %s (line %d)" % (GATED_GLOBAL, node.lineno)
        elif isinstance(node, (ast.Global, ast.Nonlocal)) and GATED_GLOBAL in node.names:
            return "`%s %s` (line %d)" % (type(node).__name__.lower(), GATED_GLOBAL, node.lineno)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == GATED_GLOBAL:
            return "a definition named %s (line %d)" % (GATED_GLOBAL, node.lineno)
    plain = [(n, a) for n, a in imports if isinstance(n, ast.Import) and a.name == GATED_GLOBAL and a.asname is None]
    if len(imports) != 1 or len(plain) != 1:
        return "%s is not bound once, by `import %s`" % (GATED_GLOBAL, GATED_GLOBAL)
    return None


def _kernel_route_problem(tree, methods):
    """None when nothing but the two live methods reaches ``flashinfer`` or names a kernel
    (the gate must see only the kernel calls those methods prepare). Earlier definitions of the
    class or of the methods count too: an alias can keep them callable."""
    inside = {id(node) for method in methods for node in ast.walk(method)}
    for node in ast.walk(tree):
        if id(node) in inside:
            continue
        named = (
            (isinstance(node, ast.Name) and node.id in (GATED_GLOBAL,) + tuple(KERNELS.values()))
            or (isinstance(node, ast.Attribute) and node.attr in KERNELS.values())
            or (isinstance(node, ast.Constant) and node.value in (GATED_GLOBAL,) + tuple(KERNELS.values()))
        )
        if named and not isinstance(getattr(node, "ctx", None), ast.Store):
            return "code outside forward_decode / forward_extend reaches %s or a TRT-LLM kernel (line %d)" % (
                GATED_GLOBAL,
                node.lineno,
            )
    return None


def _helpers_problem(cls, methods, live):
    """None when every method of the class the two call is, by name, a known release's code."""
    called = sorted(
        {
            node.attr
            for method in methods
            for node in ast.walk(method)
            if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
            and any(isinstance(n, ast.FunctionDef) and n.name == node.attr for n in cls.body)
        }
        - set(METHODS)
    )
    for name in called:
        function, problem = live.get(name, (None, "%s.%s is not examined" % (CLASS_NAME, name)))
        if problem or function is None:
            return problem or "%s.%s not found" % (CLASS_NAME, name)
        if name not in HELPERS or of_node(function) not in HELPERS[name]:
            return "%s.%s, which the two methods call, is not the code of a known release (fingerprint %s)" % (
                CLASS_NAME,
                name,
                of_node(function),
            )
    return None


def classify(tree):
    """Classify the source of ``trtllm_mha_backend`` (an ``ast.Module``)."""
    cls, class_problem = detect.live_class(tree, CLASS_NAME)
    if cls is None:
        return Classification(Verdict.UNKNOWN, class_problem, of_node(tree))
    live = detect.live_methods(tree, cls, METHODS + (BMM_SCALES,) + tuple(HELPERS))
    for name in METHODS:
        function, problem = live[name]
        if function is None:
            return Classification(Verdict.UNKNOWN, problem or "%s.%s not found" % (CLASS_NAME, name), of_node(cls))
    methods = [live[name][0] for name in METHODS]
    fingerprint = _pair_fingerprint(methods)
    first_lines = {name: detect.first_line_of(live[name][0]) for name in METHODS}

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
    if pair in UNREPAIRABLE:
        releases, pins = UNREPAIRABLE[pair]
        return verdict(
            Verdict.UNKNOWN,
            "this code (SGLang %s) has the bug PR #28144 fixes, but the FlashInfer it pins (%s) cannot take "
            "the tensor bmm1_scale upstream's fix passes: not patched" % (releases, pins),
        )
    if pair not in AFFECTED:
        return verdict(
            Verdict.UNKNOWN,
            "forward_decode / forward_extend are not the code of a release this hotfix knows "
            "(fingerprints %s / %s)" % pair,
        )
    problem = _flashinfer_problem(tree) or _kernel_route_problem(tree, methods) or _helpers_problem(cls, methods, live)
    if problem:
        return verdict(Verdict.UNKNOWN, problem)
    return verdict(
        Verdict.AFFECTED,
        "forward_decode and forward_extend pass bmm2_scale=1.0 (the FP8 KV cache's V scale ignored), cast Q to FP8 "
        "without a scale and apply the K scale to a BF16 cache",
    )


HOTFIX = Hotfix(
    name="pr28144",
    upstream="SGLang 0.5.14 (PR #28144)",
    summary="TRT-LLM MHA decode and extend pass FlashInfer the FP8 KV cache's scales (V scale as bmm2, a "
    "quantized Q with its scale) and no K scale for a BF16 cache",
    effect="FlashInfer's TRT-LLM kernels receive the query and BMM scales of the FP8 KV cache",
    distribution="sglang",
    target="sglang.srt.layers.attention.trtllm_mha_backend.%s.%s" % (CLASS_NAME, METHODS[0]),
    also=METHODS[1:],
    gates=((GATED_GLOBAL, make_gate),),
    classify=classify,
    wrapper=note_the_call,
    known_fingerprints=ReleaseTable(os.path.join(os.path.dirname(os.path.abspath(__file__)), "pr28144_releases.json")),
)
