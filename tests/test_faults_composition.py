"""The fault matrix, round 2: the hotfix composes with other patchers and odd
callers, and never raises where SGLang's method would not.

Every record, on SGLang 0.5.12's own code (its class compiled from the
release's file, in this process: ``isolated_release`` for pr26521,
``swa_cases`` with SGLang's real pools for pr25103, ``fp8_cases`` with
FlashInfer's kernels recorded for pr28144 and pr31667; for the Blackwell records, which have no
bug in 0.5.12, their own releases: 0.5.8.post1 for pr17732, 0.5.9 with SGLang's real SWAKVPool for
pr19107), under every kind of
patcher an SGLang host meets on the same method: SGLang's real
``HookRegistry`` (each ``HookType`` the installed release has), a wrapt
``FunctionWrapper``, a ``functools.wraps`` decorator and a plain reassignment;
each installed below the hotfix (before it), above it (after it), above it and
then taken off again. The rule each case holds: the hotfix works exactly as
it does alone (the oracle's result), or it stands aside with one warning, and
``patch.is_patched`` says which.
"""

import gc
import functools
import logging
import sys
import types

import pytest
import torch
import wrapt

import capture_harness
import fp8_cases
import isolated_release
import release_selection
import swa_cases
import swa_write_cases
from sglang_hotfix_trtllm import engine, logs, patch
from sglang_hotfix_trtllm.records import pr17732, pr19107, pr25103, pr26521, pr28144, pr31667
from upstream_fix import upstream_fixed_method

RELEASE = "0.5.12"
ALIAS = "hotfix_composition_target"  # the module's name in sys.modules while HookRegistry resolves it


@pytest.fixture
def lines():
    """The hotfix's log lines of one test, and a fresh 'once' memory."""
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append((record.levelname, record.getMessage()))

    handler = Keep(level=logging.DEBUG)
    logs.logger.addHandler(handler)
    saved = set(logs._said)
    logs._said.clear()
    yield records
    logs.logger.removeHandler(handler)
    logs._said.clear()
    logs._said.update(saved)


@pytest.fixture
def registry():
    hook_registry = pytest.importorskip("sglang.srt.plugins.hook_registry")
    hook_registry.HookRegistry.reset()
    yield hook_registry
    hook_registry.HookRegistry.reset()
    sys.modules.pop(ALIAS, None)


# --------------------------------------------------------------------------
# The two records, each with a check of "exactly as alone"


class Capture:
    """pr26521 on 0.5.12's capture method: the draft-decode capture against the oracle
    (the same method with PR #26521's statement inserted)."""

    hotfix = pr26521.HOTFIX

    def __init__(self):
        self.module = isolated_release.load_backend_module(release_selection.release_dir(RELEASE))
        self.cls = self.module.TRTLLMHAAttnBackend
        self.oracle = upstream_fixed_method(self.module)
        self.original = self.cls.__dict__[self.hotfix.method_name]

    def outcome(self):
        """'as-alone' when every capture equals the oracle's, 'unpatched' when it equals SGLang's own."""
        results = set()
        for step_id in (0, 2):
            for bs in (4, 1):
                req_pool_indices, seq_lens = capture_harness.inputs(bs, seed=bs + step_id)
                states = {}
                for name, function in (
                    ("now", capture_harness.via_instance),
                    ("oracle", self.oracle),
                    ("unpatched", self.original),
                ):
                    backend = capture_harness.make_backend(self.cls, step_id)
                    capture_harness.call(
                        function,
                        backend,
                        bs,
                        1,
                        req_pool_indices,
                        seq_lens,
                        self.module.ForwardMode.DECODE,
                        capture_harness.SPEC_INFO,
                        "keyword",
                    )
                    states[name] = capture_harness.snapshot(backend)
                results.add(
                    "as-alone"
                    if not capture_harness.differences(states["now"], states["oracle"])
                    else "unpatched"
                    if not capture_harness.differences(states["now"], states["unpatched"])
                    else "other"
                )
        assert len(results) == 1, results
        return results.pop()


