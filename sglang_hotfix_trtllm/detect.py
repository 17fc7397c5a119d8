"""Detect: the verdict on a hotfix's target, from its source, never importing it.

Generic, for any method-level hotfix record: ``assess_installed`` (find the
installed module's source without importing its package), ``assess_module``
(the file an imported module ran from) and ``assess_source`` (one file) parse
the source and ask the record's ``classify``; the helpers below tell which
definition of ``Class.method`` Python will actually run.

Standard library only; never raises. Python binds the *last* definition of a name, so a
module that defines a class twice, or a class body that defines a method
twice, runs the later one. These helpers return that live definition, and
refuse (return a problem in words instead) whenever the live binding cannot
be read off the source with certainty: a binding inside ``if``/``try``/loops,
a rebinding by assignment or import, a ``global`` statement naming the class,
a class decorator, an attribute store of the method's name anywhere in the
module, or the method's name used as a string (``setattr(cls, "name", f)``).
"""

import ast
import collections
import functools
import threading

from . import source

from .fingerprint import of_node
from .record import Classification, Value, Verdict

_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _binds(node, name):
    """True when this one node binds ``name``: a def or class of that name, an
    import alias, or the name stored or deleted."""
    if isinstance(node, _DEFINITIONS):
        return node.name == name
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return any((alias.asname or alias.name.split(".")[0]) == name for alias in node.names)
    return isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, (ast.Store, ast.Del))


def _binds_directly(statement, name):
    """True when a simple statement binds ``name`` in the scope it sits in."""
    if isinstance(statement, _DEFINITIONS):
        return statement.name == name  # its body is another scope
    return any(_binds(node, name) for node in _walk_scope(statement))


def _walk_scope(node):
    """ast.walk that does not enter nested function or class bodies (other scopes)."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        for child in ast.iter_child_nodes(current):
            if isinstance(child, _DEFINITIONS) and child is not node:
                yield child  # its name binds here; its body is another scope
                stack.extend(child.decorator_list)
                continue
            stack.append(child)


def _nested_bindings(statement, name):
    """Lines where a compound statement binds ``name`` inside its branches."""
    return [node.lineno for node in _walk_scope(statement) if node is not statement and _binds(node, name)]


_COMPOUND = (
    (ast.If, ast.Try, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith)
    + ((ast.Match,) if hasattr(ast, "Match") else ())
    + ((ast.TryStar,) if hasattr(ast, "TryStar") else ())
)


def live_definition(body, name, kind):
    """(node, problem): the definition of ``name`` that is live after ``body``
    runs, which must be a ``kind`` node (``ast.ClassDef`` or ``ast.FunctionDef``).

    node is None when there is none or it cannot be told with certainty;
    problem then says why ("" when ``name`` is simply not defined)."""
    live = None
    for statement in body:
        if isinstance(statement, _COMPOUND):
            nested = _nested_bindings(statement, name)
            if nested:
                return None, "%s is bound conditionally (line %d)" % (name, nested[0])
        elif _binds_directly(statement, name):
            live = statement
    if live is None:
        return None, ""
    if not isinstance(live, kind) or isinstance(live, ast.AsyncFunctionDef) != (kind is ast.AsyncFunctionDef):
        return None, "%s is last bound by a %s at line %d, not by its definition" % (
            name,
            type(live).__name__,
            live.lineno,
        )
    return live, ""


def walk(node):
    """``list(ast.walk(node))``, the same nodes in the same order (breadth first, children in field
    order), with the children read inline instead of through ``ast.walk``'s generators: about twice
    as fast, for the records' looks over whole methods at import (a test holds it to ``ast.walk``)."""
    nodes, todo = [], collections.deque([node])
    pop, extend, keep, AST = todo.popleft, todo.extend, nodes.append, ast.AST
    while todo:
        current = pop()
        keep(current)
        for field in current._fields:
            value = getattr(current, field, None)
            if isinstance(value, AST):
                extend((value,))
            elif isinstance(value, list):
                extend([item for item in value if isinstance(item, AST)])
    return nodes


