"""The hotfix record for SGLang PR #26521: draft-decode capture leaves
``cache_seqlens`` at zero.

Standard library only (the wrapper touches tensors through their methods and
never imports torch).

The bug: in ``TRTLLMHAAttnBackend.init_forward_metadata_capture_cuda_graph``,
branch ``forward_mode.is_decode_or_idle()`` / ``spec_info is not None`` binds
``self.decode_cuda_graph_metadata["cache_seqlens"][:bs]`` (a zero-filled
buffer) and derives ``cu_seqlens_k`` from it without first writing the
lengths. Upstream's fix is one statement right after the binding::

    metadata.cache_seqlens_int32.copy_(seq_lens + self.speculative_step_id + 1)

The repair: the wrapper performs that same copy into the same buffer view
*before* calling the original method. The original then binds a view that
already holds the lengths, and everything it derives afterwards is what the
upstream-fixed method derives. The other branches are not touched at all.

``classify`` accepts a source as ``affected`` only when it has exactly the
shape that argument relies on: the parameter list the wrapper reads its
arguments from, the two branch conditions it re-evaluates, the binding of
that buffer view, and no other write to it. Anything else is ``unknown``.
"""

import ast

from .fingerprint import of_node
from .record import Classification, Hotfix, Verdict
from .release_table import ReleaseTable

CLASS_NAME = "TRTLLMHAAttnBackend"
METHOD_NAME = "init_forward_metadata_capture_cuda_graph"
# 0.5.13 replaced the method by one body shared by capture and replay, entered
# through this method; that body writes cache_seqlens before use.
SHARED_BODY_ENTRY = "init_forward_metadata_out_graph"
BUFFER_DICT = "decode_cuda_graph_metadata"
BUFFER_KEY = "cache_seqlens"
METADATA_FIELD = "cache_seqlens_int32"
STEP_ATTRIBUTE = "speculative_step_id"

# The method's parameters after ``self``, in order: the wrapper finds its
# inputs by these positions or names, so classify() demands exactly these.
PARAMETERS = ("bs", "num_tokens", "req_pool_indices", "seq_lens", "encoder_lens", "forward_mode", "spec_info")
_BS, _SEQ_LENS, _FORWARD_MODE, _SPEC_INFO = (PARAMETERS.index(n) for n in ("bs", "seq_lens", "forward_mode", "spec_info"))


# --------------------------------------------------------------------------
# The repair


def prefill_draft_decode_seqlens(wrapped, instance, args, kwargs):
    """wrapt wrapper: write ``seq_lens + speculative_step_id + 1`` into the
    draft-decode ``cache_seqlens`` view, then run the original method.

    Arguments are read by the positions and names of ``PARAMETERS`` (classify()
    guarantees the method has exactly those); the common call shapes -- all
    positional, or the multi-step draft backend's four positional plus
    keywords -- take the short path.
    """
    backend, call_args = instance, args
    if backend is None and args:  # called through the class: self is args[0]
        backend, call_args = args[0], args[1:]
    count = len(call_args)
    try:
        spec_info = call_args[_SPEC_INFO] if count > _SPEC_INFO else kwargs["spec_info"]
        if spec_info is not None:
            forward_mode = call_args[_FORWARD_MODE] if count > _FORWARD_MODE else kwargs["forward_mode"]
            bs = call_args[_BS] if count > _BS else kwargs["bs"]
            seq_lens = call_args[_SEQ_LENS] if count > _SEQ_LENS else kwargs["seq_lens"]
    except KeyError:
        # A call the original cannot bind either: let it raise its own TypeError.
        return wrapped(*args, **kwargs)
    if spec_info is not None and forward_mode.is_decode_or_idle():
        # Spelled out rather than getattr(BUFFER_DICT) / STEP_ATTRIBUTE: this runs on every capture call.
        # `seq_lens + (step + 1)` is upstream's `seq_lens + step + 1` with one tensor operation instead of
        # two; integer addition is associative (wrap-around included), so the values are identical.
        backend.decode_cuda_graph_metadata[BUFFER_KEY][:bs].copy_(seq_lens + (backend.speculative_step_id + 1))
    return wrapped(*args, **kwargs)


