"""Code edits: a method SGLang calls per step runs upstream's code, compiled into SGLang's own function.

Standard library only; imports neither torch nor SGLang nor wrapt. Raises ``NotEditable`` (the
record stands aside, the caller says so) and nothing else into its callers' callers.

A record whose repair is a change of statements inside an SGLang method hands in *edits*
(``Hotfix.edits``): functions that change the syntax tree of one method of the installed file
the way upstream's pull request changed it, and raise ``EditMismatch`` where the tree is not the
one they know. The mechanism, here and nowhere else:

1. **prove** that the function the class holds *is* the installed file's code: a fresh compile of
   the file, as the import system compiles it (``compile(bytes, co_filename, "exec",
   dont_inherit=True, optimize=-1)``), compared with the running code object field by field,
   nested code constants included. A stale ``.pyc``, a file changed since import, a function
   replaced or wrapped by someone else all differ, and the first differing field is named;
2. **edit** a fresh parse of the whole file: every record on a method applies its edits, in the
   order the records were put in force (the engine's catalog order), to the one tree;
3. **compile** the edited module as the import system compiles the file (same file name, every
   unchanged line at its own number, qualified names, name mangling, ``__future__`` flags and a
   ``super()`` method's ``__class__`` cell as in the file) and take the method's code object;
4. **install** it as the function's ``__code__`` after checking what CPython does not: the free
   variables by *name* (cells bind by position; CPython counts them only) and the parameters.
   The function keeps its globals, closure, defaults and identity: subclasses, bound methods taken
   before, decorators and other patchers' wrappers above it all reach the new code, and no frame
   of the hotfix's runs on a call;
5. **restore**: ``remove_all`` puts back the identical original code object;
6. **report**: ``in_force`` says whether a record's code is what the class's function runs now.

New names upstream's code needs (``Hotfix.new_names``: 0.5.10's ``_get_layer_cache_loc``) are
upstream's own definitions, compiled under a file name that says whose they are (registered in
``linecache``, so a traceback shows their text), added before the code that calls them and taken
away after it on ``remove_all``; a name that exists already stands the record aside.

What it does not cope with (said here, as jurigged says it): a frame already running the method
keeps the code it started with (one pointer store: the next call runs the new code); a compiled
graph (TorchDynamo) that inlined the method before the change keeps the old body
(pytorch/pytorch#197860), which is why the engine edits at import, before anything compiles.
"""

import ast
import collections
import copy
import linecache
import pickle
import logging
import os
import sys
import threading
import types
import weakref

from . import detect, source
from .logs import say
from .record import Value

_lock = threading.RLock()
# (class, method name) -> EditedMethod, for every method whose code this process changed.
_edited = {}
# Every name added to a class (NewName), in the order added: taken away in reverse.
_added = []
# SGLang's functions this process proved and edited: after remove(), apply() finds one again under
# a wrapper another patcher put above it meanwhile (weakly: a reloaded class's old ones go).
# (By id, compared by identity: a wrapt proxy compares equal to what it wraps.)
_known_functions = weakref.WeakValueDictionary()

# The fields of a code object that say what it runs and where it says it comes from; those a
# Python version lacks are skipped. co_consts is compared recursively (nested functions, lambdas,
# comprehensions before 3.12).
_FIELDS = (
    "co_name",
    "co_qualname",
    "co_filename",
    "co_firstlineno",
    "co_argcount",
    "co_posonlyargcount",
    "co_kwonlyargcount",
    "co_nlocals",
    "co_stacksize",
    "co_flags",
    "co_code",
    "co_names",
    "co_varnames",
    "co_freevars",
    "co_cellvars",
    "co_linetable",
    "co_exceptiontable",
    "co_consts",
)
_ABSENT = object()


class NotEditable(Exception):
    """The method cannot be changed safely here: the record stands aside (the message says why)."""


class EditMismatch(Exception):
    """Raised by a record's edit when the method's tree is not one it knows how to change."""


class Edit(Value):
    """One record's change of one method: ``method`` (its name on the record's class) and
    ``apply(function_node, module_tree)``, which changes the ``ast.FunctionDef`` in place as
    upstream's change does (reading the rest of the file where it must: whether the class sets an
    attribute), or raises ``EditMismatch``. New statements carry the line of the statement they replace
    or precede, so every unchanged line keeps its number."""

    __slots__ = ("method", "apply")


