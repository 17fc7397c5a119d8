"""Issue 38, item 1: what the hotfix costs a decode step against upstream's own fix, in one process,
the arms interleaved. SGLang 0.5.12's own ``TRTLLMHAAttnBackend.forward_decode`` for 32 layers with
real kernels (XQA on the H200), four arms:

* ``release``: SGLang's module as shipped (the hotfix removed);
* ``wrapt``: the release with ``forward_decode`` under a plain ``wrapt.FunctionWrapper`` whose body
  only calls it (what any wrapt wrapper of the method costs: the floor of the project's rule);
* ``hotfix``: the same module with the hotfix applied (``sglang_hotfix_trtllm.apply()``);
* ``anchor``: SGLang's file with upstream's changes for the records that apply inserted into its
  source (``tools/anchor_source.py``: PR #28144 as 0.5.15 has it, PR #31667 as 0.5.16 has it),
  loaded as a module of its own beside SGLang's (what an upgrade would cost).

    python decode_step_anchor_worker.py --anchor .gpu/anchor/trtllm_mha_backend_anchor.py
    python decode_step_anchor_worker.py --anchor ... --cpu-dry-run   # CPU, a torch stand-in kernel
    py-spy record --native -f raw -o hotfix.txt -- \
        python decode_step_anchor_worker.py --anchor ... --spin hotfix --cases fp8_scaled --spin-s 20

Cases (``decode_step_ab_worker.build_case``: one SGLang pool of 32 layers, batch 32, contexts up to
1023, each layer its own fused qkv): ``bf16_strided`` (a ``qkv.split`` query: pr31667 repairs
every call), ``bf16_packed`` (a packed query: nothing to repair) and ``fp8_scaled`` (FP8 cache with
K/V scales 0.5 and 4, a strided query: pr28144 through the gate and pr31667). A step is the 32
``forward_decode`` calls and a synchronize. Blocks go arm by arm in the six orders in turn; after
each switch one untimed step, then timed steps. Reported: medians per arm, and per pair of arms the
median of block-median differences with a distribution-free 95% interval, per step and per call
(/32). Outputs: the hotfix arm's against the anchor's, bit for bit. ``profile``: cProfile of the
hotfix and anchor arms (top functions by own time), on this host.
"""

import argparse
import cProfile
import functools
import gc
import io
import itertools
import json
import os
import pathlib
import pstats
import statistics
import sys
import time
import types

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from cuda_graph_worker import import_sglang, use_kernel  # noqa: E402
from decode_step_ab_worker import (  # noqa: E402
    LAYERS,
    SIZES,
    Clock,
    build_case,
    decode_step,
    failure,
    median_interval,
    quartiles,
    set_state,
    timed,
    where_it_runs,
)

ARMS = ("release", "wrapt", "hotfix", "anchor")
ANCHOR_MODULE = "sglang.srt.layers.attention.trtllm_mha_backend_anchor"
# name: (decode_step_ab_worker's case, query layout)
CASES = {
    "bf16_strided": ("bf16_no_scales", "strided"),
    "bf16_packed": ("bf16_no_scales", "packed"),
    "fp8_scaled": ("fp8_scaled", "strided"),
}
PLAN = {
    "device": dict(blocks=240, steps=4, profile_steps=300, cost_rounds=40, cost_calls=300),
    "dry": dict(blocks=6, steps=2, profile_steps=3, cost_rounds=10, cost_calls=100),
}


def load_anchor(path, backend_module):
    """The anchor file as a module of its own (the hotfix patches only SGLang's module name), its
    imports taken as SGLang's CPU import path takes them (``import_sglang``), its ``flashinfer``
    the one SGLang's module was given."""
    module = types.ModuleType(ANCHOR_MODULE)
    module.__file__ = str(path)
    sys.modules[ANCHOR_MODULE] = module  # dataclasses look their module up while the file runs
    real = torch.cuda.is_available
    torch.cuda.is_available = lambda: False
    try:
        exec(compile(pathlib.Path(path).read_text(encoding="utf-8"), str(path), "exec"), module.__dict__)
    finally:
        torch.cuda.is_available = real
    module.flashinfer = backend_module.__dict__["flashinfer"]
    return module


def packed(inputs):
    """The same queries packed (each its own tensor), K and V as they were."""
    return [(q.contiguous(), k, v) for q, k, v in inputs]


