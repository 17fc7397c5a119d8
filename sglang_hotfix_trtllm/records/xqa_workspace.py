"""The hotfix record for SGLang's XQA semaphore workspace fix (SGLang 0.5.23; the pull request
that made it was not found: docs/records.md says how it was looked for): fmha_v2
prefill and XQA decode no longer share the first 8 MiB of one workspace.

Standard library only at import (torch and wrapt are reached when the record wraps, as for
every record).

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

The repair, in two places, each where upstream's value is made:

* ``__init__`` is wrapped: the call is noted while SGLang's ``__init__`` runs, and the module's
  ``get_buffer`` (a gate, armed by the first ``__init__``; it passes every other call through) hands
  the workspace's ``get_buffer`` call, on XQA (the expression above, asked of the module's
  ``get_platform`` at that call), upstream's factory instead of the release's:
  ``torch.zeros(8 MiB + self.workspace_size, dtype=torch.uint8, device=model_runner.device)``.
  ``get_buffer`` is SGLang's own, so the buffer is still one per process, shared by the draft's
  backend, allocated once (8 MiB more, never the old size and the new both), before any CUDA graph
  is captured (the hotfix wraps when the backend module is imported). Off XQA (SM100) nothing
  changes: upstream's ``semaphore_bytes`` is 0 there.
* FlashInfer's fmha_v2 kernel, as the module reaches it through ``flashinfer`` (the kernel-call
  site's gate, ``trtllm_kernel_site``), gets ``workspace[8 MiB:]`` in place of a workspace this
  record allocated: upstream's view (same storage, offset 8 MiB, size, dtype, strides). XQA and
  every other kernel get the whole buffer, as in 0.5.23.

A workspace allocated before the record was in force (an instance built before ``apply()``) is
never swapped: CUDA graphs may hold it. That process keeps the release's sharing, and says so
(one WARNING naming the record).

Verdicts, from the live code: ``affected`` when ``__init__`` and ``forward_extend`` are, by
fingerprint, 0.5.19's to 0.5.22's, the module binds ``flashinfer`` and ``get_buffer`` once each, and
nothing but ``forward_extend`` names fmha_v2's kernel and nothing but ``__init__`` names the
workspace; ``fixed`` when fmha_v2 gets ``self.fmha_v2_workspace_buffer`` and ``__init__`` makes it
a slice of the workspace (0.5.23); ``not-applicable`` when the module has no fmha_v2 call (0.5.18 and
earlier); ``unknown`` otherwise.
"""

import ast
import contextvars
import os
import weakref

from .. import detect, logs
from . import trtllm_kernel_routes as routes
from . import trtllm_kernel_site as site
from ..fingerprint import of_node
from ..record import Classification, Hotfix, Verdict
from ..release_table import ReleaseTable

NAME = "xqa_workspace"
CLASS_NAME = site.CLASS_NAME
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
# The repair: the workspace's allocation


class _Construction:
    """One ``__init__`` call on XQA, as the ``get_buffer`` gate needs it."""

    __slots__ = ("backend", "model_runner", "outcome")

    def __init__(self, backend, model_runner):
        self.backend, self.model_runner = backend, model_runner
        self.outcome = None  # "allocated" / "shared": upstream's buffer; else why not


_current_construction = contextvars.ContextVar("sglang_hotfix_trtllm_workspace_construction", default=None)
# id(workspace) -> a weak reference to it: the workspaces this record allocated.
_allocated = {}


def _model_runner(
    self, model_runner, skip_prefill=False, kv_indptr_buf=None, kv_last_page_len_buf=None, speculative_step_id=0
):
    """Binds ``__init__``'s parameters as every affected release declares them (pinned by
    fingerprint): a call SGLang rejects is left to SGLang's own error."""
    return model_runner


def _on_xqa(module):
    """``self.is_xqa_impl`` as every affected release computes it."""
    platform = module.get_platform()
    return bool(platform.is_sm90 or platform.is_sm120)


