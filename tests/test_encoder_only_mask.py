"""Record encoder_only_mask: ``ENCODER_ONLY`` layers prefilled with SGLang 0.5.22's ``causal``.

Differential, on CPU (``fp8_cases``): each release the record repairs (0.5.11 to 0.5.13.post1),
its own ``forward_extend`` and ``forward_decode`` compiled from its file, FlashInfer's kernels
recorded, against the oracle: the same release with 0.5.22's ``causal=layer.attn_type !=
AttentionType.ENCODER_ONLY`` (taken from 0.5.22's call) added to its context-kernel call. Decoder
and encoder-only layers, extend and target verify, both KV dtypes, XQA both ways, with and without
pr28144 (which repairs the same call: the oracle then has both upstream changes). Every tensor the
kernel receives is compared in dtype, shape, strides, storage offset and values.

The oracle passes ``causal=True`` for a decoder layer where the release passes nothing: FlashInfer's
default (``causal: bool = True`` in every FlashInfer that takes the argument, 0.6.11.post1 on), so
the kernel reads the same; the comparison drops that one keyword, and only where it is True.

The installed FlashInfer decides whether the repair can be carried: its ``prefill.py`` (fetched from
the published wheels at test time, 0.6.8.post1 without the argument, 0.6.11.post1 with it) read by
``status`` in a fresh process.
"""

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
from sglang_hotfix_trtllm.records import encoder_only_mask, pr28144

HOTFIX = encoder_only_mask.HOTFIX
TABLE = release_selection.table(HOTFIX)
AFFECTED = sorted((r for r, row in TABLE.items() if row["verdict"] == "affected"), key=Version)
RELEASES = release_selection.selected(AFFECTED, ("0.5.12", "0.5.13"))
FIXED_IN = "0.5.22"
CONTEXT = "prefill.trtllm_batch_context_with_kv_cache"


def test_the_records_affected_releases_are_0_5_11_to_0_5_13_post1():
    assert AFFECTED == ["0.5.11", "0.5.12", "0.5.12.post1", "0.5.13", "0.5.13.post1"]


def _cases(release):
    """Extend and target verify, plain scales (the scales are pr28144's: crossed with it below),
    each as a decoder and as an encoder-only layer."""
    chosen = {}
    for name, case in fp8_cases.cases(release).items():
        if case.mode == "decode" or case.scales not in ("absent", "float") or case.layout != "packed":
            continue
        for attn_type in ("DECODER", "ENCODER_ONLY"):
            chosen["%s-%s" % (name, attn_type)] = dataclasses.replace(case, name=name, attn_type=attn_type)
    return chosen


def _default_dropped(calls):
    """The oracle's calls with the context kernel's ``causal=True`` (FlashInfer's default) taken out."""
    out = []
    for name, arguments in calls:
        if name == CONTEXT and arguments.get("causal") is True:
            arguments = {k: v for k, v in arguments.items() if k != "causal"}
        out.append((name, arguments))
    return out


def _oracle(release, scales):
    module = fp8_cases.upstream_module(
        release_selection.release_dir(release),
        release_selection.release_dir(fp8_cases.FIXED_RELEASE),
        scales=scales,
        encoder_only_dir=release_selection.release_dir(FIXED_IN),
    )
    return {name: _default_dropped(fp8_cases.kernel_calls(module, case)) for name, case in _cases(release).items()}


def _with_records(release, records):
    module = fp8_cases.load_backend_module(release_selection.release_dir(release))
    try:
        for hotfix in records:
            assessment = detect.assess_module(hotfix, module)
            assert assessment.verdict.value == "affected", (hotfix.name, assessment.reason)
            patch.wrap(hotfix, module, assessment)
        return {name: fp8_cases.kernel_calls(module, case) for name, case in _cases(release).items()}
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
    assert all(dict(patched[n])[CONTEXT]["causal"] is False for n in encoder_only_extend)


@pytest.mark.parametrize("order", ["pr28144 first", "encoder_only_mask first"])
@pytest.mark.parametrize("release", RELEASES)
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
