"""Patch: wrap a hotfix's target method on its class with wrapt, and revert; records whose repair is
upstream's code (``Hotfix.edits``) are handed to ``code_edit``, so this module answers "put it in
force", "is it in force" and "take it all back" for both mechanisms.

Imported only when something is to be wrapped (after ``engine.decide`` saw
that wrapt imports), so wrapt is imported here at module level. Never imports
torch or SGLang. ``wrap`` raises ``NotWrappable`` when the hotfix must stand
aside; the caller decides whether that stops the process.

Wrappers are for set-up-time methods only (pr26521's capture, pr25103's ``__init__``): a method
SGLang calls per step runs upstream's code instead (``code_edit``), and no method gets both.

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
one ``Applied`` per wrapped method; ``is_patched``, ``remove_all`` and the engine's report all
read it.
"""

import functools
import logging
import os
import threading
import types
import weakref

import wrapt

from . import code_edit
from .logs import say

_lock = threading.RLock()
# Every method this package wrapped in this process, in order.
_applied = []


class NotWrappable(code_edit.NotEditable):
    """The class attribute is not the function the analysis read: the hotfix stands aside."""


class Applied:
    """One record's part in one wrapped method: the class (weakly), the record, the method's
    name, the original function object, our wrapper, and the ``Joined`` set of the records that
    share that wrapper. ``enabled``: False once ``remove()`` turned the record off."""

    __slots__ = ("cls_ref", "hotfix", "method_name", "original", "wrapper", "joined", "_enabled", "__weakref__")

    def __init__(self, cls, hotfix, method_name, original, joined):
        self.cls_ref = weakref.ref(cls)
        self.hotfix = hotfix
        self.method_name = method_name
        self.original = original
        self.wrapper = None
        self.joined = joined
        self._enabled = True
        joined.add(self)

    @property
    def enabled(self):
        return self._enabled

    @enabled.setter
    def enabled(self, value):
        self._enabled = value
        self.joined.refresh()


class Joined:
    """The record whose part a wrapper is. Calling it answers wrapt's ``enabled`` question (the
    record on); ``active`` holds its name while it is on, ``hotfixes`` its ``Hotfix`` by name."""

    __slots__ = ("entries", "active", "hotfixes", "derived", "__weakref__")

    def __init__(self):
        self.entries, self.active, self.hotfixes, self.derived = [], (), {}, None

    def add(self, entry):
        self.entries.append(entry)
        self.refresh()

    def refresh(self):
        on = [entry.hotfix for entry in self.entries if entry._enabled]
        self.hotfixes = {hotfix.name: hotfix for hotfix in on}
        self.active = tuple(self.hotfixes)

    def entry_of(self, hotfix):
        return next((entry for entry in self.entries if entry.hotfix.name == hotfix.name), None)

    def __call__(self):
        return bool(self.active)


# wrapt forwards ``__class__`` and ``__code__`` to the wrapped function, so TorchDynamo takes a
# wrapper for SGLang's own function and inlines SGLang's code, skipping the wrapper: compiled code
# (SGLang's ``--enable-torch-compile`` traces RadixAttention -> forward_decode) would run
# unrepaired. TorchDynamo reads this attribute statically (``inspect.getattr_static``) before it
# inlines a function, and calls what carries it instead of tracing it (a graph break), as it does
# for ``torch.compiler.disable``: the wrapper then runs, eagerly, bound as Python binds it.
_TRACERS_CALL_IT = {
    "_torchdynamo_disable": True,
    "_torchdynamo_disable_msg": "sglang-hotfix-trtllm's wrapper of an SGLang method (the repair runs eagerly)",
}


class BoundHotfixWrapper(wrapt.BoundFunctionWrapper):
    """A ``HotfixWrapper`` bound to an instance (``backend.forward_decode``)."""

    locals().update(_TRACERS_CALL_IT)


class HotfixWrapper(wrapt.FunctionWrapper):
    """Marks a method wrapped by this package, so applying twice is a no-op; compiled code calls
    it rather than inlining what it wraps (``_TRACERS_CALL_IT``)."""

    __bound_function_wrapper__ = BoundHotfixWrapper
    locals().update(_TRACERS_CALL_IT)


def _is_ours(attribute, hotfix, method_name):
    try:
        return (
            isinstance(attribute, HotfixWrapper)
            and attribute._self_method_name == method_name
            and attribute._self_joined.entry_of(hotfix) is not None
        )
    except Exception:
        return False


