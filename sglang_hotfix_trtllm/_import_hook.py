"""The import hook's work, loaded only when a watched module is imported.

``sglang_hotfix_trtllm_autoload.find_spec`` stays tiny because it runs in every
process; when SGLang's backend is actually imported it calls ``find_spec``
here, which finds the module's real spec through the other finders and wraps
its loader so that the engine sees the module right after it executed. The
module's own ``__loader__`` and ``__spec__.loader`` are put back to SGLang's
before its code runs, so nothing of the hook remains visible on it.

Does not cope with loaders lacking ``exec_module`` (legacy ``load_module``):
such a module is imported unpatched.
"""

import sys


def module_executed(module):
    """Hand a freshly executed watched module to the engine.

    Never raises, except the engine's HotfixError in strict mode."""
    from . import engine

    engine.on_module_imported(module)


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
        module_executed(module)


def find_spec(hook, fullname, path, target):
    """The regular spec of ``fullname`` (from the finders other than ``hook``),
    with its loader wrapped."""
    for finder in sys.meta_path:
        if finder is hook:
            continue
        finder_find_spec = getattr(finder, "find_spec", None)
        if finder_find_spec is None:
            continue
        spec = finder_find_spec(fullname, path, target)
        if spec is not None:
            break
    else:
        return None
    if spec.loader is not None and hasattr(spec.loader, "exec_module"):
        spec.loader = PatchAfterExecLoader(spec.loader)
    return spec
