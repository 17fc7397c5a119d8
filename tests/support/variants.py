"""Hand-made variants of a real ``trtllm_mha_backend.py`` source.

Each takes the installed (or downloaded) source text and returns a modified
module source. They are built on the AST so they apply to every release.
"""

import ast

from upstream_fix import CLASS_NAME, METHOD_NAME, _draft_decode_body, fixed_source_text  # noqa: F401


def _edit(source_text, change):
    tree = ast.parse(source_text)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == CLASS_NAME)
    method = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == METHOD_NAME)
    change(method)
    return ast.unparse(ast.fix_missing_locations(tree))


def _binding_index(body):
    return next(
        i for i, s in enumerate(body)
        if isinstance(s, ast.Assign) and ast.unparse(s.targets[0]) == "metadata.cache_seqlens_int32"
    )


def with_extra_write(source_text, statement="metadata.cache_seqlens_int32.fill_(1)"):
    """An additional write into the buffer right after it is bound."""
    def change(method):
        body = _draft_decode_body(method)
        body.insert(_binding_index(body) + 1, ast.parse(statement).body[0])
    return _edit(source_text, change)


def with_write_after_use(source_text):
    """Upstream's statement, but placed at the end of the branch (too late)."""
    def change(method):
        body = _draft_decode_body(method)
        body.insert(len(body) - 1, ast.parse("metadata.cache_seqlens_int32.copy_(seq_lens + self.speculative_step_id + 1)").body[0])
    return _edit(source_text, change)


def with_renamed_key(source_text):
    """The draft-decode branch binds another buffer key."""
    def change(method):
        body = _draft_decode_body(method)
        binding = body[_binding_index(body)]
        for node in ast.walk(binding):
            if isinstance(node, ast.Constant) and node.value == "cache_seqlens":
                node.value = "cache_seqlens_draft"
    return _edit(source_text, change)


def without_draft_branch(source_text):
    """The decode branch no longer splits on spec_info: only normal decode remains."""
    def change(method):
        for statement in method.body:
            if isinstance(statement, ast.If) and "is_decode_or_idle" in ast.unparse(statement.test):
                statement.body = statement.body[0].orelse
                return
    return _edit(source_text, change)


def reformatted(source_text):
    """Same code, other formatting, no comments."""
    return ast.unparse(ast.parse(source_text))
