"""Record pr28144 on the real TRT-LLM kernels: SGLang 0.5.12's own ``forward_decode`` and
``forward_extend`` (target verify) into FlashInfer, with KV caches written by SGLang's own pool.

    python fp8_scales_worker.py                # prints RESULT:<json>
    python fp8_scales_worker.py --cpu-dry-run  # the same logic on CPU, a torch stand-in for the kernel

Whether the record is active is decided outside (SGLANG_HOTFIX_TRTLLM_DISABLE=pr28144 for the
unpatched run); this worker reports which it saw.

What is SGLang's: the ``MHATokenToKVPool`` (FP8 or BF16) whose ``set_kv_buffer`` divides K and V
by the layer's scales and stores them; the ``TRTLLMHAAttnBackend``'s ``init_forward_metadata``,
``forward_decode`` and ``forward_extend``, which call ``flashinfer.decode.
trtllm_batch_decode_with_kv_cache`` (XQA on SM90). Stand-ins: the backend is built without a
model runner (the plain attributes ``__init__`` takes from one, as in the CUDA-graph proof); the
RadixAttention layer and the ForwardBatch are namespaces holding the fields those methods read;
queries and K/V are random.

The check, per case: each query row against fp32 attention over the *de-quantized* cache (what
the pool stores, times the scale it divided by; for a BF16 cache, what it stores). Cases: an FP8
cache with K scale 0.5 and V scale 4 (decode, and target verify with 4 draft tokens); the same
with unit scales (what the FP8 path gives at best: its own floor); a BF16 cache under a
checkpoint's K scale of 0.5 (and V scale 4, which a BF16 cache never uses); a BF16 cache without
scales (the BF16 floor).
"""

import json
import pathlib
import sys
import traceback
import types

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from cuda_graph_worker import (  # noqa: E402
    HEAD_DIM,
    KV_HEADS,
    PAGE_SIZE,
    Q_HEADS,
    attention,
    import_sglang,
    radix_layer,
    use_kernel,
)

BATCH = 16
MAX_CONTEXT = 1024
DRAFT_TOKENS = 4
PAGES = BATCH * MAX_CONTEXT // PAGE_SIZE + 1  # page 0: the pool's padding
FP8 = torch.float8_e4m3fn
CASES = {
    # name: (KV dtype, forward mode, k_scale, v_scale)
    "fp8_scaled_decode": (FP8, "decode", 0.5, 4.0),
    "fp8_unit_decode": (FP8, "decode", 1.0, 1.0),
    "fp8_scaled_target_verify": (FP8, "target_verify", 0.5, 4.0),
    "fp8_unit_target_verify": (FP8, "target_verify", 1.0, 1.0),
    "bf16_checkpoint_scales_decode": (torch.bfloat16, "decode", 0.5, 4.0),
    "bf16_unscaled_decode": (torch.bfloat16, "decode", None, None),
}


def make_backend(backend_module, kv_dtype, device):
    backend = object.__new__(backend_module.TRTLLMHAAttnBackend)
    backend.max_context_len = MAX_CONTEXT
    backend.page_size = PAGE_SIZE
    backend.device = device
    backend.data_type = kv_dtype  # model_runner.kv_cache_dtype
    backend.q_data_type = torch.bfloat16  # model_runner.dtype
    backend.speculative_step_id = 0
    backend.speculative_num_draft_tokens = DRAFT_TOKENS
    backend.topk = 1
    backend.use_sliding_window_kv_pool = False
    backend._swa_kv_pool = None
    backend.workspace_buffer = torch.zeros(512 * 1024 * 1024, dtype=torch.uint8, device=device)
    # __init__'s is_sm90_supported() / is_sm120_supported(), as this device answers them; the CPU
    # dry run takes the H200's path (XQA), where no Q is quantized (SGLang's quantizer needs CUDA).
    backend.is_xqa_impl = device.type == "cpu" or torch.cuda.get_device_capability()[0] in (9, 12)
    return backend