class SlidingWindowPool:
    """pr25103 on 0.5.12's ``__init__`` with SGLang's real pools: every model
    runner of ``swa_cases`` against what 0.5.13's resolver returns."""

    hotfix = pr25103.HOTFIX

    def __init__(self):
        self.module = swa_cases.load_backend_module(release_selection.release_dir(RELEASE))
        self.cls = self.module.TRTLLMHAAttnBackend
        self.original = self.cls.__dict__[self.hotfix.method_name]
        self.upstream = swa_cases.upstream(release_selection.release_dir("0.5.13"))
        self.cases = swa_cases.cases(release_selection.release_dir("0.5.11"))

    @staticmethod
    def _as_0_5_13_sees_it(runner):
        """0.5.13 asks ``is_frozen_kv_mtp()``, which the enum of releases before 0.5.12 lacks."""
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        return types.SimpleNamespace(
            **dict(vars(runner), spec_algorithm=SpeculativeAlgorithm[runner.spec_algorithm.name])
        )

    def outcome(self):
        """'as-alone' when every case resolves 0.5.13's pool, 'unpatched' when every
        case keeps 0.5.12's; cases where the two agree count for both."""
        results = {"as-alone", "unpatched"}
        for name, (world, runner) in self.cases.items():
            backend = self.cls(runner)
            pool = self.upstream._resolve_swa_kv_pool(self._as_0_5_13_sees_it(runner))
            unpatched = self.cls.__new__(self.cls)
            self.original(unpatched, runner)
            seen = (backend._swa_kv_pool, backend.use_sliding_window_kv_pool)
            if seen != (pool, pool is not None):
                results.discard("as-alone")
            if seen != (unpatched._swa_kv_pool, unpatched.use_sliding_window_kv_pool):
                results.discard("unpatched")
        # The cases include drafts on which 0.5.12 and 0.5.13 differ: the two outcomes are told apart.
        assert len(results) == 1, results
        return results.pop()


class FlashInferScales:
    """pr28144 on 0.5.12's ``forward_decode`` (the method the patchers here sit on): what
    FlashInfer's kernel receives, recorded, against the same method with upstream's change applied
    (``fp8_cases.upstream_module``), on decode cases where the two differ (FP8 and BF16 caches,
    scales that bite, XQA and TRT-LLM-GEN). ``forward_extend``, wrapped with it, is not under
    the other patcher: its repair does not depend on what happens to ``forward_decode``."""

    hotfix = pr28144.HOTFIX
    release = RELEASE
    oracle_changes = {}  # fp8_cases.upstream_module's default: pr28144's change

    @staticmethod
    def chosen(case):
        return case.mode == "decode" and case.scales == "float" and not case.save_kv_cache

    def __init__(self):
        release_dir = release_selection.release_dir(self.release)
        self.module = fp8_cases.load_backend_module(release_dir)
        self.cls = self.module.TRTLLMHAAttnBackend
        self.original = self.cls.__dict__[self.hotfix.method_name]
        self.cases = [case for case in fp8_cases.cases(self.release).values() if self.chosen(case)]
        oracle = fp8_cases.upstream_module(
            release_dir, release_selection.release_dir(fp8_cases.FIXED_RELEASE), **self.oracle_changes
        )
        self.expected = {
            "as-alone": [fp8_cases.kernel_calls(oracle, case) for case in self.cases],
            "unpatched": [fp8_cases.kernel_calls(self.module, case) for case in self.cases],
        }
        assert self.expected["as-alone"] != self.expected["unpatched"]

    def outcome(self):
        now = [fp8_cases.kernel_calls(self.module, case) for case in self.cases]
        found = [name for name, calls in self.expected.items() if calls == now]
        return found[0] if found else "other"

    def close(self):
        for name in self.hotfix.also:  # the record's other methods, not under the patcher: put back
            setattr(self.cls, name, self.cls.__dict__[name])


class PackedQuery(FlashInferScales):
    """pr31667 on 0.5.12's ``forward_decode``: what FlashInfer's kernel receives against the same
    method with PR #31667 applied from 0.5.16's file, on XQA decode cases with a strided query
    (where the two differ) and BF16 / FP8 caches without scales (pr28144 has nothing to do there:
    it is this record alone on the shared method)."""

    hotfix = pr31667.HOTFIX

    @property
    def oracle_changes(self):
        return dict(scales=False, packed_query_dir=release_selection.release_dir("0.5.16"))

    @staticmethod
    def chosen(case):
        return (
            case.mode == "decode"
            and case.scales == "absent"
            and case.xqa
            and case.layout == "strided"
            and not case.save_kv_cache
        )


