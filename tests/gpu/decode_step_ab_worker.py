"""What the hotfix adds to a decode step, eager and under torch.compile, measured in one process:
SGLang 0.5.12's own ``TRTLLMHAAttnBackend.forward_decode`` for 32 layers, with the hotfix applied
(``sglang_hotfix_trtllm.apply()``) and removed (``remove()``) in alternating blocks.

    python decode_step_ab_worker.py                # on the H200: prints RESULT:<json> ($OUT/decode_step_ab.json)
    python decode_step_ab_worker.py --cpu-dry-run  # the same logic on CPU, a torch stand-in kernel, few steps
    options: --no-compile, --budget-s S (default 240: compiled blocks stop there), --kv-write,
             --traceable-stand-in (dry run: a stand-in kernel Dynamo can trace)

What is SGLang's: one ``MHATokenToKVPool`` with ``layer_num=32`` (a model runner makes one pool for
all its layers; ``get_kv_buffer(layer_id)`` picks a layer's buffers); ``init_forward_metadata``
(normal decode) and ``forward_decode``, which calls ``flashinfer.decode.
trtllm_batch_decode_with_kv_cache`` (XQA on the H200). Stand-ins, as in fp8_scales_worker: the
backend built without a model runner, the 32 RadixAttention layers (distinct ``layer_id``) and the
ForwardBatch as namespaces, random values; K/V stored into the pool as its ``set_kv_buffer`` stores
them (that method's torch path imports SGLang's cuda_graph_runner: msgspec, which the .whl carry
lacks). Each layer has its own fused ``qkv`` [batch, (32 + 2 x 8) x 128] and passes
``q, k, v = qkv.split(...)`` (q strided, k and v viewed [batch, 8, 128]) as a Llama layer does,
with ``save_kv_cache=False`` (attention only; ``--kv-write``: True, the new token's K/V written
first, where cuda_graph_runner imports).

Cases: ``bf16_no_scales`` (BF16 cache, no scales: nothing to repair, the wrapper calls SGLang's
method alone) and ``fp8_scaled`` (FP8 cache, K scale 0.5, V scale 4: repaired through the gate).
A step: ``forward_decode`` once per layer for the 32 layers, then ``torch.cuda.synchronize()``.
Blocks go on/off, off/on, on/off ... (pairs in alternating order); after each switch untimed
steps (the first FP8 call after apply arms the gate), then timed steps, each timed on its own
(perf_counter around step and synchronize, GC off). Reported per state: median and quartiles of
all timed steps, the difference of medians in us and in % of the off median, and the paired
estimate (median over pairs of on-block median - off-block median, with min and max).

torch.compile (default settings) of the whole step, per case: always compiled afresh in the state
it runs (``torch._dynamo.reset()`` after every switch, as a process that applied the hotfix at
import and compiled later); (a) outputs against eager in the same state and in the other
(``torch.equal``, every layer), on against off; (b) on vs off in interleaved blocks, each block
with its own compile (compile seconds and Dynamo frame / graph / graph-break counts kept). A
compile that fails with the hotfix removed is not the plugin's: reported, the eager figures
stand. ``stale_probe``: compiled removed, then apply() without a reset (what the compiled step then
gives). The dry run's stand-in kernel is opaque to Dynamo (``torch.compiler.disable``), as
FlashInfer's tvm-ffi call is; ``--traceable-stand-in`` lets Dynamo inline the whole method.
Dynamo specialises ``forward_decode`` on ``layer.layer_id`` and stops recompiling it at its
recompile limit (8), the other layers' frames then run uncompiled: ``recompile_limit_hits``.
"""

import argparse
import functools
import gc
import logging
import json
import os
import pathlib
import statistics
import sys
import time
import traceback
import types

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from cuda_graph_worker import HEAD_DIM, KV_HEADS, PAGE_SIZE, Q_HEADS, import_sglang, radix_layer, use_kernel  # noqa: E402

LAYERS = 32
FP8 = torch.float8_e4m3fn
CASES = {
    # name: (KV cache dtype, k_scale, v_scale)
    "bf16_no_scales": (torch.bfloat16, None, None),
    "fp8_scaled": (FP8, 0.5, 4.0),
}
# batch, longest context, eager blocks per state, timed steps per block, untimed steps after a
# switch, warm-up steps per state, compiled blocks per state, timed compiled steps per block.
SIZES = {
    "device": dict(batch=32, context=1024, blocks=300, steps=4, after_switch=1, warmup=20, cblocks=6, csteps=25),
    "dry": dict(batch=4, context=128, blocks=2, steps=3, after_switch=1, warmup=1, cblocks=2, csteps=2),
}


