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
one ``Applied`` per wrapped method and one ``Gate`` per replaced module global
(``Hotfix.gates``); ``is_patched``, ``remove_all`` and the engine's report all
read it. A record that wraps several methods (``Hotfix.also``) wraps all of
them or none.
"""

import copy
import functools
import logging
import os
import sys
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
    """The records whose parts share one wrapper: one record alone, or the records of one
    ``Hotfix.site`` on one method (pr28144, pr31667 and pr17732 on ``forward_decode``). Calling it answers
    wrapt's ``enabled`` question (any record on); ``active`` holds the names of the records on, in
    the order they were applied (livepatch's stack: the engine applies in the catalog's order, so
    this module needs to know no record), and ``hotfixes`` each one's ``Hotfix`` by name (what a
    site's wrapper hands back to ``arm_gates``). ``derived``: what the wrapper derives from
    ``hotfixes`` and keeps for its calls (its own; this module only makes room for it): a
    ``refresh`` makes a new ``hotfixes``, so the wrapper can tell a stale one by identity."""

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


class Gate:
    """One module global replaced by a gate (``Hotfix.gates``): the module (weakly), the record
    that armed it, the name, what it held, the gate put there and the function that made it (the
    gate's identity: records of one site name the same ``make_gate`` and share one gate)."""

    __slots__ = ("module_ref", "hotfix", "name", "original", "gate", "make_gate")

    def __init__(self, module, hotfix, name, original, gate, make_gate):
        self.module_ref = weakref.ref(module)
        self.hotfix, self.name, self.original, self.gate, self.make_gate = hotfix, name, original, gate, make_gate


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


def _is_site_wrapper(attribute, hotfix, method_name):
    """Our wrapper of ``method_name`` made for another record of ``hotfix``'s site: joined, never
    refused (a record of the same site is not "someone else")."""
    try:
        return (
            hotfix.site is not None
            and isinstance(attribute, HotfixWrapper)
            and attribute._self_method_name == method_name
            and attribute._self_site == hotfix.site
        )
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


class GateProxy(wrapt.ObjectProxy):
    """Base class of the objects ``Hotfix.gates`` put in a module's globals: a gate is
    recognised as one (by its type: a proxy of someone else's around it is not one), a new
    gate is put around what the old one gated, never around a gate, and ``remove()`` turns
    it off (``_self_hotfix_on``) wherever it still sits.

    It passes for what it gates, as wrapt's proxies do: ``isinstance`` and
    ``inspect.ismodule`` (``__class__``), ``dir()``, ``__doc__``, ``__name__``, ``__spec__``,
    ``__dict__``, attribute writes and deletions (they go to the gated object: a
    ``mock.patch`` through the gate patches the module itself, as without the hotfix). Copying
    and pickling do what they do to the gated object (a module: TypeError)."""

    def __init__(self, gated):
        super().__init__(gated)
        self._self_hotfix_on = True

    def __copy__(self):
        return copy.copy(self.__wrapped__)

    def __deepcopy__(self, memo):
        return copy.deepcopy(self.__wrapped__, memo)

    def __reduce__(self):
        return self.__wrapped__.__reduce__()

    def __reduce_ex__(self, protocol):
        return self.__wrapped__.__reduce_ex__(protocol)


def _is_gate(value):
    return issubclass(type(value), GateProxy)


def _holds(value, gate):
    """Whether ``value`` is ``gate`` or wraps it (a proxy's ``__wrapped__`` chain)."""
    for _ in range(16):
        if value is gate:
            return True
        try:
            value = getattr(value, "__wrapped__", None)
        except Exception:
            return False
        if value is None:
            return False
    return False


def defining_class(module, class_name):
    """The class the module's source defines as ``class_name``, found from what the module binds
    under that name now: that class itself, or, where a subclass was put in its place (SGLang's
    HookRegistry REPLACE, a plugin), the first class of the subclass's MRO that the module defines
    under that name. The records wrap that class's methods, which the subclass inherits. None when
    the name is bound to nothing deriving from it."""
    bound = vars(module).get(class_name)
    for candidate in getattr(bound, "__mro__", ()) if isinstance(bound, type) else ():
        if candidate.__dict__.get("__module__") == module.__name__ and candidate.__qualname__ == class_name:
            return candidate
    return None


def wrap(hotfix, module, assessment):
    """Wrap the record's methods on their class (all or none) and put its gates
    in the module. Returns "wrapped" or "already".

    The record's wrapper gets ``module`` (the module it was applied to) as its
    first argument: the names of the target module it needs come from there,
    never from the globals of whatever function it wraps.
    Raises ``NotWrappable`` when the hotfix must stand aside.
    """
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
        shared = [_ours_in_chain(current, hotfix, name, _is_site_wrapper) for name, current in found]
        # All or none: each method holds ours already (on, or turned off in place by remove()), a
        # wrapper of this record's site (joined), or SGLang's own function; anything else on one of
        # them and the record stands aside for all.
        for (name, current), wrapper, site_wrapper in zip(found, ours, shared):
            problem = None
            if wrapper is None:
                # Joining checks the function under the site's wrapper as wrapping checks SGLang's own:
                # compiled from the analysed file, at the analysed line.
                below = site_wrapper.__wrapped__ if site_wrapper is not None else current
                problem = _check_wrappable(hotfix, name, below, assessment)
            if problem:
                raise NotWrappable(problem)
        resumed = _resume(hotfix, [wrapper for wrapper in ours if wrapper is not None])
        fresh = False
        for (name, current), wrapper, site_wrapper in zip(found, ours, shared):
            if wrapper is not None:
                continue
            if site_wrapper is not None:  # another record of the site wraps it: one wrapper, joined
                entry = Applied(cls, hotfix, name, site_wrapper.__wrapped__, site_wrapper._self_joined)
                entry.wrapper = site_wrapper
                _applied.append(entry)
                fresh = True
                continue
            joined = Joined()
            entry = Applied(cls, hotfix, name, current, joined)
            # A site's wrapper is told which of its records are on (``joined.hotfixes``).
            bound = (module, joined) if hotfix.site is not None else (module,)
            # wrapt asks ``enabled`` at each call; a site's wrapper reads ``joined.hotfixes`` itself (none
            # on: SGLang's method alone), so it is spared that call (every decode layer makes one).
            enabled = joined if hotfix.site is None else None
            wrapper = HotfixWrapper(current, functools.partial(hotfix.wrapper, *bound), enabled=enabled)
            wrapper._self_joined = joined
            wrapper._self_site = hotfix.site
            wrapper._self_method_name = name
            entry.wrapper = wrapper
            setattr(cls, name, wrapper)
            _applied.append(entry)
            fresh = True
        if (fresh or resumed) and hotfix.on_wrap is not None:
            try:
                hotfix.on_wrap(module)
            except Exception:  # the record is in force; what on_wrap could not do stays as before
                pass
        return "wrapped" if fresh or resumed else "already"


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


def _gate_in_force(hotfix, module, name):
    """Our gate for ``name`` (the one this record's ``make_gate`` makes: shared by the records of
    one site) is recorded and reached through the module's global (itself, or under someone's
    proxy that forwards to it)."""
    value = vars(module).get(name)
    make_gate = dict(hotfix.gates).get(name)
    return any(
        isinstance(e, Gate)
        and e.make_gate is make_gate
        and e.name == name
        and e.module_ref() is module
        and _holds(value, e.gate)
        for e in _applied
    )


def arm_gates(hotfix, module, names=None):
    """Put the record's gates that are not in force into the module (those of ``names``, or all),
    at the first call that needs them (a record's wrapper asks): a process whose calls never need
    a repair never gets a gate. True when those gates are in force afterwards. False, with nothing put, when
    the record's wrappers on the module's class are no longer in force (``remove()`` ran
    meanwhile) or the module lacks a global it gates (SGLang binds ``flashinfer`` only where
    it imports it: the module's own code cannot reach it either)."""
    with _lock:
        cls = defining_class(module, hotfix.class_name)
        if not any(
            isinstance(e, Applied) and e.hotfix is hotfix and e.enabled and e.cls_ref() is cls for e in _applied
        ):
            return False
        gates = [(name, make_gate) for name, make_gate in hotfix.gates if names is None or name in names]
        if any(name not in vars(module) for name, _ in gates):
            return False
        _install_gates(hotfix, module, gates)
        return True


def _install_gates(hotfix, module, gates):
    """Put these gates of the record that are not in force into the module."""
    for name, make_gate in gates:
        if name not in vars(module) or _gate_in_force(hotfix, module, name):
            continue
        original = vars(module)[name]
        if _is_gate(original):  # one of ours, put back by someone after remove()
            original = original.__wrapped__
        gate = make_gate(module, original)
        setattr(module, name, gate)
        _applied.append(Gate(module, hotfix, name, original, gate, make_gate))


def remove_all():
    """Undo every wrap; returns how many methods were restored or turned off.

    Every wrapper of ours is turned off (wrapt's ``enabled``), so that one
    still referenced somewhere (a copy another patcher took, or ours put back
    later by someone who had replaced it, as ``mock.patch.object`` does) calls
    SGLang's method straight through. Ours on top: the original function
    object goes back. Ours under another wrapper: it stays in that chain,
    turned off. Replaced by someone else: nothing else to undo.
    """
    restored = set()  # (class, method): a method several records share counts once
    in_place = set()  # the same, for methods turned off under another wrapper (not put back)
    with _lock:
        for entry in _applied:
            if isinstance(entry, Gate):
                _remove_gate(entry)
                continue
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
    return len(restored) + len(in_place)


def _remove_gate(entry):
    """Put the module's global back, when it still holds our gate. A gate left in
    place is harmless: with its record's wrappers off it only passes calls through."""
    entry.gate._self_hotfix_on = False  # wherever it still sits, it only passes calls through
    module = entry.module_ref()
    current = vars(module).get(entry.name) if module is not None else None
    if module is not None and current is entry.gate:
        setattr(module, entry.name, entry.original)
    elif current is entry.original or _is_gate(current):
        # Nothing of this gate's to undo: the original is back (``importlib.reload`` re-ran the
        # module's import), or a later gate of ours sits there (put back by its own entry).
        if _is_gate(current):
            current._self_hotfix_on = False
            setattr(module, entry.name, current.__wrapped__)
    elif module is not None:
        say(
            logging.WARNING,
            "not restoring %s.%s: it was replaced after the hotfix put its gate there",
            entry.hotfix.module,
            entry.name,
        )


def is_patched(hotfix, cls):
    """True when this hotfix's wrappers are in force on every method it wraps (ours,
    on or under another wrapper that calls it, and not turned off) and its gates, once
    armed (``arm_gates``), are still in the module's globals."""
    with _lock:
        for name in hotfix.method_names:
            ours = _ours_in_chain(cls.__dict__.get(name), hotfix, name)
            if ours is None or not ours._self_joined.entry_of(hotfix).enabled:
                return False
        if not hotfix.gates:
            return True
        module = _module_of(hotfix, cls)
        if module is None:  # no gate was ever put: the module had none of the globals it gates
            return True
        makers = {make_gate for _, make_gate in hotfix.gates}
        armed = {e.name for e in _applied if isinstance(e, Gate) and e.make_gate in makers and e.module_ref() is module}
        return all(name not in armed or _gate_in_force(hotfix, module, name) for name, _ in hotfix.gates)


def _module_of(hotfix, cls):
    """The module whose class ``cls`` is: the one a gate of this record went into, else the
    one registered under the class's module name (when it holds this class)."""
    makers = {make_gate for _, make_gate in hotfix.gates}
    candidates = [e.module_ref() for e in _applied if isinstance(e, Gate) and e.make_gate in makers]
    candidates.append(sys.modules.get(cls.__module__))
    for module in candidates:
        if module is not None and defining_class(module, hotfix.class_name) is cls:
            return module
    return None