class CanonicalStrides(FlashInferScales):
    """pr17732 on 0.5.8.post1's ``forward_decode`` (it has no bug in 0.5.12): what FlashInfer's
    kernel receives against the same method with PR #17732 applied from 0.5.9's file, on decode
    cases without scales (pr28144, affected there too, is not applied: this record alone on the
    shared method), one KV head: every case differs."""

    hotfix = pr17732.HOTFIX
    release = "0.5.8.post1"

    @property
    def oracle_changes(self):
        return dict(scales=False, canonical_strides_dir=release_selection.release_dir("0.5.9"))

    @staticmethod
    def chosen(case):
        return case.mode == "decode" and case.scales == "absent" and not case.save_kv_cache


class SlidingWindowWrite:
    """pr19107 on 0.5.9's ``_fused_fp8_set_kv_buffer`` (it has no bug in 0.5.12): what SGLang's fused
    FP8 write receives on SGLang's real SWAKVPool (``swa_write_cases``), against 0.5.9 with PR #19107
    applied from 0.5.10's file."""

    hotfix = pr19107.HOTFIX

    def __init__(self):
        release_dir = release_selection.release_dir(swa_write_cases.RELEASE)
        self.module, oracle = swa_write_cases.modules(release_dir)
        self.cls = self.module.TRTLLMHAAttnBackend
        self.original = self.cls.__dict__[self.hotfix.method_name]
        self.expected = {
            "as-alone": swa_write_cases.helper_calls(oracle, True),
            "unpatched": swa_write_cases.helper_calls(self.module, True),
        }
        assert self.expected["as-alone"] != self.expected["unpatched"]

    def outcome(self):
        now = swa_write_cases.helper_calls(self.module, True)
        found = [name for name, calls in self.expected.items() if calls == now]
        return found[0] if found else "other"


RECORDS = {
    "pr26521": Capture,
    "pr25103": SlidingWindowPool,
    "pr28144": FlashInferScales,
    "pr31667": PackedQuery,
    "pr17732": CanonicalStrides,
    "pr19107": SlidingWindowWrite,
}


@pytest.fixture(params=list(RECORDS))
def record(request):
    target = RECORDS[request.param]()
    yield target
    patch.remove_all()
    setattr(target.cls, target.hotfix.method_name, target.original)
    getattr(target, "close", lambda: None)()


# --------------------------------------------------------------------------
# The patchers: each installs itself on the class attribute as it is now.


def _hook_registry(kind):
    def install(record, registry):
        hook_type = registry.HookType[kind]
        hook = {
            "BEFORE": lambda *args, **kwargs: None,
            "AFTER": lambda result, *args, **kwargs: None,
            "AROUND": lambda original, *args, **kwargs: original(*args, **kwargs),
            # A plugin's own implementation; here SGLang's, so that only who runs differs.
            "REPLACE": lambda *args, **kwargs: record.original(*args, **kwargs),
        }[kind]
        sys.modules[ALIAS] = record.module
        registry.HookRegistry.reset()
        registry.HookRegistry.register(
            "%s.%s.%s" % (ALIAS, record.cls.__name__, record.hotfix.method_name), hook, hook_type
        )
        registry.HookRegistry.apply_hooks()

    return install


def _wrapt_wrapper(record, registry):
    wrapt.wrap_function_wrapper(
        record.cls, record.hotfix.method_name, lambda wrapped, instance, args, kwargs: wrapped(*args, **kwargs)
    )


def _functools_wraps(record, registry):
    current = record.cls.__dict__[record.hotfix.method_name]

    @functools.wraps(current)
    def timed(*args, **kwargs):
        return current(*args, **kwargs)

    setattr(record.cls, record.hotfix.method_name, timed)


def _plain_reassignment(record, registry):
    original = record.original

    def replacement(*args, **kwargs):  # a vendor's own method, which happens to call SGLang's
        return original(*args, **kwargs)

    setattr(record.cls, record.hotfix.method_name, replacement)


