"""Record encoder_only_mask: ``ENCODER_ONLY`` layers prefilled with SGLang 0.5.22's ``causal``.

Differential, on CPU (``fp8_cases``): each release the record repairs (0.5.11 to 0.5.18),
its own ``forward_extend`` and ``forward_decode`` compiled from its file, FlashInfer's kernels
recorded, against the oracle: the same release with 0.5.22's ``causal=layer.attn_type !=
AttentionType.ENCODER_ONLY`` (taken from 0.5.22's call) added to its context-kernel call. Decoder
and encoder-only layers, extend and target verify, both KV dtypes, XQA both ways, with and without
pr28144 where it repairs the same call (to 0.5.13.post1: the oracle then has both upstream
changes). 0.5.14 on quantize the extend query with sgl-kernel's ``scaled_fp8_quant`` (a recorded
stand-in here, as the kernels are) and write through the release's own ``KVWriteLoc``. 0.5.16 on
call the kernel from ``_trtllm_context_attn``, nested in ``forward_extend``: extend runs with and
without context parallelism (the release's own zigzag ``run_attention``, which calls the nested
function twice in 0.5.16, once later; its K/V gather across ranks recorded), the fused FP8 write
through the JIT ``fused_fp8_qkv_kv_cache`` (recorded). Every tensor the kernel receives is compared
in dtype, shape, strides, storage offset and values.

The oracle passes ``causal=True`` for a decoder layer where the release passes nothing: FlashInfer's
default (``causal: bool = True`` in every FlashInfer that takes the argument, 0.6.11.post1 on), so
the kernel reads the same; the comparison drops that one keyword, and only where it is True.

The installed FlashInfer decides whether the repair can be carried: its ``prefill.py`` (fetched from
the published wheels at test time, 0.6.8.post1 without the argument, 0.6.11.post1 with it) read by
``status`` in a fresh process.
"""

import ast
import dataclasses
import subprocess
import sys
import zipfile

import pytest
from packaging.version import Version

import fp8_cases
import release_selection
import workspace_cases
from conftest import CACHE, clean_env, exclusive, status_json
from sglang_hotfix_trtllm import detect, flashinfer_install, logs, patch
from sglang_hotfix_trtllm.records import catalog, encoder_only_mask, pr28144, pr31667, xqa_workspace

HOTFIX = encoder_only_mask.HOTFIX
TABLE = release_selection.table(HOTFIX)
AFFECTED = release_selection.with_verdict(HOTFIX)
RELEASES = release_selection.selected(AFFECTED, ("0.5.12", "0.5.14", "0.5.15", "0.5.16", "0.5.17", "0.5.19", "0.5.21"))
FIXED_IN = "0.5.22"
CONTEXT = "prefill.trtllm_batch_context_with_kv_cache"
FMHA_V2 = "prefill.trtllm_fmha_v2_prefill"  # 0.5.19 on, where XQA decodes (SM90/SM120)
# From 0.5.16 the context kernel is called from _trtllm_context_attn, nested in forward_extend, and
# under context parallelism from the zigzag strategy's run_attention (0.5.16: once per half).
NESTED = [r for r in RELEASES if Version(r) >= Version("0.5.16")]


def test_the_records_affected_releases_are_0_5_11_to_0_5_21():
    assert AFFECTED == ["0.5.11", "0.5.12", "0.5.12.post1", "0.5.13", "0.5.13.post1"] + [
        "0.5.14",
        "0.5.15",
        "0.5.15.post1",
        "0.5.16",
        "0.5.17",
        "0.5.18",
        "0.5.19",
        "0.5.20",
        "0.5.21",
    ]