class NewName(Value):
    """A name upstream's code reaches that the release lacks, defined by ``source`` (upstream's own
    definition) from ``origin`` (the upstream release it is taken from, for the file name
    tracebacks show). ``scope`` "class": a method of the record's class (a ``def``, or a
    ``@staticmethod`` one); "module": a global of the target module (a ``def``, an assignment of
    constants, or ``from M import name`` of a module already imported: nothing is imported)."""

    __slots__ = ("name", "source", "origin", "scope")
    _defaults = {"scope": "class"}


class EditedMethod:
    """One method whose code this process changed: the function (its identity never changes), the
    original code object (put back by identity), the code installed now, the records whose edits
    it holds, in the order applied, and the file's bytes its proof read (every later compile of
    it uses them)."""

    __slots__ = ("function", "original", "installed", "records", "edits", "data")

    def __init__(self, function, data):
        self.function, self.data = function, data
        self.original = self.installed = function.__code__
        self.records = ()
        self.edits = {}  # record -> its Edits of this method: a later record's compile re-applies them


# --------------------------------------------------------------------------
# Comparing code objects


def _same_constant(left, right):
    if type(left) is not type(right):
        return False
    if isinstance(left, (float, complex)):
        return repr(left) == repr(right)  # -0.0 and nan compare as the compiler keys them
    if isinstance(left, (tuple, frozenset)):
        if len(left) != len(right):
            return False
        pairs = zip(left, right) if isinstance(left, tuple) else zip(sorted(left, key=repr), sorted(right, key=repr))
        return all(_same_constant(a, b) for a, b in pairs)
    return left == right


def code_difference(live, fresh, where=""):
    """None when the two code objects are the same code, field by field and constant by constant
    (nested code objects included), else the first field that differs, named by its path
    (``"co_consts[4].co_code"``) with both values where they are short."""
    for field in _FIELDS:
        left, right = getattr(live, field, _ABSENT), getattr(fresh, field, _ABSENT)
        if field != "co_consts":
            if left != right:
                shown = " (%r, fresh compile %r)" % (left, right) if len(repr(left)) + len(repr(right)) < 160 else ""
                return "%s%s%s" % (where, field, shown)
            continue
        if len(left) != len(right):
            return "%sco_consts (%d constants, fresh compile %d)" % (where, len(left), len(right))
        for index, (a, b) in enumerate(zip(left, right)):
            if isinstance(a, types.CodeType) and isinstance(b, types.CodeType):
                found = code_difference(a, b, "%sco_consts[%d]." % (where, index))
                if found:
                    return found
            elif not _same_constant(a, b):
                return "%sco_consts[%d]" % (where, index)
    return None


# --------------------------------------------------------------------------
# Compiling as the import system does


def compile_module(source, filename):
    """The module's code object as importlib compiles a source file (``source_to_code``):
    ``source`` is the file's bytes or an ``ast.Module``."""
    return compile(source, filename, "exec", dont_inherit=True, optimize=-1)


def method_code(module_code, class_name, method_name, first_line):
    """The code object of ``class_name.method_name`` defined at ``first_line`` (decorators
    included) in a module's code, or the last one of that name when none starts there (the caller
    then names the differing line); None when the class body defines none."""
    found = None
    for constant in module_code.co_consts:
        if not (isinstance(constant, types.CodeType) and constant.co_name == class_name):
            continue
        for inner in constant.co_consts:
            if isinstance(inner, types.CodeType) and inner.co_name == method_name:
                if inner.co_firstlineno == first_line:
                    return inner
                found = inner
    return found


def _future_flags(tree):
    return [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "__future__"]


# --------------------------------------------------------------------------
# Helpers for the records' edits


_HOLDS_STATEMENTS = (ast.stmt, ast.excepthandler, ast.match_case)


def statement_lists(node):
    """Every statement list under ``node`` (bodies of the function, ifs, loops, withs, trys), as
    lists a record's edit may change in place, in the order ``ast.walk`` meets their owners.
    Only statements, handlers and match cases are visited: an expression holds no statement, and
    walking every node was a sixth of an import's time (a test holds the order to ``ast.walk``'s)."""
    todo = collections.deque([node])
    pop, extend, holds = todo.popleft, todo.extend, _HOLDS_STATEMENTS
    while todo:
        child = pop()
        for field in child._fields:
            value = getattr(child, field, None)
            if isinstance(value, list):
                extend([item for item in value if isinstance(item, holds)])
            elif isinstance(value, holds):
                extend((value,))
        for field in ("body", "orelse", "finalbody"):
            statements = getattr(child, field, None)
            if isinstance(statements, list) and statements and isinstance(statements[0], ast.stmt):
                yield statements
        for handler in getattr(child, "handlers", ()):
            yield handler.body


