"""CPU dry run of what ``test_server_swa_e2e.py`` needs, before device time is spent.

    python tests/gpu/swa_probe/dry_run.py      # from the repository root, in a venv with SGLang 0.5.12 (CPU),
                                               # transformers 5.6.0 and this plugin installed

1. builds the target and the draft (``e2e_swa_models``) and loads both configs,
   and the target's weights into ``GptOssForCausalLM``, with the transformers at hand;
2. checks ``swa_probe.bound`` against an emulation of the kernel's bf16
   roundings (it must hold) and against attention over the wrong KV (it must
   not), at value sizes from random-weight to about 10 and more;
3. checks the probe on a strided query (a view into a fused QKV tensor) with a
   stand-in kernel that reads it as contiguous rows, as flashinfer's XQA does;
4. runs ``swa_draft_worker.py --cpu-dry-run`` (SGLang's own backend, pools and
   allocator on CPU, a torch stand-in for the kernel) in fresh processes with
   this folder on PYTHONPATH and ``SWA_PROBE=compare``, record pr25103 off by
   name and on, and prints the probe's totals: off, 15 of 16 rows read through a
   table other than the draft's own and are wrong; on, none.

Exits 1 when a check fails.
"""

import json
import os
import pathlib
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
GPU_TESTS = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(GPU_TESTS))
import swa_probe  # noqa: E402


def models():
    import e2e_swa_models

    with tempfile.TemporaryDirectory() as folder:
        facts = e2e_swa_models.check_with_transformers(*e2e_swa_models.build(folder))
    print("models:", json.dumps(facts, default=str))
    info = facts["loading_info"]
    return not info["missing_keys"] and not info["unexpected_keys"] and facts["layer_types"][0] == "sliding_attention"


def bound():
    import torch

    torch.manual_seed(0)
    bs, heads, kv_heads, dim, length = 6, 8, 2, 128, 700
    ok = True
    for v_std, q_std in ((0.45, 0.45), (4.0, 0.45), (4.0, 1.5), (10.0, 3.0)):
        q = (torch.randn(bs, heads, dim) * q_std).bfloat16().float()
        k = (torch.randn(bs, length, kv_heads, dim) * q_std).bfloat16().float()
        v = (torch.randn(bs, length, kv_heads, dim) * v_std + v_std / 3).bfloat16().float()
        valid = torch.ones(bs, length, dtype=torch.bool)
        scale = dim**-0.5
        expected, spread, logit_size = swa_probe.attention(q, k, v, valid, scale)
        limit = swa_probe.bound(expected, spread, logit_size)
        # The kernel, emulated: Q * scale rounded to bf16, softmax weights rounded before P.V, output rounded.
        group = heads // kv_heads
        kk, vv = k.repeat_interleave(group, 2), v.repeat_interleave(group, 2)
        scores = torch.einsum("bhd,blhd->bhl", (q * scale).bfloat16().float(), kk)
        weights = torch.exp(scores - scores.amax(-1, keepdim=True))
        out = torch.einsum("bhl,blhd->bhd", weights.bfloat16().float(), vv) / weights.sum(-1, keepdim=True)
        rounding = ((out.bfloat16().float() - expected).abs() / limit).max().item()
        # Wrong KV: 80 % of the keys read from a zeroed slot, as the evicted window's tokens are.
        k2, v2 = k.clone(), v.clone()
        k2[:, : int(length * 0.8)] = 0
        v2[:, : int(length * 0.8)] = 0
        wrong, _, _ = swa_probe.attention(q, k2, v2, valid, scale)
        flagged = int(((wrong.bfloat16().float() - expected).abs() > limit).flatten(1).any(1).sum())
        print(
            "bound: values %.2f/%.2f, max |out| %.2f: rounding uses %.3f of it; wrong KV flags %d of %d rows"
            % (v_std, q_std, expected.abs().max(), rounding, flagged, bs)
        )
        ok = ok and rounding < 1 and flagged == bs
    return ok


