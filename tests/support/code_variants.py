"""Hand-made variants of SGLang's backend module, as edits of its syntax tree (``edit(tree)``),
for the verdicts of the records that edit ``forward_decode`` and ``forward_extend``.

``OUTSIDE_THE_EDITED_METHODS``: code other than the edited methods that reaches FlashInfer's
kernels, or changes what those methods call. Until 0.14.0 a gate on the module's ``flashinfer``
had to see every kernel call, and each of these was refused as a route around it (issue 28); a
record that runs upstream's code changes only its methods' statements, so each is repaired, and
must be repaired exactly: equal to upstream's change applied to the variant (``test_mutants``).
"""

import ast

CLASS_NAME = "TRTLLMHAAttnBackend"
DECODE_KERNEL = "trtllm_batch_decode_with_kv_cache"


def method(tree, name):
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == CLASS_NAME)
    return next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name)


def _class(tree):
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == CLASS_NAME)


def append_to(method_name, statement):
    def edit(tree):
        method(tree, method_name).body.append(ast.parse(statement).body[0])

    return edit


def upstream_helper_added(tree):
    """A ``_get_bmm_scales`` of the class that is not 0.5.14's: the name pr28144 adds, taken."""
    _class(tree).body.append(ast.parse("def _get_bmm_scales(self, layer, q_scale):\n    return (1.0, 1.0)").body[0])


def upstream_helper_changed(tree):
    """0.5.14's ``_get_bmm_scales`` with a statement more: fixed no more, unknown."""
    method(tree, "_get_bmm_scales").body.insert(0, ast.parse("layer = layer").body[0])


def _helper_calling_a_kernel(tree):
    _class(tree).body.append(
        ast.parse("def _other(self, **kw):\n    return flashinfer.decode.%s(**kw)" % DECODE_KERNEL).body[0]
    )


def _rebinding_flashinfer_after_the_class(tree):
    tree.body.append(ast.parse("flashinfer = None").body[0])


def _aliased_import(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "flashinfer":
                    alias.asname = "fi"
    tree.body.append(ast.parse("flashinfer = fi").body[0])


def _helper_reaching_the_kernel_by_a_computed_name(tree):
    probe = "getattr(flashinfer.decode, 'trtllm_batch_%s_with_kv_cache' % 'decode')"
    method(tree, "_get_layer_page_table").body.insert(0, ast.parse("_ = " + probe).body[0])


def _earlier_definition_kept_callable(tree):
    """An earlier ``def forward_decode`` that Python replaces, kept callable under another name."""
    cls = _class(tree)
    live = method(tree, "forward_decode")
    index = cls.body.index(live)
    cls.body.insert(index, ast.parse("_kept = forward_decode").body[0])
    cls.body.insert(index, ast.parse(ast.unparse(live)).body[0])


def _method_importing(statement):
    def edit(tree):
        _class(tree).body.append(ast.parse("def _route(self):\n    %s\n    return None" % statement).body[0])

    return edit


def _helper_changed(tree):
    method(tree, "_should_use_fused_fp8_path").body.insert(0, ast.parse("k = k").body[0])


OUTSIDE_THE_EDITED_METHODS = {
    "a_helper_reaching_the_kernel_by_a_computed_name": _helper_reaching_the_kernel_by_a_computed_name,
    "an_earlier_definition_kept_callable": _earlier_definition_kept_callable,
    "a_helper_the_methods_call_changed": _helper_changed,
    "a_helper_names_a_kernel": _helper_calling_a_kernel,
    "flashinfer_bound_again": _rebinding_flashinfer_after_the_class,
    "flashinfer_imported_under_another_name": _aliased_import,
    # FlashInfer is not installed on the CPU: imports of it inside a method, which runs only if called.
    "a_kernel_imported_by_alias": _method_importing("from flashinfer.decode import %s as k" % DECODE_KERNEL),
    "a_kernel_submodule_imported_as": _method_importing("import flashinfer.decode as fd"),
}
