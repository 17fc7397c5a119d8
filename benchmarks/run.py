"""Benchmarks of sglang-hotfix-trtllm: what the hotfix costs, side by side.

    .venv/bin/python benchmarks/run.py [--quick] [--json OUT]

Run it with the test environment's Python (the README's set-up command): it
needs the plugin, SGLang 0.5.12 and torch installed there. Each figure is a
ratio or difference measured in one run, medians over repeated runs:

1. Interpreter start (``python -c pass``) with the plugin installed against
   the same environment without it: fresh venvs that differ only by the
   plugin's wheel, installed four ways (pip, pip --no-compile, uv, uv
   --compile-bytecode; the uv rows need ``python -m uv``). Counted in
   instructions with callgrind (repeatable to about 0.2%) and in wall time
   (noisier). For scale, a venv whose .pth imports wrapt, and the floors of
   other start-up designs (``FLOORS``).
2. Added cost when SGLang's backend module is first imported: finding the
   source, deciding the verdict and wrapping, in fresh processes.
3. The patched capture call against the upstream-fixed function on the same
   inputs (CPU), and the replay method, which the hotfix does not wrap.
4. ``sglang-hotfix-trtllm status`` wall time.
"""

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "tests" / "support"))


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_") and k != "PYTHONPATH"}
    env.update(extra)
    return env


def callgrind_instructions(python, runs=3):
    counts = []
    for _ in range(runs):
        out = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", python, "-c", "pass"],
                             capture_output=True, text=True, env=clean_env()).stderr
        line = next(l for l in out.splitlines() if "refs:" in l)
        counts.append(int(line.split()[-1].replace(",", "")))
    return statistics.median(counts)


def wall_starts(pythons, runs):
    """Median wall time of `python -c pass` per interpreter, interleaved, the
    order rotated every round so that none always runs first."""
    times = {p: [] for p in pythons}
    for round_ in range(runs):
        shift = round_ % len(pythons)
        for python in pythons[shift:] + pythons[:shift]:
            start = time.perf_counter()
            subprocess.run([python, "-c", "pass"], env=clean_env())
            times[python].append(time.perf_counter() - start)
    return {p: statistics.median(t) for p, t in times.items()}


def build_wheel(folder):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(folder), str(REPO)],
                   check=True)
    return next(pathlib.Path(folder).glob("sglang_hotfix_trtllm-*.whl"))


def make_venv(folder, *install, installer="pip"):
    """A fresh venv, with ``install`` installed by ``installer``: "pip" (which
    byte-compiles what it installs), "pip --no-compile", "uv" (which writes no
    bytecode by default) or "uv --compile-bytecode"."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = str(pathlib.Path(folder) / "bin" / "python")
    if install:
        tool, *flags = installer.split()
        command = ([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps"] if tool == "pip"
                   else [sys.executable, "-m", "uv", "pip", "install", "-q", "--no-deps", "--python", python])
        subprocess.run(command + flags + list(install), check=True)
    return python


def have_uv():
    return subprocess.run([sys.executable, "-m", "uv", "--version"], capture_output=True).returncode == 0


INSTALLERS = ("pip", "pip --no-compile", "uv", "uv --compile-bytecode")

# For scale, the floors of other start-up designs (README, Costs): files put in
# an otherwise bare venv. A tiny top-level module that arms a finder, imported
# from its bytecode, bare or behind the smallest guard that keeps a missing or
# broken module off stdout (an exec'd try, compiled at every start).
TINY_FINDER = """import sys
def find_spec(name, path=None, target=None):
    if name != 'sglang.srt.layers.attention.trtllm_mha_backend':
        return None
    from sglang_hotfix_trtllm_autoload import find_spec as real
    return real(name, path, target)
