"""Fault scenarios: each runs in a fresh interpreter of the test environment
and prints ``RESULT:<json>``, like scenarios.py. Used by tests/test_faults.py."""

import json
import os
import sys
import threading

from scenarios import METHOD, TARGET_MODULE, _describe, _import_backend, _records_of_pr26521, _result


def _enable_hook_now():
    """Processes started with the hook disabled: enable it from here on."""
    os.environ.pop("SGLANG_HOTFIX_TRTLLM_DISABLE", None)
    import sglang_hotfix_trtllm

    return sglang_hotfix_trtllm.apply()


def imported_before_hook():
    module = _import_backend()
    before = _describe(module)["attribute_type"]
    _enable_hook_now()
    _result(before=before, after=_describe(module)["attribute_type"])


def source_removed_after_import(path):
    """The backend is imported from a copy whose file then disappears."""
    import importlib

    package = importlib.import_module("sglang.srt.layers.attention")
    package.__path__ = [path] + list(package.__path__)
    module = _import_backend()
    os.remove(os.path.join(path, "trtllm_mha_backend.py"))
    _enable_hook_now()
    _result(**_describe(module))


def replaced_by_someone_else():
    module = _import_backend()
    cls = module.TRTLLMHAAttnBackend

    def their_version(self, *args, **kwargs):
        return "theirs"

    cls.init_forward_metadata_capture_cuda_graph = their_version
    _enable_hook_now()
    _result(still_theirs=cls.__dict__[METHOD] is their_version)


def reimported():
    first = _import_backend()
    first_cls = first.TRTLLMHAAttnBackend
    del sys.modules[TARGET_MODULE]
    second = _import_backend()
    _result(
        distinct=first is not second,
        first=_describe(first),
        second=_describe(second),
        patched_records=_records_of_pr26521(),
        first_still=type(first_cls.__dict__[METHOD]).__name__,
    )


def concurrent_imports(threads="16"):
    barrier = threading.Barrier(int(threads))
    errors = []

    def worker():
        barrier.wait()
        try:
            _import_backend()
        except Exception as error:  # reported, not raised in the thread
            errors.append(repr(error))

    pool = [threading.Thread(target=worker) for _ in range(int(threads))]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    module = sys.modules[TARGET_MODULE]
    _result(errors=errors, patched_records=_records_of_pr26521(), **_describe(module))


def fork_child():
    module = _import_backend()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        import sglang_hotfix_trtllm_autoload

        sglang_hotfix_trtllm_autoload.install()  # as a forked worker re-running start-up code would
        payload = dict(_describe(module), records=_records_of_pr26521())
        os.write(write, json.dumps(payload).encode())
        os._exit(0)
    os.close(write)
    data = b""
    while True:
        chunk = os.read(read, 65536)
        if not chunk:
            break
        data += chunk
    os.waitpid(pid, 0)
    _result(parent=_describe(module), child=json.loads(data))


def hook_registry(order):
    """SGLang's own HookRegistry wraps the method too, before or after us."""
    import torch  # noqa: F401
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from capture_harness import compare_with_oracle
    from upstream_fix import upstream_fixed_method

    calls = []

    def passthrough(original_fn, *args, **kwargs):
        calls.append(1)
        return original_fn(*args, **kwargs)

    target = TARGET_MODULE + ".TRTLLMHAAttnBackend." + METHOD
    HookRegistry.register(target, passthrough, HookType.AROUND)
    if order == "registry-first":
        HookRegistry.apply_hooks()  # imports the module (hook disabled) and wraps it
        module = sys.modules[TARGET_MODULE]
        _enable_hook_now()
    else:
        _enable_hook_now()
        module = _import_backend()  # our hook wraps at import
        HookRegistry.apply_hooks()
    cls = module.TRTLLMHAAttnBackend
    from sglang_hotfix_trtllm import patch
    from sglang_hotfix_trtllm.records import pr26521

    original = None
    for layer in patch._chain(cls.__dict__[METHOD]):
        original = layer
    written, mismatches, unpatched_differs = compare_with_oracle(
        cls, ForwardMode, upstream_fixed_method(module), original
    )
    top = cls.__dict__[METHOD]
    patched = patch.is_patched(pr26521.HOTFIX, cls)
    restored = patch.remove_all()
    _result(
        order=order,
        patched=patched,
        patched_after_remove=patch.is_patched(pr26521.HOTFIX, cls),
        top_type=type(top).__name__,
        top_file=getattr(getattr(top, "__code__", None), "co_filename", None),
        hook_calls=len(calls),
        written=written,
        mismatches=mismatches,
        unpatched_differs=unpatched_differs,
        restored=restored,
        after_remove_top_is_same=cls.__dict__[METHOD] is top,
    )