def for_arms(case, anchor, layout):
    """``case`` (``build_case``'s) as the arms run it: its queries packed for the ``packed`` layout,
    and ``case.anchor_backend``, the anchor's class over the release backend's own state (the same
    pool, metadata and workspace: only the method differs)."""
    if layout == "packed":
        case.inputs = packed(case.inputs)
    case.anchor_backend = object.__new__(anchor.TRTLLMHAAttnBackend)
    case.anchor_backend.__dict__.update(case.backend.__dict__)
    return case


def returning(out):
    """A stand-in for FlashInfer whose decode kernel returns ``out``: what is left of a call is Python."""
    return types.SimpleNamespace(decode=types.SimpleNamespace(trtllm_batch_decode_with_kv_cache=lambda **kwargs: out))


def arm_step(arm, case, save_kv_cache):
    backend = case.anchor_backend if arm == "anchor" else case.backend
    return functools.partial(decode_step, backend, case.layers, case.inputs, case.forward_batch, save_kv_cache)


def _passthrough_wrapper(cls):
    """SGLang's ``forward_decode`` under a plain ``wrapt.FunctionWrapper`` with a pass-through body:
    what any wrapt wrapper of the method costs (the ``wrapt`` arm)."""
    import wrapt

    return wrapt.FunctionWrapper(cls.__dict__["forward_decode"], _passthrough)


def enter(arm, hotfix, cls, passthrough):
    """The class as the arm runs it: the hotfix applied (``hotfix``), SGLang's method under a
    pass-through wrapt wrapper (``wrapt``), or SGLang's method alone (``release``, ``anchor``: the
    anchor's class is another)."""
    set_state(arm == "hotfix", hotfix, cls)
    if arm == "wrapt":
        setattr(cls, "forward_decode", passthrough)


def leave(arm, cls, passthrough):
    if arm == "wrapt":
        setattr(cls, "forward_decode", passthrough.__wrapped__)


def interleaved(case, synchronize, hotfix, cls, plan, clock):
    """Blocks arm by arm, the six orders in turn; per arm the timed samples, per block its median."""
    samples = {arm: [] for arm in ARMS}
    blocks = []
    orders = list(itertools.permutations(ARMS))
    passthrough = _passthrough_wrapper(cls)
    gc.collect()
    gc.disable()
    try:
        for index in range(plan["blocks"]):
            if clock.left() < 0 and blocks:  # the budget spent: at least one block, for the figures' sake
                break
            medians = {}
            for arm in orders[index % len(orders)]:
                enter(arm, hotfix, cls, passthrough)
                try:
                    run = case.steps[arm]
                    timed(run, synchronize, 1)
                    got = timed(run, synchronize, plan["steps"])
                finally:
                    leave(arm, cls, passthrough)
                samples[arm].extend(got)
                medians[arm] = statistics.median(got)
            blocks.append(medians)
    finally:
        gc.enable()
        set_state(False, hotfix, cls)
    result = {
        "blocks": len(blocks),
        "median_us": {arm: round(statistics.median(samples[arm]), 1) for arm in ARMS},
        "quartiles_us": {arm: quartiles(samples[arm]) for arm in ARMS},
    }
    for a, b in (("hotfix", "anchor"), ("hotfix", "release"), ("anchor", "release"), ("wrapt", "release")):
        differences = [block[a] - block[b] for block in blocks]
        median = statistics.median(differences)
        low, high = median_interval(differences)
        result["%s_minus_%s" % (a, b)] = {
            "per_step_us": round(median, 1),
            "per_step_95ci_us": [low, high],
            "percent_of_%s_step" % b: round(100 * median / result["median_us"][b], 2),
            "per_call_us": round(median / LAYERS, 2),
            "per_call_95ci_us": [round(low / LAYERS, 2), round(high / LAYERS, 2)],
        }
    return result


def profile(case, synchronize, hotfix, cls, steps):
    """cProfile of the hotfix and anchor arms: the top functions by own time, per step."""
    out = {}
    for arm in ("hotfix", "anchor"):
        set_state(arm == "hotfix", hotfix, cls)
        run = case.steps[arm]
        timed(run, synchronize, 2)
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(steps):
            run()
            synchronize()
        profiler.disable()
        stream = io.StringIO()
        stats = pstats.Stats(profiler, stream=stream)
        rows, ours = [], []
        for (filename, line, name), (_, calls, own, total, _) in stats.stats.items():
            row = (own, calls, total, "%s:%d(%s)" % (os.path.basename(filename), line, name))
            rows.append(row)
            if any(part in filename for part in ("sglang_hotfix_trtllm", "wrapt", "eval_frame", "contextlib")):
                ours.append(row)
        rows.sort(reverse=True)
        ours.sort(key=lambda row: row[2], reverse=True)

        def listed(chosen):
            return [
                {
                    "function": label,
                    "calls_per_step": round(calls / steps, 1),
                    "own_us_per_step": round(own * 1e6 / steps, 1),
                    "cumulative_us_per_step": round(total * 1e6 / steps, 1),
                }
                for own, calls, total, label in chosen
            ]

        out[arm] = listed(rows[:14])
        out[arm + "_plugin_and_wrapt"] = listed(ours[:25])
    set_state(False, hotfix, cls)
    return out


