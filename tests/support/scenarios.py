"""Scenarios run in a fresh interpreter of the test environment.

``python scenarios.py NAME [ARG]`` runs one scenario and prints its findings as
one line ``RESULT:<json>`` on stdout; tests assert on that. Each scenario
imports SGLang's real backend module the way SGLang would, so the plugin
arrives through its real startup module (or entry point), never from the
repository's source tree.
"""

import inspect
import json
import os
import sys

TARGET_MODULE = "sglang.srt.layers.attention.trtllm_mha_backend"
METHOD = "init_forward_metadata_capture_cuda_graph"


def _records_of_pr26521():
    """Entries of the patch registry for record pr26521 (the one these scenarios
    are about; pr25103 wraps __init__ of the same class alongside)."""
    from sglang_hotfix_trtllm import patch

    return sum(1 for entry in patch._applied if entry.hotfix.name == "pr26521")


def _result(**findings):
    print("RESULT:" + json.dumps(findings, default=str), flush=True)


def _import_backend():
    import importlib

    return importlib.import_module(TARGET_MODULE)


def _patched_in_class(cls):
    """The class's methods the hotfix patched: under its wrapper, or running its compile."""
    edit = sys.modules.get("sglang_hotfix_trtllm.code_edit")
    edited = {
        name
        for (owner, name), state in (edit._edited.items() if edit is not None else ())
        if owner is cls and state.function.__code__ is state.installed
    }
    return sorted({n for n, v in cls.__dict__.items() if type(v).__name__ == "HotfixWrapper"} | edited)


def _describe(module):
    cls = module.TRTLLMHAAttnBackend
    attribute = cls.__dict__.get(METHOD)
    wrapped = getattr(attribute, "__wrapped__", None)
    return {
        "attribute_type": type(attribute).__name__ if attribute is not None else None,
        "patched_in_class": _patched_in_class(cls),
        "wrapped_type": type(wrapped).__name__ if wrapped is not None else None,
        "wrapped_is_wrapper": hasattr(wrapped, "__wrapped__"),
        "wrapped_file": getattr(getattr(wrapped, "__code__", None), "co_filename", None),
        "module_file": module.__file__,
    }


def describe():
    """Import the backend and report what the class holds; nothing else."""
    _result(**_describe(_import_backend()))


def import_only():
    """Import the backend; report what the class holds and where the plugin lives."""
    module = _import_backend()
    import sglang_hotfix_trtllm
    import sglang_hotfix_trtllm_autoload

    findings = _describe(module)
    findings["plugin_file"] = sglang_hotfix_trtllm.__file__
    findings["autoload_file"] = sglang_hotfix_trtllm_autoload.__file__
    findings["loader_type"] = type(module.__loader__).__name__
    findings["spec_loader_type"] = type(module.__spec__.loader).__name__
    _result(**findings)


def startup_only():
    """A process that never imports SGLang: what did the startup module load?"""
    import sys as _sys

    heavy = sorted(m for m in _sys.modules if m.split(".")[0] in ("wrapt", "torch", "sglang", "sglang_hotfix_trtllm"))
    # Read the mark as the startup module does, without importing it: whether
    # start-up imported it is one of the findings.
    marked = [i for i, f in enumerate(_sys.meta_path) if getattr(f, "sglang_hotfix_trtllm_finder", None) is True]
    _result(heavy_modules=heavy, marked_finders=marked, autoload_loaded="sglang_hotfix_trtllm_autoload" in _sys.modules)


def equivalence():
    """Patched method vs upstream's fix vs unpatched, on every branch."""
    from capture_harness import compare_with_oracle
    from upstream_fix import upstream_fixed_method
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    module = _import_backend()
    cls = module.TRTLLMHAAttnBackend
    unpatched = cls.__dict__[METHOD].__wrapped__
    written, mismatches, unpatched_differs = compare_with_oracle(
        cls, ForwardMode, upstream_fixed_method(module), unpatched
    )
    _result(written=written, mismatches=mismatches, unpatched_differs=unpatched_differs)