def allocate_as_upstream(module, wrapped, instance, args, kwargs):
    """wrapt wrapper of ``__init__``: the call is noted for the ``get_buffer`` gate while SGLang's
    ``__init__`` runs (the gate decides, at the workspace's ``get_buffer`` call, whether it is on
    XQA). A call that cannot be read runs SGLang's ``__init__`` alone; a workspace that could not be
    allocated as upstream allocates it is said once (the release's sharing then stays)."""
    try:
        model_runner = _model_runner(instance, *args, **kwargs)
    except TypeError:
        return wrapped(*args, **kwargs)  # SGLang's own __init__ raises its own error
    from .. import patch

    if instance is None or not patch.arm_gates(HOTFIX, module, (BUFFER_GLOBAL,)):
        return wrapped(*args, **kwargs)  # remove() ran meanwhile: the record is off
    construction = _Construction(instance, model_runner)
    token = _current_construction.set(construction)
    try:
        result = wrapped(*args, **kwargs)
    finally:
        _current_construction.reset(token)
    # Said only when SGLang's __init__ returned (else its own error says what happened) and the
    # record is still on (remove() meanwhile is the operator's choice); each kind of outcome once
    # per process on its own, so that one never hides another.
    outcome = construction.outcome
    if outcome is None:
        outcome = ("no-gate", "the workspace's get_buffer call did not pass the gate")
    if isinstance(outcome, tuple) and _gate_on(module, BUFFER_GLOBAL):
        logs.repair_skipped(HOTFIX.target, NAME, LookupError(outcome[1]), outcome[0])
    return result


def _gate_on(module, name):
    """The record's gate is the module's ``get_buffer`` and ``remove()`` has not turned it off."""
    current = vars(module).get(name)
    return bool(_gate_class) and type(current) is _gate_class[0] and current._self_hotfix_on


def rearm(module):
    """Called by ``patch.wrap`` each time the record is (re)applied: workspaces it allocated before a
    ``remove()`` live on in their backends, so fmha_v2's gate goes back at once (no new ``__init__``
    would put it back)."""
    if any(ref() is not None for ref in list(_allocated.values())) and site.GATED_GLOBAL in vars(module):
        from .. import patch

        patch.arm_gates(HOTFIX, module, (site.GATED_GLOBAL,))


def _bind_get_buffer(name, factory):
    return name, factory


def _not_needed(module):
    """None when the workspace must be allocated as 0.5.23 does (on XQA, with FlashInfer's gate in
    place); else "not-xqa" (upstream's allocation is the release's there), "no-flashinfer" (no
    kernel can run, so none is repaired), or (kind, why) the repair cannot be made."""
    from .. import patch

    try:
        if not _on_xqa(module):
            return "not-xqa"  # SM100: 0.5.23's semaphore_bytes is 0
    except Exception as error:  # SGLang's own __init__ asks the same and meets the same
        return ("platform", "get_platform() failed: %s: %s" % (type(error).__name__, error))
    if site.GATED_GLOBAL not in vars(module):
        return "no-flashinfer"  # no FlashInfer kernel can run in this process: nothing to repair
    if not patch.arm_gates(HOTFIX, module, (site.GATED_GLOBAL,)):
        return ("no-gate", "the hotfix's gate could not be put in %s.%s" % (site.MODULE, site.GATED_GLOBAL))
    return None


def _upstream_workspace(module, construction, get_buffer, name):
    """``get_buffer`` with 0.5.23's factory; the record's own workspace, or None where the one
    SGLang shares was allocated without the record (then it is returned as it is)."""
    backend, model_runner = construction.backend, construction.model_runner
    size = XQA_SEMAPHORE_BYTES + backend.workspace_size
    torch = module.torch
    made = []

    def factory():
        made.append(torch.zeros(size, dtype=torch.uint8, device=model_runner.device))
        return made[0]

    workspace = get_buffer(name, factory)
    entry = _allocated.get(id(workspace))
    if made and workspace is made[0]:
        _remember(workspace)
        construction.outcome = "allocated"
    elif entry is not None and entry() is workspace:
        construction.outcome = "shared"  # allocated by an earlier instance, with the record
    else:
        construction.outcome = (
            "preallocated",
            "the process's shared workspace was allocated before the hotfix was in force (it is never "
            "swapped: CUDA graphs may hold it); XQA and fmha_v2 keep sharing it until the process restarts",
        )
    return workspace


def _remember(workspace):
    # Only a weak reference: a view kept here would keep the workspace's memory alive after SGLang
    # dropped it (an engine rebuilt in the same process).
    key = id(workspace)
    _allocated[key] = weakref.ref(workspace, lambda _, key=key: _allocated.pop(key, None))


_gate_class = []


