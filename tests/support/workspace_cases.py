"""Record xqa_workspace on CPU: what FlashInfer's kernels receive as their workspace, when SGLang's
own ``__init__``, ``forward_extend`` and ``forward_decode`` of one release (0.5.19 to 0.5.22) run.

* ``load_module(release_dir, oracle=False)``: the release's backend module, compiled from its own
  file (module named as SGLang's, functions with their line numbers): ``TRTLLMHAAttnBackend`` with
  every method, ``__init__`` included, ``TRTLLMMHAMetadata``, the module's top-level constants and
  functions. With ``oracle=True``, 0.5.23's change is inserted by AST first (``upstream_fix``):
  0.5.23's ``_XQA_SEMAPHORE_BYTES`` and its three statements in place of the release's workspace
  allocation (``self.is_xqa_impl``, which 0.5.19 and 0.5.20 set only later, replaced by the
  release's own expression for it), and fmha_v2's ``workspace_buffer=`` as 0.5.23 writes it.
* ``Process``: one process's state as SGLang's module globals reach it: SGLang's own
  ``get_buffer`` (compiled from the release's ``runtime_context.py``) over a fresh buffer cache,
  the platform (SM90 or SM100), and recorders for FlashInfer's kernels that note the workspace
  each call receives, with whether XQA's first 8 MiB were zero at that launch.
* ``run(module, process, ...)``: a target backend and a draft backend built by SGLang's
  ``__init__``, then prefill (``forward_extend``), decode (``forward_decode``), prefill again: the
  recorded calls, every tensor as plain data (dtype, shape, strides, storage offset, values) and
  each workspace as (size, dtype, strides, offset into the process's shared workspace, whether it
  is that workspace's memory).

Stand-ins, where the real thing needs a GPU or the whole server: the base class (FlashInfer's
backend; it sets the two attributes ``__init__`` reads of it), the model runner and layer (plain
objects with real tensors), ``envs`` (the workspace size set to 16 MiB, as
``SGLANG_FLASHINFER_WORKSPACE_SIZE`` would), the platform, spec and parallel settings, and the
kernels (recorders). A kernel that "leaves a counter" is simulated by the fmha_v2 recorder
writing into the first bytes of the workspace it receives, as the H200 showed fmha_v2 does.
Nothing of SGLang is copied here: every SGLang function that runs is compiled from a release.
"""

import ast
import copy
import enum
import hashlib
import types
import typing

import torch

import fp8_cases
import isolated_release
from sglang_hotfix_trtllm.records import xqa_workspace

MODULE_NAME = isolated_release.MODULE_NAME
BACKEND = isolated_release.BACKEND
RUNTIME_CONTEXT = "sglang/srt/runtime_context.py"
PAGED_VIEW = "sglang/srt/mem_cache/layout/paged_view.py"  # 0.5.22's paged_kv_view (plain PyTorch)
FIXED_RELEASE = "0.5.23"
AFFECTED_RELEASES = ("0.5.19", "0.5.20", "0.5.21", "0.5.22")
WORKSPACE_BYTES = 16 * 1024 * 1024
SEMAPHORES = xqa_workspace.XQA_SEMAPHORE_BYTES
COUNTER = 644  # the first word fmha_v2 left in the workspace on the H200
HEADS, KV_HEADS, HEAD_DIM, PAGE = 32, 8, 128, 64


# --------------------------------------------------------------------------
# The release's module, and the oracle


def _tree(path):
    return ast.parse(path.read_text(encoding="utf-8"))


def _class(tree, name):
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)


def _method(cls, name):
    return next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name)


def _is_workspace_allocation(statement):
    return (
        isinstance(statement, ast.Assign)
        and [ast.unparse(t) for t in statement.targets] == ["self.workspace_buffer"]
        and xqa_workspace.WORKSPACE_NAME in ast.unparse(statement.value)
    )


def _statement_lists(node):
    for child in ast.walk(node):
        for field in ("body", "orelse", "finalbody"):
            value = getattr(child, field, None)
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                yield value


class _XqaExpression(ast.NodeTransformer):
    """``self.is_xqa_impl`` replaced by the expression the release assigns to it."""

    def __init__(self, expression):
        self.expression = expression

    def visit_Attribute(self, node):
        if ast.unparse(node) == "self.is_xqa_impl":
            return copy.deepcopy(self.expression)
        return self.generic_visit(node)


