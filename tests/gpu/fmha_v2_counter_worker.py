"""Issue 50 item 4: does one fmha_v2 prefill leave its tile counter in workspace[:4]?

Calls flashinfer.prefill.trtllm_fmha_v2_prefill directly, the way SGLang 0.5.19-0.5.22's
trtllm_mha backend calls it in forward_extend (Q_PAGED_KV_NHD, causal, bf16, window_left -1,
max_kv_len = model context), on a freshly zeroed workspace, and reads the first bytes afterwards.
Shapes: 32 query heads, 8 KV heads, head_dim 128, page 64.

  python probe_fmha.py --label 0.7.1 [--cases "128;2000,1000"] [--out FILE] [--cpu-dry-run]
"""

import argparse
import hashlib
import json
import math
import time

import torch

QH, KVH, D, PAGE = 32, 8, 128, 64


def build_case(lens, dev, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    b = len(lens)
    npages = [math.ceil(n / PAGE) for n in lens]
    total_pages = sum(npages) + 1  # page 0: padding page, as SGLang's pool
    perm = (torch.randperm(total_pages - 1, generator=g) + 1).tolist()
    bt = torch.zeros(b, max(npages), dtype=torch.int32)
    k = 0
    for i, n in enumerate(npages):
        bt[i, :n] = torch.tensor(perm[k : k + n], dtype=torch.int32)
        k += n
    q = torch.randn(sum(lens), QH, D, generator=g).to(torch.bfloat16)
    kv = torch.randn(total_pages, 2, PAGE, KVH, D, generator=g).to(torch.bfloat16)
    cu = torch.zeros(b + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(lens, dtype=torch.int32), 0)
    seq = torch.tensor(lens, dtype=torch.int32)
    return dict(q=q.to(dev), kv=kv.to(dev), bt=bt.to(dev), cu=cu.to(dev), seq=seq.to(dev))


def reference(c, lens):
    """fp32 causal attention, GQA, over the pages the block table names."""
    outs = []
    for i, n in enumerate(lens):
        pages = c["bt"][i, : math.ceil(n / PAGE)].long()
        kv = c["kv"][pages].float()  # [p, 2, PAGE, KVH, D]
        k = kv[:, 0].reshape(-1, KVH, D)[:n]
        v = kv[:, 1].reshape(-1, KVH, D)[:n]
        q = c["q"][c["cu"][i] : c["cu"][i + 1]].float()
        k = k.repeat_interleave(QH // KVH, dim=1)
        v = v.repeat_interleave(QH // KVH, dim=1)
        o = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1)[None],
            k.transpose(0, 1)[None],
            v.transpose(0, 1)[None],
            is_causal=True,
            scale=1.0 / math.sqrt(D),
        )
        outs.append(o[0].transpose(0, 1))
    return torch.cat(outs)


def stand_in(qkv, input_layout, workspace_buffer, seq_lens, cum_seq_lens_q, **kw):
    workspace_buffer.view(torch.int32)[0] = 644  # CPU dry run only: pretend a counter was left
    return torch.zeros_like(qkv[0])


def ws_facts(ws):
    first4 = [int(x) for x in ws[:4].tolist()]
    word = int(ws[:4].view(torch.int32).item())
    nz8 = int(torch.count_nonzero(ws[: 8 << 20]).item())
    nz_all = int(torch.count_nonzero(ws).item())
    idx = torch.nonzero(ws[: 8 << 20]).flatten()[:8].tolist()
    return dict(
        first4_bytes=first4,
        first_int32=word,
        nonzero_bytes_first_8MiB=nz8,
        nonzero_bytes_whole=nz_all,
        first_nonzero_offsets=[int(i) for i in idx],
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--label", required=True)
    ap.add_argument("--cases", default="128;1000;2000,1000;4096;8192,3000,500")
    ap.add_argument("--workspace-mib", type=int, default=512)
    ap.add_argument("--max-kv-len", type=int, default=16384)
    ap.add_argument("--out")
    ap.add_argument("--cpu-dry-run", action="store_true")
    a = ap.parse_args()
    cases = [[int(x) for x in c.split(",")] for c in a.cases.split(";") if c]
    dev = "cpu" if a.cpu_dry_run else "cuda"
    if a.cpu_dry_run:
        a.workspace_mib = 16
    info = dict(
        label=a.label,
        torch=torch.__version__,
        workspace_mib=a.workspace_mib,
        max_kv_len=a.max_kv_len,
        heads=[QH, KVH],
        head_dim=D,
        page=PAGE,
        dtype="bf16",
        layout="Q_PAGED_KV_NHD",
        mask="causal",
    )
    if a.cpu_dry_run:
        prefill = stand_in
    else:
        import flashinfer
        from flashinfer.prefill import trtllm_fmha_v2_prefill as prefill

        info.update(
            flashinfer=flashinfer.__version__,
            flashinfer_file=flashinfer.__file__,
            device=torch.cuda.get_device_name(0),
            capability=list(torch.cuda.get_device_capability(0)),
        )
    print("INFO", json.dumps(info), flush=True)
    results = []
    for ci, lens in enumerate(cases):
        c = build_case(lens, dev, seed=1000 + ci)
        b = len(lens)
        ws = torch.zeros(a.workspace_mib << 20, dtype=torch.uint8, device=dev)
        kwargs = dict(
            seq_lens=c["seq"],
            max_q_len=max(lens),
            max_kv_len=a.max_kv_len,
            bmm1_scale=1.0 / math.sqrt(D),
            bmm2_scale=1.0,
            batch_size=b,
            cum_seq_lens_q=c["cu"],
            cum_seq_lens_kv=c["cu"],
            block_tables=c["bt"],
            out_dtype=torch.bfloat16,
            mask_mode="causal",
            window_left=-1,
            sinks=None,
            skip_softmax_threshold_scale_factor=0.0,
        )
        before = ws_facts(ws)
        t = time.time()
        o1 = prefill((c["q"], c["kv"]), input_layout="Q_PAGED_KV_NHD", workspace_buffer=ws, **kwargs)
        if dev == "cuda":
            torch.cuda.synchronize()
        t1 = time.time() - t
        after1 = ws_facts(ws)
        # second launch on the same (not re-zeroed) workspace, into a zero-filled out
        o2 = torch.zeros_like(o1)
        prefill((c["q"], c["kv"]), input_layout="Q_PAGED_KV_NHD", workspace_buffer=ws, out=o2, **kwargs)
        if dev == "cuda":
            torch.cuda.synchronize()
        after2 = ws_facts(ws)
        ref = reference(c, lens)
        err = (o1.float() - ref).abs()
        r = dict(
            seq_lens=lens,
            batch=b,
            tokens=sum(lens),
            before=before,
            after_first=after1,
            after_second=after2,
            second_equals_first=bool(torch.equal(o1, o2)),
            max_err_vs_fp32=float(err.max().item()),
            nan=int(torch.isnan(o1).sum().item()),
            out_sha256=hashlib.sha256(o1.view(torch.int16).cpu().numpy().tobytes()).hexdigest()[:16],
            first_call_s=round(t1, 3),
        )
        print("CASE", json.dumps(r), flush=True)
        results.append(r)
        del ws
    doc = dict(info=info, results=results)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(doc, f, indent=1)
    print(
        "SUMMARY",
        a.label,
        [(r["seq_lens"], r["after_first"]["first4_bytes"], r["after_first"]["first_int32"]) for r in results],
    )


if __name__ == "__main__":
    main()
