"""AST mutants of chosen methods of a real module source, for mutation-testing
a record's verdict.

``generate(text, class_name, method_names, writes)`` yields ``Mutant`` objects,
in a fixed order: for each method of ``method_names`` that the (last, top-level)
class ``class_name`` defines, every statement position at every nesting depth
gets each operator below, then every expression node of the method gets the
expression operators. Each mutant is the whole module text with only that one
method rewritten (``ast.unparse`` of the mutated method, spliced over the
method's lines: every other line of the file is kept as it is).

Statement operators (every body: ``body``, ``orelse``, ``finalbody``, the
bodies of ``except`` handlers and ``match`` cases):

* ``drop``: the statement removed (``pass`` in its place if the body would be empty);
* ``swap``: the statement exchanged with the next one of the same body;
* ``dup``: the statement repeated right after itself;
* ``negate``: an ``if``/``while`` test (and a conditional expression's) as ``not (...)``;
* ``write``: one of ``writes`` (name -> statement text) inserted after the
  statement; ``write_first`` inserts it at the start of a body (after the
  docstring in the method's own body).

Expression operators: ``const`` (ints and floats + 1, strings get ``_x``
appended, ``True``/``False`` swapped, ``None`` becomes ``True``) on every
constant except the docstring, including parameter defaults; ``attr`` (``_x``
appended to the name) on every attribute.

The method's docstring is not mutated itself (it is documentation: fingerprints
and classifiers drop it). Mutants whose method does not compile are skipped,
as are mutants whose text equals the original or an earlier mutant's.

A mutant's id reads ``method:operator@L<line>[:detail]``, ``line`` being the
line of the mutated statement or node in the original file (``#2``... when one
id would repeat). ``before`` and ``after`` hold the mutated statement's first
line before and after the mutation, for reports.
"""

import ast
import copy
import pickle

STATEMENT_LISTS = ("body", "orelse", "finalbody")


class Mutant:
    __slots__ = ("id", "method", "operator", "line", "before", "after", "text", "_tree")

    def __init__(self, id, method, operator, line, before, after, text, tree):
        self.id, self.method, self.operator, self.line = id, method, operator, line
        self.before, self.after, self.text, self._tree = before, after, text, tree

    def tree(self):
        """``ast.parse(self.text)``, equal to it field for field and position for position, made
        without parsing the whole file: the unmutated module's nodes (line numbers after the method
        moved by its change in length) around the mutated method parsed alone. A fresh module and
        class node each call; the other nodes are shared between mutants, so a caller must not
        change the tree. Parsing the whole mutant was two thirds of a mutation test's time."""
        return self._tree()

    def describe(self):
        return "%s: `%s` -> `%s`" % (self.id, self.before, self.after)

    def __repr__(self):
        return "Mutant(%s)" % self.id


def methods(tree, class_name, method_names):
    """(name, FunctionDef) of each name the last top-level class ``class_name`` defines (its last definition)."""
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name]
    if not classes:
        return []
    found = []
    for name in method_names:
        defs = [n for n in classes[-1].body if isinstance(n, ast.FunctionDef) and n.name == name]
        if defs:
            found.append((name, defs[-1]))
    return found


def _is_docstring(statement):
    return (
        isinstance(statement, ast.Expr)
        and isinstance(statement.value, ast.Constant)
        and isinstance(statement.value.value, str)
    )


def _first_line(node):
    text = ast.unparse(node).split("\n")[0]
    return text if len(text) <= 160 else text[:157] + "..."


# --------------------------------------------------------------------------
# Addressing nodes: a path of (field, index) steps from the method, so that the
# same site can be found again in a fresh copy of the method.


def _get(root, path):
    node = root
    for field, index in path:
        node = getattr(node, field)
        if index is not None:
            node = node[index]
    return node


def _walk(node, path=()):
    """(path, node) of every AST node under ``node``, pre-order, fields in declaration order."""
    yield path, node
    for field in node._fields:
        value = getattr(node, field, None)
        if isinstance(value, ast.AST):
            yield from _walk(value, path + ((field, None),))
        elif isinstance(value, list):
            for index, item in enumerate(value):
                if isinstance(item, ast.AST):
                    yield from _walk(item, path + ((field, index),))


def _statement_lists(function):
    """(path of the owner, field, statements) of every statement list in the method, pre-order."""
    for path, node in _walk(function):
        for field in STATEMENT_LISTS:
            value = getattr(node, field, None)
            if isinstance(value, list) and value and all(isinstance(s, ast.stmt) for s in value):
                yield path, field, value


