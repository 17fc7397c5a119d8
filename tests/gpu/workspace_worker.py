"""Record xqa_workspace on the real kernels: SGLang 0.5.19's own ``TRTLLMHAAttnBackend`` (``__init__``,
``forward_extend``, ``forward_decode``, compiled from the release's file by
``tests/support/workspace_cases.load_module``) with FlashInfer 0.6.18's fmha_v2 prefill and XQA decode
(SM90) behind it, one arm per process.

    python workspace_worker.py --arm release      # the release as shipped; prints RESULT:<json>
    python workspace_worker.py --arm record       # the release with the record applied (patch.wrap)
    python workspace_worker.py --arm oracle       # 0.5.23's change inserted in the release's code
    python workspace_worker.py --arm release --cpu-dry-run   # the same flow on the CPU (stand-in kernels)

Why compiled and not imported: SGLang 0.5.19 pins torch 2.13 and sglang-kernel 0.4.6.post1; the
H200's image has torch 2.11, so SGLang 0.5.19 does not import there. ``workspace_cases`` compiles the
release's backend class, with every method, from the release's own file, and SGLang's own
``get_buffer`` from its ``runtime_context.py`` (one buffer per process, by name, as in a server);
``Process`` installs the module's globals, here with the real ``flashinfer`` module.

What is the worker's, not SGLang's: the model runner, the layer and the forward batch (namespaces
with the fields these methods read, tensors on the GPU); the KV pool (one K and one V buffer of
``[pages * page_size, kv heads, head dim]`` bf16, read through ``get_kv_buffer(layer_id)`` as
SGLang's ``MHATokenToKVPool`` lays them out, filled with random values, page 0 left as the pool's
padding page); ``forward_metadata`` (set as ``init_forward_metadata`` would for these batches: the
lengths, cumulative lengths and a page table of random whole pages); ``envs`` (an object of this
worker: ``SGLANG_FLASHINFER_WORKSPACE_SIZE`` unset, so the release's default 512 MiB, unless
``--workspace-mib``; one decode split, SGLang's default; no skip-softmax thresholds);
``make_persistent_multi_ctas_kv_counter_buffer`` (a zeroed int32 buffer on the GPU; FlashInfer's
XQA path ignores that argument). Queries are random.

Flow, in each arm: the target backend and a draft backend (``speculative_step_id=1``, on the same
pool) built by SGLang's ``__init__``; decode at batch 1, 2, 4, 8, 16 (contexts 2 to 8 k tokens)
through the target before any prefill; one prefill through ``forward_extend`` (fmha_v2,
``Q_PAGED_KV_NHD``); the process's shared workspace read (its first int32 word, the word at 8 MiB,
non-zero bytes in the first 8 MiB); then the same decodes again, twice through the target and once
through the draft. Every decode output is compared with

* the same kernel on a fresh zeroed workspace of the same size (the kernel called directly, with
  the arguments SGLang's ``forward_decode`` passes it: the query packed, K/V through the release's
  own ``_reshape_paged_kv_cache``, the page table, the lengths): rows (request, query head) that
  differ beyond the bf16 tolerance, rows not bit-identical;
* fp32 attention over the same pages (the largest error, for the size of it).

Tolerance 0.02 absolute, as the other GPU proofs (docs/gpu.md): bf16 Q, K and V, fp32 accumulation,
bf16 weights and output. SHA-256 of every output is reported, so that arms can be compared bit for
bit across processes (the data are the same in every arm: same seeds).

--cpu-dry-run: the same flow on the CPU with small contexts (64 to 512 tokens) and stand-in
kernels (fp32 attention through the layouts the real kernels read; the fmha_v2 stand-in leaves
644 at its workspace's offset 0, and the XQA stand-in, at batch 8 or less, garbles request 0 / KV
head 0 when its first 8 MiB are not zero): a check of the worker's plumbing, not of the kernels.
"""

import argparse
import hashlib
import json
import os
import pathlib
import sys
import time
import traceback
import types

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent.parent
CARRY = REPO / ".gpu" / "workspace"
# The plugin from this checkout, imported before tests/conftest.py (which fp8_cases imports) takes
# the checkout off sys.path.
sys.path.insert(0, str(REPO))
from sglang_hotfix_trtllm import detect, patch  # noqa: E402
from sglang_hotfix_trtllm.records import xqa_workspace  # noqa: E402

