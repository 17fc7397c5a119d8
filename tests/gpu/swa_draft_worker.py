"""One decode step of an EAGLE3 draft on a sliding-window target, through SGLang
0.5.12's own ``TRTLLMHAAttnBackend`` on the real TRT-LLM decode kernel (record
pr25103).

    python swa_draft_worker.py                # prints RESULT:<json>
    python swa_draft_worker.py --cpu-dry-run  # the same logic on CPU, a torch stand-in for the kernel

Whether the record is active is decided outside (SGLANG_HOTFIX_TRTLLM_DISABLE=pr25103
for the unpatched run); this worker reports which it saw.

What is SGLang's: the target's ``SWAKVPool`` (layer 0 slides, layer 1 does
not, as in gpt-oss) and its ``SWATokenToKVPoolAllocator``, whose full-to-SWA
index mapping translates the target's tokens; the draft's own
``MHATokenToKVPool`` (one layer, layer id 0, as an EAGLE3 head has); the
draft's ``TRTLLMHAAttnBackend`` built by its own ``__init__`` from a model
runner holding those (the hotfix wraps that ``__init__``); its
``init_forward_metadata`` for a draft decode and ``forward_decode``, which
calls ``flashinfer.decode.trtllm_batch_decode_with_kv_cache`` (XQA on SM90).
Stand-ins: the model runner and the ForwardBatch are namespaces holding the
fields those methods read; FlashInfer's base ``__init__`` is skipped while the
backend is built (it needs a full model config, and sets none of the fields
the record is about); the allocations are written into the allocator's
mapping directly (whole pages: each request's full pages, and, for its tokens
in the sliding window, other pages of the SWA pool), as the paged allocator
leaves them; queries are random.

The check: each row's output against fp32 attention over the draft's own KV
at the request's true slots (``req_to_token``) and lengths.
"""

import json
import pathlib
import sys
import types

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from cuda_graph_worker import (
    DTYPE,
    HEAD_DIM,
    KV_HEADS,
    PAGE_SIZE,
    Q_HEADS,
    TOLERANCE,
    attention,
    import_sglang,  # noqa: E402
    radix_layer,
    use_kernel,
)

BATCH = 16
MAX_CONTEXT = 1024
PAGES = 2 * BATCH * MAX_CONTEXT // PAGE_SIZE  # per pool
STEP_ID = 0  # the first draft step: it attends over seq_len + 1 keys


def build_pools(device, generator):
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool, SWATokenToKVPoolAllocator

    size = PAGES * PAGE_SIZE
    common = dict(page_size=PAGE_SIZE, dtype=DTYPE, head_num=KV_HEADS, head_dim=HEAD_DIM, device=device)
    target = SWAKVPool(
        size=size,
        size_swa=size,
        swa_attention_layer_ids=[0],
        full_attention_layer_ids=[1],
        enable_kvcache_transpose=False,
        **common,
    )
    allocator = SWATokenToKVPoolAllocator(size, size, PAGE_SIZE, DTYPE, device, target, False)
    draft = MHATokenToKVPool(size=size, layer_num=1, enable_memory_saver=False, **common)
    k, v = draft.get_kv_buffer(0)
    k.copy_(torch.randn(k.shape, generator=generator).to(DTYPE))
    v.copy_(torch.randn(v.shape, generator=generator).to(DTYPE))
    return target, allocator, draft


