"""The generic engine: find the source, decide a verdict, wrap or refuse,
report, revert. It knows nothing about a particular bug; that is in the
records of ``catalog``.

Imports wrapt only when something is wrapped; never imports torch or SGLang
itself (the target module is handed in by the import hook, already imported).
Never raises into the host, except ``HotfixError`` in strict mode
(``SGLANG_HOTFIX_TRTLLM_STRICT=1``), which the operator asked for.
"""

import ast
import logging
import os
import threading
import types
import weakref

from . import catalog, source, switches
from .logs import say
from .record import Value, Verdict

UNINSTALL_HINT = "pip uninstall sglang-hotfix-trtllm"


class HotfixError(ImportError):
    """Raised in strict mode when the target is imported but cannot be patched.

    An ImportError, so the import of SGLang's backend itself fails: the
    process stops at the point where it would otherwise run unprotected.
    """


class Assessment(Value):
    """The verdict on one source of a hotfix's target, with what it rests on."""

    __slots__ = ("hotfix_name", "target", "verdict", "reason", "fingerprint", "source_path", "known_releases",
                 "method_first_line")
    _defaults = {"method_first_line": None}

    def as_dict(self):
        return {
            "hotfix": self.hotfix_name,
            "target": self.target,
            "verdict": self.verdict.value,
            "reason": self.reason,
            "fingerprint": self.fingerprint,
            "source_path": self.source_path,
            "known_releases": list(self.known_releases),
        }


# --------------------------------------------------------------------------
# Verdicts


def assess_source(hotfix, path, text=None):
    """Classify one source file of the hotfix's target module; never raises."""

    def result(verdict, reason, fingerprint=None, first_line=None, releases=()):
        return Assessment(hotfix.name, hotfix.target, verdict, reason, fingerprint, path, tuple(releases), first_line)

    try:
        if text is None:
            text = source.read_text(path)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError) as error:
        return result(Verdict.UNKNOWN, "cannot read %s: %s: %s" % (path, type(error).__name__, error))

    try:
        tree = ast.parse(text, filename=path)
    except (SyntaxError, ValueError) as error:
        return result(Verdict.UNKNOWN, "cannot read %s as Python: %s: %s" % (path, type(error).__name__, error))
    try:
        # Always the full analysis of the live definitions: the release table
        # only names the releases that share the fingerprint. A method whose
        # fingerprint a release has can still be dead code (a later definition
        # wins) or be reached through code the table never saw.
        classification = hotfix.classify(tree)
    except Exception as error:  # a bug in a record must not take the host down
        return result(Verdict.UNKNOWN, "classifier failed: %s: %s" % (type(error).__name__, error))
    releases = ()
    try:
        known = hotfix.known_fingerprints.get(classification.fingerprint)
        if known is not None and known[0] is classification.verdict:
            releases = known[1]
    except Exception:
        pass
    reason = classification.reason
    if releases:
        reason = "%s; code identical to SGLang %s" % (reason, _releases_text(releases))
    return result(classification.verdict, reason, classification.fingerprint, classification.method_first_line, releases)


def _releases_text(releases):
    return releases[0] if len(releases) == 1 else "%s … %s (%d releases)" % (releases[0], releases[-1], len(releases))


def assess_installed(hotfix):
    """The verdict on the installed distribution, found without importing it."""
    located = source.locate(hotfix.module)
    if located.path is None:
        if located.module_found:
            return Assessment(hotfix.name, hotfix.target, Verdict.UNKNOWN,
                              "cannot analyse %s: %s" % (hotfix.module, located.reason), None, None, ())
        if not located.package_found:
            reason = "%s is not installed in this environment (%s)" % (hotfix.distribution, located.reason)
        else:
            reason = "this %s has no %s module (%s)" % (hotfix.distribution, hotfix.module, located.reason)
        return Assessment(hotfix.name, hotfix.target, Verdict.NOT_APPLICABLE, reason, None, None, ())
    return assess_source(hotfix, located.path)


def assess_module(hotfix, module):
    """The verdict on an imported module, from the file it was loaded from."""
    path, problem = source.source_file(getattr(getattr(module, "__spec__", None), "origin", None)
                                       or getattr(module, "__file__", None))
    if path is None:
        return Assessment(hotfix.name, hotfix.target, Verdict.UNKNOWN,
                          "cannot analyse %s: %s" % (hotfix.module, problem), None, None, ())
    return assess_source(hotfix, path)


def wrapt_problem():
    """None when wrapt imports, else why not. Asked by the import hook before
    wrapping and by ``status`` before promising protection: one answer."""
    try:
        import wrapt  # noqa: F401
    except Exception as error:
        return "wrapt cannot be imported (%s: %s); install it: pip install 'wrapt>=1.14'" % (type(error).__name__, error)
    return None


class Decision(Value):
    """What a process does when the target is imported: ``action`` is one of
    patch, disabled, excluded, fixed, not-applicable, refuse; ``why`` in words."""

    __slots__ = ("action", "why")


