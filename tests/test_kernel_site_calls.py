"""Issue 36 (trust, round 3), items 2 and 3: what one call of the kernel-call site's methods may do
to another, and what ``remove()`` with a call in flight says.

The site repairs a call in one of two ways: on the method's own query before SGLang's method runs
(pr31667's packed query), or at the kernel call, through the gate, for a call noted while it runs
(pr28144's scales). Foreign code running inside the method before its kernel call (a KV-pool hook,
an accuracy checker) may call another layer's ``forward_decode``, or the kernel itself: that call
must get its own arguments, and the outer call its repair. SGLang 0.5.12's own module
(``fp8_cases``), XQA, each record with a call that needs its repair and one that needs none:

* pr31667: a strided query (BF16 cache) needs it, a packed one needs none;
* pr28144: an FP8 cache with K/V scales 0.5 and 4 needs it (the kernel gets bmm2_scale 4.0, the
  release 1.0), a BF16 cache without scales needs none.
"""

import dataclasses
import logging
import random
import threading
import typing

import pytest
import torch

import fp8_cases
import release_selection
from sglang_hotfix_trtllm import detect, logs, patch
from sglang_hotfix_trtllm.records import pr28144, pr31667

RELEASE = "0.5.12"


@dataclasses.dataclass(frozen=True)
class Record:
    hotfix: typing.Any
    needs: dict  # the case fields of a call that needs the repair
    none: dict  # ... of one that needs none
    repaired: typing.Callable  # kernel kwargs -> True where the record's repair is in them


RECORDS = {
    "pr31667": Record(
        pr31667.HOTFIX,
        needs=dict(kv="bf16", scales="absent", layout="strided"),
        none=dict(kv="bf16", scales="absent", layout="packed"),
        repaired=lambda kwargs: kwargs["query"].is_contiguous(),
    ),
    "pr28144": Record(
        pr28144.HOTFIX,
        needs=dict(kv="fp8", scales="float", layout="strided"),
        none=dict(kv="bf16", scales="absent", layout="strided"),
        repaired=lambda kwargs: kwargs["bmm2_scale"] == 4.0,
    ),
}
GATED = RECORDS["pr28144"]  # the record whose repair goes through the gate


def _case(fields):
    cases = fp8_cases.cases(RELEASE)
    return next(
        c
        for c in cases.values()
        if c.mode == "decode"
        and c.xqa
        and not c.save_kv_cache
        and all(getattr(c, name) == value for name, value in fields.items())
    )


def _backend_and_arguments(module, case, seed, pool_hook=None):
    """A backend over a pool of its own and the positional arguments of its ``forward_decode``
    (q, k, v, layer, forward batch) for ``case``."""
    generator = torch.Generator().manual_seed(seed)
    pool = fp8_cases.KVPool(fp8_cases.CallLog(), fp8_cases.KV_DTYPES[case.kv], generator)
    if pool_hook is not None:
        original = pool.get_kv_buffer
        pool.get_kv_buffer = lambda layer_id: (pool_hook(), original(layer_id))[1]
    q, k, v = fp8_cases.inputs(case, generator)
    backend = fp8_cases._backend(module, case, pool)
    return backend, (q, k, v, fp8_cases._layer(case), fp8_cases._forward_batch(module, case, pool))


def _call(module, case, seed, pool_hook=None):
    backend, arguments = _backend_and_arguments(module, case, seed, pool_hook)
    return lambda: backend.forward_decode(*arguments, save_kv_cache=False, sinks=None), arguments[0]


def _kernel_calls(module):
    """The keyword arguments of each decode kernel call, in order."""
    return [arguments for name, arguments in fp8_cases._LOGS[module] if name.startswith("decode.")]


