"""The FP8 KV-cache scales record (pr28144) on CPU: what FlashInfer's TRT-LLM kernels receive.

* ``load_backend_module(release_dir)``: one release's ``TRTLLMHAAttnBackend`` with all its
  methods but ``__init__`` (``isolated_release``: compiled from the release's file, with its
  line numbers, module named as SGLang's), plus the module globals ``forward_decode`` and
  ``forward_extend`` reach: ``torch``, the release's ``ForwardMode`` and
  ``TRTLLMMHAMetadata``, the release's own ``canonicalize_stride`` (compiled from its
  ``layers/attention/utils.py``: the module holding it imports triton and SGLang), and
  recorders where the real thing needs a GPU: ``flashinfer`` (the two kernels) and
  ``fused_fp8_set_kv_buffer`` (a Triton kernel); ``envs`` and ``logger`` are small stand-ins.
* ``upstream_module(release_dir, fixed_dir)``: the same release with upstream's fix applied by
  AST, as the record reproduces it (PR #28144 as revised by PR #29423, 0.5.15): 0.5.15's two
  helpers added to the class, and in ``forward_decode`` / ``forward_extend`` the FP8 cast of Q
  and the four-statement scale block replaced by 0.5.15's own statements.
* ``cases(release)``: name -> ``Case`` (KV dtype, the layer's scales, XQA, the KV write path,
  forward mode, and the query's layout: packed, or a strided view split from a fused QKV
  projection as Llama-family models pass it), for what that release's code can do.
* ``kernel_calls(module, case)``: runs one case through the class's method and returns what the
  recorders saw, as plain data compared with ``==``: every tensor as the kernel reads it (dtype,
  shape, strides, storage offset, values).

Nothing of SGLang is copied here: every SGLang function that runs is compiled at test time from
a release's file (or the installed SGLang's).
"""

import ast
import copy
import dataclasses
import enum
import functools
import itertools
import logging
import os
import pathlib
import subprocess
import sys
import tempfile
import types
import typing
import weakref
import zipfile

import torch

import isolated_release
import release_selection
from conftest import exclusive

MODULE_NAME = isolated_release.MODULE_NAME
BACKEND = isolated_release.BACKEND
CLASS_NAME = "TRTLLMHAAttnBackend"
METHODS = ("forward_decode", "forward_extend")
UPSTREAM_HELPERS = ("_get_scalar_scale", "_get_bmm_scales")
# Upstream's fix as the record reproduces it: PR #28144 as PR #29423 revised it (0.5.15 to 0.5.23).
FIXED_RELEASE = "0.5.15"
ATTENTION_UTILS = "sglang/srt/layers/attention/utils.py"
FP8_KERNEL = "srt/layers/quantization/fp8_kernel.py"  # inside the installed sglang package
# Files the shared release cache does not keep (scan_releases keeps only what the records read).
EXTRA_CACHE = pathlib.Path(os.environ.get("SGLANG_HOTFIX_FP8_CACHE", "/tmp/sglang_hotfix_fp8_cache"))
FP8 = torch.float8_e4m3fn


# --------------------------------------------------------------------------
# Parsing, shared


@functools.lru_cache(maxsize=None)
def _tree(path):
    return ast.parse(pathlib.Path(path).read_text(encoding="utf-8"))


def _backend_class(path):
    """A fresh copy of the file's backend class node (callers edit it)."""
    return copy.deepcopy(next(n for n in _tree(path).body if isinstance(n, ast.ClassDef) and n.name == CLASS_NAME))


def _methods(class_node):
    return {n.name: n for n in class_node.body if isinstance(n, ast.FunctionDef)}


def _is_self_attribute(node, attr=None):
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
        and (attr is None or node.attr == attr)
    )


def _self_attributes(methods, roots):
    """The ``self`` attributes (not methods) that the ``roots`` read, directly or through the
    methods of ``methods`` they call."""
    seen, todo, read = set(), list(roots), set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for node in ast.walk(methods[name]):
            if _is_self_attribute(node) and isinstance(node.ctx, ast.Load):
                if node.attr in methods:
                    todo.append(node.attr)
                else:
                    read.add(node.attr)
    return read


def backend_attributes(release_dir, fixed_dir):
    """What a backend object needs: every attribute the release's ``forward_decode`` and
    ``forward_extend`` read, and those 0.5.15's helpers read that the release's ``__init__``
    sets (``data_type``, which 0.5.1 to 0.5.4.post1 never read in these methods; ``is_xqa_impl``
    only where the release has it)."""
    methods = _methods(_backend_class(release_dir / BACKEND))
    fixed = _methods(_backend_class(fixed_dir / BACKEND))
    set_by_init = {
        n.attr for n in ast.walk(methods["__init__"]) if _is_self_attribute(n) and isinstance(n.ctx, ast.Store)
    }
    return _self_attributes(methods, METHODS) | (_self_attributes(fixed, UPSTREAM_HELPERS) & set_by_init)


def release_features(release_dir):
    """What the release's code can do, read from its source."""
    methods = _methods(_backend_class(release_dir / BACKEND))
    extend = methods["forward_extend"]
    return {
        "xqa": "is_xqa_impl" in _self_attributes(methods, METHODS),
        "fused": "_should_use_fused_fp8_path" in methods,
        "target_verify": any(isinstance(n, ast.Attribute) and n.attr == "is_target_verify" for n in ast.walk(extend)),
    }


# --------------------------------------------------------------------------
# Files beyond the shared release cache


def extra_file(release_dir, member):
    """``member`` of the release whose files ``release_dir`` holds (named by the release):
    there if the shared cache kept it, else extracted from the release's wheel into
    ``EXTRA_CACHE`` (downloaded once)."""
    own = release_dir / member
    if own.is_file():
        return own
    release = release_dir.name
    target = EXTRA_CACHE / release / member
    with exclusive("fp8-extra-" + release):
        if not target.is_file():
            _extract_from_wheel(release, member, target)
    return target


def _extract_from_wheel(release, member, target):
    # The same wheel scan_releases.fetch reads (its platform tags), for one more file.
    with tempfile.TemporaryDirectory() as download:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--only-binary=:all:"]
            + ["--python-version", "3.11", "--implementation", "cp", "--abi", "cp311"]
            + ["--platform", "manylinux_2_34_x86_64", "-d", download, "sglang==" + release],
            check=True,
            capture_output=True,
            timeout=600,
        )
        (wheel,) = pathlib.Path(download).glob("sglang-*.whl")
        with zipfile.ZipFile(wheel) as archive:
            data = archive.read(member)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_suffix(".partial")
    staging.write_bytes(data)
    staging.replace(target)  # whole or absent, should a run stop half-way


