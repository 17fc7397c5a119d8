"""Fault scenarios: each runs in a fresh interpreter of the test environment
and prints ``RESULT:<json>``, like scenarios.py. Used by tests/test_faults.py."""

import json
import os
import sys
import threading

from scenarios import METHOD, TARGET_MODULE, _describe, _import_backend, _result


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
    from sglang_hotfix_trtllm import engine

    _result(distinct=first is not second, first=_describe(first), second=_describe(second),
            patched_records=len(engine._patched), first_still=type(first_cls.__dict__[METHOD]).__name__)


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
    from sglang_hotfix_trtllm import engine

    module = sys.modules[TARGET_MODULE]
    _result(errors=errors, patched_records=len(engine._patched), **_describe(module))


def fork_child():
    module = _import_backend()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        import sglang_hotfix_trtllm_autoload

        sglang_hotfix_trtllm_autoload.install()  # as a forked worker re-running start-up code would
        from sglang_hotfix_trtllm import engine

        payload = dict(_describe(module), records=len(engine._patched))
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
    from sglang_hotfix_trtllm import engine, pr26521

    original = None
    for layer in engine._chain(cls.__dict__[METHOD]):
        original = layer
    compared, mismatches, unpatched_differs = compare_with_oracle(cls, ForwardMode, upstream_fixed_method(module), original)
    top = cls.__dict__[METHOD]
    restored = engine.remove_all()
    _result(order=order, patched=engine.is_patched(pr26521.HOTFIX, cls) if restored == 0 else None,
            top_type=type(top).__name__, top_file=getattr(getattr(top, "__code__", None), "co_filename", None),
            hook_calls=len(calls), compared=compared, mismatches=mismatches, unpatched_differs=unpatched_differs,
            restored=restored, after_remove_top_is_same=cls.__dict__[METHOD] is top)


def cycles_memory(count="2000"):
    import gc
    import tracemalloc

    module = _import_backend()
    import sglang_hotfix_trtllm
    import sglang_hotfix_trtllm_autoload  # noqa: F401
    from sglang_hotfix_trtllm import engine

    cls = module.TRTLLMHAAttnBackend
    original = cls.__dict__[METHOD].__wrapped__
    sglang_hotfix_trtllm.remove()
    for _ in range(50):  # warm caches before measuring
        sglang_hotfix_trtllm.apply()
        sglang_hotfix_trtllm.remove()
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    meta_before = len(sys.meta_path)
    for _ in range(int(count)):
        sglang_hotfix_trtllm.apply()
        sglang_hotfix_trtllm.remove()
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    sglang_hotfix_trtllm.apply()
    _result(growth_bytes=after - before, meta_path_growth=len(sys.meta_path) - meta_before - 1,
            records=len(engine._patched), wrapped_is_original=cls.__dict__[METHOD].__wrapped__ is original,
            single_layer=not hasattr(cls.__dict__[METHOD].__wrapped__, "__wrapped__"))


def audited_startup():
    """Run site's start-up (python -S, then site.main()) under an audit hook and
    a recording os.environ: what does the startup hook touch?"""
    events = []

    def audit(event, args):
        if event in ("open",):
            events.append([event, str(args[0]), str(args[1])])
        elif event.startswith(("socket.", "subprocess.", "os.system", "os.exec", "os.spawn", "os.posix_spawn",
                               "os.remove", "os.rename", "shutil.", "urllib.")):
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
    _result(armed=sglang_hotfix_trtllm_autoload.is_installed(), env_keys=sorted(set(read_keys)), writes=writes,
            other_events=[e for e in events if e[0] != "open"],
            opened=[e[1] for e in events if e[0] == "open"])


SCENARIOS = {f.__name__: f for f in (
    imported_before_hook, source_removed_after_import, replaced_by_someone_else, reimported, concurrent_imports,
    fork_child, hook_registry, cycles_memory, audited_startup,
)}

if __name__ == "__main__":
    SCENARIOS[sys.argv[1]](*sys.argv[2:])