def _cases(release, every_layout=False):
    """Extend and target verify, plain scales (the scales are pr28144's: crossed with it below),
    each as a decoder and as an encoder-only layer; from 0.5.16, extend with context parallelism
    too (the release's own zigzag ``run_attention``); ``every_layout``: decode too, and strided
    queries (pr31667's calls)."""
    context_parallel = Version(release) >= Version("0.5.16")
    chosen = {}
    for name, case in fp8_cases.cases(release).items():
        if not every_layout and (case.mode == "decode" or case.layout != "packed"):
            continue
        if case.scales not in ("absent", "float"):
            continue
        for attn_type in ("DECODER", "ENCODER_ONLY"):
            chosen["%s-%s" % (name, attn_type)] = dataclasses.replace(case, name=name, attn_type=attn_type)
            if context_parallel and case.mode == "extend":
                chosen["%s-cp-%s" % (name, attn_type)] = dataclasses.replace(
                    case, name=name, attn_type=attn_type, cp=True
                )
    return chosen


def _causal_default_dropped(calls):
    """Calls with the context kernel's ``causal=True`` (FlashInfer's default) taken out."""
    return [
        (name, {k: v for k, v in arguments.items() if not (k == "causal" and v is True)})
        if name == CONTEXT
        else (name, arguments)
        for name, arguments in calls
    ]


def _oracle(release, scales, packed_query=False):
    module = fp8_cases.upstream_module(
        release_selection.release_dir(release),
        release_selection.release_dir(fp8_cases.FIXED_RELEASE),
        scales=scales,
        encoder_only_dir=release_selection.release_dir(FIXED_IN),
        packed_query_dir=release_selection.release_dir("0.5.16") if packed_query else None,
    )
    return {
        name: fp8_cases.kernel_calls(module, case) for name, case in _cases(release, every_layout=packed_query).items()
    }


def _with_records(release, records, every_layout=False):
    module = fp8_cases.load_backend_module(release_selection.release_dir(release))
    try:
        for hotfix in records:
            assessment = detect.assess_module(hotfix, module)
            assert assessment.verdict.value == "affected", (hotfix.name, assessment.reason)
            patch.wrap(hotfix, module, assessment)
        return {name: fp8_cases.kernel_calls(module, case) for name, case in _cases(release, every_layout).items()}
    finally:
        patch.remove_all()


@pytest.mark.parametrize("release", RELEASES)
def test_unpatched_differs_from_the_oracle_exactly_on_encoder_only_prefill(release):
    """The comparison can fail, and fails where the bug bites: an encoder-only layer's extend."""
    unpatched = _with_records(release, ())
    # 0.5.22 passes causal=True on a decoder layer, FlashInfer's default: the same attention.
    oracle = {name: _causal_default_dropped(calls) for name, calls in _oracle(release, scales=False).items()}
    cases = _cases(release)
    differing = sorted(name for name in cases if unpatched[name] != oracle[name])
    expected = sorted(
        name for name, case in cases.items() if case.attn_type == "ENCODER_ONLY" and case.mode == "extend"
    )
    assert expected and differing == expected


@pytest.mark.parametrize("release", RELEASES)
def test_patched_release_equals_the_oracle_on_every_case(release):
    patched, oracle = _with_records(release, (HOTFIX,)), _oracle(release, scales=False)
    assert {name for name in oracle if patched[name] != oracle[name]} == set()
    encoder_only_extend = [
        n for n, c in _cases(release).items() if c.attn_type == "ENCODER_ONLY" and c.mode == "extend"
    ]
    for name in encoder_only_extend:
        masks = [_mask(kernel, arguments) for kernel, arguments in patched[name] if kernel in (CONTEXT, FMHA_V2)]
        assert masks and all(mask == "bidirectional" for mask in masks), (name, masks)


def _mask(kernel, arguments):
    """What a prefill kernel call is told: causal or bidirectional (FlashInfer's defaults: causal)."""
    if kernel == FMHA_V2:
        return {"causal": "causal", "padding": "bidirectional"}[arguments["mask_mode"]]
    return "causal" if arguments.get("causal", True) else "bidirectional"


def _prefill_calls(calls):
    return [(kernel, arguments) for kernel, arguments in calls if kernel in (CONTEXT, FMHA_V2)]