def _enclosing_statement(function, path):
    """The innermost statement on ``path`` (the statement a node belongs to)."""
    statement = None
    for depth in range(len(path) + 1):
        node = _get(function, path[:depth])
        if isinstance(node, ast.stmt):
            statement = node
    return statement


def _constant_change(value):
    if isinstance(value, bool):
        return not value
    if value is None:
        return True
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value + 1.0
    if isinstance(value, str):
        return value + "_x" if value else "x"
    return NotImplemented  # bytes, Ellipsis, complex: left alone


# --------------------------------------------------------------------------
# Edits: each takes a fresh copy of the method and changes it in place;
# returns (line, before, after) for the report.


def _body_edit(owner_path, field, index, operator, statement_text=None):
    def edit(function):
        body = getattr(_get(function, owner_path), field)
        if operator == "drop":
            removed = body.pop(index)
            if not body:
                body.append(ast.copy_location(ast.Pass(), removed))
            return removed.lineno, _first_line(removed), "(dropped)"
        if operator == "swap":
            first, second = body[index], body[index + 1]
            body[index], body[index + 1] = second, first
            return first.lineno, _first_line(first), "(after) " + _first_line(second)
        if operator == "dup":
            body.insert(index + 1, _copied(body[index]))
            return body[index].lineno, _first_line(body[index]), "(twice) " + _first_line(body[index])
        if operator in ("write", "write_first"):
            new = ast.parse(statement_text).body
            anchor = body[index - 1] if operator == "write" else body[index]
            for statement in new:
                ast.copy_location(statement, anchor)
            body[index:index] = new
            return (
                anchor.lineno,
                _first_line(anchor),
                ("(then) " if operator == "write" else "(before it) ") + statement_text,
            )
        raise ValueError(operator)

    return edit


def _node_edit(path, operator):
    def edit(function):
        node = _get(function, path)
        statement = _enclosing_statement(function, path)
        before = _first_line(statement)
        if operator == "negate":
            node.test = ast.copy_location(ast.UnaryOp(op=ast.Not(), operand=node.test), node.test)
        elif operator == "const":
            node.value = _constant_change(node.value)
        elif operator == "attr":
            node.attr += "_x"
        else:
            raise ValueError(operator)
        return getattr(node, "lineno", statement.lineno), before, _first_line(statement)

    return edit


def _sites(function, writes):
    """(operator, detail, edit) of every mutation of the method, in a fixed order."""
    docstring = function.body[0] if function.body and _is_docstring(function.body[0]) else None
    sites = []
    for owner_path, field, body in _statement_lists(function):
        own_body = owner_path == () and field == "body"
        start = 1 if own_body and docstring is not None else 0
        for name, statement in writes.items():
            sites.append(("write_first", name, _body_edit(owner_path, field, start, "write_first", statement)))
        for index in range(start, len(body)):
            sites.append(("drop", "", _body_edit(owner_path, field, index, "drop")))
            if index + 1 < len(body):
                sites.append(("swap", "", _body_edit(owner_path, field, index, "swap")))
            sites.append(("dup", "", _body_edit(owner_path, field, index, "dup")))
            for name, statement in writes.items():
                sites.append(("write", name, _body_edit(owner_path, field, index + 1, "write", statement)))
    for path, node in _walk(function):
        if docstring is not None and path[:1] == (("body", 0),):
            continue  # the docstring and its constant
        if isinstance(node, (ast.If, ast.While, ast.IfExp)):
            sites.append(("negate", "", _node_edit(path, "negate")))
        elif isinstance(node, ast.Constant) and _constant_change(node.value) is not NotImplemented:
            sites.append(("const", repr(node.value)[:30], _node_edit(path, "const")))
        elif isinstance(node, ast.Attribute):
            sites.append(("attr", node.attr, _node_edit(path, "attr")))
    return sites


# --------------------------------------------------------------------------
# Putting a mutated method back into the file