PATCHERS = {
    "hook_registry_before": _hook_registry("BEFORE"),
    "hook_registry_after": _hook_registry("AFTER"),
    "hook_registry_around": _hook_registry("AROUND"),
    "hook_registry_replace": _hook_registry("REPLACE"),
    "wrapt_function_wrapper": _wrapt_wrapper,
    "functools_wraps_decorator": _functools_wraps,
    "plain_reassignment": _plain_reassignment,
}
# Patchers that call what they wrap: above the hotfix, the hotfix stays in force.
CALL_THROUGH = {
    "hook_registry_before",
    "hook_registry_after",
    "hook_registry_around",
    "wrapt_function_wrapper",
    "functools_wraps_decorator",
}


def _warnings(lines):
    return [message for level, message in lines if level == "WARNING"]


@pytest.mark.parametrize("patcher", list(PATCHERS))
def test_another_patcher_below_the_hotfix_makes_it_stand_aside_with_one_warning(record, patcher, registry, lines):
    PATCHERS[patcher](record, registry)
    theirs = record.cls.__dict__[record.hotfix.method_name]
    assert engine.handle(record.hotfix, record.module) == "refused"
    assert record.cls.__dict__[record.hotfix.method_name] is theirs
    assert not patch.is_patched(record.hotfix, record.cls)
    (warning,) = _warnings(lines)
    assert "stands aside" in warning or "replaced by someone else" in warning or "compiled from" in warning, warning
    assert "SGLang runs without this record's fix" in warning and record.hotfix.target in warning
    assert "for record %s" % record.hotfix.name in warning  # issue 36, item 4: the line names its record
    assert record.outcome() == "unpatched"  # and nothing raised on the way


@pytest.mark.parametrize("patcher", list(PATCHERS))
def test_another_patcher_above_the_hotfix_keeps_it_exact_or_reports_it_gone(record, patcher, registry, lines):
    assert engine.handle(record.hotfix, record.module) == "patched"
    PATCHERS[patcher](record, registry)
    if patcher in CALL_THROUGH:
        assert patch.is_patched(record.hotfix, record.cls)
        assert record.outcome() == "as-alone"
    elif record.hotfix.mechanism == "edit":
        # Their method calls SGLang's function, which runs upstream's code: repaired. Whether a
        # replacement calls it cannot be seen, so the record does not claim it (never more).
        assert not patch.is_patched(record.hotfix, record.cls)
        assert record.outcome() == "as-alone"
    else:  # their own method replaces SGLang's, and the hotfix with it: status says so
        assert not patch.is_patched(record.hotfix, record.cls)
        assert record.outcome() == "unpatched"
    assert _warnings(lines) == []
    # remove(): ours on top is put back; ours under theirs is turned off in place.
    patch.remove_all()
    assert not patch.is_patched(record.hotfix, record.cls)
    assert record.outcome() == "unpatched"


@pytest.mark.parametrize("patcher", list(PATCHERS))
def test_the_other_patcher_taken_off_again_leaves_the_hotfix_exact(record, patcher, registry, lines):
    assert engine.handle(record.hotfix, record.module) == "patched"
    ours = record.cls.__dict__[record.hotfix.method_name]
    PATCHERS[patcher](record, registry)
    setattr(record.cls, record.hotfix.method_name, ours)  # the other patcher undoes itself
    assert patch.is_patched(record.hotfix, record.cls)
    assert record.outcome() == "as-alone"
    assert engine.handle(record.hotfix, record.module) == "already"


def test_hook_registry_after_hook_below_pr25103_no_longer_breaks_every_construction(registry, lines):
    """The serious case of 0.3.0: the wrapper read SWAKVPool from the globals of
    the function it wrapped (hook_registry's) and raised KeyError at each
    construction. Applied on top by force here (as 0.3.0 did), the repair
    takes the name from the module it was applied to."""
    target = SlidingWindowPool()
    try:
        _hook_registry("AFTER")(target, registry)
        theirs = target.cls.__dict__["__init__"]
        forced = patch.HotfixWrapper(theirs, functools.partial(pr25103.HOTFIX.wrapper, target.module))
        target.cls.__init__ = forced
        assert target.outcome() == "as-alone"
    finally:
        target.cls.__init__ = target.original


# --------------------------------------------------------------------------
# Class 2: the wrapper never raises where SGLang's method does not.


class _Without:
    """A model runner that lacks one attribute: every other is the real one's."""

    def __init__(self, runner, missing):
        self.__runner, self.__missing = runner, missing

    def __getattr__(self, name):
        if name == self.__missing:
            raise AttributeError("%r object has no attribute %r (simulated)" % ("ModelRunner", name))
        return getattr(self.__runner, name)


