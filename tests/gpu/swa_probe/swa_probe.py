"""The test's own instrumentation of an EAGLE3 draft's decode on a sliding-window
target (record pr25103), inside a real SGLang server. Not part of the plugin:
``test_server_swa_e2e.py`` puts this folder on ``PYTHONPATH``, and its
``sitecustomize`` arms a post-import hook that calls ``install`` once SGLang's
``trtllm_mha_backend`` module has been executed.

``install`` replaces ``TRTLLMHAAttnBackend.forward_decode`` on the class with a
function that calls SGLang's own and then, for a draft decode (decode mode with
a ``spec_info``), observes:

* once per backend object: ``use_sliding_window_kv_pool``, the type of
  ``_swa_kv_pool`` and of the active pool (``forward_batch.token_to_kv_pool``),
  and whether the two are the same object. No tensor is touched, so this is
  safe inside CUDA-graph capture (``SWA_PROBE=attributes``);
* with ``SWA_PROBE=compare``, outside capture only (the server then runs with
  ``--disable-cuda-graph``, so every call is seen): every row of the kernel's
  output against fp32 attention over the draft's *own* KV (its active pool)
  at the request's true slots, ``req_to_token[req_pool_indices[b], :L]`` with
  ``L = seq_lens[b] + speculative_step_id + 1`` (the keys written so far,
  this step's included), none of it read from the backend's metadata. The
  query is taken as the kernel reads it: flashinfer 0.6.11's XQA wrapper reads
  ``q.data_ptr()`` as contiguous rows, while SGLang hands it a strided view
  into the fused QKV projection (seen on the H200: rows 1 and up then read
  other memory, row 0 does not); the rows are also compared with the query's
  true values (``wrong_true_q``), which measures that separate effect.

``watch_swa_pools`` notes each ``SWAKVPool`` SGLang builds (the target's), when
its allocator registers its full-to-SWA index mapping: the comparison then
also says, for every row, whether translating the row's own pages through
that mapping changes them, that is whether the two index spaces have parted
for that row, whichever table the kernel was given.

Each observation is one JSON line appended to ``$SWA_PROBE_DIR/probe-<pid>.jsonl``
(written and flushed at once: SGLang's schedulers are killed, not shut down).

The tolerance is derived from each row's own values (``bound``, below).
Standard library at import; torch is imported only inside the observer, which
runs only in a process that has imported SGLang (and so torch) already.
"""

import json
import os
import sys

BF16_UNIT_ROUNDOFF = 2.0**-9  # bf16 keeps 8 significant bits: round to nearest is within 2^-9, relative
MARGIN = 2.0  # every rounding term below is counted twice
_seen_backends = set()
_swa_pools = []  # SGLang's SWAKVPool objects, as their mappings were registered
_file = None


def _write(record):
    global _file
    if _file is None:
        folder = os.environ.get("SWA_PROBE_DIR") or "."
        os.makedirs(folder, exist_ok=True)
        _file = open(os.path.join(folder, "probe-%d.jsonl" % os.getpid()), "a", buffering=1)
    record.setdefault("pid", os.getpid())
    _file.write(json.dumps(record) + "\n")
    _file.flush()


def install(module, mode=None):
    """Wrap ``module.TRTLLMHAAttnBackend.forward_decode`` (once)."""
    cls = module.TRTLLMHAAttnBackend
    original = cls.__dict__["forward_decode"]
    if getattr(original, "_swa_probe", False):
        return
    mode = mode or os.environ.get("SWA_PROBE", "attributes")

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        out = original(self, q, k, v, layer, forward_batch, save_kv_cache, **kwargs)
        try:
            observe(self, q, out, layer, forward_batch, kwargs, mode)
        except Exception as error:  # the probe must never change what the server does
            _write({"event": "probe-error", "error": "%s: %s" % (type(error).__name__, error)})
        return out

    forward_decode._swa_probe = True
    forward_decode.__wrapped__ = original
    cls.forward_decode = forward_decode
    _write(
        {
            "event": "installed",
            "mode": mode,
            "module": module.__name__,
            "file": getattr(module, "__file__", None),
            "init_type": type(cls.__dict__["__init__"]).__name__,
        }
    )