def _compile_functions(path, names, namespace):
    """The named top-level functions of ``path``, compiled from it (with their line numbers)
    into ``namespace``."""
    tree = _tree(path)
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    assert sorted(f.name for f in functions) == sorted(names), (path, names)
    futures = [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "__future__"]
    exec(compile(ast.Module(body=futures + functions, type_ignores=[]), str(path), "exec"), namespace)
    return namespace


def _imported_from(release_dir, name):
    """The file of the release the backend imports ``name`` from (``from X import name`` at its
    top level), as a member of its wheel; None where it does not import it."""
    for node in _tree(release_dir / BACKEND).body:
        if isinstance(node, ast.ImportFrom) and node.module and any(a.name == name for a in node.names):
            return node.module.replace(".", "/") + ".py"
    return None


def release_canonicalize_stride(release_dir):
    """The release's own ``canonicalize_stride`` (plain PyTorch), from the file its backend imports
    it from (``layers/attention/utils.py``; 0.5.16 on, ``sglang/kernels/ops/attention/utils.py``)."""
    path = extra_file(release_dir, _imported_from(release_dir, "canonicalize_stride") or ATTENTION_UTILS)
    return _compile_functions(path, ["canonicalize_stride"], {"torch": torch})["canonicalize_stride"]


# --------------------------------------------------------------------------
# Recorders and stand-ins for the module's globals


class AttentionType(enum.Enum):
    """Stand-in for SGLang's ``radix_attention.AttentionType`` (the two members these tests use):
    what a layer's ``attn_type`` is, and the module global 0.5.22's argument compares it to."""

    DECODER = "decoder"
    ENCODER_ONLY = "encoder_only"


class CallLog(list):
    """(name, arguments) of every recorded call, in order."""


class _Kernel:
    def __init__(self, log, name):
        self.log, self.__name__ = log, name

    def __call__(self, **kwargs):
        self.log.append((self.__name__, kwargs))
        query = kwargs["query"]
        return torch.zeros(query.shape, dtype=kwargs.get("out_dtype") or query.dtype)


class _FmhaV2Kernel(_Kernel):
    """fmha_v2 (0.5.19 on, SM90/SM120): SGLang passes ``(q, paged_kv)`` first, positionally."""

    def __call__(self, qkv, **kwargs):
        self.log.append((self.__name__, {"qkv": qkv, **kwargs}))
        query = qkv[0]
        return torch.zeros(query.shape, dtype=kwargs.get("out_dtype") or query.dtype)


def flashinfer_recorder(log):
    """``flashinfer`` as the backend reaches it: ``flashinfer.<submodule>.<kernel>(**kwargs)``."""
    return types.SimpleNamespace(
        decode=types.SimpleNamespace(
            trtllm_batch_decode_with_kv_cache=_Kernel(log, "decode.trtllm_batch_decode_with_kv_cache")
        ),
        prefill=types.SimpleNamespace(
            trtllm_batch_context_with_kv_cache=_Kernel(log, "prefill.trtllm_batch_context_with_kv_cache"),
            trtllm_fmha_v2_prefill=_FmhaV2Kernel(log, "prefill.trtllm_fmha_v2_prefill"),
        ),
    )


def fused_fp8_recorder(log):
    """SGLang's ``fused_fp8_set_kv_buffer`` is a Triton kernel (GPU only): its call is recorded."""

    def fused_fp8_set_kv_buffer(**kwargs):
        log.append(("fused_fp8_set_kv_buffer", kwargs))

    return fused_fp8_set_kv_buffer


class _EnvValue:
    def get(self):
        return None  # the skip-softmax threshold factors unset, SGLang's default


class _Envs:
    """``sglang.srt.environ.envs`` for the variables these methods read."""

    def __getattr__(self, name):
        if not name.startswith("SGLANG_SKIP_SOFTMAX_"):
            raise AttributeError(name)
        return _EnvValue()


class _Logger(logging.LoggerAdapter):
    """The module's logger. 0.5.15's ``_get_scalar_scale`` calls ``logger.warning_once``, which
    only transformers (imported by every SGLang server) adds to ``logging.Logger``."""

    def __init__(self):
        super().__init__(logging.getLogger(MODULE_NAME), {})
        self.warned = set()

    def warning_once(self, message, *args):
        if (message, args) not in self.warned:
            self.warned.add((message, args))
            self.warning(message, *args)


_LOGS = weakref.WeakKeyDictionary()  # module -> its CallLog


def scaled_fp8_recorder(log):
    """SGLang's ``scaled_fp8_quant`` (0.5.14's ``_maybe_quantize_q``) runs sgl-kernel's CUDA
    quantizer: its call is recorded, and it returns what a dynamic per-tensor quantization does
    (scale = amax / FP8's largest value, the input divided by it, cast), on CPU."""

    def scaled_fp8_quant(input, scale=None, **kwargs):
        log.append(("scaled_fp8_quant", {"input": input, "scale": scale, **kwargs}))
        if scale is None:
            scale = (input.abs().max().float() / torch.finfo(FP8).max).clamp(min=1e-12).reshape(1)
        return (input.float() / scale).clamp(torch.finfo(FP8).min, torch.finfo(FP8).max).to(FP8), scale

    return scaled_fp8_quant


# The release file each of these module globals comes from (when the backend imports it): the
# release's own class, compiled from it.
RELEASE_CLASSES = {"KVWriteLoc": "sglang/srt/mem_cache/memory_pool.py"}


def release_class(release_dir, name):
    """The release's own top-level class ``name`` (a dataclass of plain fields), compiled from
    its file into a namespace holding what its annotations and decorator need."""
    path = extra_file(release_dir, RELEASE_CLASSES[name])
    (node,) = [n for n in _tree(path).body if isinstance(n, ast.ClassDef) and n.name == name]
    namespace = {"torch": torch, "dataclass": dataclasses.dataclass, "Optional": typing.Optional}
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), namespace)
    return namespace[name]


def _imported_names(release_dir):
    return {
        alias.asname or alias.name
        for node in _tree(release_dir / BACKEND).body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }


def _add_globals(module, release_dir):
    log = CallLog()
    _LOGS[module] = log
    module.__dict__.update(
        flashinfer=flashinfer_recorder(log),
        fused_fp8_set_kv_buffer=fused_fp8_recorder(log),
        scaled_fp8_quant=scaled_fp8_recorder(log),
        envs=_Envs(),
        logger=_Logger(),
        AttentionType=AttentionType,
    )
    if "canonicalize_stride" in ast.unparse(_backend_class(release_dir / BACKEND)):
        module.canonicalize_stride = release_canonicalize_stride(release_dir)
    imported = _imported_names(release_dir)
    if "get_cp_strategy" in imported:  # 0.5.16 on: context parallelism, off unless a case turns it on
        module.__dict__.update(_context_parallel_globals(module, release_dir))
    for name in RELEASE_CLASSES:
        if name in imported:
            module.__dict__[name] = release_class(release_dir, name)
    return module