def cycles_memory(count="80"):
    import gc
    import tracemalloc

    def settled():
        # What stays after a window: its garbage collected, and CPython's type attribute cache
        # emptied. That cache (4096 entries) keeps the name strings of attribute lookups, and the
        # records' apply() makes fresh ones (pickle's copies of methods, importlib's finders): it
        # fills a few entries a cycle, 50 to 70 bytes, which earlier versions of this test could
        # only bound. With it emptied, a window of 100 cycles grew 0 bytes (this test's window: 32).
        gc.collect()
        (getattr(sys, "_clear_internal_caches", None) or sys._clear_type_cache)()
        return tracemalloc.get_traced_memory()[0]

    module = _import_backend()
    import sglang_hotfix_trtllm

    cls = module.TRTLLMHAAttnBackend
    original = cls.__dict__[METHOD].__wrapped__
    sglang_hotfix_trtllm.remove()
    window = int(count) // 2
    for _ in range(window):  # warm-up: caches that are filled once
        sglang_hotfix_trtllm.apply()
        sglang_hotfix_trtllm.remove()
    gc.collect()
    # Traced from the first of two windows; the growth is the second's: an object a cycle replaces
    # (a cache, a resized dict) is then allocated and freed under the trace, and only what stays
    # counts. (Measured from one window, the replacement of an object made before tracing started
    # reads as growth.)
    tracemalloc.start()
    meta_before = len(sys.meta_path)
    for _ in range(window):
        sglang_hotfix_trtllm.apply()
        sglang_hotfix_trtllm.remove()
    before = settled()
    for _ in range(window):
        sglang_hotfix_trtllm.apply()
        sglang_hotfix_trtllm.remove()
    after = settled()
    sglang_hotfix_trtllm.apply()
    _result(
        growth_bytes=after - before,
        meta_path_growth=len(sys.meta_path) - meta_before - 1,
        records=_records_of_pr26521(),
        wrapped_is_original=cls.__dict__[METHOD].__wrapped__ is original,
        single_layer=not hasattr(cls.__dict__[METHOD].__wrapped__, "__wrapped__"),
    )


def audited_startup():
    """Run site's start-up (python -S, then site.main()) under an audit hook and
    a recording os.environ: what does the startup module touch?"""
    events = []

    def audit(event, args):
        if event in ("open",):
            events.append([event, str(args[0]), str(args[1])])
        elif event.startswith(
            (
                "socket.",
                "subprocess.",
                "os.system",
                "os.exec",
                "os.spawn",
                "os.posix_spawn",
                "os.remove",
                "os.rename",
                "shutil.",
                "urllib.",
            )
        ):
            events.append([event, repr(args)[:200]])

    sys.addaudithook(audit)
    read_keys = []

    original_get = os.environ.__class__.__getitem__

    def recording_getitem(self, key):
        # Only reads made by the hotfix's own code (its frames) count; site reads HOME and more.
        frame = sys._getframe(1)
        while frame is not None:
            if "sglang_hotfix_trtllm" in frame.f_code.co_filename:
                read_keys.append(key)
                break
            frame = frame.f_back
        return original_get(self, key)

    os.environ.__class__.__getitem__ = recording_getitem
    import site

    site.main()
    os.environ.__class__.__getitem__ = original_get
    import sglang_hotfix_trtllm_autoload

    writes = [e for e in events if e[0] == "open" and e[2] not in ("r", "rb", "None")]
    _result(
        armed=sglang_hotfix_trtllm_autoload.is_installed(),
        env_keys=sorted(set(read_keys)),
        writes=writes,
        other_events=[e for e in events if e[0] != "open"],
        opened=[e[1] for e in events if e[0] == "open"],
    )