def _queries(module):
    return [arguments["query"] for arguments in _kernel_calls(module)]


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_a_nested_call_needing_no_repair_gets_its_own_arguments_and_the_outer_call_its_repair(name):
    record = RECORDS[name]
    module = fp8_cases.load_backend_module(release_selection.release_dir(RELEASE))
    inner, inner_q = _call(module, _case(record.none), 1)
    outer, outer_q = _call(module, _case(record.needs), 2, pool_hook=inner)
    patch.wrap(record.hotfix, module, detect.assess_module(record.hotfix, module))
    try:
        del fp8_cases._LOGS[module][:]
        outer()
    finally:
        patch.remove_all()
    inner_seen, outer_seen = _kernel_calls(module)
    # The inner call: SGLang's own query (its reshape of its q), not the outer call's, unrepaired.
    assert inner_seen["query"].data_ptr() == inner_q.data_ptr() and torch.equal(inner_seen["query"].flatten(1), inner_q)
    assert inner_seen["bmm2_scale"] == 1.0
    # The outer call: the repair, its own values.
    assert record.repaired(outer_seen)
    assert torch.equal(outer_seen["query"].flatten(1), outer_q)


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_remove_with_a_call_in_flight_says_nothing_of_a_failure(caplog, name):
    """remove() while a call that needs a repair runs: no WARNING says the kernel call missed the
    gate (the operator removed the hotfix on purpose; a noted call finishes as with the record off)."""
    record = RECORDS[name]
    module = fp8_cases.load_backend_module(release_selection.release_dir(RELEASE))
    outer, _ = _call(module, _case(record.needs), 3, pool_hook=lambda: patch.remove_all())
    patch.wrap(record.hotfix, module, detect.assess_module(record.hotfix, module))
    try:
        with caplog.at_level(logging.DEBUG, logger="sglang_hotfix_trtllm"):
            outer()
    finally:
        patch.remove_all()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == []


def test_the_kernel_as_the_gated_module_hands_it_out_says_what_the_kernel_says_of_itself():
    """Item 6: a HookRegistry hook's ``functools.wraps`` of the kernel, or a profiler's label, read
    the hotfix's ``__module__`` and ``__doc__``. They are the kernel's now, and ``__wrapped__`` leads
    to it (``inspect.signature``, ``inspect.unwrap``). What still differs is documented
    (docs/design.md, Limits): it is not a function object, and ``importlib.reload`` of the gated
    global cannot work."""
    import functools
    import inspect

    module = fp8_cases.load_backend_module(release_selection.release_dir(RELEASE))
    recorder = module.flashinfer.decode.trtllm_batch_decode_with_kv_cache

    def trtllm_batch_decode_with_kv_cache(query, kv_cache, workspace_buffer, **kwargs):
        """FlashInfer's docstring."""
        return recorder(query=query, kv_cache=kv_cache, workspace_buffer=workspace_buffer, **kwargs)

    trtllm_batch_decode_with_kv_cache.__module__ = "flashinfer.decode"
    module.flashinfer.decode.trtllm_batch_decode_with_kv_cache = trtllm_batch_decode_with_kv_cache
    call, _ = _call(module, _case(GATED.needs), 4)
    patch.wrap(GATED.hotfix, module, detect.assess_module(GATED.hotfix, module))
    try:
        call()  # needs the repair: arms the gate
        handed_out = module.flashinfer.decode.trtllm_batch_decode_with_kv_cache
        assert handed_out is not trtllm_batch_decode_with_kv_cache  # the gate's stand-in
        for name in ("__module__", "__name__", "__qualname__", "__doc__"):
            assert getattr(handed_out, name) == getattr(trtllm_batch_decode_with_kv_cache, name), name
        assert inspect.unwrap(handed_out) is trtllm_batch_decode_with_kv_cache
        assert inspect.signature(handed_out) == inspect.signature(trtllm_batch_decode_with_kv_cache)
        hooked = functools.wraps(handed_out)(lambda *a, **k: handed_out(*a, **k))
        assert (hooked.__module__, hooked.__doc__) == ("flashinfer.decode", "FlashInfer's docstring.")
    finally:
        patch.remove_all()


def _needing_call_through(module, record, seed):
    """A call that needs ``record``'s repair, on an instance of whatever the module binds as the
    class now (``fp8_cases`` builds the backend from ``module.TRTLLMHAAttnBackend``): True where
    its kernel got the repair."""
    call, _ = _call(module, _case(record.needs), seed)
    del fp8_cases._LOGS[module][:]
    call()
    return record.repaired(_kernel_calls(module)[-1])


