"""Startup module of sglang-hotfix-trtllm: arm the lazy import hook, nothing else.

Runs from ``sglang_hotfix_trtllm.pth`` (or, where Python implements PEP 829,
``sglang_hotfix_trtllm.start``) in *every* Python process of the environment.
Constraints, kept because each costs start-up time in every process or could
harm a host that never asked for SGLang:

* Standard library only, and only ``sys`` at module level. ``os`` is imported
  inside ``switch_on`` (already loaded at start-up, so free).
* Small: the import hook's real work lives in ``sglang_hotfix_trtllm.import_hook``
  and is imported only when a watched module is imported.
* Never raises into the host (strict mode aside, see ``find_spec``) and never
  writes to stdout; at most one line on stderr, and only when stderr can take
  it (``_say``: stderr may be None, closed or a broken pipe).
* Idempotent, across copies: the ``.pth`` may be read twice (a venv whose
  ``lib64`` links to ``lib``), the SGLang plugin entry point calls ``install``
  again, and this module may be reloaded or imported from a second install.
  Every copy of the finder carries the attribute ``FINDER_MARK``; ``install``
  arms one only when no marked finder is armed yet, and the import hook skips
  all marked finders when it asks the others for the real spec.

The finder placed at the front of ``sys.meta_path`` is ``find_spec`` below, a
function carrying itself as its ``find_spec`` attribute, so no class is built
at start-up. It answers ``None`` for every module but the watched ones.
"""

import sys

# Modules whose import triggers the engine. Must equal the ``module`` of the
# hotfix records in ``sglang_hotfix_trtllm.catalog`` (a test holds them equal);
# repeated here so that arming the hook imports nothing.
WATCHED_MODULES = frozenset(("sglang.srt.layers.attention.trtllm_mha_backend",))
DISABLE_VARIABLE = "SGLANG_HOTFIX_TRTLLM_DISABLE"
STRICT_VARIABLE = "SGLANG_HOTFIX_TRTLLM_STRICT"
# Read as "on". ``sglang_hotfix_trtllm.switches`` parses the same variables and
# warns about other values (a test holds both vocabularies equal).
TRUE_VALUES = ("1", "true", "yes", "on")
# Set to True on every copy of the finder (see the module docstring).
FINDER_MARK = "sglang_hotfix_trtllm_finder"


def switch_on(variable):
    from os import environ

    return environ.get(variable, "").strip().lower() in TRUE_VALUES


def _say(message):
    """One line on stderr when stderr can take it; never raises."""
    try:
        stream = sys.stderr
        if stream is not None:
            stream.write("sglang-hotfix-trtllm: %s\n" % message)
            stream.flush()
    except Exception:
        pass


def _load_import_hook(subject):
    """``sglang_hotfix_trtllm.import_hook``, or None after one line on stderr
    (an ImportError instead, in strict mode) when the package cannot load."""
    try:
        from sglang_hotfix_trtllm import import_hook
    except Exception as error:
        message = "cannot load the hotfix (%s: %s); %s is imported unpatched. Reinstall sglang-hotfix-trtllm, or set %s=1." % (
            type(error).__name__, error, subject, DISABLE_VARIABLE)
        if switch_on(STRICT_VARIABLE):
            raise ImportError("sglang-hotfix-trtllm (strict mode): " + message) from error
        _say(message)
        return None
    return import_hook


def find_spec(fullname, path=None, target=None):
    """Meta-path finder: None for all but the watched modules; for those, the
    regular spec with a loader that hands the module to the engine once run."""
    if fullname not in WATCHED_MODULES:
        return None
    hook = _load_import_hook(fullname)
    return None if hook is None else hook.find_spec(fullname, path, target)


find_spec.find_spec = find_spec
setattr(find_spec, FINDER_MARK, True)


def is_finder(candidate):
    """True for any copy of this module's finder; never raises."""
    try:
        return getattr(candidate, FINDER_MARK, None) is True
    except Exception:
        return False


def install():
    """Arm the hook in this process. Idempotent. Returns False when disabled.

    If no copy of the finder was armed yet and a watched module is already
    imported, it is handed to the engine now.
    """
    if switch_on(DISABLE_VARIABLE):
        return False
    if not is_installed():
        sys.meta_path.insert(0, find_spec)
        for name in WATCHED_MODULES:
            module = sys.modules.get(name)
            if module is not None:
                hook = _load_import_hook(name)
                if hook is not None:
                    hook.module_executed(module, name)
    return True


def uninstall():
    """Disarm the hook (every copy of it): later imports of watched modules are not patched."""
    sys.meta_path[:] = [finder for finder in sys.meta_path if not is_finder(finder)]


def is_installed():
    return any(is_finder(finder) for finder in sys.meta_path)
