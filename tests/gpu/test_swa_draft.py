"""Record pr25103 on the real TRT-LLM decode kernel: an EAGLE3 draft's decode on
a sliding-window target (skipped without a CUDA device or without flashinfer).

Runs tests/gpu/swa_draft_worker.py in fresh processes, with the record turned
off by name (SGLANG_HOTFIX_TRTLLM_DISABLE=pr25103) and with it active (under
`sglang-hotfix-trtllm run`, see docs/gpu.md).
"""

import pathlib

import pytest

from worker_output import run_worker

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
if torch.cuda.is_available():
    pytest.importorskip("flashinfer")

WORKER = pathlib.Path(__file__).with_name("swa_draft_worker.py")


def run(disabled):
    name = "swa-draft-%s" % ("unpatched" if disabled else "patched")
    return run_worker(WORKER, name, disabled="pr25103" if disabled else None)


@pytest.fixture(scope="module")
def unpatched():
    return run(disabled=True)


@pytest.fixture(scope="module")
def patched():
    return run(disabled=False)


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
