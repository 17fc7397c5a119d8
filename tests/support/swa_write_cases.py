"""The fused FP8 KV write of SGLang 0.5.9 (record pr19107) on SGLang's real ``SWAKVPool``, on CPU.

* ``swa_pool()``: the installed SGLang's ``SWAKVPool`` with ``fp8_cases``'s page geometry, layer 0
  sliding and layer 1 full, its full-to-SWA mapping registered through its own ``register_mapping``.
* ``helper_calls(module, swa)``: what SGLang's fused write (``fused_fp8_set_kv_buffer``, recorded by
  ``fp8_cases``) receives when ``_fused_fp8_set_kv_buffer`` is called directly, three ways.
* ``method_calls(module)``: the same and FlashInfer's kernels, inside ``forward_decode`` and
  ``forward_extend`` (``fp8_cases``'s FP8 cases with the fused write).
* ``modules(release_dir)``: the release's module and the oracle, the release with 0.5.10's
  ``_get_layer_cache_loc`` and statement inserted by AST (``fp8_cases.upstream_module``).
"""

import types

import torch

import fp8_cases
import release_selection

RELEASE, TRANSLATED_RELEASE = "0.5.9", "0.5.10"
SWA_LAYER, FULL_LAYER = 0, 1


def swa_pool():
    """SGLang's SWAKVPool (the installed SGLang's: 0.5.9's own needs its server stack), FP8, with
    the fp8_cases page geometry, layer 0 sliding and layer 1 full, and a full-to-SWA mapping
    registered through the pool's own ``register_mapping``: full slot i -> a shuffled SWA slot."""
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

    full, swa = fp8_cases.PAGES * fp8_cases.PAGE_SIZE, (fp8_cases.PAGES - 2) * fp8_cases.PAGE_SIZE
    pool = SWAKVPool(
        size=full,
        size_swa=swa,
        page_size=fp8_cases.PAGE_SIZE,
        dtype=fp8_cases.FP8,
        head_num=fp8_cases.KV_HEADS,
        head_dim=fp8_cases.HEAD_DIM,
        swa_attention_layer_ids=[SWA_LAYER],
        full_attention_layer_ids=[FULL_LAYER],
        enable_kvcache_transpose=False,
        device="cpu",
    )
    generator = torch.Generator().manual_seed(7)
    mapping = torch.randperm(full + fp8_cases.PAGE_SIZE, generator=generator) % (swa + fp8_cases.PAGE_SIZE)
    pool.register_mapping(torch.cat([mapping, torch.tensor([-1])]).to(torch.int64))
    return pool


def layer_of(layer_id, scales):
    return types.SimpleNamespace(
        layer_id=layer_id,
        tp_q_head_num=fp8_cases.Q_HEADS,
        tp_k_head_num=fp8_cases.KV_HEADS,
        tp_v_head_num=fp8_cases.KV_HEADS,
        head_dim=fp8_cases.HEAD_DIM,
        scaling=fp8_cases.HEAD_DIM**-0.5,
        sliding_window_size=8 if layer_id == SWA_LAYER else -1,
        **fp8_cases.SCALES[scales],
    )


def record(module, call, pool=None):
    """What ``call`` hands the recorded kernels and the fused write, as plain data; with ``pool``,
    whether each tensor is the memory of the pool's buffers (layer 0 and 1), or of its own."""
    log = fp8_cases._LOGS[module]
    del log[:]
    storages = None
    if pool is not None:
        (k0, v0), (k1, v1) = pool.get_kv_buffer(SWA_LAYER), pool.get_kv_buffer(FULL_LAYER)
        storages = fp8_cases.named_storages(swa_k=k0, swa_v=v0, full_k=k1, full_v=v1)
    try:
        result = call()
        calls = [(name, fp8_cases.plain(arguments, storages)) for name, arguments in log]
        return calls + ([("returned", fp8_cases.plain(result, storages))] if isinstance(result, torch.Tensor) else [])
    except Exception as error:
        return "raised %s: %s" % (type(error).__name__, error)
    finally:
        del log[:]


def helper_calls(module, swa):
    """The fused write called directly, three ways, per layer and scale, with and without an SWA pool."""
    pool = swa_pool()
    out = {}
    for layer_id in (SWA_LAYER, FULL_LAYER):
        for scales in ("absent", "float"):
            backend = object.__new__(module.TRTLLMHAAttnBackend)
            backend.page_size = fp8_cases.PAGE_SIZE
            backend.use_sliding_window_kv_pool, backend._swa_kv_pool = (True, pool) if swa else (False, None)
            generator = torch.Generator().manual_seed(layer_id * 10 + len(scales))
            q, k, v = (torch.randn(3, 1, fp8_cases.HEAD_DIM, generator=generator).to(torch.bfloat16) for _ in "qkv")
            layer = layer_of(layer_id, scales)
            batch = types.SimpleNamespace(out_cache_loc=torch.tensor([5, 9, 17]), token_to_kv_pool=pool)
            cls = module.TRTLLMHAAttnBackend
            key = "layer%d-%s" % (layer_id, scales)
            out[key + "-keywords"] = record(
                module, lambda: backend._fused_fp8_set_kv_buffer(q=q, k=k, v=v, layer=layer, forward_batch=batch), pool
            )
            out[key + "-positional"] = record(
                module, lambda: backend._fused_fp8_set_kv_buffer(q, k, v, layer, batch), pool
            )
            out[key + "-class"] = record(
                module, lambda: cls._fused_fp8_set_kv_buffer(backend, q, k, v, layer, batch), pool
            )
    return out


def method_calls(module, release=RELEASE, layer_ids=(SWA_LAYER, FULL_LAYER)):
    """``forward_decode`` and ``forward_extend`` of fp8_cases's FP8 cases with the fused write (packed
    and strided queries), on the real SWA pool (the page tables as fp8_cases builds them)."""
    out = {}
    for name, case in fp8_cases.cases(release).items():
        if not case.fused or case.scales not in ("absent", "float", "checkpoint"):
            continue
        for layer_id in layer_ids:
            pool = swa_pool()
            backend = fp8_cases._backend(module, case, pool)
            backend.use_sliding_window_kv_pool, backend._swa_kv_pool = True, pool
            batch = fp8_cases._forward_batch(module, case, pool)
            q, k, v = fp8_cases.inputs(case, torch.Generator().manual_seed(fp8_cases._seed(case)))
            layer = layer_of(layer_id, case.scales)
            method = getattr(backend, case.method)
            out["%s-layer%d" % (name, layer_id)] = record(
                module, lambda: method(q, k, v, layer, batch, save_kv_cache=True, sinks=None), pool
            )
    return out


def modules(release_dir):
    oracle = fp8_cases.upstream_module(
        release_dir,
        release_selection.release_dir(fp8_cases.FIXED_RELEASE),
        scales=False,
        swa_locations_dir=release_selection.release_dir(TRANSLATED_RELEASE),
    )
    return fp8_cases.load_backend_module(release_dir), oracle