def upstream_fix(tree, fixed_tree):
    """``tree`` (a release's module) with 0.5.23's change inserted, taken from ``fixed_tree``."""
    tree = copy.deepcopy(tree)
    fixed_cls, cls = _class(fixed_tree, "TRTLLMHAAttnBackend"), _class(tree, "TRTLLMHAAttnBackend")
    constant = next(
        n
        for n in fixed_tree.body
        if isinstance(n, ast.Assign) and [ast.unparse(t) for t in n.targets] == ["_XQA_SEMAPHORE_BYTES"]
    )
    tree.body.insert(0, copy.deepcopy(constant))
    fixed_init, init = _method(fixed_cls, "__init__"), _method(cls, "__init__")
    xqa = next(
        n.value
        for n in ast.walk(init)
        if isinstance(n, ast.Assign) and [ast.unparse(t) for t in n.targets] == ["self.is_xqa_impl"]
    )
    # 0.5.23's three statements: semaphore_bytes, the allocation, fmha_v2's view.
    fixed_body = next(body for body in _statement_lists(fixed_init) if any(map(_is_workspace_allocation, body)))
    at = next(i for i, s in enumerate(fixed_body) if _is_workspace_allocation(s))
    upstream = [copy.deepcopy(s) for s in fixed_body[at - 1 : at + 2]]
    assert ast.unparse(upstream[0]).startswith("semaphore_bytes = ") and "fmha_v2_workspace_buffer" in ast.unparse(
        upstream[2]
    ), [ast.unparse(s) for s in upstream]
    body = next(body for body in _statement_lists(init) if any(map(_is_workspace_allocation, body)))
    at = next(i for i, s in enumerate(body) if _is_workspace_allocation(s))
    xqa_set_before = any(
        isinstance(s, ast.Assign) and [ast.unparse(t) for t in s.targets] == ["self.is_xqa_impl"] for s in body[:at]
    )
    if not xqa_set_before:  # 0.5.19, 0.5.20: not yet set there; the release's own expression for it
        upstream = [ast.fix_missing_locations(_XqaExpression(xqa).visit(s)) for s in upstream]
    for statement in upstream:
        ast.copy_location(statement, body[at])
        for node in ast.walk(statement):
            if hasattr(node, "lineno"):  # all on the release's line (0.5.23's own lines mean nothing here)
                node.lineno = node.end_lineno = body[at].lineno
                node.col_offset = node.end_col_offset = 0
    body[at : at + 1] = upstream
    calls = xqa_workspace._fmha_v2_calls(ast.walk(_method(cls, "forward_extend")))
    fixed_calls = xqa_workspace._fmha_v2_calls(ast.walk(_method(fixed_cls, "forward_extend")))
    assert len(calls) == len(fixed_calls) == 1
    keyword = next(k for k in calls[0].keywords if k.arg == "workspace_buffer")
    keyword.value = copy.deepcopy(next(k.value for k in fixed_calls[0].keywords if k.arg == "workspace_buffer"))
    ast.fix_missing_locations(tree)
    return tree


class _Parent:
    """FlashInfer's backend as ``TRTLLMHAAttnBackend.__init__`` reads it after ``super().__init__``:
    the KV-cache quantisation method (plain BF16 access), the index translator (none) and
    the model runner's KV pool."""

    def __init__(self, model_runner, skip_prefill=False, kv_indptr_buf=None, kv_last_page_len_buf=None):
        self.kv_cache_quant_method = types.SimpleNamespace(
            resolve_attention_access=lambda phase, backend: types.SimpleNamespace(
                kind=KVCacheAttentionAccessKind.PLAIN, scale_recipe=None
            ),
            name="plain",
        )
        self.kv_index_translator = types.SimpleNamespace(is_translating=False)
        self.token_to_kv_pool = model_runner.token_to_kv_pool


class KVCacheAttentionAccessKind(enum.Enum):
    PLAIN = "plain"
    NATIVE_FP4 = "native_fp4"


AttentionType = fp8_cases.AttentionType


class _Env:
    def __init__(self, value=None):
        self.value = value

    def is_set(self):
        return self.value is not None

    def get(self):
        return self.value


class Envs:
    """``sglang.srt.environ.envs`` for the variables these methods read: the workspace size as
    ``SGLANG_FLASHINFER_WORKSPACE_SIZE`` sets it (None: unset, the release's default), one decode
    split (SGLang's default), no skip-softmax thresholds. The GPU worker's too."""

    def __init__(self, workspace_bytes=WORKSPACE_BYTES):
        self.values = {
            "SGLANG_FLASHINFER_WORKSPACE_SIZE": workspace_bytes,
            "SGLANG_TRTLLM_MHA_DECODE_SEQ_LEN_SPLITS": 1,
        }

    def __getattr__(self, name):
        if name == "values":
            raise AttributeError(name)
        return _Env(self.values.get(name))