def _walk_index(tree):
    """What the rebinding checks look for, from one walk of the module: the
    first line of each ``global`` name, of each attribute stored or deleted,
    and of each string constant; and every node, in ``ast.walk``'s order
    (``walk``: the generators of ``ast.walk`` were most of a classification's
    time)."""
    globals_, stores, strings, nodes = {}, {}, {}, walk(tree)
    Global, Attribute, Constant, writes = ast.Global, ast.Attribute, ast.Constant, (ast.Store, ast.Del)
    for node in nodes:
        kind = type(node)
        if kind is Global:
            for name in node.names:
                globals_.setdefault(name, node.lineno)
        elif kind is Attribute and isinstance(node.ctx, writes):
            stores.setdefault(node.attr, node.lineno)
        elif kind is Constant and isinstance(node.value, str):
            strings.setdefault(node.value, node.lineno)
    return globals_, stores, strings, nodes


_walking = threading.local()  # .tree, .index: while one_walk(tree) is open in this thread


class one_walk:
    """While open, the checks of ``tree`` in this thread share one walk of it (``live_class`` and
    ``live_methods`` each ask for the index: a tree classified outside ``shared_parses`` was walked
    twice per record). Closed, nothing is kept: a caller may change its tree between two calls."""

    def __init__(self, tree):
        self.tree = tree

    def __enter__(self):
        self.outer = getattr(_walking, "tree", None), getattr(_walking, "index", None)
        _walking.tree, _walking.index = self.tree, None
        return self

    def __exit__(self, *exc):
        _walking.tree, _walking.index = self.outer
        return False


def walked_once(classify):
    """``classify`` (a record's ``Hotfix.classify``) with one walk of its tree for all its checks."""

    @functools.wraps(classify)
    def classify_walking_once(tree):
        with one_walk(tree):
            return classify(tree)

    return classify_walking_once


def _index(tree):
    """The index of ``tree``: the kept ``ParsedSource``'s when it is that tree (the
    records of one module share one walk), else the open ``one_walk``'s, else walked now.
    Nothing is stored on the tree: classification never modifies it."""
    kept = _kept
    if kept is not None and kept.tree is tree:
        if kept.index is None:
            kept.index = _walk_index(tree)
        return kept.index
    if getattr(_walking, "tree", None) is tree:
        if _walking.index is None:
            _walking.index = _walk_index(tree)
        return _walking.index
    return _walk_index(tree)


def nodes(tree):
    """Every node of ``tree`` in ``ast.walk``'s order, from the walk its checks share (``_index``):
    a record's look over the whole module costs no walk of its own. Never to be changed."""
    return _index(tree)[3]


def live_class(tree, class_name):
    """(ClassDef, problem) of the class that module ``tree`` leaves bound to ``class_name``."""
    cls, problem = live_definition(tree.body, class_name, ast.ClassDef)
    if cls is None:
        return None, problem or "class %s not found in the module" % class_name
    globals_, _, _, _ = _index(tree)
    if class_name in globals_:
        return None, "a function declares `global %s` (line %d): the class may be rebound at run time" % (
            class_name,
            globals_[class_name],
        )
    if cls.decorator_list:
        return None, "class %s has a decorator (line %d), which may replace its methods" % (
            class_name,
            cls.decorator_list[0].lineno,
        )
    return cls, ""


def live_method(tree, cls, method_name):
    """(FunctionDef, problem) of the method the class ``cls`` (in module ``tree``)
    holds under ``method_name`` at run time; (None, "") when it has none."""
    return live_methods(tree, cls, (method_name,))[method_name]


def live_methods(tree, cls, method_names):
    """``live_method`` for several names."""
    _, stores, strings, _ = _index(tree)
    found = {}
    for name in method_names:
        if name in stores:
            found[name] = (None, "%s is assigned as an attribute at line %d" % (name, stores[name]))
        elif name in strings:
            found[name] = (None, "the name %s appears as a string at line %d (setattr?)" % (name, strings[name]))
        else:
            found[name] = live_definition(cls.body, name, ast.FunctionDef)
    return found


