"""One SGLang release's backend class, compiled from that release's own source
without importing the rest of SGLang (whose import needs each release's own
dependency set, too heavy to install 29 times in CI).

The module object built here has the real module name, its ``__file__`` and
``__spec__.origin`` point at the release's ``trtllm_mha_backend.py``, and the
class holds the release's own functions compiled from that file with their
original line numbers. Only the class's base is dropped (FlashInfer's backend,
whose import needs a GPU stack); the capture and CUDA-graph state methods do
not use it. ``ForwardMode`` comes from the same release's
``forward_batch_info.py``. The plugin's engine then sees this module exactly as
its import hook would.
"""

import ast
import dataclasses
import enum
import importlib.machinery
import sys
import types
import typing

import torch

MODULE_NAME = "sglang.srt.layers.attention.trtllm_mha_backend"
BACKEND = "sglang/srt/layers/attention/trtllm_mha_backend.py"
FORWARD_BATCH_INFO = "sglang/srt/model_executor/forward_batch_info.py"


def _futures(tree):
    return [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "__future__"]


def _class(tree, name):
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)


def load_forward_mode(release_dir):
    path = release_dir / FORWARD_BATCH_INFO
    tree = ast.parse(path.read_text(encoding="utf-8"))
    namespace = {"__name__": "sglang.srt.model_executor.forward_batch_info", "IntEnum": enum.IntEnum, "auto": enum.auto}
    body = _futures(tree) + [_class(tree, "ForwardMode")]
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), namespace)
    return namespace["ForwardMode"]


def load_backend_module(release_dir):
    path = release_dir / BACKEND
    tree = ast.parse(path.read_text(encoding="utf-8"))
    backend = _class(tree, "TRTLLMHAAttnBackend")
    backend.bases, backend.keywords = [], []
    backend.body = [n for n in backend.body if isinstance(n, ast.FunctionDef) and n.name != "__init__"]
    module = types.ModuleType(MODULE_NAME)
    module.__file__ = str(path)
    module.__spec__ = importlib.machinery.ModuleSpec(MODULE_NAME, None, origin=str(path))
    module.__dict__.update(
        torch=torch,
        dataclass=dataclasses.dataclass,
        field=dataclasses.field,
        ForwardMode=load_forward_mode(release_dir),
        **{
            name: getattr(typing, name)
            for name in ("TYPE_CHECKING", "Optional", "List", "Dict", "Tuple", "Union", "Any", "Callable")
        },
    )
    body = as_the_file_binds(tree, _futures(tree) + [_class(tree, "TRTLLMMHAMetadata"), backend])
    run_as_module(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), module)
    return module


def as_the_file_binds(tree, kept):
    """``kept`` (statements of the module ``tree``) followed by every other top-level statement of
    the file under ``if False:``: never run, but seen by the compiler's symbol table, so names the
    file binds by import compile as they do in the file (CPython 3.12 calls a method of an imported
    module with LOAD_ATTR, of another global with LOAD_METHOD; 3.11 likewise for some calls). The
    functions then hold the very code a fresh compile of the file gives, which the plugin proves
    before it changes a method."""
    rest = [n for n in tree.body if n not in kept and not (isinstance(n, ast.ImportFrom) and n.module == "__future__")]
    if not rest:
        return kept
    guard = ast.If(test=ast.Constant(False), body=rest, orelse=[])
    return kept + [ast.fix_missing_locations(ast.copy_location(guard, rest[0]))]


def run_as_module(code, module):
    """Execute ``code`` in ``module``. dataclasses resolves string annotations
    through sys.modules[cls.__module__]: the module is registered under its name
    only while its classes are created (an installed one is put back)."""
    previous = sys.modules.get(module.__name__)
    sys.modules[module.__name__] = module
    try:
        exec(code, module.__dict__)
    finally:
        if previous is None:
            del sys.modules[module.__name__]
        else:
            sys.modules[module.__name__] = previous
