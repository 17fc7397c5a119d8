"""One run of SGLang's real draft-decode CUDA-graph path on a GPU, as SGLang's
EAGLE draft runner drives it, around a reference attention written in torch.

    python cuda_graph_worker.py            # prints RESULT:<json>
    python cuda_graph_worker.py --cpu-dry-run   # the same logic on CPU, eager, few replays

Whether the hotfix is active is decided outside (SGLANG_HOTFIX_TRTLLM_DISABLE=1
for the unpatched run); this worker reports which it saw.

TRT-LLM's own MHA kernels run only on SM100, so attention here is a paged
decode attention in torch that bounds each row's keys by the metadata's
``cache_seqlens_int32`` and reads pages through its ``page_table`` -- the two
fields the real kernel takes. Everything else is SGLang's: the backend class,
``init_cuda_graph_state`` (the buffers), the multi-step draft backend's capture
method, and the replay method.

For each batch size: capture metadata (SGLang's multi-step draft backend, with
capture-time seq_lens at SGLang's fill value), an eager warm-up forward (where
the upstream NaN appears), ``torch.cuda.graph`` capture, then replays through
SGLang's replay method with fresh random sequence lengths and page tables,
each checked against an eager reference computed from the true lengths and
``req_to_token`` (not from SGLang's buffers).
"""

import json
import math
import sys
import time
import types

import torch

BATCH_SIZES = (1, 2, 4, 8, 16, 32)
REPLAYS_PER_BS = 200
NUM_STEPS = 4  # speculative_num_steps: NUM_STEPS - 1 per-step backends
HEADS, HEAD_DIM = 4, 64
PAGE_SIZE = 16
MAX_CONTEXT = 1024
MAX_BS = max(BATCH_SIZES)
MAX_REQS = 2 * MAX_BS


def import_sglang_backend():
    """SGLang's import chain wants sgl_kernel on a CUDA machine (a 322 MB wheel,
    not carried): let SGLang take its CPU import paths while it is imported.
    The capture and replay methods do not branch on the platform."""
    real = torch.cuda.is_available
    torch.cuda.is_available = lambda: False
    try:
        import sglang.srt.layers.attention.trtllm_mha_backend as backend
        from sglang.srt.model_executor.forward_batch_info import ForwardMode
    finally:
        torch.cuda.is_available = real
    return backend, ForwardMode


def make_draft_backend(backend_module, device):
    """SGLang's multi-step draft backend over one real backend per draft step."""
    from sglang_hotfix_trtllm.pr26521_probe import backend_without_model_runner

    draft = object.__new__(backend_module.TRTLLMHAAttnMultiStepDraftBackend)
    draft.topk = 1
    draft.speculative_num_steps = NUM_STEPS
    draft.page_size = PAGE_SIZE
    draft.attn_backends = [
        backend_without_model_runner(backend_module.TRTLLMHAAttnBackend, device=device, step_id=step, max_bs=MAX_BS,
                                     max_num_tokens=MAX_BS, max_context_len=MAX_CONTEXT, page_size=PAGE_SIZE,
                                     num_draft_tokens=NUM_STEPS)
        for step in range(NUM_STEPS - 1)
    ]
    draft.init_cuda_graph_state(MAX_BS, MAX_BS)  # SGLang's own, once more through the multi-step backend
    return draft


