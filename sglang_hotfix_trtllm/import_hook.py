"""The import hook's work, loaded only when a watched module has been looked up.

``sglang_hotfix_trtllm_autoload``'s finder stays tiny because it runs in every
process and imports nothing: it gives the watched module's real spec a loader
that, from ``exec_module`` (under the module's own lock, not importlib's global
one), runs the module's own code and then calls ``module_executed`` here. The
module's ``__loader__`` and ``__spec__.loader`` are put back to SGLang's before
its code runs, so nothing of the hook remains visible on it.

Does not cope with loaders lacking ``exec_module`` (legacy ``load_module``):
such a module is imported unpatched.
"""


def module_executed(module, name=None):
    """Hand a freshly executed watched module to the engine.

    Never raises, except the engine's HotfixError in strict mode."""
    from . import engine

    engine.on_module_imported(module, name)
