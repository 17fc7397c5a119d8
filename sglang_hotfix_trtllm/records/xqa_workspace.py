"""The hotfix record for SGLang's XQA semaphore workspace fix (SGLang 0.5.23; the pull request
that made it was not found: docs/records.md says how it was looked for): fmha_v2
prefill and XQA decode no longer share the first 8 MiB of one workspace.

Standard library only at import.

The bug (SGLang 0.5.19 to 0.5.22): on SM90/SM120 ``TRTLLMHAAttnBackend`` prefills with FlashInfer's
fmha_v2 kernel (``flashinfer.prefill.trtllm_fmha_v2_prefill``, ``self.use_fmha_v2``) and decodes with
XQA (``flashinfer.decode.trtllm_batch_decode_with_kv_cache``), and passes both the same
``self.workspace_buffer``: one zeroed buffer per process, ``get_buffer("trtllm_mha_zero_workspace",
...)``, shared by every trtllm_mha backend instance (a draft's included). XQA keeps its multi-block
semaphores in the first 8 MiB of that workspace and needs them zero at every launch; fmha_v2's
Hopper kernel keeps a tile counter at offset 0 and leaves it non-zero. After the first prefill, XQA
decode in multi-block mode (low batch, long context) reads garbage for the first request's first
KV head. Upstream's fix, in 0.5.23::

    _XQA_SEMAPHORE_BYTES = 8 * 1024 * 1024                      # module constant
    semaphore_bytes = _XQA_SEMAPHORE_BYTES if self.is_xqa_impl else 0
    self.workspace_buffer = get_buffer("trtllm_mha_zero_workspace",
        lambda: torch.zeros(semaphore_bytes + self.workspace_size, dtype=torch.uint8,
                            device=model_runner.device))
    self.fmha_v2_workspace_buffer = self.workspace_buffer[semaphore_bytes:]
    ... flashinfer.prefill.trtllm_fmha_v2_prefill(..., workspace_buffer=self.fmha_v2_workspace_buffer, ...)

``self.is_xqa_impl`` is ``get_platform().is_sm90 or get_platform().is_sm120`` in every release
(0.5.19 and 0.5.20 set it after the allocation, 0.5.21 on before it; the same expression).

The repair is upstream's code (``code_edit``): ``__init__``, compiled from the installed file with
its allocation replaced by 0.5.23's three statements above, and ``forward_extend``, with fmha_v2's
``workspace_buffer=self.fmha_v2_workspace_buffer``, run as SGLang's functions; 0.5.23's
``_XQA_SEMAPHORE_BYTES`` becomes a global of the module first. ``get_buffer`` is SGLang's own, so
the buffer is still one per process, shared by the draft's backend, allocated once. One adaptation:
0.5.19 and 0.5.20 set ``self.is_xqa_impl`` after the allocation, so there the reserve asks the very
expression it is set to, ``get_platform().is_sm90 or get_platform().is_sm120``.

``forward_extend`` then reads what ``__init__`` makes: a backend built before the record was in
force has no ``fmha_v2_workspace_buffer``, so while such backends live (``apply()`` late in a
process) the record stands aside and says so (``Hotfix.made_at_construction``), rather than let
upstream's code meet an object upstream's ``__init__`` never made.

Verdicts, from the live code: ``affected`` when ``__init__`` and ``forward_extend`` are, by
fingerprint, 0.5.19's to 0.5.22's, the module binds ``get_buffer`` once, nothing but
``forward_extend`` names fmha_v2's kernel and nothing but ``__init__`` names the workspace (the bug
as this record understands it: one workspace, shared by these two methods' kernels); ``fixed``
when fmha_v2 gets ``self.fmha_v2_workspace_buffer`` and ``__init__`` makes it
a slice of the workspace (0.5.23); ``not-applicable`` when the module has no fmha_v2 call (0.5.18 and
earlier); ``unknown`` otherwise.
"""

import ast
import os

from .. import code_edit, detect
from . import trtllm_backend
from ..fingerprint import of_node
from ..record import Classification, Hotfix, Verdict
from ..release_table import ReleaseTable