# --------------------------------------------------------------------------
# Recognising the code


def _is_name(node, name):
    return isinstance(node, ast.Name) and node.id == name


def _is_attribute(node, owner, attribute):
    return isinstance(node, ast.Attribute) and node.attr == attribute and _is_name(node.value, owner)


def _is_buffer(node):
    """``self.decode_cuda_graph_metadata["cache_seqlens"]``"""
    return (
        isinstance(node, ast.Subscript)
        and _is_attribute(node.value, "self", BUFFER_DICT)
        and isinstance(node.slice, ast.Constant)
        and node.slice.value == BUFFER_KEY
    )


def _is_buffer_view_binding(statement):
    """``metadata.cache_seqlens_int32 = self.decode_cuda_graph_metadata["cache_seqlens"][:bs]``"""
    if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1):
        return False
    value = statement.value
    return (
        _is_attribute(statement.targets[0], "metadata", METADATA_FIELD)
        and isinstance(value, ast.Subscript)
        and _is_buffer(value.value)
        and isinstance(value.slice, ast.Slice)
        and value.slice.lower is None
        and value.slice.step is None
        and _is_name(value.slice.upper, "bs")
    )


def _is_draft_decode_test(node):
    return (
        isinstance(node, ast.Compare)
        and _is_name(node.left, "spec_info")
        and len(node.ops) == 1
        and isinstance(node.ops[0], ast.IsNot)
        and isinstance(node.comparators[0], ast.Constant)
        and node.comparators[0].value is None
    )


def _is_decode_test(node):
    return (
        isinstance(node, ast.Call)
        and _is_attribute(node.func, "forward_mode", "is_decode_or_idle")
        and not node.args
        and not node.keywords
    )


def _refers_to_view(node, view_names):
    """True for the view, the raw buffer, or any subscript of either."""
    while isinstance(node, ast.Subscript) and not _is_buffer(node):
        node = node.value
    return _is_buffer(node) or any(_is_attribute(node, "metadata", f) for f in view_names)


def _writes(statement, view_names):
    """Nodes in ``statement`` that write into the buffer (in-place calls,
    subscript or augmented assignment, ``out=``)."""
    found = []
    for node in ast.walk(statement):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr.endswith("_") and not func.attr.startswith("_"):
                if _refers_to_view(func.value, view_names):
                    found.append(node)
            for keyword in node.keywords:
                if keyword.arg == "out" and _refers_to_view(keyword.value, view_names):
                    found.append(node)
        elif isinstance(node, ast.AugAssign) and _refers_to_view(node.target, view_names):
            found.append(node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Subscript) and _refers_to_view(target.value, view_names):
                    found.append(node)
    return found


def _mentions(node, predicate):
    return any(predicate(child) for child in ast.walk(node))


def _is_upstream_copy(statement):
    """``metadata.cache_seqlens_int32.copy_(<expr of seq_lens and self.speculative_step_id>)``"""
    if not (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call)):
        return False
    call = statement.value
    return (
        isinstance(call.func, ast.Attribute)
        and call.func.attr == "copy_"
        and _is_attribute(call.func.value, "metadata", METADATA_FIELD)
        and len(call.args) == 1
        and not call.keywords
        and _mentions(call.args[0], lambda n: _is_name(n, "seq_lens"))
        and _mentions(call.args[0], lambda n: _is_attribute(n, "self", STEP_ATTRIBUTE))
    )


def first_line_of(function):
    """The line a function's code object reports as co_firstlineno."""
    return min([function.lineno] + [d.lineno for d in function.decorator_list])


def _find_method(cls, name):
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    return None