# --------------------------------------------------------------------------
# 0.5.16 on: context parallelism, the fused FP8 QKV write, the base class's write scales

CP_BASE = "sglang/srt/layers/cp/base.py"
CP_ZIGZAG = "sglang/srt/layers/cp/zigzag.py"
FUSED_QKV = "fused_fp8_qkv_kv_cache"  # a JIT CUDA kernel (0.5.16 on), imported inside a method


def _release_top_class(path, name, namespace):
    """The release's top-level class ``name``, compiled from ``path`` into ``namespace``."""
    tree = _tree(path)
    (node,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
    futures = [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "__future__"]
    exec(compile(ast.Module(body=futures + [node], type_ignores=[]), str(path), "exec"), namespace)
    return namespace[name]


def _release_methods(path, class_name, names, namespace, bases=()):
    """A class holding the named methods of the release's class ``class_name`` (compiled from
    ``path``, with their line numbers), over ``bases``."""
    tree = _tree(path)
    (node,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name]
    functions = [n for n in node.body if isinstance(n, ast.FunctionDef) and n.name in names]
    assert sorted(f.name for f in functions) == sorted(names), (path, class_name, names)
    namespace = dict(namespace)
    futures = [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "__future__"]
    body = futures + [_holder_node(class_name, functions)]
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), namespace)
    made = namespace[class_name]
    return type(class_name, bases + (made,), {})


def _holder_node(name, functions):
    holder = ast.ClassDef(name=name, bases=[], keywords=[], body=functions, decorator_list=[])
    if "type_params" in ast.ClassDef._fields:
        holder.type_params = []
    return ast.fix_missing_locations(ast.copy_location(holder, functions[0]))


class _StrategyRecorder:
    """What the zigzag strategy does beside dispatching attention: gathering the ranks' K/V into the
    pool (a collective across the CP group) is recorded."""

    def __init__(self, log):
        self.log = log

    def materialize_full_kv(self, forward_batch, layer=None, k=None, v=None, swa_loc=None):
        self.log.append(("materialize_full_kv", {"k": k, "v": v, "swa_loc": swa_loc}))


def _context_parallel_globals(module, release_dir):
    """``is_cp_v2_active`` / ``get_cp_strategy`` (off: no strategy, until ``kernel_calls`` puts the
    case's in place) and the release's own ``CPAttentionBackendKind``; the zigzag strategy, for the
    cases that turn context parallelism on: the release's own ``run_attention`` and
    ``get_supported_attention_backend`` (compiled from its ``zigzag.py``), its K/V gather recorded."""
    kind = _release_top_class(extra_file(release_dir, CP_BASE), "CPAttentionBackendKind", {"IntEnum": enum.IntEnum})
    strategy = _release_methods(
        extra_file(release_dir, CP_ZIGZAG),
        "ZigzagCPStrategy",
        ("run_attention", "get_supported_attention_backend"),
        {"torch": torch, "CPAttentionBackendKind": kind, "Any": typing.Any, "Optional": typing.Optional},
        bases=(_StrategyRecorder,),
    )
    state = {"strategy": None}
    module._cp_state, module._cp_strategy_class = state, strategy
    return {
        "CPAttentionBackendKind": kind,
        "get_cp_strategy": lambda: state["strategy"],
        "is_cp_v2_active": lambda forward_batch: state["strategy"] is not None,
        "is_cp_active": lambda forward_batch: state["strategy"] is not None,  # 0.5.21's name
    }


@functools.lru_cache(maxsize=None)
def _fused_qkv_module(release_dir):
    """The module the release's backend imports the fused FP8 QKV kernel from, inside its method
    (``sglang.jit_kernel...`` in 0.5.16, ``sglang.kernels.ops.kvcache...`` later); None without one.
    Read from the cached tree, not a copy, once per release: every kernel call asks."""
    tree = _tree(release_dir / BACKEND)
    for node in ast.walk(next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == CLASS_NAME)):
        if isinstance(node, ast.ImportFrom) and any(a.name == FUSED_QKV for a in node.names):
            return node.module
    return None


def fused_qkv_recorder(log):
    """sgl's JIT ``fused_fp8_qkv_kv_cache`` (0.5.16 on; CUDA only): its call is recorded, and it
    returns what the method then uses as its query: ``q`` cast to FP8 where it was given one."""

    def fused_fp8_qkv_kv_cache(q=None, **kwargs):
        log.append(("fused_fp8_qkv_kv_cache", {"q": q, **kwargs}))
        return None if q is None else q.to(FP8)

    return types.SimpleNamespace(fused_fp8_qkv_kv_cache=fused_fp8_qkv_kv_cache)


def load_backend_module(release_dir):
    """The release's backend module, unpatched (see the module's docstring)."""
    module = isolated_release.load_backend_module(release_dir)
    module._release_dir = release_dir
    return _add_globals(module, release_dir)


# --------------------------------------------------------------------------
# The oracle: PR #28144 applied by AST


def _bodies(node):
    """Every statement list under ``node`` (bodies of ifs, loops, withs, trys)."""
    for child in ast.walk(node):
        for field in ("body", "orelse", "finalbody"):
            statements = getattr(child, field, None)
            if isinstance(statements, list) and statements and isinstance(statements[0], ast.stmt):
                yield statements
        for handler in getattr(child, "handlers", ()):
            yield handler.body


def _assigned_name(statement):
    if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
        target = statement.targets[0]
        return target.id if isinstance(target, ast.Name) else None
    return None


def _is_unscaled_fp8_cast(statement):
    """``if self.data_type == torch.float8_e4m3fn [and ...]: q = q.to(torch.float8_e4m3fn)``."""
    if not (isinstance(statement, ast.If) and not statement.orelse and len(statement.body) == 1):
        return False
    (inner,) = statement.body
    reads_data_type = any(_is_self_attribute(n, "data_type") for n in ast.walk(statement.test))
    value = getattr(inner, "value", None)
    casts_q = (
        _assigned_name(inner) == "q"
        and isinstance(value, ast.Call)
        and isinstance(value.func, ast.Attribute)
        and value.func.attr == "to"
        and isinstance(value.func.value, ast.Name)
        and value.func.value.id == "q"
    )
    return reads_data_type and casts_q


def _is_q_reshape(statement):
    """``q = q.contiguous().view(...)`` / ``q = q.reshape(...)``: where 0.5.4.post2 put the cast."""
    value = getattr(statement, "value", None)
    return (
        _assigned_name(statement) == "q"
        and isinstance(value, ast.Call)
        and isinstance(value.func, ast.Attribute)
        and value.func.attr in ("view", "reshape")
    )


SCALE_BLOCK = ("q_scale", "k_scale", "bmm1_scale", "bmm2_scale")


