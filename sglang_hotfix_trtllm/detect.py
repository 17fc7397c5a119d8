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

from . import source
from .record import Value, Verdict

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


_COMPOUND = (ast.If, ast.Try, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith) + (
    (ast.Match,) if hasattr(ast, "Match") else ()) + ((ast.TryStar,) if hasattr(ast, "TryStar") else ())


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
        return None, "%s is last bound by a %s at line %d, not by its definition" % (name, type(live).__name__, live.lineno)
    return live, ""


def live_class(tree, class_name):
    """(ClassDef, problem) of the class that module ``tree`` leaves bound to ``class_name``."""
    cls, problem = live_definition(tree.body, class_name, ast.ClassDef)
    if cls is None:
        return None, problem or "class %s not found in the module" % class_name
    for node in ast.walk(tree):
        if isinstance(node, ast.Global) and class_name in node.names:
            return None, "a function declares `global %s` (line %d): the class may be rebound at run time" % (class_name, node.lineno)
    if cls.decorator_list:
        return None, "class %s has a decorator (line %d), which may replace its methods" % (class_name, cls.decorator_list[0].lineno)
    return cls, ""


def live_method(tree, cls, method_name):
    """(FunctionDef, problem) of the method the class ``cls`` (in module ``tree``)
    holds under ``method_name`` at run time; (None, "") when it has none."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == method_name and isinstance(node.ctx, (ast.Store, ast.Del)):
            return None, "%s is assigned as an attribute at line %d" % (method_name, node.lineno)
        if isinstance(node, ast.Constant) and node.value == method_name:
            return None, "the name %s appears as a string at line %d (setattr?)" % (method_name, node.lineno)
    return live_definition(cls.body, method_name, ast.FunctionDef)


def first_line_of(function):
    """The line a function's code object reports as ``co_firstlineno`` (the
    first decorator's line, if any)."""
    return min([function.lineno] + [d.lineno for d in function.decorator_list])


def is_docstring(statement):
    return isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant) and isinstance(statement.value.value, str)


# --------------------------------------------------------------------------
# Verdicts


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
