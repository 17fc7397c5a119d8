"""The engine: for a freshly imported target module, decide and act (patch,
stand aside, or refuse), and say so. ``decide`` is the one decision, made the
same way by the import hook (which acts on it) and by ``status`` (which
predicts it). It knows nothing about a particular bug; that is in the records
of ``catalog``, found with ``detect`` and applied with ``patch``.

Never imports torch or SGLang itself (the target module is handed in by the
import hook, already imported). Never raises into the host, except
``HotfixError`` in strict mode (``SGLANG_HOTFIX_TRTLLM_STRICT=1``), which the
operator asked for.
"""

import contextlib
import enum
import logging
import os
import types

from . import detect, process_state, source, switches
from .records import catalog
from .logs import say
from .record import Value, Verdict

UNINSTALL_HINT = "pip uninstall sglang-hotfix-trtllm"


class HotfixError(ImportError):
    """Raised in strict mode when the target is imported but cannot be patched.

    An ImportError, so the import of SGLang's backend itself fails: the
    process stops at the point where it would otherwise run unprotected.
    """


# What the wrappers use of wrapt: a module named wrapt without them is not the wrapt package.
WRAPT_NAMES = ("FunctionWrapper", "BoundFunctionWrapper")


def wrapt_problem(search_first=None):
    """None when wrapt imports and is the wrapt package, else why not. Asked by the import hook
    before wrapping and by ``status`` before promising protection: one answer. ``status`` passes
    the folder a ``python -m`` or ``python -c`` process started in its folder would search first
    (the current one): a ``wrapt.py`` or ``wrapt/`` there shadows the package in such processes,
    while ``status`` itself, a console script, does not see it (issue 48, item 3)."""
    if search_first is not None:
        for name in ("wrapt.py", "wrapt"):
            candidate = os.path.join(search_first, name)
            if os.path.exists(candidate):
                return (
                    "%s shadows the wrapt package for `python -m` and `python -c` processes started in %s (they "
                    "search that folder first): rename it, or start SGLang elsewhere" % (candidate, search_first)
                )
    try:
        import wrapt
    except Exception as error:
        return "wrapt cannot be imported (%s: %s); install it: pip install 'wrapt>=1.14'" % (
            type(error).__name__,
            error,
        )
    missing = [name for name in WRAPT_NAMES if not hasattr(wrapt, name)]
    if missing:
        return (
            "the module imported as wrapt (%s) is not the wrapt package (it has no %s): a file or folder named "
            "wrapt shadows it; rename that, or reinstall wrapt: pip install 'wrapt>=1.14'"
            % (getattr(wrapt, "__file__", None) or "no file", ", ".join(missing))
        )
    return None


class Action(str, enum.Enum):
    """What a process does with a record when its target is imported: the closed set
    ``decide`` chooses from. ``status --json`` shows the value as ``decision``."""

    PATCH = "patch"
    DISABLED = "disabled"  # SGLANG_HOTFIX_TRTLLM_DISABLE: silent
    EXCLUDED = "excluded"  # SGLang's plugin allowlist leaves this plugin out
    FIXED = "fixed"  # upstream's fix is there: INFO, the package can go
    NOT_APPLICABLE = "not-applicable"  # nothing of this record's here: silent
    UNKNOWN_CODE = "unknown-code"  # refused: the code is not recognised
    UNREPAIRABLE = "unrepairable"  # the bug is recognised, but not repairable here: a WARNING, no refusal
    WRAPT_UNUSABLE = "wrapt-unusable"  # refused: wrapt cannot be imported

    def __str__(self):
        return self.value


# The actions that refuse: a warning (SGLang runs without the record's fix), or in strict mode a stopped import.
REFUSALS = (Action.UNKNOWN_CODE, Action.WRAPT_UNUSABLE)


class Decision(Value):
    """``decide``'s answer: the ``action``, ``why`` in a few words (status shows
    it), and the log line the import hook writes for it (``message`` at
    ``level``; None for the silent actions, and for PATCH, whose line follows
    the wrapping)."""

    __slots__ = ("action", "why", "message", "level")
    _defaults = {"message": None, "level": logging.INFO}