def _release_get_buffer(release_dir, buffers):
    """SGLang's own ``get_buffer`` (the runtime context's method, compiled from the release's
    ``runtime_context.py``) over ``buffers``."""
    path = fp8_cases.extra_file(release_dir, RUNTIME_CONTEXT)
    tree = _tree(path)
    context = next(
        n
        for n in tree.body
        if isinstance(n, ast.ClassDef)
        and any(isinstance(f, ast.FunctionDef) and f.name == "get_buffer" for f in n.body)
    )
    method = _method(context, "get_buffer")
    namespace = {"Any": typing.Any}
    exec(compile(ast.Module(body=[method], type_ignores=[]), str(path), "exec"), namespace)
    owner = types.SimpleNamespace(resources=types.SimpleNamespace(buffers=buffers))
    return types.MethodType(namespace["get_buffer"], owner)


def load_module(release_dir, oracle=False, fixed_dir=None, mask_dir=None):
    """The release's module (see the module's docstring); ``fixed_dir``: 0.5.23's files (by
    default beside ``release_dir``); ``mask_dir`` (a folder holding 0.5.22): 0.5.22's ``causal=``
    and ``mask_mode=`` arguments put in the release's context-kernel and fmha_v2 calls by AST
    (``fp8_cases._apply_encoder_only_mask``), alone or with 0.5.23's change."""
    path = release_dir / BACKEND
    tree = _tree(path)
    if oracle:
        tree = upstream_fix(tree, _tree((fixed_dir or release_dir.parent / FIXED_RELEASE) / BACKEND))
    if mask_dir is not None:
        tree = copy.deepcopy(tree)
        fixed_methods = {
            n.name: n
            for n in _class(_tree(mask_dir / BACKEND), "TRTLLMHAAttnBackend").body
            if isinstance(n, ast.FunctionDef)
        }
        fp8_cases._apply_encoder_only_mask(
            _method(_class(tree, "TRTLLMHAAttnBackend"), "forward_extend"), fixed_methods
        )
        ast.fix_missing_locations(tree)
    backend = _class(tree, "TRTLLMHAAttnBackend")
    backend.bases, backend.keywords = [ast.copy_location(ast.Name("_Parent", ast.Load()), backend)], []
    ast.fix_missing_locations(backend)
    keep = [
        n
        for n in tree.body
        if (isinstance(n, ast.Assign) and all(isinstance(t, ast.Name) for t in n.targets))
        or isinstance(n, ast.FunctionDef)
        or n is backend
        or (isinstance(n, ast.ClassDef) and n.name == "TRTLLMMHAMetadata")
    ]
    keep = [n for n in keep if not (isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "logger")]
    module = types.ModuleType(MODULE_NAME)
    module.__file__ = str(path)
    module.__spec__ = isolated_release.importlib.machinery.ModuleSpec(MODULE_NAME, None, origin=str(path))
    module.__dict__.update(
        torch=torch,
        dataclass=isolated_release.dataclasses.dataclass,
        field=isolated_release.dataclasses.field,
        ForwardMode=isolated_release.load_forward_mode(release_dir),
        _Parent=_Parent,
        KVCacheAttentionAccessKind=KVCacheAttentionAccessKind,
        AttentionType=AttentionType,
        SWAKVPool=type("SWAKVPool", (), {}),
        envs=Envs(),
        logger=fp8_cases._Logger(),
        is_cp_v2_active=lambda forward_batch: False,
        is_cp_active=lambda forward_batch: False,
        get_cp_strategy=lambda: None,
        make_persistent_multi_ctas_kv_counter_buffer=lambda device, **kwargs: torch.zeros(8, dtype=torch.int32),
        **{
            name: getattr(typing, name)
            for name in ("TYPE_CHECKING", "Optional", "List", "Dict", "Tuple", "Union", "Any", "Callable")
        },
    )
    if "paged_kv_view" in ast.unparse(backend):
        functions = fp8_cases._compile_functions(
            fp8_cases.extra_file(release_dir, PAGED_VIEW), ["paged_view", "paged_kv_view"], {"torch": torch}
        )
        module.paged_kv_view = functions["paged_kv_view"]
    futures = [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "__future__"]
    body = isolated_release.as_the_file_binds(tree, futures + keep)
    isolated_release.run_as_module(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), module)
    module._release_dir = release_dir
    return module


# --------------------------------------------------------------------------
# One process


