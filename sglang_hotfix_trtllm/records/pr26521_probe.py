"""The probe behind ``sglang-hotfix-trtllm verify`` for PR #26521.

Imported only by ``verify``, after SGLang's backend module and torch were
imported. It runs the capture method's draft-decode branch on CPU with small
synthetic inputs three ways, each on a fresh backend object whose CUDA-graph
buffers come from SGLang's own ``init_cuda_graph_state``:

* unpatched: SGLang's original function;
* patched: the same function wrapped by this package's wrapper;
* upstream: SGLang's function with PR #26521's statement inserted, compiled
  from the installed source with the module's own globals.

The patched result must equal upstream's in every buffer and metadata field.
"""

import ast
import functools

from . import pr26521
from ..record import ProbeReport

SEQ_LENS = (5, 9, 17)
STEP_ID = 1
MAX_BS = 4


def backend_without_model_runner(
    cls, *, device, step_id, max_bs, max_num_tokens, max_context_len, page_size, num_draft_tokens
):
    """A real ``TRTLLMHAAttnBackend`` without its GPU- and model-bound ``__init__``.

    Only the plain attributes that ``__init__`` would take from a model runner
    and that ``init_cuda_graph_state`` and the capture and replay methods read
    are set by hand; the CUDA-graph buffers then come from SGLang's own
    ``init_cuda_graph_state``. Also used by the tests and the GPU check.
    """
    backend = object.__new__(cls)
    backend.max_context_len = max_context_len
    backend.page_size = page_size
    backend.device = device
    backend.speculative_step_id = step_id
    backend.speculative_num_draft_tokens = num_draft_tokens
    backend.topk = 1
    backend.use_sliding_window_kv_pool = False
    backend._swa_kv_pool = None
    backend.decode_cuda_graph_metadata = {}
    backend.target_verify_metadata = {}
    backend.draft_extend_metadata = {}
    backend.forward_metadata = None
    backend.init_cuda_graph_state(max_bs, max_num_tokens)
    return backend


def _backend(cls, torch):
    return backend_without_model_runner(
        cls,
        device=torch.device("cpu"),
        step_id=STEP_ID,
        max_bs=MAX_BS,
        max_num_tokens=MAX_BS * 2,
        max_context_len=256,
        page_size=16,
        num_draft_tokens=2,
    )


def _upstream_function(module):
    from ..source import read_text

    tree = ast.parse(read_text(module.__file__))
    method = pr26521.upstream_fixed_method_node(tree)
    futures = [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "__future__"]
    code = compile(ast.Module(body=futures + [method], type_ignores=[]), module.__file__, "exec", dont_inherit=True)
    namespace = {}
    exec(code, vars(module), namespace)
    return namespace[pr26521.METHOD_NAME]


def _state(backend, torch):
    state = {}
    for name, value in sorted(vars(backend.forward_metadata).items()):
        state["metadata." + name] = value.tolist() if isinstance(value, torch.Tensor) else value
    for table in ("decode_cuda_graph_metadata", "target_verify_metadata", "draft_extend_metadata"):
        for key, value in getattr(backend, table).items():
            if isinstance(value, torch.Tensor):
                state["%s[%r]" % (table, key)] = value.tolist()
    return state


def probe(module):
    import torch
    import wrapt

    cls = getattr(module, pr26521.CLASS_NAME)
    current = cls.__dict__[pr26521.METHOD_NAME]
    original = getattr(current, "__wrapped__", current) if isinstance(current, wrapt.FunctionWrapper) else current
    functions = {
        "unpatched": original,
        "patched": wrapt.FunctionWrapper(original, functools.partial(pr26521.HOTFIX.wrapper, module)),
        "upstream": _upstream_function(module),
    }
    seq_lens = torch.tensor(SEQ_LENS, dtype=torch.int64)
    bs = len(SEQ_LENS)
    states = {}
    for name, function in functions.items():
        backend = _backend(cls, torch)
        if name == "patched":
            function = function.__get__(backend, cls)
            function(
                bs,
                bs,
                torch.arange(bs),
                seq_lens,
                encoder_lens=None,
                forward_mode=module.ForwardMode.DECODE,
                spec_info=object(),
            )
        else:
            function(
                backend,
                bs,
                bs,
                torch.arange(bs),
                seq_lens,
                encoder_lens=None,
                forward_mode=module.ForwardMode.DECODE,
                spec_info=object(),
            )
        states[name] = _state(backend, torch)
    shown = ("metadata.cache_seqlens_int32", "metadata.cu_seqlens_k", "metadata.max_seq_len_k")
    rows = tuple((key,) + tuple(str(states[n].get(key)) for n in ("unpatched", "patched", "upstream")) for key in shown)
    differing = sorted(
        k
        for k in set(states["patched"]) | set(states["upstream"])
        if states["patched"].get(k) != states["upstream"].get(k)
    )
    return ProbeReport(
        title="draft-decode capture, bs=%d, seq_lens=%s, speculative_step_id=%d" % (bs, list(SEQ_LENS), STEP_ID),
        rows=rows,
        patched_equals_upstream=not differing,
        detail=("fields differing from upstream: " + ", ".join(differing))
        if differing
        else "all %d fields and buffers equal upstream's" % len(states["upstream"]),
    )