SCENARIOS = {
    f.__name__: f
    for f in (
        imported_before_hook,
        source_removed_after_import,
        replaced_by_someone_else,
        reimported,
        concurrent_imports,
        fork_child,
        hook_registry,
        cycles_memory,
        audited_startup,
    )
}


# --- re-entrancy of the import hook (Trust, class 3) --------------------------


def _import_outcome():
    """Import the backend; report what the class holds, or the exception."""
    try:
        module = _import_backend()
    except RecursionError as error:
        return {"error": "RecursionError: %s" % str(error)[:100]}
    except Exception as error:
        return {"error": "%s: %s" % (type(error).__name__, str(error)[:200])}
    try:
        records = _records_of_pr26521()
    except Exception:  # the package may be the broken one a test put in place
        records = None
    return dict(_describe(module), records=records, finders=_finders())


def _finders():
    import sglang_hotfix_trtllm_autoload as autoload

    # (0.1.0 had no is_finder: the fallback lets this harness measure it too.)
    is_finder = getattr(autoload, "is_finder", lambda f: f is autoload.find_spec)
    return sum(is_finder(f) for f in sys.meta_path)


def describe_or_error():
    """Import the backend; report what the class holds, or the import's exception."""
    _result(**_import_outcome())


def autoload_reloaded():
    """The startup module reloaded (a second copy of its finder), then armed again."""
    import importlib

    import sglang_hotfix_trtllm_autoload

    importlib.reload(sglang_hotfix_trtllm_autoload)
    sglang_hotfix_trtllm_autoload.install()
    _result(**_import_outcome())


def modules_purged_then_entry_point():
    """sys.modules purged of the plugin (and SGLang), then SGLang's plugin loader
    runs the entry point: a fresh copy of everything, a finder already armed."""
    import importlib

    importlib.import_module("sglang.srt.layers.attention")
    for name in [
        n for n in sys.modules if n.split(".")[0] in ("sglang_hotfix_trtllm", "sglang_hotfix_trtllm_autoload")
    ]:
        del sys.modules[name]
    from sglang_hotfix_trtllm import plugin

    plugin.register()
    _result(**_import_outcome())


def twin_finders_armed():
    """Two copies of the startup module (two installs) each with a finder armed."""
    import importlib.util

    import sglang_hotfix_trtllm_autoload

    spec = importlib.util.spec_from_file_location(
        "sglang_hotfix_trtllm_autoload_twin", sglang_hotfix_trtllm_autoload.__file__
    )
    twin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(twin)
    sys.meta_path.insert(0, twin.find_spec)  # armed by hand: a twin that did not see ours
    _result(**_import_outcome())


def finder_that_asks_find_spec():
    """A third-party finder ahead of ours that asks importlib for the same name
    (as wrapt's import-hook finder does): no recursion."""
    import importlib.util

    class Asking:
        def find_spec(self, fullname, path=None, target=None):
            if fullname == TARGET_MODULE and not getattr(self, "busy", False):
                self.busy = True
                try:
                    importlib.util.find_spec(fullname)
                finally:
                    self.busy = False
            return None

    sys.meta_path.insert(0, Asking())
    import sglang_hotfix_trtllm_autoload

    sglang_hotfix_trtllm_autoload.uninstall()
    sglang_hotfix_trtllm_autoload.install()  # ours first again, the asking one second
    sys.meta_path.insert(0, sys.meta_path.pop(1))  # the asking finder first
    _result(**_import_outcome())


