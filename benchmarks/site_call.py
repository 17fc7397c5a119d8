"""What the hotfix adds to one ``forward_decode`` (or ``forward_extend``) call against upstream's own
fix, on this machine's CPU (issues 38 and 47): SGLang 0.5.12's real method for three arms interleaved in one process,
``release`` (SGLang as shipped), ``hotfix`` (``apply()``) and ``anchor`` (SGLang's file with
upstream's changes inserted: ``tools/anchor_source.py``'s output, as the H200 worker loads it),
FlashInfer's kernel a stand-in returning a preallocated tensor (so the figure is Python's).

    .venv/bin/python benchmarks/site_call.py --anchor .gpu/anchor/trtllm_mha_backend_anchor.py

``--applied-once``: the hotfix applied once before the first round, as a process runs it, and the
release arm left out (with it, each round applies or removes the hotfix, so every hotfix round
starts on freshly installed code objects and module globals, which CPython specialises again: the
encoder-only case read +0.51 µs that way and −0.14 µs applied once, 0.16.0).

Cases (``tests/gpu/decode_step_ab_worker.build_case`` at batch 2): a BF16 cache with a packed query
(nothing to repair), with a strided ``qkv.split`` query (pr31667's statement packs it) and an FP8
cache with K/V scales 0.5 and 4, strided (pr28144's and pr31667's statements); and
``forward_extend`` of an ``ENCODER_ONLY`` layer, one query token a request (encoder_only_mask's
keyword, with pr28144's statements). Since 0.14.0 the hotfix arm runs upstream's code compiled into
SGLang's own methods.

To compare two versions of the plugin, run each in its own process with its code first on the
path and the environment's ``.pth`` files skipped (``-S``: the installed plugin's start-up hook
would import the installed copy):

    PYTHONPATH=CHECKOUT:.venv/lib/python3.11/site-packages .venv/bin/python -S benchmarks/site_call.py ...

(SGLang's CPU import of ``decode_step_ab_worker`` needs msgspec on the path too.)
"""

import argparse
import copy
import gc
import pathlib
import statistics
import sys
import time
import types

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "gpu"))

import torch  # noqa: E402

CASES = {
    "bf16, packed query (nothing to repair)": ("bf16_no_scales", "packed"),
    "bf16, strided query (pr31667)": ("bf16_no_scales", "strided"),
    "fp8 with K/V scales, strided (pr28144 and pr31667)": ("fp8_scaled", "strided"),
    # forward_extend of an ENCODER_ONLY layer, one token a request: encoder_only_mask's keyword on
    # the context kernel (the anchor needs tools/anchor_source.py's encoder_only_mask change)
    "bf16, encoder-only extend (encoder_only_mask)": ("bf16_no_scales", "extend"),
}


def _setup(anchor_path):
    import decode_step_anchor_worker as worker
    from cuda_graph_worker import import_sglang

    backend_module, ForwardMode, _ = import_sglang()
    worker.use_kernel(backend_module, True)
    anchor = worker.load_anchor(anchor_path, backend_module)
    import sglang_hotfix_trtllm as hotfix

    hotfix.remove()
    return backend_module, ForwardMode, anchor, hotfix


def _case(backend_module, ForwardMode, anchor, base, layout):
    from decode_step_ab_worker import SIZES, build_case
    from decode_step_anchor_worker import for_arms, returning

    case = for_arms(
        build_case(
            backend_module,
            ForwardMode,
            base,
            torch.device("cpu"),
            dict(SIZES["dry"], batch=2),
            torch.Generator().manual_seed(5),
        ),
        anchor,
        "strided" if layout == "extend" else layout,
    )
    out = torch.zeros(2, 32, 128, dtype=torch.bfloat16)
    stand_in = returning(out)
    stand_in.prefill = types.SimpleNamespace(trtllm_batch_context_with_kv_cache=lambda **kwargs: out)
    backend_module.flashinfer = anchor.flashinfer = stand_in
    layer = case.layers[0]
    q, k, v = case.inputs[0]
    if layout == "extend":
        from sglang.srt.layers.radix_attention import AttentionType

        layer.attn_type = AttentionType.ENCODER_ONLY
        # the decode metadata holds what forward_extend reads (one query token a request)
        forward_batch = copy.copy(case.forward_batch)
        forward_batch.forward_mode = ForwardMode.EXTEND

        def run(backend):
            return backend.forward_extend(q, k, v, layer, forward_batch, save_kv_cache=False)

        return case, run, stand_in

    def run(backend):
        return backend.forward_decode(q, k, v, layer, case.forward_batch, save_kv_cache=False)

    return case, run, stand_in


def _timed(run, backend, calls):
    run(backend)
    started = time.perf_counter_ns()
    for _ in range(calls):
        run(backend)
    return (time.perf_counter_ns() - started) / calls / 1000.0


def arms(options):
    from decode_step_ab_worker import set_state

    backend_module, ForwardMode, anchor, hotfix = _setup(options.anchor)
    cls = backend_module.TRTLLMHAAttnBackend
    print("plugin: %s" % pathlib.Path(hotfix.__file__).parent)
    print("| case | release (µs) | hotfix (µs) | anchor (µs) | hotfix − anchor (µs) |")
    print("|---|---|---|---|---|")
    if options.applied_once:
        set_state(True, hotfix, cls)  # as a process runs it: applied once, never removed
    gc.disable()
    for label, (base, layout) in CASES.items():
        case, run, _ = _case(backend_module, ForwardMode, anchor, base, layout)
        backends = {
            "release": (False, case.backend),
            "hotfix": (True, case.backend),
            "anchor": (False, case.anchor_backend),
        }
        if options.applied_once:
            del backends["release"]  # the release's code is not running in this process
        times = {arm: [] for arm in backends}
        for round_ in range(options.rounds):
            for arm in list(backends) if round_ % 2 == 0 else list(backends)[::-1]:
                on, backend = backends[arm]
                if not options.applied_once:
                    set_state(on, hotfix, cls)
                times[arm].append(_timed(run, backend, options.calls))
        if not options.applied_once:
            set_state(False, hotfix, cls)
        m = {arm: statistics.median(values) for arm, values in times.items()}
        print(
            "| %s | %s | %.2f | %.2f | %+.2f |"
            % (
                label,
                "%.2f" % m["release"] if "release" in m else "—",
                m["hotfix"],
                m["anchor"],
                m["hotfix"] - m["anchor"],
            )
        )
    gc.enable()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--anchor", required=True, help="tools/anchor_source.py's file")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument(
        "--applied-once",
        action="store_true",
        help="apply the hotfix once, as a process does, and time hotfix and anchor only (by default "
        "every round applies or removes it, so each hotfix round starts on freshly installed code)",
    )
    options = parser.parse_args(argv)
    import logging

    logging.getLogger("sglang_hotfix_trtllm").setLevel(logging.WARNING)  # apply/remove lines, every round
    arms(options)


if __name__ == "__main__":
    main()
