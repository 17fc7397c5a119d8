"""The seventh record, xqa_workspace: fmha_v2 prefill and XQA decode no longer share XQA's
semaphores (SGLang 0.5.23), for the releases with the bug, 0.5.19 to 0.5.22.

Verdicts: every release of the shipped table from its own source, hand-made variants refused.
Differential (``workspace_cases``): each affected release's own ``__init__``, ``forward_extend``
and ``forward_decode`` (compiled from its file), a target and a draft backend in one process,
prefill then decode then prefill again, against the oracle: the same release with 0.5.23's change
inserted by AST. What each kernel receives as its workspace is compared in size, dtype, strides,
offset into the process's one shared workspace and whose memory it is, with whether XQA's first
8 MiB were zero at each launch; every other argument in dtype, shape, strides, storage offset and
values. On SM100 (no fmha_v2, no XQA) the record changes nothing.
"""

import ast
import gc
import logging

import shutil

import pytest
import torch
from packaging.version import Version

import flashinfer_cases
import release_selection
import workspace_cases
from conftest import clean_env, status_json
from sglang_hotfix_trtllm import detect, patch
from sglang_hotfix_trtllm.record import Verdict
from sglang_hotfix_trtllm.records import xqa_workspace

HOTFIX = xqa_workspace.HOTFIX
TABLE = release_selection.table(HOTFIX)
AFFECTED = workspace_cases.AFFECTED_RELEASES


def expected_verdict(release):
    version = Version(release)
    if version < Version("0.5.19"):
        return Verdict.NOT_APPLICABLE
    return Verdict.AFFECTED if version < Version("0.5.23") else Verdict.FIXED


def test_shipped_table_gives_every_release_its_verdict():
    assert HOTFIX.known_fingerprints.problem is None
    assert len([r for r in TABLE if Version(r) <= Version("0.5.23")]) == 42
    assert {r: row["verdict"] for r, row in TABLE.items() if row["verdict"] != expected_verdict(r).value} == {}
    assert [r for r, row in TABLE.items() if row["verdict"] == "affected"] == list(AFFECTED)


@pytest.mark.parametrize("release", release_selection.selected(TABLE, ("0.5.18", "0.5.19", "0.5.22", "0.5.23")))
def test_release_gets_its_verdict_from_its_own_source(release):
    assessment = detect.assess_source(HOTFIX, str(release_selection.release_dir(release) / workspace_cases.BACKEND))
    assert assessment.verdict is expected_verdict(release), assessment.reason
    assert assessment.fingerprint == TABLE[release]["fingerprint"]


def _source(release):
    return (release_selection.release_dir(release) / workspace_cases.BACKEND).read_text(encoding="utf-8")


