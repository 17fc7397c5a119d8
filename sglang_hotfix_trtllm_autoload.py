"""Startup hook of sglang-hotfix-trtllm: arm a lazy import hook, nothing else.

Runs from ``sglang_hotfix_trtllm.pth`` (or, where Python implements PEP 829,
``sglang_hotfix_trtllm.start``) in *every* Python process of the environment.
Constraints, kept because each costs start-up time in every process:

* Standard library only, and only ``sys`` at module level. ``os`` is imported
  inside ``install`` (already loaded, so free) rather than kept as a global:
  a module global holding ``os`` makes interpreter shutdown measurably slower.
* Small: the import hook's real work lives in ``sglang_hotfix_trtllm._import_hook``
  and is imported only when SGLang's TRT-LLM MHA backend is imported.
* Never raises into the host (strict mode aside, see ``find_spec``).
* Idempotent: the ``.pth`` may be read twice (a venv whose ``lib64`` links to
  ``lib``), and the SGLang plugin entry point calls ``install`` again.

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


def switch_on(variable):
    from os import environ

    return environ.get(variable, "").strip().lower() in TRUE_VALUES


def _import_hook(subject):
    """``sglang_hotfix_trtllm._import_hook``, or None after one line on stderr
    (an ImportError instead, in strict mode) when the package cannot load."""
    try:
        from sglang_hotfix_trtllm import _import_hook
    except Exception as error:
        message = "cannot load the hotfix (%s: %s); %s is imported unpatched. Reinstall sglang-hotfix-trtllm, or set %s=1." % (
            type(error).__name__, error, subject, DISABLE_VARIABLE)
        if switch_on(STRICT_VARIABLE):
            raise ImportError("sglang-hotfix-trtllm (strict mode): " + message) from error
        sys.stderr.write("sglang-hotfix-trtllm: %s\n" % message)
        return None
    return _import_hook


def find_spec(fullname, path=None, target=None):
    """Meta-path finder: None for all but the watched modules; for those, the
    regular spec with a loader that hands the module to the engine once run."""
    if fullname not in WATCHED_MODULES:
        return None
    hook = _import_hook(fullname)
    return None if hook is None else hook.find_spec(find_spec, fullname, path, target)


find_spec.find_spec = find_spec


def install():
    """Arm the hook in this process. Idempotent. Returns False when disabled.

    If a watched module is already imported, it is handed to the engine now.
    """
    if switch_on(DISABLE_VARIABLE):
        return False
    if find_spec not in sys.meta_path:
        sys.meta_path.insert(0, find_spec)
        for name in WATCHED_MODULES:
            if name in sys.modules:
                hook = _import_hook(name)
                if hook is not None:
                    hook.module_executed(sys.modules[name])
    return True


def uninstall():
    """Disarm the hook: later imports of watched modules are not patched."""
    while find_spec in sys.meta_path:
        sys.meta_path.remove(find_spec)


def is_installed():
    return find_spec in sys.meta_path
