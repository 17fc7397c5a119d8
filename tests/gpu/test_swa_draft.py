"""Record pr25103 on the real TRT-LLM decode kernel: an EAGLE3 draft's decode on
a sliding-window target (skipped without a CUDA device or without flashinfer).

Runs tests/gpu/swa_draft_worker.py in fresh processes, with the record turned
off by name (SGLANG_HOTFIX_TRTLLM_DISABLE=pr25103) and with it active (under
`sglang-hotfix-trtllm run`, see docs/gpu.md).
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

WORKER = pathlib.Path(__file__).with_name("swa_draft_worker.py")


def run_worker(disabled):
    env = {k: v for k, v in os.environ.items() if k != "SGLANG_HOTFIX_TRTLLM_DISABLE"}
    env["PYTHONUNBUFFERED"] = "1"
    if disabled:
        env["SGLANG_HOTFIX_TRTLLM_DISABLE"] = "pr25103"
    ran = subprocess.run([sys.executable, str(WORKER)], capture_output=True, text=True, env=env, timeout=900)
    result = result_of("swa-draft-%s" % ("unpatched" if disabled else "patched"), ran)
    assert ran.returncode == 0 and result, ran.stdout[-4000:] + ran.stderr[-4000:]
    return result


@pytest.fixture(scope="module")
def unpatched():
    return run_worker(disabled=True)


@pytest.fixture(scope="module")
def patched():
    return run_worker(disabled=False)


def test_the_real_kernel_runs(unpatched, patched):
    for result in (unpatched, patched):
        assert result["kernel"].startswith("flashinfer") and result["xqa"] is (
            torch.cuda.get_device_capability()[0] in (9, 12)
        )


def test_without_the_record_the_draft_reads_through_the_targets_mapping(unpatched):
    assert unpatched["patched"] is False
    assert unpatched["swa_kv_pool"] == "SWAKVPool" and unpatched["swa_page_table_used"]
    assert unpatched["wrong_rows"] > unpatched["rows"] // 2


def test_with_the_record_the_draft_reads_its_own_kv(patched):
    assert patched["patched"] is True
    assert patched["swa_kv_pool"] == "NoneType" and not patched["swa_page_table_used"]
    assert patched["wrong_rows"] == 0 and patched["nan_rows"] == 0
    assert patched["max_abs_error"] <= patched["tolerance"]