def _replace_with_a_subclass(module):
    """What SGLang's HookRegistry REPLACE (or any plugin) does: a subclass in the class's place."""
    base = module.TRTLLMHAAttnBackend
    subclass = type("PluginTRTLLMHAAttnBackend", (base,), {"__module__": "some_plugin"})
    module.TRTLLMHAAttnBackend = subclass
    return base, subclass


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_a_subclass_put_in_the_class_place_after_apply_gets_the_repair_and_survives_remove_and_apply(caplog, name):
    """Item 1: the subclass inherited the wrapped forward_decode, yet the gate "could not be put"
    (it looked for the record's wrappers on the class the module now binds), every call ran
    unrepaired, and remove() then apply() failed with KeyError: 'forward_decode'."""
    record = RECORDS[name]
    module = fp8_cases.load_backend_module(release_selection.release_dir(RELEASE))
    patch.wrap(record.hotfix, module, detect.assess_module(record.hotfix, module))
    try:
        base, subclass = _replace_with_a_subclass(module)
        with caplog.at_level(logging.WARNING, logger="sglang_hotfix_trtllm"):
            assert _needing_call_through(module, record, 6)
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
        assert patch.remove_all() >= 1 and not _needing_call_through(module, record, 7)
        assert patch.wrap(record.hotfix, module, detect.assess_module(record.hotfix, module)) == "wrapped"
        assert _needing_call_through(module, record, 8)
        assert "forward_decode" not in subclass.__dict__  # the record wraps the class SGLang defines
    finally:
        patch.remove_all()


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_a_subclass_put_in_the_class_place_before_apply_gets_the_repair(name):
    record = RECORDS[name]
    module = fp8_cases.load_backend_module(release_selection.release_dir(RELEASE))
    _replace_with_a_subclass(module)
    try:
        assert patch.wrap(record.hotfix, module, detect.assess_module(record.hotfix, module)) == "wrapped"
        assert _needing_call_through(module, record, 9)
    finally:
        patch.remove_all()


def test_a_class_that_does_not_derive_from_sglangs_in_its_place_is_refused_by_name():
    module = fp8_cases.load_backend_module(release_selection.release_dir(RELEASE))
    module.TRTLLMHAAttnBackend = type("Unrelated", (), {})
    try:
        patch.wrap(GATED.hotfix, module, detect.assess_module(GATED.hotfix, module))
    except patch.NotWrappable as error:
        assert "does not derive from the class the module's source defines" in str(error)
    else:
        raise AssertionError("wrapped a class that is not SGLang's")
    finally:
        patch.remove_all()


# --------------------------------------------------------------------------
# Property (issue 36): no sequence of nested, concurrent, removed and re-applied calls lets one
# call's repair reach another call's kernel, or leaves a call unrepaired without a WARNING naming
# the record. Run for each record: pr31667 (repaired before SGLang's method) and pr28144 (through
# the gate).
#
# A program is a tree of calls of SGLang 0.5.12's own forward_decode (XQA, each call its own
# backend, layer, seed and query: one that needs the record's repair, or one that needs none). What
# runs inside a call, between the method's start and its kernel call (in the KV pool's
# get_kv_buffer, where a pool hook or an accuracy checker runs), is a list of steps: another call,
# the same in a new thread (joined before the outer call goes on, or left running beside it until
# the outer kernel call is made), a call of the kernel itself through the module's ``flashinfer``
# with a query and scales of its own (a checker calling FlashInfer directly), remove() or apply().
# Programs are drawn from fixed seeds; each is checked against a model that knows only when the
# record was applied:
#
# * every call's kernel is called once, with that call's own query values (no other call's);
# * a call needing no repair gets SGLang's own query object and no repair; a direct kernel call
#   gets the very arguments it passed;
# * a call needing the repair during which the record stayed applied from its start to its return
#   gets upstream's arguments; one during which it stayed removed gets SGLang's own; one during
#   which remove() or apply() ran, in any thread, may get either (the operator changed it mid-call);
# * any WARNING names the record; a call left unrepaired while the record was applied throughout
#   is a failure whatever was logged.

PROGRAMS = 60
STEP_KINDS = ("call", "call", "thread", "beside", "direct", "remove", "apply")


def _draw_call(rng, depth):
    steps = []
    if depth < 3:
        for _ in range(rng.choice((0, 0, 1, 2, 3))):
            kind = rng.choice(STEP_KINDS)
            steps.append((kind, _draw_call(rng, depth + 1)) if kind in ("call", "thread", "beside") else (kind, None))
    return {"kind": rng.choice(("needs", "none")), "steps": steps}