def _is_scale_block(statements, i):
    """The bug's four statements from ``statements[i]``: ``q_scale = 1.0``, ``k_scale = ...``,
    ``bmm1_scale = ...``, ``bmm2_scale = 1.0``."""
    block = statements[i : i + len(SCALE_BLOCK)]
    if tuple(_assigned_name(s) for s in block) != SCALE_BLOCK:
        return False
    return all(isinstance(block[j].value, ast.Constant) and block[j].value.value == 1.0 for j in (0, 3))


def _upstream_statement(fixed_method, helper):
    """The one statement of 0.5.15's method that assigns from ``self.<helper>(...)``."""
    found = [
        s
        for body in _bodies(fixed_method)
        for s in body
        if isinstance(s, ast.Assign) and isinstance(s.value, ast.Call) and _is_self_attribute(s.value.func, helper)
    ]
    assert len(found) == 1, (fixed_method.name, helper, len(found))
    return found[0]


def _upstream_q_scale(fixed_method):
    """0.5.15's ``q_scale = 1.0``."""
    (found,) = [
        s
        for body in _bodies(fixed_method)
        for s in body
        if _assigned_name(s) == "q_scale" and isinstance(s.value, ast.Constant) and s.value.value == 1.0
    ]
    return found


def _placed_at(statement, line):
    """A copy of 0.5.15's ``statement`` numbered from ``line`` of the release's file, so a
    traceback points at the statement it replaced."""
    placed = copy.deepcopy(statement)
    ast.increment_lineno(placed, line - placed.lineno)
    return placed


def _apply_fix(method, fixed_method):
    """PR #28144 as revised by PR #29423 (0.5.15) on the release's ``method``, in place: the
    bug's four scale statements become 0.5.15's ``q_scale = 1.0`` and ``_get_bmm_scales`` call,
    and the release's FP8 cast of Q becomes 0.5.15's (the same statement in ``forward_decode``
    from 0.5.10 on; in ``forward_extend``, XQA target verify keeps BF16 Q). Releases that never
    cast Q (0.5.1 to 0.5.4.post1) get no cast: the two PRs together add none."""
    scales = _upstream_statement(fixed_method, "_get_bmm_scales")
    q_scale = _upstream_q_scale(fixed_method)
    (upstream_cast,) = [s for body in _bodies(fixed_method) for s in body if _is_unscaled_fp8_cast(s)]
    casts = [(body, i) for body in _bodies(method) for i, s in enumerate(body) if _is_unscaled_fp8_cast(s)]
    blocks = [(body, i) for body in _bodies(method) for i in range(len(body)) if _is_scale_block(body, i)]
    assert len(blocks) == 1, (method.name, "scale blocks", len(blocks))
    body, i = blocks[0]
    body[i : i + len(SCALE_BLOCK)] = [_placed_at(q_scale, body[i].lineno), _placed_at(scales, body[i].lineno)]
    assert len(casts) <= 1, (method.name, "casts", len(casts))
    for body, i in casts:
        body[i] = _XqaAttributeOptional().visit(_placed_at(upstream_cast, body[i].lineno))


class _XqaAttributeOptional(ast.NodeTransformer):
    """``self.is_xqa_impl`` -> ``getattr(self, "is_xqa_impl", False)``. Releases up to 0.5.9
    never set the attribute (the backend object here has none, as in SGLang) and have no XQA
    path: their own cast treats every kernel as TRT-LLM-GEN, so "absent" reads as "not XQA"."""

    def visit_Attribute(self, node):
        if _is_self_attribute(node, "is_xqa_impl") and isinstance(node.ctx, ast.Load):
            call = ast.Call(
                func=ast.Name(id="getattr", ctx=ast.Load()),
                args=[node.value, ast.Constant("is_xqa_impl"), ast.Constant(False)],
                keywords=[],
            )
            return ast.copy_location(call, node)
        return self.generic_visit(node)


def _holder(functions, path):
    """A module of one class named as SGLang's (so the functions get SGLang's qualnames)
    holding ``functions``, with the file's ``__future__`` imports."""
    futures = [n for n in _tree(path).body if isinstance(n, ast.ImportFrom) and n.module == "__future__"]
    holder = ast.ClassDef(name=CLASS_NAME, bases=[], keywords=[], body=functions, decorator_list=[])
    if "type_params" in ast.ClassDef._fields:
        holder.type_params = []
    ast.copy_location(holder, functions[0])
    return compile(ast.fix_missing_locations(ast.Module(body=futures + [holder], type_ignores=[])), str(path), "exec")


def _install(module, code, names):
    """Run ``code`` (a holder class) in the module's namespace, so the functions read the
    module's globals, and move the named functions onto the module's backend class."""
    cls = module.__dict__[CLASS_NAME]
    try:
        exec(code, module.__dict__)
        holder = module.__dict__[CLASS_NAME]
    finally:
        module.__dict__[CLASS_NAME] = cls
    for name in names:
        setattr(cls, name, holder.__dict__[name])  # __dict__: the staticmethod object itself


def upstream_module(
    release_dir,
    fixed_dir,
    scales=True,
    packed_query_dir=None,
    canonical_strides_dir=None,
    swa_locations_dir=None,
    encoder_only_dir=None,
    draft_extend_dir=None,
):
    """The release's module with upstream's fixes applied (compiled from the release's file):
    ``scales``, PR #28144 as #29423 revised it (0.5.15's helpers on the class and 0.5.15's
    statements in the release's two methods, ``fixed_dir`` holding 0.5.15); ``packed_query_dir``
    (a folder holding 0.5.16), PR #31667: 0.5.16's ``if self.is_xqa_impl: ... else: ...`` in
    place of the release's ``q = q.reshape(...)`` in ``forward_decode``; ``canonical_strides_dir``
    (a folder holding 0.5.9), PR #17732: 0.5.9's two ``if layer.tp_*_head_num == 1:`` statements
    before ``kv_cache = (k_cache, v_cache)`` in both methods, and 0.5.9's ``canonicalize_stride``
    (compiled from its attention utils) as the module's global; ``swa_locations_dir`` (a folder
    holding 0.5.10), PR #19107: 0.5.10's ``_get_layer_cache_loc`` on the class and 0.5.10's
    ``cache_loc = ...`` statement in place of the release's in ``_fused_fp8_set_kv_buffer``;
    ``encoder_only_dir`` (a folder holding 0.5.22), its ``causal=layer.attn_type !=
    AttentionType.ENCODER_ONLY``, taken from 0.5.22's context-kernel call, added to the release's
    context-kernel call in ``forward_extend``; ``draft_extend_dir`` (a folder holding 0.5.22), its three
    statements for draft extend on XQA (``_apply_draft_extend``)."""
    module = load_backend_module(release_dir)
    fixed_path, path = fixed_dir / BACKEND, release_dir / BACKEND
    own = _methods(_backend_class(path))
    if scales:
        fixed = _methods(_backend_class(fixed_path))
        helpers = [fixed[name] for name in UPSTREAM_HELPERS]
        _install(module, _holder(helpers, fixed_path), UPSTREAM_HELPERS)
        for name in METHODS:
            _apply_fix(own[name], fixed[name])
    if packed_query_dir is not None:
        _apply_packed_query(
            own["forward_decode"], _methods(_backend_class(packed_query_dir / BACKEND))["forward_decode"]
        )
    if canonical_strides_dir is not None:
        canonical = _methods(_backend_class(canonical_strides_dir / BACKEND))
        for name in METHODS:
            _apply_canonical_strides(own[name], canonical[name])
        module.canonicalize_stride = release_canonicalize_stride(canonical_strides_dir)
    if encoder_only_dir is not None:
        _apply_encoder_only_mask(own["forward_extend"], _methods(_backend_class(encoder_only_dir / BACKEND)))
    if draft_extend_dir is not None:
        _apply_draft_extend(
            own["forward_extend"], _methods(_backend_class(draft_extend_dir / BACKEND))["forward_extend"]
        )
    names = METHODS
    if swa_locations_dir is not None:
        translated_path = swa_locations_dir / BACKEND
        translated = _methods(_backend_class(translated_path))
        _install(module, _holder([translated[SWA_TRANSLATOR]], translated_path), (SWA_TRANSLATOR,))
        _apply_swa_locations(own[FUSED_WRITE], translated[FUSED_WRITE])
        names = METHODS + (FUSED_WRITE,)
    _install(module, _holder([own[name] for name in names], path), names)
    return module


