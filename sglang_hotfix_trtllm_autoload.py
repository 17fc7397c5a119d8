"""Startup hook of sglang-hotfix-trtllm: arm the hotfix, do nothing else.

Python runs this module from ``sglang_hotfix_trtllm.pth`` (or, on Pythons
that implement PEP 829, from ``sglang_hotfix_trtllm.start``) in *every*
process of the environment, so it keeps three constraints:

* Nothing beyond ``sys`` and ``os`` is imported at module level: both are
  already loaded when ``site`` runs, so importing them costs nothing. wrapt,
  torch, SGLang and the rest of this package are imported only when SGLang's
  TRT-LLM MHA backend module is itself imported.
* It never raises into the host. A failure is reported in one line on stderr
  and Python goes on, unless the operator asked for strict mode
  (``SGLANG_HOTFIX_TRTLLM_STRICT=1``) and the target module is being imported.
* Running it twice in one process (``.pth`` and ``.start``, or the SGLang
  plugin entry point after the startup file) arms the hook once.

What it does: put one finder at the front of ``sys.meta_path``. The finder
answers only for the watched module names; for those it lets the regular
finders locate the module and wraps the loader so that, right after the
module has executed, ``sglang_hotfix_trtllm.engine`` decides whether to patch
it. Every other import passes through after one set-membership test.

What it does not cope with: a module loaded by a loader without
``exec_module`` (legacy ``load_module`` loaders) is left alone; it is reported
by ``sglang-hotfix-trtllm status`` as not patched.
"""

import os
import sys

# Modules whose import triggers the engine. Must equal the ``module`` of the
# hotfix records in ``sglang_hotfix_trtllm.catalog`` (a test holds them equal):
# it is repeated here so that arming the hook imports nothing.
WATCHED_MODULES = frozenset({"sglang.srt.layers.attention.trtllm_mha_backend"})

DISABLE_VARIABLE = "SGLANG_HOTFIX_TRTLLM_DISABLE"
STRICT_VARIABLE = "SGLANG_HOTFIX_TRTLLM_STRICT"
# The values read as "on". ``sglang_hotfix_trtllm.switches`` parses the same
# variables with warnings for values outside its vocabulary; at start-up only
# the cheapest test is made (a test holds both vocabularies equal).
TRUE_VALUES = ("1", "true", "yes", "on")

_finder = None


def _switch_on(variable):
    return os.environ.get(variable, "").strip().lower() in TRUE_VALUES


def _report(message):
    try:
        sys.stderr.write("sglang-hotfix-trtllm: %s\n" % message)
    except Exception:
        pass


def _on_watched_module_executed(module):
    """Hand the freshly executed module to the engine; never raise unless strict."""
    try:
        from sglang_hotfix_trtllm import engine
    except Exception as error:
        message = (
            "cannot load the hotfix engine (%s: %s); %s was imported unpatched. "
            "Reinstall sglang-hotfix-trtllm, or set %s=1 to silence this."
            % (type(error).__name__, error, module.__name__, DISABLE_VARIABLE)
        )
        if _switch_on(STRICT_VARIABLE):
            raise ImportError("sglang-hotfix-trtllm (strict mode): " + message) from error
        _report(message)
        return
    engine.on_module_imported(module)


class _PatchAfterExecLoader:
    """Delegates to the real loader; calls the engine once the module ran."""

    def __init__(self, loader):
        self._loader = loader

    def __getattr__(self, name):
        # get_source, is_package, get_resource_reader ... come from the real loader.
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        # Put the real loader back before anything can observe the proxy, so
        # the module's __loader__ and __spec__.loader are SGLang's own.
        module.__loader__ = self._loader
        spec = getattr(module, "__spec__", None)
        if spec is not None:
            spec.loader = self._loader
        self._loader.exec_module(module)
        _on_watched_module_executed(module)


class HotfixImportFinder:
    """Meta-path finder that answers only for ``WATCHED_MODULES``."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in WATCHED_MODULES:
            return None
        for finder in sys.meta_path:
            if finder is self or isinstance(finder, HotfixImportFinder):
                continue
            find_spec = getattr(finder, "find_spec", None)
            if find_spec is None:
                continue
            spec = find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _PatchAfterExecLoader(spec.loader)
        return spec


def install():
    """Arm the hotfix in this process. Idempotent; never raises.

    If a watched module is already imported it is handed to the engine at
    once; otherwise the engine runs when it is first imported.
    Returns True when the hook is armed, False when disabled or failed.
    """
    global _finder
    try:
        if _switch_on(DISABLE_VARIABLE):
            return False
        if _finder is None:
            _finder = HotfixImportFinder()
            sys.meta_path.insert(0, _finder)
            for name in WATCHED_MODULES:
                module = sys.modules.get(name)
                if module is not None:
                    _on_watched_module_executed(module)
        return True
    except ImportError:
        # Strict mode refused an already-imported module: let it stop the process.
        raise
    except Exception as error:
        _report("startup hook failed (%s: %s); SGLang runs unpatched." % (type(error).__name__, error))
        return False


def uninstall():
    """Disarm the hook: later imports of watched modules are not patched."""
    global _finder
    if _finder is not None:
        try:
            sys.meta_path.remove(_finder)
        except ValueError:
            pass
        _finder = None


def is_installed():
    return _finder is not None and _finder in sys.meta_path