# Names of the attribute protocol: code that mentions them can reach any attribute by a computed name.
_ATTRIBUTE_PROTOCOL = frozenset(("__dict__", "__setattr__", "__delattr__", "__getattribute__", "__getattr__"))
_NAMED_WRITES = frozenset(("setattr", "delattr", "vars"))
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _outside_function_bodies(tree):
    """The nodes of ``tree`` that run at module or class level: everything but
    the bodies of ``def`` statements (their decorators, defaults and
    annotations run where the ``def`` is; so do lambdas there)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, _FUNCTIONS):
            stack.extend(node.decorator_list)
            stack.extend(d for d in node.args.defaults + node.args.kw_defaults if d is not None)
            continue
        stack.extend(ast.iter_child_nodes(node))


def attribute_routes_problem(tree, attributes, module_names=()):
    """Why the plain ``self.name`` reads and writes a record examines might not
    be the only ways its ``attributes`` are reached, or "" when they are.

    Refused anywhere in the module: an attribute's name as a string (``getattr``
    / ``setattr`` / ``__dict__[...]`` by name); a write by computed name
    (``setattr``, ``delattr``, ``vars()``); any use of the attribute protocol
    (``__dict__``, ``__setattr__``, ``object.__setattr__`` ...); a class-level
    binding of an attribute's name to anything but a constant (a ``property``
    or any descriptor, a method, a lambda); a use of the attribute in code
    that runs at module or class level (``Cls.name = property(...)``, a lambda
    in a class body); a ``global`` statement naming one of ``module_names``
    (the module's names the record's repair reads).
    """
    attributes = frozenset(attributes)
    for node in nodes(tree):
        if isinstance(node, ast.Constant) and node.value in attributes:
            return "line %d names %s as a string (an access by name)" % (node.lineno, node.value)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _NAMED_WRITES:
            if node.func.id == "vars" or len(node.args) < 2 or not isinstance(node.args[1], ast.Constant):
                return "line %d calls %s() with a computed attribute name" % (node.lineno, node.func.id)
        if (
            (isinstance(node, ast.Attribute) and node.attr in _ATTRIBUTE_PROTOCOL)
            or (isinstance(node, ast.Name) and node.id in _ATTRIBUTE_PROTOCOL)
            or (isinstance(node, _FUNCTIONS) and node.name in _ATTRIBUTE_PROTOCOL)
        ):
            return "line %d uses the attribute protocol (%s)" % (
                node.lineno,
                getattr(node, "attr", None) or getattr(node, "id", None) or node.name,
            )
        if isinstance(node, ast.Global) and set(node.names) & set(module_names):
            return "line %d declares `global %s`" % (
                node.lineno,
                ", ".join(sorted(set(node.names) & set(module_names))),
            )
        if isinstance(node, ast.ClassDef):
            for statement in node.body:
                for name in attributes:
                    if _binds_directly(statement, name) and not (
                        isinstance(statement, (ast.Assign, ast.AnnAssign))
                        and isinstance(statement.value, (ast.Constant, type(None)))
                    ):
                        return (
                            "class %s binds %s at class level (line %d): a descriptor there takes over the "
                            "attribute" % (node.name, name, statement.lineno)
                        )
    for node in _outside_function_bodies(tree):
        if isinstance(node, ast.Attribute) and node.attr in attributes:
            return "line %d uses .%s in code that runs at module or class level" % (node.lineno, node.attr)
    return ""


def signature_problem(method, parameters, defaults=()):
    """None when ``method`` is undecorated and takes exactly ``self`` and
    ``parameters`` (positional-or-keyword, no ``*``/``**``, no keyword-only),
    with ``defaults`` (their source text) for the last ones; else what it takes.
    A wrapper binds its calls with a function of that exact list."""
    arguments = method.args
    names = tuple(a.arg for a in arguments.posonlyargs + arguments.args)
    if (
        method.decorator_list
        or names != ("self",) + tuple(parameters)
        or arguments.vararg
        or arguments.kwarg
        or arguments.kwonlyargs
        or arguments.posonlyargs
        or tuple(ast.unparse(d) for d in arguments.defaults) != tuple(defaults)
    ):
        return "unexpected signature: (%s)" % ", ".join(names)
    return None


def live_method_classified(tree, class_name, method_name):
    """(refusal, cls, function, fingerprint, verdict) for a record that judges one method of the
    class: the live class and method, the method's fingerprint, and ``verdict(value, reason)``, a
    Classification by that fingerprint and the method's first line; or, when either is missing or
    cannot be followed, ``refusal`` (an ``unknown`` Classification saying why) and None for the rest."""
    with one_walk(tree):
        return _live_method_classified(tree, class_name, method_name)


def _live_method_classified(tree, class_name, method_name):
    cls, class_problem = live_class(tree, class_name)
    if cls is None:
        return Classification(Verdict.UNKNOWN, class_problem, of_node(tree)), None, None, None, None
    function, problem = live_methods(tree, cls, (method_name,))[method_name]
    if problem or function is None:
        reason = problem or "%s.%s not found" % (class_name, method_name)
        return Classification(Verdict.UNKNOWN, reason, of_node(cls)), None, None, None, None
    fingerprint, first_line = of_node(function), first_line_of(function)

    def verdict(value, reason):
        return Classification(value, reason, fingerprint, first_line)

    return None, cls, function, fingerprint, verdict


def first_line_of(function):
    """The line a function's code object reports as ``co_firstlineno`` (the
    first decorator's line, if any)."""
    return min([function.lineno] + [d.lineno for d in function.decorator_list])