FUSED_WRITE, SWA_TRANSLATOR = "_fused_fp8_set_kv_buffer", "_get_layer_cache_loc"
CONTEXT_KERNEL = "trtllm_batch_context_with_kv_cache"


FMHA_V2_KERNEL = "trtllm_fmha_v2_prefill"


def _context_calls(method, kernel=CONTEXT_KERNEL):
    return [
        node
        for node in ast.walk(method)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == kernel
    ]


def _apply_encoder_only_mask(method, fixed_methods):
    """0.5.22's ``causal=`` keyword of its context-kernel call (in ``forward_extend``, whose nested
    ``_trtllm_context_attn`` makes the call), added to the release's one context-kernel call; and
    where the release calls fmha_v2 (0.5.19 on), 0.5.22's ``mask_mode=`` keyword of its fmha_v2 call
    in place of the release's."""
    (fixed_call,) = _context_calls(fixed_methods["forward_extend"])
    (keyword,) = [k for k in fixed_call.keywords if k.arg == "causal"]
    (call,) = _context_calls(method)
    assert not [k for k in call.keywords if k.arg == "causal"], "the release already passes causal"
    call.keywords.append(copy.deepcopy(keyword))
    calls = _context_calls(method, FMHA_V2_KERNEL)
    if calls:
        (fixed_call,) = _context_calls(fixed_methods["forward_extend"], FMHA_V2_KERNEL)
        (keyword,) = [k for k in fixed_call.keywords if k.arg == "mask_mode"]
        (call,) = calls
        (at,) = [i for i, k in enumerate(call.keywords) if k.arg == "mask_mode"]
        call.keywords[at] = copy.deepcopy(keyword)


def _apply_draft_extend(method, fixed_method):
    """0.5.22's fix of draft extend on XQA, taken from 0.5.22's ``forward_extend``, on the release's:
    0.5.22's ``uses_decode_kernel = ...`` (the statement of its own body that binds that name) put
    right before the release's own ``q_scale = 1.0``; the term of the release's FP8-cast test that asks
    ``is_target_verify()`` beside ``is_xqa_impl`` replaced by 0.5.22's term (the one beside
    ``is_xqa_impl`` there); the release's ``mask = ...`` value replaced by 0.5.22's."""
    (binding,) = [
        s
        for s in fixed_method.body
        if isinstance(s, ast.Assign) and [ast.unparse(t) for t in s.targets] == ["uses_decode_kernel"]
    ]

    def xqa_terms(function):
        return [
            (node, i)
            for node in ast.walk(function)
            if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And)
            for i, term in enumerate(node.values)
            if isinstance(term, ast.BoolOp) and "self.is_xqa_impl" in ast.unparse(term)
        ]

    def masks(function):
        return [
            s
            for s in ast.walk(function)
            if isinstance(s, ast.Assign)
            and [ast.unparse(t) for t in s.targets] == ["mask"]
            and "_xqa_spec_dec_mask" in ast.unparse(s.value)
        ]

    ((fixed_and, fixed_at),) = xqa_terms(fixed_method)
    ((release_and, release_at),) = [
        (n, i) for n, i in xqa_terms(method) if "is_target_verify" in ast.unparse(n.values[i])
    ]
    (fixed_mask,) = masks(fixed_method)
    (release_mask,) = masks(method)
    (at,) = [i for i, s in enumerate(method.body) if ast.unparse(s) == "q_scale = 1.0"]
    method.body.insert(at, _placed_at(binding, method.body[at].lineno))
    release_and.values[release_at] = copy.deepcopy(fixed_and.values[fixed_at])
    release_mask.value = copy.deepcopy(fixed_mask.value)
    ast.fix_missing_locations(method)


def _is_cache_loc(statement):
    return _assigned_name(statement) == "cache_loc"


def _apply_swa_locations(method, fixed_method):
    """PR #19107 on the release's fused FP8 write, in place: its one ``cache_loc = ...`` becomes
    0.5.10's."""
    (statement,) = [s for body in _bodies(fixed_method) for s in body if _is_cache_loc(s)]
    places = [(body, i) for body in _bodies(method) for i, s in enumerate(body) if _is_cache_loc(s)]
    assert len(places) == 1, (method.name, "cache_loc statements", len(places))
    body, i = places[0]
    body[i] = _placed_at(statement, body[i].lineno)


KV_PAIR = "kv_cache = (k_cache, v_cache)"


def _apply_canonical_strides(method, fixed_method):
    """PR #17732 on one of the release's methods, in place: 0.5.9's statements that call
    ``canonicalize_stride``, taken from 0.5.9's method, right before its one ``kv_cache = (k_cache,
    v_cache)`` (where 0.5.9 has them)."""
    statements = [
        s
        for body in _bodies(fixed_method)
        for s in body
        if isinstance(s, ast.If) and "canonicalize_stride" in ast.unparse(s)
    ]
    assert len(statements) == 2, (method.name, "0.5.9's statements", len(statements))
    places = [(body, i) for body in _bodies(method) for i, s in enumerate(body) if ast.unparse(s) == KV_PAIR]
    assert len(places) == 1, (method.name, KV_PAIR, len(places))
    body, i = places[0]
    body[i:i] = [_placed_at(s, body[i].lineno) for s in statements]


