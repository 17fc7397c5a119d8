"""Record pr28144 and a strided query on XQA: SGLang's own ``forward_decode`` (0.5.10 packs the
query itself) into FlashInfer's decode kernel, with the query a view into a fused QKV projection.

    python strided_query_worker.py                                  # prints RESULT:<json>
    python strided_query_worker.py --cpu-dry-run                    # torch stand-in kernel (honours strides)
    python strided_query_worker.py --cpu-dry-run --packed-stand-in  # the stand-in reads the query as packed

Which plugin runs is decided outside: the one importable (none, or a wheel's --target folder on
PYTHONPATH), SGLANG_HOTFIX_TRTLLM_DISABLE as usual; this worker calls ``apply()`` when the plugin
imports, and reports what it saw.

The defect: plugin 0.5.0's pr28144 gate handed the kernel ``q.reshape(query.shape)`` re-made from
the method's input q, not SGLang's own query object. SGLang 0.5.1 to 0.5.10.post1 pack the query
(``q = q.contiguous().view(-1, H, D)``); Llama-family models hand ``forward_decode`` a strided view
(``q, k, v = qkv.split(...)``); FlashInfer's XQA kernel (decode on SM90/SM120) reads only
``q.data_ptr()``, ignoring strides. So with 0.5.0, a plain BF16 decode (nothing to repair) reads
row b's query at b x H x D elements from row 0's: every row after the first attends with parts of
the previous rows' Q, K and V. Without the plugin, and with the fixed one, every row is right.

One case: a BF16 KV cache written by SGLang's own ``MHATokenToKVPool``, no layer scales, decode,
16 rows of 64 to 1023 keys (page size 64, 32 query and 8 KV heads of 128), the query taken as
``qkv.split([H*D, KV*D, KV*D], dim=1)[0]`` from a random bf16 ``qkv``. Each output row is compared
with fp32 attention over the TRUE query (what the model computed), and, to show the mechanism,
over the query as a packed reader sees the same memory (``torch.as_strided`` with contiguous
strides at the view's storage offset). The floor: the same call with ``q.contiguous()`` (which
every variant hands the kernel as is), same cache, same lengths. Tolerance: 1.25 x that floor,
never below the bf16 tolerance of the CUDA-graph proof (0.02: bf16 Q, K, V, fp32 accumulation,
bf16 softmax weights and output, outputs well below 1.5). A row read with another row's query
errs by the size of the outputs (over 0.1 here), never by bf16 rounding. Rows of at least 64
keys, because a row of one key returns its V whatever the query is.

--packed-stand-in (dry run only): the stand-in kernel of ``cuda_graph_worker.use_kernel`` reads
the query through its strides (``query.float()``), as TRT-LLM-GEN does; this option wraps it to
read ``query.data_ptr()`` onwards as if packed, as XQA does, so that the CPU run shows what the
H200 will.
"""

import hashlib
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
    TOLERANCE,
    attention,
    import_sglang,
    radix_layer,
    use_kernel,
)
from fp8_scales_worker import paged_batch  # noqa: E402

BATCH = 16
MAX_CONTEXT = 1024
MIN_KEYS = 64
PAGES = BATCH * MAX_CONTEXT // PAGE_SIZE + 1  # page 0: the pool's padding
FLOOR_FACTOR = 1.25


def packed_view(query):
    """The query as a reader of ``query.data_ptr()`` onwards sees it: the same shape, contiguous
    strides, from the view's storage offset (what XQA reads)."""
    strides, step = [], 1
    for size in reversed(query.shape):
        strides.insert(0, step)
        step *= size
    return torch.as_strided(query, query.shape, strides, query.storage_offset())


def reads_packed(kernel):
    """--packed-stand-in: the stand-in kernel, reading its query as XQA does."""

    def read_as_packed(*args, **kwargs):
        if args:
            args = (packed_view(args[0]),) + args[1:]
        else:
            kwargs = dict(kwargs, query=packed_view(kwargs["query"]))
        return kernel(*args, **kwargs)

    return read_as_packed


