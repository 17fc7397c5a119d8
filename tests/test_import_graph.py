"""Issue 38 item 4: the mechanism does not know its records. The package's own imports (at the top
of a module or inside a function, read from the installed source) form no cycle, and the modules
that apply and report records (``patch``, ``detect``, ``record``, ``logs``) import nothing under
``records``: records hand in what the mechanism needs (their order is the order they are applied,
their ``Hotfix`` objects travel with the joined wrapper)."""

import ast
import pathlib

import sglang_hotfix_trtllm

ROOT = pathlib.Path(sglang_hotfix_trtllm.__file__).resolve().parent
PACKAGE = "sglang_hotfix_trtllm"
MECHANISM = ("patch", "code_edit", "detect", "record", "logs", "fingerprint", "source", "release_table")


def _modules():
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = (PACKAGE,) + path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imports(name, path, modules):
    """The package's modules ``path`` imports, anywhere in it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(max(node.level - 1, 0)):
                base = base.rpartition(".")[0]
            module = node.module if not node.level else (base + "." + node.module if node.module else base)
            for alias in node.names:
                full = "%s.%s" % (module, alias.name)
                out.add(full if full in modules else module)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    return {m for m in out if m in modules and m != name}


def _graph():
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycle(graph):
    """One cycle of the graph as a list of modules, or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_packages_imports_form_no_cycle():
    graph = _graph()
    assert len(graph) > 20 and graph["%s.engine" % PACKAGE]  # the graph is read (not empty)
    assert _cycle(graph) is None


def test_the_check_finds_a_cycle_where_there_is_one():
    graph = _graph()
    graph["%s.code_edit" % PACKAGE] = graph["%s.code_edit" % PACKAGE] | {"%s.records.catalog" % PACKAGE}
    assert _cycle(graph) is not None  # the records import code_edit: code_edit reading the catalog closes a circle


def test_the_mechanism_imports_no_record():
    graph = _graph()
    for name in MECHANISM:
        imported = graph["%s.%s" % (PACKAGE, name)]
        assert not [m for m in imported if m.startswith(PACKAGE + ".records")], name