def place_requests(allocator, device, generator):
    """req_to_token over whole random pages (page 0 is the pools' padding), and
    the allocator's full-to-SWA mapping for those tokens: other random pages."""
    pages_per_req = MAX_CONTEXT // PAGE_SIZE
    full_pages = torch.randperm(PAGES - 1, generator=generator)[: BATCH * pages_per_req].view(BATCH, pages_per_req) + 1
    swa_pages = torch.randperm(PAGES - 1, generator=generator)[: BATCH * pages_per_req].view(BATCH, pages_per_req) + 1
    positions = torch.arange(MAX_CONTEXT)
    full = full_pages[:, positions // PAGE_SIZE] * PAGE_SIZE + positions % PAGE_SIZE
    swa = swa_pages[:, positions // PAGE_SIZE] * PAGE_SIZE + positions % PAGE_SIZE
    mapping = allocator.full_to_swa_index_mapping
    mapping[full.reshape(-1).to(mapping.device)] = swa.reshape(-1).to(mapping.device, mapping.dtype)
    return full.to(torch.int32).to(device)


def build_draft_backend(backend_module, runner):
    """The draft's backend, by its own __init__ (wrapped by the hotfix when active)."""
    base = backend_module.FlashInferAttnBackend
    real_init = base.__dict__["__init__"]
    base.__init__ = lambda self, *args, **kwargs: None
    try:
        return backend_module.TRTLLMHAAttnBackend(runner)
    finally:
        base.__init__ = real_init


def main():
    dry_run = "--cpu-dry-run" in sys.argv
    device = torch.device("cpu" if dry_run else "cuda")
    backend_module, ForwardMode, _ = import_sglang()
    kernel = use_kernel(backend_module, dry_run)
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    generator = torch.Generator().manual_seed(0)
    target, allocator, draft_pool = build_pools(str(device), generator)
    req_to_token = place_requests(allocator, device, generator)
    runner = types.SimpleNamespace(
        token_to_kv_pool=draft_pool,
        token_to_kv_pool_allocator=allocator,
        is_draft_worker=True,
        spec_algorithm=SpeculativeAlgorithm.EAGLE3,
        req_to_token_pool=types.SimpleNamespace(req_to_token=req_to_token),
        model_config=types.SimpleNamespace(context_len=MAX_CONTEXT, hidden_size=Q_HEADS * HEAD_DIM),
        kv_cache_dtype=DTYPE,
        dtype=DTYPE,
        page_size=PAGE_SIZE,
        device=str(device),
        server_args=types.SimpleNamespace(speculative_eagle_topk=1, speculative_num_draft_tokens=4),
    )
    backend = build_draft_backend(backend_module, runner)
    # __init__ asks is_sm90_supported(), which answered while SGLang was imported
    # with CUDA hidden (import_sglang) and keeps that answer: set what it says on this device.
    backend.is_xqa_impl = device.type == "cuda" and torch.cuda.get_device_capability()[0] in (9, 12)
    wrapper_type = type(backend_module.TRTLLMHAAttnBackend.__dict__["__init__"]).__name__

    lengths_cpu = torch.randint(1, MAX_CONTEXT - 1, (BATCH,), generator=generator)
    lengths = lengths_cpu.to(device)
    req_pool_indices = torch.arange(BATCH, device=device)
    batch = types.SimpleNamespace(
        forward_mode=ForwardMode.DECODE,
        spec_info=types.SimpleNamespace(is_draft_input=lambda: True),
        batch_size=BATCH,
        seq_lens=lengths,
        seq_lens_cpu=lengths_cpu,
        req_pool_indices=req_pool_indices,
        req_to_token_pool=runner.req_to_token_pool,
        token_to_kv_pool=draft_pool,
        out_cache_loc=None,
        encoder_lens=None,
    )
    backend.init_forward_metadata(batch)
    layer = radix_layer()
    q = torch.randn(BATCH, Q_HEADS * HEAD_DIM, generator=generator).to(DTYPE).to(device)
    out = backend.forward_decode(q, None, None, layer, batch, save_kv_cache=False).view(BATCH, Q_HEADS, HEAD_DIM)
    if not dry_run:
        torch.cuda.synchronize()

    k_flat, v_flat = draft_pool.get_kv_buffer(0)
    tokens = req_to_token[req_pool_indices].long()
    expected = attention(
        q.view(BATCH, Q_HEADS, HEAD_DIM).float(),
        k_flat[tokens].float(),
        v_flat[tokens].float(),
        lengths + STEP_ID + 1,
        HEAD_DIM**-0.5,
    )
    error = (out.float() - expected).abs().amax(dim=(1, 2))
    nan_rows = torch.isnan(out.float()).any(dim=-1).any(dim=-1)
    print(
        "RESULT:"
        + json.dumps(
            {
                "patched": wrapper_type == "HotfixWrapper",
                "init_attribute_type": wrapper_type,
                "swa_kv_pool": type(backend._swa_kv_pool).__name__,
                "use_sliding_window_kv_pool": bool(backend.use_sliding_window_kv_pool),
                "swa_page_table_used": backend.forward_metadata.swa_page_table is not None,
                "kernel": kernel,
                "xqa": bool(backend.is_xqa_impl),
                "device": "cpu (dry run)" if dry_run else torch.cuda.get_device_name(),
                "torch": torch.__version__,
                "sglang_file": backend_module.__file__,
                "shape": {
                    "batch": BATCH,
                    "q_heads": Q_HEADS,
                    "kv_heads": KV_HEADS,
                    "head_dim": HEAD_DIM,
                    "page_size": PAGE_SIZE,
                    "dtype": str(DTYPE),
                },
                "rows": BATCH,
                "wrong_rows": int((nan_rows | (error > TOLERANCE)).sum()),
                "nan_rows": int(nan_rows.sum()),
                "max_abs_error": float(error[~nan_rows].max()) if bool((~nan_rows).any()) else None,
                "min_abs_error": float(error[~nan_rows].min()) if bool((~nan_rows).any()) else None,
                "tolerance": TOLERANCE,
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
