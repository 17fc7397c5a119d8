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


def without_import_lock(function, *args):
    """``function(*args)`` with the global import lock let go, if this thread holds it, and taken
    back as often after. importlib holds that lock while it asks each meta-path finder
    (``_find_spec``), and an import needs a module's own lock *before* the global one
    (``_find_and_load``): a finder that imports while holding the global lock waits for a thread
    importing the same module, which waits for the global lock: both hang (issue 36, item 7). So
    the hook's imports run without it, as any import outside a finder does."""
    import _imp

    held = 0
    try:
        while _imp.lock_held():
            _imp.release_lock()  # RuntimeError when another thread holds it: nothing of ours to let go
            held += 1
    except RuntimeError:
        pass
    try:
        return function(*args)
    finally:
        while held:
            _imp.acquire_lock()
            held -= 1


def find_spec(fullname, path=None, target=None):
    """Meta-path finder: None for all but the watched modules; for those, the
    regular spec with a loader that hands the module to the engine once run.
    The disable switch is read here, at the lookup, because the ``.pth``
    finder is armed without reading the environment."""
    if fullname not in WATCHED_MODULES or switch_on(DISABLE_VARIABLE):
        return None
    return without_import_lock(_spec_from_the_hook, fullname, path, target)


def _spec_from_the_hook(fullname, path, target):
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
            _AfterImport.watch(name)
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
    """A finder that answers None to every lookup and, at each, hands the
    watched modules whose import has completed since to the engine. It is
    armed only when ``install`` found a watched module half-executed; the next
    import of anything after that (SGLang imports on) is the first moment the
    module is whole. It never edits ``sys.meta_path`` from inside a lookup (the
    import system is iterating that list: removing an entry would make it skip
    the next finder); once nothing is pending it stays, answering None at the
    cost of one call, until ``uninstall``. If the module's import fails, the
    module is forgotten. When the import hook's own loader ran the module, the
    loader hands it over itself and takes it off ``pending`` first."""

    pending = set()

    @classmethod
    def watch(cls, name):
        cls.pending.add(name)
        if cls not in sys.meta_path:
            sys.meta_path.insert(0, cls)

    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if not cls.pending:
            return None
        done = []
        for name in list(cls.pending):
            module = sys.modules.get(name)
            if module is not None and _initializing(module):
                continue
            try:
                cls.pending.remove(name)  # one thread wins each name: handed over once
            except KeyError:
                continue
            if module is not None:
                done.append((name, module))
        if done:
            without_import_lock(_hand_over, done)  # it imports the engine (see without_import_lock)
        return None


def _hand_over(done):
    for name, module in done:
        hook = _load_import_hook(name)
        if hook is not None:
            hook.module_executed(module, name)


def uninstall():
    """Disarm the hook (every copy of it): later imports of watched modules are not patched."""
    _AfterImport.pending.clear()
    sys.meta_path[:] = [finder for finder in sys.meta_path if not is_finder(finder) and finder is not _AfterImport]


def is_installed():
    return any(is_finder(finder) for finder in sys.meta_path)


# What the .pth finder runs when a watched module is looked up: load this
# module (the failure of that is the only one caught: strict mode's ImportError
# from ``find_spec`` must reach the importer) and ask its ``find_spec``, with
# the global import lock let go meanwhile and taken back after, as often as
# this thread held it (``without_import_lock`` says why; this string cannot
# call it before it has imported this module). ``args``
# holds the finder's arguments; ``spec`` comes back through the finder's own
# dictionary. Every character here is read at each start (the .pth line holds
# it), so it stays short; its one line goes to descriptor 2 with os.write, for
# the reason ``write_stderr`` gives.
_LOOKUP = (
    "global spec\n"
    "import _imp\n"
    "n=0\n"
    "try:\n"
    " while _imp.lock_held():_imp.release_lock();n+=1\n"
    "except RuntimeError:pass\n"
    "try:\n"
    " try:from sglang_hotfix_trtllm_autoload import find_spec as f\n"
    " except Exception as e:\n"
    "  f=None\n"
    "  try:import os;os.write(2,('sglang-hotfix-trtllm: startup module failed (%r); %s is imported unpatched."
    " Reinstall sglang-hotfix-trtllm or delete its .pth file\\n'%(e,args[0])).encode())\n"
    "  except Exception:pass\n"
    " spec=f and f(*args)\n"
    "finally:\n"
    " while n:_imp.acquire_lock();n-=1"
)


def startup_line():
    """The line of ``sglang_hotfix_trtllm.pth`` (a test holds the shipped file to it).

    Unless a marked finder is armed already (site reads this file twice in a
    venv), a lambda, evaluated with globals of its own that hold ``_LOOKUP`` as
    ``G`` (globals holding site's namespace would keep it alive to the end,
    which costs more than the eval), gets ``find_spec`` and ``FINDER_MARK`` as
    attributes and goes first on ``sys.meta_path``. site runs the line with
    ``exec`` in its ``addpackage``, whose locals it only sees as a snapshot:
    the names the line binds (``sys``, ``_f``) go nowhere else.

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
    # The finder protocol's parameter names and defaults, so that a caller passing them by keyword is served.
    watched = " and ".join("fullname!=%r" % name for name in sorted(WATCHED_MODULES))
    finder = (
        "lambda fullname,path=None,target=None,g={}:None if %s else exec(G,g,{'args':(fullname,path,target)})"
        "or g.pop('spec',None)" % watched
    )
    arm = "_f=eval(%r,{'G':%r});_f.find_spec=_f;_f.%s=True;sys.meta_path.insert(0,_f)" % (finder, _LOOKUP, FINDER_MARK)
    return "import sys;any([getattr(f,%r,0)is True for f in sys.meta_path])or exec(%r)" % (FINDER_MARK, arm)


# The first line of the .pth, for whoever opens it in site-packages: site skips
# lines that start with "#", so it costs a line read and nothing else.
STARTUP_COMMENT = (
    "# sglang-hotfix-trtllm: arms an import hook that patches SGLang's trtllm_mha_backend when it is imported; "
    "it imports nothing at start. Readable source: sglang_hotfix_trtllm_autoload.py (startup_line). "
    "Off: SGLANG_HOTFIX_TRTLLM_DISABLE=1, or pip uninstall sglang-hotfix-trtllm."
)


def pth_text():
    """The whole ``sglang_hotfix_trtllm.pth`` (a test holds the shipped file to it)."""
    return "%s\n%s\n" % (STARTUP_COMMENT, startup_line())


if __name__ == "__main__":
    sys.stdout.write(pth_text())