def _is_xqa_query_choice(statement):
    """0.5.16's ``if self.is_xqa_impl: q = q.contiguous().view(...) else: q = q.reshape(...)``."""
    return (
        isinstance(statement, ast.If)
        and _is_self_attribute(statement.test, "is_xqa_impl")
        and len(statement.body) == len(statement.orelse) == 1
        and all(_is_q_reshape(s) for s in statement.body + statement.orelse)
    )


def _apply_packed_query(method, fixed_method):
    """PR #31667 on the release's ``forward_decode``, in place: its one ``q = q.reshape(...)``
    becomes 0.5.16's statement."""
    (choice,) = [s for body in _bodies(fixed_method) for s in body if _is_xqa_query_choice(s)]
    reshapes = [
        (body, i)
        for body in _bodies(method)
        for i, s in enumerate(body)
        if _is_q_reshape(s) and s.value.func.attr == "reshape"
    ]
    assert len(reshapes) == 1, (method.name, "q reshapes", len(reshapes))
    body, i = reshapes[0]
    body[i] = _placed_at(choice, body[i].lineno)


# --------------------------------------------------------------------------
# Cases


class _TensorScale(float):
    """A scale the layer holds as a torch tensor (a checkpoint's ``k_scale`` parameter)."""


# attribute -> value; _TensorScale(x) becomes torch.tensor(x) on the layer.
SCALES = {
    "absent": {"k_scale": None, "v_scale": None, "k_scale_float": None, "v_scale_float": None},
    "one": {"k_scale": 1.0, "v_scale": 1.0, "k_scale_float": 1.0, "v_scale_float": 1.0},
    "float": {"k_scale": 0.5, "v_scale": 4.0, "k_scale_float": 0.5, "v_scale_float": 4.0},
    "tensor": {
        "k_scale": _TensorScale(0.5),
        "v_scale": _TensorScale(4.0),
        "k_scale_float": None,
        "v_scale_float": None,
    },
    # As RadixAttention holds an FP8 checkpoint's scales: the parameter and its float.
    "checkpoint": {
        "k_scale": _TensorScale(0.5),
        "v_scale": _TensorScale(4.0),
        "k_scale_float": 0.5,
        "v_scale_float": 4.0,
    },
    "zero": {"k_scale": 0.0, "v_scale": 0.0, "k_scale_float": 0.0, "v_scale_float": 0.0},
    "negative": {"k_scale": -0.5, "v_scale": -4.0, "k_scale_float": -0.5, "v_scale_float": -4.0},
}
KV_DTYPES = {"fp8": FP8, "bf16": torch.bfloat16}
# packed: q as its own tensor; strided: ``q, k, v = qkv.split(...)`` of a fused projection, the
# view every Llama-family model, EAGLE3 Llama draft and gpt-oss hands the backend.
LAYOUTS = ("packed", "strided")
MODES = {
    "decode": "forward_decode",
    "extend": "forward_extend",
    "target_verify": "forward_extend",
    "draft_extend_v2": "forward_extend",  # 0.5.16 on; only in cases a test makes itself
}


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    kv: str  # key of KV_DTYPES
    scales: str  # key of SCALES
    xqa: typing.Optional[bool]  # None: the release has no is_xqa_impl (the object gets none)
    save_kv_cache: bool
    mode: str  # key of MODES
    fused: bool  # the release's own _should_use_fused_fp8_path says yes for these inputs
    attributes: typing.FrozenSet[str]  # the backend object's attributes (backend_attributes)
    layout: str = "packed"  # key of LAYOUTS: how the method's q lies in memory
    attn_type: str = "DECODER"  # the layer's AttentionType member (ENCODER_ONLY: bidirectional)
    cp: bool = False  # context parallelism (0.5.16 on): the release's zigzag strategy runs the prefill

    @property
    def method(self):
        return MODES[self.mode]

    def scale(self, attribute):
        """The case's value of a layer scale attribute, as a float or None (tensors unwrapped)."""
        value = SCALES[self.scales][attribute]
        return None if value is None else float(value)

    def holds_tensor(self, attribute):
        return isinstance(SCALES[self.scales][attribute], _TensorScale)


def cases(release):
    """name -> Case for every combination the release's code can take."""
    release_dir = release_selection.release_dir(release)
    features = release_features(release_dir)
    attributes = frozenset(backend_attributes(release_dir, release_selection.release_dir(FIXED_RELEASE)))
    modes = [m for m in MODES if (m != "target_verify" or features["target_verify"]) and m != "draft_extend_v2"]
    built = {}
    for kv in KV_DTYPES:
        for scales in SCALES:
            for xqa in (False, True) if features["xqa"] else (None,):
                for save in (True, False):
                    for mode in modes:
                        for layout in LAYOUTS:
                            # The release's fused path takes save_kv_cache, k (always given here) and the KV dtype.
                            fused = features["fused"] and save and kv == "fp8"
                            name = "-".join(
                                [kv, scales, {None: "no-xqa-attr", False: "trtllm-gen", True: "xqa"}[xqa]]
                                + [("fused-write" if fused else "write") if save else "no-write", mode, layout]
                            )
                            built[name] = Case(name, kv, scales, xqa, save, mode, fused, attributes, layout)
    return built


# --------------------------------------------------------------------------
# One case's objects

Q_HEADS, KV_HEADS, HEAD_DIM, PAGE_SIZE, PAGES = 2, 1, 8, 4, 6  # one KV head: canonicalize_stride runs
V_HEADS = None  # V's heads on the rank where they differ from K's (None: KV_HEADS)


def v_heads():
    return KV_HEADS if V_HEADS is None else V_HEADS


MAX_CONTEXT_LEN = 64
# Per mode: query tokens per request, and the KV length of each request after this step.
LENGTHS = {
    "decode": ((1, 1), (6, 5)),
    "extend": ((3, 2), (7, 4)),
    "target_verify": ((3, 3), (8, 7)),
    "draft_extend_v2": ((3, 3), (8, 7)),
}


class KVPool:
    """``token_to_kv_pool``: real CPU buffers of the case's KV dtype; writes are recorded."""

    def __init__(self, log, dtype, generator):
        self.log = log
        self.k_buffer = torch.randn((PAGES * PAGE_SIZE, KV_HEADS, HEAD_DIM), generator=generator).to(dtype)
        self.v_buffer = torch.randn((PAGES * PAGE_SIZE, v_heads(), HEAD_DIM), generator=generator).to(dtype)

    def get_kv_buffer(self, layer_id):
        assert layer_id == 0
        return self.k_buffer, self.v_buffer

    def set_kv_buffer(self, *args, **kwargs):
        self.log.append(("set_kv_buffer", {"args": args, **kwargs}))


