"""The import hook's work, loaded only when a watched module is imported.

``sglang_hotfix_trtllm_autoload.find_spec`` stays tiny because it runs in every
process; when SGLang's backend is actually imported it calls ``find_spec``
here, which finds the module's real spec through the other finders and wraps
its loader so that the engine sees the module right after it executed. The
module's own ``__loader__`` and ``__spec__.loader`` are put back to SGLang's
before its code runs, so nothing of the hook remains visible on it.

Re-entrancy, as wrapt's ``importer.py`` guards it: while this thread looks a
name up, a nested lookup of the same name (another finder asking
``importlib.util.find_spec``) gets None from us; and every copy of the
startup finder (a reloaded startup module, a second install) is skipped, so
the hook never recurses into itself or into a twin.

Does not cope with loaders lacking ``exec_module`` (legacy ``load_module``):
such a module is imported unpatched.
"""

import sys
import threading

import sglang_hotfix_trtllm_autoload

_in_progress = threading.local()


def module_executed(module, name=None):
    """Hand a freshly executed watched module to the engine.

    Never raises, except the engine's HotfixError in strict mode."""
    from . import engine

    engine.on_module_imported(module, name)


class PatchAfterExecLoader:
    def __init__(self, loader):
        self._loader = loader

    def __getattr__(self, name):
        # get_source, is_package, get_resource_reader ... come from the real loader.
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = self._loader
        spec = getattr(module, "__spec__", None)
        if spec is not None:
            spec.loader = self._loader
        self._loader.exec_module(module)
        # apply() may have run while this module executed and left it to _AfterImport: it is handed
        # over here, once.
        sglang_hotfix_trtllm_autoload._AfterImport.pending.discard(module.__name__)
        module_executed(module)


def find_spec(fullname, path, target):
    """The regular spec of ``fullname`` (from the finders that are not ours),
    with its loader wrapped; None while this thread is already looking it up."""
    names = getattr(_in_progress, "names", None)
    if names is None:
        names = _in_progress.names = set()
    if fullname in names:
        return None
    names.add(fullname)
    try:
        for finder in list(sys.meta_path):
            if sglang_hotfix_trtllm_autoload.is_finder(finder):
                continue
            finder_find_spec = getattr(finder, "find_spec", None)
            if finder_find_spec is None:
                continue
            spec = finder_find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
    finally:
        names.discard(fullname)
    if spec.loader is not None and hasattr(spec.loader, "exec_module"):
        spec.loader = PatchAfterExecLoader(spec.loader)
    return spec