@pytest.mark.parametrize("release", NESTED)
def test_from_0_5_16_the_nested_context_call_is_repaired_every_time_context_parallelism_makes_it(release):
    """The kernel calls the repair must reach: one context call from the nested function without
    context parallelism; with it, 0.5.16's zigzag makes two (one per half), 0.5.17 on one (both
    halves as one batch, zigzag's page table); from 0.5.19, where XQA decodes, fmha_v2 (called by
    forward_extend itself, ``(q, paged_kv)`` first) without context parallelism. Each is told the
    layer's mask (an encoder-only layer: causal=False, mask_mode="padding"; a decoder layer: what
    the release passes), with and without a KV write."""
    cases = _cases(release)
    patched = _with_records(release, (HOTFIX,))
    expected_cp_calls = 2 if release == "0.5.16" else 1
    fmha_v2 = Version(release) >= Version("0.5.19")
    cp_cases = [n for n, c in cases.items() if c.cp]
    assert cp_cases and {c.save_kv_cache for c in cases.values() if c.cp} == {True, False}
    for name, case in cases.items():
        calls = _prefill_calls(patched[name])
        if case.mode != "extend":
            assert calls == []
            continue
        kernel = FMHA_V2 if fmha_v2 and case.xqa and not case.cp else CONTEXT
        assert [k for k, _ in calls] == [kernel] * (expected_cp_calls if case.cp else 1), name
        want = "bidirectional" if case.attn_type == "ENCODER_ONLY" else "causal"
        assert all(_mask(k, arguments) == want for k, arguments in calls), name
        if kernel == CONTEXT and want == "causal":  # 0.5.22 passes causal=True itself, as upstream's code here
            assert all(arguments["causal"] is True for _, arguments in calls), name
        if kernel == FMHA_V2:
            assert all(isinstance(arguments["qkv"], tuple) for _, arguments in calls), name


@pytest.mark.parametrize("release", NESTED)
def test_from_0_5_16_the_records_patching_beside_it_are_known(release):
    """The composition to prove on these releases: every other record is fixed, not applicable or
    only reported there (pr28144, pr31667 fixed by 0.5.16), but xqa_workspace from 0.5.19, which
    edits the same method (test_with_xqa_workspace_...), and xqa_draft_extend on 0.5.21."""
    from sglang_hotfix_trtllm.records import catalog

    tree = ast.parse((release_selection.release_dir(release) / fp8_cases.BACKEND).read_text(encoding="utf-8"))
    patching = [h.name for h in catalog.HOTFIXES if h.classify(tree).verdict.value == "affected"]
    expected = ["encoder_only_mask"] if Version(release) < Version("0.5.19") else ["xqa_workspace", "encoder_only_mask"]
    if release == "0.5.21":  # xqa_draft_extend repairs 0.5.21 (0.14.0): test_xqa_draft_extend composes the two
        expected.append("xqa_draft_extend")
    assert patching == expected


# pr28144 repairs the same kernel call up to 0.5.13.post1 (0.5.14 carries upstream's scales).
WITH_PR28144 = [r for r in RELEASES if release_selection.table(pr28144.HOTFIX)[r]["verdict"] == "affected"]


def test_the_composition_is_tested_where_both_records_repair():
    assert WITH_PR28144 == [r for r in RELEASES if Version(r) < Version("0.5.14")]


@pytest.mark.parametrize("order", ["pr28144 first", "encoder_only_mask first"])
@pytest.mark.parametrize("release", WITH_PR28144)
def test_with_pr28144_on_the_same_call_both_upstream_changes_arrive(release, order):
    """One kernel call, two records: the scales (pr28144) and the mask, applied in either order,
    equal the release with both upstream changes."""
    records = (pr28144.HOTFIX, HOTFIX) if order == "pr28144 first" else (HOTFIX, pr28144.HOTFIX)
    patched, oracle = _with_records(release, records), _oracle(release, scales=True)
    assert {name for name in oracle if patched[name] != oracle[name]} == set()


