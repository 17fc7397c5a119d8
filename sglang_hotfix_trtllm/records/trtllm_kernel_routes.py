"""What the records of FlashInfer's kernel call site (``trtllm_kernel_site``) check of the backend
module before they patch it: the gate must see every kernel call the wrapped methods prepare,
and only those. Standard library only.

* ``flashinfer_problem``: the module binds ``flashinfer`` once, by ``import flashinfer``;
* ``kernel_route_problem``: no code outside the wrapped methods reaches ``flashinfer`` or names a
  kernel, and nothing binds a kernel or its submodule by import (alias, star, submodule);
* ``helpers_problem``: every method of the class the wrapped methods call is a known release's.
"""

import ast
import weakref

from ..fingerprint import of_node

CLASS_NAME = "TRTLLMHAAttnBackend"
MODULE = "sglang.srt.layers.attention.trtllm_mha_backend"
GATED_GLOBAL = "flashinfer"  # the module global through which the backend reaches FlashInfer's kernels
KERNELS = {"decode": "trtllm_batch_decode_with_kv_cache", "prefill": "trtllm_batch_context_with_kv_cache"}


# tree -> {check: answer}: the records of this site ask the two whole-module walks of one parse with
# the same methods (``status`` and the import hook classify every record from one tree); held
# weakly, so a tree the analysis dropped is not kept alive here.
_answers = weakref.WeakKeyDictionary()


def problem(tree, cls, live, methods, helpers):
    """The first problem of the three, or None."""
    answers = _answers.setdefault(tree, {})
    key = tuple(id(method) for method in methods)  # nodes of ``tree``: alive, so unique, while it is
    if key not in answers:
        answers[key] = flashinfer_problem(tree) or kernel_route_problem(tree, methods)
    return answers[key] or helpers_problem(cls, methods, live, helpers)


def module_bindings(tree, name, nodes=None):
    """(problem, imports): a problem when something other than an import binds the global
    ``name`` (an assignment, ``global``/``nonlocal``, a definition), else None and every
    (import node, alias) that binds it. What the gates of this module's globals need to know:
    the global they replace is bound by imports only. ``nodes``: the tree's, walked already."""
    imports = []
    for node in ast.walk(tree) if nodes is None else nodes:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imports += [(node, alias) for alias in node.names if (alias.asname or alias.name.split(".")[0]) == name]
        elif isinstance(node, ast.Name) and node.id == name and not isinstance(node.ctx, ast.Load):
            return "the module rebinds %s (line %d)" % (name, node.lineno), imports
        elif isinstance(node, (ast.Global, ast.Nonlocal)) and name in node.names:
            return "`%s %s` (line %d)" % (type(node).__name__.lower(), name, node.lineno), imports
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return "a definition named %s (line %d)" % (name, node.lineno), imports
    return None, imports


def flashinfer_problem(tree, nodes=None):
    """None when the module binds ``flashinfer`` only by ``import flashinfer`` at its top level
    (SGLang guards it with ``if is_flashinfer_available():``), once."""
    problem, imports = module_bindings(tree, GATED_GLOBAL, nodes)
    if problem:
        return problem
    plain = [(n, a) for n, a in imports if isinstance(n, ast.Import) and a.name == GATED_GLOBAL and a.asname is None]
    if len(imports) != 1 or len(plain) != 1:
        return "%s is not bound once, by `import %s`" % (GATED_GLOBAL, GATED_GLOBAL)
    return None


def imports_a_kernel_route(node):
    """An import that binds a kernel, or the submodule holding one, under a name of the module's
    own (``from flashinfer.decode import trtllm_batch_decode_with_kv_cache as k``, ``from
    flashinfer import decode``, ``import flashinfer.prefill as p``, a star import): a route to
    the kernel that does not pass the gate."""
    if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == GATED_GLOBAL:
        names = {alias.name for alias in node.names}
        return bool(names & (set(KERNELS) | set(KERNELS.values()) | {"*"})) or node.module != GATED_GLOBAL
    if isinstance(node, ast.Import):
        return any(alias.name.startswith(GATED_GLOBAL + ".") and alias.asname for alias in node.names)
    return False


def kernel_route_problem(tree, methods):
    """None when nothing but the live ``methods`` reaches ``flashinfer`` or names a kernel
    (the gate must see only the kernel calls those methods prepare). Earlier definitions of the
    class or of the methods count too: an alias can keep them callable."""
    inside = {id(node) for method in methods for node in ast.walk(method)}
    for node in ast.walk(tree):
        if id(node) in inside:
            continue
        if imports_a_kernel_route(node):
            return (
                "the module binds a FlashInfer kernel or its submodule by import (line %d): a route around "
                "the gate" % node.lineno
            )
        named = (
            (isinstance(node, ast.Name) and node.id in (GATED_GLOBAL,) + tuple(KERNELS.values()))
            or (isinstance(node, ast.Attribute) and node.attr in KERNELS.values())
            or (isinstance(node, ast.Constant) and node.value in (GATED_GLOBAL,) + tuple(KERNELS.values()))
        )
        if named and not isinstance(getattr(node, "ctx", None), ast.Store):
            return "code outside forward_decode / forward_extend reaches %s or a TRT-LLM kernel (line %d)" % (
                GATED_GLOBAL,
                node.lineno,
            )
    return None


def helpers_problem(cls, methods, live, helpers):
    """None when every method of the class that ``methods`` call is, by name, a known release's
    code (``helpers``: name -> fingerprints): the gate must see only the kernel calls the methods
    prepare, so nothing they call may reach a kernel first."""
    called = sorted(
        {
            node.attr
            for method in methods
            for node in ast.walk(method)
            if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
            and any(isinstance(n, ast.FunctionDef) and n.name == node.attr for n in cls.body)
        }
        - {method.name for method in methods}
    )
    for name in called:
        function, problem = live.get(name, (None, "%s.%s is not examined" % (CLASS_NAME, name)))
        if problem or function is None:
            return problem or "%s.%s not found" % (CLASS_NAME, name)
        if name not in helpers or of_node(function) not in helpers[name]:
            return "%s.%s, which the methods call, is not the code of a known release (fingerprint %s)" % (
                CLASS_NAME,
                name,
                of_node(function),
            )
    return None