def draft_decode_values():
    """The concrete buffer contents for one draft-decode capture (for a readable assertion)."""
    from capture_harness import SPEC_INFO, call, make_backend, via_instance
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    import torch

    module = _import_backend()
    backend = make_backend(module.TRTLLMHAAttnBackend, step_id=2)
    seq_lens = torch.tensor([5, 9, 17], dtype=torch.int64)
    call(via_instance, backend, 3, 1, torch.arange(3), seq_lens, ForwardMode.DECODE, SPEC_INFO, "keyword")
    metadata = backend.forward_metadata
    _result(
        cache_seqlens=metadata.cache_seqlens_int32.tolist(),
        cu_seqlens_k=metadata.cu_seqlens_k.tolist(),
        max_seq_len_k=metadata.max_seq_len_k,
        buffer=backend.decode_cuda_graph_metadata["cache_seqlens"].tolist(),
    )


def replay_untouched():
    """The replay method is SGLang's own function, and capture+replay matches upstream."""
    from capture_harness import SPEC_INFO, call, differences, inputs, make_backend, snapshot, via_instance
    from upstream_fix import upstream_fixed_method
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    import torch

    module = _import_backend()
    cls = module.TRTLLMHAAttnBackend
    replay = cls.__dict__["init_forward_metadata_replay_cuda_graph"]
    oracle = upstream_fixed_method(module)
    mismatches = 0
    for bs in (1, 4, 8):
        patched_backend, oracle_backend = make_backend(cls, 1), make_backend(cls, 1)
        req, seq_lens = inputs(bs, seed=bs)
        call(via_instance, patched_backend, bs, 1, req, seq_lens, ForwardMode.DECODE, SPEC_INFO, "keyword")
        call(oracle, oracle_backend, bs, 1, req, seq_lens, ForwardMode.DECODE, SPEC_INFO, "keyword")
        _, new_lens = inputs(bs, seed=bs + 100)
        for backend in (patched_backend, oracle_backend):
            backend.req_to_token = torch.arange(bs * 512, dtype=torch.int32).reshape(bs, 512)
            backend.init_forward_metadata_replay_cuda_graph(
                bs, req, new_lens, int(new_lens.sum()), None, ForwardMode.DECODE, SPEC_INFO, new_lens.clone()
            )
        mismatches += len(differences(snapshot(patched_backend), snapshot(oracle_backend)))
    _result(
        replay_type=type(replay).__name__,
        replay_file=replay.__code__.co_filename,
        module_file=module.__file__,
        replay_has_wrapped=hasattr(replay, "__wrapped__"),
        mismatches=mismatches,
    )


def identity_and_cycles():
    """Started with the hook disabled: apply/remove touch the one method only."""
    module = _import_backend()
    cls = module.TRTLLMHAAttnBackend
    before = {name: value for name, value in cls.__dict__.items()}
    codes_before = {name: getattr(value, "__code__", None) for name, value in before.items()}
    original = before[METHOD]
    signature_before = str(inspect.signature(cls.init_forward_metadata_capture_cuda_graph))
    os.environ.pop("SGLANG_HOTFIX_TRTLLM_DISABLE", None)
    import sglang_hotfix_trtllm
    from sglang_hotfix_trtllm import engine

    first = sglang_hotfix_trtllm.apply()
    after_first = cls.__dict__[METHOD]
    second = sglang_hotfix_trtllm.apply()
    engine.on_module_imported(module)  # as if the hook fired again
    after_second = cls.__dict__[METHOD]
    changed = sorted(
        name
        for name, value in cls.__dict__.items()
        if name in before and (before[name] is not value or getattr(value, "__code__", None) is not codes_before[name])
    )
    added = sorted(name for name in cls.__dict__ if name not in before)
    signature_after = str(inspect.signature(cls.init_forward_metadata_capture_cuda_graph))
    bound_signature_after = str(inspect.signature(object.__new__(cls).init_forward_metadata_capture_cuda_graph))
    restored = sglang_hotfix_trtllm.remove()
    after_remove = cls.__dict__[METHOD]
    unchanged_after_remove = all(
        cls.__dict__.get(name) is value and getattr(value, "__code__", None) is codes_before[name]
        for name, value in before.items()
    ) and sorted(cls.__dict__) == sorted(before)
    cycles = 0
    for _ in range(50):
        sglang_hotfix_trtllm.apply()
        assert type(cls.__dict__[METHOD]).__name__ == "HotfixWrapper"
        assert cls.__dict__[METHOD].__wrapped__ is original
        sglang_hotfix_trtllm.remove()
        cycles += 1
    _result(
        first=first,
        second=second,
        first_type=type(after_first).__name__,
        same_wrapper_after_second_apply=after_first is after_second,
        wrapped_is_original=after_first.__wrapped__ is original,
        changed=changed,
        added=added,
        signature_before=signature_before,
        signature_after=signature_after,
        bound_signature_after=bound_signature_after,
        restored=restored,
        original_back=after_remove is original,
        unchanged_after_remove=unchanged_after_remove,
        cycles=cycles,
        final_is_original=cls.__dict__[METHOD] is original,
        patched_records=_records_of_pr26521(),
    )