class Clock:
    def __init__(self, budget_s):
        self.start, self.budget = time.perf_counter(), budget_s

    def left(self):
        return self.budget - (time.perf_counter() - self.start)


def set_state(on, hotfix, cls):
    """apply() or remove(); returns the class attribute's type name (checked by the caller)."""
    if on:
        if not hotfix.apply():
            raise RuntimeError("sglang_hotfix_trtllm.apply() returned False (SGLANG_HOTFIX_TRTLLM_DISABLE set?)")
    else:
        hotfix.remove()
    from sglang_hotfix_trtllm import code_edit

    function = cls.__dict__["forward_decode"]
    edited = any(s.function is function and function.__code__ is s.installed for s in code_edit._edited.values())
    kind = "%s (%s)" % (type(function).__name__, "the hotfix's compile" if edited else "the release's code")
    if edited != on:
        raise RuntimeError("forward_decode is a %s with the hotfix %s" % (kind, "applied" if on else "removed"))
    return kind


def build_case(backend_module, ForwardMode, name, device, size, generator):
    """One pool of 32 layers, one backend, 32 layers, per-layer qkv; the metadata of a normal decode."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    from fp8_scales_worker import paged_batch

    kv_dtype, k_scale, v_scale = CASES[name]
    batch, context = size["batch"], size["context"]
    pages = batch * context // PAGE_SIZE + 1  # page 0: the pool's padding
    pool = MHATokenToKVPool(
        size=(pages - 1) * PAGE_SIZE,
        page_size=PAGE_SIZE,
        dtype=kv_dtype,
        head_num=KV_HEADS,
        head_dim=HEAD_DIM,
        layer_num=LAYERS,
        device=str(device),
        enable_memory_saver=False,
    )
    layers = []
    slots = torch.arange(PAGE_SIZE, pages * PAGE_SIZE, device=device)
    bulk = torch.Generator(device=device).manual_seed(1)  # 2 x 32 layers of K/V: drawn where they live
    for layer_id in range(LAYERS):
        layer = radix_layer(device, k_scale, v_scale)
        layer.layer_id = layer_id
        layers.append(layer)
        # K and V as a model computes them (bf16), stored as the pool's set_kv_buffer stores them
        # (divided by the scale and cast for an FP8 cache, kept in its store dtype). Written here:
        # set_kv_buffer's torch path imports SGLang's cuda_graph_runner (msgspec, sgl_kernel ...).
        k_stored, v_stored = pool.k_buffer[layer_id], pool.v_buffer[layer_id]
        for stored, scale in ((k_stored, k_scale), (v_stored, v_scale)):
            values = torch.randn(len(slots), KV_HEADS, HEAD_DIM, generator=bulk, device=device, dtype=torch.bfloat16)
            if kv_dtype != torch.bfloat16:
                values = (values / scale if scale is not None else values).to(kv_dtype)
            stored[slots] = values.view(stored.dtype)
    shape = (batch, pages, context, (1, context))
    backend, forward_batch, _, _ = paged_batch(
        backend_module, ForwardMode, pool, kv_dtype, device, generator, shape, cache_loc=True
    )
    width = (Q_HEADS + 2 * KV_HEADS) * HEAD_DIM
    qkv = [torch.randn(batch, width, generator=generator).to(torch.bfloat16).to(device) for _ in range(LAYERS)]
    q_size, kv_size = Q_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    inputs = []
    for fused in qkv:
        q, k, v = fused.split([q_size, kv_size, kv_size], dim=-1)  # q: strided, as a Llama layer has it
        inputs.append((q, k.view(-1, KV_HEADS, HEAD_DIM), v.view(-1, KV_HEADS, HEAD_DIM)))
    return types.SimpleNamespace(
        name=name, backend=backend, layers=layers, inputs=inputs, forward_batch=forward_batch, pool=pool
    )


def kv_write_importable():
    """--kv-write: the BF16 pool's set_kv_buffer imports SGLang's cuda_graph_runner at its first
    call (its torch path: SGLang was imported with CUDA hidden). Imported here the same way, CUDA
    hidden; it needs msgspec and more (the .e2e carry has them, the .whl one does not)."""
    real = torch.cuda.is_available
    torch.cuda.is_available = lambda: False
    try:
        import sglang.srt.model_executor.cuda_graph_runner  # noqa: F401
    except Exception as error:
        kv_write_importable.error = "%s: %s (the step runs with save_kv_cache=False)" % (type(error).__name__, error)
        return False
    finally:
        torch.cuda.is_available = real
    return True


def decode_step(backend, layers, inputs, forward_batch, save_kv_cache):
    """One decode step's attention: SGLang's forward_decode for every layer, called as
    RadixAttention -> AttentionBackend.forward calls it."""
    return [
        backend.forward_decode(q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache)
        for layer, (q, k, v) in zip(layers, inputs)
    ]


def timed(run, synchronize, steps):
    samples = []
    for _ in range(steps):
        start = time.perf_counter()
        run()
        synchronize()
        samples.append((time.perf_counter() - start) * 1e6)
    return samples


def median_interval(samples):
    ordered, n = sorted(samples), len(samples)
    half = 0.98 * n**0.5
    low, high = max(0, int(n / 2 - half)), min(n - 1, int(n / 2 + half))
    return [round(ordered[low], 1), round(ordered[high], 1)]


def quartiles(samples):
    q = statistics.quantiles(samples, n=4) if len(samples) > 1 else [samples[0]] * 3
    return [round(q[0], 1), round(q[1], 1), round(q[2], 1)]


def ab_blocks(run, synchronize, hotfix, cls, size, blocks, steps, clock=None, prepare=None, reserve=lambda: 0.0):
    """Interleaved blocks: pair i runs (on, off) for even i, (off, on) for odd i. After each switch
    ``prepare(on)`` (compiled: a fresh compile in the new state; its figures kept), then untimed
    steps, then ``steps`` timed ones."""
    per_state = {True: [], False: []}
    block_medians = {True: [], False: []}
    pair_differences, switches = [], []
    gc.collect()
    gc.disable()
    try:
        for pair in range(blocks):
            if clock is not None and clock.left() < reserve():
                break
            medians = {}
            for on in (True, False) if pair % 2 == 0 else (False, True):
                set_state(on, hotfix, cls)
                switch = {"state": "on" if on else "off"}
                if prepare is not None:
                    switch.update(prepare(on))
                switch["untimed_steps_ms"] = [round(t / 1000, 1) for t in timed(run, synchronize, size["after_switch"])]
                switches.append(switch)
                samples = timed(run, synchronize, steps)
                per_state[on].extend(samples)
                medians[on] = statistics.median(samples)
                block_medians[on].append(round(medians[on], 1))
            pair_differences.append(medians[True] - medians[False])
    finally:
        gc.enable()
    if not pair_differences:
        return {"error": "no block ran within the time budget"}
    on, off = statistics.median(per_state[True]), statistics.median(per_state[False])
    result = {
        "pairs": len(pair_differences),
        "steps_per_state": len(per_state[True]),
        "on_median_us": round(on, 1),
        "off_median_us": round(off, 1),
        "on_quartiles_us": quartiles(per_state[True]),
        "off_quartiles_us": quartiles(per_state[False]),
        "difference_us": round(on - off, 1),
        "difference_percent_of_step": round(100 * (on - off) / off, 2),
        "paired_median_difference_us": round(statistics.median(pair_differences), 1),
        "paired_min_max_us": [round(min(pair_differences), 1), round(max(pair_differences), 1)],
        # A distribution-free 95% interval of the paired median (order statistics n/2 -+ 0.98 sqrt(n)).
        "paired_median_95ci_us": median_interval(pair_differences),
        "paired_median_percent_of_step": round(100 * statistics.median(pair_differences) / off, 2),
        "per_layer_call_paired_us": round(statistics.median(pair_differences) / LAYERS, 2),
        "block_medians_on_us": block_medians[True],
        "block_medians_off_us": block_medians[False],
    }
    if prepare is not None:
        result["switches"] = switches
    return result


def all_equal(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def max_difference(a, b):
    return max(float((x.float() - y.float()).abs().max()) for x, y in zip(a, b))


def dynamo_counts():
    from torch._dynamo.utils import counters

    return {
        "frames_ok": int(counters["frames"]["ok"]),
        "unique_graphs": int(counters["stats"]["unique_graphs"]),
        "graph_breaks": int(sum(counters["graph_break"].values())),
    }


def delta(before, after):
    return {key: after[key] - before[key] for key in after}


def eager_case(case, run, synchronize, hotfix, cls, module, size):
    result = {}
    # Warm-up in both states (XQA's JIT build, Triton's FP8 write, the gate's first arming).
    for on in (False, True):
        set_state(on, hotfix, cls)
        start = time.perf_counter()
        timed(run, synchronize, size["warmup"])
        result["warmup_seconds_%s" % ("on" if on else "off")] = round(time.perf_counter() - start, 2)
    # Outputs in both states, and the gate as the FP8 case left it.
    set_state(False, hotfix, cls)
    off, off_again = run(), run()
    synchronize()
    set_state(True, hotfix, cls)
    on = run()
    synchronize()
    result["flashinfer_global_on"] = type(module.flashinfer).__name__
    result["eager_repeat_equal"] = all_equal(off, off_again)
    result["on_equals_off"] = all_equal(on, off)
    result["on_vs_off_max_abs_difference"] = max_difference(on, off)
    if case.name == "fp8_scaled":
        # bmm2_scale 4 (upstream) against 1.0 (release): a power of two.
        result["on_equals_4x_off"] = all_equal(on, [4 * x for x in off])
    set_state(False, hotfix, cls)
    result["flashinfer_global_off"] = type(module.flashinfer).__name__
    result["timing"] = ab_blocks(run, synchronize, hotfix, cls, size, size["blocks"], size["steps"])
    return result, {"off": off, "on": on}


def compiled_case(case, run_eager, step_args, synchronize, hotfix, cls, size, eager_outputs, clock):
    """torch.compile (default settings) of the whole step, always compiled afresh in the state it
    runs in (``torch._dynamo.reset()`` after each switch, as a process that applied the hotfix
    at import and compiled later): where Dynamo inlines a whole ``forward_decode`` it reads the
    wrapt wrapper as SGLang's function (wrapt forwards ``__class__`` and ``__code__``), so a
    compiled function need not see a later apply()/remove() (``stale_probe``). The hotfix is
    removed for the first compile: a failure there is not the plugin's."""
    result = {}
    holder = {}

    def run():
        return holder["compiled"](*step_args)

    def fresh_compile(on):
        torch._dynamo.reset()
        holder["compiled"] = torch.compile(decode_step)
        before = dynamo_counts()
        start = time.perf_counter()
        first = run()
        synchronize()
        seconds = time.perf_counter() - start
        holder["longest"] = max(holder.get("longest", 0.0), seconds)
        return first, {"compile_seconds": round(seconds, 2), "dynamo": delta(before, dynamo_counts())}

    outputs = {}
    for state in ("off", "on"):
        if clock.left() < 0:
            result["compile_%s" % state] = {"error": "skipped: time budget spent"}
            return result
        set_state(state == "on", hotfix, cls)
        try:
            first, figures = fresh_compile(state == "on")
            again = run()
            synchronize()
        except Exception as error:
            result["compile_%s" % state] = failure(error)
            if state == "off":
                result["verdict"] = "compile fails with the hotfix removed: not the plugin's; eager figures stand"
            else:
                result["verdict"] = "compile runs with the hotfix removed but fails with it applied"
            set_state(False, hotfix, cls)
            return result
        eager = run_eager()  # eager in the same state, now (no KV write, or an idempotent one)
        synchronize()
        outputs[state] = first
        figures.update(
            {
                "equal_to_eager_same_state": all_equal(first, eager),
                "equal_to_eager_on": all_equal(first, eager_outputs["on"]),
                "equal_to_eager_off": all_equal(first, eager_outputs["off"]),
                "second_call_equal_to_first": all_equal(first, again),
                "max_abs_difference_to_eager_same_state": max_difference(first, eager),
                "max_abs_difference_to_eager_on_off": [
                    max_difference(first, eager_outputs["on"]),
                    max_difference(first, eager_outputs["off"]),
                ],
            }
        )
        result["compile_%s" % state] = figures
    result["on_equals_off"] = all_equal(outputs["on"], outputs["off"])
    if clock.left() < 0:
        result["timing"] = {"error": "skipped: time budget spent"}
    else:
        try:
            result["timing"] = ab_blocks(
                run,
                synchronize,
                hotfix,
                cls,
                size,
                size["cblocks"],
                size["csteps"],
                clock=clock,
                prepare=lambda on: fresh_compile(on)[1],
                reserve=lambda: 2.5 * holder["longest"],  # a pair: two compiles and its steps
            )
        except Exception as error:
            result["timing"] = failure(error)
    if clock.left() > 1.5 * holder["longest"]:
        result["stale_probe"] = stale_probe(run, run_eager, synchronize, hotfix, cls, holder, eager_outputs)
    set_state(False, hotfix, cls)
    torch._dynamo.reset()
    return result


