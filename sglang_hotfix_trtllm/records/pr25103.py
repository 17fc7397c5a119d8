"""The hotfix record for SGLang PR #25103 with #26966's exception: an EAGLE
draft's TRT-LLM MHA backend reads the target's sliding-window KV mapping.

Standard library only.

The bug (SGLang 0.5.9 to 0.5.12.post1): ``TRTLLMHAAttnBackend.__init__``
decides whether it runs on a sliding-window (SWA) KV pool, and which pool's
layer mapping to use, from the token-to-KV *allocator*::

    allocator = model_runner.token_to_kv_pool_allocator
    self.use_sliding_window_kv_pool = isinstance(allocator, SWATokenToKVPoolAllocator)
    self._swa_kv_pool = allocator.get_kvcache() if self.use_sliding_window_kv_pool else None

An EAGLE draft worker shares the target's allocator but owns a plain KV pool
whose layer ids start at 0; on a target whose layer 0 is a sliding-window
layer (gpt-oss, Llama 4) the draft then translates its KV indices through the
target's SWA mapping and reads the wrong slots of its own pool. The target
verifies every draft token, so outputs stay right; the accept length drops.

Upstream's fix, as SGLang 0.5.13 ships it (PR #25103, undone for drafts by
#26966 to fix Gemma-4 FROZEN_KV MTP, both relanded together by #27491):
``_resolve_swa_kv_pool(model_runner)`` takes the *active* pool when it is an
``SWAKVPool``; an EAGLE-style draft (a draft worker whose algorithm is not
FROZEN_KV MTP, which reads the target's KV) gets None; otherwise the
allocator's pool when it is an ``SWAKVPool``. 0.5.13's helpers ask
``self._swa_kv_pool is None`` where the affected releases ask
``self.use_sliding_window_kv_pool``.

The repair: after SGLang's ``__init__`` has run, the wrapper resolves the pool
as 0.5.13 does and sets both attributes (the flag to "a pool was resolved"),
so every helper of the affected releases sees what 0.5.13's helpers see.
``SpeculativeAlgorithm.is_frozen_kv_mtp`` exists from 0.5.12 on; before, there
is no FROZEN_KV MTP, and its absence reads as "not FROZEN_KV MTP".

``classify`` accepts a source as ``affected`` only when the live ``__init__``
has the parameter list the wrapper binds with, resolves the pool with exactly
the three statements above (and nothing else in it touches the two attributes
or the local ``allocator``), and every other function of the module that
touches the attributes is one of the affected releases' helpers, by
fingerprint, and only reads them. ``fixed`` is a live ``_resolve_swa_kv_pool``
of a known fingerprint that ``__init__`` assigns from. Releases whose backend
has no SWA handling at all are ``not-applicable``. Anything else is ``unknown``.
"""

import ast
import os

from .. import detect, logs
from ..fingerprint import is_docstring, of_node
from ..record import Classification, Hotfix, Verdict
from ..release_table import ReleaseTable

CLASS_NAME = "TRTLLMHAAttnBackend"
METHOD_NAME = "__init__"
RESOLVER = "_resolve_swa_kv_pool"
ATTRIBUTES = ("use_sliding_window_kv_pool", "_swa_kv_pool")
POOL_CLASS = "SWAKVPool"  # the module's own name for it; the wrapper reads it from the module
POOL_MODULE = "sglang.srt.mem_cache.swa_memory_pool"


# --------------------------------------------------------------------------
# The repair


def _arguments(
    self, model_runner, skip_prefill=False, kv_indptr_buf=None, kv_last_page_len_buf=None, speculative_step_id=0
):
    """Binds a call exactly as ``__init__``'s parameter list does (classify()
    demands that list, defaults included)."""
    return self, model_runner


PARAMETERS = _arguments.__code__.co_varnames[1 : _arguments.__code__.co_argcount]
DEFAULTS = tuple(repr(value) for value in _arguments.__defaults__)


def resolve_swa_kv_pool(model_runner, swa_kv_pool_class):
    """The pool SGLang 0.5.13's ``_resolve_swa_kv_pool`` returns for this model runner."""
    active_pool = model_runner.token_to_kv_pool
    if isinstance(active_pool, swa_kv_pool_class):
        return active_pool
    if model_runner.is_draft_worker:
        is_frozen_kv_mtp = getattr(model_runner.spec_algorithm, "is_frozen_kv_mtp", None)
        if is_frozen_kv_mtp is None or not is_frozen_kv_mtp():
            return None
    kvcache = model_runner.token_to_kv_pool_allocator.get_kvcache()
    return kvcache if isinstance(kvcache, swa_kv_pool_class) else None