def make_buffer_gate(module, get_buffer):
    """The module's ``get_buffer`` once the record armed it: SGLang's own function, but for the
    workspace's call inside a noted ``__init__``."""
    if not _gate_class:
        from .. import patch

        class WorkspaceBufferGate(patch.GateProxy):
            """SGLang's ``get_buffer`` as the backend module reaches it (a proxy: it passes for
            the function), handing the workspace's call upstream's factory during a noted
            ``__init__``."""

            def __call__(self, *args, **kwargs):
                construction = _current_construction.get()
                if construction is None or not self._self_hotfix_on:
                    return self.__wrapped__(*args, **kwargs)
                try:
                    name, _ = _bind_get_buffer(*args, **kwargs)
                except TypeError:
                    return self.__wrapped__(*args, **kwargs)
                if name != WORKSPACE_NAME or construction.outcome is not None:
                    return self.__wrapped__(*args, **kwargs)
                module = self._self_module
                construction.outcome = _not_needed(module)
                if construction.outcome is not None:
                    return self.__wrapped__(*args, **kwargs)  # SGLang's own factory: upstream's there
                return _upstream_workspace(module, construction, self.__wrapped__, name)

        _gate_class.append(WorkspaceBufferGate)
    gate = _gate_class[0](get_buffer)
    gate._self_module = module
    return gate


# --------------------------------------------------------------------------
# The repair: what fmha_v2 receives


def fmha_v2_workspace(kwargs):
    """fmha_v2's keyword arguments with 0.5.23's workspace: the view after the semaphores, in place
    of a workspace this record allocated; SGLang's own arguments otherwise."""
    workspace = kwargs.get("workspace_buffer")
    entry = _allocated.get(id(workspace))
    if entry is None or entry() is not workspace:
        return kwargs
    return dict(kwargs, workspace_buffer=workspace[XQA_SEMAPHORE_BYTES:])  # 0.5.23's view, made as it makes it


site.register_argument_repair(FMHA_V2_SUBMODULE, FMHA_V2_KERNEL, fmha_v2_workspace)


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


def _get_buffer_problem(tree, nodes):
    """None when the module binds ``get_buffer`` once, by a top-level ``from ... import get_buffer``
    (no alias), and never rebinds it."""
    problem, bound = routes.module_bindings(tree, BUFFER_GLOBAL, nodes)
    if problem:
        return problem
    if len(bound) != 1 or not isinstance(bound[0][0], ast.ImportFrom) or bound[0][0] not in tree.body:
        return "%s is not bound once, by a top-level `from ... import %s`" % (BUFFER_GLOBAL, BUFFER_GLOBAL)
    return None


def _affected_problem(tree, walked, init, extend):
    """None when only these two methods touch what the repair changes (see the module's docstring)."""
    nodes = walked[tree]
    problem = routes.flashinfer_problem(tree, nodes) or _get_buffer_problem(tree, nodes)
    if problem:
        return problem
    inside_extend = {id(n) for n in walked[extend]}
    kernel_names = _names(nodes, FMHA_V2_KERNEL)
    calls = _fmha_v2_calls(walked[extend])
    if len(calls) != 1 or _workspace_argument(calls[0]) != "self.workspace_buffer":
        return "forward_extend does not call fmha_v2 once with workspace_buffer=self.workspace_buffer"
    if [n for n in kernel_names if id(n) not in inside_extend]:
        return "code outside forward_extend names FlashInfer's fmha_v2 kernel: a route the repair does not see"
    inside_init = {id(n) for n in walked[init]}
    if [n for n in _names(nodes, WORKSPACE_NAME) if id(n) not in inside_init] or len(
        _names(walked[init], WORKSPACE_NAME)
    ) != 1:
        return "code outside __init__ names the shared workspace %r" % WORKSPACE_NAME
    if any(isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == site.GATED_GLOBAL for n in nodes):
        return "the module imports from FlashInfer by name: a route around the gate"
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
    walked = {tree: tuple(ast.walk(tree))}
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


HOTFIX = Hotfix(
    name=NAME,
    upstream=UPSTREAM,
    summary="on SM90/SM120, TRT-LLM MHA's fmha_v2 prefill no longer writes into XQA decode's semaphores "
    "(8 MiB more workspace, fmha_v2 gets the part after them)",
    effect="on SM90/SM120 the shared workspace holds 8 MiB for XQA's semaphores and fmha_v2 gets the part after them",
    distribution="sglang",
    target="%s.%s.%s" % (site.MODULE, CLASS_NAME, METHOD),
    # Both armed by the first __init__ on XQA: get_buffer's for the allocation, FlashInfer's (the
    # kernel-call site's, shared with its records) for what fmha_v2 receives.
    gates=((BUFFER_GLOBAL, make_buffer_gate), (site.GATED_GLOBAL, site.make_gate)),
    classify=classify,
    wrapper=allocate_as_upstream,
    on_wrap=rearm,
    known_fingerprints=ReleaseTable(os.path.join(os.path.dirname(os.path.abspath(__file__)), NAME + "_releases.json")),
)
