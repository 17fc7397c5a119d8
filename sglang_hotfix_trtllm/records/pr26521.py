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

``classify`` accepts a source as ``affected`` only when the live definition
(the last one Python binds) has exactly the shape that argument relies on: the
parameter list the wrapper binds its arguments with, the two branch
conditions it re-evaluates, and, on the draft-decode path, only statements of
an allow-list taken from the affected releases (the binding of that buffer
view once, nothing that writes it). Anything else is ``unknown``.
"""

import ast
import os

from .. import detect, logs
from ..fingerprint import is_docstring, of_node
from ..record import Classification, Hotfix, Verdict
from ..release_table import ReleaseTable

CLASS_NAME = "TRTLLMHAAttnBackend"
METHOD_NAME = "init_forward_metadata_capture_cuda_graph"
# 0.5.13 replaced the method by one body shared by capture and replay, entered
# through this method; that body writes cache_seqlens before use.
SHARED_BODY_ENTRY = "init_forward_metadata_out_graph"
BUFFER_DICT = "decode_cuda_graph_metadata"
BUFFER_KEY = "cache_seqlens"
METADATA_FIELD = "cache_seqlens_int32"


# --------------------------------------------------------------------------
# The repair


def _arguments(self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode, spec_info):
    """Binds a call exactly as the target method's parameter list does (classify()
    demands that list), so a call the method rejects is rejected here too."""
    return self, bs, seq_lens, forward_mode, spec_info


# The method's parameters after ``self``, in order: the wrapper binds calls with
# ``_arguments``, so classify() demands exactly its parameter list (one list, here).
PARAMETERS = _arguments.__code__.co_varnames[1 : _arguments.__code__.co_argcount]


def prefill_draft_decode_seqlens(module, wrapped, instance, args, kwargs):
    """wrapt wrapper: write ``seq_lens + speculative_step_id + 1`` into the
    draft-decode ``cache_seqlens`` view, then run the original method.

    Every call shape binds as it would on the original: through an instance,
    through the class (``self`` positional or by keyword), ``functools.partial``,
    ``types.MethodType``, ``super()``. A call the original rejects writes
    nothing: the original is then called as it was, and raises its own TypeError.
    When the write cannot be made (an object without the buffers, odd inputs),
    nothing is written, one warning says why, and the original runs as it would
    alone. ``module`` (the module the hotfix was applied to) is not needed here.
    """
    try:
        if instance is None:
            backend, bs, seq_lens, forward_mode, spec_info = _arguments(*args, **kwargs)
        else:
            backend, bs, seq_lens, forward_mode, spec_info = _arguments(instance, *args, **kwargs)
    except TypeError:
        return wrapped(*args, **kwargs)
    try:
        if spec_info is not None and forward_mode.is_decode_or_idle():
            # Spelled out rather than getattr(BUFFER_DICT): this runs on every capture call.
            # `seq_lens + (step + 1)` is upstream's `seq_lens + step + 1` with one tensor operation instead of
            # two; integer addition is associative (wrap-around included), so the values are identical.
            backend.decode_cuda_graph_metadata[BUFFER_KEY][:bs].copy_(seq_lens + (backend.speculative_step_id + 1))
    except Exception as error:
        logs.repair_skipped(HOTFIX.target, HOTFIX.name, error)
    return wrapped(*args, **kwargs)


# --------------------------------------------------------------------------
# Recognising the code
#
# An allow-list, not a deny-list: the statements a draft-decode capture runs
# (those before the `if forward_mode.is_decode_or_idle():` chain, the
# `if spec_info is not None:` body, and those after the chain) must each be
# one of the statements below, as they appear in SGLang 0.5.1 to 0.5.12.post1
# (compared after ast.unparse, so formatting and comments do not matter).
# None of them writes the buffer: the only uses of it are the binding and
# the torch.cumsum read. Any other statement on that path -- an alias, a
# write through `.data`, a slice assignment, the view passed to a call --
# makes the verdict `unknown`.

BINDING = "metadata.cache_seqlens_int32 = self.decode_cuda_graph_metadata['cache_seqlens'][:bs]"
DRAFT_DECODE_PATH = frozenset(
    (
        "metadata = TRTLLMMHAMetadata()",
        "device = seq_lens.device",
        BINDING,
        "metadata.max_seq_len_k = seq_lens.max().item() + (self.speculative_step_id + 1)",
        "metadata.cu_seqlens_q = self.decode_cuda_graph_metadata['cu_seqlens_q'][:bs + 1]",
        "metadata.cu_seqlens_k = torch.nn.functional.pad(torch.cumsum(metadata.cache_seqlens_int32, dim=0, dtype=torch.int32), (1, 0))",  # noqa: E501 (verbatim data)
        "metadata.page_table = self.decode_cuda_graph_metadata['page_table_draft_decode'][:bs, :]",
        "self._bind_swa_page_table(metadata, self.decode_cuda_graph_metadata, 'swa_page_table_draft_decode', bs)",
        "self.decode_cuda_graph_metadata[bs] = metadata",
        "self.forward_metadata = metadata",
    )
)
# What the path runs before the binding, in this order, in every affected
# release: nothing that can stop the method or read the buffer, so writing it
# before the method starts equals writing it right after the binding.
BEFORE_BINDING = ("metadata = TRTLLMMHAMetadata()", "device = seq_lens.device")
# Methods of the class the path calls, by the fingerprint of the code they
# must have: `_bind_swa_page_table` (0.5.9 to 0.5.12.post1) receives the
# buffer dict and only reads another key of it.
PATH_HELPERS = {"_bind_swa_page_table": frozenset(("ast1:00e24d335c4ab3f5",))}
# The attributes the wrapper and the path reach by plain `x.name` only: the
# buffer table and step id it reads off the backend, the metadata field the
# path binds. Any other route to them (a descriptor, a write by name) is refused.
RELIED_ON = (BUFFER_DICT, "speculative_step_id", METADATA_FIELD)
# PR #26521's statement, verbatim: `fixed` means exactly this, right after the binding.
UPSTREAM_STATEMENT = "metadata.cache_seqlens_int32.copy_(seq_lens + self.speculative_step_id + 1)"


def _is_decode_test(node):
    return ast.unparse(node) == "forward_mode.is_decode_or_idle()"


def _draft_decode_path(method):
    """(the statements a draft-decode capture runs, "") or (None, why not)."""
    body = [s for s in method.body if not is_docstring(s)]
    index = next((i for i, s in enumerate(body) if isinstance(s, ast.If) and _is_decode_test(s.test)), None)
    if index is None:
        return None, "no top-level `if forward_mode.is_decode_or_idle():` branch"
    branch = body[index]
    if len(branch.body) != 1 or not (
        isinstance(branch.body[0], ast.If) and ast.unparse(branch.body[0].test) == "spec_info is not None"
    ):
        return None, "the decode branch is not a single `if spec_info is not None:` (draft decode) split"
    return body[:index] + branch.body[0].body + body[index + 1 :], ""


def _unrecognised_helper_calls(tree, cls, path):
    problems = []
    for statement in path:
        for node in ast.walk(statement):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "self"
            ):
                name = node.func.attr
                helper, problem = detect.live_method(tree, cls, name)
                if helper is None or of_node(helper) not in PATH_HELPERS.get(name, ()):
                    problems.append("self.%s() is not a known helper%s" % (name, " (%s)" % problem if problem else ""))
    return problems


def classify(tree):
    """Classify the source of ``trtllm_mha_backend`` (an ``ast.Module``): the
    live definitions only (see ``detect``), the draft-decode path by the
    allow-list above."""
    cls, problem = detect.live_class(tree, CLASS_NAME)
    if cls is None:
        return Classification(Verdict.UNKNOWN, problem, of_node(tree))
    method, problem = detect.live_method(tree, cls, METHOD_NAME)
    if method is None:
        if problem:
            return Classification(Verdict.UNKNOWN, problem, of_node(cls))
        entry, problem = detect.live_method(tree, cls, SHARED_BODY_ENTRY)
        if entry is not None:
            return Classification(
                Verdict.FIXED,
                "%s is gone; capture and replay share one body entered through %s "
                "(the SGLang 0.5.13 refactor, which writes cache_seqlens)" % (METHOD_NAME, SHARED_BODY_ENTRY),
                of_node(cls),
            )
        return Classification(
            Verdict.UNKNOWN,
            problem or "%s.%s not found and no %s either" % (CLASS_NAME, METHOD_NAME, SHARED_BODY_ENTRY),
            of_node(cls),
        )

    fingerprint = of_node(method)
    first_line = detect.first_line_of(method)

    def unknown(reason):
        return Classification(Verdict.UNKNOWN, reason, fingerprint, first_line)

    problem = detect.signature_problem(method, PARAMETERS)
    if problem:
        return unknown(problem)

    path, problem = _draft_decode_path(method)
    if path is None:
        return unknown(problem)
    texts = [ast.unparse(s) for s in path]
    if texts.count(BINDING) != 1:
        return unknown(
            "the draft-decode path binds metadata.%s = self.%s[%r][:bs] %d times (expected once)"
            % (METADATA_FIELD, BUFFER_DICT, BUFFER_KEY, texts.count(BINDING))
        )
    binding = texts.index(BINDING)
    if tuple(texts[:binding]) != BEFORE_BINDING:
        return unknown(
            "the draft-decode path does not reach the binding through exactly `%s` (the wrapper's write "
            "comes before the method starts, upstream's after the binding: nothing between may differ)"
            % "; ".join(BEFORE_BINDING)
        )
    upstream = binding + 1 < len(texts) and texts[binding + 1] == UPSTREAM_STATEMENT
    others = [(s, t) for i, (s, t) in enumerate(zip(path, texts)) if not (upstream and i == binding + 1)]
    strangers = [(s, t) for s, t in others if t not in DRAFT_DECODE_PATH]
    if strangers:
        statement, text = strangers[0]
        return unknown(
            "the draft-decode path runs a statement this hotfix does not know (line %d: %s)%s"
            % (
                statement.lineno,
                text if len(text) <= 100 else text[:97] + "...",
                "" if len(strangers) == 1 else " and %d more" % (len(strangers) - 1),
            )
        )
    helpers = _unrecognised_helper_calls(tree, cls, path)
    if helpers:
        return unknown("the draft-decode path calls code this hotfix does not know: %s" % "; ".join(helpers))
    problem = detect.attribute_routes_problem(tree, RELIED_ON)
    if problem:
        return unknown(problem)
    if upstream:
        return Classification(
            Verdict.FIXED,
            "draft-decode branch copies the lengths into the buffer right after binding it (PR #26521)",
            fingerprint,
            first_line,
        )
    return Classification(
        Verdict.AFFECTED,
        "draft-decode branch binds self.%s[%r][:bs] and derives from it without writing the lengths"
        % (BUFFER_DICT, BUFFER_KEY),
        fingerprint,
        first_line,
    )


# --------------------------------------------------------------------------
# Upstream's fix, for `sglang-hotfix-trtllm verify`


def upstream_fixed_method_node(tree):
    """The target method's AST with PR #26521's statement inserted right after
    the draft-decode binding, as upstream inserted it (for an affected source)."""
    cls, _ = detect.live_class(tree, CLASS_NAME)
    method, _ = detect.live_method(tree, cls, METHOD_NAME)
    decode_branch = next(n for n in method.body if isinstance(n, ast.If) and _is_decode_test(n.test))
    draft_body = decode_branch.body[0].body
    binding = next(i for i, statement in enumerate(draft_body) if ast.unparse(statement) == BINDING)
    statement = ast.parse(UPSTREAM_STATEMENT).body[0]
    draft_body.insert(binding + 1, ast.copy_location(statement, draft_body[binding]))
    return ast.fix_missing_locations(method)


HOTFIX = Hotfix(
    name="pr26521",
    upstream="SGLang PR #26521",
    summary="TRT-LLM MHA draft-decode CUDA-graph capture fills cache_seqlens before use",
    effect="draft-decode CUDA-graph capture now fills cache_seqlens",
    distribution="sglang",
    target="sglang.srt.layers.attention.trtllm_mha_backend.%s.%s" % (CLASS_NAME, METHOD_NAME),
    classify=detect.walked_once(classify),
    wrapper=prefill_draft_decode_seqlens,
    known_fingerprints=ReleaseTable(os.path.join(os.path.dirname(os.path.abspath(__file__)), "pr26521_releases.json")),
    probe="sglang_hotfix_trtllm.records.pr26521_probe:probe",
)