class _Run:
    """One program's execution: the record's state (applied or not, and how many times it changed),
    and what each call saw."""

    def __init__(self, module, record):
        self.module, self.record, self.applied, self.changes, self.calls = module, record, False, 0, []
        self.lock = threading.Lock()
        self.seed = 100

    def apply(self):
        with self.lock:
            if not self.applied:
                hotfix = self.record.hotfix
                assert patch.wrap(hotfix, self.module, detect.assess_module(hotfix, self.module)) == "wrapped"
                self.applied, self.changes = True, self.changes + 1

    def remove(self):
        with self.lock:
            if self.applied:
                patch.remove_all()
                self.applied, self.changes = False, self.changes + 1

    def call(self, node):
        with self.lock:
            self.seed += 1
            seed = self.seed
        seen = {"kind": node["kind"], "errors": []}
        beside = []

        def hook():
            for kind, child in node["steps"]:
                if kind == "call":
                    self.call(child)
                elif kind == "direct":
                    self.direct()
                elif kind in ("thread", "beside"):
                    thread = threading.Thread(target=self._in_thread, args=(child, seen))
                    thread.start()
                    (beside.append if kind == "beside" else lambda t: t.join())(thread)
                else:
                    getattr(self, kind)()

        fields = self.record.needs if node["kind"] == "needs" else self.record.none
        run, q = _call(self.module, _case(fields), seed, pool_hook=hook)
        seen["q"], seen["state_at_start"] = q, (self.applied, self.changes)
        with self.lock:
            self.calls.append(seen)
        run()
        seen["state_at_end"] = (self.applied, self.changes)  # a thread beside may change it after the hook
        for thread in beside:
            thread.join()

    def direct(self):
        """The kernel called by foreign code with a strided query of its own, of the shape SGLang's
        query has, and unit scales: a repair that leaked into it would replace one of them."""
        with self.lock:
            self.seed += 1
            seed = self.seed
        case = _case(self.record.needs)
        layer = fp8_cases._layer(case)
        q, _, _ = fp8_cases.inputs(case, torch.Generator().manual_seed(seed))
        query = q.reshape(-1, layer.tp_q_head_num, layer.head_dim)
        assert not query.is_contiguous()
        passed = dict(query=query, bmm1_scale=1.0, bmm2_scale=1.0)
        seen = {"kind": "direct", "errors": [], "q": query, "passed": passed, "state_at_start": None}
        with self.lock:
            self.calls.append(seen)
        self.module.flashinfer.decode.trtllm_batch_decode_with_kv_cache(**passed)

    def _in_thread(self, child, seen):
        try:
            self.call(child)
        except Exception as error:  # noqa: BLE001 - reported by the property
            seen["errors"].append(repr(error))


def _violations(run, kernel_calls, warnings):
    problems = []
    owners = []
    for kwargs in kernel_calls:
        query = kwargs["query"]
        matches = [i for i, c in enumerate(run.calls) if torch.equal(query.flatten(1), c["q"].flatten(1))]
        owners.append(matches)
        if len(matches) != 1:
            problems.append("a kernel call's query is no single call's own (%d matches)" % len(matches))
    for index, seen in enumerate(run.calls):
        got = [kernel_calls[k] for k, owner in enumerate(owners) if owner == [index]]
        problems += ["call %d: %s" % (index, e) for e in seen["errors"]]
        if len(got) != 1:
            problems.append("call %d (%s): its kernel called %d times" % (index, seen["kind"], len(got)))
            continue
        kwargs = got[0]
        if seen["kind"] == "direct":
            if set(kwargs) != set(seen["passed"]) or any(kwargs[k] is not v for k, v in seen["passed"].items()):
                problems.append("call %d (direct): the kernel did not get the arguments passed to it" % index)
            continue
        query, changed = kwargs["query"], seen["state_at_start"][1] != seen["state_at_end"][1]
        own = query.data_ptr() == seen["q"].data_ptr()
        if seen["kind"] == "none" and not (own and kwargs["bmm2_scale"] == 1.0):
            problems.append("call %d (needs none): the kernel did not get SGLang's own arguments" % index)
        if seen["kind"] == "needs" and not changed:
            repaired = run.record.repaired(kwargs)
            if seen["state_at_start"][0] and not repaired:
                problems.append("call %d (needs the repair, record applied throughout): unrepaired" % index)
            if not seen["state_at_start"][0] and (repaired or not own):
                problems.append("call %d (needs the repair, record removed throughout): repaired" % index)
    name = run.record.hotfix.name
    problems += ["a WARNING that names no record: %s" % w for w in warnings if name not in w]
    return problems


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_no_sequence_of_nested_concurrent_removed_and_reapplied_calls_leaks_or_hides_a_repair(caplog, name):
    module = fp8_cases.load_backend_module(release_selection.release_dir(RELEASE))
    failures = []
    kinds = set()
    for program in range(PROGRAMS):
        rng = random.Random(program)
        root = _draw_call(rng, 0)
        run = _Run(module, RECORDS[name])
        if rng.random() < 0.8:
            run.apply()
        logs._said.clear()  # the once-per-process warnings: each program says its own
        caplog.clear()
        del fp8_cases._LOGS[module][:]
        try:
            with caplog.at_level(logging.WARNING, logger="sglang_hotfix_trtllm"):
                run.call(root)
        except Exception as error:  # noqa: BLE001 - reported below
            failures.append("program %d raised %r" % (program, error))
        finally:
            patch.remove_all()
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        problems = _violations(run, _kernel_calls(module), warnings)
        failures += ["program %d: %s (%s)" % (program, p, root) for p in problems]
        kinds.update(kind for kind, _ in _all_steps(root))
    assert kinds == set(STEP_KINDS)  # every kind of step was drawn
    assert failures == [], "\n".join(failures[:20])