def statement_at(text, line):
    """Upstream's statement ``text`` (one statement), numbered from ``line`` of the release's file:
    a traceback through it names the line of the statement it replaces or precedes."""
    (statement,) = ast.parse(text).body
    ast.increment_lineno(statement, line - 1)
    return statement


def replace_statement(method, release_text, upstream_text):
    """Upstream's change "this statement becomes that one", on the method's one statement whose
    text is ``release_text``; EditMismatch unless there is exactly one."""
    places = [
        (body, index)
        for body in statement_lists(method)
        for index, statement in enumerate(body)
        if ast.unparse(statement) == release_text
    ]
    if len(places) != 1:
        raise EditMismatch(
            "%d statements `%s` in %s (upstream's change has one)" % (len(places), release_text, method.name)
        )
    body, index = places[0]
    body[index] = statement_at(upstream_text, body[index].lineno)


# --------------------------------------------------------------------------
# Prove


def _describe(attribute):
    code = getattr(attribute, "__code__", None)
    where = " from %s" % code.co_filename if isinstance(code, types.CodeType) else ""
    return "%s %s.%s%s" % (
        type(attribute).__name__,
        getattr(attribute, "__module__", "?"),
        getattr(attribute, "__qualname__", "?"),
        where,
    )


def wrapper_chain(attribute):
    """The attribute and what it calls below it through ``__wrapped__`` (wrapt's wrappers,
    ``functools.wraps`` decorators, SGLang's HookRegistry hooks). A plain function that declares
    ``__wrapped__`` but does not hold it in its closure (a HookRegistry REPLACE calls the plugin's
    function, not the one it names) ends the chain: what it names is never called."""
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


def _reaches(attribute, function):
    """Whether a call of the class attribute reaches ``function`` (it, or under wrappers that call it)."""
    return any(layer is function for layer in wrapper_chain(attribute))


def _same_file(left, right):
    try:
        return os.path.samefile(left, right)
    except (OSError, TypeError, ValueError):
        return False


def proof_problem(function, target, path, data, class_name, method_name):
    """None when ``function`` (what the class holds under ``method_name``) is SGLang's own function
    running the code a fresh compile of ``path`` (its bytes ``data``) gives, else why not."""
    if type(function) is not types.FunctionType or "__wrapped__" in getattr(function, "__dict__", {}):
        return "%s is not SGLang's function but %s (wrapped or replaced by someone else)" % (
            target,
            _describe(function),
        )
    code = function.__code__
    if code.co_name != method_name:
        return "%s holds function %r from %s (replaced by someone else)" % (target, code.co_name, code.co_filename)
    if not _same_file(code.co_filename, path):
        return "%s runs code compiled from %s, not from the installed %s" % (target, code.co_filename, path)
    try:
        fresh = method_code(fresh_module_code(data, code.co_filename), class_name, method_name, code.co_firstlineno)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
        return "%s cannot be compiled afresh: %s: %s" % (path, type(error).__name__, error)
    if fresh is None:
        return "a fresh compile of %s defines no %s (file changed since import?)" % (path, target)
    difference = code_difference(code, fresh)
    if difference:
        return (
            "%s is not the code a fresh compile of %s gives: %s differs (a stale .pyc, the file changed since "
            "import, or code changed by someone else)" % (target, path, difference)
        )
    return None


# --------------------------------------------------------------------------
# Edit and compile


def _live_method_node(tree, class_name, method_name, first_line):
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == method_name:
                    start = min([item.lineno] + [d.lineno for d in item.decorator_list])
                    if start == first_line:
                        return item
    return None


def _signature(code):
    count = code.co_argcount + code.co_kwonlyargcount
    count += bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)  # *args, **kwargs
    return (code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount, code.co_varnames[:count])


# The last file compiled afresh, by (path, bytes): the records of one module are put in force one
# after the other, each proving against the same file; the module's code (17 objects) stays, for
# apply() after remove(). Its syntax tree is shared only while ``source.remembering()`` is open
# (engine opens it for the records of one import): its thousands of nodes, all tracked by the
# garbage collector, would otherwise stay in every process that imported the backend (6,591
# objects for 0.5.12's file).
_last_compile = [None, None]


def parsed(path, data):
    """The file's syntax tree: the one its records were classified from while that is still open
    (``detect.shared_tree``), else parsed once per content while ``source.remembering()`` is open
    (else afresh). Never changed: an edit works on copies."""
    tree = detect.shared_tree(path, data)
    if tree is not None:
        return tree
    return source.remembered(("syntax tree", path, data), lambda: ast.parse(data, filename=path))


def fresh_module_code(data, filename):
    """``compile_module`` of the file's bytes, once per content."""
    if _last_compile[0] != (filename, data):
        _last_compile[:] = [(filename, data), compile_module(data, filename)]
    return _last_compile[1]