sys.path[:0] = [str(REPO / "tests" / "support"), str(REPO / "tests"), str(REPO / "tools")]
import torch  # noqa: E402

import workspace_cases as wc  # noqa: E402

# The release whose methods run: 0.5.19 (FlashInfer 0.6.18, its pin) unless WORKSPACE_RELEASE names
# another of the affected ones (0.5.22, with FlashInfer 0.7.1, its pin).
RELEASE = os.environ.get("WORKSPACE_RELEASE", "0.5.19")
assert RELEASE in wc.AFFECTED_RELEASES, RELEASE
ARMS = ("release", "record", "oracle")
HEADS, KV_HEADS, HEAD_DIM, PAGE = wc.HEADS, wc.KV_HEADS, wc.HEAD_DIM, wc.PAGE
GROUP = HEADS // KV_HEADS
BATCH_SIZES = (1, 2, 4, 8, 16)
TOLERANCE = 0.02
SEMAPHORE_BYTES = xqa_workspace.XQA_SEMAPHORE_BYTES
MIB = 1024 * 1024
# (decode contexts, prefill lengths, context_len of the model config)
GPU_SHAPES = ((2048, 8192), (2000, 1000), 16384)
CPU_SHAPES = ((64, 512), (200, 100), 1024)


# --------------------------------------------------------------------------
# Environment


def release_dirs():
    """(0.5.19's folder, 0.5.23's folder): the carried ones (tools/workspace_carry.py), else the
    release cache of the CPU tests."""
    for root in (CARRY / "releases", REPO / ".cache" / "releases"):
        if (root / RELEASE / wc.BACKEND).is_file():
            return root / RELEASE, root / wc.FIXED_RELEASE
    raise FileNotFoundError("no %s of SGLang %s: run tools/workspace_carry.py" % (wc.BACKEND, RELEASE))


def cuda_build_environment():
    """What FlashInfer's JIT needs of the machine: CUDA_HOME a folder with include/cuda.h (else it
    takes the folder of ``which nvcc``), and cublasLt.h, which fmha_v2 includes, on the include
    path (from CUDA_HOME, else from the cuBLAS pip package). Returns what was set, in words."""
    said = []
    if not os.environ.get("CUDA_HOME"):
        for candidate in ("/usr/local/cuda", "/usr/local/cuda-13.0"):
            if pathlib.Path(candidate, "include", "cuda.h").is_file():
                os.environ["CUDA_HOME"] = candidate
                break
    home = os.environ.get("CUDA_HOME", "")
    said.append("CUDA_HOME=%s" % home)
    if not pathlib.Path(home, "include", "cublasLt.h").is_file():
        found = None
        try:
            import nvidia

            for base in map(pathlib.Path, nvidia.__path__):
                found = next(iter(sorted(base.glob("**/include/cublasLt.h"))), None)
                if found:
                    break
        except ImportError:
            pass
        if found:
            flag = "-isystem %s" % found.parent
            for variable in ("FLASHINFER_EXTRA_CUDAFLAGS", "FLASHINFER_EXTRA_CFLAGS"):
                os.environ[variable] = (os.environ.get(variable, "") + " " + flag).strip()
            said.append("cublasLt.h from %s" % found.parent)
        else:
            said.append("no cublasLt.h found")
    return ", ".join(said)


# --------------------------------------------------------------------------
# Attention in fp32, and the CPU stand-ins