@pytest.mark.parametrize(
    "missing", ["token_to_kv_pool", "is_draft_worker", "spec_algorithm", "token_to_kv_pool_allocator"]
)
def test_pr25103_leaves_sglangs_pool_when_the_runner_lacks_what_the_repair_reads(missing, lines):
    target = SlidingWindowPool()
    world, runner = target.cases["eagle3_draft"]
    odd = _Without(runner, missing)
    unpatched = target.cls.__new__(target.cls)
    try:
        target.original(unpatched, odd)
    except AttributeError:
        sglang_raises = True  # SGLang's own __init__ reads it too: then so may we
    else:
        sglang_raises = False
    # what SGLang's own __init__ made, kept without the backend: a live backend built by the
    # release's __init__ makes the record stand aside (code_edit.refuse_when_built_before)
    made = {name: vars(unpatched).get(name) for name in ("_swa_kv_pool", "use_sliding_window_kv_pool")}
    del unpatched
    gc.collect()
    assert engine.handle(target.hotfix, target.module) == "patched"
    try:
        if sglang_raises:
            with pytest.raises(AttributeError):
                target.cls(odd)
            return
        backend = target.cls(odd)
        target.cls(odd)  # the warning is said once per process
    finally:
        patch.remove_all()
    assert backend._swa_kv_pool is made["_swa_kv_pool"]
    assert backend.use_sliding_window_kv_pool is made["use_sliding_window_kv_pool"]
    (warning,) = _warnings(lines)
    assert "not repairing a call of" in warning and missing in warning and "pr25103" in warning


def test_pr25103_without_the_pool_class_in_its_module_leaves_sglangs_pool(lines):
    target = SlidingWindowPool()
    world, runner = target.cases["eagle3_draft"]
    assert engine.handle(target.hotfix, target.module) == "patched"
    saved = target.module.__dict__.pop("SWAKVPool")
    try:
        backend = target.cls(runner)
    finally:
        target.module.SWAKVPool = saved
        patch.remove_all()
    assert backend.use_sliding_window_kv_pool is True  # as 0.5.12 set it
    (warning,) = _warnings(lines)
    assert "KeyError" in warning and "SWAKVPool" in warning


@pytest.mark.parametrize("missing", ["decode_cuda_graph_metadata", "speculative_step_id"])
def test_pr26521_writes_nothing_and_lets_sglang_speak_when_the_backend_lacks_what_it_reads(missing, lines):
    target = Capture()
    req_pool_indices, seq_lens = capture_harness.inputs(2, seed=1)
    forward_mode = target.module.ForwardMode.DECODE

    def attempt(function):
        backend = capture_harness.make_backend(target.cls, 0)
        delattr(backend, missing)
        try:
            capture_harness.call(
                function, backend, 2, 1, req_pool_indices, seq_lens, forward_mode, capture_harness.SPEC_INFO, "keyword"
            )
        except Exception as error:
            return type(error), str(error)
        return None

    alone = attempt(target.original)
    assert engine.handle(target.hotfix, target.module) == "patched"
    try:
        under_hotfix = attempt(capture_harness.via_instance)
    finally:
        patch.remove_all()
    assert under_hotfix == alone  # SGLang's own error, or none, whatever the hotfix does
    (warning,) = _warnings(lines)
    assert "not repairing a call of" in warning and missing in warning


def test_pr26521_with_lengths_it_cannot_add_to_leaves_sglangs_capture_alone(lines):
    """SGLang's capture only asks ``seq_lens`` for ``.device`` and ``.max()``; an
    object with just those (a tool's stand-in) passes there, and must here."""
    target = Capture()
    odd = types.SimpleNamespace(max=lambda: torch.tensor(3), device="cpu")  # `odd + 1` raises TypeError
    forward_mode = target.module.ForwardMode.DECODE
    alone = capture_harness.make_backend(target.cls, 0)
    target.original(alone, 2, 2, torch.arange(2), odd, None, forward_mode, capture_harness.SPEC_INFO)
    assert engine.handle(target.hotfix, target.module) == "patched"
    try:
        backend = capture_harness.make_backend(target.cls, 0)
        backend.init_forward_metadata_capture_cuda_graph(
            2, 2, torch.arange(2), odd, None, forward_mode, capture_harness.SPEC_INFO
        )
    finally:
        patch.remove_all()
    assert capture_harness.differences(capture_harness.snapshot(backend), capture_harness.snapshot(alone)) == []
    (warning,) = _warnings(lines)
    assert "not repairing a call of" in warning and "TypeError" in warning