_chain = code_edit.wrapper_chain  # one answer, for both mechanisms, to "what does a call of it reach"


def _ours_in_chain(attribute, hotfix, method_name, test=None):
    """Our wrapper of ``method_name`` when it is the attribute or sits below another
    wrapper (a wrapper made around ours as seen through the class holds wrapt's
    bound wrapper, whose ``_self_parent`` is ours); else None."""
    test = test or _is_ours
    for layer in _chain(attribute):
        for candidate in (layer, getattr(layer, "_self_parent", None)):
            if test(candidate, hotfix, method_name):
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


def _first_line(assessment, hotfix, method_name):
    line = assessment.method_first_line
    if isinstance(line, dict):
        return line.get(method_name)
    return line if method_name == hotfix.method_name else None


def _check_wrappable(hotfix, method_name, current, assessment):
    """None when the class attribute is the function the analysis read, else why not."""
    target = "%s.%s.%s" % (hotfix.module, hotfix.class_name, method_name)
    if type(current) is not types.FunctionType or hasattr(current, "__wrapped__"):  # type(): proxies pass isinstance
        return (
            "%s is already wrapped or replaced by someone else (%s): the hotfix's repair is proven only directly "
            "around SGLang's own method, so it stands aside. The .pth file, SGLang's plugin loader and `run` "
            "apply the hotfix when the backend is imported, before other patchers" % (target, _describe(current))
        )
    code = current.__code__
    if code.co_name != method_name:
        return "%s holds function %r from %s (replaced by someone else?)" % (target, code.co_name, code.co_filename)
    if assessment.source_path and os.path.basename(code.co_filename) != os.path.basename(assessment.source_path):
        return "%s was compiled from %s, not from the analysed %s" % (target, code.co_filename, assessment.source_path)
    first_line = _first_line(assessment, hotfix, method_name)
    if first_line is not None and code.co_firstlineno != first_line:
        return "%s starts at line %d in the running code but at line %d on disk (file changed since import?)" % (
            target,
            code.co_firstlineno,
            first_line,
        )
    return None


defining_class = code_edit.defining_class  # one answer for both mechanisms


def wrap(hotfix, module, assessment):
    """Wrap the record's methods on their class (all or none). Returns "wrapped" or "already".

    The record's wrapper gets ``module`` (the module it was applied to) as its
    first argument: the names of the target module it needs come from there,
    never from the globals of whatever function it wraps.
    Raises ``NotWrappable`` when the hotfix must stand aside. A record whose repair is an edit
    (``Hotfix.edits``) is put in force by ``code_edit`` instead: one mechanism per record.
    """
    if hotfix.mechanism == "edit":
        try:
            return code_edit.put_record_in_force(hotfix, module, assessment)
        except NotWrappable:
            raise
        except code_edit.NotEditable as problem:
            raise NotWrappable(str(problem)) from None
    with _lock:
        cls = defining_class(module, hotfix.class_name)
        if cls is None:
            raise NotWrappable(
                "%s.%s is %r, which does not derive from the class the module's source defines"
                % (hotfix.module, hotfix.class_name, vars(module).get(hotfix.class_name))
            )
        missing = [name for name in hotfix.method_names if name not in cls.__dict__]
        if missing:
            raise NotWrappable("%s.%s does not define %s" % (hotfix.module, hotfix.class_name, ", ".join(missing)))
        found = [(name, cls.__dict__[name]) for name in hotfix.method_names]
        ours = [_ours_in_chain(current, hotfix, name) for name, current in found]
        # All or none: each method holds ours already (on, or turned off in place by remove()) or
        # SGLang's own function; anything else on one of them and the record stands aside for all.
        for (name, current), wrapper in zip(found, ours):
            problem = _check_wrappable(hotfix, name, current, assessment) if wrapper is None else None
            if problem:
                raise NotWrappable(problem)
        if all(wrapper is None for wrapper in ours):
            code_edit.refuse_when_built_before(hotfix, cls, _built_under.get(hotfix.name, ()))  # NotWrappable's base
        resumed = _resume(hotfix, [wrapper for wrapper in ours if wrapper is not None])
        fresh = False
        for (name, current), wrapper in zip(found, ours):
            if wrapper is not None:
                continue
            joined = Joined()
            entry = Applied(cls, hotfix, name, current, joined)
            call = functools.partial(hotfix.wrapper, module)
            if name == "__init__":
                call = functools.partial(
                    _noting_construction, call, _built_under.setdefault(hotfix.name, weakref.WeakSet())
                )
            wrapper = HotfixWrapper(current, call, enabled=joined)
            wrapper._self_joined = joined
            wrapper._self_method_name = name
            entry.wrapper = wrapper
            setattr(cls, name, wrapper)
            _applied.append(entry)
            fresh = True
        return "wrapped" if fresh or resumed else "already"


