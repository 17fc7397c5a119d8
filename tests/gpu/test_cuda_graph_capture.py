"""The fix on the real TRT-LLM decode kernel under CUDA-graph capture and replay
(skipped without a CUDA device or without flashinfer).

Runs tests/gpu/cuda_graph_worker.py in fresh processes: with the hotfix
disabled (SGLANG_HOTFIX_TRTLLM_DISABLE=1) and with it active (loaded by its own
startup path: run this under `sglang-hotfix-trtllm run`, see docs/gpu.md), each
once for the figures and once more for SGLang's own NaN check, which ends the
process with a device-side assert when it fires.
"""

import os
import pathlib
import subprocess
import sys

import pytest

from worker_output import result_of

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
if torch.cuda.is_available():
    pytest.importorskip("flashinfer")

WORKER = pathlib.Path(__file__).with_name("cuda_graph_worker.py")


def run_worker(disabled, *flags):
    env = {
        k: v for k, v in os.environ.items() if k not in ("SGLANG_HOTFIX_TRTLLM_DISABLE", "SGLANG_SPEC_NAN_DETECTION")
    }
    env["PYTHONUNBUFFERED"] = "1"
    if disabled:
        env["SGLANG_HOTFIX_TRTLLM_DISABLE"] = "1"
    if "--nan-check" in flags:
        env["SGLANG_SPEC_NAN_DETECTION"] = "1"
    ran = subprocess.run(
        [sys.executable, str(WORKER)] + list(flags), capture_output=True, text=True, env=env, timeout=900
    )
    return ran, result_of("gpu-%s%s" % ("unpatched" if disabled else "patched", "-nan-check" if flags else ""), ran)


@pytest.fixture(scope="module")
def unpatched():
    ran, result = run_worker(disabled=True)
    assert ran.returncode == 0 and result, ran.stdout[-4000:] + ran.stderr[-4000:]
    return result


@pytest.fixture(scope="module")
def patched():
    ran, result = run_worker(disabled=False)
    assert ran.returncode == 0 and result, ran.stdout[-4000:] + ran.stderr[-4000:]
    return result


def test_the_real_kernel_runs(unpatched, patched):
    for result in (unpatched, patched):
        assert result["kernel"].startswith("flashinfer") and result["xqa"] is (
            torch.cuda.get_device_capability()[0] in (9, 12)
        )


def test_without_the_hotfix_every_warmup_row_is_wrong_and_some_are_nan(unpatched):
    assert unpatched["patched"] is False
    assert unpatched["warmup_rows"] == 189
    assert unpatched["warmup_wrong_rows"] == unpatched["warmup_rows"]
    assert unpatched["warmup_nan_rows"] > 0


def test_with_the_hotfix_every_warmup_row_is_right(patched):
    assert patched["patched"] is True
    assert patched["warmup_wrong_rows"] == 0 and patched["warmup_nan_rows"] == 0
    assert patched["warmup_max_error_finite_rows"] <= patched["tolerance"]


def test_replays_match_the_fp32_reference_either_way(unpatched, patched):
    # The bug is capture-only: SGLang's replay method always wrote the lengths.
    for result in (unpatched, patched):
        assert result["replays"] == 600 and result["replays_with_nan"] == 0
        assert result["replay_max_abs_error"] <= result["tolerance"]


def test_sglangs_own_nan_check_fires_without_the_hotfix_and_not_with_it():
    ran, _ = run_worker(True, "--nan-check")
    assert ran.returncode != 0 and "NaN detected! draft_forward step" in ran.stdout + ran.stderr
    ran, result = run_worker(False, "--nan-check")
    assert ran.returncode == 0 and result == {"nan_check": "passed", "batch_sizes": 6, "patched": True}, ran.stderr[
        -3000:
    ]