def plugin():
    """(the plugin module or None, what its import said)."""
    try:
        import sglang_hotfix_trtllm
    except ImportError as error:
        return None, "not importable: %s" % error
    return sglang_hotfix_trtllm, "imported"


def plugin_facts(module):
    if module is None:
        return {"version": "none"}
    record = pathlib.Path(module.__file__).parent / "records" / "pr28144.py"
    return {
        "version": getattr(module, "__version__", "?"),
        "file": module.__file__,
        # Both plugin wheels of this proof say 0.5.0: the record's source tells them apart.
        "pr28144_sha256": hashlib.sha256(record.read_bytes()).hexdigest()[:16] if record.exists() else None,
    }


def capture_flag_module():
    """``MHATokenToKVPool.set_kv_buffer`` imports ``get_is_capture_mode`` from SGLang's
    ``cuda_graph_runner`` at its first call. That module's import chain reaches SGLang's
    disaggregation and host-cache stack (msgspec, and ``sgl_kernel.kvcacheio`` unconditionally in
    0.5.10), which the H200 carry does not hold: imported here with CUDA hidden, as the backend
    was; where that fails, a module holding only ``get_is_capture_mode`` (always False: nothing is
    captured here) stands in for it, so the pool's own write path runs (its naive branch, as with
    CUDA hidden at import). Returns which, in words."""
    real = torch.cuda.is_available
    torch.cuda.is_available = lambda: False
    try:
        import sglang.srt.mem_cache.memory_pool  # noqa: F401  (its failure is the worker's)

        try:
            import sglang.srt.model_executor.cuda_graph_runner  # noqa: F401

            return "SGLang's own"
        except ImportError as error:
            name = "sglang.srt.model_executor.cuda_graph_runner"
            stand_in = types.ModuleType(name)
            stand_in.get_is_capture_mode = lambda: False
            sys.modules[name] = stand_in
            return "stand-in (get_is_capture_mode only; the real import failed: %s)" % error
    finally:
        torch.cuda.is_available = real


def run(backend_module, ForwardMode, device):
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    generator = torch.Generator().manual_seed(0)
    pool = MHATokenToKVPool(
        size=PAGES * PAGE_SIZE - PAGE_SIZE,
        page_size=PAGE_SIZE,
        dtype=torch.bfloat16,
        head_num=KV_HEADS,
        head_dim=HEAD_DIM,
        layer_num=1,
        device=str(device),
        enable_memory_saver=False,
    )
    layer = radix_layer(device)  # no scales: k_scale(_float) and v_scale(_float) None
    slots = torch.arange(PAGE_SIZE, PAGES * PAGE_SIZE, device=device)
    k = torch.randn(len(slots), KV_HEADS, HEAD_DIM, generator=generator).to(torch.bfloat16).to(device)
    v = torch.randn(len(slots), KV_HEADS, HEAD_DIM, generator=generator).to(torch.bfloat16).to(device)
    pool.set_kv_buffer(layer, slots, k, v, layer.k_scale, layer.v_scale)
    k_stored, v_stored = pool.get_kv_buffer(0)

    shape = (BATCH, PAGES, MAX_CONTEXT, (MIN_KEYS, MAX_CONTEXT))
    backend, batch, req_to_token, lengths_cpu = paged_batch(
        backend_module, ForwardMode, pool, torch.bfloat16, device, generator, shape
    )

    # The query as Llama-family attention hands it over: a view into the fused QKV projection.
    widths = [Q_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM]
    qkv = torch.randn(BATCH, sum(widths), generator=generator).to(torch.bfloat16).to(device)
    q = qkv.split(widths, dim=1)[0]
    assert not q.is_contiguous(), q.stride()

    tokens = req_to_token.long()
    keys, values = k_stored.float()[tokens], v_stored.float()[tokens]
    true_q = q.float().view(BATCH, Q_HEADS, HEAD_DIM)
    packed_q = packed_view(q.view(BATCH, Q_HEADS, HEAD_DIM)).float()
    expected = attention(true_q, keys, values, lengths_cpu.to(device), layer.scaling)
    expected_packed = attention(packed_q, keys, values, lengths_cpu.to(device), layer.scaling)

    def call(query):
        out = backend.forward_decode(query, None, None, layer, batch, save_kv_cache=False)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return out.view(BATCH, Q_HEADS, HEAD_DIM).float()

    def row_errors(out, reference):
        return (out - reference).abs().amax(dim=(1, 2))

    try:
        floor_out = call(q.contiguous())
        out = call(q)
    except Exception as error:
        return {"error": "%s: %s" % (type(error).__name__, str(error)[:300]), "trace": traceback.format_exc()[-2000:]}
    floor = row_errors(floor_out, expected)
    errors = row_errors(out, expected)
    errors_packed = row_errors(out, expected_packed)
    tolerance = max(TOLERANCE, FLOOR_FACTOR * float(floor.max()))
    nan = torch.isnan(out).flatten(1).any(dim=1)
    wrong = nan | (errors > tolerance)
    return {
        "rows": BATCH,
        "query_shape": list(q.shape),
        "query_strides": list(q.stride()),
        "query_contiguous": q.is_contiguous(),
        "lengths": lengths_cpu.tolist(),
        "floor_max_abs_error_contiguous_q": round(float(floor.max()), 5),
        "tolerance": round(tolerance, 5),
        "wrong_rows": int(wrong.sum()),
        "wrong_row_ids": [i for i in range(BATCH) if bool(wrong[i])],
        "first_row_wrong": bool(wrong[0]),
        "nan_rows": int(nan.sum()),
        "max_abs_error": round(float(errors.max()), 5),
        "max_abs_error_rows_after_first": round(float(errors[1:].max()), 5),
        "errors": [round(float(e), 4) for e in errors],
        # The mechanism: rows that equal attention over the query as a packed reader sees it.
        "rows_matching_packed_read": int((errors_packed <= tolerance).sum()),
        "errors_vs_packed_read": [round(float(e), 4) for e in errors_packed],
        "max_abs_output": round(float(expected.abs().max()), 4),
        "max_abs_difference_true_vs_packed_reference": round(float((expected - expected_packed).abs().max()), 4),
    }


