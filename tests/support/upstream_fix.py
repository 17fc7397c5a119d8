"""The oracle: the installed SGLang method with upstream's own fix inserted.

SGLang PR #26521 adds one statement right after the draft-decode branch binds
the ``cache_seqlens`` buffer. This module takes the *installed* source of
``TRTLLMHAAttnBackend.init_forward_metadata_capture_cuda_graph``, inserts that
statement there, and compiles the result with the module's own globals. It
shares no code with the plugin's detector on purpose: the oracle must not
inherit the plugin's mistakes.
"""

import ast

# The statement PR #26521 adds, verbatim.
UPSTREAM_STATEMENT = "metadata.cache_seqlens_int32.copy_(seq_lens + self.speculative_step_id + 1)"
CLASS_NAME = "TRTLLMHAAttnBackend"
METHOD_NAME = "init_forward_metadata_capture_cuda_graph"


def _draft_decode_body(method):
    for statement in method.body:
        if isinstance(statement, ast.If) and "is_decode_or_idle" in ast.unparse(statement.test):
            inner = statement.body[0]
            assert isinstance(inner, ast.If) and ast.unparse(inner.test) == "spec_info is not None"
            return inner.body
    raise AssertionError("no draft-decode branch in %s" % METHOD_NAME)


def insert_upstream_fix(source_text):
    """Return (module AST holding only the fixed method, its line)."""
    tree = ast.parse(source_text)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == CLASS_NAME)
    method = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == METHOD_NAME)
    body = _draft_decode_body(method)
    index = next(
        i
        for i, s in enumerate(body)
        if isinstance(s, ast.Assign)
        and ast.unparse(s.targets[0]) == "metadata.cache_seqlens_int32"
        and "'cache_seqlens'" in ast.unparse(s.value)
    )
    statement = ast.parse(UPSTREAM_STATEMENT).body[0]
    ast.copy_location(statement, body[index])
    body.insert(index + 1, statement)
    return tree, method


def fixed_source_text(source_text):
    """The whole module source with the upstream statement inserted (for files on disk)."""
    tree, _ = insert_upstream_fix(source_text)
    return ast.unparse(tree)


def upstream_fixed_method(module):
    """The module's method, fixed as upstream fixed it, as a plain function
    compiled from the module's own source file with the module's globals."""
    with open(module.__file__, encoding="utf-8") as handle:
        tree, method = insert_upstream_fix(handle.read())
    # Keep the module's `from __future__ import annotations`, as the original was compiled with it.
    futures = [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "__future__"]
    body = futures + [method]
    code = compile(
        ast.fix_missing_locations(ast.Module(body=body, type_ignores=[])), module.__file__, "exec", dont_inherit=True
    )
    namespace = {}
    exec(code, vars(module), namespace)
    return namespace[METHOD_NAME]