NAME = "xqa_workspace"
# What of this record depends on FlashInfer, for the README (tools/docs_tables.py).
FLASHINFER = "is a bug only with a FlashInfer whose fmha_v2 leaves its tile counter (0.6.18 to 0.7.1, not 0.7.2 on)"
CLASS_NAME = trtllm_backend.CLASS_NAME
METHOD = "__init__"
PREFILL_METHOD = "forward_extend"
UPSTREAM = "SGLang 0.5.23"
# FlashInfer's XQA keeps its multi-block semaphores in the first 8 MiB of the workspace (0.5.23's
# _XQA_SEMAPHORE_BYTES).
XQA_SEMAPHORE_BYTES = 8 * 1024 * 1024
WORKSPACE_NAME = "trtllm_mha_zero_workspace"
BUFFER_GLOBAL = "get_buffer"
FMHA_V2_SUBMODULE, FMHA_V2_KERNEL = "prefill", "trtllm_fmha_v2_prefill"
FIXED_ATTRIBUTE = "fmha_v2_workspace_buffer"


# --------------------------------------------------------------------------
# The repair: upstream's change, as edits of the release's own methods

SEMAPHORE_CONSTANT = "_XQA_SEMAPHORE_BYTES"
# 0.5.23's module constant, verbatim.
UPSTREAM_CONSTANT = "_XQA_SEMAPHORE_BYTES = 8 * 1024 * 1024"
# The release's allocation (0.5.19 to 0.5.22, as ``ast.unparse`` writes it) and 0.5.23's three
# statements in its place.
RELEASE_ALLOCATION = (
    "self.workspace_buffer = get_buffer('trtllm_mha_zero_workspace', lambda: torch.zeros(self.workspace_size, "
    "dtype=torch.uint8, device=model_runner.device))"
)
UPSTREAM_RESERVE = "semaphore_bytes = _XQA_SEMAPHORE_BYTES if %s else 0"
UPSTREAM_ALLOCATION = """\
self.workspace_buffer = get_buffer(
    "trtllm_mha_zero_workspace",
    lambda: torch.zeros(
        semaphore_bytes + self.workspace_size,
        dtype=torch.uint8,
        device=model_runner.device,
    ),
)"""
UPSTREAM_VIEW = "self.%s = self.workspace_buffer[semaphore_bytes:]" % FIXED_ATTRIBUTE
XQA_ATTRIBUTE = "self.is_xqa_impl"


def _xqa_test(init, before):
    """What 0.5.23's reserve asks: ``self.is_xqa_impl`` where ``__init__`` has set it before the
    allocation (0.5.21 on, as in 0.5.23); where it sets it after (0.5.19 and 0.5.20, the adaptation),
    the very expression it is then set to (``get_platform().is_sm90 or get_platform().is_sm120``)."""
    settings = [
        (i, s)
        for i, s in enumerate(init.body)
        if isinstance(s, ast.Assign) and [ast.unparse(t) for t in s.targets] == [XQA_ATTRIBUTE]
    ]
    if len(settings) != 1:
        raise code_edit.EditMismatch("__init__ sets is_xqa_impl %d times at its top level" % len(settings))
    index, setting = settings[0]
    return XQA_ATTRIBUTE if index < before else "(%s)" % ast.unparse(setting.value)


def allocate_as_upstream(init, tree):
    """0.5.23's change of ``__init__``: the shared workspace's allocation becomes its reserve, its
    allocation of 8 MiB more on XQA and fmha_v2's view after the reserve."""
    places = [i for i, s in enumerate(init.body) if ast.unparse(s) == RELEASE_ALLOCATION]
    if len(places) != 1:
        raise code_edit.EditMismatch(
            "%d workspace allocations in __init__'s own body (0.5.19 to 0.5.22 have one)" % len(places)
        )
    index = places[0]
    statement = init.body[index]
    init.body[index : index + 1] = [
        code_edit.statement_at(UPSTREAM_RESERVE % _xqa_test(init, index), statement.lineno),
        code_edit.statement_at(UPSTREAM_ALLOCATION, statement.lineno),
        code_edit.statement_at(UPSTREAM_VIEW, statement.end_lineno),
    ]