def paged_batch(backend_module, ForwardMode, pool, kv_dtype, device, generator, shape, mode="decode", cache_loc=False):
    """SGLang's backend over ``pool`` with the metadata of one forward batch, as the GPU workers
    share it: ``shape`` = (batch, pages, context, (low, high)); the requests' pages drawn at random
    from ``generator`` (page 0 is the pool's padding), then each request's length in [low, high)
    (the new token included); a decode batch, or target verify; ``cache_loc``: the new tokens'
    slots as ``out_cache_loc`` (a KV write), else None. Returns (backend, forward batch,
    req_to_token on the device, the lengths on the CPU)."""
    batch, pages, context, (low, high) = shape
    page_ids = torch.randperm(pages - 1, generator=generator)[: batch * (context // PAGE_SIZE)] + 1
    page_ids = page_ids.view(batch, context // PAGE_SIZE)
    positions = torch.arange(context)
    req_to_token = (page_ids[:, positions // PAGE_SIZE] * PAGE_SIZE + positions % PAGE_SIZE).to(torch.int32)
    lengths_cpu = torch.randint(low, high, (batch,), generator=generator)
    out_cache_loc = req_to_token[torch.arange(batch), lengths_cpu - 1].to(torch.int64) if cache_loc else None
    req_to_token = req_to_token.to(device)
    forward_batch = types.SimpleNamespace(
        forward_mode=ForwardMode.TARGET_VERIFY if mode == "target_verify" else ForwardMode.DECODE,
        spec_info=None,
        batch_size=batch,
        seq_lens=lengths_cpu.to(device),
        seq_lens_cpu=lengths_cpu,
        req_pool_indices=torch.arange(batch, device=device),
        req_to_token_pool=types.SimpleNamespace(req_to_token=req_to_token),
        token_to_kv_pool=pool,
        out_cache_loc=None if out_cache_loc is None else out_cache_loc.to(device),
        encoder_lens=None,
    )
    backend = make_backend(backend_module, kv_dtype, device)
    backend.token_to_kv_pool = pool
    backend.init_forward_metadata(forward_batch)
    return backend, forward_batch, req_to_token, lengths_cpu


def run_case(backend_module, ForwardMode, name, device, generator):
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    kv_dtype, mode, k_scale, v_scale = CASES[name]
    pool = MHATokenToKVPool(
        size=PAGES * PAGE_SIZE - PAGE_SIZE,
        page_size=PAGE_SIZE,
        dtype=kv_dtype,
        head_num=KV_HEADS,
        head_dim=HEAD_DIM,
        layer_num=1,
        device=str(device),
        enable_memory_saver=False,
    )
    layer = radix_layer(device, k_scale, v_scale)
    # K and V as a model computes them (bf16), written by SGLang's pool: divided by the scales, stored.
    slots = torch.arange(PAGE_SIZE, PAGES * PAGE_SIZE, device=device)
    k = torch.randn(len(slots), KV_HEADS, HEAD_DIM, generator=generator).to(torch.bfloat16).to(device)
    v = torch.randn(len(slots), KV_HEADS, HEAD_DIM, generator=generator).to(torch.bfloat16).to(device)
    pool.set_kv_buffer(layer, slots, k, v, layer.k_scale, layer.v_scale)
    k_stored, v_stored = pool.get_kv_buffer(0)
    dequantized_k = k_stored.float() * (k_scale if kv_dtype == FP8 else 1.0)
    dequantized_v = v_stored.float() * (v_scale if kv_dtype == FP8 else 1.0)

    q_len = DRAFT_TOKENS if mode == "target_verify" else 1
    shape = (BATCH, PAGES, MAX_CONTEXT, (1, MAX_CONTEXT - q_len))
    backend, batch, req_to_token, lengths_cpu = paged_batch(
        backend_module, ForwardMode, pool, kv_dtype, device, generator, shape, mode
    )
    q = torch.randn(BATCH * q_len, Q_HEADS * HEAD_DIM, generator=generator).to(torch.bfloat16).to(device)
    method = backend.forward_extend if mode == "target_verify" else backend.forward_decode
    try:
        out = method(q, None, None, layer, batch, save_kv_cache=False)
        if device.type == "cuda":
            torch.cuda.synchronize()
    except Exception as error:
        return {"error": "%s: %s" % (type(error).__name__, str(error)[:300]), "trace": traceback.format_exc()[-1500:]}

    timing = None
    if name == "fp8_scaled_decode":  # a CPU dry run only checks that the timing runs
        timing = time_calls(method, q, layer, batch, device, *((2000, 5) if device.type == "cuda" else (3, 1)))
    tokens = req_to_token.long()
    q_rows = q.view(BATCH, q_len, Q_HEADS, HEAD_DIM).float()
    out_rows = out.view(BATCH, q_len, Q_HEADS, HEAD_DIM).float()
    errors = []
    for i in range(q_len):
        # decode: the new token is already counted in seq_lens; target verify: draft token i sees
        # the prefix and draft tokens 0..i (cache_seqlens = seq_lens + draft tokens, causal).
        keys = lengths_cpu.to(device) + (i + 1 if mode == "target_verify" else 0)
        expected = attention(q_rows[:, i], dequantized_k[tokens], dequantized_v[tokens], keys, layer.scaling)
        errors.append((out_rows[:, i] - expected).abs().amax(dim=(1, 2)))
    error = torch.stack(errors, dim=1).amax(dim=1)
    nan = torch.isnan(out_rows).flatten(1).any(dim=1)
    return {
        "rows": BATCH,
        "microseconds_per_call": timing,
        "max_abs_error": float(error[~nan].max()) if bool((~nan).any()) else None,
        "nan_rows": int(nan.sum()),
        "errors": [round(float(e), 4) for e in error],
    }


def time_calls(method, q, layer, batch, device, calls=2000, rounds=5):
    """Median over rounds of the wall time per eager call (the Python and launch work a call
    costs outside a CUDA graph; the GPU runs behind, synchronised once per round)."""
    import time

    samples = []
    for _ in range(rounds):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            method(q, None, None, layer, batch, save_kv_cache=False)
        if device.type == "cuda":
            torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return sorted(samples)[len(samples) // 2]


def main():
    dry_run = "--cpu-dry-run" in sys.argv
    device = torch.device("cpu" if dry_run else "cuda")
    backend_module, ForwardMode, _ = import_sglang()
    kernel = use_kernel(backend_module, dry_run)
    # The records run upstream's code compiled into SGLang's own forward_decode (0.14.0): the function
    # stays SGLang's, its code is the hotfix's compile, and the module's `flashinfer` is FlashInfer.
    import sglang_hotfix_trtllm

    own_flashinfer = backend_module.flashinfer
    sglang_hotfix_trtllm.apply()
    decode = backend_module.TRTLLMHAAttnBackend.__dict__["forward_decode"]
    decode_type = type(decode).__name__
    from sglang_hotfix_trtllm import patch
    from sglang_hotfix_trtllm.records import pr28144

    # pr28144 itself in force (with it off by name, pr31667 may still edit forward_decode on 0.5.12).
    edited = patch.is_patched(pr28144.HOTFIX, backend_module.TRTLLMHAAttnBackend)
    generator = torch.Generator().manual_seed(0)
    results = {name: run_case(backend_module, ForwardMode, name, device, generator) for name in CASES}
    gate = (
        "FlashInfer's own" if backend_module.flashinfer is own_flashinfer else type(backend_module.flashinfer).__name__
    )
    print(
        "RESULT:"
        + json.dumps(
            {
                "patched": decode_type == "function" and edited and backend_module.flashinfer is own_flashinfer,
                "forward_decode_type": decode_type,
                "flashinfer_global": gate,
                "kernel": kernel,
                "xqa": device.type == "cpu" or torch.cuda.get_device_capability()[0] in (9, 12),
                "device": "cpu (dry run)" if dry_run else torch.cuda.get_device_name(),
                "torch": torch.__version__,
                "sglang_file": backend_module.__file__,
                "shape": {"batch": BATCH, "q_heads": Q_HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM},
                "cases": results,
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