# Record name -> the objects its wrapper of ``__init__`` built: they were made as upstream makes
# them, so a later apply() (after remove()) need not stand aside for them
# (``code_edit.refuse_when_built_before``).
_built_under = {}


def _noting_construction(call, built, wrapped, instance, args, kwargs):
    outcome = call(wrapped, instance, args, kwargs)
    try:
        built.add(instance)
    except TypeError:  # an object that cannot be weakly referenced is never counted as repaired
        pass
    return outcome


def _resume(hotfix, ours):
    """Every method already holds our wrapper. True when some were off (apply() after a
    remove() that turned them off in place, or after someone put ours back: a
    mock.patch.object undone): now in force again, and recorded again."""
    entries = [wrapper._self_joined.entry_of(hotfix) for wrapper in ours]  # this record's parts
    if all(entry.enabled and entry in _applied for entry in entries):
        return False
    for entry in entries:
        entry.enabled = True
        if entry not in _applied:
            _applied.append(entry)
    return True


def remove_all():
    """Undo every wrap; returns how many methods were restored or turned off.

    Every wrapper of ours is turned off (wrapt's ``enabled``), so that one
    still referenced somewhere (a copy another patcher took, or ours put back
    later by someone who had replaced it, as ``mock.patch.object`` does) calls
    SGLang's method straight through. Ours on top: the original function
    object goes back. Ours under another wrapper: it stays in that chain,
    turned off. Replaced by someone else: nothing else to undo.
    """
    edited = code_edit.remove_all()
    restored = set()  # (class, method): a method several records share counts once
    in_place = set()  # the same, for methods turned off under another wrapper (not put back)
    with _lock:
        for entry in _applied:
            entry.enabled = False
            cls = entry.cls_ref()
            if cls is None:
                continue
            target = "%s.%s.%s" % (entry.hotfix.module, entry.hotfix.class_name, entry.method_name)
            current = cls.__dict__.get(entry.method_name)
            if current is entry.wrapper:
                if not entry.joined.active:  # the last record on this wrapper puts SGLang's method back
                    setattr(cls, entry.method_name, entry.original)
                restored.add((cls, entry.method_name))
            elif (cls, entry.method_name) in restored and current is entry.original:
                pass  # put back already, by another record of the same wrapper
            elif _ours_in_chain(current, entry.hotfix, entry.method_name) is not None:
                if (cls, entry.method_name) in in_place:
                    continue
                in_place.add((cls, entry.method_name))
                say(
                    logging.WARNING,
                    "%s: another wrapper sits on top of the hotfix's; the hotfix is turned off "
                    "in place and calls go straight to SGLang's method",
                    target,
                )
            else:
                say(
                    logging.WARNING,
                    "not restoring %s: it was replaced after the hotfix wrapped it (the hotfix "
                    "is no longer called there, and is turned off should it come back)",
                    target,
                )
        _applied.clear()  # what stays reachable is found again through the class by wrap()
    if restored or in_place:
        # Says which is which: a method under another wrapper is not SGLang's original again.
        say(
            logging.INFO,
            "removed: %d method(s) restored to SGLang's original%s",
            len(restored),
            ", %d turned off in place under another wrapper" % len(in_place) if in_place else "",
            once_key="removed",
        )
    return edited + len(restored) + len(in_place)


def is_patched(hotfix, cls):
    """True when this hotfix is in force on every method it patches: for a wrapper, ours (on, or
    under another wrapper that calls it, and not turned off); for an edit, the code ``code_edit``
    compiled with it (``code_edit.record_in_force``)."""
    if hotfix.mechanism == "edit":
        return code_edit.record_in_force(hotfix, cls)
    with _lock:
        for name in hotfix.method_names:
            ours = _ours_in_chain(cls.__dict__.get(name), hotfix, name)
            if ours is None or not ours._self_joined.entry_of(hotfix).enabled:
                return False
        return True