def give_fmha_v2_its_view(extend, tree):
    """0.5.23's change of ``forward_extend``: fmha_v2's ``workspace_buffer=`` is its view."""
    calls = _fmha_v2_calls(tuple(ast.walk(extend)))
    if len(calls) != 1:
        raise code_edit.EditMismatch("%d fmha_v2 calls in forward_extend (0.5.19 to 0.5.22 have one)" % len(calls))
    given = [k for k in calls[0].keywords if k.arg == "workspace_buffer"]
    if len(given) != 1 or ast.unparse(given[0].value) != "self.workspace_buffer":
        raise code_edit.EditMismatch("fmha_v2's call does not pass workspace_buffer=self.workspace_buffer")
    value = ast.parse("self.%s" % FIXED_ATTRIBUTE, mode="eval").body
    ast.increment_lineno(value, given[0].value.lineno - 1)
    given[0].value = value


EDITS = (code_edit.Edit(METHOD, allocate_as_upstream), code_edit.Edit(PREFILL_METHOD, give_fmha_v2_its_view))
NEW_NAMES = (code_edit.NewName(SEMAPHORE_CONSTANT, UPSTREAM_CONSTANT, UPSTREAM, scope="module"),)


# --------------------------------------------------------------------------
# Recognising the code

# (__init__, forward_extend) fingerprints of the affected releases.
AFFECTED = {
    ("ast1:914a49bd48a2275f", "ast1:6431b3b2463a8083"): "0.5.19",
    ("ast1:914a49bd48a2275f", "ast1:586829385e017f50"): "0.5.20",
    ("ast1:aa1004bab5d0e716", "ast1:a639d577cfcfba4f"): "0.5.21",
    ("ast1:aa1004bab5d0e716", "ast1:1f4b8faf2331ebcf"): "0.5.22",
}


def _names(nodes, name):
    """Those of ``nodes`` (a tree's, walked once: ``ast.walk``) that name ``name``: a name, an
    attribute, an imported name or a string."""
    return [
        n
        for n in nodes
        if (isinstance(n, ast.Name) and n.id == name)
        or (isinstance(n, ast.Attribute) and n.attr == name)
        or (isinstance(n, ast.alias) and name in (n.name.rpartition(".")[2], n.asname))
        or (isinstance(n, ast.Constant) and n.value == name)
    ]


def _mentions_fmha_v2(nodes):
    """Any name, attribute or imported name of the module (its ``nodes``) that speaks of fmha_v2
    (0.5.19 on: the kernel, ``use_fmha_v2``, its helpers); docstrings and comments do not count."""
    for node in nodes:
        if isinstance(node, ast.Name):
            names = (node.id,)
        elif isinstance(node, ast.Attribute):
            names = (node.attr,)
        elif isinstance(node, ast.alias):
            names = (node.name, node.asname or "")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names = (node.name,)
        else:
            continue
        if any("fmha_v2" in name for name in names):
            return True
    return False


def _fmha_v2_calls(nodes):
    return [
        n
        for n in nodes
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == FMHA_V2_KERNEL  # first: unparsing every call is most of the time
        and ast.unparse(n.func) == "flashinfer.%s.%s" % (FMHA_V2_SUBMODULE, FMHA_V2_KERNEL)
    ]


def _workspace_argument(call):
    found = [k.value for k in call.keywords if k.arg == "workspace_buffer"]
    return ast.unparse(found[0]) if len(found) == 1 else None


def _top_level(init, text):
    """The statement of ``__init__``'s own body (not under another) whose source is ``text``."""
    return [statement for statement in init.body if ast.unparse(statement) == text]


def _semaphore_constant(tree, nodes):
    """The module's ``_XQA_SEMAPHORE_BYTES``, bound once at its top level to 8 MiB (a product of
    integer literals, as 0.5.23 writes it), else None."""
    bound = [
        node
        for node in nodes
        if isinstance(node, ast.Name) and node.id == "_XQA_SEMAPHORE_BYTES" and not isinstance(node.ctx, ast.Load)
    ]
    for statement in tree.body:
        if (
            isinstance(statement, ast.Assign)
            and len(bound) == 1
            and [ast.unparse(t) for t in statement.targets] == ["_XQA_SEMAPHORE_BYTES"]
        ):
            value = _product(statement.value)
            return value if value == XQA_SEMAPHORE_BYTES else None
    return None