find_spec.find_spec = find_spec
sys.meta_path.insert(0, find_spec)
"""
FLOORS = {
    "floor: a .pth holding only `import sys`": {"floor.pth": "import sys\n"},
    "floor: a .pth importing a tiny finder module (bytecode), unguarded": {
        "floor.pth": "import tiny_finder\n", "tiny_finder.py": TINY_FINDER},
    "floor: the same behind an exec'd try": {
        "floor.pth": 'import sys;exec("try:import tiny_finder\\nexcept Exception:pass")\n', "tiny_finder.py": TINY_FINDER},
}


def site_packages(python):
    return subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()


def startup(work, wall_runs):
    """Start-up cost of the plugin installed each way, side by side in one run,
    against the same bare venv; plus, for scale, a .pth that imports wrapt."""
    wheel = build_wheel(work / "wheel")
    base = make_venv(work / "base")
    venvs = {"base": base}
    for number, installer in enumerate(INSTALLERS):
        if installer.startswith("uv") and not have_uv():
            continue  # `pip install uv` into the benchmark's environment to measure these
        venvs[installer] = make_venv(work / ("plugin%d" % number), str(wheel), installer=installer)
    wrapt_env = make_venv(work / "wrapt", "wrapt")
    pathlib.Path(site_packages(wrapt_env), "import_wrapt.pth").write_text("import wrapt\n")
    venvs["a .pth importing wrapt"] = wrapt_env
    for number, (name, files) in enumerate(FLOORS.items()):
        python = make_venv(work / ("floor%d" % number))
        for file_name, text in files.items():
            pathlib.Path(site_packages(python), file_name).write_text(text)
        if "tiny_finder.py" in files:  # as pip would, byte-compile what it installs
            subprocess.run([python, "-c", "import py_compile, sys; py_compile.compile(sys.argv[1], doraise=True)",
                            os.path.join(site_packages(python), "tiny_finder.py")], check=True)
        venvs[name] = python
    result = {"pythondontwritebytecode": os.environ.get("PYTHONDONTWRITEBYTECODE")}
    if shutil.which("valgrind"):
        counts = {name: callgrind_instructions(python) for name, python in venvs.items()}
        result["instructions"] = counts
        result["instructions_ratio"] = {name: counts[name] / counts["base"] for name in counts if name != "base"}
    walls = wall_starts(list(venvs.values()), wall_runs)
    result["wall_median_ms"] = {name: walls[python] * 1e3 for name, python in venvs.items()}
    result["wall_ratio"] = {name: walls[python] / walls[base] for name, python in venvs.items() if name != "base"}
    return result


PATCH_COST = r"""
import os, sys, time, json
# Started with SGLANG_HOTFIX_TRTLLM_DISABLE=1: the startup module stood aside.
import sglang.srt.layers.attention.trtllm_mha_backend as backend
del os.environ["SGLANG_HOTFIX_TRTLLM_DISABLE"]
import sglang_hotfix_trtllm_autoload as autoload
start = time.perf_counter()
autoload.install()   # the module is already imported: locate, verdict, wrap, log now
elapsed = time.perf_counter() - start
kind = type(backend.TRTLLMHAAttnBackend.__dict__["init_forward_metadata_capture_cuda_graph"]).__name__
print("RESULT:" + json.dumps({"seconds": elapsed, "wrapped": kind}))
"""


def patch_cost(processes):
    samples = []
    for _ in range(processes):
        out = subprocess.run([sys.executable, "-c", PATCH_COST], capture_output=True, text=True,
                             env=clean_env(SGLANG_HOTFIX_TRTLLM_DISABLE="1"), check=True).stdout
        result = json.loads(next(l for l in out.splitlines() if l.startswith("RESULT:"))[7:])
        assert result["wrapped"] == "HotfixWrapper", result
        samples.append(result["seconds"])
    return {"median_ms": statistics.median(samples) * 1e3, "max_ms": max(samples) * 1e3, "processes": processes}


CALL_COST = r"""
import json, statistics, sys, time
sys.path.insert(0, sys.argv[1])
import torch
import sglang.srt.layers.attention.trtllm_mha_backend as backend
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from capture_harness import SPEC_INFO, make_backend
from upstream_fix import upstream_fixed_method