def _layer(case):
    values = {
        attribute: torch.tensor(float(value)) if isinstance(value, _TensorScale) else value
        for attribute, value in SCALES[case.scales].items()
    }
    return types.SimpleNamespace(
        tp_q_head_num=Q_HEADS,
        tp_k_head_num=KV_HEADS,
        tp_v_head_num=v_heads(),
        head_dim=HEAD_DIM,
        layer_id=0,
        scaling=HEAD_DIM**-0.5,
        sliding_window_size=-1,
        attn_type=AttentionType[case.attn_type],
        **values,
    )


def _metadata(module, case):
    q_lens, kv_lens = (torch.tensor(x, dtype=torch.int32) for x in LENGTHS[case.mode])
    zero = torch.zeros(1, dtype=torch.int32)
    values = {
        "cache_seqlens_int32": kv_lens,
        "max_seq_len_q": int(q_lens.max()),
        "max_seq_len_k": int(kv_lens.max()),
        "cu_seqlens_q": torch.cat([zero, q_lens.cumsum(0, dtype=torch.int32)]),
        "cu_seqlens_k": torch.cat([zero, kv_lens.cumsum(0, dtype=torch.int32)]),
        "page_table": torch.arange(1, 1 + 2 * 2, dtype=torch.int32).view(2, 2),
    }
    if case.mode == "target_verify":
        # 0.5.17 on: an ENCODER_ONLY verify runs each draft token as its own row over the whole window
        # (built on the draft worker as cache_seqlens_int32[row_map], page_table[row_map]).
        row_map = torch.repeat_interleave(torch.arange(len(kv_lens)), q_lens.long())
        values["encoder_cache_seqlens"] = kv_lens[row_map]
        values["encoder_page_table"] = values["page_table"][row_map]
    if case.cp:
        # 0.5.17 on: zigzag's halves as one batch of 2 * bs requests (each its request's pages)
        values["zigzag_page_table"] = values["page_table"].repeat_interleave(2, dim=0)
    metadata = module.TRTLLMMHAMetadata()
    for field in dataclasses.fields(metadata):  # the release's own fields; the SWA ones stay None
        if field.name in values:
            setattr(metadata, field.name, values[field.name])
    return metadata