class Process:
    """The process-level state one arm's backends share, installed into ``module``'s globals."""

    def __init__(self, module, sm="sm90", flashinfer=None):
        """``flashinfer``: the real FlashInfer (on a GPU), else the recorders."""
        self.buffers = {}
        self.calls = []
        self.module = module
        platform = types.SimpleNamespace(is_sm90=sm == "sm90", is_sm100=sm == "sm100", is_sm120=sm == "sm120")
        module.__dict__.update(
            get_buffer=_release_get_buffer(module._release_dir, self.buffers),
            get_platform=lambda: platform,
            get_spec=lambda: types.SimpleNamespace(speculative_eagle_topk=None, speculative_num_draft_tokens=None),
            get_parallel=lambda: types.SimpleNamespace(attn_tp_size=1),
            flashinfer=flashinfer if flashinfer is not None else self._flashinfer(),
        )

    def shared_workspace(self):
        return self.buffers.get(xqa_workspace.WORKSPACE_NAME)

    def _record(self, name, args, kwargs):
        workspace = kwargs["workspace_buffer"]
        shared = self.shared_workspace()
        # XQA's semaphores: the first 8 MiB of the process's workspace (all of it when smaller).
        semaphores = shared.view(torch.uint8)[: min(SEMAPHORES, shared.numel())]
        zero = not bool(semaphores.view(torch.int64).any())
        others = {k: v for k, v in kwargs.items() if k != "workspace_buffer"}
        self.calls.append((name, describe_workspace(workspace, shared), zero, describe(args), describe(others)))
        return workspace

    def _flashinfer(self):
        process = self

        def fmha_v2(qkv, **kwargs):
            workspace = process._record("prefill.trtllm_fmha_v2_prefill", (qkv,), kwargs)
            workspace.view(torch.int32)[0] = COUNTER  # the tile counter fmha_v2 leaves behind
            query = qkv[0]
            return torch.zeros(query.shape, dtype=kwargs.get("out_dtype") or query.dtype)

        def decode(**kwargs):
            process._record("decode.trtllm_batch_decode_with_kv_cache", (), kwargs)
            query = kwargs["query"]
            return torch.zeros(query.shape, dtype=kwargs.get("out_dtype") or query.dtype)

        def context(**kwargs):
            process._record("prefill.trtllm_batch_context_with_kv_cache", (), kwargs)
            query = kwargs["query"]
            return torch.zeros(query.shape, dtype=kwargs.get("out_dtype") or query.dtype)

        return types.SimpleNamespace(
            decode=types.SimpleNamespace(trtllm_batch_decode_with_kv_cache=decode),
            prefill=types.SimpleNamespace(trtllm_fmha_v2_prefill=fmha_v2, trtllm_batch_context_with_kv_cache=context),
        )


