"""Record encoder_only_mask on the real kernel: SGLang 0.5.19's own ``TRTLLMHAAttnBackend``
(``__init__`` and ``forward_extend``, compiled from the release's file by
``tests/support/workspace_cases.load_module``) with FlashInfer 0.6.18's fmha_v2 prefill behind it
(SM90), an ``ENCODER_ONLY`` layer and a decoder layer, in one process:

* ``release``: 0.5.19 as shipped (fmha_v2 gets ``mask_mode="causal"``);
* ``record``: the same with record encoder_only_mask applied (``detect.assess_module``, ``patch.wrap``);
* ``oracle``: 0.5.22's ``causal=`` / ``mask_mode=`` arguments put in 0.5.19's code by AST;
* ``both``: records xqa_workspace and encoder_only_mask applied;
* ``oracle_both``: 0.5.23's workspace change and 0.5.22's arguments put in by AST.

    python encoder_only_worker.py                 # prints RESULT:<json>, writes $OUT/encoder-only.json
    python encoder_only_worker.py --cpu-dry-run   # the same flow on the CPU (a stand-in fmha_v2)

Each prefill output is compared, row by row (token, query head), with fp32 attention over the same
pages, bidirectional and causal, and its SHA-256 reported (the data are the same in every arm:
same seeds). The worker's stand-ins are workspace_worker's (model runner, layer, batch, KV pool,
``envs`` with a 16 MiB workspace); the kernel is FlashInfer's own, JIT-built on the machine. Carry
``.gpu/workspace`` as for workspace_worker (tools/workspace_carry.py) plus 0.5.22's backend file in
``.gpu/workspace/releases/0.5.22/``.

Not yet run on a GPU (the session that wrote it had no device time left): only ``--cpu-dry-run``
has run, where the encoder-only layer's output is causal as shipped, bidirectional with the record
and in both oracles (record = oracle, both = oracle_both, bit for bit), and the decoder layer's is
the same in every arm.
"""

import argparse
import json
import os
import pathlib
import sys
import traceback
import types

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import workspace_worker as ww  # noqa: E402  (puts the checkout's plugin and tests/support on sys.path)

from sglang_hotfix_trtllm import detect, patch  # noqa: E402
from sglang_hotfix_trtllm.records import encoder_only_mask, xqa_workspace  # noqa: E402

torch, wc = ww.torch, ww.wc
HEADS, KV_HEADS, HEAD_DIM = ww.HEADS, ww.KV_HEADS, ww.HEAD_DIM
MIB = ww.MIB
MASK_RELEASE = "0.5.22"
ARMS = {  # arm -> (records applied, 0.5.23's workspace change inserted, 0.5.22's arguments inserted)
    "release": ((), False, False),
    "record": ((encoder_only_mask.HOTFIX,), False, False),
    "oracle": ((), False, True),
    "both": ((xqa_workspace.HOTFIX, encoder_only_mask.HOTFIX), False, False),
    "oracle_both": ((), True, True),
}
GPU_SHAPES = ((700, 300), 4096)  # prefill lengths, the model's context length
CPU_SHAPES = ((40, 24), 256)


def mask_dir():
    for root in (ww.CARRY / "releases", ww.REPO / ".cache" / "releases"):
        if (root / MASK_RELEASE / wc.BACKEND).is_file():
            return root / MASK_RELEASE
    raise FileNotFoundError("no %s of SGLang %s" % (wc.BACKEND, MASK_RELEASE))


def cpu_fmha_v2():
    """fmha_v2 as the dry run sees it: fp32 attention through its NHD paged layout, causal unless
    ``mask_mode="padding"``."""

    def fmha_v2(qkv, input_layout, workspace_buffer, seq_lens, cum_seq_lens_q, block_tables, **kwargs):
        query, paged_kv = qkv
        k_flat = paged_kv[:, 0].reshape(-1, KV_HEADS, HEAD_DIM)
        v_flat = paged_kv[:, 1].reshape(-1, KV_HEADS, HEAD_DIM)
        out = torch.empty(query.shape, dtype=torch.float32)
        starts = cum_seq_lens_q.tolist()
        causal = kwargs.get("mask_mode", "causal") != "padding"
        for b, length in enumerate(seq_lens.tolist()):
            q = query[starts[b] : starts[b + 1]]
            s = ww.request_slots(block_tables[b], length)
            offset = length - q.shape[0] if causal else None
            out[starts[b] : starts[b + 1]] = ww.attention_fp32(q, k_flat[s], v_flat[s], causal_offset=offset)
        return out.to(kwargs.get("out_dtype") or query.dtype)

    return types.SimpleNamespace(
        decode=types.SimpleNamespace(trtllm_batch_decode_with_kv_cache=None),
        prefill=types.SimpleNamespace(trtllm_fmha_v2_prefill=fmha_v2),
    )