# --------------------------------------------------------------------------
# Verdicts


class Assessment(Value):
    """The verdict on one source of a hotfix's target, with what it rests on."""

    __slots__ = (
        "hotfix_name",
        "target",
        "verdict",
        "reason",
        "fingerprint",
        "source_path",
        "known_releases",
        "method_first_line",
    )
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


class ParsedSource:
    """One source file as the analysis read it: ``path``, ``text``, its ``tree``
    and ``index`` (one walk, for the rebinding checks), and each record's
    ``assessments`` of it. The one cache of this module.

    Lifetime: one is kept, the last file read (``_kept``), and replaced when
    another path or text is read, so it never grows. Its tree and index (about
    1.4 MB for SGLang 0.5.12's backend) live only inside ``shared_parses()``,
    the span in which the records of one module are assessed; outside it only
    the path, the text (about 40 kB) and the assessments stay, so that
    ``apply()`` after ``remove()`` on an unchanged file gives the same verdicts
    without parsing again.
    """

    __slots__ = ("path", "text", "tree", "index", "assessments")

    def __init__(self, path, text):
        self.path, self.text = path, text
        self.tree = self.index = None
        self.assessments = {}

    def parse(self):
        if self.tree is None:
            self.tree = ast.parse(self.text, filename=self.path)
        return self.tree


_kept = None
_sharing = 0  # depth of shared_parses() contexts


def _parsed(path, text):
    global _kept
    if _kept is None or _kept.path != path or _kept.text != text:
        _kept = ParsedSource(path, text)
    return _kept


def shared_tree(path, data):
    """The tree the records of one module are classified from, for their edits (``code_edit``):
    while ``shared_parses()`` is open and ``data`` is exactly the UTF-8 bytes of the text read from
    ``path`` (a BOM, another encoding or CRLF line ends: None, and the caller parses the bytes
    itself). One parse and one walk (``nodes``) then serve both, where the edits parsed the file
    again and walked it once per look of pr28144's (four walks, 35 ms an import on 0.5.12 here).
    Never to be changed: edits work on copies."""
    kept = _kept
    if not _sharing or kept is None or kept.path != path:
        return None
    try:
        if kept.text.encode("utf-8") != data:
            return None
        return kept.parse()
    except (UnicodeError, SyntaxError, ValueError, RecursionError, MemoryError):
        return None  # the caller's own parse says why, as before


class shared_parses:
    """Context in which the records assessing one source share its tree; on
    leaving the outermost one, the tree and index are let go (ParsedSource)."""

    def __enter__(self):
        global _sharing
        _sharing += 1
        return self

    def __exit__(self, *exc):
        global _sharing
        _sharing -= 1
        if not _sharing and _kept is not None:
            _kept.tree = _kept.index = None