# --------------------------------------------------------------------------
# pr28144's gate: the module's `flashinfer` while the record is applied


@pytest.fixture
def scales():
    target = FlashInferScales()
    yield target
    patch.remove_all()
    target.close()


def test_pr28144_no_module_global_is_replaced_and_remove_restores_the_very_code(scales, lines):
    """Records as upstream's code (0.14.0): the module's ``flashinfer`` is FlashInfer itself before,
    during and after; the methods stay SGLang's functions; remove() puts back the very code objects
    and apply() makes the repair again. (0.13 replaced the global by a gate at the first call that
    needed a repair.)"""
    own = scales.module.flashinfer
    functions = {name: scales.cls.__dict__[name] for name in scales.hotfix.method_names}
    codes = {name: function.__code__ for name, function in functions.items()}
    assert engine.handle(scales.hotfix, scales.module) == "patched"
    assert scales.outcome() == "as-alone" and scales.module.flashinfer is own
    assert all(scales.cls.__dict__[name] is function for name, function in functions.items())
    assert engine.handle(scales.hotfix, scales.module) == "already"
    patch.remove_all()
    assert all(functions[name].__code__ is codes[name] for name in functions)
    assert scales.module.flashinfer is own and scales.outcome() == "unpatched"
    assert engine.handle(scales.hotfix, scales.module) == "patched"
    assert scales.outcome() == "as-alone" and scales.module.flashinfer is own
    assert _warnings(lines) == []


def test_pr28144_an_error_inside_upstreams_code_propagates_as_upstreams_would(scales, lines):
    """A scale that cannot be read raises inside 0.5.15's ``_get_bmm_scales``, as it would upstream
    (0.13 made the release's call with one warning: a failure became the release's output)."""

    class Unreadable:
        def __float__(self):
            raise RuntimeError("simulated: the scale cannot be read")

        def __gt__(self, other):
            raise RuntimeError("simulated: the scale cannot be read")

    assert engine.handle(scales.hotfix, scales.module) == "patched"
    case = _fp8_decode_case(scales)
    original = fp8_cases._layer

    def layer(case):
        made = original(case)
        made.v_scale_float = Unreadable()
        return made

    fp8_cases._layer = layer
    try:
        with pytest.raises(RuntimeError, match="simulated: the scale cannot be read"):
            fp8_cases.kernel_calls(scales.module, case)
    finally:
        fp8_cases._layer = original
    assert _warnings(lines) == []


def test_pr28144_a_kernel_failure_with_upstreams_arguments_propagates_and_is_never_retried(scales, lines):
    """Item 4 of issue 28: 0.5.0 called the kernel again with the release's arguments when it raised
    (a transient out-of-memory, say) and returned that: a failure became wrong output."""
    kernel = scales.module.flashinfer.decode.trtllm_batch_decode_with_kv_cache
    calls = []

    def out_of_memory(**kwargs):
        calls.append(kwargs)
        raise RuntimeError("simulated: CUDA out of memory")

    scales.module.flashinfer.decode.trtllm_batch_decode_with_kv_cache = out_of_memory
    try:
        assert engine.handle(scales.hotfix, scales.module) == "patched"
        with pytest.raises(RuntimeError, match="simulated: CUDA out of memory"):
            fp8_cases.kernel_calls(scales.module, scales.cases[0])
        assert len(calls) == 1 and calls[0]["bmm2_scale"] == 4.0  # upstream's arguments, once
    finally:
        scales.module.flashinfer.decode.trtllm_batch_decode_with_kv_cache = kernel
    assert _warnings(lines) == []