def odd_sys_modules(state):
    """apply(), remove() and the hook with the target blocked (None) or a non-module in sys.modules."""
    import types

    odd = {"blocked": None, "object": object(), "dict": {}, "fake_module": types.ModuleType(TARGET_MODULE)}[state]
    import importlib

    importlib.import_module("sglang.srt.layers.attention")
    sys.modules[TARGET_MODULE] = odd
    import sglang_hotfix_trtllm
    import sglang_hotfix_trtllm_autoload

    outcome = {}
    try:
        sglang_hotfix_trtllm_autoload.uninstall()
        outcome["apply"] = sglang_hotfix_trtllm.apply()
        outcome["remove"] = sglang_hotfix_trtllm.remove()
        outcome["apply_again"] = sglang_hotfix_trtllm.apply()
    except BaseException as error:
        outcome["raised"] = "%s: %s" % (type(error).__name__, error)
    try:
        importlib.import_module(TARGET_MODULE)
        outcome["import"] = "ok"
    except ModuleNotFoundError:
        outcome["import"] = "ModuleNotFoundError"  # what Python itself does for a blocked name
    except BaseException as error:
        outcome["import"] = "%s: %s" % (type(error).__name__, error)
    outcome["still_odd"] = sys.modules.get(TARGET_MODULE) is odd
    _result(**outcome)


def odd_finder_on_meta_path():
    """A finder whose attributes raise on access sits on sys.meta_path."""

    class Hostile:
        def __getattr__(self, name):
            if name.startswith("sglang_hotfix"):  # our mark: any error but AttributeError
                raise RuntimeError("hostile finder: " + name)
            raise AttributeError(name)

        def find_spec(self, fullname, path=None, target=None):
            return None

    sys.meta_path.append(Hostile())
    import sglang_hotfix_trtllm_autoload

    _result(
        installed=sglang_hotfix_trtllm_autoload.is_installed(),
        armed_again=sglang_hotfix_trtllm_autoload.install(),
        **_import_outcome(),
    )


# --- start-up and logging (Trust, class 4) -----------------------------------


def import_with_stderr_none():
    """SGLang imports its backend while sys.stderr is None (pythonw, closed fd 2)."""
    sys.stderr = None
    outcome = _import_outcome()
    sys.stderr = sys.__stderr__
    _result(**outcome)


def logging_configured(when):
    """The host configures logging before the hotfix's first line, or after it."""
    import logging

    if when == "before":
        logging.basicConfig(level=logging.INFO, format="HOST %(name)s %(levelname)s: %(message)s")
    _import_backend()
    if when == "after":
        logging.basicConfig(level=logging.INFO, format="HOST %(name)s %(levelname)s: %(message)s")
    import sglang_hotfix_trtllm

    sglang_hotfix_trtllm.remove()  # a second line ("removed: ...") after the host's set-up
    _result(when=when)


# --- the wrapper seen by callers (Trust, class 6) ----------------------------


def _shape_calls(cls, backend, bs, req, seq_lens, mode, spec):
    import functools
    import types

    method_name = METHOD

    class Sub(cls):
        def init_forward_metadata_capture_cuda_graph(self, *args, **kwargs):
            return super().init_forward_metadata_capture_cuda_graph(*args, **kwargs)

    args = (bs, bs, req, seq_lens, None, mode, spec)
    names = ("bs", "num_tokens", "req_pool_indices", "seq_lens", "encoder_lens", "forward_mode", "spec_info")
    return {
        "positional": lambda b: getattr(b, method_name)(*args),
        "keyword": lambda b: getattr(b, method_name)(**dict(zip(names, args))),
        "self_by_keyword_through_class": lambda b: getattr(cls, method_name)(self=b, **dict(zip(names, args))),
        "self_positional_through_class": lambda b: getattr(cls, method_name)(b, *args),
        "partial_of_class_attribute": lambda b: functools.partial(getattr(cls, method_name), b)(*args),
        "partial_of_bound_method": lambda b: functools.partial(getattr(b, method_name), bs)(*args[1:]),
        "method_type": lambda b: types.MethodType(cls.__dict__[method_name], b)(*args),
        # The instance becomes a subclass instance whose override calls super().
        "super_from_subclass": lambda b: (
            setattr(b, "__class__", Sub),
            b.init_forward_metadata_capture_cuda_graph(*args),
        ),
    }