def decide(hotfix, assessment, current):
    """The one decision, made the same way by the import hook (which acts on
    it) and by ``status`` (which predicts it). Imports wrapt when the verdict is
    affected and nothing else stands in the way."""
    if current.disabled:
        return Decision("disabled", "%s is on" % switches.DISABLE)
    if current.excluded_by_sglang_plugins:
        return Decision("excluded", "%s is set and does not name %s" % (switches.SGLANG_PLUGINS, switches.PLUGIN_NAME))
    if assessment.verdict is Verdict.FIXED:
        return Decision("fixed", "nothing to patch: the verdict is fixed")
    if assessment.verdict is Verdict.NOT_APPLICABLE:
        return Decision("not-applicable", "nothing to patch: the verdict is not-applicable")
    if assessment.verdict is Verdict.UNKNOWN:
        return Decision("refuse", "the code is not recognised: %s" % assessment.reason)
    problem = wrapt_problem()
    if problem is not None:
        return Decision("refuse", problem)
    return Decision("patch", "the verdict is affected and wrapt is available")


# --------------------------------------------------------------------------
# Wrapping

_lock = threading.RLock()
# (weak ref to the patched class, hotfix, original function object)
_patched = []


def _hotfix_wrapper_type():
    import wrapt

    class HotfixWrapper(wrapt.FunctionWrapper):
        """Marks a method wrapped by this package, so applying twice is a no-op."""

    return HotfixWrapper


_wrapper_type = None


def _is_ours(attribute, hotfix):
    return _wrapper_type is not None and isinstance(attribute, _wrapper_type) and attribute._self_hotfix_name == hotfix.name


def _chain(attribute):
    """The attribute and everything below it through ``__wrapped__``."""
    seen = set()
    while attribute is not None and id(attribute) not in seen:
        seen.add(id(attribute))
        yield attribute
        attribute = getattr(attribute, "__wrapped__", None)


def _ours_in_chain(attribute, hotfix):
    """True when our wrapper is the attribute or sits below another wrapper
    (a wrapper made around our wrapper as seen through the class holds wrapt's
    bound wrapper, whose ``_self_parent`` is ours)."""
    return any(_is_ours(a, hotfix) or _is_ours(getattr(a, "_self_parent", None), hotfix) for a in _chain(attribute))


def _innermost(attribute):
    """The function at the bottom of ``__wrapped__`` (functools.wraps, SGLang's
    HookRegistry), as ``inspect.unwrap`` finds it, without importing inspect."""
    for attribute in _chain(attribute):
        pass
    return attribute


def _check_wrappable(hotfix, current, assessment):
    """The function at the bottom of the attribute must be the code we analysed.

    Returns None when it is, else why not. A wrapper that declares what it
    wraps (``__wrapped__``, as SGLang's HookRegistry does) is accepted: the
    hotfix then wraps on top of it.
    """
    function = _innermost(current)
    code = getattr(function, "__code__", None)
    if not isinstance(function, types.FunctionType) or code is None:
        return "%s is a %s, not the function SGLang defines (replaced by someone else?)" % (hotfix.target, type(function).__name__)
    if code.co_name != hotfix.method_name:
        return "%s holds function %r from %s (replaced by someone else?)" % (hotfix.target, code.co_name, code.co_filename)
    if assessment.source_path and os.path.basename(code.co_filename) != os.path.basename(assessment.source_path):
        return "%s was compiled from %s, not from the analysed %s" % (hotfix.target, code.co_filename, assessment.source_path)
    if assessment.method_first_line is not None and code.co_firstlineno != assessment.method_first_line:
        return "%s starts at line %d in the running code but at line %d on disk (file changed since import?)" % (
            hotfix.target, code.co_firstlineno, assessment.method_first_line)
    return None


def wrap(hotfix, module, assessment):
    """Wrap the target method on its class. Returns "wrapped" or "already".

    Raises on failure (the caller decides whether that stops the process).
    """
    global _wrapper_type
    with _lock:
        cls = getattr(module, hotfix.class_name)
        current = cls.__dict__[hotfix.method_name]
        if _ours_in_chain(current, hotfix):
            return "already"
        problem = _check_wrappable(hotfix, current, assessment)
        if problem:
            raise RuntimeError(problem)
        if _wrapper_type is None:
            _wrapper_type = _hotfix_wrapper_type()
        wrapper = _wrapper_type(current, hotfix.wrapper)
        wrapper._self_hotfix_name = hotfix.name
        setattr(cls, hotfix.method_name, wrapper)
        _patched.append((weakref.ref(cls), hotfix, current))
        return "wrapped"


def remove_all():
    """Put every original function object back; returns how many were restored."""
    restored = 0
    with _lock:
        for cls_ref, hotfix, original in _patched:
            cls = cls_ref()
            if cls is None:
                continue
            if _is_ours(cls.__dict__.get(hotfix.method_name), hotfix):
                setattr(cls, hotfix.method_name, original)
                restored += 1
            else:
                say(logging.WARNING, "not restoring %s: it was replaced after the hotfix wrapped it", hotfix.target)
        _patched.clear()
    if restored:
        say(logging.INFO, "removed: %d method(s) restored to SGLang's original", restored, once_key="removed")
    return restored