def _passthrough(wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs)


def _passthrough_joined(module, joined, wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs)


def call_costs(backend_module, anchor, ForwardMode, hotfix, cls, rounds, calls):
    """What one ``forward_decode`` call costs this host's CPU, the kernel a stand-in returning a
    preallocated tensor (so the figure is Python's): SGLang's method, under a plain wrapt
    FunctionWrapper, under the hotfix's HotfixWrapper with a pass-through body, with the hotfix
    applied, and the anchor's method; the three cases of the step. Rounds
    interleaved, medians of per-round means, in microseconds."""
    import wrapt

    from sglang_hotfix_trtllm import patch

    size = dict(SIZES["dry"], batch=32)
    kept = backend_module.__dict__["flashinfer"], anchor.__dict__["flashinfer"]
    backend_module.flashinfer = anchor.flashinfer = returning(torch.zeros(size["batch"], 32, 128, dtype=torch.bfloat16))
    original = cls.__dict__["forward_decode"]
    joined = patch.Joined()
    joined.active = ("pass-through",)
    variants = {
        "release": original,
        "wrapt_passthrough": wrapt.FunctionWrapper(original, _passthrough),
        "hotfix_wrapper_passthrough": patch.HotfixWrapper(
            original, functools.partial(_passthrough_joined, None, joined), enabled=joined
        ),
    }
    results = {}
    try:
        for name, (base, layout) in CASES.items():
            case = for_arms(
                build_case(
                    backend_module, ForwardMode, base, torch.device("cpu"), size, torch.Generator().manual_seed(5)
                ),
                anchor,
                layout,
            )
            anchor_backend, layer = case.anchor_backend, case.layers[0]
            q, k, v = case.inputs[0]
            arms = list(variants) + ["hotfix", "anchor"]
            times = {arm: [] for arm in arms}
            for round_ in range(rounds):
                for arm in arms if round_ % 2 == 0 else reversed(arms):
                    set_state(arm == "hotfix", hotfix, cls)
                    if arm in variants:
                        setattr(cls, "forward_decode", variants[arm])
                    backend = anchor_backend if arm == "anchor" else case.backend
                    run = lambda: backend.forward_decode(q, k, v, layer, case.forward_batch, save_kv_cache=False)  # noqa: E731
                    run()
                    started = time.perf_counter_ns()
                    for _ in range(calls):
                        run()
                    times[arm].append((time.perf_counter_ns() - started) / calls / 1000.0)
                    if arm in variants:
                        setattr(cls, "forward_decode", original)
            medians = {arm: statistics.median(v) for arm, v in times.items()}
            results[name] = {
                "per_call_us": {arm: round(m, 2) for arm, m in medians.items()},
                "added_to_release_us": {arm: round(m - medians["release"], 2) for arm, m in medians.items()},
                "hotfix_minus_anchor_us": round(medians["hotfix"] - medians["anchor"], 2),
            }
    finally:
        setattr(cls, "forward_decode", original)
        set_state(False, hotfix, cls)
        backend_module.flashinfer, anchor.flashinfer = kept
    results["wrapt"] = {
        "version": getattr(wrapt, "__version__", "?"),
        "function_wrapper_mro": ["%s.%s" % (c.__module__, c.__name__) for c in wrapt.FunctionWrapper.__mro__],
        "file": getattr(wrapt, "__file__", None),
    }
    return results