def _product(node):
    """An integer literal or a product of them, evaluated; else None."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        left, right = _product(node.left), _product(node.right)
        return None if left is None or right is None else left * right
    return None


def _fixed_in_substance(tree, walked, init, extend):
    """0.5.23's change, in substance: 8 MiB set aside when ``self.is_xqa_impl``, in the allocation
    and in fmha_v2's view, all in ``__init__``'s own body, and fmha_v2 (named nowhere else) given that
    view. A fork with the view at offset 0, the reserve dropped or the view in a dead branch is not."""
    if _semaphore_constant(tree, walked[tree]) is None:
        return False
    reserve = _top_level(init, "semaphore_bytes = _XQA_SEMAPHORE_BYTES if self.is_xqa_impl else 0")
    view = _top_level(init, "self.%s = self.workspace_buffer[semaphore_bytes:]" % FIXED_ATTRIBUTE)
    allocation = [
        s
        for s in init.body
        if isinstance(s, ast.Assign)
        and [ast.unparse(t) for t in s.targets] == ["self.workspace_buffer"]
        and WORKSPACE_NAME in ast.unparse(s.value)
        and "semaphore_bytes + self.workspace_size" in ast.unparse(s.value)
    ]
    if len(reserve) != 1 or len(view) != 1 or len(allocation) != 1:
        return False
    order = [init.body.index(reserve[0]), init.body.index(allocation[0]), init.body.index(view[0])]
    if order != sorted(order):
        return False
    calls = _fmha_v2_calls(walked[extend])
    inside = {id(n) for n in walked[extend]}
    return (
        len(calls) == 1
        and _workspace_argument(calls[0]) == "self.%s" % FIXED_ATTRIBUTE
        and not [n for n in _names(walked[tree], FMHA_V2_KERNEL) if id(n) not in inside]
    )


def _bindings(name, nodes):
    """(problem, imports): a problem when something other than an import binds the module global
    ``name`` (an assignment, ``global``/``nonlocal``, a definition), else None and every (import
    node, alias) that binds it. ``nodes``: the module's, walked."""
    imports = []
    for node in nodes:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imports += [(node, alias) for alias in node.names if (alias.asname or alias.name.split(".")[0]) == name]
        elif isinstance(node, ast.Name) and node.id == name and not isinstance(node.ctx, ast.Load):
            return "the module rebinds %s (line %d)" % (name, node.lineno), imports
        elif isinstance(node, (ast.Global, ast.Nonlocal)) and name in node.names:
            return "`%s %s` (line %d)" % (type(node).__name__.lower(), name, node.lineno), imports
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return "a definition named %s (line %d)" % (name, node.lineno), imports
    return None, imports


def _get_buffer_problem(tree, nodes):
    """None when the module binds ``get_buffer`` once, by a top-level ``from ... import get_buffer``
    (no alias), and never rebinds it: upstream's allocation calls it, and the one buffer a process
    shares is the one SGLang's own ``get_buffer`` keeps."""
    problem, bound = _bindings(BUFFER_GLOBAL, nodes)
    if problem:
        return problem
    if len(bound) != 1 or not isinstance(bound[0][0], ast.ImportFrom) or bound[0][0] not in tree.body:
        return "%s is not bound once, by a top-level `from ... import %s`" % (BUFFER_GLOBAL, BUFFER_GLOBAL)
    return None


def _affected_problem(tree, walked, init, extend):
    """None when only these two methods touch what the repair changes (see the module's docstring)."""
    nodes = walked[tree]
    problem = _get_buffer_problem(tree, nodes)
    if problem:
        return problem
    inside_extend = {id(n) for n in walked[extend]}
    kernel_names = _names(nodes, FMHA_V2_KERNEL)
    calls = _fmha_v2_calls(walked[extend])
    if len(calls) != 1 or _workspace_argument(calls[0]) != "self.workspace_buffer":
        return "forward_extend does not call fmha_v2 once with workspace_buffer=self.workspace_buffer"
    if [n for n in kernel_names if id(n) not in inside_extend]:
        return "code outside forward_extend names FlashInfer's fmha_v2 kernel: not the one shared use this record knows"
    inside_init = {id(n) for n in walked[init]}
    if [n for n in _names(nodes, WORKSPACE_NAME) if id(n) not in inside_init] or len(
        _names(walked[init], WORKSPACE_NAME)
    ) != 1:
        return "code outside __init__ names the shared workspace %r" % WORKSPACE_NAME
    return None