def test_pr28144_after_remove_under_a_patcher_on_one_method_apply_brings_the_repair_back(scales, registry, lines):
    """remove() put forward_extend back and turned forward_decode's wrapper off under the other
    patcher's: apply() resumes the one and wraps the other again (all or none: all)."""
    assert engine.handle(scales.hotfix, scales.module) == "patched"
    _hook_registry("AROUND")(scales, registry)
    patch.remove_all()
    assert scales.outcome() == "unpatched"
    assert engine.handle(scales.hotfix, scales.module) == "patched"
    assert patch.is_patched(scales.hotfix, scales.cls) and scales.outcome() == "as-alone"


def test_pr28144_the_kernel_is_looked_up_at_each_call_as_sglang_does(scales, lines):
    """A kernel replaced while the record is applied (a profiler, a mock) is the one called."""
    assert engine.handle(scales.hotfix, scales.module) == "patched"
    scales.outcome()
    decode = scales.module.flashinfer.decode
    kernel, seen = decode.trtllm_batch_decode_with_kv_cache, []

    def profiled(**kwargs):
        seen.append(1)
        return kernel(**kwargs)

    decode.trtllm_batch_decode_with_kv_cache = profiled
    try:
        assert scales.outcome() == "as-alone" and len(seen) == len(scales.cases)
    finally:
        decode.trtllm_batch_decode_with_kv_cache = kernel


def test_pr28144_a_proxy_of_someone_elses_around_flashinfer_gets_upstreams_arguments_and_is_kept(scales, lines):
    """A tracer put over the module's ``flashinfer`` receives what upstream's code passes; the hotfix
    never touches it, and remove() leaves it there."""
    assert engine.handle(scales.hotfix, scales.module) == "patched"
    tracer = wrapt.ObjectProxy(scales.module.flashinfer)
    scales.module.flashinfer = tracer
    assert patch.is_patched(scales.hotfix, scales.cls) and scales.outcome() == "as-alone"
    assert engine.handle(scales.hotfix, scales.module) == "already" and scales.module.flashinfer is tracer
    patch.remove_all()
    assert scales.module.flashinfer is tracer and scales.outcome() == "unpatched"
    assert _warnings(lines) == []


# --------------------------------------------------------------------------
# Routes to the kernel that pass through the gate's names (issue 28, item 5)


def _fp8_decode_case(scales):
    return next(c for c in scales.cases if c.kv == "fp8")


def test_pr28144_mock_patch_of_the_kernel_through_the_backends_name_gets_upstreams_arguments(scales, lines):
    """``mock.patch("<backend>.flashinfer.decode.<kernel>")`` patches FlashInfer's own submodule,
    as without the hotfix, and the mock receives upstream's arguments (0.5.0: the release's,
    bmm2 1.0, since the mock landed on 0.5.0's gate); leaving the context puts FlashInfer's own
    kernel back."""
    from unittest import mock

    assert engine.handle(scales.hotfix, scales.module) == "patched"
    scales.outcome()
    decode = scales.module.flashinfer.decode
    kernel = decode.trtllm_batch_decode_with_kv_cache
    sys.modules[ALIAS] = scales.module
    try:
        with mock.patch(ALIAS + ".flashinfer.decode.trtllm_batch_decode_with_kv_cache", wraps=kernel) as seen:
            fp8_cases.kernel_calls(scales.module, _fp8_decode_case(scales))
    finally:
        sys.modules.pop(ALIAS, None)
    assert seen.call_args.kwargs["bmm2_scale"] == 4.0 and seen.call_args.kwargs["bmm1_scale"] == 0.5 * 8**-0.5
    assert decode.trtllm_batch_decode_with_kv_cache is kernel
    assert _warnings(lines) == []


