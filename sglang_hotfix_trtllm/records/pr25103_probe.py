"""The probe behind ``sglang-hotfix-trtllm verify`` for PR #25103 (with #26966).

Imported only by ``verify``, after SGLang's backend module and torch were
imported. It builds, on CPU, from SGLang's real classes:

* a *target* model runner whose active pool is a real ``SWAKVPool`` (layers 0
  and 2 slide, 1 and 3 are full attention: layer 0 slides, as in gpt-oss)
  with a real ``SWATokenToKVPoolAllocator`` over it;
* an *EAGLE3 draft* model runner that owns a real ``MHATokenToKVPool`` (one
  layer, id 0) and shares the target's allocator, as SGLang's draft worker does.

The model runners themselves are plain namespaces holding exactly what
``__init__`` reads (SGLang's ``ModelRunner`` loads a model).

For each runner it then constructs the backend twice with SGLang's own
``TRTLLMHAAttnBackend.__init__``, the installed function object itself (taken
from under this package's wrapper when the hotfix is applied):

* unpatched: that function, as it is;
* patched: that function wrapped as ``patch.wrap`` wraps it,
  ``wrapt.FunctionWrapper(original, functools.partial(pr25103.HOTFIX.wrapper, module))``.

How SGLang's ``__init__`` runs on CPU: it calls ``super().__init__(...)``,
FlashInfer's backend, which needs flashinfer and a GPU. The probe neither
modifies SGLang's classes nor compiles SGLang code of its own: it makes a
throwaway subclass ``(TRTLLMHAAttnBackend, _QuietBase)`` where ``_QuietBase``
subclasses FlashInfer's backend with an ``__init__`` that accepts the same
arguments and sets nothing. Python's method resolution order puts
``_QuietBase`` between ``TRTLLMHAAttnBackend`` and FlashInfer's backend, so
the zero-argument ``super()`` inside SGLang's unmodified function (bound to
``TRTLLMHAAttnBackend``) reaches ``_QuietBase``. FlashInfer's base sets none
of the two attributes this record is about in the affected releases. The
function is put on the throwaway class as its ``__init__`` and the backend
is built by calling that class, so the wrapper is bound exactly as on
SGLang's class. SGLang's ``__init__`` allocates its global workspace buffer
(512 MiB by default) into a module global: the probe puts the module's
globals back as they were afterwards.

The "upstream fix" column is what SGLang 0.5.13 holds for these runners,
stated per runner from how the probe built them, not computed by the
wrapper's code (``pr25103.resolve_swa_kv_pool``): 0.5.13's
``_resolve_swa_kv_pool`` returns the active pool when it is an ``SWAKVPool``
(the target: its own pool) and None for an EAGLE-style draft (EAGLE3 is not
FROZEN_KV MTP); 0.5.13's FlashInfer base sets ``use_sliding_window_kv_pool``
from the active pool being an ``SWAKVPool`` (target True, draft False).

The patched backend must hold exactly that for both runners; the unpatched
draft must hold the target's ``SWAKVPool`` (the bug), else the probe did not
run what it claims to and fails.
"""

import functools
import types

from . import pr25103
from ..record import ProbeReport

# Small real pools: one token slot per page, float32 on CPU.
SIZE, SIZE_SWA, HEADS, HEAD_DIM = 16, 8, 2, 8
TARGET_SWA_LAYERS, TARGET_FULL_LAYERS = (0, 2), (1, 3)
DRAFT_LAYERS = 1
RUNNERS = ("target", "EAGLE3 draft")


def _runner(torch, pool, allocator, is_draft_worker, algorithm):
    """What ``TRTLLMHAAttnBackend.__init__`` (and 0.5.13's resolver) reads from a model runner."""
    return types.SimpleNamespace(
        token_to_kv_pool=pool,
        token_to_kv_pool_allocator=allocator,
        is_draft_worker=is_draft_worker,
        spec_algorithm=algorithm,
        req_to_token_pool=types.SimpleNamespace(req_to_token=torch.zeros(2, 8, dtype=torch.int32)),
        model_config=types.SimpleNamespace(context_len=256, hidden_size=HEADS * HEAD_DIM),
        kv_cache_dtype=torch.float32,
        dtype=torch.float32,
        page_size=1,
        device="cpu",
        server_args=types.SimpleNamespace(speculative_eagle_topk=1, speculative_num_draft_tokens=4),
    )


def swa_pool(torch, swa_layers=TARGET_SWA_LAYERS, full_layers=TARGET_FULL_LAYERS, size=SIZE, size_swa=SIZE_SWA):
    """SGLang's own ``SWAKVPool`` on CPU: one token slot per page, float32 (also the tests' pools)."""
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

    return SWAKVPool(
        size=size,
        size_swa=size_swa,
        page_size=1,
        dtype=torch.float32,
        head_num=HEADS,
        head_dim=HEAD_DIM,
        swa_attention_layer_ids=list(swa_layers),
        full_attention_layer_ids=list(full_layers),
        enable_kvcache_transpose=False,
        device="cpu",
    )