def prefill(module, backend, batch, attn_type):
    """SGLang's ``forward_extend`` of one layer of ``attn_type``: [tokens, H, D]."""
    backend.forward_metadata = batch.metadata(module)
    tokens = batch.q.shape[0]
    forward_batch = types.SimpleNamespace(
        forward_mode=module.ForwardMode.EXTEND,
        batch_size=batch.lengths.shape[0],
        out_cache_loc=torch.zeros(tokens, dtype=torch.int64, device=batch.lengths.device),
        seq_lens=batch.lengths,
        _attn_output=None,
    )
    out = backend.forward_extend(batch.q, batch.k, batch.v, wc.layer(attn_type), forward_batch, save_kv_cache=False)
    return out.view(tokens, HEADS, HEAD_DIM)


def run(dry_run, seed=20261203):
    device = "cpu" if dry_run else "cuda"
    lengths, context_len = CPU_SHAPES if dry_run else GPU_SHAPES
    release_dir, fixed_dir = ww.release_dirs()
    facts = {"release": ww.RELEASE, "device": device}
    if dry_run:
        kernels, facts["kernel"] = cpu_fmha_v2(), "cpu stand-in"
    else:
        facts["build_environment"] = ww.cuda_build_environment()
        import flashinfer

        kernels = flashinfer
        facts["kernel"] = "flashinfer %s" % getattr(flashinfer, "__version__", "?")
        facts["gpu"] = torch.cuda.get_device_name()
        facts["torch"] = torch.__version__

    generator = torch.Generator(device=device).manual_seed(seed)
    pages = 2 + sum((n + ww.PAGE - 1) // ww.PAGE for n in lengths)
    pool = ww.KVPool(pages, device, generator)
    batch = ww.Batch(list(lengths), torch.arange(1, pages, device=device), device, generator, extend=True)
    k_flat, v_flat = pool.get_kv_buffer(0)

    # fp32 references, per request: bidirectional and causal
    starts = [0] + torch.cumsum(batch.lengths, 0).tolist()
    query = batch.q.contiguous().view(-1, HEADS, HEAD_DIM)
    references = {"bidirectional": [], "causal": []}
    for b, length in enumerate(batch.lengths.tolist()):
        s = ww.request_slots(batch.page_table[b], length)
        q = query[starts[b] : starts[b + 1]]
        references["bidirectional"].append(ww.attention_fp32(q, k_flat[s], v_flat[s]))
        references["causal"].append(ww.attention_fp32(q, k_flat[s], v_flat[s], causal_offset=0))
    references = {name: torch.cat(parts) for name, parts in references.items()}
    facts["mean_abs_reference"] = {name: float(ref.abs().mean()) for name, ref in references.items()}
    facts["bidirectional_vs_causal"] = float((references["bidirectional"] - references["causal"]).abs().max())

    arms = {}
    for arm, (records, workspace, mask) in ARMS.items():
        for attn_type in ("ENCODER_ONLY", "DECODER"):
            module = wc.load_module(
                release_dir, oracle=workspace, fixed_dir=fixed_dir, mask_dir=mask_dir() if mask else None
            )
            module.envs = wc.Envs(16 * MIB)
            module.make_persistent_multi_ctas_kv_counter_buffer = lambda device, num_q_heads, max_batch_size: (
                torch.zeros(num_q_heads * max_batch_size, dtype=torch.int32, device=device)
            )
            process = wc.Process(module, sm="sm90", flashinfer=kernels)
            seen = {}
            try:
                for hotfix in records:
                    assessment = detect.assess_module(hotfix, module)
                    seen[hotfix.name] = "%s / %s" % (
                        assessment.verdict.value,
                        patch.wrap(hotfix, module, assessment),
                    )
                backend = module.TRTLLMHAAttnBackend(ww.model_runner(pool, device, context_len))
                out = prefill(module, backend, batch, attn_type)
                if device == "cuda":
                    torch.cuda.synchronize()
            finally:
                patch.remove_all()
            shared = process.shared_workspace()
            errors = {name: (out.float() - ref).abs().amax(dim=-1) for name, ref in references.items()}
            arms["%s-%s" % (arm, attn_type)] = {
                "records": seen,
                "sha256": ww.digest(out),
                "max_error": {name: float(e.nan_to_num(float("inf")).max()) for name, e in errors.items()},
                "rows_wrong": {name: int((e > ww.TOLERANCE).sum()) for name, e in errors.items()},
                "rows": int(out.shape[0] * HEADS),
                "workspace_bytes": int(shared.numel()),
                "nonzero_bytes_first_8mib": int(shared.view(torch.uint8)[: ww.SEMAPHORE_BYTES].count_nonzero()),
            }
    facts["arms"] = arms
    return facts


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpu-dry-run", action="store_true")
    args = parser.parse_args()
    try:
        result = run(args.cpu_dry_run)
    except Exception:
        traceback.print_exc()
        result = {"error": traceback.format_exc()[-3000:]}
    out = os.environ.get("OUT")
    if out:
        pathlib.Path(out, "encoder-only.json").write_text(json.dumps(result, indent=1, sort_keys=True))
    print("RESULT:" + json.dumps(result, sort_keys=True))
    return 0 if "error" not in result else 1


if __name__ == "__main__":
    sys.exit(main())
