"""One run of SGLang 0.5.12's draft-decode CUDA-graph path on the real TRT-LLM
decode kernel, as SGLang's EAGLE draft runner drives it.

    python cuda_graph_worker.py                # prints RESULT:<json>
    python cuda_graph_worker.py --nan-check    # warm-up only, then SGLang's own NaN check
    python cuda_graph_worker.py --cpu-dry-run  # the same logic on CPU, eager, few replays

Whether the hotfix is active is decided outside (SGLANG_HOTFIX_TRTLLM_DISABLE=1
for the unpatched run); this worker reports which it saw.

What is SGLang's: the ``TRTLLMHAAttnMultiStepDraftBackend`` and one
``TRTLLMHAAttnBackend`` per draft step, their buffers from
``init_cuda_graph_state``, the capture and replay metadata methods, and
attention through
``TRTLLMHAAttnBackend.forward_decode``, which calls
``flashinfer.decode.trtllm_batch_decode_with_kv_cache`` -- on SM90 flashinfer's
XQA kernel, JIT-built at the first call. The NaN check is SGLang's own
``maybe_detect_nan``. Stand-ins: the backend objects are built without a model
runner (``backend_without_model_runner``), the RadixAttention layer and the
ForwardBatch are namespaces holding the fields ``forward_decode`` reads, the
KV cache is laid out as SGLang's ``MHATokenToKVPool`` but built here, and
queries are random instead of coming from a draft model. Only in the CPU dry
run does a torch function stand in for the kernel.

For each batch size (largest first, all captured before any replay): capture
metadata through the multi-step backend with seq_lens at SGLang's fill value,
two eager warm-up forwards, ``torch.cuda.graph`` capture; then replays through
SGLang's replay method with fresh random lengths, page tables and queries,
each checked against an fp32 attention computed from the true lengths and
``req_to_token`` (not from SGLang's buffers).
"""

import json
import sys
import time
import types

import torch

BATCH_SIZES = (1, 2, 4, 8, 16, 32)
REPLAYS_PER_BS = 100
NUM_STEPS = 4  # speculative_num_steps: NUM_STEPS - 1 per-step backends, step ids 0, 1, 2
Q_HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128  # a GQA model (Llama-3-8B's attention shape)
PAGE_SIZE = 64  # SGLang forces 16, 32 or 64 for trtllm_mha
MAX_CONTEXT = 1024
MAX_BS = max(BATCH_SIZES)
MAX_REQS = 2 * MAX_BS
DTYPE = torch.bfloat16
# bf16 tolerance, absolute: the kernel reads bf16 K, V and Q, accumulates in
# fp32, rounds the softmax weights to bf16 before the PV product and the output
# to bf16 (relative 2^-9 each); outputs here are below 1.5 in magnitude, so
# one output rounding is below 0.003. 0.02 leaves room for the weights'
# rounding summed over up to 1024 keys, and is far below what a wrong length
# does (an error of the size of the outputs themselves, or NaN).
TOLERANCE = 0.02


def import_sglang():
    """SGLang's import chain wants sgl_kernel on a CUDA machine (a 322 MB wheel,
    not carried): let SGLang take its CPU import paths while it is imported.
    The metadata methods do not branch on the platform; forward_decode needs
    the module's ``flashinfer`` name, which the CPU path skips: set it after."""
    real = torch.cuda.is_available
    torch.cuda.is_available = lambda: False
    try:
        import sglang.srt.layers.attention.trtllm_mha_backend as backend
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        maybe_detect_nan = sglang_function("sglang/srt/speculative/spec_utils.py", "maybe_detect_nan")
    finally:
        torch.cuda.is_available = real
    return backend, ForwardMode, maybe_detect_nan