def main():
    dry_run = "--cpu-dry-run" in sys.argv
    packed_stand_in = "--packed-stand-in" in sys.argv
    if packed_stand_in and not dry_run:
        sys.exit("--packed-stand-in is for --cpu-dry-run only (the real XQA kernel reads the query as packed)")
    device = torch.device("cpu" if dry_run else "cuda")
    backend_module, ForwardMode, _ = import_sglang()
    capture_flag = capture_flag_module()
    kernel = use_kernel(backend_module, dry_run)
    if packed_stand_in:
        decode = backend_module.flashinfer.decode
        decode.trtllm_batch_decode_with_kv_cache = reads_packed(decode.trtllm_batch_decode_with_kv_cache)
        kernel += ", reading the query as packed (as XQA)"
    # SGLang bound no `flashinfer` while imported with CUDA hidden (import_sglang): the record's gate
    # goes around the module's global now that it exists, as it does at import on a GPU machine.
    module, imported = plugin()
    applied = module.apply() if module is not None else None
    decode_type = type(backend_module.TRTLLMHAAttnBackend.__dict__["forward_decode"]).__name__
    try:
        import importlib.metadata

        sglang_version = importlib.metadata.version("sglang")
    except Exception as error:  # an unzipped tree without its dist-info
        sglang_version = "unknown (%s)" % type(error).__name__
    result = run(backend_module, ForwardMode, device)
    print(
        "RESULT:"
        + json.dumps(
            {
                "plugin": dict(plugin_facts(module), import_=imported, applied=applied),
                "forward_decode_type": decode_type,
                "forward_decode_wrapped": decode_type != "function",
                "flashinfer_global_after_call": type(backend_module.flashinfer).__name__,
                "kernel": kernel,
                "cuda_graph_runner": capture_flag,
                "xqa": device.type == "cpu" or torch.cuda.get_device_capability()[0] in (9, 12),
                "device": "cpu (dry run)" if dry_run else torch.cuda.get_device_name(),
                "torch": torch.__version__,
                "sglang_version": sglang_version,
                "sglang_file": backend_module.__file__,
                "shape": {"batch": BATCH, "q_heads": Q_HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM},
                "case": result,
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
