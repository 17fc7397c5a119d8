"""Startup of sglang-hotfix-trtllm: the finder the ``.pth`` line arms, and what it loads.

``sglang_hotfix_trtllm.pth`` runs in *every* Python process of the environment,
so it imports nothing and compiles almost nothing: its one line (``startup_line``
below writes it) evaluates a one-expression finder, a lambda that answers None
for every module name but the watched ones, and puts it at the front of
``sys.meta_path``. Importing even a tiny module there would cost 1.3x in every
process wherever no bytecode exists (uv's default, ``pip --no-compile``,
read-only images), because compiling source imports the tokenizer and the AST
types; and a ``def`` or ``try`` costs more to compile than the lambda (README,
Costs). Only when a watched module is looked up does the lambda compile its
second string: load this module, guarded, and ask ``find_spec`` here. A missing
or broken copy of this module then costs one line on stderr and the import goes
on unpatched.

This module is also imported by the SGLang plugin entry point, ``run``'s
bootstrap and ``sglang_hotfix_trtllm.apply()``, which call ``install``.
Constraints, kept because it runs inside SGLang's imports:

* Standard library only, and only ``sys`` at module level. ``os`` is imported
  inside ``switch_on`` (already loaded at start-up, so free).
* Small: the import hook's real work lives in ``sglang_hotfix_trtllm.import_hook``.
* Never raises into the host (strict mode aside, see ``find_spec``) and never
  writes to stdout; at most one line on stderr, and only when stderr can take
  it (``_say``: stderr may be None, closed or a broken pipe).
* Idempotent, across copies: the ``.pth`` may be read twice (a venv whose
  ``lib64`` links to ``lib``), the plugin entry point calls ``install`` again,
  and this module may be reloaded or imported from a second install. Every
  copy of the finder (the ``.pth`` lambda, ``find_spec`` below) carries the
  attribute ``FINDER_MARK``; ``install`` arms one only when no marked finder is
  armed yet, and the import hook skips all marked finders when it asks the
  others for the real spec.
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
    write_stderr("sglang-hotfix-trtllm: %s\n" % message)


def write_stderr(text):
    """Write ``text`` to stderr when it can take it; never raises, and never
    changes the process's exit status. The text goes to stderr's file
    descriptor with ``os.write``, not through ``sys.stderr``'s buffer: text left
    in that buffer by a write that failed (a pipe whose reader is gone) would
    fail again when Python flushes it at shutdown, and Python would exit 120.
    A stream without a descriptor (a test's capture) is written as usual."""
    try:
        stream = sys.stderr
        if stream is None:
            return
        try:
            descriptor = stream.fileno()
        except Exception:  # no descriptor behind it: a buffer in memory cannot break a pipe
            stream.write(text)
            stream.flush()
            return
        from os import write

        try:
            stream.flush()  # what the host wrote before goes first
        except Exception:
            pass  # the host's own unwritable text: its fate is the host's, as without us
        data = text.encode(getattr(stream, "encoding", None) or "utf-8", "backslashreplace")
        while data:
            data = data[write(descriptor, data) :]
    except Exception:
        pass


def _load_import_hook(subject):
    """``sglang_hotfix_trtllm.import_hook``, or None after one line on stderr
    (an ImportError instead, in strict mode) when the package cannot load."""
    try:
        from sglang_hotfix_trtllm import import_hook
    except Exception as error:
        message = (
            "cannot load the hotfix (%s: %s); %s is imported unpatched. Reinstall sglang-hotfix-trtllm, or set %s=1."
            % (type(error).__name__, error, subject, DISABLE_VARIABLE)
        )
        if switch_on(STRICT_VARIABLE):
            raise ImportError("sglang-hotfix-trtllm (strict mode): " + message) from error
        _say(message)
        return None
    return import_hook


def exec_watched(loader, module):
    """Run a watched module's code with its own ``loader``, then hand the module to the engine.

    The finder's loader calls this from its ``exec_module``, where importlib holds the module's own
    lock and not its global one, so the hook and the engine are imported here as any import is
    (issue 49: a finder that imports inside a lookup, where importlib holds the global lock, has to
    let go of a lock it did not take). The hook is loaded *before* SGLang's code runs, so that strict
    mode's ImportError stops the import before anything of the backend executed; a hook that cannot
    load costs one line and the module runs unpatched. With the disable switch on, or when this
    thread is already executing the module through a copy of our loader (another finder that asked
    for the spec and wrapped ours), it only runs the module's code: one hand-over per import."""
    name = module.__name__
    from _thread import get_ident

    key = (get_ident(), name)
    if key in _EXECUTING or switch_on(DISABLE_VARIABLE):
        loader.exec_module(module)
        return
    _EXECUTING.add(key)
    try:
        hook = _load_import_hook(name)
        loader.exec_module(module)
    finally:
        _EXECUTING.discard(key)
    _AfterImport.pending.discard(name)  # apply() ran while it executed: handed over here, once
    if hook is not None:
        hook.module_executed(module, name)


_EXECUTING = set()  # (thread, module name) while exec_watched runs that module's code


# What the finder runs when a watched module is looked up, with its arguments as ``a``, in a
# dictionary made for that lookup alone: nothing passes between two lookups, so two threads looking
# the backend up at once each get their own spec (issue 49: one dictionary shared by every lookup
# lost one thread's spec to another's, and the backend ran unpatched). It imports nothing that is
# not loaded (``sys`` and ``os`` are, at every start), takes no lock and lets none go: it asks the
# other finders for the real spec, as wrapt's finder does (every copy of this finder is skipped),
# and gives it a loader whose ``exec_module``, run under the module's own lock, puts SGLang's loader
# back on the module, loads this module and calls ``exec_watched``; anything else is asked of
# SGLang's loader. A startup module that cannot load costs one line, written to descriptor 2 for the
# reason ``write_stderr`` gives, and the module runs unpatched. Compiled only at a watched lookup;
# read at every start (the .pth line holds it), so it stays short (docs/costs.md).
_LOOKUP = (
    "import sys,os\n"
    "n,p,t=a\n"
    "spec=None\n"
    "for f in list(sys.meta_path):\n"
    " if getattr(f,%(mark)r,0)is not True and hasattr(f,'find_spec'):\n"
    "  spec=f.find_spec(n,p,t)\n"
    "  if spec:break\n"
    "l=spec and spec.loader\n"
    "if hasattr(l,'exec_module'):\n"
    " class HotfixLoader:\n"
    "  __getattr__=lambda s,k:getattr(l,k)\n"
    "  def exec_module(s,m):\n"
    "   m.__loader__=m.__spec__.loader=l\n"
    "   try:from sglang_hotfix_trtllm_autoload import exec_watched as x\n"
    "   except Exception as e:\n"
    "    x=lambda l,m:l.exec_module(m)\n"
    "    try:os.write(2,b'sglang-hotfix-trtllm: startup module failed (%%a); %%s runs unpatched%%c'"
    "%%(e,n.encode(),10))\n"
    "    except Exception:pass\n"
    "   x(l,m)\n"
    " spec.loader=HotfixLoader()"
) % {"mark": FINDER_MARK}


# The .pth holds ``_LOOKUP`` in a comment line that starts with this: site skips comment lines, so
# it costs a line read at start where the line's own text is compiled (twice in a venv) and its
# every character counts (docs/costs.md). At a watched lookup, ``_FROM_THE_PTH`` finds the .pth on
# sys.path and runs that line. ``_LOOKUP`` holds no backslash, so its newlines are written as "\n".
LOOKUP_LINE = "#lookup of sglang-hotfix-trtllm's finder (sglang_hotfix_trtllm_autoload.py, _LOOKUP): "
_FROM_THE_PTH = (
    "import sys,os\n"
    "g=''\n"
    "for d in sys.path:\n"
    " try:g=[l for l in open(d+'/sglang_hotfix_trtllm.pth')if l[:8]=='#lookup '][0];break\n"
    " except Exception:pass\n"
    "spec=None\n"
    "if g:exec(g[g.index(': ')+2:].replace(chr(92)+'n',chr(10)))\n"
    "else:\n"
    " try:os.write(2,b'sglang-hotfix-trtllm: its .pth has no lookup; %s runs unpatched%c'%(a[0].encode(),10))\n"
    " except Exception:pass"
)


def _finder_text():
    """The finder, one lambda: None for every module name but the watched ones; for those, the spec
    the lookup ``G`` leaves, from a dictionary made for this lookup alone.
    It carries the finder protocol's parameter names and defaults, so that a caller passing them by
    keyword is served."""
    watched = " and ".join("fullname!=%r" % name for name in sorted(WATCHED_MODULES))
    return (
        "lambda fullname,path=None,target=None:None if %s else "
        "exec(G,d:={'a':(fullname,path,target)})or d['spec']" % watched
    )


# This module's copy of the finder, which ``install`` arms where the .pth line did not (``python
# -S``, a plugin entry point, ``apply()``): the same finder, with the lookup at hand.
find_spec = eval(_finder_text(), {"G": _LOOKUP})
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

    A watched module already imported (before any finder was armed, or while
    the switch was on) is handed to the engine now; the engine wraps a class
    at most once and says each line once, so calling this again is harmless.
    A watched module still executing (``install`` called from a module it
    imports) is not judged half-made: it is handed over once its import has
    completed (``_AfterImport``).
    """
    if switch_on(DISABLE_VARIABLE):
        return False
    if not is_installed():
        sys.meta_path.insert(0, find_spec)
    for name in WATCHED_MODULES:
        module = sys.modules.get(name)
        if module is None:
            continue
        if _initializing(module):
            _AfterImport.watch(module)
            continue
        hook = _load_import_hook(name)
        if hook is not None:
            hook.module_executed(module, name)
    return True


def _initializing(module):
    """True while the import system is still executing ``module``'s code."""
    try:
        return getattr(getattr(module, "__spec__", None), "_initializing", False) is True
    except Exception:
        return False


class _AfterImport:
    """Hands a watched module that ``install`` found half-executed to the engine once its import
    has completed: at the moment importlib marks its spec no longer initialising (the ``finally``
    of ``_load_unlocked``, where importlib holds the module's own lock and not its global one, so
    the engine imports as any import does). For that moment the spec's class is a subclass of its
    own whose ``_initializing`` is a property; the setter puts the class back before anything else.
    If the import fails (the module is no longer in ``sys.modules``) it is forgotten. When the
    finder's own loader ran the module, ``exec_watched`` hands it over and takes it off ``pending``
    first, so a module is handed over once. It never edits ``sys.meta_path``: the import system may
    be iterating that list."""

    pending = set()

    @classmethod
    def watch(cls, module):
        spec = module.__spec__
        cls.pending.add(module.__name__)
        original = type(spec)
        if getattr(original, "_sglang_hotfix_trtllm_after_import", False):
            return
        try:
            spec.__class__ = type(
                original.__name__,
                (original,),
                {"_initializing": _Completion(original), "_sglang_hotfix_trtllm_after_import": True},
            )
        except Exception as error:  # a spec whose class cannot be changed: said, and left to the next install()
            cls.pending.discard(module.__name__)
            _say(
                "%s is still being imported and cannot be patched now (%s); it runs unpatched."
                % (module.__name__, error)
            )


class _Completion:
    """The ``_initializing`` of a watched spec while ``_AfterImport`` waits for its import to end."""

    def __init__(self, original):
        self.original = original

    def __get__(self, spec, owner=None):
        if spec is None:
            return self
        return spec.__dict__.get("_initializing", False)

    def __set__(self, spec, value):
        spec.__dict__["_initializing"] = value
        if value:
            return
        spec.__class__ = self.original
        name = spec.name
        module = sys.modules.get(name)
        if name not in _AfterImport.pending:
            return
        _AfterImport.pending.discard(name)
        if module is not None and getattr(module, "__spec__", None) is spec:
            hook = _load_import_hook(name)
            if hook is not None:
                hook.module_executed(module, name)


def uninstall():
    """Disarm the hook (every copy of it): later imports of watched modules are not patched."""
    _AfterImport.pending.clear()
    sys.meta_path[:] = [finder for finder in sys.meta_path if not is_finder(finder)]


def is_installed():
    return any(is_finder(finder) for finder in sys.meta_path)


def startup_line():
    """The line of ``sglang_hotfix_trtllm.pth`` (a test holds the shipped file to it).

    Unless a marked finder is armed already (site reads this file twice in a
    venv), the finder (``_finder_text``), evaluated with globals of its own that
    hold ``_LOOKUP`` as ``G`` (globals holding site's namespace would keep it
    alive to the end, which costs more than the eval), gets ``find_spec`` and
    ``FINDER_MARK`` as attributes and goes first on ``sys.meta_path``. site runs
    the line with ``exec`` in its ``addpackage``, whose locals it only sees as a
    snapshot: the names the line binds (``sys``, ``_f``) go nowhere else.

    Every token here is compiled at every start, twice in a venv
    (docs/costs.md): the "already armed?" test is a list comprehension (inlined
    from Python 3.12 on, where a generator expression compiles a code object of
    its own), and it asks each finder ``getattr(finder, FINDER_MARK, 0)``
    without first checking the finder's type. A finder of another ``.pth``
    whose unknown attributes raise anything but AttributeError then stops the
    line (site prints it; the hook stays unarmed, and SGLang's plugin loader
    still arms it in SGLang's processes): guarding against that costs 0.14 M
    instructions a start, 0.3 %, in every process, which is more than this
    line may cost (decided in 0.4.0; docs/design.md, Limits).
    """
    arm = "_f=eval(%r,{'G':%r});_f.find_spec=_f;_f.%s=True;sys.meta_path.insert(0,_f)" % (
        _finder_text(),
        _FROM_THE_PTH,
        FINDER_MARK,
    )
    return "import sys;any([getattr(f,%r,0)is True for f in sys.meta_path])or exec(%r)" % (FINDER_MARK, arm)


# The first line of the .pth, for whoever opens it in site-packages: site skips
# lines that start with "#", so it costs a line read and nothing else.
STARTUP_COMMENT = (
    "# sglang-hotfix-trtllm: arms an import hook that patches SGLang's trtllm_mha_backend when it is imported; "
    "it imports nothing at start. Readable source: sglang_hotfix_trtllm_autoload.py (startup_line). "
    "Off: SGLANG_HOTFIX_TRTLLM_DISABLE=1, or pip uninstall sglang-hotfix-trtllm."
)


def pth_text():
    """The whole ``sglang_hotfix_trtllm.pth`` (a test holds the shipped file to it): the comment,
    the line, and the lookup the line's finder reads from this file (``LOOKUP_LINE``)."""
    assert "\\" not in _LOOKUP  # its newlines are written as backslash-n, and read back so
    return "%s\n%s\n%s%s\n" % (STARTUP_COMMENT, startup_line(), LOOKUP_LINE, _LOOKUP.replace("\n", "\\n"))


if __name__ == "__main__":
    sys.stdout.write(pth_text())