def _zigzag_metadata(case):
    """``forward_batch.attn_cp_metadata`` of the zigzag strategy for the case's requests, the
    fields its ``run_attention`` reads: each request's new tokens split into a first ("prev") and a
    second ("next") half, each half attending to the KV up to its last token."""
    q_lens, kv_lens = LENGTHS[case.mode]
    prev_q = [(q + 1) // 2 for q in q_lens]
    next_q = [q - p for q, p in zip(q_lens, prev_q)]
    prev_kv = [kv - q + p for kv, q, p in zip(kv_lens, q_lens, prev_q)]

    def cu(lengths):
        return torch.tensor([0] + list(itertools.accumulate(lengths)), dtype=torch.int32)

    combined_q = [x for pair in zip(prev_q, next_q) for x in pair]
    combined_kv = [x for pair in zip(prev_kv, kv_lens) for x in pair]
    return types.SimpleNamespace(
        total_q_prev_tokens=sum(prev_q),
        total_q_next_tokens=sum(next_q),
        cu_seqlens_q_prev_tensor=cu(prev_q),
        cu_seqlens_q_next_tensor=cu(next_q),
        kv_len_prev_tensor=torch.tensor(prev_kv, dtype=torch.int32),
        kv_len_next_tensor=torch.tensor(kv_lens, dtype=torch.int32),
        max_seqlen_q_prev=max(prev_q),
        max_seqlen_q_next=max(next_q),
        cu_seqlens_kv_prev_tensor=cu(prev_kv),
        cu_seqlens_kv_next_tensor=cu(kv_lens),
        cu_seqlens_q_combined_tensor=cu(combined_q),
        kv_len_combined_tensor=torch.tensor(combined_kv, dtype=torch.int32),
        max_seqlen_q_combined=max(combined_q),
        cu_seqlens_kv_combined_tensor=cu(combined_kv),
    )


def _backend(module, case, pool):
    """``object.__new__`` of the class, given exactly the case's attributes (``backend_attributes``)."""
    available = {
        "data_type": KV_DTYPES[case.kv],
        "q_data_type": torch.bfloat16,
        "page_size": PAGE_SIZE,
        "max_context_len": MAX_CONTEXT_LEN,
        "workspace_buffer": torch.zeros(16, dtype=torch.uint8),
        "forward_metadata": _metadata(module, case),
        "token_to_kv_pool": pool,
        "use_sliding_window_kv_pool": False,
        "_swa_kv_pool": None,
    }
    if case.xqa is not None:
        available["is_xqa_impl"] = case.xqa
    # 0.5.16 on, as __init__ sets them for a BF16 or FP8 cache on CPU (no native FP4)
    available.update(
        decode_uses_native_fp4=False,
        is_nvfp4_kvcache=False,
        device=torch.device("cpu"),
        _default_kv_scale=torch.ones(1, dtype=torch.float32),  # __init__'s get_buffer factory
        _multi_ctas_kv_counter_buffer=torch.zeros(8, dtype=torch.int32),  # a kernel's buffer, unread here
        kv_cache_quant_method=_plain_quant_method(module) if "kv_cache_quant_method" in case.attributes else None,
        # 0.5.19 on: fmha_v2 prefills where XQA decodes (SM90/SM120), one decode split (SGLang's default)
        use_fmha_v2=bool(case.xqa),
        decode_seq_len_splits=1,
        # 0.5.21: no native FP4 anywhere; the spec-decoding mask unset
        prefill_uses_native_fp4=False,
        uses_trtllm_gen_native_fp4=False,
        _nvfp4_fp8_output=None,
        # A real buffer (0.5.21 on pass it to XQA): which calls get it is part of what is compared.
        _xqa_spec_dec_mask=torch.ones(64, dtype=torch.bool),
    )
    if "_kv_write_scales" in case.attributes:  # FlashInfer's backend's method (the base class)
        available["_kv_write_scales"] = _base_write_scales(module)
    missing = case.attributes - set(available)
    assert not missing, "the release's methods read attributes the harness does not give: %s" % sorted(missing)
    backend = object.__new__(module.TRTLLMHAAttnBackend)
    for name in case.attributes:
        value = available[name]
        setattr(backend, name, types.MethodType(value, backend) if isinstance(value, types.FunctionType) else value)
    return backend


FLASHINFER_BACKEND = "sglang/srt/layers/attention/flashinfer_backend.py"
KV_QUANT_METHOD = "sglang/srt/layers/quantization/fp4_kv_cache_quant_method.py"


def _plain_quant_method(module):
    """The KV cache's quantisation method for a BF16 or FP8 cache as ``_kv_write_scales`` asks it:
    ``needs_global_scale`` of the release's ``KVCacheQuantMethodBase`` (compiled from its file; the
    NVFP4 method alone overrides it)."""
    path = extra_file(module._release_dir, KV_QUANT_METHOD)
    holder = _release_methods(path, "KVCacheQuantMethodBase", ("needs_global_scale",), {})
    return holder()


def _base_write_scales(module):
    """The release's ``FlashInferAttnBackend._kv_write_scales`` (the base class's), compiled from
    its ``flashinfer_backend.py``."""
    path = extra_file(module._release_dir, FLASHINFER_BACKEND)
    holder = _release_methods(path, "FlashInferAttnBackend", ("_kv_write_scales",), {})
    return holder.__dict__.get("_kv_write_scales") or holder.__mro__[1].__dict__["_kv_write_scales"]


def _forward_batch(module, case, pool):
    q_lens, kv_lens = LENGTHS[case.mode]
    # The new tokens' slots: the last q_len slots of each request's pages (page table rows 1-2, 3-4).
    slots = [
        PAGE_SIZE * (1 + 2 * row) + kv - q + i for row, (q, kv) in enumerate(zip(q_lens, kv_lens)) for i in range(q)
    ]
    return types.SimpleNamespace(
        forward_mode=getattr(module.ForwardMode, case.mode.upper()),
        out_cache_loc=torch.tensor(slots, dtype=torch.int64),
        out_cache_loc_swa=None,
        batch_size=len(q_lens),
        token_to_kv_pool=pool,
        spec_info=None,
        _attn_output=None,  # 0.5.17 on: no preallocated output (the kernel allocates its own)
        attn_cp_metadata=_zigzag_metadata(case) if case.cp else None,
    )


def _seed(case):
    return sum(ord(c) * (i + 1) for i, c in enumerate(case.name)) % (2**31)


def plain(value, storages=None):
    """Comparable data: tensors as (dtype, shape, strides, storage offset, values), containers
    element-wise. With ``storages`` (storage pointer -> name: the pool's buffers, the call's
    inputs), also whose memory a tensor is: a kernel must read the pool's own K/V, not a copy of
    the same values, so a tensor of memory not named is "own" (made during the call)."""
    if isinstance(value, torch.Tensor):
        # As a kernel reads it: FlashInfer's XQA takes only data_ptr(), so the layout is part of the value.
        seen = (
            "tensor",
            str(value.dtype),
            tuple(value.shape),
            tuple(value.stride()),
            value.storage_offset(),
            value.float().tolist(),
        )
        if storages is not None:
            seen += (storages.get(value.untyped_storage().data_ptr(), "own"),)
        return seen
    if isinstance(value, (tuple, list)):
        return tuple(plain(v, storages) for v in value)
    if isinstance(value, dict):
        return {k: plain(v, storages) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):  # KVWriteLoc: its fields
        return (type(value).__name__,) + tuple(
            (field.name, plain(getattr(value, field.name), storages)) for field in dataclasses.fields(value)
        )
    if isinstance(value, types.SimpleNamespace):  # the layer, as set_kv_buffer receives it
        return ("layer", value.layer_id)
    if isinstance(value, torch.dtype):  # out_dtype
        return str(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError("no plain form for %r" % (value,))


def inputs(case, generator):
    """q, k, v of one call of ``case``, drawn from ``generator``; with the strided layout, ``q`` is
    the same values as a view into one fused QKV tensor (``qkv.split``)."""
    tokens = sum(LENGTHS[case.mode][0])
    q = (torch.randn(tokens, Q_HEADS * HEAD_DIM, generator=generator) * 3).to(torch.bfloat16)
    k, v = (torch.randn(tokens, h, HEAD_DIM, generator=generator).to(torch.bfloat16) for h in (KV_HEADS, v_heads()))
    if case.layout == "strided":
        qkv = torch.cat([q, k.flatten(1), v.flatten(1)], dim=1)
        q = qkv.split([Q_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, v_heads() * HEAD_DIM], dim=1)[0]
        assert not q.is_contiguous()
    return q, k, v


def kernel_calls(module, case):
    """Run ``case`` through ``module``'s backend class as SGLang calls it; the recorded calls
    (kernels, KV writes) and the returned tensor, as plain data."""
    log = _LOGS[module]
    del log[:]
    generator = torch.Generator().manual_seed(_seed(case))
    pool = KVPool(log, KV_DTYPES[case.kv], generator)
    q, k, v = inputs(case, generator)
    backend = _backend(module, case, pool)
    method = getattr(backend, case.method)  # through the class attribute, wrapped or not
    state = getattr(module, "_cp_state", None)
    assert state is not None or not case.cp, "the release has no context parallelism"
    fused = _fused_qkv_module(module._release_dir) if hasattr(module, "_release_dir") else None
    previous = sys.modules.get(fused)
    if fused is not None:  # what the method's import finds (sys.modules first): the recorder
        sys.modules[fused] = fused_qkv_recorder(log)
    if case.cp:
        state["strategy"] = module._cp_strategy_class(log)
    try:
        out = method(
            q, k, v, _layer(case), _forward_batch(module, case, pool), save_kv_cache=case.save_kv_cache, sinks=None
        )
    finally:
        if state is not None:
            state["strategy"] = None
        if fused is not None and previous is None:
            del sys.modules[fused]
        elif fused is not None:
            sys.modules[fused] = previous
    storages = named_storages(pool_k=pool.k_buffer, pool_v=pool.v_buffer, q=q, k=k, v=v)
    calls = [(name, plain(arguments, storages)) for name, arguments in log]
    del log[:]
    return calls + [("returned", plain(out, storages))]


def named_storages(**tensors):
    """storage pointer -> name, for ``plain``: the first name given a storage keeps it."""
    named = {}
    for name, tensor in tensors.items():
        named.setdefault(tensor.untyped_storage().data_ptr(), name)
    return named


def flashinfer_of(kernel):
    """``flashinfer`` as the backend reaches it, ``kernel`` standing for both TRT-LLM kernels."""
    return types.SimpleNamespace(
        decode=types.SimpleNamespace(trtllm_batch_decode_with_kv_cache=kernel),
        prefill=types.SimpleNamespace(trtllm_batch_context_with_kv_cache=kernel),
    )


def decode_call(module, case, seed=0):
    """A callable running one decode call of ``case`` (no KV write) through ``module``'s class as
    SGLang calls it, with a strided query (``qkv.split`` of a fused projection)."""
    generator = torch.Generator().manual_seed(seed)
    pool = KVPool(CallLog(), KV_DTYPES[case.kv], generator)
    tokens = sum(LENGTHS[case.mode][0])
    qkv = torch.randn(tokens, (Q_HEADS + 2 * KV_HEADS) * HEAD_DIM, generator=generator).to(torch.bfloat16)
    q = qkv[:, : Q_HEADS * HEAD_DIM]
    backend, layer, batch = _backend(module, case, pool), _layer(case), _forward_batch(module, case, pool)
    return lambda: backend.forward_decode(q, None, None, layer, batch, save_kv_cache=False, sinks=None)