def sglang_function(relative_path, name):
    """One function of SGLang's, compiled from its installed file with the names
    it uses (torch, SGLang's envs). Used for spec_utils.maybe_detect_nan: that
    module's own imports need packages the device machine lacks (msgspec ...)."""
    import ast
    import importlib.util

    from sglang.srt.environ import envs

    path = importlib.util.find_spec("sglang").submodule_search_locations[0] + "/" + relative_path.split("/", 1)[1]
    tree = ast.parse(open(path, encoding="utf-8").read())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    namespace = {"torch": torch, "envs": envs}
    exec(compile(ast.Module(body=[node], type_ignores=[]), path, "exec"), namespace)
    return namespace[name]


def use_kernel(backend_module, dry_run):
    """Give the backend module its ``flashinfer`` (the real one, or on a CPU dry
    run a torch stand-in for the decode kernel); returns which, in words."""
    if dry_run:
        backend_module.flashinfer = types.SimpleNamespace(
            decode=types.SimpleNamespace(trtllm_batch_decode_with_kv_cache=torch_decode_kernel)
        )
        return "torch stand-in (CPU dry run)"
    import flashinfer
    import flashinfer.decode

    backend_module.flashinfer = flashinfer
    return "flashinfer %s trtllm_batch_decode_with_kv_cache" % flashinfer.__version__


