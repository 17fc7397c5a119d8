"""The fix under real CUDA-graph capture and replay (skipped without a CUDA device).

Runs tests/gpu/cuda_graph_worker.py twice in fresh processes: with the hotfix
disabled (SGLANG_HOTFIX_TRTLLM_DISABLE=1) and with it active. See docs/gpu.md
for how it is run on a GPU machine and what it gave.
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

WORKER = pathlib.Path(__file__).with_name("cuda_graph_worker.py")


def run_worker(disabled):
    env = {k: v for k, v in os.environ.items() if k != "SGLANG_HOTFIX_TRTLLM_DISABLE"}
    if disabled:
        env["SGLANG_HOTFIX_TRTLLM_DISABLE"] = "1"
    ran = subprocess.run([sys.executable, str(WORKER)], capture_output=True, text=True, env=env, timeout=1200)
    lines = [l for l in ran.stdout.splitlines() if l.startswith("RESULT:")]
    assert ran.returncode == 0 and lines, ran.stdout[-4000:] + ran.stderr[-4000:]
    result = json.loads(lines[-1][len("RESULT:"):])
    out = os.environ.get("OUT")
    if out:
        pathlib.Path(out, "gpu-%s.json" % ("unpatched" if disabled else "patched")).write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return result


@pytest.fixture(scope="module")
def unpatched():
    return run_worker(disabled=True)


@pytest.fixture(scope="module")
def patched():
    return run_worker(disabled=False)


def test_without_the_hotfix_the_warmup_attends_over_nothing_and_gives_nan(unpatched):
    assert unpatched["patched"] is False
    assert unpatched["warmup_rows"] > 0
    assert unpatched["warmup_nan_rows"] == unpatched["warmup_rows"]


def test_with_the_hotfix_no_nan_anywhere(patched):
    assert patched["patched"] is True
    assert patched["warmup_nan_rows"] == 0
    assert patched["replays_with_nan"] == 0


def test_with_the_hotfix_every_replay_matches_the_reference(patched):
    assert patched["replays"] >= 1000
    assert patched["max_abs_error"] < 1e-4