def paged_decode_attention(q, k_pool, v_pool, cache_seqlens, page_table, positions):
    """Reference paged decode attention: row b attends to its first
    cache_seqlens[b] positions, read through page_table. An empty range gives
    NaN (softmax over nothing), as in the upstream report."""
    token = page_table.long()[:, positions // PAGE_SIZE] * PAGE_SIZE + (positions % PAGE_SIZE)
    k, v = k_pool[token], v_pool[token]  # [bs, L, H, D]
    scores = torch.einsum("bhd,blhd->bhl", q, k) / math.sqrt(HEAD_DIM)
    mask = positions[None, :] < cache_seqlens.long()[:, None]
    scores = scores.masked_fill(~mask[:, None, :], float("-inf"))
    return torch.einsum("bhl,blhd->bhd", torch.softmax(scores, dim=-1), v)


def reference(q, k_pool, v_pool, lengths, req_to_token, req_pool_indices, positions):
    """Eager attention from the true lengths and req_to_token, without SGLang's buffers."""
    token = req_to_token[req_pool_indices].long()[:, : positions.numel()]
    k, v = k_pool[token], v_pool[token]
    scores = torch.einsum("bhd,blhd->bhl", q, k) / math.sqrt(HEAD_DIM)
    mask = positions[None, :] < lengths.long()[:, None]
    scores = scores.masked_fill(~mask[:, None, :], float("-inf"))
    return torch.einsum("bhl,blhd->bhd", torch.softmax(scores, dim=-1), v)


def random_req_to_token(generator, device):
    """Each request's tokens live in randomly chosen whole pages of the pool."""
    pages_per_req = MAX_CONTEXT // PAGE_SIZE
    pages = torch.randperm(MAX_REQS * pages_per_req, generator=generator, device="cpu")[: MAX_REQS * pages_per_req]
    pages = pages.view(MAX_REQS, pages_per_req).to(device)
    positions = torch.arange(MAX_CONTEXT, device=device)
    return (pages[:, positions // PAGE_SIZE] * PAGE_SIZE + positions % PAGE_SIZE).to(torch.int32)


class EagerGraph:
    """--cpu-dry-run: stands in for torch.cuda.CUDAGraph by re-running the forward."""

    def __init__(self):
        self.forward, self.out = None, None

    def replay(self):
        self.out.copy_(self.forward())


def main():
    dry_run = "--cpu-dry-run" in sys.argv
    device = torch.device("cpu" if dry_run else "cuda")
    replays_per_bs = 3 if dry_run else REPLAYS_PER_BS
    synchronize = (lambda: None) if dry_run else torch.cuda.synchronize
    backend_module, ForwardMode = import_sglang_backend()
    attribute = backend_module.TRTLLMHAAttnBackend.__dict__["init_forward_metadata_capture_cuda_graph"]
    generator = torch.Generator().manual_seed(0)
    pool_tokens = MAX_REQS * MAX_CONTEXT
    k_pool = torch.randn(pool_tokens, HEADS, HEAD_DIM, generator=generator).to(device)
    v_pool = torch.randn(pool_tokens, HEADS, HEAD_DIM, generator=generator).to(device)
    positions = torch.arange(MAX_CONTEXT, device=device)
    spec_info = types.SimpleNamespace(is_draft_input=lambda: True)  # the draft runner's EagleDraftInput, as the backends see it

    draft = make_draft_backend(backend_module, device)
    req_to_token = torch.zeros(MAX_REQS, MAX_CONTEXT, dtype=torch.int32, device=device)
    for b in draft.attn_backends:
        b.req_to_token = req_to_token
    fill = draft.attn_backends[0].get_cuda_graph_seq_len_fill_value()

    steps = NUM_STEPS - 1
    q_static = torch.zeros(steps, MAX_BS, HEADS, HEAD_DIM, device=device)
    warmup_nan_rows, warmup_rows, capture_seconds = 0, 0, 0.0
    replays, max_error, replay_nan = 0, 0.0, 0
    per_bs = {}
    graphs = {}
    # Phase 1, as SGLang's draft CUDA-graph runner does it: every batch size is
    # captured, largest first, before anything is replayed.
    for bs in sorted(BATCH_SIZES, reverse=True):
        seq_lens = torch.full((bs,), fill, dtype=torch.int64, device=device)
        req_pool_indices = torch.zeros(bs, dtype=torch.int64, device=device)
        batch = types.SimpleNamespace(batch_size=bs, req_pool_indices=req_pool_indices, seq_lens=seq_lens,
                                      encoder_lens=None, spec_info=spec_info, forward_mode=ForwardMode.DECODE)
        synchronize()
        start = time.perf_counter()
        draft.init_forward_metadata_capture_cuda_graph(batch)
        synchronize()
        capture_seconds += time.perf_counter() - start
        q_static[:, :bs].copy_(torch.randn(steps, bs, HEADS, HEAD_DIM, generator=generator).to(device))

        def forward(bs=bs, metadata=[b.forward_metadata for b in draft.attn_backends]):
            return torch.stack([
                paged_decode_attention(q_static[step, :bs], k_pool, v_pool, m.cache_seqlens_int32, m.page_table, positions)
                for step, m in enumerate(metadata)
            ])

        warm = forward()  # the eager warm-up before capture: where upstream's NaN check fires
        synchronize()
        warmup_nan_rows += int(torch.isnan(warm).any(dim=-1).any(dim=-1).sum())
        warmup_rows += steps * bs
        if dry_run:
            graph = EagerGraph()
            graph.forward, graph.out = forward, forward()
            static_out = graph.out
        else:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_out = forward()
        graphs[bs] = (graph, static_out)

    # Phase 2: replays through SGLang's own replay method, fresh lengths and pages each time.
    for bs in BATCH_SIZES:
        graph, static_out = graphs[bs]
        errors = []
        for _ in range(replays_per_bs):
            req_to_token.copy_(random_req_to_token(generator, device))
            req_pool_indices = torch.randperm(MAX_REQS, generator=generator)[:bs].to(device)
            lengths_cpu = torch.randint(1, MAX_CONTEXT - NUM_STEPS, (bs,), generator=generator)
            lengths = lengths_cpu.to(device)
            replay_batch = types.SimpleNamespace(batch_size=bs, req_pool_indices=req_pool_indices, seq_lens=lengths,
                                                 seq_lens_cpu=lengths_cpu, seq_lens_sum=int(lengths_cpu.sum()),
                                                 encoder_lens=None, spec_info=spec_info, forward_mode=ForwardMode.DECODE)
            draft.init_forward_metadata_replay_cuda_graph(replay_batch, bs)
            q_static[:, :bs].copy_(torch.randn(steps, bs, HEADS, HEAD_DIM, generator=generator).to(device))
            graph.replay()
            for step in range(steps):
                expected = reference(q_static[step, :bs], k_pool, v_pool, lengths + step + 1, req_to_token, req_pool_indices, positions)
                errors.append(float((static_out[step] - expected).abs().max()))
            replay_nan += int(torch.isnan(static_out).any())
            replays += 1
        per_bs[bs] = max(errors)
        max_error = max(max_error, max(errors))

    # Steady-state cost of the capture-metadata call (what the hotfix wraps),
    # apart from the first call's one-time costs: median of repeated calls.
    steady = {}
    for bs in BATCH_SIZES:
        batch = types.SimpleNamespace(batch_size=bs, req_pool_indices=torch.zeros(bs, dtype=torch.int64, device=device),
                                      seq_lens=torch.full((bs,), fill, dtype=torch.int64, device=device),
                                      encoder_lens=None, spec_info=spec_info, forward_mode=ForwardMode.DECODE)
        samples = []
        for _ in range(30):
            synchronize()
            start = time.perf_counter()
            draft.init_forward_metadata_capture_cuda_graph(batch)
            synchronize()
            samples.append(time.perf_counter() - start)
        steady[bs] = sorted(samples)[len(samples) // 2] * 1e6

    print("RESULT:" + json.dumps({
        "patched": type(attribute).__name__ == "HotfixWrapper",
        "attribute_type": type(attribute).__name__,
        "device": "cpu (dry run)" if dry_run else torch.cuda.get_device_name(),
        "capability": None if dry_run else list(torch.cuda.get_device_capability()),
        "torch": torch.__version__,
        "sglang_file": backend_module.__file__,
        "batch_sizes": list(BATCH_SIZES),
        "draft_steps": steps,
        "warmup_nan_rows": warmup_nan_rows,
        "warmup_rows": warmup_rows,
        "replays": replays,
        "replays_with_nan": replay_nan,
        "max_abs_error": max_error,
        "max_abs_error_per_bs": per_bs,
        "capture_metadata_seconds_first_pass": capture_seconds,
        "capture_metadata_us_steady_median_per_bs": steady,
    }), flush=True)


if __name__ == "__main__":
    sys.exit(main())