def _with_copies(tree, class_name, methods):
    """A module tree that shares every node of ``tree`` but the class ``class_name`` and its methods
    ``methods`` ({name: node of ``tree``}): copies, which an edit may change."""
    copies = {name: pickle.loads(pickle.dumps(node)) for name, node in methods.items()}  # a deep copy, in C
    body = []
    for statement in tree.body:
        if (
            isinstance(statement, ast.ClassDef)
            and statement.name == class_name
            and any(node in statement.body for node in methods.values())
        ):
            cls = copy.copy(statement)
            cls.body = [copies.get(n.name, n) if n in methods.values() else n for n in statement.body]
            statement = cls
        body.append(statement)
    return ast.Module(body=body, type_ignores=tree.type_ignores), copies


def edited_codes(path, data, class_name, plan):
    """Compile the file with the edits of ``plan`` ({method name: (original code, [(record, Edit),
    ...])}) applied, in order, to copies of its methods. Returns {method name: new code}. Raises
    NotEditable naming the record whose edit does not fit, or the check a new code object fails."""
    try:
        tree = parsed(path, data)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
        raise NotEditable("cannot parse %s: %s: %s" % (path, type(error).__name__, error)) from None
    nodes = {}
    for method_name, (original, _) in plan.items():
        nodes[method_name] = _live_method_node(tree, class_name, method_name, original.co_firstlineno)
        if nodes[method_name] is None:
            raise NotEditable(
                "%s.%s is not at line %d of %s" % (class_name, method_name, original.co_firstlineno, path)
            )
    module, copies = _with_copies(tree, class_name, nodes)
    shown = _Shown(data)
    for method_name, (_, edits) in plan.items():
        before = shown.before(copies[method_name])
        for record, edit in edits:
            try:
                edit.apply(copies[method_name], tree)
            except EditMismatch as mismatch:
                raise NotEditable("record %s's edit of %s does not fit this code: %s" % (record, method_name, mismatch))
        ast.fix_missing_locations(copies[method_name])
        shown.after(copies[method_name], before)
    try:
        module_code = compile_module(module, path)
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError) as error:
        raise NotEditable("the edited %s does not compile: %s: %s" % (path, type(error).__name__, error)) from None
    codes = {}
    for method_name, (original, _) in plan.items():
        code = method_code(module_code, class_name, method_name, original.co_firstlineno)
        if code is None or code.co_firstlineno != original.co_firstlineno:
            raise NotEditable("the edited %s.%s is not found where the original starts" % (class_name, method_name))
        if code.co_freevars != original.co_freevars:  # cells bind by position: the names must match
            raise NotEditable(
                "the edited %s.%s has free variables %s, the original %s"
                % (class_name, method_name, code.co_freevars, original.co_freevars)
            )
        if _signature(code) != _signature(original):
            raise NotEditable("the edited %s.%s changes the method's parameters" % (class_name, method_name))
        codes[method_name] = code
    # The edited code names a file of its own, the installed file's path with what it holds said
    # after it, whose lines in linecache are the file's with upstream's statements at theirs: a
    # traceback through an edited statement, inspect.getsource and pdb show the code that runs, not
    # the release's text at that line (issue 47, item 6).
    records = ", ".join(sorted({r for _, edits in plan.values() for r, _ in edits}))  # whatever order they came in
    filename = "%s (sglang-hotfix-trtllm: with upstream's change of record %s)" % (
        next(iter(plan.values()))[0].co_filename,
        records,
    )
    shown.register(filename)
    return {name: _named(code, filename) for name, code in codes.items()}