def _method_text(function, indent):
    """The method's source at ``indent`` columns (nested in placeholder classes,
    so ast.unparse indents it and leaves string literals as they are)."""
    assert indent % 4 == 0, indent
    node = function
    for _ in range(indent // 4):
        node = ast.ClassDef(name="_", bases=[], keywords=[], body=[node], decorator_list=[])
        if "type_params" in ast.ClassDef._fields:
            node.type_params = []
    lines = ast.unparse(ast.fix_missing_locations(ast.Module(body=[node], type_ignores=[]))).split("\n")
    return "\n".join(lines[indent // 4 :])


def _compiled(method_text, indent):
    """The method's node parsed from ``method_text`` (below ``indent // 4`` placeholder class lines),
    or None when the method does not compile."""
    placeholder = "".join("%sclass _:\n" % ("    " * depth) for depth in range(indent // 4))
    try:
        module = ast.parse(placeholder + method_text + "\n", "<mutant>")
        compile(module, "<mutant>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return None
    node = module.body[0]
    for _ in range(indent // 4):
        node = node.body[0]
    return node  # its first line at line indent // 4 + 1 (below the placeholder classes)


class _Splicer:
    """Module trees of one source with one method of its class replaced (``Mutant.tree``)."""

    def __init__(self, tree, class_index, function):
        self.tree, self.class_index = tree, class_index
        self.method_index = tree.body[class_index].body.index(function)
        self.start = min([function.lineno] + [d.lineno for d in function.decorator_list])
        self.end = function.end_lineno
        self.around = {}  # change in length -> the module with every position after the method moved

    def _moved(self, delta):
        if delta not in self.around:
            moved = _copied(self.tree)
            if delta:
                for node in ast.walk(moved):
                    if getattr(node, "lineno", None) is not None and node.lineno > self.end:
                        node.lineno += delta
                    end = getattr(node, "end_lineno", None)
                    if end is not None and (end > self.end or (end == self.end and node.lineno < self.start)):
                        node.end_lineno += delta  # after the method, or around it (its class)
            self.around[delta] = moved
        return self.around[delta]

    def maker(self, method_node, line_count, placeholder_lines):
        """A function making the module with ``method_node`` (its first line at line
        ``placeholder_lines + 1``, ``line_count`` lines long) in the method's place."""

        ast.increment_lineno(method_node, self.start - 1 - placeholder_lines)  # one walk of the method
        delta = line_count - (self.end - self.start + 1)

        def make():
            around = self._moved(delta)
            cls = copy.copy(around.body[self.class_index])
            cls.body = list(cls.body)
            cls.body[self.method_index] = method_node
            if self.tree.body[self.class_index].end_lineno == self.end:  # the class ends where the method does
                cls.end_col_offset = method_node.end_col_offset
            body = list(around.body)
            body[self.class_index] = cls
            return ast.Module(body=body, type_ignores=[])

        return make


def _copied(node):
    """A deep copy of ``node``: through pickle, several times faster than ``copy.deepcopy`` for a
    syntax tree (a method's copy per mutant was a quarter of a mutation test's time)."""
    return pickle.loads(pickle.dumps(node))


def generate(text, class_name, method_names, writes):
    """Every mutant of the methods ``method_names`` of ``class_name`` in module
    source ``text``; ``writes``: name -> statement text for ``write`` mutants."""
    tree = ast.parse(text)
    lines = text.split("\n")
    seen = set()
    ids = set()
    classes = [i for i, n in enumerate(tree.body) if isinstance(n, ast.ClassDef) and n.name == class_name]
    for name, function in methods(tree, class_name, method_names):
        splicer = _Splicer(tree, classes[-1], function)
        start = min([function.lineno] + [d.lineno for d in function.decorator_list]) - 1
        head, tail = "\n".join(lines[:start]), "\n".join(lines[function.end_lineno :])
        # The method unmutated, as ast.unparse writes it: a mutant equal to it changes nothing.
        seen.add(head + "\n" + _method_text(function, function.col_offset) + "\n" + tail)
        for operator, detail, edit in _sites(function, writes):
            mutated = _copied(function)
            line, before, after = edit(mutated)
            method_text = _method_text(mutated, function.col_offset)
            node = _compiled(method_text, function.col_offset)
            if node is None:
                continue
            mutant_text = head + "\n" + method_text + "\n" + tail
            if mutant_text in seen:
                continue
            seen.add(mutant_text)
            base = "%s:%s@L%d%s" % (name, operator, line, ":" + detail if detail else "")
            mutant_id, n = base, 1
            while mutant_id in ids:
                n += 1
                mutant_id = "%s#%d" % (base, n)
            ids.add(mutant_id)
            tree_of = splicer.maker(node, method_text.count("\n") + 1, function.col_offset // 4)
            yield Mutant(mutant_id, name, operator, line, before, after, mutant_text, tree_of)