def watch_swa_pools(module):
    """Note every ``SWAKVPool`` whose allocator registers its mapping (reads nothing else)."""
    cls = module.SWAKVPool
    original = cls.__dict__["register_mapping"]
    if getattr(original, "_swa_probe", False):
        return

    def register_mapping(self, full_to_swa_index_mapping):
        _swa_pools.append(self)
        return original(self, full_to_swa_index_mapping)

    register_mapping._swa_probe = True
    register_mapping.__wrapped__ = original
    cls.register_mapping = register_mapping


def observe(backend, q, out, layer, forward_batch, kwargs, mode):
    import torch

    forward_mode = forward_batch.forward_mode
    if forward_batch.spec_info is None or not forward_mode.is_decode():
        return  # not a draft decode (with EAGLE the target never decodes; it verifies)
    capturing = q.is_cuda and torch.cuda.is_current_stream_capturing()
    pool = forward_batch.token_to_kv_pool
    if id(backend) not in _seen_backends:
        _seen_backends.add(id(backend))
        swa_pool = getattr(backend, "_swa_kv_pool", None)
        _write(
            {
                "event": "backend",
                "step": getattr(backend, "speculative_step_id", None),
                "use_sliding_window_kv_pool": bool(getattr(backend, "use_sliding_window_kv_pool", False)),
                "swa_kv_pool": None if swa_pool is None else type(swa_pool).__name__,
                "active_pool": type(pool).__name__,
                "swa_kv_pool_is_active_pool": swa_pool is pool,
                "layer_id": layer.layer_id,
                "capturing": bool(capturing),
            }
        )
    if mode != "compare" or capturing:
        return
    _write(dict(compare(backend, q, out, layer, forward_batch, kwargs), event="call"))


def attention(q, k, v, valid, scale, sinks=None):
    """fp32 GQA attention of q [bs, Hq, D] over k, v [bs, L, Hkv, D] where valid [bs, L];
    returns the output, sum_l P_l |v_l| and max_l scale * sum_d |q_d k_ld| (for ``bound``)."""
    import torch

    group = q.shape[1] // k.shape[2]
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    scores = torch.einsum("bhd,blhd->bhl", q, k) * scale
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    if sinks is not None:  # gpt-oss sinks: one more logit per head in the softmax's denominator, no value
        sink = sinks.float().view(1, -1, 1).expand(scores.shape[0], -1, 1)
        weights = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    else:
        weights = torch.softmax(scores, dim=-1)
    output = torch.einsum("bhl,blhd->bhd", weights, v)
    spread = torch.einsum("bhl,blhd->bhd", weights, v.abs())
    logit_size = (torch.einsum("bhd,blhd->bhl", q.abs(), k.abs()) * scale).masked_fill(~valid[:, None, :], 0)
    return output, spread, logit_size.amax(dim=-1)


def bound(output, spread, logit_size):
    """The largest difference bf16 arithmetic can make, per element, between the
    kernel's output and the fp32 reference over the same KV.

    The kernel reads the same bf16 Q, K and V as the reference and accumulates
    in fp32; it rounds to bf16 (relative error u = 2^-9 each) (1) the softmax
    weights before the P.V product: |dO| <= u * sum_l P_l |v_l| = u * S; (2) the
    normalisation with a sum of weights other than the rounded ones: <= u * |O|;
    (3) the output: <= u * |O|; and (4), if it scales Q in bf16 before Q.K, the
    logits by u * A with A = max_l scale * sum_d |q_d k_ld|, which moves the output
    by <= u * A * sum_l P_l |v_l - O| <= u * A * (S + |O|). Together
    u * (S + |O|) * (2 + A), here with MARGIN 2: it grows with the values, where an
    absolute 0.02 does not (activations reach about 10 with random weights).
    """
    return MARGIN * BF16_UNIT_ROUNDOFF * (spread + output.abs()) * (2.0 + logit_size[..., None])


