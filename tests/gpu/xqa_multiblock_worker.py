"""Issue 50 item 4 (optional): stress multi-block XQA decode (bf16 Q, bf16 KV cache) for FlashInfer #4161.

Calls flashinfer.decode.trtllm_batch_decode_with_kv_cache(backend="xqa") as SGLang's trtllm_mha
decode does (K/V as an HND (k, v) pair, page 64, 32 query / 8 KV heads, head_dim 128), on a zeroed
workspace. Multi-block is on when sm_count // (batch * kv_heads) > 1 (launchMHAFlashInfer); "off" is
the same call with flashinfer.decode.get_device_sm_count patched to return 1 (one CTA a sequence).
A correct multi-block kernel is deterministic, so every repeat is compared bitwise with the first
multi-block output; each is also compared with the single-block output (bitwise and at 0.02).

  python stress_xqa.py --label 0.6.16 [--seconds 8] [--out FILE] [--cpu-dry-run]
"""

import argparse
import json
import math
import time

import torch

QH, KVH, D, PAGE = 32, 8, 128, 64


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--label", required=True)
    ap.add_argument("--seconds", type=float, default=8.0, help="per config and phase")
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--windows", default="-1,1023")
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--out")
    ap.add_argument("--cpu-dry-run", action="store_true")
    a = ap.parse_args()
    dev = "cpu" if a.cpu_dry_run else "cuda"
    if a.cpu_dry_run:
        import types

        calls = {"n": 0}

        def fake(query, kv_cache, workspace_buffer, block_tables, seq_lens, max_seq_len, out=None, **kw):
            calls["n"] += 1
            o = out if out is not None else torch.empty_like(query)
            o.copy_(query * (1.0 if fi_decode.get_device_sm_count(query.device) == 1 else 1.0))
            if calls["n"] % 997 == 0:
                o[0, 0, 0] = 0  # dry run: a planted mismatch, to check the counting
            return o

        fi_decode = types.SimpleNamespace(get_device_sm_count=lambda d: 132)
        decode = fake
        version = "dry"
        sms = 132
    else:
        import flashinfer
        import flashinfer.decode as fi_decode

        decode = fi_decode.trtllm_batch_decode_with_kv_cache
        version = flashinfer.__version__
        sms = fi_decode.get_device_sm_count(torch.device("cuda"))
    real_sm = fi_decode.get_device_sm_count
    info = dict(
        label=a.label,
        flashinfer=version,
        torch=torch.__version__,
        sm_count=sms,
        device=(torch.cuda.get_device_name(0) if dev == "cuda" else "cpu"),
        ctx=a.ctx,
        seconds=a.seconds,
    )
    print("INFO", json.dumps(info), flush=True)
    ws = torch.zeros(512 << 20, dtype=torch.uint8, device=dev)
    noise_a = torch.randn(16384, 16384, device=dev).to(torch.bfloat16) if dev == "cuda" else None
    side = torch.cuda.Stream() if dev == "cuda" else None
    results = []
    for window in [int(x) for x in a.windows.split(",")]:
        for b in [int(x) for x in a.batches.split(",")]:
            g = torch.Generator().manual_seed(7 + b)
            lens = [a.ctx] * b
            npg = math.ceil(a.ctx / PAGE)
            pages = b * npg + 1
            bt = (torch.randperm(pages - 1, generator=g) + 1).to(torch.int32).view(b, npg).to(dev)
            k = torch.randn(pages, KVH, PAGE, D, generator=g).to(torch.bfloat16).to(dev)
            v = torch.randn(pages, KVH, PAGE, D, generator=g).to(torch.bfloat16).to(dev)
            q = torch.randn(b, QH, D, generator=g).to(torch.bfloat16).to(dev)
            seq = torch.tensor(lens, dtype=torch.int32, device=dev)
            kw = dict(
                bmm1_scale=1.0 / math.sqrt(D),
                bmm2_scale=1.0,
                window_left=window,
                kv_layout="HND",
                backend="xqa",
                out_dtype=torch.bfloat16,
            )

            def run(out):
                return decode(q, (k, v), ws, bt, seq, a.ctx, out=out, **kw)

            fi_decode.get_device_sm_count = lambda d: 1
            single = run(torch.empty_like(q)).clone()
            fi_decode.get_device_sm_count = real_sm
            nb_sub = min(max(1, sms // (b * KVH)), math.ceil(a.ctx / 256))
            out = torch.empty_like(q)
            first = run(out).clone()
            row_err = (first.float() - single.float()).abs().amax(-1)
            rec = dict(
                window_left=window,
                batch=b,
                ctx=a.ctx,
                sub_seqs_est=nb_sub,
                mb_vs_single_bitwise_equal=bool(torch.equal(first, single)),
                mb_vs_single_max_err=float(row_err.max()),
                mb_vs_single_rows_over_0_02=int((row_err > 0.02).sum()),
                single_nan=int(torch.isnan(single).sum()),
                first_nan=int(torch.isnan(first).sum()),
                first_zero_rows=int((first.abs().amax(-1) == 0).sum()),
            )
            for phase in ("quiet", "noisy"):
                mism = torch.zeros((), dtype=torch.int64, device=dev)
                bad_rows = torch.zeros((), dtype=torch.int64, device=dev)
                example = None
                bad_out = first.clone()
                n = 0
                if phase == "noisy" and side is not None:
                    side.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(side):
                        for _ in range(
                            int(a.seconds / 0.011)
                        ):  # 16384^3 bf16 products, ~11 ms each: the phase's length
                            noise_a @ noise_a
                t0 = time.time()
                while time.time() - t0 < a.seconds:
                    for _ in range(50):
                        run(out)
                        d = (out != first).any(-1)  # [b, QH] rows differing bitwise from the first multi-block output
                        anyd = d.any()
                        mism += anyd.to(torch.int64)
                        bad_rows += d.sum()
                        bad_out.copy_(torch.where(anyd, out, bad_out))  # keep the last differing output
                        n += 1
                if int(mism) > 0:
                    diff = (bad_out.float() - first.float()).abs().amax(-1)
                    idx = torch.nonzero(diff > 0)[:8].tolist()
                    example = dict(
                        rows=idx,
                        max_diff=float(diff.max()),
                        zero_rows=int((bad_out.abs().amax(-1) == 0).sum()),
                        nan_rows=int(torch.isnan(bad_out).any(-1).sum()),
                        err_vs_single=float((bad_out.float() - single.float()).abs().max()),
                    )
                if dev == "cuda":
                    torch.cuda.synchronize()
                    if side is not None:
                        side.synchronize()
                rec[phase] = dict(
                    calls=n,
                    outputs_differing=int(mism),
                    rows_differing=int(bad_rows),
                    seconds=round(time.time() - t0, 2),
                    example=example,
                )
            print("CONFIG", json.dumps(rec), flush=True)
            results.append(rec)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(dict(info=info, results=results), f, indent=1)


if __name__ == "__main__":
    main()