def strided_query():
    """The probe on a query that is a view into a fused QKV tensor (as SGLang's draft hands it over),
    with a stand-in kernel that reads q.data_ptr() as contiguous rows, as flashinfer's XQA wrapper
    does: the KV comparison (query as read) must pass, the true-query one must fail from row 1 on."""
    import types

    import torch

    torch.manual_seed(1)
    bs, heads, kv_heads, dim, page, length = 5, 8, 2, 128, 64, 300
    slots_per_row = torch.arange(bs * 320).view(bs, 320) + page  # whole pages, after the padding page
    k_buffer = torch.randn(bs * 320 + 2 * page, kv_heads, dim).bfloat16()
    v_buffer = torch.randn(bs * 320 + 2 * page, kv_heads, dim).bfloat16()
    qkv = torch.randn(bs, (heads + 2 * kv_heads) * dim).bfloat16()
    q = qkv[:, : heads * dim]
    lengths = torch.full((bs,), length - 1)
    read = torch.as_strided(q, (bs, heads, dim), (heads * dim, dim, 1), q.storage_offset()).float()
    valid = torch.arange(length)[None, :] < (lengths + 1)[:, None]
    keys = slots_per_row[:, :length]
    out, _, _ = swa_probe.attention(read, k_buffer[keys].float(), v_buffer[keys].float(), valid, dim**-0.5)
    table = slots_per_row[:, ::page] // page
    backend = types.SimpleNamespace(page_size=page, speculative_step_id=0, _get_layer_page_table=lambda *a: table)
    batch = types.SimpleNamespace(
        batch_size=bs,
        seq_lens=lengths,
        req_pool_indices=torch.arange(bs),
        req_to_token_pool=types.SimpleNamespace(req_to_token=slots_per_row),
        token_to_kv_pool=types.SimpleNamespace(get_kv_buffer=lambda i: (k_buffer, v_buffer)),
        out_cache_loc=None,
    )
    layer = types.SimpleNamespace(
        tp_q_head_num=heads,
        tp_k_head_num=kv_heads,
        head_dim=dim,
        scaling=dim**-0.5,
        sliding_window_size=-1,
        layer_id=0,
        k_scale_float=None,
    )
    summary = swa_probe.compare(backend, q, out.bfloat16().view(bs, -1), layer, batch, {})
    print(
        "strided query:",
        json.dumps(
            {
                k: summary[k]
                for k in (
                    "q_contiguous",
                    "q_strides",
                    "wrong",
                    "wrong_true_q",
                    "wrong_true_q_first_row",
                    "table_differs",
                )
            }
        ),
    )
    return (
        not summary["q_contiguous"]
        and summary["wrong"] == 0
        and summary["wrong_true_q"] == bs - 1
        and summary["wrong_true_q_first_row"] == 0
    )


def worker(disable):
    with tempfile.TemporaryDirectory() as folder:
        env = dict(
            os.environ,
            SWA_PROBE="compare",
            SWA_PROBE_DIR=folder,
            SGLANG_HOTFIX_TRTLLM_DISABLE=disable,
            PYTHONPATH=os.pathsep.join([str(HERE)] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
        )
        subprocess.run(
            [sys.executable, str(GPU_TESTS / "swa_draft_worker.py"), "--cpu-dry-run"],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
            timeout=600,
        )
        records = []
        for path in pathlib.Path(folder).glob("probe-*.jsonl"):
            records += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    summary = swa_probe.summarise(records)
    keys = (
        "rows",
        "table_differs",
        "spaces_parted",
        "wrong",
        "nan",
        "max_error",
        "max_ratio",
        "wrong_against_given_table",
        "last_slot_mismatch",
    )
    print(
        "worker, SGLANG_HOTFIX_TRTLLM_DISABLE=%r:" % disable,
        json.dumps({k: summary[k] for k in keys}),
        json.dumps(summary["backends"]),
    )
    return summary


def main():
    ok = models()
    ok = bound() and ok
    ok = strided_query() and ok
    off, on = worker("pr25103"), worker("")
    ok = ok and off["table_differs"] > 0 and off["wrong"] > 0 and on["table_differs"] == 0 and on["wrong"] == 0
    ok = ok and on["spaces_parted"] > 0 and not off["probe_errors"] and not on["probe_errors"]
    print("dry run:", "ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