def request_slots(page_row, length):
    """KV-pool token slots of one request: its pages' slots in order, the first ``length``."""
    pages = page_row[: (length + PAGE - 1) // PAGE].long()
    return (pages[:, None] * PAGE + torch.arange(PAGE, device=pages.device)[None, :]).reshape(-1)[:length]


def attention_fp32(q, k, v, causal_offset=None):
    """q [n, H, D], k/v [L, KV, D]: fp32 GQA attention; ``causal_offset``: query i sees keys up to
    causal_offset + i (prefill), else all."""
    q, k, v = q.float(), k.float().repeat_interleave(GROUP, dim=1), v.float().repeat_interleave(GROUP, dim=1)
    out = torch.empty_like(q)
    for h0 in range(0, HEADS, 8):
        scores = torch.einsum("nhd,lhd->hnl", q[:, h0 : h0 + 8], k[:, h0 : h0 + 8]) * HEAD_DIM**-0.5
        if causal_offset is not None:
            seen = (
                torch.arange(k.shape[0], device=q.device)[None, :]
                <= (causal_offset + torch.arange(q.shape[0], device=q.device))[:, None]
            )
            scores = scores.masked_fill(~seen[None], float("-inf"))
        out[:, h0 : h0 + 8] = torch.einsum("hnl,lhd->nhd", torch.softmax(scores, dim=-1), v[:, h0 : h0 + 8])
    return out


def decode_fp32(query, k_flat, v_flat, page_table, lengths):
    """[bs, H, D] fp32: each request's query over its own pages."""
    rows = []
    for b, length in enumerate(lengths.tolist()):
        slots = request_slots(page_table[b], length)
        rows.append(attention_fp32(query[b : b + 1], k_flat[slots], v_flat[slots])[0])
    return torch.stack(rows)


def cpu_stand_in():
    """FlashInfer's two kernels as the CPU dry run sees them (see the module's docstring)."""

    def hnd_flat(cache):  # [pages, KV, page, D] (the release's HND view) -> [pages * page, KV, D]
        return cache.permute(0, 2, 1, 3).reshape(-1, KV_HEADS, HEAD_DIM)

    def decode(query, kv_cache, workspace_buffer, block_tables, seq_lens, **kwargs):
        k_cache, v_cache = kv_cache
        out = decode_fp32(query, hnd_flat(k_cache), hnd_flat(v_cache), block_tables, seq_lens)
        if query.shape[0] <= 8 and bool(workspace_buffer.view(torch.uint8)[:SEMAPHORE_BYTES].any()):
            out[0, :GROUP] = -out[0, :GROUP] + 0.25  # a stale semaphore: request 0 / KV head 0 garbled
        return out.to(kwargs.get("out_dtype") or query.dtype)

    def fmha_v2(qkv, input_layout, workspace_buffer, seq_lens, cum_seq_lens_q, block_tables, **kwargs):
        assert input_layout == "Q_PAGED_KV_NHD"
        query, paged_kv = qkv
        k_flat = paged_kv[:, 0].reshape(-1, KV_HEADS, HEAD_DIM)
        v_flat = paged_kv[:, 1].reshape(-1, KV_HEADS, HEAD_DIM)
        out = torch.empty(query.shape, dtype=torch.float32)
        starts = cum_seq_lens_q.tolist()
        for b, length in enumerate(seq_lens.tolist()):
            q = query[starts[b] : starts[b + 1]]
            s = request_slots(block_tables[b], length)
            out[starts[b] : starts[b + 1]] = attention_fp32(q, k_flat[s], v_flat[s], causal_offset=length - q.shape[0])
        workspace_buffer.view(torch.int32)[0] = wc.COUNTER  # the tile counter fmha_v2 left on the H200
        return out.to(kwargs.get("out_dtype") or query.dtype)

    return types.SimpleNamespace(
        decode=types.SimpleNamespace(trtllm_batch_decode_with_kv_cache=decode),
        prefill=types.SimpleNamespace(trtllm_fmha_v2_prefill=fmha_v2),
    )


# --------------------------------------------------------------------------
# SGLang's objects, as the backend reads them


class KVPool:
    """``MHATokenToKVPool``'s layout for one layer: K and V of ``[pages * PAGE, KV, D]``, page 0 the
    padding page."""

    def __init__(self, pages, device, generator):
        shape = (pages * PAGE, KV_HEADS, HEAD_DIM)
        self.k = torch.randn(shape, generator=generator, device=device).to(torch.bfloat16)
        self.v = torch.randn(shape, generator=generator, device=device).to(torch.bfloat16)
        self.k[:PAGE] = 0
        self.v[:PAGE] = 0

    def get_kv_buffer(self, layer_id):
        return self.k, self.v


def model_runner(pool, device, context_len, draft=False):
    return wc.model_runner(None, pool, draft, device=device, context_len=context_len, requests=32)


class Batch:
    """One batch: lengths, page table (random whole pages of the pool, no page twice in a batch),
    the fused QKV projection's output (the query a strided view of it, as models pass it)."""

    def __init__(self, lengths, free_pages, device, generator, extend):
        self.lengths = torch.tensor(lengths, dtype=torch.int32, device=device)
        self.extend = extend
        widths = [(n + PAGE - 1) // PAGE for n in lengths]
        order = free_pages[torch.randperm(len(free_pages), generator=generator, device=device)]
        self.page_table = torch.zeros(len(lengths), max(widths), dtype=torch.int32, device=device)
        at = 0
        for b, width in enumerate(widths):
            self.page_table[b, :width] = order[at : at + width]
            at += width
        tokens = sum(lengths) if extend else len(lengths)
        qkv = torch.randn(tokens, (HEADS + 2 * KV_HEADS) * HEAD_DIM, generator=generator, device=device)
        self.q, self.k, self.v = qkv.to(torch.bfloat16).split(
            [HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=-1
        )

    def metadata(self, module):
        device = self.lengths.device
        bs = self.lengths.shape[0]
        q_lens = self.lengths if self.extend else torch.ones(bs, dtype=torch.int32, device=device)
        return module.TRTLLMMHAMetadata(
            cache_seqlens_int32=self.lengths,
            max_seq_len_q=int(q_lens.max()),
            cu_seqlens_q=torch.nn.functional.pad(torch.cumsum(q_lens, 0, dtype=torch.int32), (1, 0)),
            cu_seqlens_k=torch.nn.functional.pad(torch.cumsum(self.lengths, 0, dtype=torch.int32), (1, 0)),
            page_table=self.page_table,
        )

    def forward(self, module, backend):
        """SGLang's ``forward_extend`` / ``forward_decode``: [tokens, H, D]."""
        backend.forward_metadata = self.metadata(module)
        tokens = self.q.shape[0]
        forward_batch = types.SimpleNamespace(
            forward_mode=module.ForwardMode.EXTEND if self.extend else module.ForwardMode.DECODE,
            batch_size=self.lengths.shape[0],
            out_cache_loc=torch.zeros(tokens, dtype=torch.int64, device=self.lengths.device),
            seq_lens=self.lengths,
            _attn_output=None,
        )
        method = backend.forward_extend if self.extend else backend.forward_decode
        out = method(self.q, self.k, self.v, wc.layer(), forward_batch, save_kv_cache=False)
        return out.view(tokens, HEADS, HEAD_DIM)


# --------------------------------------------------------------------------
# Measuring


def digest(tensor):
    return hashlib.sha256(tensor.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()).hexdigest()[:16]


def compare(out, fresh, exact):
    """Rows (request, query head) of ``out`` against the kernel on a fresh workspace and fp32."""
    error = (out.float() - fresh.float()).abs().amax(dim=-1)  # [bs, H]
    wrong = (error > TOLERANCE) | torch.isnan(out.float()).any(dim=-1)
    groups = sorted({(int(b), int(h) // GROUP) for b, h in wrong.nonzero().tolist()})
    return {
        "rows": out.shape[0] * HEADS,
        "rows_wrong": int(wrong.sum()),
        "rows_not_bitwise": int((out.view(torch.int16) != fresh.view(torch.int16)).any(dim=-1).sum()),
        "wrong_request_kv_head": groups[:16],
        "max_error_vs_fresh": float(error.nan_to_num(float("inf")).max()),
        "max_error_vs_fp32": float((out.float() - exact).abs().nan_to_num(float("inf")).max()),
        "nan_rows": int(torch.isnan(out.float()).any(dim=-1).sum()),
        "sha256": digest(out),
    }


def workspace_facts(shared):
    words = shared.view(torch.int32)
    head = shared.view(torch.uint8)[:SEMAPHORE_BYTES]
    return {
        "first_word": int(words[0]),
        "word_at_8mib": int(words[SEMAPHORE_BYTES // 4]) if shared.numel() > SEMAPHORE_BYTES else None,
        "nonzero_bytes_first_8mib": int(head.count_nonzero()),
    }


def view_facts(view, shared):
    if view is None:
        return None
    return {
        "bytes": view.numel(),
        "offset": view.data_ptr() - shared.data_ptr(),
        "same_storage": view.untyped_storage().data_ptr() == shared.untyped_storage().data_ptr(),
    }


def run(arm, dry_run, workspace_mib, seed=20261202):
    device = "cpu" if dry_run else "cuda"
    contexts, prefill_lengths, context_len = CPU_SHAPES if dry_run else GPU_SHAPES
    release_dir, fixed_dir = release_dirs()
    facts = {"arm": arm, "release": RELEASE, "release_dir": str(release_dir), "device": device}
    if dry_run:
        kernels, facts["kernel"] = cpu_stand_in(), "cpu stand-in"
        workspace_mib = workspace_mib or 16
    else:
        facts["build_environment"] = cuda_build_environment()
        import flashinfer

        kernels = flashinfer
        facts["kernel"] = "flashinfer %s" % getattr(flashinfer, "__version__", "?")
        facts["gpu"] = torch.cuda.get_device_name()
        facts["torch"] = torch.__version__

    module = wc.load_module(release_dir, oracle=arm == "oracle", fixed_dir=fixed_dir)
    module.envs = wc.Envs(workspace_mib * MIB if workspace_mib else None)
    module.make_persistent_multi_ctas_kv_counter_buffer = lambda device, num_q_heads, max_batch_size: torch.zeros(
        num_q_heads * max_batch_size, dtype=torch.int32, device=device
    )
    process = wc.Process(module, sm="sm90", flashinfer=kernels)
    if arm == "record":
        assessment = detect.assess_module(xqa_workspace.HOTFIX, module)
        facts["verdict"] = "%s: %s" % (assessment.verdict.value, assessment.reason)
        facts["wrapped"] = str(patch.wrap(xqa_workspace.HOTFIX, module, assessment))
    init = vars(module.TRTLLMHAAttnBackend)["__init__"]
    # 0.14.0: the record runs upstream's code compiled into SGLang's own __init__ (no wrapper).
    facts["init_on_class"] = type(init).__name__
    facts["init_runs_the_hotfix_compile"] = patch.is_patched(xqa_workspace.HOTFIX, module.TRTLLMHAAttnBackend)

    generator = torch.Generator(device=device).manual_seed(seed)
    largest = max(max(BATCH_SIZES) * contexts[1], sum(prefill_lengths))
    pages = 1 + max(BATCH_SIZES) * (contexts[1] + PAGE - 1) // PAGE + 1
    pool = KVPool(pages, device, generator)
    free_pages = torch.arange(1, pages, device=device)
    k_flat, v_flat = pool.get_kv_buffer(0)
    assert largest <= (pages - 1) * PAGE

    target = module.TRTLLMHAAttnBackend(model_runner(pool, device, context_len))
    draft = module.TRTLLMHAAttnBackend(model_runner(pool, device, context_len, draft=True), speculative_step_id=1)
    shared = process.shared_workspace()
    facts["workspace"] = {
        "workspace_size": target.workspace_size,
        "shared_bytes": shared.numel(),
        "buffers": sorted(process.buffers),
        "target_is_shared": target.workspace_buffer is shared,
        "draft_is_shared": draft.workspace_buffer is shared,
        # Since 0.14.0 the record runs 0.5.23's __init__: the backend holds upstream's view itself, in
        # the record's arm as in the oracle's (and none as shipped).
        "fmha_v2_view_oracle": view_facts(getattr(target, "fmha_v2_workspace_buffer", None), shared),
        "fmha_v2_view_record": view_facts(getattr(target, "fmha_v2_workspace_buffer", None), shared),
    }

    decodes = {}
    for bs in BATCH_SIZES:
        lengths = torch.randint(contexts[0], contexts[1] + 1, (bs,), generator=generator, device=device).tolist()
        decodes[bs] = Batch(lengths, free_pages, device, generator, extend=False)
    prefill = Batch(list(prefill_lengths), free_pages, device, generator, extend=True)

    def fresh_and_fp32(batch):
        """The kernel on a fresh zeroed workspace (the arguments SGLang's forward_decode passes),
        and fp32 attention."""
        layer = wc.layer()
        query = batch.q.contiguous().view(-1, HEADS, HEAD_DIM)
        kv_cache = target._reshape_paged_kv_cache(k_flat, v_flat, layer, HEAD_DIM)
        out = kernels.decode.trtllm_batch_decode_with_kv_cache(
            query=query,
            kv_cache=kv_cache,
            workspace_buffer=torch.zeros(shared.numel(), dtype=torch.uint8, device=device),
            block_tables=batch.page_table,
            seq_lens=batch.lengths,
            max_seq_len=target.max_context_len,
            bmm1_scale=layer.scaling,
            bmm2_scale=1.0,
            window_left=layer.sliding_window_size,
            sinks=None,
            skip_softmax_threshold_scale_factor=None,
            out_dtype=torch.bfloat16,
            kv_cache_sf=None,
            multi_ctas_kv_counter_buffer=target._multi_ctas_kv_counter_buffer,
        )
        return out, decode_fp32(query, k_flat, v_flat, batch.page_table, batch.lengths)

    references = {bs: fresh_and_fp32(batch) for bs, batch in decodes.items()}
    facts["fresh"] = {bs: {"sha256": digest(out)} for bs, (out, _) in references.items()}
    facts["fresh_vs_fp32"] = {bs: float((out.float() - exact).abs().max()) for bs, (out, exact) in references.items()}
    facts["mean_abs_output"] = {bs: float(out.float().abs().mean()) for bs, (out, _) in references.items()}

    def decode_all(backend):
        """Each batch size in turn; with the workspace's first word as each call left it."""
        outcomes = {}
        for bs, batch in decodes.items():
            outcomes[bs] = compare(batch.forward(module, backend), *references[bs])
            outcomes[bs]["first_word_after"] = int(shared.view(torch.int32)[0])
        return outcomes

    facts["workspace_at_start"] = workspace_facts(shared)
    facts["before_prefill"] = decode_all(target)
    facts["workspace_after_first_decodes"] = workspace_facts(shared)

    started = time.time()
    prefill_out = prefill.forward(module, target)
    if device == "cuda":
        torch.cuda.synchronize()
    facts["prefill_seconds_first_call"] = round(time.time() - started, 2)
    facts["workspace_after_prefill"] = workspace_facts(shared)
    starts = [0] + torch.cumsum(prefill.lengths, 0).tolist()
    prefill_error = 0.0
    for b, length in enumerate(prefill.lengths.tolist()):
        s = request_slots(prefill.page_table[b], length)
        q = prefill.q.contiguous().view(-1, HEADS, HEAD_DIM)[starts[b] : starts[b + 1]]
        exact = attention_fp32(q, k_flat[s], v_flat[s], causal_offset=0)
        prefill_error = max(prefill_error, float((prefill_out[starts[b] : starts[b + 1]].float() - exact).abs().max()))
    facts["prefill"] = {
        "lengths": prefill.lengths.tolist(),
        "max_error_vs_fp32": prefill_error,
        "sha256": digest(prefill_out),
    }

    facts["after_prefill"] = [decode_all(target), decode_all(target)]
    facts["after_prefill_draft"] = decode_all(draft)
    facts["workspace_at_end"] = workspace_facts(shared)
    facts["contexts"] = {bs: batch.lengths.tolist() for bs, batch in decodes.items()}
    if arm == "record":
        patch.remove_all()
    return facts


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--arm", choices=ARMS, required=True)
    parser.add_argument("--cpu-dry-run", action="store_true")
    parser.add_argument(
        "--workspace-mib", type=int, default=None, help="SGLANG_FLASHINFER_WORKSPACE_SIZE (MiB); unset: 512"
    )
    args = parser.parse_args()
    try:
        result = run(args.arm, args.cpu_dry_run, args.workspace_mib)
    except Exception:
        traceback.print_exc()
        result = {"arm": args.arm, "error": traceback.format_exc()[-3000:]}
    text = json.dumps(result, sort_keys=True)
    out = os.environ.get("OUT")
    if out:
        pathlib.Path(out, "workspace-%s.json" % args.arm).write_text(json.dumps(result, indent=1, sort_keys=True))
    print("RESULT:" + text)
    return 0 if "error" not in result else 1


if __name__ == "__main__":
    sys.exit(main())
