"""Fingerprint of a function's code that ignores formatting and comments.

Standard library only. The fingerprint is a hash of a canonical walk of the
AST, not of ``ast.dump``: ``ast.dump`` changed its output in Python 3.13
(optional fields left out) and new Pythons add fields (``type_params`` in
3.12), which would give one source different fingerprints on different
Pythons. Here, fields that are None or empty are skipped and expression
contexts are ignored, so the same source has the same fingerprint on every
supported Python. Docstrings are dropped: they are documentation, not code.
"""

import ast
import hashlib

PREFIX = "ast1:"


def is_docstring(node):
    """True for a statement that is a docstring (a bare string expression)."""
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _canonical(node, out):
    if isinstance(node, ast.AST):
        out.append(type(node).__name__)
        out.append("(")
        for field in node._fields:
            if field in ("ctx", "type_comment", "kind"):
                continue
            value = getattr(node, field, None)
            if value is None or value == []:
                continue
            if field == "body" and isinstance(value, list) and value and is_docstring(value[0]):
                value = value[1:]
            out.append(field)
            out.append("=")
            _canonical(value, out)
            out.append(",")
        out.append(")")
    elif isinstance(node, list):
        out.append("[")
        for item in node:
            _canonical(item, out)
            out.append(",")
        out.append("]")
    else:
        out.append(repr(node))


def of_node(node):
    """Fingerprint of an AST node, e.g. a ``FunctionDef``: ``ast1:`` + 16 hex digits."""
    parts = []
    _canonical(node, parts)
    return PREFIX + hashlib.sha256("".join(parts).encode("utf-8")).hexdigest()[:16]