def stale_probe(run, run_eager, synchronize, hotfix, cls, holder, eager_outputs):
    """Compiled with the hotfix removed, then apply() without a reset: which outputs the
    compiled step gives (the release's = the apply went unseen), before and after an eager call
    (which arms the gate where a repair is needed)."""
    probe = {}
    torch._dynamo.reset()
    holder["compiled"] = torch.compile(decode_step)
    set_state(False, hotfix, cls)
    run()
    synchronize()
    set_state(True, hotfix, cls)
    for label in ("after_apply", "after_an_eager_call"):
        if label == "after_an_eager_call":
            run_eager()
        before = dynamo_counts()
        try:
            got = run()
            synchronize()
            probe[label] = {
                "equal_to_eager_on": all_equal(got, eager_outputs["on"]),
                "equal_to_eager_off": all_equal(got, eager_outputs["off"]),
                "dynamo": delta(before, dynamo_counts()),
            }
        except Exception as error:
            probe[label] = {"error": "%s: %s" % (type(error).__name__, str(error)[:400])}
    return probe


def failure(error):
    return {"error": "%s: %s" % (type(error).__name__, str(error)[:600]), "trace": traceback.format_exc()[-2500:]}


def save(result):
    """The result so far under $OUT (a run cut short by its time limit still brings it back)."""
    if os.environ.get("OUT"):
        pathlib.Path(os.environ["OUT"], "decode_step_ab.json").write_text(json.dumps(result, indent=1))