def is_patched(hotfix, cls):
    """True when the class's method is wrapped by this hotfix, on top or below another wrapper."""
    return _ours_in_chain(cls.__dict__.get(hotfix.method_name), hotfix)


# --------------------------------------------------------------------------
# The import hook's entry point


def _version_text(hotfix, path):
    version = source.distribution(hotfix.distribution, path, hotfix.module).version
    return "%s %s" % (hotfix.distribution, version or "(version unknown: no distribution metadata)")


RUNS_UNPATCHED = "SGLang runs unpatched"


def _refuse(hotfix, strict, message):
    """Warn that SGLang runs unpatched; in strict mode, stop the import instead
    (and say so: the message must not promise that SGLang runs)."""
    if strict:
        message = message.replace(RUNS_UNPATCHED, "the import of %s is stopped" % hotfix.module)
        raise HotfixError("sglang-hotfix-trtllm (strict mode, %s=1): %s" % (switches.STRICT, message))
    say(logging.WARNING, "%s", message, once_key=("refused", hotfix.name))


def handle(hotfix, module):
    """Decide and act for one freshly imported target module. Returns the
    outcome as a short word: patched, already, disabled, excluded, fixed,
    not-applicable, refused."""
    current = switches.read()
    for problem in current.problems:
        say(logging.WARNING, "%s", problem, once_key=("switch", problem))
    if current.disabled:
        return "disabled"
    assessment = assess_module(hotfix, module)
    decision = decide(hotfix, assessment, current)
    path = assessment.source_path

    if decision.action == "excluded":
        # A known bug left unpatched by the allowlist deserves a WARNING; elsewhere it is only information.
        say(
            logging.WARNING if assessment.verdict is Verdict.AFFECTED else logging.INFO,
            "not patching %s: %s=%r does not name %s (SGLang's plugin allowlist); add it there to enable the hotfix",
            hotfix.target, switches.SGLANG_PLUGINS, os.environ.get(switches.SGLANG_PLUGINS), switches.PLUGIN_NAME,
            once_key=("excluded", hotfix.name),
        )
        return "excluded"
    if decision.action == "fixed":
        say(
            logging.INFO,
            "not patching %s: upstream already has the fix (%s; %s). This package can be removed: %s",
            hotfix.target, _version_text(hotfix, path), assessment.reason, UNINSTALL_HINT,
            once_key=("fixed", hotfix.name),
        )
        return "fixed"
    if decision.action == "not-applicable":
        return "not-applicable"
    if assessment.verdict is Verdict.UNKNOWN:
        _refuse(
            hotfix, current.strict,
            "not patching %s: code not recognised (%s, %s, fingerprint %s): %s. %s; run `sglang-hotfix-trtllm status` "
            "for details" % (hotfix.target, _version_text(hotfix, path) if path else hotfix.distribution,
                             path or "no source", assessment.fingerprint, assessment.reason, RUNS_UNPATCHED),
        )
        return "refused"
    if decision.action == "refuse":
        _refuse(hotfix, current.strict, "could not patch %s (%s, %s): %s; " % (
            hotfix.target, _version_text(hotfix, path), path, decision.why) + RUNS_UNPATCHED)
        return "refused"

    try:
        outcome = wrap(hotfix, module, assessment)
    except Exception as error:
        _refuse(hotfix, current.strict, "could not patch %s (%s, %s): %s: %s; " % (
            hotfix.target, _version_text(hotfix, path), path, type(error).__name__, error) + RUNS_UNPATCHED)
        return "refused"
    if outcome == "wrapped":
        below = getattr(module, hotfix.class_name).__dict__[hotfix.method_name].__wrapped__
        stacked = "" if not hasattr(below, "__wrapped__") else " (on top of an existing wrapper, %s.%s)" % (
            getattr(below, "__module__", "?"), getattr(below, "__qualname__", type(below).__name__))
        say(
            logging.INFO,
            "patched %s (%s, fingerprint %s): draft-decode CUDA-graph capture now fills cache_seqlens as %s does%s",
            hotfix.target, _version_text(hotfix, path), assessment.fingerprint, hotfix.upstream, stacked,
            once_key=("patched", hotfix.name),
        )
        return "patched"
    return outcome


def on_module_imported(module, name=None):
    """Called by the import hook right after a watched module executed (or,
    from ``apply()``, for one found already in ``sys.modules``).

    Never raises, except HotfixError in strict mode; anything that is not a
    module object (``sys.modules[name] = None`` blocks an import) is ignored.
    """
    if not isinstance(module, types.ModuleType):
        return
    name = name or getattr(module, "__name__", None)
    for hotfix in catalog.for_module(name):
        try:
            handle(hotfix, module)
        except HotfixError:
            raise
        except Exception as error:  # a bug here must not take the host down
            message = "internal error while handling %s: %s: %s; " % (hotfix.target, type(error).__name__, error)
            if switches.read().strict:
                raise HotfixError(message + "the import of %s is stopped (strict mode)" % hotfix.module) from error
            message += RUNS_UNPATCHED
            say(logging.WARNING, "%s", message)