def resolve_from_active_pool(module, wrapped, instance, args, kwargs):
    """wrapt wrapper of ``__init__``: run SGLang's, then set ``_swa_kv_pool`` and
    ``use_sliding_window_kv_pool`` from the pool 0.5.13 would resolve.

    SGLang's ``__init__`` runs first and unchanged, so a call it rejects raises
    its own error before anything here runs. ``SWAKVPool`` is read from
    ``module``, the module the hotfix was applied to, at each call (as the
    module's own code reads it), never from ``wrapped``'s globals: another
    patcher's wrapper below has globals of its own. When the pool cannot be
    resolved (a model runner without an attribute 0.5.13 reads: test doubles,
    tools), both attributes stay as SGLang set them and one warning says why.
    """
    result = wrapped(*args, **kwargs)
    backend, model_runner = _arguments(*args, **kwargs) if instance is None else _arguments(instance, *args, **kwargs)
    try:
        pool = resolve_swa_kv_pool(model_runner, vars(module)[POOL_CLASS])
    except Exception as error:
        logs.repair_skipped(HOTFIX.target, HOTFIX.name, error)
        return result
    backend._swa_kv_pool = pool
    backend.use_sliding_window_kv_pool = pool is not None
    return result


# --------------------------------------------------------------------------
# Recognising the code

# __init__'s pool resolution in SGLang 0.5.9 to 0.5.12.post1 (compared after
# ast.unparse, so formatting and comments do not matter), consecutive, once.
ALLOCATOR_RESOLUTION = (
    "allocator = model_runner.token_to_kv_pool_allocator",
    "self.use_sliding_window_kv_pool = isinstance(allocator, SWATokenToKVPoolAllocator)",
    "self._swa_kv_pool: Optional[SWAKVPool] = allocator.get_kvcache() if self.use_sliding_window_kv_pool else None",
)
# The functions that read the two attributes in those releases, by the
# fingerprint of the code they must have: each only reads them, and asks the
# flag before using the pool, so flag and pool set together are all they see.
READERS = {
    "_maybe_translate_swa": frozenset(("ast1:c0a65afd2919a2e2",)),
    "_alloc_swa_page_table": frozenset(("ast1:675192b232aeb7e6",)),
    "_get_layer_cache_loc": frozenset(("ast1:11cc781c9c76d601", "ast1:fdd5b756c9ed4e65")),
    "_get_layer_page_table": frozenset(("ast1:493eaef90bae8bfe",)),
}
# 0.5.13's statement, verbatim, and the resolver's fingerprint (0.5.13 to 0.5.23).
UPSTREAM_STATEMENT = "self._swa_kv_pool: Optional[SWAKVPool] = self._resolve_swa_kv_pool(model_runner)"
RESOLVER_FINGERPRINTS = frozenset(("ast1:832677301bcac5e6",))


def _touches(node):
    """(line, how) of every use of the two attributes under ``node``."""
    return [
        (sub.lineno, type(sub.ctx).__name__)
        for sub in detect.walk(node)
        if isinstance(sub, ast.Attribute) and sub.attr in ATTRIBUTES
    ]


def _functions(tree):
    """Every function of the module, with the class it is defined in (or None)."""
    found = []

    def visit(body, cls):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((node, cls))
            if isinstance(node, ast.ClassDef):
                visit(node.body, node)
            elif hasattr(node, "body") and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for field in ("body", "orelse", "finalbody", "handlers"):
                    visit(getattr(node, field, []) or [], cls)

    visit(tree.body, None)
    return found


def _pool_class_problem(tree):
    """None when the module binds ``SWAKVPool`` once, by importing it from SGLang's pool module."""
    bindings = [s for s in tree.body if detect._binds_directly(s, POOL_CLASS)]
    imported = [
        s
        for s in bindings
        if isinstance(s, ast.ImportFrom)
        and s.module == POOL_MODULE
        and s.level == 0
        and any(a.name == POOL_CLASS and a.asname is None for a in s.names)
    ]
    if len(bindings) != 1 or len(imported) != 1:
        return "%s is not bound once, by `from %s import %s`" % (POOL_CLASS, POOL_MODULE, POOL_CLASS)
    if any(isinstance(s, detect._COMPOUND) and detect._nested_bindings(s, POOL_CLASS) for s in tree.body):
        return "%s is bound conditionally" % POOL_CLASS
    return None


def _readers_problem(methods):
    """None when every helper the repair relies on is, by name, exactly the code
    of a known release (pinned whether or not it still touches the attributes:
    a reader that lost its flag test touches nothing yet reads the wrong pool)."""
    for name in sorted(READERS):
        function, problem = methods[name]
        if problem:
            return problem
        if function is not None and of_node(function) not in READERS[name]:
            return "%s.%s is not the code of a known release (fingerprint %s)" % (CLASS_NAME, name, of_node(function))
    return None