def _flashinfer_prefill(version):
    """A folder holding FlashInfer ``version``'s ``flashinfer/__init__.py`` and ``prefill.py``, from
    its published wheel (fetched once into the test cache)."""
    folder = CACHE / ("flashinfer-prefill-" + version)
    with exclusive("flashinfer-" + version):
        if not (folder / ".complete").exists():
            wheels = CACHE / "wheels"
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels)]
                + ["flashinfer-python==" + version],
                check=True,
                timeout=600,
            )
            (wheel,) = wheels.glob("flashinfer_python-%s-*.whl" % version)
            with zipfile.ZipFile(wheel) as archive:
                for member in ("flashinfer/__init__.py", "flashinfer/prefill.py"):
                    archive.extract(member, folder)
            (folder / ".complete").write_text(version)
    return folder


@pytest.mark.parametrize(
    "flashinfer, verdict, code", [("0.6.8.post1", "unrepairable", 1), ("0.6.11.post1", "affected", 0)]
)
def test_the_installed_flashinfer_decides_whether_the_repair_can_be_carried(flashinfer, verdict, code):
    """SGLang 0.5.12's code with 0.5.11's FlashInfer (its context kernel takes no ``causal``): NOT
    PROTECTED, naming FlashInfer; with 0.5.12's own: patched. Read from FlashInfer's file, never
    imported (its ``__init__`` would need CUDA libraries here)."""
    # FlashInfer's own kernel bugs, which 0.5.12's code reaches with these FlashInfers, accepted by
    # name: this test is about encoder_only_mask (test_flashinfer_records is about them)
    kernel_bugs = ",".join(h.name for h in catalog.HOTFIXES if h.flashinfer_fix is not None)
    env = clean_env(PYTHONPATH=str(_flashinfer_prefill(flashinfer)), SGLANG_HOTFIX_TRTLLM_ACCEPT=kernel_bugs)
    ran = status_json(env=env, timeout=300)
    document = ran.report
    (block,) = [r for r in document["hotfixes"] if r["hotfix"] == "encoder_only_mask"]
    assert block["verdict"] == verdict, block["reason"]
    assert ran.returncode == code and document["exit_status"] == code, document["headline"]
    # the README's release table has only each release's pinned version (tools/docs_tables.py): its
    # rule gives what the product read from this FlashInfer's kernel
    repairable = flashinfer_install.has_release(flashinfer, encoder_only_mask.FLASHINFER_REPAIRABLE_FROM)
    assert repairable is (verdict == "affected")
    if verdict == "unrepairable":
        assert "takes no causal argument" in block["reason"] and "0.5.22" in block["reason"]
        probe = (
            "import sys; from sglang_hotfix_trtllm.records import encoder_only_mask as e; "
            "print(e.environment_problem() is not None, 'flashinfer' in sys.modules)"
        )
        read = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
        assert read.stdout.split() == ["True", "False"], read.stderr


# pr31667 wraps the same two methods on 0.5.11 to 0.5.15.post1 (the decode query on XQA).
WITH_PR31667 = [r for r in RELEASES if release_selection.table(pr31667.HOTFIX)[r]["verdict"] == "affected"]


@pytest.mark.parametrize("release", WITH_PR31667)
def test_with_pr31667_both_upstream_changes_arrive_on_every_mode_and_layout(release):
    """Decode and extend, packed and strided queries, decoder and encoder-only layers: the release
    with pr31667 and this record equals the release with 0.5.16's packed query and 0.5.22's mask
    (the scales as the release has them: pr28144 off, or fixed from 0.5.14)."""
    patched = _with_records(release, (pr31667.HOTFIX, HOTFIX), every_layout=True)
    oracle = _oracle(release, scales=False, packed_query=True)
    assert len(oracle) > len(_cases(release))
    assert {name for name in oracle if patched[name] != oracle[name]} == set()


# The FlashInfer each release from 0.5.16 pins (its wheel's Requires-Dist).
PINNED_FLASHINFER = {
    "0.5.16": "0.6.14",
    "0.5.17": "0.6.15.post1",
    "0.5.18": "0.6.17",
    "0.5.19": "0.6.18",
    "0.5.20": "0.6.18",
    "0.5.21": "0.6.18",
}