class RecompileLimitHits(logging.Handler):
    """Dynamo's 'hit config.recompile_limit' warnings (the frame then runs uncompiled)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []
        logging.getLogger("torch._dynamo").addHandler(self)

    def emit(self, record):
        message = record.getMessage()
        if "recompile_limit" in message or "cache_size_limit" in message:
            self.messages.append(message.splitlines()[0][:200])

    def close(self):
        logging.getLogger("torch._dynamo").removeHandler(self)
        super().close()


def where_it_runs(dry_run):
    """(device, sizes, synchronize) of a run on the GPU, or of a dry run on the CPU."""
    if dry_run:
        return torch.device("cpu"), SIZES["dry"], (lambda: None)
    return torch.device("cuda"), SIZES["device"], torch.cuda.synchronize


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpu-dry-run", action="store_true")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--kv-write", action="store_true")
    parser.add_argument("--budget-s", type=float, default=240.0)
    parser.add_argument("--traceable-stand-in", action="store_true")
    options = parser.parse_args()
    dry_run = options.cpu_dry_run
    clock = Clock(options.budget_s)
    device, size, synchronize = where_it_runs(dry_run)
    backend_module, ForwardMode, _ = import_sglang()
    save_kv_cache, kv_write_note = options.kv_write and kv_write_importable(), None
    if options.kv_write and not save_kv_cache:
        kv_write_note = kv_write_importable.error
    kernel = use_kernel(backend_module, dry_run)
    stand_ins = []
    if dry_run:
        stand_ins.append("torch function for flashinfer's decode kernel")
        if not options.traceable_stand_in:
            # FlashInfer's kernel is a tvm-ffi call (its register_custom_op is a no-op): Dynamo
            # cannot trace it. The stand-in is made as opaque; --traceable-stand-in lets Dynamo in.
            stand_in = torch.compiler.disable(backend_module.flashinfer.decode.trtllm_batch_decode_with_kv_cache)
            backend_module.flashinfer.decode.trtllm_batch_decode_with_kv_cache = stand_in
            stand_ins[-1] += ", opaque to Dynamo (torch.compiler.disable)"
        if save_kv_cache:
            # SGLang's fused FP8 KV write is a Triton kernel (CUDA only): its own torch fallback here.
            backend_module.fused_fp8_set_kv_buffer = functools.partial(
                backend_module.fused_fp8_set_kv_buffer, use_triton=False
            )
            stand_ins.append("fused_fp8_set_kv_buffer with use_triton=False (SGLang's own torch path)")
    import sglang_hotfix_trtllm as hotfix

    cls = backend_module.TRTLLMHAAttnBackend
    hotfix.remove()  # a known start, whatever loaded the plugin before (a .pth, `run`)
    generator = torch.Generator().manual_seed(0)
    result = {
        "device": "cpu (dry run)" if dry_run else torch.cuda.get_device_name(),
        "capability": None if dry_run else list(torch.cuda.get_device_capability()),
        "torch": torch.__version__,
        "kernel": kernel,
        "stand_ins": stand_ins,
        "plugin": "%s %s" % (hotfix.__version__, os.path.dirname(hotfix.__file__)),
        "sglang_file": backend_module.__file__,
        "shape": dict(
            layers=LAYERS,
            batch=size["batch"],
            max_context=size["context"],
            q_heads=Q_HEADS,
            kv_heads=KV_HEADS,
            head_dim=HEAD_DIM,
            page_size=PAGE_SIZE,
            query="strided view of qkv.split",
            save_kv_cache=save_kv_cache,
            kv_write_unavailable=kv_write_note,
        ),
        "plan": {k: size[k] for k in ("blocks", "steps", "after_switch", "warmup", "cblocks", "csteps")},
        "cases": {},
    }
    cases = {}
    for name in CASES:
        case = cases[name] = build_case(backend_module, ForwardMode, name, device, size, generator)
        case.step_args = (case.backend, case.layers, case.inputs, case.forward_batch, save_kv_cache)
        case.run_eager = functools.partial(decode_step, *case.step_args)
        result["shape"].setdefault("seq_lens", {})[name] = {
            "min": int(case.forward_batch.seq_lens_cpu.min()),
            "median": int(case.forward_batch.seq_lens_cpu.median()),
            "max": int(case.forward_batch.seq_lens_cpu.max()),
        }
        result["shape"]["xqa"] = bool(case.backend.is_xqa_impl)

    # Eager first, both cases (cheap); then torch.compile, each case within its share of the budget.
    for name, case in cases.items():
        started = time.perf_counter()
        try:
            eager, case.outputs = eager_case(case, case.run_eager, synchronize, hotfix, cls, backend_module, size)
        except Exception as error:
            eager, case.outputs = failure(error), None
        eager["seconds"] = round(time.perf_counter() - started, 1)
        result["cases"][name] = {"eager": eager}
        print("eager %s: %s" % (name, json.dumps(eager.get("timing", eager))), flush=True)
        save(result)
    for index, (name, case) in enumerate(cases.items()):
        if options.no_compile or case.outputs is None:
            continue
        share = Clock(max(clock.left(), 0) / (len(cases) - index))
        started = time.perf_counter()
        limit_hits = RecompileLimitHits()
        try:
            compiled = compiled_case(
                case, case.run_eager, case.step_args, synchronize, hotfix, cls, size, case.outputs, share
            )
        except Exception as error:
            compiled = failure(error)
        finally:
            limit_hits.close()
        compiled["recompile_limit_hits"] = limit_hits.messages
        compiled["seconds"] = round(time.perf_counter() - started, 1)
        result["cases"][name]["compiled"] = compiled
        print("compiled %s: %s" % (name, json.dumps(compiled)[:3000]), flush=True)
        hotfix.remove()
        save(result)
    result["wall_seconds"] = round(time.perf_counter() - clock.start, 1)
    summary = {}
    for name, case in result["cases"].items():
        for kind in ("eager", "compiled"):
            timing = case.get(kind, {}).get("timing", {})
            if "on_median_us" in timing:
                summary["%s_%s" % (name, kind)] = (
                    "step on %.1f / off %.1f us: %+.1f us (%+.2f%%); paired %+.1f us (%+.2f%%, %+.2f us per call)"
                    % (
                        timing["on_median_us"],
                        timing["off_median_us"],
                        timing["difference_us"],
                        timing["difference_percent_of_step"],
                        timing["paired_median_difference_us"],
                        timing["paired_median_percent_of_step"],
                        timing["per_layer_call_paired_us"],
                    )
                )
    result["summary"] = summary
    save(result)
    print("RESULT:" + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
