"""Patch: wrap a hotfix's target method on its class with wrapt, and revert.

Imported only when something is to be wrapped (after ``engine.decide`` saw
that wrapt imports), so wrapt is imported here at module level. Never imports
torch or SGLang. ``wrap`` raises ``NotWrappable`` when the hotfix must stand
aside; the caller decides whether that stops the process.

Composition with other patchers (SGLang's ``HookRegistry``, wrapt wrappers,
``functools.wraps`` decorators, plain reassignment). A record's repair is
proven for a call of SGLang's own method, so the hotfix wraps only SGLang's
own function, found as the class attribute itself:

* another wrapper *above* ours (installed after us: what SGLang's plugin
  loader and HookRegistry do, since the hotfix wraps at import) calls ours,
  and ours calls SGLang's method directly: the repair is exactly as alone;
* anything already *below* (the attribute is not the analysed function: a
  wrapper, a replacement) makes the hotfix stand aside: what runs under it
  may receive other arguments, or not be SGLang's method at all;
* ``remove()`` puts the original back when ours is on top; when another
  wrapper sits above ours it cannot take ours out of that chain, so it turns
  ours off in place (wrapt's ``enabled``): the call then goes straight through.

State, in one place (as gevent keeps its ``saved`` dict): ``_applied`` holds
one ``Applied`` per wrapped method; ``is_patched``, ``remove_all`` and the
engine's report all read it.
"""

import functools
import logging
import os
import threading
import types
import weakref

import wrapt

from .logs import say

_lock = threading.RLock()
# Every method this package wrapped in this process, in order.
_applied = []


class NotWrappable(Exception):
    """The class attribute is not the function the analysis read: the hotfix stands aside."""


class Applied:
    """One wrapped method: the class (weakly), the record, the original
    function object and our wrapper. Calling it answers wrapt's ``enabled``
    question: False once ``remove()`` turned the wrapper off in place."""

    __slots__ = ("cls_ref", "hotfix", "original", "wrapper", "enabled", "__weakref__")

    def __init__(self, cls, hotfix, original):
        self.cls_ref = weakref.ref(cls)
        self.hotfix = hotfix
        self.original = original
        self.wrapper = None
        self.enabled = True

    def __call__(self):
        return self.enabled


class HotfixWrapper(wrapt.FunctionWrapper):
    """Marks a method wrapped by this package, so applying twice is a no-op."""


def _is_ours(attribute, hotfix):
    try:
        return isinstance(attribute, HotfixWrapper) and attribute._self_hotfix_name == hotfix.name
    except Exception:
        return False


def _chain(attribute):
    """The attribute and what it calls below it through ``__wrapped__``.

    A plain function that declares ``__wrapped__`` but does not hold it in its
    closure (SGLang's HookRegistry REPLACE wrapper calls the plugin's function,
    not the one it names) ends the chain: what it names is never called."""
    seen = set()
    while attribute is not None and id(attribute) not in seen:
        seen.add(id(attribute))
        yield attribute
        try:
            below = getattr(attribute, "__wrapped__", None)
            if (
                type(attribute) is types.FunctionType
                and below is not None
                and not any(_cell_holds(cell, below) for cell in attribute.__closure__ or ())
            ):
                return
            attribute = below
        except Exception:  # a hostile proxy: the chain ends here
            return


def _cell_holds(cell, value):
    try:
        return cell.cell_contents is value
    except ValueError:  # an empty cell
        return False


def _ours_in_chain(attribute, hotfix):
    """Our wrapper when it is the attribute or sits below another wrapper (a
    wrapper made around ours as seen through the class holds wrapt's bound
    wrapper, whose ``_self_parent`` is ours); else None."""
    for layer in _chain(attribute):
        for candidate in (layer, getattr(layer, "_self_parent", None)):
            if _is_ours(candidate, hotfix):
                return candidate
    return None


def _describe(attribute):
    code = getattr(attribute, "__code__", None)
    where = " from %s" % code.co_filename if code is not None else ""
    return "%s %s.%s%s" % (
        type(attribute).__name__,
        getattr(attribute, "__module__", "?"),
        getattr(attribute, "__qualname__", "?"),
        where,
    )