def _named(code, filename):
    """``code`` and every code object nested in it, compiled from ``filename``."""
    consts = tuple(_named(c, filename) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


class _Shown:
    """The text a traceback shows for edited code. Every statement an edit made or changed is put on
    its own first line (all its positions there), and that line's text becomes the statement as it
    runs (``ast.unparse``, one line; statements sharing a line joined with "; ", the release's
    statement that still starts there last); lines of the release's statements that no longer run are
    blank. Every other line is the file's own."""

    def __init__(self, data):
        self.lines = data.decode("utf-8", "replace").splitlines(True)
        self.written = {}  # line number -> [statement text, ...] of what the edits made there
        self.blank = set()
        self.kept = set()  # lines where a statement of the release still starts

    @staticmethod
    def _statements(method):
        return [s for body in statement_lists(method) for s in body]

    def before(self, method):
        return {id(s): (s, ast.unparse(s)) for s in self._statements(method)}

    def after(self, method, before):
        now = self._statements(method)
        present = {id(s) for s in now}
        changed = []
        for statement in now:
            old = before.get(id(statement))
            if old is None or (not _is_compound(statement) and ast.unparse(statement) != old[1]):
                changed.append(statement)
        inside = {id(n) for s in changed for n in ast.walk(s) if n is not s}
        changed = [s for s in changed if id(s) not in inside]  # a new compound statement is shown whole
        for statement, _ in before.values():
            if id(statement) not in present or statement in changed:
                self.blank.update(range(statement.lineno, (statement.end_lineno or statement.lineno) + 1))
        for statement in changed:
            line = statement.lineno
            text = " ".join(part.strip() for part in ast.unparse(statement).splitlines())
            for node in ast.walk(statement):
                if "lineno" in node._attributes:
                    node.lineno = node.end_lineno = line
                    node.col_offset, node.end_col_offset = 0, len(text)
            self.written.setdefault(line, []).append(text)
        self.blank.difference_update(self.written)
        self.kept |= {s.lineno for s in now if id(s) in before and s not in changed}

    def register(self, filename):
        lines = list(self.lines)
        for number in self.blank:
            if 0 < number <= len(lines):
                lines[number - 1] = "\n"
        for number, texts in self.written.items():
            original = lines[number - 1] if 0 < number <= len(lines) else ""
            indent = original[: len(original) - len(original.lstrip())]
            still = [original.strip()] if number in self.kept and original.strip() else []
            lines[number - 1] = indent + "; ".join(texts + still) + "\n"
        linecache.cache[filename] = (sum(map(len, lines)), None, lines, filename)


def _is_compound(statement):
    return any(isinstance(getattr(statement, field, None), list) for field in ("body", "orelse", "finalbody"))


def _rebound(function, module_globals):
    """``function`` with the module's globals (it reads the module's names as upstream's does)."""
    if function.__code__.co_freevars:  # a __class__ cell would hold a holder class, not SGLang's
        raise NotEditable("%s needs free variables %s" % (function.__name__, function.__code__.co_freevars))
    made = types.FunctionType(function.__code__, module_globals, function.__name__, function.__defaults__)
    made.__kwdefaults__, made.__annotations__ = function.__kwdefaults__, function.__annotations__
    made.__qualname__, made.__doc__ = function.__qualname__, function.__doc__
    made.__module__ = module_globals.get("__name__")
    return made


def _check_definition(new, statements, record):
    """One statement defining ``new.name`` and nothing else, of the kinds its scope allows."""
    (statement,) = statements if len(statements) == 1 else (None,)
    if isinstance(statement, ast.FunctionDef):
        plain = [ast.unparse(d) for d in statement.decorator_list] in ([], ["staticmethod"])
        if statement.name == new.name and plain and (new.scope == "class" or not statement.decorator_list):
            return
    elif new.scope == "module" and isinstance(statement, ast.Assign):
        names = [ast.unparse(t) for t in statement.targets]
        constants = all(isinstance(n, (ast.Constant, ast.BinOp, ast.operator)) for n in ast.walk(statement.value))
        if names == [new.name] and constants:
            return
    elif new.scope == "module" and isinstance(statement, ast.ImportFrom):
        aliases = [(a.name, a.asname) for a in statement.names]
        if aliases == [(new.name, None)] and statement.level == 0:
            if statement.module not in sys.modules:  # importing here could change SGLang's import order
                raise NotEditable(
                    "record %s: %s comes from %s, which is not imported yet" % (record, new.name, statement.module)
                )
            return
    raise NotEditable("record %s: the definition of %s is not one the mechanism adds" % (record, new.name))


# (file name, source) -> (the module whose globals it has, weakly; what was made): a record put in
# force again on the same module (apply() after remove()) adds the very object it added before,
# rather than making a new class and function each time.
_made = {}


def _made_name(cls, module, new, futures, record):
    """``_make_name``, once per module: the same object for the same definition and module."""
    where = cls.__name__ + "." if new.scope == "class" else ""
    filename = "<sglang-hotfix-trtllm: %s%s as in %s (record %s)>" % (where, new.name, new.origin, record)
    key = (filename, new.source, cls.__qualname__)
    kept = _made.get(key)
    if kept is not None and kept[0]() is module:
        return kept[1]
    value = _make_name(cls, vars(module), new, futures, record, filename)
    _made[key] = (weakref.ref(module), value)
    return value


def _make_name(cls, module_globals, new, futures, record, filename):
    """Upstream's definition ``new``, compiled under a file name that says whose it is (registered
    in ``linecache``: a traceback shows upstream's text): a method is compiled in a class named as
    SGLang's (qualified name and name mangling as upstream's)."""
    definition = ast.parse(new.source, filename=filename)
    _check_definition(new, definition.body, record)
    body = definition.body
    if new.scope != "class":
        futures = []  # compiled as upstream's own file compiles it (SGLang's utility modules have none)
    else:
        holder = ast.ClassDef(name=cls.__name__, bases=[], keywords=[], body=body, decorator_list=[])
        if "type_params" in ast.ClassDef._fields:
            holder.type_params = []
        body = [ast.copy_location(holder, body[0])]
    namespace = dict(module_globals)  # defaults and annotations read the module's names, as upstream's do
    exec(
        compile_module(ast.fix_missing_locations(ast.Module(body=futures + body, type_ignores=[])), filename), namespace
    )
    linecache.cache[filename] = (len(new.source), None, new.source.splitlines(True), filename)
    if new.scope == "module":
        value = namespace[new.name]
        return _rebound(value, module_globals) if isinstance(value, types.FunctionType) else value
    value = namespace[cls.__name__].__dict__[new.name]
    if isinstance(value, staticmethod):
        return staticmethod(_rebound(value.__func__, module_globals))
    return _rebound(value, module_globals)


# --------------------------------------------------------------------------
# Put in force, report, restore


def defining_class(module, class_name):
    """The class the module's source defines as ``class_name``, found from what the module binds
    under that name now: that class itself, or, where a subclass was put in its place (SGLang's
    HookRegistry REPLACE, a plugin), the first class of the subclass's MRO that the module defines
    under that name. None when the name is bound to nothing deriving from it."""
    bound = vars(module).get(class_name)
    for candidate in getattr(bound, "__mro__", ()) if isinstance(bound, type) else ():
        if candidate.__dict__.get("__module__") == module.__name__ and candidate.__qualname__ == class_name:
            return candidate
    return None


def _read(path):
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as error:
        raise NotEditable("cannot read %s: %s: %s" % (path, type(error).__name__, error)) from None


def put_in_force(record, module, class_name, path, edits, new_names=()):
    """Make the class's methods that ``edits`` name run their code with the edits of every record
    in force on them, this one's last. Returns "edited", or "already" when this record's code is
    what they run. Raises NotEditable, changing nothing, when a method is not proven to be the
    installed file's code (or the code this module installed), an edit does not fit, or a new
    name exists already."""
    with _lock:
        cls = defining_class(module, class_name)
        if cls is None:
            raise NotEditable(
                "%s.%s is %r, which does not derive from the class the module's source defines"
                % (module.__name__, class_name, vars(module).get(class_name))
            )
        methods, data = [], None
        for name in dict.fromkeys(edit.method for edit in edits):
            target = "%s.%s.%s" % (module.__name__, class_name, name)
            if name not in cls.__dict__:
                raise NotEditable("%s.%s does not define %s" % (module.__name__, class_name, name))
            function, state = cls.__dict__[name], _edited.get((cls, name))
            if state is not None:
                # Edited before: the class's attribute may be another patcher's wrapper put above since
                # (it calls SGLang's function, whose code this compile changes again).
                if not _reaches(function, state.function) or state.function.__code__ is not state.installed:
                    raise NotEditable(
                        "%s was changed by someone else after the hotfix edited it (%s)" % (target, _describe(function))
                    )
                methods.append((name, state))
                continue
            data = _read(path) if data is None else data
            # Under a wrapper put above it while the hotfix was in force (and left there by remove()):
            # the function this process edited before, found through the chain, is proven again.
            function = next(
                (layer for layer in wrapper_chain(function) if _known_functions.get(id(layer)) is layer), function
            )
            problem = proof_problem(function, target, path, data, class_name, name)
            if problem:
                raise NotEditable(problem)
            methods.append((name, EditedMethod(function, data)))
        # Every method is compiled from the one content that was proven (a method edited before keeps
        # the content its proof read: a file changed between two records cannot mix into one compile).
        contents = {state.data for _, state in methods if state.data is not None} | ({data} if data else set())
        if len(contents) != 1:
            raise NotEditable("%s changed between two records' edits of its methods" % path)
        (data,) = contents
        if all(record in state.records for _, state in methods):
            return "already"
        owners = {"class": cls.__dict__, "module": vars(module)}
        # A name the release binds by its own import of it is upstream's import already (0.5.17 on
        # import AttentionType): nothing to add. Any other name that exists is another value.
        new_names = [new for new in new_names if not (new.name in owners[new.scope] and _is_import(new))]
        taken = [
            new.name
            for new in new_names
            if new.name in owners[new.scope] and not _is_added(owners[new.scope], new.name)
        ]
        if taken:
            raise NotEditable(
                "%s or its class %s already has %s, which upstream's change adds (with another value here)"
                % (module.__name__, class_name, ", ".join(taken))
            )
        plan = {}
        for name, state in methods:
            records = [r for r in state.records if r != record] + [record]
            plan[name] = (state.original, [(r, e) for r in records for e in _edits_of(r, edits, state, name)])
        codes = edited_codes(path, data, class_name, plan)
        futures = _future_flags(parsed(path, data))
        made = [(new, _made_name(cls, module, new, futures, record)) for new in new_names]
        # Callees before callers: the new names first, then the code that calls them.
        for new, value in made:
            if new.name in owners[new.scope]:
                continue  # added by this record before (a re-apply)
            if new.scope == "class":
                setattr(cls, new.name, value)
                _added.append((weakref.ref(cls), new.name, value))
            else:
                vars(module)[new.name] = value
                _added.append((weakref.ref(module), new.name, value))
        for name, state in methods:
            state.installed = codes[name]
            state.function.__code__ = codes[name]
            _known_functions[id(state.function)] = state.function
            state.records = tuple(r for r in state.records if r != record) + (record,)
            state.edits[record] = [e for e in edits if e.method == name]
            _edited[(cls, name)] = state
        forget_compiled_graphs("record %s changed the code of %s" % (record, ", ".join(name for name, _ in methods)))
        return "edited"


def _edits_of(record, edits, state, method_name):
    if record in state.records:
        return state.edits.get(record, [])
    return [edit for edit in edits if edit.method == method_name]


def _is_import(new):
    return new.scope == "module" and new.source.lstrip().startswith("from ")


def _is_added(namespace, name):
    """Whether ``namespace`` (a class's or module's ``__dict__``) holds, under ``name``, what this
    module added there."""
    return any(
        ref() is not None and vars(ref()) is namespace and added == name and namespace.get(name) is value
        for ref, added, value in _added
    )


def in_force(record, cls, method_names):
    """True when every one of ``method_names`` of ``cls`` runs the code this module compiled with
    ``record``'s edits in it: a call of the class's attribute reaches SGLang's function (itself, or
    under wrappers that call it), and its code is still ours."""
    with _lock:
        for name in method_names:
            state = _edited.get((cls, name))
            if state is None or record not in state.records:
                return False
            if not _reaches(cls.__dict__.get(name), state.function) or state.function.__code__ is not state.installed:
                return False
        return True


# How many frames TorchDynamo had compiled when this module last reset it (its counters survive a reset).
_dynamo_frames_seen = [0]


def _compiled_frames():
    utils = sys.modules.get("torch._dynamo.utils")
    try:
        return sum(utils.counters["frames"].values()) if utils is not None else 0
    except Exception:  # another torch's counters: nothing known to be compiled
        return 0


def forget_compiled_graphs(why):
    """After a change of code a compiled graph may have inlined (pytorch/pytorch#197860: TorchDynamo
    does not guard an inlined method's code object): when TorchDynamo compiled anything since the last
    reset, reset it, so graphs are traced again from the code that runs now, and say so. Never raises."""
    frames = _compiled_frames()
    if frames <= _dynamo_frames_seen[0]:
        return False
    try:
        sys.modules["torch._dynamo"].reset()
    except Exception as error:
        say(
            logging.WARNING,
            "%s after TorchDynamo compiled %d frame(s), and its reset failed (%s: %s): compiled graphs may run the "
            "code from before",
            why,
            frames,
            type(error).__name__,
            error,
        )
        return False
    _dynamo_frames_seen[0] = frames
    say(
        logging.WARNING,
        "%s after TorchDynamo compiled %d frame(s): TorchDynamo was reset, so compiled graphs are traced again from "
        "the code that runs now (the first calls after this recompile)",
        why,
        frames,
    )
    return True


def remove_all():
    """Put back every original code object (by identity) and take away the names added; returns
    how many methods were restored. A method whose code someone changed after the hotfix is left
    as it is, with a warning."""
    restored = 0
    with _lock:
        for (cls, name), state in list(_edited.items()):
            target = "%s.%s" % (cls.__qualname__, name)
            if state.function.__code__ is state.installed:
                state.function.__code__ = state.original
                restored += 1
            else:
                say(
                    logging.WARNING,
                    "not restoring %s: its code was changed after the hotfix edited it (left as it is)",
                    target,
                )
        _edited.clear()
        if restored:
            forget_compiled_graphs(
                "sglang-hotfix-trtllm restored %d SGLang method(s) to their release's code" % restored
            )
        for owner_ref, name, value in reversed(_added):  # callers restored first, then their callees
            owner = owner_ref()
            if owner is not None and vars(owner).get(name) is value:
                delattr(owner, name)
        del _added[:]
    return restored


def put_record_in_force(hotfix, module, assessment):
    """``put_in_force`` for a record (``Hotfix.edits``) on the module whose file ``assessment`` read:
    "wrapped" (its code now runs) or "already", as ``patch.wrap`` answers for a wrapper."""
    if not assessment.source_path:
        raise NotEditable("%s has no source file to compile upstream's change from" % hotfix.module)
    cls = defining_class(module, hotfix.class_name)
    if cls is not None and not in_force(hotfix.name, cls, dict.fromkeys(e.method for e in hotfix.edits)):
        refuse_when_built_before(hotfix, cls)
    outcome = put_in_force(
        hotfix.name, module, hotfix.class_name, assessment.source_path, hotfix.edits, hotfix.new_names
    )
    return "wrapped" if outcome == "edited" else "already"


def refuse_when_built_before(hotfix, cls, built_under=()):
    """Raise NotEditable when the record repairs construction (it changes ``__init__``, by edit or
    wrapper) and objects of ``cls`` built by the release's ``__init__`` are alive: they keep what it
    made (pr25103: a draft's target pool; xqa_workspace: no fmha_v2 view, which upstream's
    ``forward_extend`` reads). Rather than say "patched" of a process that runs such objects (issue
    49, item 2), the record stands aside in it and says why; a process started with the hotfix
    installed builds none. An object counts as built under the record when it holds every one of
    ``Hotfix.made_at_construction`` (what upstream's edited ``__init__`` makes) or is in
    ``built_under`` (the objects a wrapper of ``__init__`` repaired: ``patch``)."""
    changes = [edit.method for edit in hotfix.edits] or list(hotfix.method_names)
    if "__init__" not in changes:
        return
    made = hotfix.made_at_construction

    def built_by_the_release(instance):
        if made and all(name in getattr(instance, "__dict__", {}) for name in made):
            return False
        try:
            return instance not in built_under
        except TypeError:  # not weakly referenceable, so never recorded
            return True

    built = sum(1 for instance in live_instances(cls) if built_by_the_release(instance))
    if built:
        raise NotEditable(
            "%d %s object(s) built before the record was in force are alive and keep what the release's __init__ "
            "made: the record stands aside in this process (start it with the hotfix installed)"
            % (built, hotfix.class_name)
        )


def live_instances(cls):
    """The live instances of ``cls`` (or a subclass). Asked once, when a record that changes
    ``__init__`` is put in force after its module was imported (a scan of the objects the garbage
    collector tracks; an instance refers to its class)."""
    import gc

    classes, stack = set(), [cls]
    while stack:
        current = stack.pop()
        if current not in classes:
            classes.add(current)
            stack.extend(type.__subclasses__(current))
    return [
        referrer for candidate in classes for referrer in gc.get_referrers(candidate) if type(referrer) is candidate
    ]


def edit_diff(hotfix, path):
    """What the record's edits change, as a unified diff per method of the installed file's source
    (as ``ast.unparse`` writes it) and the code the hotfix would run: for ``status --verbose``.
    Reads the file only; "" where the edits do not fit it (the verdict says why)."""
    import difflib

    try:
        with open(path, "rb") as handle:
            tree = ast.parse(handle.read(), filename=path)
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return ""
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == hotfix.class_name]
    if not classes:
        return ""
    texts = []
    for name in dict.fromkeys(edit.method for edit in hotfix.edits):
        nodes = [
            n for n in classes[-1].body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name
        ]
        if not nodes:
            return ""
        edited = pickle.loads(pickle.dumps(nodes[-1]))
        try:
            for edit in hotfix.edits:
                if edit.method == name:
                    edit.apply(edited, tree)
        except EditMismatch:
            return ""
        before = ast.unparse(nodes[-1]).splitlines()
        after = ast.unparse(ast.fix_missing_locations(edited)).splitlines()
        texts += difflib.unified_diff(
            before,
            after,
            "%s.%s (SGLang's, %s)" % (hotfix.class_name, name, path),
            "%s.%s (as the hotfix runs it: %s)" % (hotfix.class_name, name, hotfix.upstream),
            n=1,
            lineterm="",
        )
    return "\n".join(texts)


def record_in_force(hotfix, cls):
    """``in_force`` for a record: every method its edits name runs its code."""
    return in_force(hotfix.name, cls, dict.fromkeys(edit.method for edit in hotfix.edits))