def describe(value):
    """Tensors as plain data (dtype, shape, strides, storage offset, a digest of their values),
    recursively."""
    if isinstance(value, torch.Tensor):
        data = value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        digest = hashlib.blake2b(data, digest_size=16).hexdigest()
        return ("tensor", str(value.dtype), tuple(value.shape), value.stride(), value.storage_offset(), digest)
    if isinstance(value, dict):
        return {k: describe(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(describe(v) for v in value)
    if isinstance(value, enum.Enum):
        return str(value)
    return value if isinstance(value, (int, float, str, bool, type(None))) else type(value).__name__


def describe_workspace(workspace, shared):
    """A workspace as a kernel reads it: size, dtype, strides, offset into the process's shared
    workspace, and whether it is that workspace's memory."""
    own = workspace.untyped_storage().data_ptr() == shared.untyped_storage().data_ptr()
    return (
        workspace.numel(),
        str(workspace.dtype),
        workspace.stride(),
        workspace.data_ptr() - shared.data_ptr() if own else None,
        own,
        shared.numel(),
    )


# --------------------------------------------------------------------------
# The backends and their calls


def model_runner(module, pool, draft=False, device="cpu", context_len=2048, requests=8):
    """SGLang's model runner as ``__init__`` reads it (a namespace; the GPU worker's too)."""
    config = types.SimpleNamespace(
        context_len=context_len,
        hidden_size=HEADS * HEAD_DIM,
        num_attention_heads=HEADS,
        head_dim=HEAD_DIM,
        v_head_dim=HEAD_DIM,
        get_num_kv_heads=lambda tp: KV_HEADS,
    )
    return types.SimpleNamespace(
        model_config=config,
        kv_cache_dtype=torch.bfloat16,
        dtype=torch.bfloat16,
        page_size=PAGE,
        req_to_token_pool=types.SimpleNamespace(
            req_to_token=torch.zeros(requests, context_len, dtype=torch.int32, device=device)
        ),
        device=device,
        model=types.SimpleNamespace(modules=lambda: iter(())),
        token_to_kv_pool=pool,
        token_to_kv_pool_allocator=types.SimpleNamespace(get_kvcache=lambda: pool),
        is_draft_worker=draft,
        spec_algorithm=types.SimpleNamespace(is_frozen_kv_mtp=lambda: False),
        max_running_requests=requests,
        prefill_attention_backend_str="trtllm_mha",
        decode_attention_backend_str="trtllm_mha",
    )


class KVPool:
    """The layer's K/V buffers as ``get_kv_buffer`` returns them: [tokens, heads, dim] each."""

    def __init__(self, pages=8):
        generator = torch.Generator().manual_seed(7)
        shape = (pages * PAGE, KV_HEADS, HEAD_DIM)
        self.k = torch.randn(shape, generator=generator).to(torch.bfloat16)
        self.v = torch.randn(shape, generator=generator).to(torch.bfloat16)

    def get_kv_buffer(self, layer_id):
        return self.k, self.v


def layer(attn_type="DECODER"):
    return types.SimpleNamespace(
        layer_id=0,
        tp_q_head_num=HEADS,
        tp_k_head_num=KV_HEADS,
        tp_v_head_num=KV_HEADS,
        head_dim=HEAD_DIM,
        v_head_dim=HEAD_DIM,
        scaling=HEAD_DIM**-0.5,
        k_scale=None,
        v_scale=None,
        k_scale_float=None,
        v_scale_float=None,
        sliding_window_size=-1,
        attn_type=AttentionType[attn_type],
        is_cross_attention=False,
    )


def _metadata(module, lengths, extend):
    bs = len(lengths)
    seqlens = torch.tensor(lengths, dtype=torch.int32)
    q_lens = seqlens if extend else torch.ones(bs, dtype=torch.int32)
    pages = (max(lengths) + PAGE - 1) // PAGE
    return module.TRTLLMMHAMetadata(
        cache_seqlens_int32=seqlens,
        max_seq_len_q=int(q_lens.max()),
        cu_seqlens_q=torch.nn.functional.pad(torch.cumsum(q_lens, 0, dtype=torch.int32), (1, 0)),
        cu_seqlens_k=torch.nn.functional.pad(torch.cumsum(seqlens, 0, dtype=torch.int32), (1, 0)),
        page_table=torch.arange(bs * pages, dtype=torch.int32).view(bs, pages),
    )


def _forward(module, backend, lengths, extend, seed, attn_type="DECODER"):
    generator = torch.Generator().manual_seed(seed)
    bs = len(lengths)
    tokens = sum(lengths) if extend else bs
    backend.forward_metadata = _metadata(module, lengths, extend)
    mode = module.ForwardMode.EXTEND if extend else module.ForwardMode.DECODE
    forward_batch = types.SimpleNamespace(
        forward_mode=mode,
        batch_size=bs,
        out_cache_loc=torch.arange(tokens, dtype=torch.int64),
        seq_lens=torch.tensor(lengths, dtype=torch.int32),
        _attn_output=None,  # 0.5.22: no preallocated output (the kernel allocates its own)
    )
    qkv = torch.randn(tokens, (HEADS + 2 * KV_HEADS) * HEAD_DIM, generator=generator).to(torch.bfloat16)
    q, k, v = qkv.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=-1)
    method = backend.forward_extend if extend else backend.forward_decode
    return method(q, k, v, layer(attn_type), forward_batch, save_kv_cache=False)


STEPS = (("extend", (130, 70)), ("decode", (131, 71)), ("extend", (40,)), ("decode", (41,)))


def run(module, process, steps=STEPS, attn_type="DECODER"):
    """A target backend and a draft backend (its own instance, one step id), each built by
    SGLang's ``__init__`` in one process; then ``steps`` on each, a layer of ``attn_type``
    (``ENCODER_ONLY``: bidirectional): the recorded kernel calls."""
    pool = KVPool()
    target = module.TRTLLMHAAttnBackend(model_runner(module, pool))
    draft = module.TRTLLMHAAttnBackend(model_runner(module, pool, draft=True), speculative_step_id=1)
    for backend in (target, draft):
        for seed, (kind, lengths) in enumerate(steps):
            _forward(module, backend, lengths, kind == "extend", seed, attn_type)
    return {
        "calls": process.calls,
        "workspaces": [describe_workspace(b.workspace_buffer, process.shared_workspace()) for b in (target, draft)],
        "shared": (process.shared_workspace().numel(), len(process.buffers)),
    }
