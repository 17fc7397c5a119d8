"""The third record, pr28144: FlashInfer's TRT-LLM kernels get the FP8 KV cache's scales.

Differential, on CPU: every affected release's own ``forward_decode`` / ``forward_extend``
(``fp8_cases``: compiled from the release's file, FlashInfer's kernels and the fused FP8 KV
write recorded) against the oracle, the same release with upstream's fix (PR #28144 as PR
#29423 revised it) applied by AST from 0.5.15's file. What the kernels receive is compared
exactly, every tensor in dtype, shape, strides, storage offset and values, with packed and
strided (``qkv.split``) queries:

* unpatched and oracle differ on exactly the cases where the bug bites, an expectation worked
  out from each case's data (so the comparison can fail, and does where it should);
* the release patched by the record equals the oracle on every case.

Which releases: ``SGLANG_HOTFIX_RELEASES`` as in test_releases.py (``quick``: one per variant).
"""

import functools

import pytest
from packaging.version import Version

import fp8_cases
import release_selection
from sglang_hotfix_trtllm import detect, patch
from sglang_hotfix_trtllm.records import pr28144

HOTFIX = pr28144.HOTFIX
TABLE = release_selection.table(HOTFIX)
# The releases the record patches, from its shipped table (see the first test).
AFFECTED = release_selection.with_verdict(HOTFIX)
# One release per (forward_decode, forward_extend) variant pair.
QUICK = ("0.5.1", "0.5.5", "0.5.6", "0.5.8", "0.5.9", "0.5.10", "0.5.12", "0.5.13")
RELEASES = release_selection.selected(AFFECTED, QUICK)
KERNELS = {
    "decode": "decode.trtllm_batch_decode_with_kv_cache",
    "extend": "prefill.trtllm_batch_context_with_kv_cache",
    "target_verify": "decode.trtllm_batch_decode_with_kv_cache",
}


# --------------------------------------------------------------------------
# The expectation, from the case's data alone


def release_k_scale(case):
    """The K scale an affected release multiplies the logits by: ``k_scale_float``, else 1."""
    value = case.scale("k_scale_float")
    return 1.0 if value is None else value


def upstream_scale(case, which):
    """PR #28144's reading of a layer scale: the float attribute, else the plain one; a tensor,
    nothing, zero or a negative value gives 1."""
    for attribute in (which + "_scale_float", which + "_scale"):
        if case.scale(attribute) is not None:
            if case.holds_tensor(attribute):
                return 1.0
            return case.scale(attribute) if case.scale(attribute) > 0 else 1.0
    return 1.0


def bug_bites(case):
    """Whether the release passes the kernel something upstream's fix changes.

    BF16 cache: the release multiplies the logits by the layer's K scale, which the cache does
    not hold (the fix: ``layer.scaling`` alone). FP8 cache: the release passes ``bmm2_scale = 1``
    whatever the V scale and multiplies by a zero or negative K scale the fix replaces by 1; and
    it casts Q to FP8 in XQA target verify, where 0.5.15 keeps BF16 Q."""
    if case.kv == "bf16":
        return release_k_scale(case) != 1.0
    verify_on_xqa = case.xqa and case.mode == "target_verify"
    return verify_on_xqa or upstream_scale(case, "v") != 1.0 or upstream_scale(case, "k") != release_k_scale(case)


# --------------------------------------------------------------------------
# Runs, cached per release (the unpatched and oracle modules are never patched)


@functools.lru_cache(maxsize=None)
def release_cases(release):
    return fp8_cases.cases(release)


@functools.lru_cache(maxsize=None)
def unpatched_calls(release):
    module = fp8_cases.load_backend_module(release_selection.release_dir(release))
    return {name: fp8_cases.kernel_calls(module, case) for name, case in release_cases(release).items()}


@functools.lru_cache(maxsize=None)
def oracle_calls(release):
    fixed_dir = release_selection.release_dir(fp8_cases.FIXED_RELEASE)
    module = fp8_cases.upstream_module(release_selection.release_dir(release), fixed_dir)
    return {name: fp8_cases.kernel_calls(module, case) for name, case in release_cases(release).items()}


def first_difference(a, b):
    """The first call (name) where two recordings part, for a readable failure."""
    for (name_a, args_a), (name_b, args_b) in zip(a, b):
        if name_a != name_b:
            return "call %s vs %s" % (name_a, name_b)
        if args_a != args_b and isinstance(args_a, dict) and isinstance(args_b, dict):
            keys = sorted(k for k in set(args_a) | set(args_b) if args_a.get(k) != args_b.get(k))
            return "%s: %s" % (name_a, keys)
        if args_a != args_b:
            return name_a
    return "%d calls vs %d" % (len(a), len(b))


# --------------------------------------------------------------------------
# Tests


def test_the_records_affected_releases_are_0_5_1_to_0_5_13_post1():
    """REFERENCE.md: 0.5.1 to 0.5.13.post1 have the bug, 0.5.14 is fixed. Upstream's revised fix
    passes Python floats, which every pinned FlashInfer takes: every release with the bug is
    repaired (0.5.0 refused 0.5.1 to 0.5.5.post3)."""
    in_range = [r for r in TABLE if Version("0.5.1") <= Version(r) < Version("0.5.14")]
    assert len(AFFECTED) == 31 and AFFECTED == sorted(in_range, key=Version)


@pytest.mark.parametrize("release", RELEASES)
def test_harness_drives_the_paths_each_case_names(release):
    """The case's KV write (the release's fused FP8 path, set_kv_buffer, none) and kernel are the
    ones the release's code took, so a case name means what it says."""
    wrong = {}
    for name, case in release_cases(release).items():
        called = [call for call, _ in unpatched_calls(release)[name]]
        write = ["fused_fp8_set_kv_buffer"] if case.fused else ["set_kv_buffer"] if case.save_kv_cache else []
        if called != write + [KERNELS[case.mode], "returned"]:
            wrong[name] = called
    assert wrong == {}


@pytest.mark.parametrize("release", RELEASES)
def test_unpatched_differs_from_the_oracle_exactly_where_the_bug_bites(release):
    cases = release_cases(release)
    expected = sorted(name for name, case in cases.items() if bug_bites(case))
    differing = sorted(name for name in cases if unpatched_calls(release)[name] != oracle_calls(release)[name])
    assert differing == expected


@pytest.mark.parametrize("release", RELEASES)
def test_harness_can_fail_on_the_fp8_v_scale(release):
    """An FP8 cache with a V scale of 4: the release passes bmm2_scale 1, the fix 4, on every path."""
    names = [name for name, case in release_cases(release).items() if case.kv == "fp8" and case.scales == "float"]
    assert names and all(unpatched_calls(release)[n] != oracle_calls(release)[n] for n in names)


@pytest.mark.parametrize("release", RELEASES)
def test_patched_release_equals_the_oracle_on_every_case(release):
    module = fp8_cases.load_backend_module(release_selection.release_dir(release))
    assessment = detect.assess_module(HOTFIX, module)
    assert assessment.verdict.value == "affected", assessment.reason
    oracle = oracle_calls(release)
    try:
        patch.wrap(HOTFIX, module, assessment)
        mismatches = {}
        for name, case in release_cases(release).items():
            patched = fp8_cases.kernel_calls(module, case)
            if patched != oracle[name]:
                mismatches[name] = first_difference(patched, oracle[name])
    finally:
        patch.remove_all()
    assert mismatches == {}
