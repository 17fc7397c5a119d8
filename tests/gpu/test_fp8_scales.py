"""Record pr28144 on the real TRT-LLM kernels: SGLang 0.5.12's forward_decode and forward_extend
(target verify) over FP8 and BF16 KV caches written by SGLang's own pool (skipped without a CUDA
device or without flashinfer).

Runs tests/gpu/fp8_scales_worker.py in fresh processes, with the record turned off by name
(SGLANG_HOTFIX_TRTLLM_DISABLE=pr28144) and with it active (under `sglang-hotfix-trtllm run`,
see docs/gpu.md).

The tolerance is the kernel's own floor, measured in the same run: the same kernel on the same
cache layout with unit scales (FP8) or no scales (BF16), against the same fp32 attention over the
de-quantized cache. K and V are drawn alike in every case and the pool divides them by the scale
it stores them with, so the de-quantized values, and the outputs, have the same magnitudes with
or without scales: an exact repair errs as the floor does. A quarter's margin covers the other
random values of each case (the floor's largest error over 16 rows); never below the bf16
tolerance of the other GPU proofs. A wrong scale errs by the size of the outputs: ten times that
tolerance and more.
"""

import pathlib

import pytest

from worker_output import run_worker

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
if torch.cuda.is_available():
    pytest.importorskip("flashinfer")

WORKER = pathlib.Path(__file__).with_name("fp8_scales_worker.py")
MARGIN = 1.25
# The BF16 floor is rounding noise (about 0.002 here): there the other GPU proofs' bf16 tolerance
# holds (docs/gpu.md: the weights and the output rounded to bf16), far below a wrong scale's error.
BF16_TOLERANCE = 0.02


def run(disabled):
    name = "fp8-scales-%s" % ("unpatched" if disabled else "patched")
    return run_worker(WORKER, name, disabled="pr28144" if disabled else None)


@pytest.fixture(scope="module")
def unpatched():
    return run(disabled=True)


@pytest.fixture(scope="module")
def patched():
    return run(disabled=False)


def error(result, case):
    outcome = result["cases"][case]
    assert "error" not in outcome, outcome
    assert outcome["nan_rows"] == 0, outcome
    return outcome["max_abs_error"]


def test_the_real_kernel_runs_and_the_record_is_on_only_when_asked(unpatched, patched):
    assert unpatched["kernel"].startswith("flashinfer") and patched["kernel"].startswith("flashinfer")
    assert unpatched["patched"] is False and patched["patched"] is True


def within(result, case, floor_case):
    """(largest error, rows beyond the tolerance, tolerance) of one case against its floor."""
    tolerance = max(error(result, floor_case) * MARGIN, BF16_TOLERANCE)
    outcome = result["cases"][case]
    return error(result, case), sum(e > tolerance for e in outcome["errors"]), tolerance


def test_fp8_cache_with_a_v_scale_is_wrong_unpatched_and_at_the_fp8_floor_patched(unpatched, patched):
    largest, wrong, tolerance = within(patched, "fp8_scaled_decode", "fp8_unit_decode")
    assert wrong == 0 and largest <= tolerance
    largest, wrong, tolerance = within(unpatched, "fp8_scaled_decode", "fp8_unit_decode")
    assert largest > 10 * tolerance and wrong > patched["shape"]["batch"] // 2


def test_bf16_cache_under_a_checkpoint_k_scale_is_wrong_unpatched_and_at_the_bf16_floor_patched(unpatched, patched):
    largest, wrong, tolerance = within(patched, "bf16_checkpoint_scales_decode", "bf16_unscaled_decode")
    assert wrong == 0 and largest <= tolerance
    largest, wrong, tolerance = within(unpatched, "bf16_checkpoint_scales_decode", "bf16_unscaled_decode")
    assert largest > 10 * tolerance and wrong > patched["shape"]["batch"] // 2


def test_target_verify_on_xqa_fails_in_flashinfer_both_ways_as_upstreams_call_fails(unpatched, patched):
    """SGLang 0.5.12's forward_extend reaches XQA for target verify only when trtllm_mha serves
    extend on Hopper: as released it passes an FP8 query with a BF16 output, which XQA rejects;
    with upstream's arguments (0.5.15 keeps the BF16 query there) XQA asks for the
    speculative-decoding mask SGLang does not pass. Since 0.6.0 the hotfix's call raises what
    upstream's call raises (0.5.0 called the kernel again with the release's arguments)."""
    for case in ("fp8_scaled_target_verify", "fp8_unit_target_verify"):
        assert "Output and query must have the same dtype" in unpatched["cases"][case]["error"]
        assert "Mask is required for speculative decoding" in patched["cases"][case]["error"]
    assert not any("not repairing" in line for line in patched["hotfix_lines"] + unpatched["hotfix_lines"])