def _spawn_child(queue):
    module = _import_backend()
    queue.put(_describe(module))


def spawn_child():
    """SGLang starts its scheduler with the spawn method: a fresh interpreter."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_spawn_child, args=(queue,))
    child.start()
    findings = queue.get(timeout=300)
    child.join(60)
    _result(parent_imported_sglang="sglang" in sys.modules, child=findings, exitcode=child.exitcode)


def sglang_plugin_loader():
    """SGLang's own plugin loader, with the startup module disarmed first."""
    import sglang_hotfix_trtllm_autoload

    sglang_hotfix_trtllm_autoload.uninstall()
    from sglang.srt.plugins import load_plugins

    load_plugins()
    loaded_backend_early = TARGET_MODULE in sys.modules
    hook_armed = sglang_hotfix_trtllm_autoload.is_installed()
    module = _import_backend()
    findings = _describe(module)
    # Both paths now: the startup module's install() again must not wrap twice.
    sglang_hotfix_trtllm_autoload.install()
    load_plugins()
    findings.update(loaded_backend_early=loaded_backend_early, hook_armed=hook_armed, after_both=_describe(module))
    _result(**findings)


def overlay(path):
    """Import the target module from ``path`` instead of SGLang's copy (the
    rest of SGLang stays the installed one); report what happened."""
    import importlib

    package = importlib.import_module("sglang.srt.layers.attention")
    package.__path__ = [path] + list(package.__path__)  # a namespace package: replace, not insert
    try:
        module = _import_backend()
    except ImportError as error:
        _result(import_error=str(error))
        raise
    findings = _describe(module)
    _result(**findings)


def wrapt_in_use():
    """Import the backend; report the class and which wrapt this process runs."""
    module = _import_backend()
    import wrapt

    _result(wrapt_file=wrapt.__file__, wrapt_version=getattr(wrapt, "__version__", None), **_describe(module))


def toy_record():
    """A second record, for a toy module on PYTHONPATH, through the real machinery."""
    import importlib

    import toy_record as toy
    import sglang_hotfix_trtllm
    from sglang_hotfix_trtllm.records import catalog

    toy.register()
    module = importlib.import_module(toy.MODULE)  # the import hook fires here
    counter = module.Counter()
    patched_value = counter.next_value(41)
    import contextlib
    import io

    from sglang_hotfix_trtllm import cli

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = cli.main(["status", "--json"])  # `sglang-hotfix-trtllm status --json`, in this process
    document = json.loads(printed.getvalue())
    report = next(r for r in document["hotfixes"] if r["hotfix"] == toy.TOY.name)
    patch = sys.modules.get("sglang_hotfix_trtllm.patch")  # loaded only when something was wrapped
    records = sorted(entry.hotfix.name for entry in patch._applied) if patch else []
    wrapper_type = type(module.Counter.__dict__["next_value"]).__name__
    restored = sglang_hotfix_trtllm.remove()
    _result(
        patched_value=patched_value,
        wrapper_type=wrapper_type,
        records=records,
        catalog=[h.name for h in catalog.HOTFIXES],
        verdict=report["verdict"],
        reason=report["reason"],
        would_patch=report["would_patch"],
        exit=code,
        headline=document["headline"],
        restored=restored,
        after_remove=counter.next_value(41),
        sglang_imported="sglang" in sys.modules,
    )


SCENARIOS = {
    f.__name__: f
    for f in (
        wrapt_in_use,
        toy_record,
        describe,
        import_only,
        startup_only,
        equivalence,
        draft_decode_values,
        replay_untouched,
        identity_and_cycles,
        spawn_child,
        sglang_plugin_loader,
        overlay,
    )
}

if __name__ == "__main__":
    SCENARIOS[sys.argv[1]](*sys.argv[2:])