def compare(backend, q, out, layer, forward_batch, kwargs):
    """Every row of this call against fp32 attention over the draft's own KV at its true slots."""
    import torch

    bs = forward_batch.batch_size
    heads, kv_heads, dim = layer.tp_q_head_num, layer.tp_k_head_num, layer.head_dim
    page = backend.page_size
    step = backend.speculative_step_id
    lengths = forward_batch.seq_lens[:bs].long() + step + 1
    max_len = int(lengths.max())
    positions = torch.arange(max_len, device=lengths.device)
    valid = positions[None, :] < lengths[:, None]
    window = getattr(layer, "sliding_window_size", -1)
    if window is not None and window >= 0:  # the kernel's window_left: keys at positions >= L - 1 - window
        valid &= positions[None, :] >= (lengths - 1 - window)[:, None]
    req_to_token = forward_batch.req_to_token_pool.req_to_token
    rows = forward_batch.req_pool_indices[:bs].long()
    # The request's true slots, in the full pool's index space (its first max_len; a shorter row's are masked).
    slots = req_to_token[rows, :max_len].long()
    k_buffer, v_buffer = forward_batch.token_to_kv_pool.get_kv_buffer(layer.layer_id)
    k_scale = getattr(layer, "k_scale_float", None)
    scale = layer.scaling * (1.0 if k_scale is None else k_scale)
    sinks = kwargs.get("sinks")
    # The query as SGLang passes it (a view into the fused QKV projection, rows strided) and as the
    # kernel reads it: flashinfer's XQA wrapper takes q.data_ptr() and assumes contiguous rows of
    # heads x dim elements, whatever the tensor's strides. Both are compared; the KV question (which
    # slots the kernel attends over) is asked with the query the kernel actually read.
    q_view = q.reshape(bs, heads, dim)
    q_contiguous = q_view.is_contiguous()
    q_read = (
        q_view
        if q_contiguous
        else torch.as_strided(q_view, (bs, heads, dim), (heads * dim, dim, 1), q_view.storage_offset())
    )
    got = out.reshape(bs, heads, dim).float()

    def against(token_slots, query):
        token_slots = token_slots.clamp(0, k_buffer.shape[0] - 1)
        k = k_buffer[token_slots].view(bs, max_len, kv_heads, dim).float()
        v = v_buffer[token_slots].view(bs, max_len, kv_heads, dim).float()
        expected, spread, logit_size = attention(query.float(), k, v, valid, scale, sinks)
        error = (got - expected).abs()
        limit = bound(expected, spread, logit_size)
        nan = torch.isnan(got).flatten(1).any(dim=1)
        wrong = nan | (error > limit).flatten(1).any(dim=1)
        ratio = (error / limit).flatten(1).amax(dim=1)
        return expected, error.flatten(1).amax(dim=1), wrong, nan, ratio, v.abs().amax()

    expected, error, wrong, nan, ratio, v_max = against(slots, q_read)
    _, error_true_q, wrong_true_q, _, _, _ = against(slots, q_view)

    # The page table the kernel was given for this layer, against the draft's own (req_to_token's pages).
    given = backend._get_layer_page_table(layer, forward_batch)[:bs].long()
    pages = (lengths + page - 1) // page
    own = (slots[:, ::page] // page)[:, : given.shape[1]]
    columns = min(own.shape[1], given.shape[1])
    in_use = torch.arange(columns, device=given.device)[None, :] < pages[:, None]
    table_differs = ((given[:, :columns] != own[:, :columns]) & in_use).any(dim=1)
    # Whether the index spaces have parted for each row: its own pages translated through the
    # target's full-to-SWA mapping (what an unpatched draft is given) against its own pages.
    pools = [p for p in _swa_pools if getattr(p, "full_to_swa_index_mapping", None) is not None]
    spaces_parted = None
    if pools:
        mapping_size = pools[-1].full_to_swa_index_mapping.numel()
        # Columns past a row's length hold whatever req_to_token has there: keep every index in range
        # (an index out of range would be a device-side assert, which kills the server).
        first_slots = slots[:, ::page][:, :columns].clamp(0, mapping_size - 1)
        translated = pools[-1].translate_loc_from_full_to_swa(first_slots.reshape(-1)).view(first_slots.shape).long()
        spaces_parted = int((((translated // page) != own[:, :columns]) & in_use).any(dim=1).sum())
    # What the kernel read, if it read what that table says: fp32 attention over those slots.
    given_slots = (
        given.gather(1, (positions // page).clamp(max=given.shape[1] - 1)[None, :].expand(bs, -1)) * page
        + positions % page
    )
    _, error_given, wrong_given, _, _, _ = against(given_slots, q_read)

    # Sanity: this step's key (the last one) is where the draft just wrote it.
    out_cache_loc = forward_batch.out_cache_loc
    last_slot_mismatch = None
    if out_cache_loc is not None and out_cache_loc.numel() == bs:
        last = slots.gather(1, (lengths - 1)[:, None]).squeeze(1)
        last_slot_mismatch = int((last != out_cache_loc.long()).sum())

    finite = ~nan
    summary = {
        "step": step,
        "rows": bs,
        "lengths_max": max_len,
        "lengths_min": int(lengths.min()),
        "table_differs": int(table_differs.sum()),
        "spaces_parted": spaces_parted,
        "wrong": int(wrong.sum()),
        "nan": int(nan.sum()),
        "wrong_where_table_same": int((wrong & ~table_differs).sum()),
        "max_error": float(error[finite].max()) if bool(finite.any()) else None,
        "max_error_where_table_differs": float(error[finite & table_differs].max())
        if bool((finite & table_differs).any())
        else None,
        "max_ratio": float(ratio[finite].max()) if bool(finite.any()) else None,
        "max_abs_out": float(got[finite].abs().max()) if bool(finite.any()) else None,
        "max_abs_expected": float(expected.abs().max()),
        "max_abs_v": float(v_max),
        "wrong_against_given_table": int(wrong_given.sum()),
        "max_error_against_given_table": float(error_given[finite].max()) if bool(finite.any()) else None,
        "last_slot_mismatch": last_slot_mismatch,
        "q_contiguous": bool(q_contiguous),
        "q_strides": list(q_view.stride()),
        "wrong_true_q": int(wrong_true_q.sum()),
        "wrong_true_q_first_row": int(wrong_true_q[:1].sum()),
        "max_error_true_q": float(error_true_q[finite].max()) if bool(finite.any()) else None,
        "window": window,
        "sinks": sinks is not None,
    }
    return summary


def _print_summary(folder):
    """Aggregate a folder of probe files (for a person reading a run by hand)."""
    import glob

    records = []
    for path in glob.glob(os.path.join(folder, "probe-*.jsonl")):
        with open(path) as handle:
            records += [json.loads(line) for line in handle if line.strip()]
    print(json.dumps(summarise(records), indent=2))


def summarise(records):
    """The totals the test reports, from the probe's JSON lines."""
    calls = [r for r in records if r.get("event") == "call"]

    def largest(key, subset=None):
        values = [r[key] for r in (calls if subset is None else subset) if r.get(key) is not None]
        return max(values) if values else None

    return {
        "installed": [r for r in records if r.get("event") == "installed"],
        "backends": [r for r in records if r.get("event") == "backend"],
        "probe_errors": [r for r in records if r.get("event") == "probe-error"][:5],
        "calls": len(calls),
        "rows": sum(r["rows"] for r in calls),
        "table_differs": sum(r["table_differs"] for r in calls),
        "spaces_parted": sum(r["spaces_parted"] or 0 for r in calls),
        "swa_pools_seen": any(r["spaces_parted"] is not None for r in calls),
        "wrong": sum(r["wrong"] for r in calls),
        "nan": sum(r["nan"] for r in calls),
        "wrong_where_table_same": sum(r["wrong_where_table_same"] for r in calls),
        "max_error": largest("max_error"),
        "max_error_where_table_differs": largest("max_error_where_table_differs"),
        "max_ratio": largest("max_ratio"),
        "max_abs_out": largest("max_abs_out"),
        "max_abs_v": largest("max_abs_v"),
        "wrong_against_given_table": sum(r["wrong_against_given_table"] for r in calls),
        "max_error_against_given_table": largest("max_error_against_given_table"),
        "last_slot_mismatch": sum(r["last_slot_mismatch"] or 0 for r in calls),
        "calls_q_not_contiguous": sum(1 for r in calls if not r.get("q_contiguous", True)),
        "q_strides": sorted({tuple(r["q_strides"]) for r in calls if "q_strides" in r}),
        "rows_q_not_contiguous": sum(r["rows"] for r in calls if not r.get("q_contiguous", True)),
        "wrong_true_q": sum(r.get("wrong_true_q", 0) for r in calls),
        "wrong_true_q_first_row": sum(r.get("wrong_true_q_first_row", 0) for r in calls),
        "max_error_true_q": largest("max_error_true_q"),
        "lengths_max": largest("lengths_max"),
        "steps": sorted({r["step"] for r in calls}),
        "max_batch": largest("rows"),
    }


if __name__ == "__main__":
    _print_summary(sys.argv[1])