def call_shapes():
    """Every call shape, patched, against the upstream-fixed method (oracle)."""
    from capture_harness import differences, inputs, make_backend, snapshot
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from upstream_fix import upstream_fixed_method

    module = _import_backend()
    cls = module.TRTLLMHAAttnBackend
    oracle = upstream_fixed_method(module)
    results = {}
    for bs in (3, 8):
        req, seq_lens = inputs(bs, seed=bs)
        for mode_name, mode in (
            ("draft_decode", ForwardMode.DECODE),
            ("idle", ForwardMode.IDLE),
            ("verify", ForwardMode.TARGET_VERIFY),
        ):
            shapes = _shape_calls(cls, None, bs, req, seq_lens, mode, object())
            for shape, invoke in shapes.items():
                backend, expected = make_backend(cls, 2), make_backend(cls, 2)
                invoke(backend)
                oracle(expected, bs, bs, req, seq_lens, None, mode, object())
                diff = differences(snapshot(backend), snapshot(expected))
                results.setdefault(shape, []).append(len(diff))
    _result(
        patched=type(cls.__dict__[METHOD]).__name__,
        shapes={k: sum(v) for k, v in results.items()},
        calls=sum(len(v) for v in results.values()),
    )


def rejected_calls():
    """Calls the original rejects: same TypeError, buffer untouched."""
    from capture_harness import inputs, make_backend
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    module = _import_backend()
    cls = module.TRTLLMHAAttnBackend
    original = cls.__dict__[METHOD].__wrapped__
    bs = 4
    req, seq_lens = inputs(bs, seed=1)
    mode, spec = ForwardMode.DECODE, object()
    bad = {
        "unexpected_keyword": lambda f, b: f(b, bs, bs, req, seq_lens, None, mode, spec, colour="red"),
        "duplicate_keyword": lambda f, b: f(b, bs, bs, req, seq_lens, None, mode, spec, bs=bs),
        "missing_argument": lambda f, b: f(b, bs, bs, req, seq_lens, None, mode),
        "too_many_positional": lambda f, b: f(b, bs, bs, req, seq_lens, None, mode, spec, None),
        "missing_self": lambda f, b: f(
            bs=bs,
            num_tokens=bs,
            req_pool_indices=req,
            seq_lens=seq_lens,
            encoder_lens=None,
            forward_mode=mode,
            spec_info=spec,
        ),
    }
    outcome = {}
    for name, invoke in bad.items():
        messages = []
        touched = []
        for label, target in (("patched", cls.init_forward_metadata_capture_cuda_graph), ("original", original)):
            backend = make_backend(cls, 1)
            try:
                invoke(target, backend)
                messages.append(None)
            except TypeError as error:
                messages.append(
                    str(error)
                    .replace("init_forward_metadata_capture_cuda_graph", "<m>")
                    .replace("TRTLLMHAAttnBackend.", "")
                )
            touched.append(int(backend.decode_cuda_graph_metadata["cache_seqlens"].abs().sum()))
        outcome[name] = {"messages": messages, "buffer_sums": touched}
    _result(**outcome)


SCENARIOS.update(
    {
        f.__name__: f
        for f in (
            describe_or_error,
            autoload_reloaded,
            modules_purged_then_entry_point,
            twin_finders_armed,
            finder_that_asks_find_spec,
            odd_sys_modules,
            odd_finder_on_meta_path,
            import_with_stderr_none,
            logging_configured,
            call_shapes,
            rejected_calls,
        )
    }
)


if __name__ == "__main__":
    SCENARIOS[sys.argv[1]](*sys.argv[2:])