def classify(tree):
    """Classify the source of ``trtllm_mha_backend`` (an ``ast.Module``)."""
    cls, class_problem = detect.live_class(tree, CLASS_NAME)
    if cls is None:  # no backend here at all (an empty file, say): as for pr26521, not SGLang's code
        return Classification(Verdict.UNKNOWN, class_problem, of_node(tree))
    # One walk of the module for every method this needs to know the live definition of.
    methods = detect.live_methods(tree, cls, (METHOD_NAME, RESOLVER) + tuple(READERS))
    method, problem = methods[METHOD_NAME]
    uses = [(function, owner, _touches(function)) for function, owner in _functions(tree)]
    if not any(found for _, _, found in uses) and not _touches(tree):
        return Classification(
            Verdict.NOT_APPLICABLE,
            "this backend has no sliding-window KV pool handling (added in SGLang 0.5.9)",
            of_node(method if method is not None else tree),
        )
    if method is None:
        return Classification(Verdict.UNKNOWN, problem or "%s.%s not found" % (CLASS_NAME, METHOD_NAME), of_node(cls))
    fingerprint = of_node(method)
    first_line = detect.first_line_of(method)

    def unknown(reason):
        return Classification(Verdict.UNKNOWN, reason, fingerprint, first_line)

    problem = detect.signature_problem(method, PARAMETERS, DEFAULTS)
    if problem:
        return unknown(problem)

    body = [s for s in method.body if not is_docstring(s)]
    texts = [ast.unparse(s) for s in body]
    resolver, problem = methods[RESOLVER]
    if problem:
        return unknown(problem)
    if resolver is not None:
        overwrites = [
            line for s, t in zip(body, texts) if t != UPSTREAM_STATEMENT for line, how in _touches(s) if how != "Load"
        ]
        if overwrites:
            return unknown(
                "__init__ sets %s again after %s (line %d)" % (" / ".join(ATTRIBUTES), RESOLVER, overwrites[0])
            )
        if of_node(resolver) in RESOLVER_FINGERPRINTS and texts.count(UPSTREAM_STATEMENT) == 1:
            return Classification(
                Verdict.FIXED,
                "__init__ resolves the SWA pool with %s, from the active KV pool "
                "first (SGLang 0.5.13, PRs #25103/#26966)" % RESOLVER,
                fingerprint,
                first_line,
            )
        return unknown("%s is there, but not as SGLang 0.5.13 wrote it or not assigned once in __init__" % RESOLVER)

    starts = [i for i in range(len(texts)) if tuple(texts[i : i + len(ALLOCATOR_RESOLUTION)]) == ALLOCATOR_RESOLUTION]
    if len(starts) != 1:
        return unknown(
            "__init__ does not resolve the SWA pool from the allocator with the three statements of "
            "SGLang 0.5.9 to 0.5.12.post1 (found them %d times)" % len(starts)
        )
    rest = body[: starts[0]] + body[starts[0] + len(ALLOCATOR_RESOLUTION) :]
    for statement in rest:
        for node in ast.walk(statement):
            if (
                isinstance(node, ast.Name)
                and node.id in ("allocator", "model_runner")
                and isinstance(node.ctx, (ast.Store, ast.Del))
            ):
                return unknown("__init__ rebinds %s (line %d)" % (node.id, node.lineno))
        touched = _touches(statement) or [
            (n.lineno, "") for n in ast.walk(statement) if isinstance(n, ast.Name) and n.id == "allocator"
        ]
        if touched:
            return unknown(
                "__init__ uses the SWA pool attributes or `allocator` outside the resolution (line %d)" % touched[0][0]
            )

    problem = (
        _pool_class_problem(tree)
        or _readers_problem(methods)
        or detect.attribute_routes_problem(tree, ATTRIBUTES, module_names=(POOL_CLASS,))
    )
    if problem:
        return unknown(problem)
    for function, owner, found in uses:
        if function is method or not found:
            continue
        if owner is not None and owner is not cls and owner.name == CLASS_NAME:
            continue  # an earlier definition of the class, which the live one replaces
        if owner is cls:
            live, _ = (
                methods[function.name] if function.name in methods else detect.live_method(tree, cls, function.name)
            )
            if live is not function:
                continue  # a definition Python replaces; the live one is checked under its own name
        stores = [line for line, how in found if how != "Load"]
        if (
            owner is not cls
            or function.name not in READERS
            or of_node(function) not in READERS[function.name]
            or stores
        ):
            where = "%s.%s" % (owner.name, function.name) if owner is not None else function.name
            return unknown(
                "%s touches %s in code this hotfix does not know (line %d)"
                % (where, " / ".join(ATTRIBUTES), found[0][0])
            )
    return Classification(
        Verdict.AFFECTED,
        "__init__ takes the SWA pool and its layer mapping from the allocator, which an EAGLE draft shares with "
        "its target",
        fingerprint,
        first_line,
    )


HOTFIX = Hotfix(
    name="pr25103",
    upstream="SGLang 0.5.13 (PRs #25103 and #26966)",
    summary="TRT-LLM MHA backends resolve the sliding-window KV pool from the active pool (EAGLE drafts stop "
    "reading the target's SWA mapping)",
    effect="the backend's sliding-window KV pool now comes from the active KV pool",
    distribution="sglang",
    target="sglang.srt.layers.attention.trtllm_mha_backend.%s.%s" % (CLASS_NAME, METHOD_NAME),
    classify=detect.walked_once(classify),
    wrapper=resolve_from_active_pool,
    known_fingerprints=ReleaseTable(os.path.join(os.path.dirname(os.path.abspath(__file__)), "pr25103_releases.json")),
    probe="sglang_hotfix_trtllm.records.pr25103_probe:probe",
)
