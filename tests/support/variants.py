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
        i
        for i, s in enumerate(body)
        if isinstance(s, ast.Assign) and ast.unparse(s.targets[0]) == "metadata.cache_seqlens_int32"
    )


def with_extra_write(source_text, statement="metadata.cache_seqlens_int32.fill_(1)", offset=1):
    """Additional statement(s) in the draft-decode branch, ``offset`` after the
    binding (1: right after it; 0: right before it)."""

    def change(method):
        body = _draft_decode_body(method)
        index = _binding_index(body) + offset
        body[index:index] = ast.parse(statement).body

    return _edit(source_text, change)


# Writes into the buffer by routes other than `copy_` on the bound name: each
# must make the verdict unknown (the wrapper would otherwise add a second write).
OTHER_WRITES = {
    "alias_of_view": "lens = metadata.cache_seqlens_int32\nlens.add_(1)",
    "alias_of_buffer": "buf = self.decode_cuda_graph_metadata['cache_seqlens']\nbuf[:bs] += 1",
    "alias_of_dict": "table = self.decode_cuda_graph_metadata\ntable['cache_seqlens'][:bs].copy_(seq_lens)",
    "through_data": "metadata.cache_seqlens_int32.data.copy_(seq_lens + self.speculative_step_id + 1)",
    "slice_assignment": "metadata.cache_seqlens_int32[:] = seq_lens + self.speculative_step_id + 1",
    "out_keyword": "torch.add(seq_lens, self.speculative_step_id + 1, out=metadata.cache_seqlens_int32)",
    "passed_to_a_call": "fill_lengths(metadata.cache_seqlens_int32, seq_lens)",
    "unknown_helper": "self._fill_lengths(metadata, seq_lens)",
    "similar_not_upstream": "metadata.cache_seqlens_int32.copy_(seq_lens + self.speculative_step_id)",
    "upstream_in_dead_branch": "if False:\n    metadata.cache_seqlens_int32.copy_(seq_lens + self.speculative_step_id + 1)",  # noqa: E501 (verbatim data)
}


def _class_and_method(tree):
    cls = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == CLASS_NAME][-1]
    method = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == METHOD_NAME][-1]
    return cls, method


def with_method_defined_twice(source_text, live):
    """The class body defines the method twice; ``live`` ("buggy" or "fixed")
    says which version is the second, the one Python binds."""
    fixed = _class_and_method(ast.parse(fixed_source_text(source_text)))[1]
    tree = ast.parse(source_text)
    cls, buggy = _class_and_method(tree)
    index = cls.body.index(buggy)
    cls.body[index : index + 1] = [fixed, buggy] if live == "buggy" else [buggy, fixed]
    return ast.unparse(ast.fix_missing_locations(tree))


def with_class_defined_twice(source_text, live):
    """The module defines the class twice; ``live`` says which version comes last."""
    fixed_cls = _class_and_method(ast.parse(fixed_source_text(source_text)))[0]
    tree = ast.parse(source_text)
    cls = _class_and_method(tree)[0]
    index = tree.body.index(cls)
    tree.body[index : index + 1] = [fixed_cls, cls] if live == "buggy" else [cls, fixed_cls]
    return ast.unparse(ast.fix_missing_locations(tree))


def with_module_statement(source_text, statement):
    """A statement appended to the module (after every definition)."""
    tree = ast.parse(source_text)
    tree.body.extend(ast.parse(statement).body)
    return ast.unparse(ast.fix_missing_locations(tree))


def with_class_statement(source_text, statement):
    """A statement appended to the class body (after the method)."""
    tree = ast.parse(source_text)
    _class_and_method(tree)[0].body.extend(ast.parse(statement).body)
    return ast.unparse(ast.fix_missing_locations(tree))


# Ways the live method may not be the one defined: each must be unknown.
REBINDINGS = {
    "method_rebound_in_class": lambda t: with_class_statement(
        t, "init_forward_metadata_capture_cuda_graph = init_forward_metadata_replay_cuda_graph"
    ),
    "attribute_store_in_module": lambda t: with_module_statement(
        t,
        "TRTLLMHAAttnBackend.init_forward_metadata_capture_cuda_graph = TRTLLMHAAttnBackend.init_forward_metadata_replay_cuda_graph",  # noqa: E501 (verbatim data)
    ),
    "setattr_by_name": lambda t: with_module_statement(
        t,
        "setattr(TRTLLMHAAttnBackend, 'init_forward_metadata_capture_cuda_graph', TRTLLMHAAttnBackend.init_forward_metadata_replay_cuda_graph)",  # noqa: E501 (verbatim data)
    ),
    "class_rebound_conditionally": lambda t: with_module_statement(
        t, "if __debug__:\n    class TRTLLMHAAttnBackend(TRTLLMHAAttnBackend):\n        pass"
    ),
    "class_rebound_by_assignment": lambda t: with_module_statement(
        t, "TRTLLMHAAttnBackend = TRTLLMHAAttnMultiStepDraftBackend"
    ),
    "class_decorated": lambda t: with_module_statement(
        t, "@staticmethod\nclass TRTLLMHAAttnBackend(TRTLLMHAAttnBackend):\n    pass"
    ),
}


def with_write_after_use(source_text):
    """Upstream's statement, but placed at the end of the branch (too late)."""

    def change(method):
        body = _draft_decode_body(method)
        body.insert(
            len(body) - 1,
            ast.parse("metadata.cache_seqlens_int32.copy_(seq_lens + self.speculative_step_id + 1)").body[0],
        )

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