def decide(hotfix, assessment, current, search_first=None):
    """The one decision, made the same way by the import hook (which acts on
    it) and by ``status`` and ``verify`` (which report it). ``assessment`` is
    the verdict on the code, or a function returning it: it is asked only when
    the switches leave the record on. Imports wrapt when the verdict is
    affected and nothing else stands in the way. ``search_first``: ``status``'s current folder, which
    a ``python -m`` process started there searches first (``wrapt_problem``)."""
    if current.disables(hotfix.name):
        why = current.why_disabled(hotfix.name)
        # Turned off by name: said once in the process's log, as every other decision (README: "once
        # per record"). Everything off (a value not understood) is said once, by the switch's warning.
        said = None if current.disabled else "not patching %s for record %s: %s (turned off by the operator)"
        return Decision(Action.DISABLED, why, said and said % (hotfix.target, hotfix.name, why))
    if callable(assessment):
        assessment = assessment()
    path = assessment.source_path
    if assessment.verdict is Verdict.FIXED:
        return Decision(
            Action.FIXED,
            "nothing to patch: upstream already has the fix",
            "not patching %s for record %s: upstream already has the fix (%s; %s). Other records may still repair "
            "this SGLang: once `sglang-hotfix-trtllm status` says NOTHING TO DO, the package can be removed: %s"
            % (hotfix.target, hotfix.name, _version_text(hotfix, path), assessment.reason, UNINSTALL_HINT),
        )
    if assessment.verdict is Verdict.NOT_APPLICABLE:
        return Decision(Action.NOT_APPLICABLE, "nothing to patch: the record does not apply to this code")
    if current.excluded_by_sglang_plugins:
        return Decision(
            Action.EXCLUDED,
            "%s is set and does not name %s" % (switches.SGLANG_PLUGINS, switches.PLUGIN_NAME),
            "not patching %s for record %s: %s=%r does not name %s (SGLang's plugin allowlist); add it there to "
            "enable the hotfix"
            % (
                hotfix.target,
                hotfix.name,
                switches.SGLANG_PLUGINS,
                os.environ.get(switches.SGLANG_PLUGINS),
                switches.PLUGIN_NAME,
            ),
            # Asked only where there is something to do: a record fixed upstream or with nothing to
            # repair says so whatever the allowlist ("add it there" would be advice for nothing).
            # A known bug left unpatched by the allowlist deserves a WARNING; elsewhere it is only information.
            logging.WARNING if assessment.verdict in (Verdict.AFFECTED, Verdict.UNREPAIRABLE) else logging.INFO,
        )
    if assessment.verdict is Verdict.UNREPAIRABLE:
        # Not a refusal: the code is recognised, so strict mode (for code the hotfix does not
        # recognise) does not stop the import; status says NOT PROTECTED and exits 1.
        if hotfix.flashinfer_fix is not None:  # FlashInfer's own kernel: no SGLang code is the repair
            return Decision(
                Action.UNREPAIRABLE,
                "a bug of FlashInfer's kernel that SGLang's code reaches, never repaired by this hotfix: %s"
                % assessment.reason,
                "not patching %s: %s reaches the FlashInfer kernel bug of record %s (%s), which this hotfix never "
                "repairs: %s"
                % (hotfix.target, _version_text(hotfix, path), hotfix.name, hotfix.upstream, assessment.reason),
                logging.WARNING,
            )
        return Decision(
            Action.UNREPAIRABLE,
            "the bug is recognised but cannot be repaired exactly here: %s" % assessment.reason,
            "not patching %s: %s has the bug of record %s (%s), which this hotfix recognises but cannot repair "
            "exactly here: %s"
            % (hotfix.target, _version_text(hotfix, path), hotfix.name, hotfix.upstream, assessment.reason),
            logging.WARNING,
        )
    if assessment.verdict is Verdict.UNKNOWN:
        return Decision(
            Action.UNKNOWN_CODE,
            "the code is not recognised: %s" % assessment.reason,
            "not patching %s for record %s: code not recognised (%s, %s, fingerprint %s): %s. Run "
            "`sglang-hotfix-trtllm status` for details"
            % (
                hotfix.target,
                hotfix.name,
                _version_text(hotfix, path) if path else hotfix.distribution,
                path or "no source",
                assessment.fingerprint,
                assessment.reason,
            ),
            logging.WARNING,
        )
    problem = wrapt_problem(search_first) if hotfix.mechanism == "wrap" else None  # an edit needs no wrapt
    if problem is not None:
        return Decision(
            Action.WRAPT_UNUSABLE,
            problem,
            "could not patch %s for record %s (%s, %s): %s"
            % (hotfix.target, hotfix.name, _version_text(hotfix, path), path, problem),
            logging.WARNING,
        )
    if hotfix.mechanism == "edit":
        return Decision(Action.PATCH, "the verdict is affected: upstream's change is compiled into SGLang's method")
    return Decision(Action.PATCH, "the verdict is affected and wrapt is available")


def _version_text(hotfix, path):
    version = source.distribution(hotfix.distribution, path, hotfix.module).version
    return "%s %s" % (hotfix.distribution, version or "(version unknown: no distribution metadata)")