def assess_source(hotfix, path, text=None):
    """Classify one source file of the hotfix's target module; never raises."""

    def result(verdict, reason, fingerprint=None, first_line=None, releases=()):
        return Assessment(hotfix.name, hotfix.target, verdict, reason, fingerprint, path, tuple(releases), first_line)

    try:
        if text is None:
            text = source.read_text(path)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError) as error:
        return result(Verdict.UNKNOWN, "cannot read %s: %s: %s" % (path, type(error).__name__, error))

    parsed = _parsed(path, text)
    cached = parsed.assessments.get(hotfix.name)
    if cached is not None and cached[0] is hotfix:
        return cached[1]  # the same record on the same text: the same verdict (apply() after remove())
    try:
        assessment = _assess(hotfix, parsed, result)
    finally:
        if not _sharing:  # assessed alone: nothing else will read this tree
            parsed.tree = parsed.index = None
    parsed.assessments[hotfix.name] = (hotfix, assessment)
    return assessment


def _assess(hotfix, parsed, result):
    try:
        tree = parsed.parse()
    except (SyntaxError, ValueError, RecursionError, MemoryError) as error:  # the last two: too deeply nested
        return result(Verdict.UNKNOWN, "cannot read %s as Python: %s: %s" % (parsed.path, type(error).__name__, error))
    try:
        # Always the full analysis of the live definitions: the release table
        # only names the releases that share the fingerprint. A method whose
        # fingerprint a release has can still be dead code (a later definition
        # wins) or be reached through code the table never saw.
        classification = hotfix.classify(tree)
    except Exception as error:  # a bug in a record must not take the host down
        return result(Verdict.UNKNOWN, "classifier failed: %s: %s" % (type(error).__name__, error))
    # A release table that cannot be read (ReleaseTable.problem) names no release; the verdict stands.
    table = hotfix.known_fingerprints
    if hasattr(table, "releases_for"):
        releases = table.releases_for(classification.fingerprint, classification.verdict)
    else:  # a plain mapping (a record without a shipped table)
        known = table.get(classification.fingerprint)
        releases = known[1] if known is not None and known[0] is classification.verdict else ()
    reason = classification.reason
    if releases:
        reason = "%s; as in SGLang %s" % (reason, _releases_text(releases))
    return result(
        classification.verdict, reason, classification.fingerprint, classification.method_first_line, releases
    )


def _releases_text(releases):
    return releases[0] if len(releases) == 1 else "%s … %s (%d releases)" % (releases[0], releases[-1], len(releases))


def distribution_installed(hotfix):
    """Whether this interpreter finds the top-level package of the record's target at all (never
    imported): the one answer ``status`` and ``verify`` give for "is SGLang installed here"."""
    return bool(source.locate(hotfix.module).package_found)


def in_this_environment(hotfix, assessment):
    """``assessment`` of an installed (or imported) source, with what the record's repair needs of
    this Python besides that source (``Hotfix.environment``: encoder_only_mask needs a FlashInfer
    that takes its argument): an ``affected`` verdict whose repair this environment cannot carry
    becomes ``unrepairable``, with the record's reason. A file judged on its own (``status --source``)
    is not asked: its environment is not this one. A record of FlashInfer's own kernel bug
    (``Hotfix.flashinfer_fix``) whose code reaches the kernel path gets the installed FlashInfer's
    verdict: fixed from the fixing release on, not-applicable without FlashInfer."""
    if hotfix.flashinfer_fix is not None and assessment.verdict is Verdict.UNREPAIRABLE:
        return _with_flashinfer(hotfix, assessment)
    if assessment.verdict is not Verdict.AFFECTED or hotfix.environment is None:
        return assessment
    try:
        problem = hotfix.environment()
    except Exception as error:  # a bug in a record must not take the host down
        problem = "the record's check of this environment failed: %s: %s" % (type(error).__name__, error)
    if problem is None:
        return assessment
    verdict = Verdict.UNREPAIRABLE
    if isinstance(problem, tuple):  # (verdict, reason): the bug is masked here (xqa_workspace)
        verdict, problem = problem
    return Assessment(
        assessment.hotfix_name,
        assessment.target,
        verdict,
        problem,
        assessment.fingerprint,
        assessment.source_path,
        assessment.known_releases,
        assessment.method_first_line,
    )


