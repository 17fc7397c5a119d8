"""Patch: wrap a hotfix's target method on its class with wrapt, and revert.

Imported only when something is to be wrapped (after ``engine.decide`` saw
that wrapt imports), so wrapt is imported here at module level. Every
original this package replaced sits in ``_patched`` (as gevent keeps its
``saved`` dict): ``is_patched`` asks it and ``remove_all`` reads it. Never
imports torch or SGLang. ``wrap`` raises on failure; the caller decides
whether that stops the process.
"""

import logging
import os
import threading
import types
import weakref

import wrapt

from .logs import say

_lock = threading.RLock()
# (weak ref to the patched class, hotfix, original function object)
_patched = []


class HotfixWrapper(wrapt.FunctionWrapper):
    """Marks a method wrapped by this package, so applying twice is a no-op."""


def _is_ours(attribute, hotfix):
    return isinstance(attribute, HotfixWrapper) and attribute._self_hotfix_name == hotfix.name


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
    with _lock:
        cls = getattr(module, hotfix.class_name)
        current = cls.__dict__[hotfix.method_name]
        if _ours_in_chain(current, hotfix):
            return "already"
        problem = _check_wrappable(hotfix, current, assessment)
        if problem:
            raise RuntimeError(problem)
        wrapper = HotfixWrapper(current, hotfix.wrapper)
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
