"""Record xqa_workspace on the real kernels: SGLang 0.5.19's own backend methods with FlashInfer's
fmha_v2 prefill and XQA decode on an SM90 GPU (skipped without a CUDA device or without flashinfer).

Runs tests/gpu/workspace_worker.py in three fresh processes: the release as shipped, the release
with the record applied, and the oracle (0.5.23's change inserted in the release's code). In each,
a prefill through ``forward_extend`` and then decodes at batch 1 to 16 over contexts of 2 to 8 k
tokens through ``forward_decode``, each compared with the same kernel on a fresh zeroed workspace.

Measured (docs/gpu.md, H200, FlashInfer 0.6.18): as shipped, fmha_v2 leaves a counter in the
workspace's first word (1156 after this prefill), the first multi-block XQA decode after it gets
request 0 / KV head 0 wrong, and later calls, which meet what XQA made of that word, stay wrong at
some of batch 1 to 8; batch 16 (single-block) never. With the record, as with 0.5.23, the workspace
is 8 MiB larger, fmha_v2 writes from 8 MiB on, XQA's semaphores stay zero and every row equals the
kernel on a fresh workspace; the record's outputs equal the oracle's bit for bit. Needs SGLang
0.5.19's files (tools/workspace_carry.py on the device, the release cache here) and FlashInfer
0.6.18 (the pin of 0.5.19).
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

WORKER = pathlib.Path(__file__).with_name("workspace_worker.py")
MIB = 1024 * 1024
MULTI_BLOCK = ("1", "2", "4", "8")  # batch sizes XQA splits over several blocks at these contexts
BATCH_SIZES = MULTI_BLOCK + ("16",)
TOLERANCE = 0.02  # bf16, as the other GPU proofs (docs/gpu.md)


def run_arm(arm):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("SGLANG_HOTFIX_TRTLLM_DISABLE", None)
    ran = subprocess.run(
        [sys.executable, str(WORKER), "--arm", arm],
        capture_output=True,
        text=True,
        env=env,
        timeout=int(os.environ.get("WORKSPACE_ARM_TIMEOUT", "900")),
    )
    result = result_of("workspace-" + arm, ran)
    assert ran.returncode == 0 and result and "error" not in result, ran.stdout[-4000:] + ran.stderr[-4000:]
    return result


@pytest.fixture(scope="module")
def arms():
    return {arm: run_arm(arm) for arm in ("release", "record", "oracle")}


def decodes(result):
    """Every decode after the prefill: the target's two rounds and the draft's."""
    return result["after_prefill"] + [result["after_prefill_draft"]]


def test_the_real_kernels_run_and_the_record_is_applied_only_in_its_arm(arms):
    for arm, result in arms.items():
        assert result["kernel"].startswith("flashinfer"), arm
        assert result["init_on_class"] == "function", arm
        assert result["init_runs_the_hotfix_compile"] == (arm == "record"), arm
    assert arms["record"]["verdict"].startswith("affected") and arms["record"]["wrapped"] == "wrapped"


def test_both_kernels_read_sglangs_pool_as_fp32_attention_does(arms):
    """fmha_v2 through the release's NHD view, XQA through its HND view (on a fresh workspace)."""
    for arm, result in arms.items():
        assert result["prefill"]["max_error_vs_fp32"] <= TOLERANCE, arm
        assert max(result["fresh_vs_fp32"].values()) <= TOLERANCE, arm


def test_before_any_prefill_every_arm_decodes_as_on_a_fresh_workspace(arms):
    for arm, result in arms.items():
        assert result["workspace_after_first_decodes"]["nonzero_bytes_first_8mib"] == 0, arm
        for bs in BATCH_SIZES:
            assert result["before_prefill"][bs]["rows_not_bitwise"] == 0, (arm, bs)


def test_as_shipped_fmha_v2_leaves_a_counter_and_multi_block_xqa_rows_are_wrong(arms):
    """The first decode after the prefill meets fmha_v2's counter; later calls meet what XQA made of
    it (the word changes from call to call), so which batch sizes are wrong varies by round: each
    multi-block batch size is wrong at least once, only ever request 0 / KV head 0, and batch 16
    (single-block) never."""
    release = arms["release"]
    assert release["workspace"]["shared_bytes"] == release["workspace"]["workspace_size"] == 512 * MIB
    assert release["workspace_after_prefill"]["first_word"] != 0
    rounds = decodes(release)
    assert rounds[0]["1"]["rows_wrong"] > 0
    for bs in MULTI_BLOCK:
        assert any(round_[bs]["rows_wrong"] > 0 for round_ in rounds), bs
    for round_ in rounds:
        assert any(round_[bs]["rows_wrong"] > 0 for bs in MULTI_BLOCK)
        assert round_["16"]["rows_wrong"] == 0
        for bs in BATCH_SIZES:
            assert round_[bs]["wrong_request_kv_head"] in ([], [[0, 0]]), bs


def test_with_the_record_as_with_0_5_23_the_semaphores_stay_zero_and_no_row_is_wrong(arms):
    for arm in ("record", "oracle"):
        result = arms[arm]
        workspace = result["workspace"]
        assert workspace["shared_bytes"] == workspace["workspace_size"] + 8 * MIB == 520 * MIB, arm
        assert workspace["target_is_shared"] and workspace["draft_is_shared"], arm
        view = workspace["fmha_v2_view_" + arm]
        assert view == {"bytes": 512 * MIB, "offset": 8 * MIB, "same_storage": True}, arm
        assert result["workspace_after_prefill"]["nonzero_bytes_first_8mib"] == 0, arm
        assert result["workspace_at_end"]["nonzero_bytes_first_8mib"] == 0, arm
        for round_ in decodes(result):
            for bs in BATCH_SIZES:
                assert round_[bs]["rows_wrong"] == 0 and round_[bs]["rows_not_bitwise"] == 0, (arm, bs)


def test_the_record_equals_the_oracle_bit_for_bit(arms):
    record, oracle = arms["record"], arms["oracle"]
    assert record["prefill"]["sha256"] == oracle["prefill"]["sha256"]
    for mine, theirs in zip(decodes(record), decodes(oracle)):
        assert {bs: v["sha256"] for bs, v in mine.items()} == {bs: v["sha256"] for bs, v in theirs.items()}
    assert record["workspace_after_prefill"] == oracle["workspace_after_prefill"]