def _refuse(hotfix, strict, message, cause=None, once=True):
    """Say why ``hotfix`` is not applied and what follows: SGLang runs
    unpatched (a warning), or, in strict mode, the import is stopped (raised)."""
    if strict:
        raise HotfixError(
            "sglang-hotfix-trtllm (strict mode, %s=1): %s; the import of %s is stopped"
            % (switches.STRICT, message, hotfix.module)
        ) from cause
    # Other records may have patched the same method: what is true is that this record's fix is missing.
    say(
        logging.WARNING,
        "%s; SGLang runs without this record's fix",
        message,
        once_key=("refused", hotfix.name) if once else None,
    )


def handle(hotfix, module):
    """Act on ``decide`` for one freshly imported target module: write the
    decision's line, or wrap. Returns the decision's action when there was
    nothing to wrap, else what wrapping gave: "patched", "already" (wrapped
    before) or "refused" (an action that refuses, or wrapping that failed)."""
    current = switches.read()
    for problem in current.problems:
        say(logging.WARNING, "%s", problem, once_key=("switch", problem))
    assessment = None

    def assess():
        nonlocal assessment
        assessment = detect.assess_module(hotfix, module)
        return assessment

    def done(outcome, why=None, patched=False):
        """Keep what was done for ``status --pid`` (process_state), and return ``outcome``."""
        try:
            found = assessment if assessment is not None else assess()
            path = found.source_path
            process_state.note(
                hotfix,
                found.verdict.value,
                found.reason,
                found.fingerprint,
                source.distribution(hotfix.distribution, path, hotfix.module).version if path else None,
                decision.action.value,
                why or decision.why,
                patched,
            )
        except Exception as error:  # what status --pid reads must never cost the host its import
            say(logging.DEBUG, "could not note %s for status --pid: %s: %s", hotfix.name, type(error).__name__, error)
        return outcome

    decision = decide(hotfix, assess, current)
    if decision.action in REFUSALS:
        try:
            _refuse(hotfix, current.strict, decision.message)
        finally:
            done("refused")
        return "refused"
    if decision.action is not Action.PATCH:
        if decision.message is not None:
            say(decision.level, "%s", decision.message, once_key=(decision.action.value, hotfix.name))
        return done(decision.action)

    from . import code_edit

    path = assessment.source_path
    try:
        if hotfix.mechanism == "edit":
            with source.remembering():  # one parse of the file for the record's methods (and,
                # opened by on_module_imported, for every record of the module)
                outcome = code_edit.put_record_in_force(hotfix, module, assessment)
        else:
            from . import patch

            outcome = patch.wrap(hotfix, module, assessment)
    except code_edit.NotEditable as problem:  # patch.NotWrappable is one
        done("refused", "not wrappable: %s" % problem)
        _refuse(
            hotfix,
            current.strict,
            "not patching %s for record %s (%s, %s): %s"
            % (hotfix.target, hotfix.name, _version_text(hotfix, path), path, problem),
            problem,
        )
        return "refused"
    except Exception as error:
        done("refused", "wrapping failed: %s: %s" % (type(error).__name__, error))
        _refuse(
            hotfix,
            current.strict,
            "could not patch %s for record %s (%s, %s): %s: %s"
            % (hotfix.target, hotfix.name, _version_text(hotfix, path), path, type(error).__name__, error),
            error,
        )
        return "refused"
    if outcome == "wrapped":
        say(
            logging.INFO,
            "patched %s (%s, fingerprint %s): %s as %s does",
            hotfix.targets_text,
            _version_text(hotfix, path),
            assessment.fingerprint,
            hotfix.effect,
            hotfix.upstream,
            once_key=("patched", hotfix.name),
        )
        from . import metrics

        metrics.report_applied(
            hotfix, source.distribution(hotfix.distribution, path, hotfix.module).version, assessment.fingerprint
        )
        return done("patched", "patched in this process", patched=True)
    return done(outcome, "patched in this process (%s)" % outcome, patched=outcome == "already")


def on_module_imported(module, name=None):
    """Called by the import hook right after a watched module executed (or,
    from ``apply()``, for one found already in ``sys.modules``).

    Never raises, except HotfixError in strict mode; anything that is not a
    module object (``sys.modules[name] = None`` blocks an import) is ignored.
    """
    if not isinstance(module, types.ModuleType):
        return
    name = name or getattr(module, "__name__", None)
    # The records of one module read one file and one distribution's metadata: each once.
    with detect.shared_parses(), source.remembering(), _publishing_state():
        for hotfix in catalog.for_module(name):
            try:
                handle(hotfix, module)
            except HotfixError:
                raise
            except Exception as error:  # a bug here must not take the host down
                _refuse(
                    hotfix,
                    switches.read().strict,
                    "internal error while handling %s for record %s: %s: %s"
                    % (hotfix.target, hotfix.name, type(error).__name__, error),
                    error,
                    once=False,
                )


@contextlib.contextmanager
def _publishing_state():
    """This process's state file for ``status --pid``, written once the module's records are handled
    (also when strict mode stops the import)."""
    try:
        yield
    finally:
        process_state.publish()