@pytest.mark.parametrize("kind", ["BEFORE", "AFTER", "AROUND", "REPLACE"])
@pytest.mark.parametrize("armed_first", [True, False])
def test_pr28144_hook_registry_hooks_on_the_kernel_see_upstreams_arguments(scales, registry, lines, kind, armed_first):
    """SGLang's HookRegistry on the kernel, through the backend's name: the hook wraps what the name
    holds, and the kernel call that reaches it (and FlashInfer's kernel) carries upstream's arguments,
    whether a call ran before the hook went in or not."""
    assert engine.handle(scales.hotfix, scales.module) == "patched"
    if armed_first:
        scales.outcome()
    decode = scales.module.flashinfer.decode
    kernel = decode.trtllm_batch_decode_with_kv_cache
    seen = []
    hook = {
        "BEFORE": lambda *args, **kwargs: seen.append(kwargs),
        "AFTER": lambda result, *args, **kwargs: seen.append(kwargs),
        "AROUND": lambda original, *args, **kwargs: seen.append(kwargs) or original(*args, **kwargs),
        "REPLACE": lambda *args, **kwargs: seen.append(kwargs) or kernel(*args, **kwargs),
    }[kind]
    sys.modules[ALIAS] = scales.module
    registry.HookRegistry.register(
        ALIAS + ".flashinfer.decode.trtllm_batch_decode_with_kv_cache", hook, registry.HookType[kind]
    )
    registry.HookRegistry.apply_hooks()
    try:
        assert scales.outcome() == "as-alone"
        scaling = fp8_cases.HEAD_DIM**-0.5
        upstream = [(1.0 * 0.5 * scaling, 4.0) if c.kv == "fp8" else (scaling, 1.0) for c in scales.cases]
        assert [(kwargs["bmm1_scale"], kwargs["bmm2_scale"]) for kwargs in seen] == upstream
    finally:
        decode.trtllm_batch_decode_with_kv_cache = kernel
    assert _warnings(lines) == []


def test_both_kernel_call_records_under_another_patcher_stay_exact_and_come_back_after_remove(registry, lines):
    """pr28144 applied, a wrapt wrapper put on top of SGLang's function, then pr31667's edit compiled
    into the same function below it: the kernel gets both repairs; remove() puts back the release's
    code (their wrapper stays, and calls it); apply again brings both back."""
    release_dir = release_selection.release_dir(RELEASE)
    module = fp8_cases.load_backend_module(release_dir)
    cls = module.TRTLLMHAAttnBackend
    original = cls.__dict__["forward_decode"]
    cases = [
        c
        for c in fp8_cases.cases(RELEASE).values()
        if c.mode == "decode" and c.kv == "fp8" and c.scales == "float" and c.xqa and not c.save_kv_cache
    ]
    both = fp8_cases.upstream_module(
        release_dir,
        release_selection.release_dir(fp8_cases.FIXED_RELEASE),
        packed_query_dir=release_selection.release_dir("0.5.16"),
    )
    expected = [fp8_cases.kernel_calls(both, c) for c in cases]
    unpatched = [fp8_cases.kernel_calls(module, c) for c in cases]
    assert expected != unpatched
    try:
        assert engine.handle(pr28144.HOTFIX, module) == "patched"
        wrapt.wrap_function_wrapper(
            cls, "forward_decode", lambda wrapped, instance, args, kwargs: wrapped(*args, **kwargs)
        )
        assert engine.handle(pr31667.HOTFIX, module) == "patched"
        assert patch.is_patched(pr28144.HOTFIX, cls) and patch.is_patched(pr31667.HOTFIX, cls)
        assert [fp8_cases.kernel_calls(module, c) for c in cases] == expected
        patch.remove_all()
        assert [fp8_cases.kernel_calls(module, c) for c in cases] == unpatched
        assert not patch.is_patched(pr28144.HOTFIX, cls) and not patch.is_patched(pr31667.HOTFIX, cls)
        assert engine.handle(pr31667.HOTFIX, module) == "patched" and engine.handle(pr28144.HOTFIX, module) == "patched"
        assert [fp8_cases.kernel_calls(module, c) for c in cases] == expected
    finally:
        patch.remove_all()
        setattr(cls, "forward_decode", original)
        setattr(cls, "forward_extend", cls.__dict__["forward_extend"])
    assert _warnings(lines) == []


def test_remove_under_another_wrapper_says_the_method_is_turned_off_not_restored(registry, lines):
    """0.6.0's INFO line said "restored to SGLang's original" for a method only turned off in place
    under another wrapper (which stays on the class)."""
    record = Capture()
    try:
        assert engine.handle(record.hotfix, record.module) == "patched"
        _wrapt_wrapper(record, registry)
        assert patch.remove_all() == 1
    finally:
        setattr(record.cls, record.hotfix.method_name, record.original)
    (said,) = [message for level, message in lines if level == "INFO" and message.startswith(logs.PREFIX + "removed:")]
    assert (
        said
        == logs.PREFIX
        + "removed: 0 method(s) restored to SGLang's original, 1 turned off in place under another wrapper"
    )
    assert record.outcome() == "unpatched"