@pytest.mark.parametrize("release", sorted(PINNED_FLASHINFER))
def test_the_flashinfer_0_5_16_to_0_5_21_pin_takes_causal_defaulting_to_the_causal_mask(release):
    """What the repair and the comparison rest on there: the pinned FlashInfer's context kernel takes
    ``causal`` (the record's own check says so) and defaults it to True (so a decoder layer's call
    without it is 0.5.22's ``causal=True``); from 0.5.19 its fmha_v2 takes ``mask_mode`` and reads
    "padding" as non-causal."""
    folder = _flashinfer_prefill(PINNED_FLASHINFER[release])
    text = (folder / "flashinfer" / "prefill.py").read_text(encoding="utf-8")
    (kernel,) = [
        n
        for n in ast.walk(ast.parse(text))
        if isinstance(n, ast.FunctionDef) and n.name == encoder_only_mask.CONTEXT_KERNEL
    ]
    arguments = kernel.args
    defaults = dict(
        zip([a.arg for a in arguments.args][len(arguments.args) - len(arguments.defaults) :], arguments.defaults)
    )
    defaults.update({a.arg: d for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults) if d is not None})
    assert ast.unparse(defaults["causal"]) == "True"
    if Version(release) >= Version("0.5.19"):
        (fmha_v2,) = [
            n
            for n in ast.walk(ast.parse(text))
            if isinstance(n, ast.FunctionDef) and n.name == encoder_only_mask.FMHA_V2_KERNEL
        ]
        assert "mask_mode" in [a.arg for a in fmha_v2.args.args + fmha_v2.args.kwonlyargs]
        assert "is_non_causal = mask_mode is not None and mask_mode.lower() == 'padding'" in ast.unparse(fmha_v2)
    assert encoder_only_mask._CONTEXT_SIGNATURE.search(
        text
    ) and "causal" in encoder_only_mask._CONTEXT_SIGNATURE.search(text).group(1)


# 0.5.19 to 0.5.21: xqa_workspace repairs fmha_v2's workspace (its __init__ and the same gate).
WITH_XQA_WORKSPACE = [r for r in RELEASES if release_selection.table(xqa_workspace.HOTFIX)[r]["verdict"] == "affected"]


def test_the_composition_with_xqa_workspace_is_tested_where_both_records_repair():
    assert WITH_XQA_WORKSPACE == [r for r in RELEASES if Version(r) >= Version("0.5.19")]


def _workspace_run(release, sm, attn_type, records=(), workspace=False, mask=False):
    """SGLang's own __init__, prefill and decode (``workspace_cases``), a target and a draft
    backend in one process, the layer ``attn_type``: with ``records`` applied, or as the oracle
    with 0.5.23's workspace change (``workspace``) and 0.5.22's mask arguments (``mask``) put in by
    AST. The oracle's ``causal=True`` on the context kernel (FlashInfer's default) is left out."""
    module = workspace_cases.load_module(
        release_selection.release_dir(release),
        oracle=workspace,
        fixed_dir=release_selection.release_dir("0.5.23"),
        mask_dir=release_selection.release_dir(FIXED_IN) if mask else None,
    )
    process = workspace_cases.Process(module, sm=sm)
    try:
        for hotfix in records:
            assessment = detect.assess_module(hotfix, module)
            assert assessment.verdict.value == "affected", (hotfix.name, assessment.reason)
            assert patch.wrap(hotfix, module, assessment) == "wrapped"
        ran = workspace_cases.run(module, process, attn_type=attn_type)
    finally:
        patch.remove_all()
    calls = []
    for name, workspace_seen, zero, args, others in ran["calls"]:
        if name == CONTEXT and others.get("causal") is True:
            others = {k: v for k, v in others.items() if k != "causal"}
        calls.append((name, workspace_seen, zero, args, others))
    return dict(ran, calls=calls)