cls = backend.TRTLLMHAAttnBackend
assert type(cls.__dict__["init_forward_metadata_capture_cuda_graph"]).__name__ == "HotfixWrapper"
upstream = upstream_fixed_method(backend)
bs, rounds, calls = 8, int(sys.argv[2]), 200
seq_lens = torch.randint(1, 200, (bs,))
req = torch.arange(bs)
patched_backend, upstream_backend = make_backend(cls, 1), make_backend(cls, 1)

def patched():
    patched_backend.init_forward_metadata_capture_cuda_graph(bs, bs, req, seq_lens, encoder_lens=None, forward_mode=ForwardMode.DECODE, spec_info=SPEC_INFO)

def fixed():
    upstream(upstream_backend, bs, bs, req, seq_lens, encoder_lens=None, forward_mode=ForwardMode.DECODE, spec_info=SPEC_INFO)

replay = cls.__dict__["init_forward_metadata_replay_cuda_graph"]
for b in (patched_backend, upstream_backend):
    b.req_to_token = torch.arange(bs * 512, dtype=torch.int32).reshape(bs, 512)

def replay_patched_env():
    patched_backend.init_forward_metadata_replay_cuda_graph(bs, req, seq_lens, int(seq_lens.sum()), None, ForwardMode.DECODE, SPEC_INFO, seq_lens)

def replay_plain():
    replay(upstream_backend, bs, req, seq_lens, int(seq_lens.sum()), None, ForwardMode.DECODE, SPEC_INFO, seq_lens)

def per_call(fn):
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls

timings = {name: [] for name in ("patched", "upstream", "replay_patched_env", "replay_plain")}
for fn in (patched, fixed, replay_patched_env, replay_plain):
    fn()
for _ in range(rounds):
    timings["patched"].append(per_call(patched))
    timings["upstream"].append(per_call(fixed))
    timings["replay_patched_env"].append(per_call(replay_patched_env))
    timings["replay_plain"].append(per_call(replay_plain))
medians = {k: statistics.median(v) for k, v in timings.items()}
print("RESULT:" + json.dumps({"median_us": {k: v * 1e6 for k, v in medians.items()},
      "capture_ratio": medians["patched"] / medians["upstream"],
      "replay_ratio": medians["replay_patched_env"] / medians["replay_plain"],
      "replay_is_sglangs_function": cls.__dict__["init_forward_metadata_replay_cuda_graph"] is replay and not hasattr(replay, "__wrapped__")}))
"""


def call_cost(rounds):
    out = subprocess.run([sys.executable, "-c", CALL_COST, str(REPO / "tests" / "support"), str(rounds)], capture_output=True,
                         text=True, env=clean_env(), check=True).stdout
    return json.loads(next(l for l in out.splitlines() if l.startswith("RESULT:"))[7:])


def status_cost(runs):
    cli = shutil.which("sglang-hotfix-trtllm", path=os.path.dirname(sys.executable))
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([cli, "status", "--json"], capture_output=True, env=clean_env(), check=True)
        times.append(time.perf_counter() - start)
    return {"median_s": statistics.median(times), "max_s": max(times), "runs": runs}


def main(argv=None):
    parser = argparse.ArgumentParser(description="sglang-hotfix-trtllm benchmarks")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--json", help="also write the figures to this file")
    arguments = parser.parse_args(argv)
    scale = 1 if arguments.quick else 4
    with tempfile.TemporaryDirectory() as work:
        figures = {
            "python": sys.version.split()[0],
            "startup": startup(pathlib.Path(work), wall_runs=50 * scale),
            "patch_on_first_import": patch_cost(processes=2 * scale),
            "capture_call": call_cost(rounds=5 * scale),
            "status": status_cost(runs=5 * scale),
        }
    print(json.dumps(figures, indent=2))
    if arguments.json:
        pathlib.Path(arguments.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
