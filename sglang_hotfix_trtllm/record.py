"""What a hotfix is, as data: the generic engine reads these records.

Standard library only. A record names its target (module, class, method),
the upstream change it backports, how to classify a source of the target
module, and the wrapper that repairs the method. The
generic machinery (``detect``, ``engine``, ``patch``) knows nothing about any
particular bug: a second hotfix is a second record, listed in
``catalog.HOTFIXES`` (and its module in the startup module's
``WATCHED_MODULES``, which must not import anything to know it).
"""

import enum


class Value:
    """A small read-only record, built from positional or keyword fields.

    Not a dataclass on purpose: dataclasses generate source code and compile
    it when each class is created, on the path that runs when SGLang imports
    its backend; this needs no compiling.
    """

    __slots__ = ()
    _defaults = {}

    def __init__(self, *args, **kwargs):
        values = dict(self._defaults)
        values.update(zip(self.__slots__, args))
        values.update(kwargs)
        unknown = set(values) - set(self.__slots__)
        missing = [name for name in self.__slots__ if name not in values]
        if unknown or missing or len(args) > len(self.__slots__):
            raise TypeError("%s: unknown %s, missing %s" % (type(self).__name__, sorted(unknown), missing))
        for name in self.__slots__:
            object.__setattr__(self, name, values[name])

    def __setattr__(self, name, value):
        raise AttributeError("%s is read-only" % type(self).__name__)

    def __eq__(self, other):
        return type(self) is type(other) and all(getattr(self, n) == getattr(other, n) for n in self.__slots__)

    def __hash__(self):
        return hash(tuple(getattr(self, n) for n in self.__slots__))

    def __repr__(self):
        return "%s(%s)" % (type(self).__name__, ", ".join("%s=%r" % (n, getattr(self, n)) for n in self.__slots__))


class Verdict(str, enum.Enum):
    AFFECTED = "affected"  # the bug is there and the wrapper is known to repair it
    FIXED = "fixed"  # upstream already carries the fix
    NOT_APPLICABLE = "not-applicable"  # no SGLang, or no target module
    # The bug is there and recognised, but the hotfix cannot repair it exactly on this code: never
    # patched, and said as such (not as "not recognised"); the reason names the release that fixes it.
    UNREPAIRABLE = "unrepairable"
    UNKNOWN = "unknown"  # anything else: never patched

    def __str__(self):
        return self.value


class Classification(Value):
    """A record's judgement of one source file of its target module.

    ``method_first_line``: first line of the target method (decorators
    included), to check that the function object about to be wrapped was
    compiled from the analysed code; for a record that wraps several methods
    (``Hotfix.also``), a dict method name -> first line.
    """

    __slots__ = ("verdict", "reason", "fingerprint", "method_first_line")
    _defaults = {"fingerprint": None, "method_first_line": None}