def _all_steps(node):
    for kind, child in node["steps"]:
        yield kind, child
        if child is not None:
            yield from _all_steps(child)


def test_a_reloaded_backend_module_is_patched_again(tmp_path):
    """Issue 36's routes: ``importlib.reload`` of SGLang's backend makes a new class from the
    module's code; the import hook handles the re-executed module as a first import, so the new
    class's methods are the hotfix's wrappers too (in a fresh process, the hotfix armed by its
    startup file)."""
    from conftest import clean_env, run_python

    code = (
        "import importlib, json\n"
        "import sglang.srt.layers.attention.trtllm_mha_backend as b\n"
        "first = b.TRTLLMHAAttnBackend\n"
        "importlib.reload(b)\n"
        "second = b.TRTLLMHAAttnBackend\n"
        "kinds = {n: type(second.__dict__[n]).__name__ for n in ('__init__', 'forward_decode', 'forward_extend')}\n"
        "print('RESULT:' + json.dumps([first is second, kinds]))\n"
    )
    ran = run_python(["-c", code], cwd=tmp_path, env=clean_env())
    assert ran.result == [False, {n: "HotfixWrapper" for n in ("__init__", "forward_decode", "forward_extend")}], ran


# --------------------------------------------------------------------------
# The review of 0.11.0 (each seen failing on the code before its fix)


def test_remove_between_a_calls_check_and_its_note_raises_nothing(monkeypatch):
    """0.5.12 with pr28144 and pr31667 on one call (FP8 cache with scales, strided query): remove()
    in another thread right after the records' checks (here: inside pr31667's check) left the call
    naming a record whose Hotfix was gone: KeyError into SGLang's forward_decode."""
    from sglang_hotfix_trtllm.records import trtllm_kernel_site as site

    module = fp8_cases.load_backend_module(release_selection.release_dir(RELEASE))
    for record in (RECORDS["pr28144"], RECORDS["pr31667"]):
        patch.wrap(record.hotfix, module, detect.assess_module(record.hotfix, module))
    own = site._NEEDS["pr31667"]

    def needs_then_removed(backend, layer, q, wrapped):
        answer = own(backend, layer, q, wrapped)
        patch.remove_all()  # as another thread's remove() would, between the check and the note
        return answer

    monkeypatch.setitem(site._NEEDS, "pr31667", needs_then_removed)
    call, _ = _call(module, _case(RECORDS["pr28144"].needs), 11)
    try:
        call()  # raised KeyError: 'pr28144' before the fix
    finally:
        patch.remove_all()
    assert len(_kernel_calls(module)) >= 1