def spin(options, backend_module, ForwardMode, anchor, hotfix, cls, device, size, synchronize):
    """``--spin ARM``: the arm's step of the first case of ``--cases``, again and again for
    ``--spin-s`` seconds, for a sampling profiler run around this process (``py-spy record --
    python decode_step_anchor_worker.py --spin hotfix ...``): where the step's time goes on this
    host. Prints the steps run and their mean time."""
    name = options.cases.split(",")[0]
    base, layout = CASES[name]
    case = for_arms(
        build_case(backend_module, ForwardMode, base, device, size, torch.Generator().manual_seed(0)), anchor, layout
    )
    run = arm_step(options.spin, case, False)
    passthrough = _passthrough_wrapper(cls)
    enter(options.spin, hotfix, cls, passthrough)
    try:
        timed(run, synchronize, 5)
        gc.disable()
        steps, started = 0, time.perf_counter()
        while time.perf_counter() - started < options.spin_s:
            run()
            synchronize()
            steps += 1
        elapsed = time.perf_counter() - started
    finally:
        gc.enable()
        leave(options.spin, cls, passthrough)
        set_state(False, hotfix, cls)
    print(
        "SPIN:"
        + json.dumps({"arm": options.spin, "case": name, "steps": steps, "step_us": round(elapsed / steps * 1e6, 1)})
    )
    return 0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--anchor", required=True)
    parser.add_argument("--cpu-dry-run", action="store_true")
    parser.add_argument("--budget-s", type=float, default=300.0)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--costs-only", action="store_true")
    parser.add_argument("--spin", metavar="ARM", help="only run ARM's step of the first case for --spin-s (for py-spy)")
    parser.add_argument("--spin-s", type=float, default=20.0)
    options = parser.parse_args()
    dry_run = options.cpu_dry_run
    clock = Clock(options.budget_s)
    device, size, synchronize = where_it_runs(dry_run)
    plan = PLAN["dry" if dry_run else "device"]
    backend_module, ForwardMode, _ = import_sglang()
    kernel = use_kernel(backend_module, dry_run)
    anchor = load_anchor(options.anchor, backend_module)
    import sglang_hotfix_trtllm as hotfix

    cls = backend_module.TRTLLMHAAttnBackend
    hotfix.remove()
    if options.spin:
        return spin(options, backend_module, ForwardMode, anchor, hotfix, cls, device, size, synchronize)
    result = {
        "device": "cpu (dry run)" if dry_run else torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "kernel": kernel,
        "plugin": "%s %s" % (hotfix.__version__, os.path.dirname(hotfix.__file__)),
        "anchor": pathlib.Path(options.anchor).read_text(encoding="utf-8").splitlines()[0],
        "shape": dict(layers=LAYERS, batch=size["batch"], max_context=size["context"]),
        "plan": plan,
        "cases": {},
    }
    try:
        result["call_costs"] = call_costs(
            backend_module, anchor, ForwardMode, hotfix, cls, plan["cost_rounds"], plan["cost_calls"]
        )
    except Exception as error:
        result["call_costs"] = failure(error)
    print("call_costs: %s" % json.dumps(result["call_costs"]), flush=True)
    generator = torch.Generator().manual_seed(0)
    names = [] if options.costs_only else [n for n in options.cases.split(",") if n]
    for index, name in enumerate(names):
        share = Clock(max(clock.left(), 0) / (len(names) - index))
        base, layout = CASES[name]
        try:
            case = for_arms(build_case(backend_module, ForwardMode, base, device, size, generator), anchor, layout)
            case.steps = {arm: arm_step(arm, case, False) for arm in ARMS}
            outputs = {}
            for arm in ARMS:  # warm-up (XQA's JIT build, the gate's arming), then one output each
                set_state(arm == "hotfix", hotfix, cls)
                timed(case.steps[arm], synchronize, 3)
                outputs[arm] = case.steps[arm]()
                synchronize()
            set_state(False, hotfix, cls)
            same = {
                "%s_equals_anchor" % arm: all(torch.equal(x, y) for x, y in zip(outputs[arm], outputs["anchor"]))
                for arm in ("hotfix", "release")
            }
            entry = dict(same, query_strides=list(case.inputs[0][0].stride()))
            entry["timing"] = interleaved(case, synchronize, hotfix, cls, plan, share)
            entry["profile"] = profile(case, synchronize, hotfix, cls, plan["profile_steps"])
        except Exception as error:
            entry = failure(error)
        result["cases"][name] = entry
        print("%s: %s" % (name, json.dumps({k: v for k, v in entry.items() if k != "profile"})), flush=True)
        if os.environ.get("OUT"):
            pathlib.Path(os.environ["OUT"], "decode_step_anchor.json").write_text(json.dumps(result, indent=1))
    result["wall_seconds"] = round(time.perf_counter() - clock.start, 1)
    if os.environ.get("OUT"):
        pathlib.Path(os.environ["OUT"], "decode_step_anchor.json").write_text(json.dumps(result, indent=1))
    print("RESULT:" + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