def classify(tree):
    """Classify the source of ``trtllm_mha_backend`` (an ``ast.Module``)."""
    cls, class_problem = detect.live_class(tree, CLASS_NAME)
    if cls is None:
        return Classification(Verdict.UNKNOWN, class_problem, of_node(tree))
    live = detect.live_methods(tree, cls, (METHOD, PREFILL_METHOD))
    (init, init_problem), (extend, extend_problem) = live[METHOD], live[PREFILL_METHOD]
    if init_problem or extend_problem or init is None or extend is None:
        return Classification(
            Verdict.UNKNOWN, init_problem or extend_problem or "__init__ / forward_extend not found", of_node(cls)
        )
    fingerprint = of_node(init)

    def verdict(value, reason):
        return Classification(value, reason, fingerprint, detect.first_line_of(init))

    # Each tree walked once (``ast.walk`` of the module is most of this function's time, and it ran
    # at every start on the affected releases): the helpers filter these lists. The two methods'
    # walks only where the module speaks of fmha_v2 (0.5.12 and the other releases before it stop here).
    walked = {tree: detect.nodes(tree)}
    if not _mentions_fmha_v2(walked[tree]):
        return verdict(
            Verdict.NOT_APPLICABLE, "this backend has no fmha_v2 prefill (added for SM90/SM120 in SGLang 0.5.19)"
        )
    walked.update((method, tuple(ast.walk(method))) for method in (init, extend))
    if _fixed_in_substance(tree, walked, init, extend):
        return verdict(
            Verdict.FIXED,
            "fmha_v2 gets its own view of the workspace, after XQA's semaphores (SGLang 0.5.23)",
        )
    if (fingerprint, of_node(extend)) not in AFFECTED:
        return verdict(Verdict.UNKNOWN, "__init__ / forward_extend are not the code of a release this hotfix knows")
    problem = _affected_problem(tree, walked, init, extend)
    if problem:
        return verdict(Verdict.UNKNOWN, problem)
    return verdict(
        Verdict.AFFECTED,
        "fmha_v2 prefill and XQA decode get the same workspace, whose first 8 MiB hold XQA's semaphores: "
        "fmha_v2 leaves a counter there and multi-block XQA decode then reads wrong rows",
    )


def environment():
    """``Hotfix.environment``: where the installed FlashInfer's fmha_v2 wraps its tile counter back to
    0 after each launch (0.7.2 on), no semaphore is left non-zero for XQA to read: the bug is masked
    there and the record stands aside (it never changes what the kernel reads where no bug is)."""
    from ..flashinfer_install import fmha_v2_leaves_its_tile_counter

    leaves, why = fmha_v2_leaves_its_tile_counter()
    if leaves is False:
        return Verdict.NOT_APPLICABLE, "masked by the installed FlashInfer: %s, so XQA's semaphores stay 0" % why
    return None


HOTFIX = Hotfix(
    gpu_proof=(
        "on an H200, SGLang 0.5.19's fmha_v2 prefill and XQA decode with FlashInfer 0.6.18 (and 0.5.22 with "
        "FlashInfer 0.7.1), again on an H100 with 0.14.0 (docs/gpu.md)"
    ),
    name=NAME,
    upstream=UPSTREAM,
    summary="on SM90/SM120, TRT-LLM MHA's fmha_v2 prefill no longer writes into XQA decode's semaphores "
    "(8 MiB more workspace, fmha_v2 gets the part after them)",
    effect="on SM90/SM120 the shared workspace holds 8 MiB for XQA's semaphores and fmha_v2 gets the part after them",
    distribution="sglang",
    target="%s.%s.%s" % (trtllm_backend.MODULE, CLASS_NAME, METHOD),
    classify=detect.walked_once(classify),
    edits=EDITS,
    new_names=NEW_NAMES,
    # forward_extend reads what __init__ makes: never put in force while backends built without it live.
    made_at_construction=(FIXED_ATTRIBUTE,),
    environment=environment,
    known_fingerprints=ReleaseTable(os.path.join(os.path.dirname(os.path.abspath(__file__)), NAME + "_releases.json")),
)