def test_a_call_through_the_class_leaves_no_backend_alive():
    """The gate's cache of SGLang's method code took wrapt's partial proxy of a call through the
    class (``Cls.forward_decode(backend, ...)``) as a key: the backend and its buffers stayed alive."""
    import gc
    import weakref

    record = RECORDS["pr28144"]
    module = fp8_cases.load_backend_module(release_selection.release_dir(RELEASE))
    patch.wrap(record.hotfix, module, detect.assess_module(record.hotfix, module))
    try:
        case = _case(record.needs)
        generator = torch.Generator().manual_seed(12)
        pool = fp8_cases.KVPool(fp8_cases.CallLog(), fp8_cases.KV_DTYPES[case.kv], generator)
        q, k, v = fp8_cases.inputs(case, generator)
        backend = fp8_cases._backend(module, case, pool)
        layer, batch = fp8_cases._layer(case), fp8_cases._forward_batch(module, case, pool)
        module.TRTLLMHAAttnBackend.forward_decode(backend, q, k, v, layer, batch, save_kv_cache=False, sinks=None)
        assert record.repaired(_kernel_calls(module)[-1])
        alive = weakref.ref(backend)
        del backend, batch, pool
        del fp8_cases._LOGS[module][:]
        gc.collect()
        assert alive() is None
    finally:
        patch.remove_all()


def test_pr31667_stays_in_force_when_the_gate_it_does_not_use_is_replaced():
    """pr31667 repairs before the method: a replaced ``flashinfer`` global (the gate armed by
    pr28144 gone) does not make ``is_patched`` say pr31667 is out of force, and its calls are still
    repaired."""
    module = fp8_cases.load_backend_module(release_selection.release_dir(RELEASE))
    for record in (RECORDS["pr28144"], RECORDS["pr31667"]):
        patch.wrap(record.hotfix, module, detect.assess_module(record.hotfix, module))
    try:
        _needing_call_through(module, RECORDS["pr28144"], 13)  # arms the gate
        module.flashinfer = module.flashinfer.__wrapped__  # someone put FlashInfer itself back
        assert patch.is_patched(RECORDS["pr31667"].hotfix, module.TRTLLMHAAttnBackend)
        assert _needing_call_through(module, RECORDS["pr31667"], 14)
    finally:
        patch.remove_all()


def test_a_record_joined_after_the_first_call_repairs_the_next_one():
    """The site keeps what it asks at each call (the records' tests, which repair before the
    method) until the records on change: a record joined after calls were made (pr31667 after
    pr28144 on one FP8 call), and one removed and applied again, are in force from the next call."""
    module = fp8_cases.load_backend_module(release_selection.release_dir(RELEASE))
    call, _ = _call(module, _case(RECORDS["pr28144"].needs), 13)
    first, second = RECORDS["pr28144"], RECORDS["pr31667"]
    try:
        patch.wrap(first.hotfix, module, detect.assess_module(first.hotfix, module))
        del fp8_cases._LOGS[module][:]
        call()
        (alone,) = _kernel_calls(module)
        assert first.repaired(alone) and not second.repaired(alone)  # the query as SGLang reshaped it
        patch.wrap(second.hotfix, module, detect.assess_module(second.hotfix, module))
        call()
        patch.remove_all()
        call()
        for record in (first, second):
            patch.wrap(record.hotfix, module, detect.assess_module(record.hotfix, module))
        call()
    finally:
        patch.remove_all()
    _, joined, removed, again = _kernel_calls(module)
    assert first.repaired(joined) and second.repaired(joined)
    assert not first.repaired(removed) and not second.repaired(removed)
    assert first.repaired(again) and second.repaired(again)


@pytest.mark.parametrize("extra", [dict(layer=None), dict(q=None), dict(self=None)], ids=["layer", "q", "self"])
def test_a_call_sglang_rejects_raises_its_own_error_and_arms_no_gate(caplog, extra):
    """SGLang's positional call binds without asking ``_arguments`` (the site's fast path); a call
    that also names one of those parameters by keyword is one SGLang's method rejects: its own
    TypeError, no kernel call, no gate put in the module, nothing said."""
    record = GATED
    module = fp8_cases.load_backend_module(release_selection.release_dir(RELEASE))
    backend, arguments = _backend_and_arguments(module, _case(record.needs), 14)
    own = module.flashinfer
    with pytest.raises(TypeError) as unpatched:
        backend.forward_decode(*arguments, save_kv_cache=False, **extra)
    patch.wrap(record.hotfix, module, detect.assess_module(record.hotfix, module))
    try:
        del fp8_cases._LOGS[module][:]
        with caplog.at_level(logging.WARNING, logger=logs.LOGGER_NAME), pytest.raises(TypeError) as patched:
            backend.forward_decode(*arguments, save_kv_cache=False, **extra)
        assert module.flashinfer is own
    finally:
        patch.remove_all()
    assert str(patched.value) == str(unpatched.value)
    assert _kernel_calls(module) == [] and [r for r in caplog.records if r.levelno >= logging.WARNING] == []
