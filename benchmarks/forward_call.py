"""What pr28144 adds to one call of SGLang's own ``forward_decode``, on CPU (issue 28, item 7).

SGLang 0.5.12's real method (the installed SGLang's file, compiled as the tests compile a
release: ``tests/support/fp8_cases.py``), a fake ``self`` with real tensors, FlashInfer's kernel
replaced by a stand-in that returns a preallocated tensor (so the figure is Python's, not a
kernel's). Interleaved in one process: each round times ``CALLS`` calls with the hotfix removed
and ``CALLS`` with it applied, in alternating order, then the medians over rounds are compared.

    .venv/bin/python benchmarks/forward_call.py [--rounds 200] [--calls 200]

Cases: a BF16 cache without K scales and an FP8 cache without scales (nothing to repair: the
common users), and an FP8 cache with K/V scales on XQA (repaired). Each on a strided query
(``qkv.split``), decode batch of 2.
"""

import argparse
import pathlib
import statistics
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "tests"), str(HERE.parent / "tests" / "support"), str(HERE.parent / "tools")]

import torch  # noqa: E402

import fp8_cases  # noqa: E402
import release_selection  # noqa: E402
from sglang_hotfix_trtllm import detect, patch  # noqa: E402
from sglang_hotfix_trtllm.records import pr28144  # noqa: E402

RELEASE = "0.5.12"
CASES = {
    "bf16, no scales (no repair)": "bf16-absent-xqa-no-write-decode-strided",
    "fp8, no scales (no repair)": "fp8-absent-xqa-no-write-decode-strided",
    "fp8 with K/V scales, XQA (repaired)": "fp8-float-xqa-no-write-decode-strided",
}


def _time(call, calls):
    call()  # the first call after apply arms the gate: not timed
    started = time.perf_counter_ns()
    for _ in range(calls):
        call()
    return (time.perf_counter_ns() - started) / calls / 1000.0


def measure(rounds, calls):
    module = fp8_cases.load_backend_module(release_selection.release_dir(RELEASE))
    cases = fp8_cases.cases(RELEASE)
    out = torch.zeros(2, fp8_cases.Q_HEADS, fp8_cases.HEAD_DIM, dtype=torch.bfloat16)
    module.flashinfer = fp8_cases.flashinfer_of(lambda **kwargs: out)
    assessment = detect.assess_module(pr28144.HOTFIX, module)
    results = {}
    for label, name in CASES.items():
        call = fp8_cases.decode_call(module, cases[name])
        times = {"off": [], "on": []}
        for round_ in range(rounds):
            for state in ("off", "on") if round_ % 2 == 0 else ("on", "off"):
                if state == "on":
                    patch.wrap(pr28144.HOTFIX, module, assessment)
                times[state].append(_time(call, calls))
                if state == "on":
                    patch.remove_all()
        off, on = statistics.median(times["off"]), statistics.median(times["on"])
        paired = statistics.median(b - a for a, b in zip(times["off"], times["on"]))
        results[label] = (off, on, paired)
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--calls", type=int, default=200)
    arguments = parser.parse_args(argv)
    import logging

    logging.getLogger("sglang_hotfix_trtllm").setLevel(logging.WARNING)  # apply/remove lines, once per round
    print(
        "SGLang %s forward_decode on CPU, %d rounds x %d calls, interleaved"
        % (RELEASE, arguments.rounds, arguments.calls)
    )
    print("| call | SGLang alone (µs) | hotfix applied (µs) | added, median of paired rounds (µs) |")
    print("|---|---|---|---|")
    for label, (off, on, paired) in measure(arguments.rounds, arguments.calls).items():
        print("| %s | %.2f | %.2f | %+.2f |" % (label, off, on, paired))


if __name__ == "__main__":
    main()