VARIANTS = {
    # fmha_v2 reached from a second place: the repair would not see what it is given there
    "fmha_v2 called from a helper": lambda text: text.replace(
        "    def _get_layer_page_table(",
        "    def _prefill_elsewhere(self, q):\n"
        "        return flashinfer.prefill.trtllm_fmha_v2_prefill((q, q), workspace_buffer=self.workspace_buffer)\n\n"
        "    def _get_layer_page_table(",
        1,
    ),
    "get_buffer bound twice": lambda text: text.replace(
        "\nlogger = logging.getLogger(__name__)", "\nlogger = logging.getLogger(__name__)\nget_buffer = get_buffer", 1
    ),
    "the workspace named outside __init__": lambda text: text.replace(
        "\nlogger = logging.getLogger(__name__)",
        "\nlogger = logging.getLogger(__name__)\n_NAME = 'trtllm_mha_zero_workspace'",
        1,
    ),
    "fmha_v2 imported by name": lambda text: text.replace(
        "\nlogger = logging.getLogger(__name__)",
        "\nlogger = logging.getLogger(__name__)\nfrom flashinfer.prefill import trtllm_fmha_v2_prefill",
        1,
    ),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_hand_made_variants_are_refused(variant):
    text = _source("0.5.19")
    mutated = VARIANTS[variant](text)
    assert mutated != text
    classification = xqa_workspace.classify(ast.parse(mutated))
    assert classification.verdict is Verdict.UNKNOWN, classification.reason


def test_upstream_change_inserted_into_an_affected_release_reads_fixed():
    """The oracle is 0.5.23's change in substance: the record's own analysis calls it fixed (0.5.22,
    which sets is_xqa_impl before the allocation, as 0.5.23 does)."""
    tree = workspace_cases.upstream_fix(ast.parse(_source("0.5.22")), ast.parse(_source(workspace_cases.FIXED_RELEASE)))
    assert xqa_workspace.classify(tree).verdict is Verdict.FIXED


def _observe(release, sm, arm):
    root = release_selection.release_dir(release)
    module = workspace_cases.load_module(
        root, oracle=arm == "oracle", fixed_dir=release_selection.release_dir("0.5.23")
    )
    process = workspace_cases.Process(module, sm=sm)
    if arm != "record":
        return workspace_cases.run(module, process)
    assessment = detect.assess_module(HOTFIX, module)
    assert assessment.verdict is Verdict.AFFECTED, assessment.reason
    assert patch.wrap(HOTFIX, module, assessment) == "wrapped"
    try:
        return workspace_cases.run(module, process)
    finally:
        patch.remove_all()


@pytest.mark.parametrize("release", release_selection.selected(list(AFFECTED), ("0.5.19", "0.5.22")))
def test_kernels_get_the_workspace_as_upstream_gives_it(release):
    want = _observe(release, "sm90", "oracle")
    got = _observe(release, "sm90", "record")
    shipped = _observe(release, "sm90", "release")
    # The differential can fail: as shipped, XQA finds fmha_v2's counter in its semaphores.
    assert shipped != want
    assert [c[2] for c in shipped["calls"] if c[0].startswith("decode.")] == [False] * 4
    assert got == want
    # What 0.5.23 gives: one workspace for the process, 8 MiB larger; XQA gets it whole and finds its
    # semaphores zero at every launch; fmha_v2 gets the part after them.
    size = workspace_cases.WORKSPACE_BYTES + workspace_cases.SEMAPHORES
    assert got["shared"] == (size, 2)  # the workspace and the default KV scale, once each
    decodes = [c for c in got["calls"] if c[0].startswith("decode.")]
    prefills = [c for c in got["calls"] if c[0] == "prefill.trtllm_fmha_v2_prefill"]
    assert len(decodes) == len(prefills) == 4
    assert {c[1] for c in decodes} == {(size, "torch.uint8", (1,), 0, True, size)}
    assert {c[1] for c in prefills} == {
        (workspace_cases.WORKSPACE_BYTES, "torch.uint8", (1,), workspace_cases.SEMAPHORES, True, size)
    }
    assert all(c[2] for c in decodes)


@pytest.mark.parametrize("release", release_selection.selected(list(AFFECTED), ("0.5.19",)))
def test_off_xqa_nothing_changes(release):
    """SM100: upstream's semaphore_bytes is 0 there; the record leaves SGLang's allocation as it is."""
    shipped = _observe(release, "sm100", "release")
    assert _observe(release, "sm100", "record") == shipped == _observe(release, "sm100", "oracle")
    assert shipped["shared"][0] == workspace_cases.WORKSPACE_BYTES


def _module(release="0.5.19"):
    root = release_selection.release_dir(release)
    module = workspace_cases.load_module(root)
    return module, workspace_cases.Process(module)


def test_a_backend_built_before_the_record_makes_it_stand_aside_until_it_is_gone():
    """A backend built before the record was in force has no fmha_v2 view, which upstream's
    forward_extend reads: the record stands aside and says why (rather than let upstream's code meet
    an object upstream's __init__ never made), the early backend runs the release's code, and once
    no such backend lives the record goes in force."""
    module, process = _module()
    pool = workspace_cases.KVPool()
    early = module.TRTLLMHAAttnBackend(workspace_cases.model_runner(module, pool))
    try:
        with pytest.raises(patch.NotWrappable, match="built before the record was in force are alive"):
            patch.wrap(HOTFIX, module, detect.assess_module(HOTFIX, module))
        workspace_cases._forward(module, early, (100,), True, 0)
        assert process.calls[0][1][3] == 0  # the release's sharing: fmha_v2 got the whole workspace
        del early
        gc.collect()
        assert patch.wrap(HOTFIX, module, detect.assess_module(HOTFIX, module)) == "wrapped"
    finally:
        patch.remove_all()


def test_remove_gives_fmha_v2_the_whole_workspace_again():
    module, process = _module()
    patch.wrap(HOTFIX, module, detect.assess_module(HOTFIX, module))
    try:
        backend = module.TRTLLMHAAttnBackend(workspace_cases.model_runner(module, workspace_cases.KVPool()))
        workspace_cases._forward(module, backend, (100,), True, 0)
    finally:
        patch.remove_all()
    workspace_cases._forward(module, backend, (100,), True, 1)
    size = workspace_cases.WORKSPACE_BYTES + workspace_cases.SEMAPHORES
    assert [c[1][:4] for c in process.calls] == [
        (workspace_cases.WORKSPACE_BYTES, "torch.uint8", (1,), workspace_cases.SEMAPHORES),
        (size, "torch.uint8", (1,), 0),
    ]


def test_other_arguments_are_sglangs_own_objects():
    """Only fmha_v2's workspace is replaced: every other argument the kernel gets is the object
    SGLang's method passed."""
    module, process = _module()
    seen = []
    real = module.flashinfer.prefill.trtllm_fmha_v2_prefill
    module.flashinfer.prefill.trtllm_fmha_v2_prefill = lambda *a, **k: (seen.append((a, k)), real(*a, **k))[1]
    patch.wrap(HOTFIX, module, detect.assess_module(HOTFIX, module))
    try:
        backend = module.TRTLLMHAAttnBackend(workspace_cases.model_runner(module, workspace_cases.KVPool()))
        metadata_before = backend.forward_metadata
        workspace_cases._forward(module, backend, (100,), True, 0)
    finally:
        patch.remove_all()
    ((args, kwargs),) = seen
    assert metadata_before is None
    assert kwargs["seq_lens"] is backend.forward_metadata.cache_seqlens_int32
    assert kwargs["block_tables"] is backend.forward_metadata.page_table
    assert kwargs["workspace_buffer"] is not backend.workspace_buffer
    assert (
        kwargs["workspace_buffer"].untyped_storage().data_ptr() == backend.workspace_buffer.untyped_storage().data_ptr()
    )
    assert isinstance(args[0], tuple) and torch.is_tensor(args[0][0])


def test_remove_then_apply_gives_fmha_v2_the_view_again_at_once():
    """A review found that after remove() then apply() no new __init__ put fmha_v2's gate back: the
    workspaces already allocated went back to sharing XQA's semaphores while is_patched said True."""
    module, process = _module()
    patch.wrap(HOTFIX, module, detect.assess_module(HOTFIX, module))
    try:
        backend = module.TRTLLMHAAttnBackend(workspace_cases.model_runner(module, workspace_cases.KVPool()))
        patch.remove_all()
        patch.wrap(HOTFIX, module, detect.assess_module(HOTFIX, module))
        workspace_cases._forward(module, backend, (100,), True, 0)
        workspace_cases._forward(module, backend, (101,), False, 1)
    finally:
        patch.remove_all()
    (prefill, decode) = process.calls
    assert prefill[1][3] == workspace_cases.SEMAPHORES and decode[2]  # the view; XQA's semaphores zero


FORKS = {
    "the view at offset 0": ("self.workspace_buffer[semaphore_bytes:]", "self.workspace_buffer[0:]"),
    "no reserve": ("_XQA_SEMAPHORE_BYTES if self.is_xqa_impl else 0", "0"),
    "a reserve of another size": ("_XQA_SEMAPHORE_BYTES = 8 * 1024 * 1024", "_XQA_SEMAPHORE_BYTES = 8 * 1024"),
}


@pytest.mark.parametrize("fork", sorted(FORKS))
def test_forks_of_the_fix_that_still_share_the_semaphores_are_not_called_fixed(fork):
    old, new = FORKS[fork]
    text = _source(workspace_cases.FIXED_RELEASE)
    assert text.count(old) == 1
    classification = xqa_workspace.classify(ast.parse(text.replace(old, new)))
    assert classification.verdict is Verdict.UNKNOWN, classification.reason


def test_a_call_sglang_rejects_raises_its_error_and_says_nothing(caplog):
    module, _ = _module()
    patch.wrap(HOTFIX, module, detect.assess_module(HOTFIX, module))
    try:
        with caplog.at_level(logging.WARNING, logger="sglang_hotfix_trtllm"):
            with pytest.raises(TypeError):
                module.TRTLLMHAAttnBackend(None, 1, 2, 3, 4, 5)
    finally:
        patch.remove_all()
    assert [r.getMessage() for r in caplog.records] == []


@pytest.mark.parametrize("flashinfer, verdict", [("0.7.1", "affected"), ("0.7.2", "not-applicable")])
def test_the_verdict_on_0_5_22_depends_on_whether_the_installed_flashinfer_leaves_its_counter(
    tmp_path, flashinfer, verdict
):
    """Issue 50, item 2: the shared-workspace bug needs fmha_v2 to leave its tile counter in the
    workspace's first 4 bytes: FlashInfer 0.7.1 does (``atomicAdd``), 0.7.2 wraps it back to 0
    (``atomicInc``). SGLang 0.5.22 with each real FlashInfer (their files from the package index):
    `status` names the FlashInfer and gives the record another, true verdict; with 0.7.2 the record
    stands aside (0.14.0 repaired both)."""
    environment = tmp_path / "site"
    shutil.copytree(release_selection.release_dir("0.5.22"), environment)
    shutil.copytree(flashinfer_cases.flashinfer_dir(flashinfer), environment, dirs_exist_ok=True)
    for package in ("sglang", "sglang/srt", "sglang/srt/layers", "sglang/srt/layers/attention"):
        (environment / package / "__init__.py").touch()  # a regular package, found before the venv's 0.5.12
    ran = status_json(env=clean_env(PYTHONPATH=str(environment)))
    report = ran.report
    assert report["flashinfer_version"] == flashinfer and report["flashinfer_location"] == str(
        environment / "flashinfer"
    )
    (record,) = [r for r in report["hotfixes"] if r["hotfix"] == "xqa_workspace"]
    assert record["verdict"] == verdict, record
    if verdict == "not-applicable":
        assert record["reason"].startswith("masked by the installed FlashInfer: FlashInfer 0.7.2 at "), record
        assert "wraps its fmha_v2 tile counter back to 0" in record["reason"] and not record["would_patch"]
    else:
        assert record["would_patch"] and record["decision"] == "patch", record