class Hotfix(Value):
    """One hotfix, as data.

    * ``name``: short id used in logs and JSON; ``upstream``: the upstream fix;
      ``summary``: what the fix does, in one line (``--help``); ``effect``: what
      now happens, for the log line "patched ...: <effect> as <upstream> does".
    * ``distribution``: the distribution that ships the target module.
    * ``target``: the method, by dotted path ("package.module.Class.method", as
      SGLang's HookRegistry names targets); ``module``, ``class_name`` and
      ``method_name`` are its parts.
    * ``classify(tree) -> Classification``: verdict from the code's structure
      (of the live definitions, see ``detect``); it must not modify ``tree``:
      the records of one module share one parse.
    * ``wrapper(module, wrapped, instance, args, kwargs)``: for a record on a set-up-time method
      (``init_forward_metadata_capture_cuda_graph``, ``__init__``), the wrapt wrapper,
      with the module it was applied to first (names of the target module come
      from there). It must never raise where SGLang's method would not: a repair
      it cannot compute is skipped with ``logs.repair_skipped``.
    * ``known_fingerprints``: fingerprint -> (Verdict, releases with that code).
    * ``probe``: "module:function" run by ``verify`` on the imported target.
    * ``gpu_proof``: for a record without a ``probe``, what ran on a GPU (which release, kernel and
      card, as docs/gpu.md records it), or why nothing did: ``verify`` cites it, and must never
      cite a run that does not exist.
    * ``also``: other methods of the same class that the same ``wrapper``
      wraps (it tells them apart by ``wrapped.__name__``); all of them are
      wrapped, or none.
    * ``environment``: None, or ``environment()`` -> None, or the reason (naming the release that
      fixes the bug) why this Python cannot carry the repair although the code is affected
      (encoder_only_mask: the installed FlashInfer takes no ``causal``); the verdict on an installed
      or imported source is then ``unrepairable``. Or ``(Verdict.NOT_APPLICABLE, reason)``: the
      installed environment masks the bug (xqa_workspace with FlashInfer 0.7.2 on), and the record
      stands aside. It reads files only, never imports.
    * ``edits``: for a record whose repair is upstream's change of statements inside methods
      SGLang calls per step: ``code_edit.Edit`` values (which method, and the change of its syntax
      tree). Such a record is put in force by ``code_edit``: the methods run the installed file's
      code with upstream's change, compiled into SGLang's own function (``wrapper`` None, no gate).
    * ``new_names``: ``code_edit.NewName`` values, the definitions upstream's code needs that the
      release lacks (added to the class before the edited code runs, taken away by ``remove()``).
    * ``flashinfer_fix``: for a record of a bug in FlashInfer's own kernel code (never patched: the
      repair is FlashInfer's), the ``FlashInferFix`` that fixes it. ``classify`` says whether the SGLang
      code reaches that kernel path (``unrepairable`` where it does); where it does, the installed
      FlashInfer decides the verdict on an installed or imported source
      (``flashinfer_install.judge_kernel_fix``: ``fixed`` from the fixing release on), and the pin of
      each release its row of the release table (``tools/scan_releases.py``).
    * ``made_at_construction``: attribute names upstream's ``__init__`` (an edit of this record) makes
      and its per-step code reads: the record is never put in force while an instance of the class
      built without them is alive (``apply()`` late in a process): it stands aside and says so.
    """

    __slots__ = (
        "name",
        "upstream",
        "summary",
        "effect",
        "distribution",
        "target",
        "classify",
        "wrapper",
        "known_fingerprints",
        "probe",
        "gpu_proof",
        "also",
        "environment",
        "edits",
        "new_names",
        "made_at_construction",
        "flashinfer_fix",
    )
    _defaults = {
        "flashinfer_fix": None,
        "wrapper": None,
        "edits": (),
        "new_names": (),
        "made_at_construction": (),
        "known_fingerprints": {},
        "probe": None,
        "gpu_proof": None,
        "summary": "",
        "effect": "patched",
        "also": (),
        "environment": None,
    }

    @property
    def module(self):
        return self.target.rsplit(".", 2)[0]

    @property
    def class_name(self):
        return self.target.rsplit(".", 2)[1]

    @property
    def method_name(self):
        return self.target.rsplit(".", 2)[2]

    @property
    def targets_text(self):
        """The target, and the other methods wrapped or edited with it ("...Class.a and b"): the log
        line names every method whose code the record changes."""
        edited = tuple(edit.method for edit in self.edits)
        others = tuple(dict.fromkeys(m for m in edited + tuple(self.also) if m != self.method_name))
        return " and ".join((self.target,) + others)

    @property
    def method_names(self):
        """Every method the record wraps or edits: the target's, then ``also``."""
        return (self.method_name,) + tuple(self.also)

    @property
    def mechanism(self):
        """How the record is put in force: "edit" (upstream's code compiled into SGLang's method,
        ``code_edit``) or "wrap" (a wrapt wrapper, ``patch``)."""
        return "edit" if self.edits else "wrap"


class FlashInferFix(Value):
    """The FlashInfer change that fixes a kernel bug: ``first``, the first FlashInfer release that
    carries it ("0.6.17"); ``reference``, the change ("FlashInfer PR #4161")."""

    __slots__ = ("first", "reference")


def reports_only(module, wrapped, instance, args, kwargs):
    """The wrapper of a record whose ``classify`` never says ``affected`` (one that recognises a bug
    it cannot repair, and reports it): never called, since the engine wraps only affected code. A
    record must name a wrapper; this one would run SGLang's method alone."""
    return wrapped(*args, **kwargs)


class ProbeReport(Value):
    """What ``verify`` shows: ``rows`` of (what, unpatched, patched, upstream),
    whether patched equals upstream, and a line of detail."""

    __slots__ = ("title", "rows", "patched_equals_upstream", "detail")
    _defaults = {"detail": ""}