def _assigned_names(node):
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def target_text(text):
    """(source of the target method dedented to column 0, its first line) found
    by reading lines, or None. Parsing ~150 lines instead of the whole module
    saves milliseconds on the import path; the engine uses it only to look the
    fingerprint up in the release table, and parses the whole module otherwise."""
    lines = text.splitlines(keepends=True)
    header = "class " + CLASS_NAME
    start_class = next((i for i, l in enumerate(lines) if l.startswith(header) and l[len(header):len(header) + 1] in ("(", ":")), None)
    if start_class is None:
        return None
    definition = "    def " + METHOD_NAME + "("
    start = None
    for index in range(start_class + 1, len(lines)):
        line = lines[index]
        if line.strip() and not line[0].isspace() and not line.startswith("#"):
            return None  # the class ended without the method
        if line.startswith(definition):
            start = index
            break
    if start is None:
        return None
    first = start
    while first > start_class + 1 and lines[first - 1].startswith("    @"):
        first -= 1
    end = len(lines)
    for index in range(start + 1, len(lines)):
        stripped = lines[index].strip()
        # The next statement at class level ends the method; a closing bracket
        # there (`    ):` after the parameters) does not.
        if stripped and stripped[0] not in "#)]}" and len(lines[index]) - len(lines[index].lstrip()) <= 4:
            end = index
            break
    body = "".join(line[4:] if line.startswith("    ") else line.lstrip(" \t") for line in lines[first:end])
    return body, first + 1


def fingerprinted_node(tree):
    """(node whose fingerprint identifies this source, the target method or None):
    the target method; where it is gone, its class; without the class, the module."""
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == CLASS_NAME), None)
    if cls is None:
        return tree, None
    method = _find_method(cls, METHOD_NAME)
    return (method, method) if method is not None else (cls, None)