def plain_pool(torch, layers, size=SIZE):
    """SGLang's own ``MHATokenToKVPool`` on CPU, as ``swa_pool``."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    return MHATokenToKVPool(
        size=size,
        page_size=1,
        dtype=torch.float32,
        head_num=HEADS,
        head_dim=HEAD_DIM,
        layer_num=layers,
        device="cpu",
        enable_memory_saver=False,
    )


def _runners(torch):
    """name -> model runner, and the target's SWAKVPool."""
    from sglang.srt.mem_cache.swa_memory_pool import SWATokenToKVPoolAllocator
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    target_pool = swa_pool(torch)
    allocator = SWATokenToKVPoolAllocator(SIZE, SIZE_SWA, 1, torch.float32, "cpu", target_pool, False)
    draft_pool = plain_pool(torch, DRAFT_LAYERS)
    runners = {
        "target": _runner(torch, target_pool, allocator, False, SpeculativeAlgorithm.EAGLE3),
        "EAGLE3 draft": _runner(torch, draft_pool, allocator, True, SpeculativeAlgorithm.EAGLE3),
    }
    return runners, target_pool


def _original(cls):
    """SGLang's own ``__init__``: the class attribute, or what this package's wrapper wraps."""
    import wrapt

    current = cls.__dict__[pr25103.METHOD_NAME]
    original = getattr(current, "__wrapped__", current) if isinstance(current, wrapt.FunctionWrapper) else current
    if type(original) is not types.FunctionType or original.__code__.co_name != pr25103.METHOD_NAME:
        raise RuntimeError("%s.%s is not SGLang's function (%r)" % (pr25103.CLASS_NAME, pr25103.METHOD_NAME, original))
    return original


def _throwaway_classes(cls, functions):
    """name -> a throwaway subclass of ``cls`` whose ``__init__`` is that function
    and under which ``super().__init__`` in ``cls``'s code reaches a base that sets nothing."""
    flashinfer_base = cls.__mro__[1]

    def __init__(self, model_runner, skip_prefill=False, kv_indptr_buf=None, kv_last_page_len_buf=None):
        pass

    quiet_base = type("_QuietBase", (flashinfer_base,), {"__init__": __init__, "__module__": __name__})
    classes = {}
    for name, function in functions.items():
        probe_class = type(cls.__name__, (cls, quiet_base), {"__init__": function, "__module__": __name__})
        if probe_class.__mro__[1:4] != (cls, quiet_base, flashinfer_base):
            raise RuntimeError(
                "cannot put a quiet base under %s: method resolution order %s"
                % (cls.__name__, [c.__name__ for c in probe_class.__mro__])
            )
        classes[name] = probe_class
    return classes


def _construct(module, classes, runners):
    """(variant, runner) -> backend, each built by calling the throwaway class;
    the module's globals are put back as they were afterwards."""
    namespace = vars(module)
    before = dict(namespace)
    try:
        return {
            (variant, runner): probe_class(model_runner)
            for variant, probe_class in classes.items()
            for runner, model_runner in runners.items()
        }
    finally:
        for name in [n for n in namespace if n not in before]:
            del namespace[name]
        for name, value in before.items():
            if namespace.get(name, before) is not value:
                namespace[name] = value


def _describe_pool(pool, model_runner, target_pool):
    if pool is None:
        return "None"
    if pool is model_runner.token_to_kv_pool:
        whose = "own pool"
    elif pool is target_pool:
        whose = "target's pool"
    else:
        whose = "another pool"
    return "%s (%s)" % (type(pool).__name__, whose)


def probe(module):
    import torch
    import wrapt

    cls = getattr(module, pr25103.CLASS_NAME)
    original = _original(cls)
    functions = {
        "unpatched": original,
        "patched": wrapt.FunctionWrapper(original, functools.partial(pr25103.HOTFIX.wrapper, module)),
    }
    runners, target_pool = _runners(torch)
    backends = _construct(module, _throwaway_classes(cls, functions), runners)

    # SGLang 0.5.13, per runner (see the module docstring): (_swa_kv_pool, use_sliding_window_kv_pool).
    upstream = {"target": (target_pool, True), "EAGLE3 draft": (None, False)}

    def held(variant, runner):
        backend = backends[(variant, runner)]
        return backend._swa_kv_pool, backend.use_sliding_window_kv_pool

    rows = []
    for runner in RUNNERS:
        model_runner = runners[runner]
        states = [held("unpatched", runner), held("patched", runner), upstream[runner]]
        rows.append(
            ("%s: _swa_kv_pool" % runner,)
            + tuple(_describe_pool(pool, model_runner, target_pool) for pool, _ in states)
        )
        rows.append(("%s: use_sliding_window_kv_pool" % runner,) + tuple(str(flag) for _, flag in states))

    def same(state, expected):
        return state[0] is expected[0] and state[1] is expected[1]

    if held("unpatched", "EAGLE3 draft")[0] is not target_pool:
        raise RuntimeError(
            "SGLang's unpatched __init__ did not give the EAGLE3 draft the target's SWAKVPool: the "
            "probe does not reproduce the bug on this SGLang (draft holds %s)"
            % _describe_pool(held("unpatched", "EAGLE3 draft")[0], runners["EAGLE3 draft"], target_pool)
        )
    differing = [runner for runner in RUNNERS if not same(held("patched", runner), upstream[runner])]
    return ProbeReport(
        title="SGLang's own __init__ on real pools (CPU): target on an SWAKVPool (layer 0 sliding), EAGLE3 draft "
        "on its own MHATokenToKVPool sharing the target's SWATokenToKVPoolAllocator",
        rows=tuple(rows),
        patched_equals_upstream=not differing,
        detail=("patched backend differs from SGLang 0.5.13's for: " + ", ".join(differing))
        if differing
        else "both runners: patched _swa_kv_pool and use_sliding_window_kv_pool equal SGLang 0.5.13's; "
        "unpatched, the draft translates through the target's sliding-window mapping",
    )