def _check_wrappable(hotfix, current, assessment):
    """None when the class attribute is the function the analysis read, else why not."""
    if type(current) is not types.FunctionType or hasattr(current, "__wrapped__"):  # type(): proxies pass isinstance
        return (
            "%s is already wrapped or replaced by someone else (%s): the hotfix's repair is proven only directly "
            "around SGLang's own method, so it stands aside. The .pth file, SGLang's plugin loader and `run` "
            "apply the hotfix when the backend is imported, before other patchers" % (hotfix.target, _describe(current))
        )
    code = current.__code__
    if code.co_name != hotfix.method_name:
        return "%s holds function %r from %s (replaced by someone else?)" % (
            hotfix.target,
            code.co_name,
            code.co_filename,
        )
    if assessment.source_path and os.path.basename(code.co_filename) != os.path.basename(assessment.source_path):
        return "%s was compiled from %s, not from the analysed %s" % (
            hotfix.target,
            code.co_filename,
            assessment.source_path,
        )
    if assessment.method_first_line is not None and code.co_firstlineno != assessment.method_first_line:
        return "%s starts at line %d in the running code but at line %d on disk (file changed since import?)" % (
            hotfix.target,
            code.co_firstlineno,
            assessment.method_first_line,
        )
    return None


def wrap(hotfix, module, assessment):
    """Wrap the target method on its class. Returns "wrapped" or "already".

    The record's wrapper gets ``module`` (the module it was applied to) as its
    first argument: the names of the target module it needs come from there,
    never from the globals of whatever function it wraps.
    Raises ``NotWrappable`` when the hotfix must stand aside.
    """
    with _lock:
        cls = getattr(module, hotfix.class_name)
        current = cls.__dict__[hotfix.method_name]
        ours = _ours_in_chain(current, hotfix)
        if ours is not None:
            entry = ours._self_enabled  # the Applied record it was made with
            if entry.enabled and entry in _applied:
                return "already"
            # apply() after a remove() that turned ours off in place, or after someone put ours back
            # (a mock.patch.object undone): ours is in force again, and recorded again.
            entry.enabled = True
            if entry not in _applied:
                _applied.append(entry)
            return "wrapped"
        problem = _check_wrappable(hotfix, current, assessment)
        if problem:
            raise NotWrappable(problem)
        entry = Applied(cls, hotfix, current)
        wrapper = HotfixWrapper(current, functools.partial(hotfix.wrapper, module), enabled=entry)
        wrapper._self_hotfix_name = hotfix.name
        entry.wrapper = wrapper
        setattr(cls, hotfix.method_name, wrapper)
        _applied.append(entry)
        return "wrapped"


def remove_all():
    """Undo every wrap; returns how many methods were restored or turned off.

    Every wrapper of ours is turned off (wrapt's ``enabled``), so that one
    still referenced somewhere (a copy another patcher took, or ours put back
    later by someone who had replaced it, as ``mock.patch.object`` does) calls
    SGLang's method straight through. Ours on top: the original function
    object goes back. Ours under another wrapper: it stays in that chain,
    turned off. Replaced by someone else: nothing else to undo.
    """
    restored = 0
    with _lock:
        for entry in _applied:
            entry.enabled = False
            cls = entry.cls_ref()
            if cls is None:
                continue
            current = cls.__dict__.get(entry.hotfix.method_name)
            if current is entry.wrapper:
                setattr(cls, entry.hotfix.method_name, entry.original)
                restored += 1
            elif _ours_in_chain(current, entry.hotfix) is not None:
                restored += 1
                say(
                    logging.WARNING,
                    "%s: another wrapper sits on top of the hotfix's; the hotfix is turned off "
                    "in place and calls go straight to SGLang's method",
                    entry.hotfix.target,
                )
            else:
                say(
                    logging.WARNING,
                    "not restoring %s: it was replaced after the hotfix wrapped it (the hotfix "
                    "is no longer called there, and is turned off should it come back)",
                    entry.hotfix.target,
                )
        _applied.clear()  # what stays reachable is found again through the class by wrap()
    if restored:
        say(logging.INFO, "removed: %d method(s) restored to SGLang's original", restored, once_key="removed")
    return restored


def is_patched(hotfix, cls):
    """True when this hotfix's wrapper is in force on the class's method: ours,
    on or under another wrapper that calls it, and not turned off."""
    with _lock:
        ours = _ours_in_chain(cls.__dict__.get(hotfix.method_name), hotfix)
        return ours is not None and ours._self_enabled.enabled
