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
from conftest import CACHE, clean_env, exclusive, status_json
from sglang_hotfix_trtllm import detect, patch
from sglang_hotfix_trtllm.records import encoder_only_mask, pr28144, pr31667

HOTFIX = encoder_only_mask.HOTFIX
TABLE = release_selection.table(HOTFIX)
AFFECTED = release_selection.with_verdict(HOTFIX)
RELEASES = release_selection.selected(AFFECTED, ("0.5.12", "0.5.14", "0.5.15", "0.5.16", "0.5.17"))
FIXED_IN = "0.5.22"
CONTEXT = "prefill.trtllm_batch_context_with_kv_cache"
# From 0.5.16 the context kernel is called from _trtllm_context_attn, nested in forward_extend, and
# under context parallelism from the zigzag strategy's run_attention (0.5.16: once per half).
NESTED = [r for r in RELEASES if Version(r) >= Version("0.5.16")]


def test_the_records_affected_releases_are_0_5_11_to_0_5_18():
    assert AFFECTED == ["0.5.11", "0.5.12", "0.5.12.post1", "0.5.13", "0.5.13.post1"] + [
        "0.5.14",
        "0.5.15",
        "0.5.15.post1",
        "0.5.16",
        "0.5.17",
        "0.5.18",
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


def _default_dropped(calls):
    """The oracle's calls with the context kernel's ``causal=True`` (FlashInfer's default) taken out."""
    out = []
    for name, arguments in calls:
        if name == CONTEXT and arguments.get("causal") is True:
            arguments = {k: v for k, v in arguments.items() if k != "causal"}
        out.append((name, arguments))
    return out


def _oracle(release, scales, packed_query=False):
    module = fp8_cases.upstream_module(
        release_selection.release_dir(release),
        release_selection.release_dir(fp8_cases.FIXED_RELEASE),
        scales=scales,
        encoder_only_dir=release_selection.release_dir(FIXED_IN),
        packed_query_dir=release_selection.release_dir("0.5.16") if packed_query else None,
    )
    return {
        name: _default_dropped(fp8_cases.kernel_calls(module, case))
        for name, case in _cases(release, every_layout=packed_query).items()
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
    oracle = _oracle(release, scales=False)
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
        causal = [arguments.get("causal") for kernel, arguments in patched[name] if kernel == CONTEXT]
        assert causal and all(value is False for value in causal), (name, causal)


def _context_calls(calls):
    return [arguments for kernel, arguments in calls if kernel == CONTEXT]


@pytest.mark.parametrize("release", NESTED)
def test_from_0_5_16_the_nested_context_call_is_repaired_every_time_context_parallelism_makes_it(release):
    """The kernel calls the repair must reach: one context call from the nested function without
    context parallelism; with it, 0.5.16's zigzag makes two (one per half), 0.5.17 on one (both
    halves as one batch, zigzag's page table). Each gets causal=False, with and without a KV write."""
    cases = _cases(release)
    patched = _with_records(release, (HOTFIX,))
    expected_cp_calls = 2 if release == "0.5.16" else 1
    cp_cases = [n for n, c in cases.items() if c.cp]
    assert cp_cases and {c.save_kv_cache for c in cases.values() if c.cp} == {True, False}
    for name, case in cases.items():
        if case.mode != "extend":
            assert _context_calls(patched[name]) == []
            continue
        calls = _context_calls(patched[name])
        assert len(calls) == (expected_cp_calls if case.cp else 1), name
        if case.attn_type == "ENCODER_ONLY":
            assert all(call["causal"] is False for call in calls), name
        else:
            assert all("causal" not in call for call in calls), name


@pytest.mark.parametrize("release", NESTED)
def test_from_0_5_16_no_other_record_patches_forward_extend(release):
    """The composition to prove on these releases: every other record is fixed, not applicable or
    only reported there (pr28144, pr31667 fixed by 0.5.16; xqa_workspace from 0.5.19)."""
    from sglang_hotfix_trtllm.records import catalog

    tree = ast.parse((release_selection.release_dir(release) / fp8_cases.BACKEND).read_text(encoding="utf-8"))
    patching = [h.name for h in catalog.HOTFIXES if h.classify(tree).verdict.value == "affected"]
    assert patching == ["encoder_only_mask"]


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
    env = clean_env(PYTHONPATH=str(_flashinfer_prefill(flashinfer)))
    ran = status_json(env=env, timeout=300)
    document = ran.report
    (block,) = [r for r in document["hotfixes"] if r["hotfix"] == "encoder_only_mask"]
    assert block["verdict"] == verdict, block["reason"]
    assert ran.returncode == code and document["exit_status"] == code, document["headline"]
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
PINNED_FLASHINFER = {"0.5.16": "0.6.14", "0.5.17": "0.6.15.post1", "0.5.18": "0.6.17"}


@pytest.mark.parametrize("release", sorted(PINNED_FLASHINFER))
def test_the_flashinfer_0_5_16_to_0_5_18_pin_takes_causal_defaulting_to_the_causal_mask(release):
    """What the repair and the comparison rest on there: the pinned FlashInfer's context kernel takes
    ``causal`` (the record's own check says so) and defaults it to True (so a decoder layer's call
    without it is 0.5.22's ``causal=True``)."""
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
    assert encoder_only_mask._CONTEXT_SIGNATURE.search(
        text
    ) and "causal" in encoder_only_mask._CONTEXT_SIGNATURE.search(text).group(1)