def classify(tree):
    """Classify the source of ``trtllm_mha_backend`` (an ``ast.Module``) from its structure."""
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == CLASS_NAME), None)
    if cls is None:
        return Classification(Verdict.UNKNOWN, "class %s not found in the module" % CLASS_NAME, of_node(tree))
    method = _find_method(cls, METHOD_NAME)
    if method is None:
        if _find_method(cls, SHARED_BODY_ENTRY) is not None:
            return Classification(
                Verdict.FIXED,
                "%s is gone; capture and replay share one body entered through %s "
                "(the SGLang 0.5.13 refactor, which writes cache_seqlens)" % (METHOD_NAME, SHARED_BODY_ENTRY),
                of_node(cls),
            )
        return Classification(Verdict.UNKNOWN, "%s.%s not found and no %s either" % (CLASS_NAME, METHOD_NAME, SHARED_BODY_ENTRY), of_node(cls))

    fingerprint = of_node(method)
    first_line = first_line_of(method)

    def unknown(reason):
        return Classification(Verdict.UNKNOWN, reason, fingerprint, first_line)

    arguments = method.args
    names = tuple(a.arg for a in arguments.posonlyargs + arguments.args)
    if (
        isinstance(method, ast.AsyncFunctionDef)
        or method.decorator_list
        or names != ("self",) + PARAMETERS
        or arguments.vararg
        or arguments.kwarg
        or arguments.kwonlyargs
        or arguments.defaults
        or arguments.posonlyargs
    ):
        return unknown("unexpected signature: (%s)" % ", ".join(names))
    reassigned = _assigned_names(method) & {"self", "bs", "seq_lens", "forward_mode", "spec_info"}
    if reassigned:
        return unknown("the method rebinds its parameter(s) %s" % ", ".join(sorted(reassigned)))

    decode_branch = next((n for n in method.body if isinstance(n, ast.If) and _is_decode_test(n.test)), None)
    if decode_branch is None:
        return unknown("no top-level `if forward_mode.is_decode_or_idle():` branch")
    if len(decode_branch.body) != 1 or not (
        isinstance(decode_branch.body[0], ast.If) and _is_draft_decode_test(decode_branch.body[0].test)
    ):
        return unknown("the decode branch is not a single `if spec_info is not None:` (draft decode) split")
    draft_body = decode_branch.body[0].body

    bindings = [i for i, statement in enumerate(draft_body) if _is_buffer_view_binding(statement)]
    if len(bindings) != 1:
        return unknown(
            "the draft-decode branch binds metadata.%s = self.%s[%r][:bs] %d times (expected once)"
            % (METADATA_FIELD, BUFFER_DICT, BUFFER_KEY, len(bindings))
        )
    binding = bindings[0]
    if not any(_mentions(s, lambda n: _is_attribute(n, "self", STEP_ATTRIBUTE)) for s in draft_body):
        return unknown("the draft-decode branch does not use self.%s" % STEP_ATTRIBUTE)

    # Writes into the buffer anywhere in the method: through the draft-decode
    # view, or through the raw buffer in any branch.
    draft_writes = [w for s in draft_body for w in _writes(s, (METADATA_FIELD,))]
    raw_writes = [w for s in method.body for w in _writes(s, ())]
    raw_uses = [n for n in ast.walk(method) if _is_buffer(n)]
    if len(raw_uses) != 1 or raw_writes:
        return unknown("self.%s[%r] is used %d times outside the draft-decode binding" % (BUFFER_DICT, BUFFER_KEY, len(raw_uses) - 1))
    rebinds = [
        s for s in draft_body[binding + 1 :]
        if _mentions(s, lambda n: isinstance(n, ast.Attribute) and n.attr == METADATA_FIELD and isinstance(n.ctx, ast.Store))
    ]
    if rebinds:
        return unknown("metadata.%s is rebound after the buffer view is bound" % METADATA_FIELD)

    if not draft_writes:
        return Classification(
            Verdict.AFFECTED,
            "draft-decode branch binds self.%s[%r][:bs] and derives from it without writing the lengths"
            % (BUFFER_DICT, BUFFER_KEY),
            fingerprint,
            first_line,
        )
    following = draft_body[binding + 1] if binding + 1 < len(draft_body) else None
    if len(draft_writes) == 1 and following is not None and _is_upstream_copy(following):
        return Classification(
            Verdict.FIXED,
            "draft-decode branch copies the lengths into the buffer right after binding it (PR #26521)",
            fingerprint,
            first_line,
        )
    return unknown(
        "the draft-decode branch writes the buffer %d time(s), not as PR #26521 does" % len(draft_writes)
    )


# --------------------------------------------------------------------------
# Upstream's fix, for `sglang-hotfix-trtllm verify`

UPSTREAM_STATEMENT = "metadata.cache_seqlens_int32.copy_(seq_lens + self.speculative_step_id + 1)"


def upstream_fixed_method_node(tree):
    """The target method's AST with PR #26521's statement inserted right after
    the draft-decode binding, as upstream inserted it (for an affected source)."""
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == CLASS_NAME)
    method = _find_method(cls, METHOD_NAME)
    decode_branch = next(n for n in method.body if isinstance(n, ast.If) and _is_decode_test(n.test))
    draft_body = decode_branch.body[0].body
    binding = next(i for i, statement in enumerate(draft_body) if _is_buffer_view_binding(statement))
    statement = ast.parse(UPSTREAM_STATEMENT).body[0]
    draft_body.insert(binding + 1, ast.copy_location(statement, draft_body[binding]))
    return ast.fix_missing_locations(method)


HOTFIX = Hotfix(
    name="pr26521",
    upstream="SGLang PR #26521",
    distribution="sglang",
    module="sglang.srt.layers.attention.trtllm_mha_backend",
    class_name=CLASS_NAME,
    method_name=METHOD_NAME,
    first_fixed_release="0.5.13",
    classify=classify,
    fingerprinted_node=fingerprinted_node,
    target_text=target_text,
    first_line_of=first_line_of,
    wrapper=prefill_draft_decode_seqlens,
    known_fingerprints=ReleaseTable("pr26521_releases.json"),
    probe="sglang_hotfix_trtllm.pr26521_probe:probe",
)