@pytest.mark.parametrize("attn_type", ["DECODER", "ENCODER_ONLY"])
@pytest.mark.parametrize("sm", ["sm90", "sm100"])
@pytest.mark.parametrize("release", WITH_XQA_WORKSPACE)
def test_with_xqa_workspace_both_upstream_changes_arrive(release, sm, attn_type):
    """SM90 (fmha_v2 prefill, XQA decode: both records repair) and SM100 (the context kernel: only
    this one), a decoder and an encoder-only layer: each record alone and both, in either order,
    equal the release with the matching upstream changes (0.5.23's workspace, 0.5.22's mask) put in
    by AST, in every kernel's workspace (size, offset, memory) and every other argument; unpatched,
    the release differs from the mask's oracle exactly on the encoder-only layer."""
    both = _workspace_run(release, sm, attn_type, workspace=True, mask=True)
    mask_only = _workspace_run(release, sm, attn_type, mask=True)
    workspace_only = _workspace_run(release, sm, attn_type, workspace=True)
    shipped = _workspace_run(release, sm, attn_type)
    assert (shipped == mask_only) is (both == workspace_only) is (attn_type == "DECODER")
    assert _workspace_run(release, sm, attn_type, records=(HOTFIX,)) == mask_only
    assert _workspace_run(release, sm, attn_type, records=(xqa_workspace.HOTFIX,)) == workspace_only
    for records in ((xqa_workspace.HOTFIX, HOTFIX), (HOTFIX, xqa_workspace.HOTFIX)):
        assert _workspace_run(release, sm, attn_type, records=records) == both
    prefills = [c for c in both["calls"] if c[0].startswith("prefill.")]
    assert {c[0] for c in prefills} == {FMHA_V2 if sm == "sm90" else CONTEXT}
    if attn_type == "ENCODER_ONLY" and sm == "sm90":
        assert {c[4]["mask_mode"] for c in prefills} == {"padding"}


DELEGATING = [r for r in RELEASES if Version(r) >= Version("0.5.19")]


@pytest.mark.parametrize("release", DELEGATING)
def test_from_0_5_19_the_decode_kernel_called_by_run_fixed_q_len_decode_keeps_sglangs_arguments(
    release, caplog, monkeypatch
):
    """Draft extend (and verify) on the decode kernel go through ``_run_fixed_q_len_decode``, a
    method that calls the kernel itself: inside an encoder-only forward_extend, upstream's code
    passes it SGLang's arguments (0.5.22's, the oracle's), and the hotfix says nothing (its 0.13
    gate needed a registry of such delegates; upstream's code needs none)."""
    (case,) = [
        c
        for c in fp8_cases.cases(release).values()
        if c.mode == "extend" and c.kv == "bf16" and c.scales == "absent" and c.xqa and not c.save_kv_cache
        if c.layout == "packed"
    ]
    case = dataclasses.replace(case, mode="draft_extend_v2", attn_type="ENCODER_ONLY")
    oracle_module = fp8_cases.upstream_module(
        release_selection.release_dir(release),
        release_selection.release_dir(fp8_cases.FIXED_RELEASE),
        scales=False,
        encoder_only_dir=release_selection.release_dir(FIXED_IN),
    )
    oracle = fp8_cases.kernel_calls(oracle_module, case)
    assert [name for name, _ in oracle] == ["decode.trtllm_batch_decode_with_kv_cache", "returned"]

    def patched():
        module = fp8_cases.load_backend_module(release_selection.release_dir(release))
        assessment = detect.assess_module(HOTFIX, module)
        patch.wrap(HOTFIX, module, assessment)
        try:
            return fp8_cases.kernel_calls(module, case)
        finally:
            patch.remove_all()

    monkeypatch.setattr(logs, "_said", set())  # each warning is said once per process: said afresh here
    caplog.set_level("WARNING")
    assert patched() == oracle
    assert not [r for r in caplog.records if r.levelname == "WARNING"], caplog.text