def torch_decode_kernel(
    query, kv_cache, block_tables, seq_lens, max_seq_len, bmm1_scale, bmm2_scale, out_dtype, q_len_per_req=1, **_
):
    """--cpu-dry-run only: the kernel's contract in torch (paged KV in [pages, kv heads, page,
    dim] layout, rows bounded by seq_lens; with q_len_per_req, each request's queries end its
    keys, causally; the two BMM scales as the kernel applies them)."""
    k_cache, v_cache = kv_cache
    positions = torch.arange(min(max_seq_len, block_tables.shape[1] * PAGE_SIZE))
    pages = block_tables.long()[:, positions // PAGE_SIZE]
    k = k_cache[pages, :, positions % PAGE_SIZE].float()  # [bs, L, kv heads, dim]
    v = v_cache[pages, :, positions % PAGE_SIZE].float()
    q = query.float().view(block_tables.shape[0], q_len_per_req, query.shape[-2], query.shape[-1])
    rows = [
        attention(q[:, i], k, v, seq_lens - (q_len_per_req - 1 - i), float(bmm1_scale)) * float(bmm2_scale)
        for i in range(q_len_per_req)
    ]
    return torch.stack(rows, dim=1).view(query.shape).to(out_dtype)


def radix_layer(device=None, k_scale=None, v_scale=None):
    """A RadixAttention's fields ``forward_decode`` / ``forward_extend`` read: the scale
    tensors SGLang's loader sets (on ``device``) and their floats, None when the model has none."""

    def tensor(value):
        return None if value is None else torch.tensor(value, dtype=torch.float32, device=device)

    return types.SimpleNamespace(
        layer_id=0,
        tp_q_head_num=Q_HEADS,
        tp_k_head_num=KV_HEADS,
        tp_v_head_num=KV_HEADS,
        head_dim=HEAD_DIM,
        scaling=HEAD_DIM**-0.5,
        sliding_window_size=-1,
        k_scale=tensor(k_scale),
        v_scale=tensor(v_scale),
        k_scale_float=k_scale,
        v_scale_float=v_scale,
    )


def attention(q, k, v, lengths, scale):
    """fp32 GQA attention: row b over its first lengths[b] keys (NaN over none, as softmax gives)."""
    group = q.shape[1] // k.shape[2]
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    scores = torch.einsum("bhd,blhd->bhl", q, k) * scale
    mask = torch.arange(k.shape[1], device=q.device)[None, :] < lengths.long()[:, None]
    scores = scores.masked_fill(~mask[:, None, :], float("-inf"))
    return torch.einsum("bhl,blhd->bhd", torch.softmax(scores, dim=-1), v)


def reference(q, k_flat, v_flat, lengths, tokens):
    """fp32 attention over ``lengths`` keys at KV-pool slots ``tokens`` [bs, L]."""
    tokens = tokens.long()
    return attention(q.float(), k_flat[tokens].float(), v_flat[tokens].float(), lengths, HEAD_DIM**-0.5)


def make_draft_backend(backend_module, device, workspace):
    """SGLang's multi-step draft backend over one real backend per draft step."""
    from sglang_hotfix_trtllm.records.pr26521_probe import backend_without_model_runner

    draft = object.__new__(backend_module.TRTLLMHAAttnMultiStepDraftBackend)
    draft.topk = 1
    draft.speculative_num_steps = NUM_STEPS
    draft.page_size = PAGE_SIZE
    draft.attn_backends = []
    for step in range(NUM_STEPS - 1):
        b = backend_without_model_runner(
            backend_module.TRTLLMHAAttnBackend,
            device=device,
            step_id=step,
            max_bs=MAX_BS,
            max_num_tokens=MAX_BS,
            max_context_len=MAX_CONTEXT,
            page_size=PAGE_SIZE,
            num_draft_tokens=NUM_STEPS,
        )
        # What __init__ would take from the model runner, for forward_decode.
        b.data_type, b.q_data_type = DTYPE, DTYPE
        b.is_xqa_impl = device.type == "cuda" and torch.cuda.get_device_capability()[0] in (9, 12)
        b.workspace_buffer = workspace
        draft.attn_backends.append(b)
    draft.init_cuda_graph_state(MAX_BS, MAX_BS)  # SGLang's own, once more through the multi-step backend
    return draft


def random_req_to_token(generator, device):
    """Each request's tokens live in randomly chosen whole pages of the pool."""
    pages_per_req = MAX_CONTEXT // PAGE_SIZE
    pages = torch.randperm(MAX_REQS * pages_per_req, generator=generator)[: MAX_REQS * pages_per_req]
    pages = pages.view(MAX_REQS, pages_per_req) + 1  # page 0 holds the pool's padding slots
    positions = torch.arange(MAX_CONTEXT)
    return (pages[:, positions // PAGE_SIZE] * PAGE_SIZE + positions % PAGE_SIZE).to(torch.int32).to(device)


class KVPool:
    """Laid out as SGLang's ``MHATokenToKVPool`` for one layer: one K and one V
    buffer of [size + page_size, kv heads, head dim], read by ``forward_decode``
    through ``get_kv_buffer(layer_id)``. A stand-in because importing SGLang's
    memory_pool module pulls in its disaggregation stack (msgspec and more),
    which the device machine lacks and the carry cannot hold."""

    def __init__(self, size, device):
        shape = (size + PAGE_SIZE, KV_HEADS, HEAD_DIM)
        self.k_buffer = [torch.zeros(shape, dtype=DTYPE, device=device)]
        self.v_buffer = [torch.zeros(shape, dtype=DTYPE, device=device)]

    def get_kv_buffer(self, layer_id):
        return self.k_buffer[layer_id], self.v_buffer[layer_id]


class EagerGraph:
    """--cpu-dry-run: stands in for torch.cuda.CUDAGraph by re-running the forward."""

    def __init__(self, forward):
        self.forward, self.out = forward, forward()

    def replay(self):
        self.out.copy_(self.forward())


def main():
    dry_run = "--cpu-dry-run" in sys.argv
    nan_check = "--nan-check" in sys.argv
    device = torch.device("cpu" if dry_run else "cuda")
    replays_per_bs = 3 if dry_run else REPLAYS_PER_BS
    synchronize = (lambda: None) if dry_run else torch.cuda.synchronize
    backend_module, ForwardMode, maybe_detect_nan = import_sglang()
    kernel = use_kernel(backend_module, dry_run)
    attribute = backend_module.TRTLLMHAAttnBackend.__dict__["init_forward_metadata_capture_cuda_graph"]
    generator = torch.Generator().manual_seed(0)

    pool_tokens = (MAX_REQS * MAX_CONTEXT // PAGE_SIZE + 1) * PAGE_SIZE
    pool = KVPool(pool_tokens, device)
    k_flat, v_flat = pool.get_kv_buffer(0)
    k_flat.copy_(torch.randn(k_flat.shape, generator=generator).to(DTYPE))
    v_flat.copy_(torch.randn(v_flat.shape, generator=generator).to(DTYPE))
    layer = radix_layer()
    forward_batch = types.SimpleNamespace(token_to_kv_pool=pool, out_cache_loc=None)
    spec_info = types.SimpleNamespace(
        is_draft_input=lambda: True
    )  # the draft runner's EagleDraftInput, as the backends see it
    workspace = torch.zeros(128 * 1024 * 1024, dtype=torch.uint8, device=device)

    draft = make_draft_backend(backend_module, device, workspace)
    req_to_token = random_req_to_token(generator, device)
    for b in draft.attn_backends:
        b.req_to_token = req_to_token
    fill = draft.attn_backends[0].get_cuda_graph_seq_len_fill_value()

    steps = NUM_STEPS - 1
    q_static = torch.zeros(steps, MAX_BS, Q_HEADS, HEAD_DIM, dtype=DTYPE, device=device)
    warmup = {"rows": 0, "nan_rows": 0, "wrong_rows": 0, "max_error_finite": 0.0, "nan_rows_per_bs": {}}
    graphs, capture_seconds, checked = {}, 0.0, []
    for bs in sorted(BATCH_SIZES, reverse=True):
        seq_lens = torch.full((bs,), fill, dtype=torch.int64, device=device)
        req_pool_indices = torch.zeros(bs, dtype=torch.int64, device=device)
        batch = types.SimpleNamespace(
            batch_size=bs,
            req_pool_indices=req_pool_indices,
            seq_lens=seq_lens,
            encoder_lens=None,
            spec_info=spec_info,
            forward_mode=ForwardMode.DECODE,
        )
        synchronize()
        start = time.perf_counter()
        draft.init_forward_metadata_capture_cuda_graph(batch)
        synchronize()
        capture_seconds += time.perf_counter() - start
        q_static[:, :bs].copy_(torch.randn(steps, bs, Q_HEADS, HEAD_DIM, generator=generator).to(DTYPE))

        def forward(bs=bs):
            return torch.stack(
                [
                    b.forward_decode(q_static[step, :bs], None, None, layer, forward_batch, save_kv_cache=False).view(
                        bs, Q_HEADS, HEAD_DIM
                    )
                    for step, b in enumerate(draft.attn_backends)
                ]
            )

        # Two eager warm-up forwards before capture, as SGLang's runner does: where upstream's NaN appears.
        forward()
        warm = forward()
        synchronize()
        if nan_check:
            # As the draft worker checks each step's output: the device-side assert fires at the sync.
            for step in range(steps):
                maybe_detect_nan(warm[step], "draft_forward step %d" % step)
            synchronize()
            print("nan check passed for batch size %d" % bs, flush=True)
            checked.append(bs)
            continue
        for step, b in enumerate(draft.attn_backends):
            # The true lengths at capture, through the pages the capture bound.
            true_lengths = seq_lens + step + 1
            tokens = (
                b.forward_metadata.page_table.long()[:, torch.arange(MAX_CONTEXT, device=device) // PAGE_SIZE]
                * PAGE_SIZE
                + torch.arange(MAX_CONTEXT, device=device) % PAGE_SIZE
            )
            expected = reference(q_static[step, :bs], k_flat, v_flat, true_lengths, tokens)
            got = warm[step].float()
            nan_rows = torch.isnan(got).any(dim=-1).any(dim=-1)
            error = (got - expected).abs().amax(dim=(1, 2))
            warmup["rows"] += bs
            warmup["nan_rows"] += int(nan_rows.sum())
            warmup["nan_rows_per_bs"][bs] = warmup["nan_rows_per_bs"].get(bs, 0) + int(nan_rows.sum())
            warmup["wrong_rows"] += int((nan_rows | (error > TOLERANCE)).sum())
            finite = error[~nan_rows]
            if finite.numel():
                warmup["max_error_finite"] = max(warmup["max_error_finite"], float(finite.max()))
        if dry_run:
            graph = EagerGraph(forward)
            graphs[bs] = (graph, graph.out)
        else:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = forward()
            graphs[bs] = (graph, out)

    if nan_check:
        print(
            "RESULT:"
            + json.dumps(
                {
                    "nan_check": "passed",
                    "batch_sizes": len(checked),
                    "patched": type(attribute).__name__ == "HotfixWrapper",
                }
            ),
            flush=True,
        )
        return 0
    replays, replay_nan, max_error, per_bs = 0, 0, 0.0, {}
    for bs in BATCH_SIZES:
        (graph, out), errors = graphs[bs], []
        for _ in range(replays_per_bs):
            req_to_token.copy_(random_req_to_token(generator, device))
            req_pool_indices = torch.randperm(MAX_REQS, generator=generator)[:bs].to(device)
            lengths_cpu = torch.randint(1, MAX_CONTEXT - NUM_STEPS, (bs,), generator=generator)
            lengths = lengths_cpu.to(device)
            replay_batch = types.SimpleNamespace(
                batch_size=bs,
                req_pool_indices=req_pool_indices,
                seq_lens=lengths,
                seq_lens_cpu=lengths_cpu,
                seq_lens_sum=int(lengths_cpu.sum()),
                encoder_lens=None,
                spec_info=spec_info,
                forward_mode=ForwardMode.DECODE,
            )
            draft.init_forward_metadata_replay_cuda_graph(replay_batch, bs)
            q_static[:, :bs].copy_(torch.randn(steps, bs, Q_HEADS, HEAD_DIM, generator=generator).to(DTYPE))
            graph.replay()
            synchronize()
            for step in range(steps):
                expected = reference(
                    q_static[step, :bs], k_flat, v_flat, lengths + step + 1, req_to_token[req_pool_indices]
                )
                errors.append(float((out[step].float() - expected).abs().max()))
            replay_nan += int(torch.isnan(out).any())
            replays += 1
        per_bs[bs] = max(errors)
        max_error = max(max_error, max(errors))

    print(
        "RESULT:"
        + json.dumps(
            {
                "patched": type(attribute).__name__ == "HotfixWrapper",
                "attribute_type": type(attribute).__name__,
                "kernel": kernel,
                "xqa": draft.attn_backends[0].is_xqa_impl,
                "device": "cpu (dry run)" if dry_run else torch.cuda.get_device_name(),
                "capability": None if dry_run else list(torch.cuda.get_device_capability()),
                "torch": torch.__version__,
                "sglang_file": backend_module.__file__,
                "shape": {
                    "q_heads": Q_HEADS,
                    "kv_heads": KV_HEADS,
                    "head_dim": HEAD_DIM,
                    "page_size": PAGE_SIZE,
                    "dtype": str(DTYPE),
                },
                "batch_sizes": list(BATCH_SIZES),
                "draft_steps": steps,
                "warmup_rows": warmup["rows"],
                "warmup_wrong_rows": warmup["wrong_rows"],
                "warmup_nan_rows": warmup["nan_rows"],
                "warmup_nan_rows_per_bs": warmup["nan_rows_per_bs"],
                "warmup_max_error_finite_rows": warmup["max_error_finite"],
                "replays": replays,
                "replays_with_nan": replay_nan,
                "replay_max_abs_error": max_error,
                "replay_max_abs_error_per_bs": per_bs,
                "tolerance": TOLERANCE,
                "capture_metadata_seconds_first_pass": capture_seconds,
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