def beside_its_flashinfer(hotfix, assessment):
    """``assessment`` of a file judged on its own (``status --source``): a record of FlashInfer's own
    kernel bug whose code reaches the kernel path gets the verdict of the FlashInfer installed in the
    folder that holds the file's ``sglang`` package (an image's site-packages). Where none is there
    (a file copied out of an image, an SGLang installed away from its site-packages) it cannot be
    told which FlashInfer runs with the code: the bug stays reported, and the reason says so, never
    "all is well". Every other assessment is returned as it is."""
    if hotfix.flashinfer_fix is None or assessment.verdict is not Verdict.UNREPAIRABLE:
        return assessment
    from .flashinfer_install import beside

    try:
        found = beside(assessment.source_path, hotfix.module)
    except Exception as error:  # a bug here must not take the command down; the bug stays reported
        found, why = None, "%s: %s" % (type(error).__name__, error)
    else:
        why = None
    if found is not None and found.present:
        return _with_flashinfer(hotfix, assessment, lambda: found)
    return Assessment(
        assessment.hotfix_name,
        assessment.target,
        assessment.verdict,
        "cannot tell which FlashInfer runs with this code (%s): %s"
        % (why or "none is installed in the folder that holds its sglang package", assessment.reason),
        assessment.fingerprint,
        assessment.source_path,
        assessment.known_releases,
        assessment.method_first_line,
    )


def _with_flashinfer(hotfix, assessment, found=None):
    from .flashinfer_install import judge_kernel_fix

    try:
        verdict, why = judge_kernel_fix(
            hotfix.flashinfer_fix.first, hotfix.flashinfer_fix.reference, found() if found else None
        )
    except Exception as error:  # a bug here must not take the host down; the bug stays reported
        verdict, why = (
            Verdict.UNREPAIRABLE,
            "the installed FlashInfer cannot be read: %s: %s"
            % (
                type(error).__name__,
                error,
            ),
        )
    # The code's reason (who it concerns, why no repair) stays where the bug is reported; where the
    # installed FlashInfer has the fix or no FlashInfer runs, that is the reason.
    reason = "%s. %s" % (why, assessment.reason) if verdict is Verdict.UNREPAIRABLE else why
    return Assessment(
        assessment.hotfix_name,
        assessment.target,
        verdict,
        reason,
        assessment.fingerprint,
        assessment.source_path,
        assessment.known_releases,
        assessment.method_first_line,
    )


def assess_installed(hotfix):
    """The verdict on the installed distribution, found without importing it."""
    located = source.locate(hotfix.module)
    if located.path is None:
        if located.module_found:
            return Assessment(
                hotfix.name,
                hotfix.target,
                Verdict.UNKNOWN,
                "cannot analyse %s: %s" % (hotfix.module, located.reason),
                None,
                None,
                (),
            )
        if not located.package_found:
            reason = "%s is not installed in this environment (%s)" % (hotfix.distribution, located.reason)
        else:
            reason = "this %s has no %s module (%s)" % (hotfix.distribution, hotfix.module, located.reason)
        return Assessment(hotfix.name, hotfix.target, Verdict.NOT_APPLICABLE, reason, None, None, ())
    return in_this_environment(hotfix, assess_source(hotfix, located.path))


def assess_module(hotfix, module):
    """The verdict on an imported module, from the file it was loaded from."""
    spec = getattr(module, "__spec__", None)
    if source.is_namespace(spec):
        return Assessment(
            hotfix.name,
            hotfix.target,
            Verdict.NOT_APPLICABLE,
            "this %s has no %s module (%s)"
            % (hotfix.distribution, hotfix.module, source.NAMESPACE_REASON % hotfix.module),
            None,
            None,
            (),
        )
    path, problem = source.source_file(getattr(spec, "origin", None) or getattr(module, "__file__", None))
    if path is None:
        return Assessment(
            hotfix.name,
            hotfix.target,
            Verdict.UNKNOWN,
            "cannot analyse %s: %s" % (hotfix.module, problem),
            None,
            None,
            (),
        )
    return in_this_environment(hotfix, assess_source(hotfix, path))
