"""Verdicts tested by mutation: every AST mutant of the code a record depends
on is either refused (verdict ``unknown``) or repaired exactly: the plugin's
repair of the mutant, applied by the engine as the import hook applies it,
equals upstream's change applied to that same mutant, on the oracle's inputs.
A ``fixed`` or ``not-applicable`` verdict on a mutant is always a failure (no
single mutation turns these releases into upstream's fixed code).

Mutants come from ``support/mutants.py`` (statements dropped, swapped,
duplicated, branch tests negated, constants and attribute names changed,
extra writes of what the record is about), each classified by the installed
record's own ``classify(ast.parse(text))``. For each one called ``affected``:

* pr26521: the mutated file is compiled as ``isolated_release`` compiles a
  release, the engine wraps its capture method, and every branch of the
  capture harness (three speculative steps, both call styles, a sequence of
  batch sizes, without and with sliding-window page tables where the release
  has them) must leave exactly the state, and raise exactly the error, that
  the mutant with PR #26521's statement inserted after the draft-decode
  binding leaves and raises (``upstream_fix``, which shares no code with the
  plugin's detector). Called directly and through the class.
* pr25103: the mutated module is compiled as ``swa_cases`` compiles a release,
  the engine wraps its ``__init__``, and in every case of ``swa_cases`` the
  backend must equal the one built by the mutant whose three allocator
  statements are replaced by upstream's resolution (SGLang 0.5.13's
  ``_resolve_swa_kv_pool``, compiled from the 0.5.13 wheel, with the flag set
  to "a pool was resolved", which is what 0.5.13's helpers ask): the same
  pool object, flag, every other attribute, the same SWA page-table buffer
  from ``_alloc_swa_page_table``, and the same reads (page tables, cache
  locations, key rows) through the mutant's own helpers; or the same error.
* pr28144: the mutated file is compiled as ``fp8_cases`` compiles a release
  (in a folder named after the release, beside that release's
  ``forward_batch_info.py``, ``spec_info.py`` where it has one and attention
  ``utils.py``), the record is applied as ``test_pr28144_differential``
  applies it (``detect.assess_module``, ``patch.wrap``, the record's quantizer
  the oracle's CPU stand-in), and what FlashInfer's kernels and the KV writes
  receive (``fp8_cases.kernel_calls``) must equal, or raise the same error as,
  the mutant with upstream's fix (PR #28144 as revised by #29423) applied from 0.5.15's file
  (``fp8_cases.upstream_module``), in every case of ``fp8_cases.cases`` with a
  float or a tensor layer scale (both KV dtypes, XQA both ways where the
  release has it, the KV write both ways, decode, extend and target verify).
  The record pins ``forward_decode`` and ``forward_extend`` by whole-method
  fingerprints: every mutant of those two must be ``unknown``. Since 0.14.0 the
  records that edit methods are mutated in the methods they edit only: a mutant
  of a helper those call runs alike in the repair and in upstream's change
  applied to it (0.13's gate ran the helpers inside a noted call).

Each test asserts that the unmutated source is ``affected``, that the
differential tells the unpatched source from upstream's (so it can fail), that
the generator made at least as many mutants as measured, and lists every
mutant that breaks the rule, with its id and the mutated statement.

Releases: the installed SGLang (0.5.12) always; the other code variants
(pr26521: 0.5.1, 0.5.3; pr25103: 0.5.9; pr28144: 0.5.1, 0.5.9; pr31667: 0.5.14) unless
``SGLANG_HOTFIX_RELEASES`` is ``quick`` (a comma-separated list picks among them). The Blackwell
records, with no bug in 0.5.12, run on their own releases only (pr17732: 0.5.1 and 0.5.8.post1, the
first of them when quick; pr19107: 0.5.9): every mutant of the methods they pin must be refused,
and the unmutated release repaired exactly (pr17732: ``fp8_cases`` with PR #17732 from 0.5.9's file;
pr19107: ``swa_write_cases`` on SGLang's real SWAKVPool, with PR #19107 from 0.5.10's file).
xqa_workspace (no fmha_v2 in 0.5.12) runs on 0.5.22: ``__init__`` and ``forward_extend``, the two
methods its edits change, pinned (every mutant refused); the unmutated release repaired exactly
(``workspace_cases``: SGLang's own ``__init__``, prefill and decode, with 0.5.23's change from its
file as the oracle).
encoder_only_mask runs on 0.5.12, 0.5.14, 0.5.16 and 0.5.19 (one release per shape of the method):
``forward_extend`` pinned, every mutant refused;
the unmutated release repaired exactly (``fp8_cases`` with 0.5.22's ``causal=`` and ``mask_mode=``
keywords as the oracle; from 0.5.16 with and without context parallelism, the kernel called from the
nested ``_trtllm_context_attn``; from 0.5.19 fmha_v2 on XQA).
"""

import ast
import collections
import dataclasses
import importlib.metadata
import logging
import shutil
import time
import types

import pytest
import torch
from packaging.version import Version

import capture_harness
import code_variants
import fp8_cases
import isolated_release
import mutants
import release_selection
import swa_cases
import swa_write_cases
import upstream_fix
import workspace_cases
from sglang_hotfix_trtllm import detect, engine, patch
from sglang_hotfix_trtllm.records import (
    encoder_only_mask,
    pr17732,
    pr19107,
    pr25103,
    pr26521,
    pr28144,
    pr31667,
    xqa_workspace,
)
from sglang_hotfix_trtllm.record import Verdict

INSTALLED = "installed"
CLASS_NAME = "TRTLLMHAAttnBackend"
OUR_VARIABLES = ("SGLANG_HOTFIX_TRTLLM_DISABLE", "SGLANG_HOTFIX_TRTLLM_STRICT", "SGLANG_PLUGINS")

RECORDS = {
    "pr26521": dict(
        record=pr26521,
        methods=("init_forward_metadata_capture_cuda_graph", "_bind_swa_page_table"),
        writes={
            "fill0": "metadata.cache_seqlens_int32.fill_(0)",
            "zero_buffer": "self.decode_cuda_graph_metadata['cache_seqlens'].zero_()",
        },
        variants=("0.5.1", "0.5.3"),
    ),
    "pr25103": dict(
        record=pr25103,
        methods=(
            "__init__",
            "_maybe_translate_swa",
            "_alloc_swa_page_table",
            "_get_layer_cache_loc",
            "_get_layer_page_table",
        ),
        writes={
            "pool_none": "self._swa_kv_pool = None",
            "flag_true": "self.use_sliding_window_kv_pool = True",
            "pool_active": "self._swa_kv_pool = model_runner.token_to_kv_pool",
        },
        variants=("0.5.9",),
    ),
    # Since 0.14.0 the kernel-call records are edits of the methods they change: a mutant of another
    # method (a helper those call) runs alike in the repair and in upstream's change applied to it,
    # so the mutants that can tell are the edited methods' (0.13's gate ran the helpers inside a noted
    # call, and their mutants were tested too).
    "pr28144": dict(
        record=pr28144,
        methods=("forward_decode", "forward_extend"),
        # Pinned by the record's whole-method fingerprints: every mutant of these must be refused.
        pinned=("forward_decode", "forward_extend"),
        writes={
            "bmm2_one": "bmm2_scale = 1.0",
            "q_fp8": "q = q.to(torch.float8_e4m3fn)",
            "v_scale_one": "layer.v_scale_float = 1.0",
        },
        variants=("0.5.1", "0.5.9"),
    ),
    "pr31667": dict(
        record=pr31667,
        methods=("forward_decode",),
        # Pinned by its whole-method fingerprint: every mutant must be refused.
        pinned=("forward_decode",),
        writes={
            "reshape": "q = q.reshape(-1, layer.tp_q_head_num, layer.head_dim)",
            "xqa_off": "self.is_xqa_impl = False",
        },
        variants=("0.5.14",),
    ),
    # The Blackwell records have no bug in the installed SGLang (0.5.12): their affected releases only.
    "pr17732": dict(
        record=pr17732,
        methods=("forward_decode", "forward_extend"),
        pinned=("forward_decode", "forward_extend"),
        writes={
            "kv_pair": "kv_cache = (k_cache, v_cache)",
            "one_head": "layer.tp_k_head_num = 1",
        },
        variants=("0.5.1", "0.5.8.post1"),
        installed=False,
    ),
    "pr19107": dict(
        record=pr19107,
        methods=("_fused_fp8_set_kv_buffer",),
        pinned=("_fused_fp8_set_kv_buffer",),
        writes={
            "full_locations": "cache_loc = forward_batch.out_cache_loc",
            "no_swa_pool": "self.use_sliding_window_kv_pool = False",
        },
        variants=("0.5.9",),
        installed=False,
    ),
    # No fmha_v2 in the installed SGLang (0.5.12): its affected releases only. __init__ and
    # forward_extend, the two methods its edits change, are pinned. (Until 0.13 forward_decode's
    # mutants ran too: its XQA call went through the record's gate. Upstream's code in the two
    # methods reads nothing of forward_decode: 281 mutants, 110 s of CI, that prove nothing now.)
    "xqa_workspace": dict(
        record=xqa_workspace,
        methods=("__init__", "forward_extend"),
        pinned=("__init__", "forward_extend"),
        writes={
            "fmha_v2_here": "flashinfer.prefill.trtllm_fmha_v2_prefill((q, q), workspace_buffer=self.workspace_buffer)",
            "workspace_again": "self.workspace_buffer = get_buffer('trtllm_mha_zero_workspace', lambda: 0)",
        },
        variants=("0.5.22",),  # 0.5.19 to 0.5.21: the differential (test_xqa_workspace)
        installed=False,
    ),
    # forward_extend, the method its edit changes, pinned by fingerprint: every mutant refused; the
    # unmutated release repaired exactly (test_encoder_only_mask: every release).
    "encoder_only_mask": dict(
        record=encoder_only_mask,
        methods=("forward_extend",),
        pinned=("forward_extend",),
        writes={
            "causal_true": "causal = True",
            "decoder": "layer.attn_type = AttentionType.DECODER",
        },
        # One release per shape of forward_extend (every mutant of the pinned method is refused by
        # its fingerprint, so more releases of one shape add time, not proof): 0.5.14 quantizes the
        # query (_maybe_quantize_q); 0.5.16 to 0.5.18 call the kernel from the nested
        # _trtllm_context_attn (twice under 0.5.16's context parallelism); 0.5.19 on also fmha_v2
        # (SM90/SM120). Until 0.16.0 also 0.5.13, 0.5.17, 0.5.18 and 0.5.21 (48 s of CI).
        variants=("0.5.14", "0.5.16", "0.5.19"),
    ),
}
# Mutants the generator makes, measured (pr26521: 363 on 0.5.12, 310 on 0.5.1 and
# 0.5.3; pr25103: 403 on 0.5.12, 331 on 0.5.9; pr28144: 550 on 0.5.12, 541 on 0.5.9, 320 on 0.5.1;
# pr31667: 223 on 0.5.12, 191 on 0.5.14; pr17732: 286 on 0.5.1, 411 on 0.5.8.post1; pr19107: 24 on 0.5.9;
# xqa_workspace: 1355 on 0.5.22; encoder_only_mask: 261 on 0.5.12, 281 on 0.5.13, 234 on 0.5.14,
# 384 on 0.5.16, 507 on 0.5.17, 510 on 0.5.18, 546 on 0.5.19, 659 on 0.5.21; 0.14.0: of the methods
# the records edit), less a little: a generator that silently stops mutating fails here.
FLOORS = {
    ("pr26521", INSTALLED): 350,
    ("pr26521", "0.5.1"): 300,
    ("pr26521", "0.5.3"): 300,
    ("pr25103", INSTALLED): 390,
    ("pr25103", "0.5.9"): 320,
    ("pr28144", INSTALLED): 540,
    ("pr28144", "0.5.9"): 530,
    ("pr28144", "0.5.1"): 310,
    ("pr31667", INSTALLED): 215,
    ("pr31667", "0.5.14"): 185,
    ("pr17732", "0.5.1"): 275,
    ("pr17732", "0.5.8.post1"): 400,
    ("pr19107", "0.5.9"): 22,
    ("xqa_workspace", "0.5.22"): 1350,
    ("encoder_only_mask", INSTALLED): 250,
    ("encoder_only_mask", "0.5.14"): 225,
    ("encoder_only_mask", "0.5.16"): 370,
    ("encoder_only_mask", "0.5.19"): 530,
}


def _releases(spec):
    variants = spec["variants"]
    if not spec.get("installed", True):  # no bug in the installed SGLang: its first variant even when quick
        chosen = release_selection.selected(list(variants), variants[:1])
        return [r for r in chosen if r in variants]
    chosen = release_selection.selected(list(variants), ())  # all: every variant; quick: none; a list: those named
    return [INSTALLED] + [r for r in chosen if r in variants]


PARAMS = [(name, release) for name, spec in RECORDS.items() for release in _releases(spec)]


@pytest.fixture
def no_switches(monkeypatch):
    for name in OUR_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    # Each mutant module allocates its own workspace buffer (a module global): small, so it costs nothing.
    monkeypatch.setenv("SGLANG_FLASHINFER_WORKSPACE_SIZE", "4096")


def _write(folder, text):
    path = folder / isolated_release.BACKEND
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _error(error):
    return "%s: %s" % (type(error).__name__, error)


def _same(a, b):
    """Values equal: tensors by dtype, shape and content, containers item by item,
    plain values by ==, anything else only when it is the same object."""
    # The states compared are mostly plain dicts of tensors: dicts first, by exact type (the
    # general rules below give the same answers; this order only saves their isinstance calls).
    if type(a) is dict and type(b) is dict:
        return a is b or (a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a))
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and a.device == b.device and torch.equal(a, b)
    if a is b:
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and type(a) is type(b):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if type(a) is type(b) and isinstance(a, (int, float, str, bool, torch.dtype, torch.device)):
        return a == b
    return False


# --------------------------------------------------------------------------
# pr26521: the capture method, patched, against the mutant with PR #26521's statement


class CaptureRepair:
    """Compiles a mutated file as ``isolated_release`` does, with the release's
    ForwardMode loaded once (``load_forward_mode`` is answered from it)."""

    def __init__(self, source_root, tmp, monkeypatch):
        forward_mode = isolated_release.load_forward_mode(source_root)
        monkeypatch.setattr(isolated_release, "load_forward_mode", lambda release_dir: forward_mode)
        self.tmp = tmp

    def check(self, index, text, patched=True):
        """None when the (engine-patched) mutant equals the oracle in every branch, else the first difference."""
        folder = self.tmp / ("capture%d" % index)
        _write(folder, text)
        try:
            module = isolated_release.load_backend_module(folder)
        except Exception as error:
            return "the mutated module does not load (%s)" % _error(error)
        cls = module.TRTLLMHAAttnBackend
        try:
            oracle = upstream_fix.upstream_fixed_method(module)
        except Exception as error:
            return "no oracle: PR #26521's statement cannot be inserted (%s)" % _error(error)
        if not patched:
            return _capture_difference(cls, module.ForwardMode, oracle)
        outcome = engine.handle(pr26521.HOTFIX, module)
        if outcome != "patched":
            patch.remove_all()
            return "the engine did not patch it (%s)" % outcome
        try:
            return _capture_difference(cls, module.ForwardMode, oracle)
        finally:
            patch.remove_all()


def _capture_backend(cls, step_id, swa):
    backend = capture_harness.make_backend(cls, step_id)
    if swa:  # sliding-window page tables too, as init_cuda_graph_state allocates them for an SWA pool
        backend.use_sliding_window_kv_pool = True
        backend.init_cuda_graph_state(capture_harness.MAX_BS, capture_harness.MAX_BS * capture_harness.NUM_DRAFT_TOKENS)
    return backend


def _capture_value(value):
    """``capture_harness._value``, with tensors kept as they are (compared at once, by ``_same``)."""
    if isinstance(value, (torch.Tensor, int, float, str, bool, type(None))):
        return value
    if hasattr(value, "__dict__"):
        return {k: _capture_value(v) for k, v in sorted(vars(value).items())}
    return repr(value)


def _capture_state(backend):
    """What ``capture_harness.snapshot`` records: every buffer and stored metadata the capture method can touch."""
    state = {"forward_metadata": _capture_value(backend.forward_metadata)}
    for name in ("decode_cuda_graph_metadata", "target_verify_metadata", "draft_extend_metadata"):
        state[name] = {str(key): _capture_value(value) for key, value in getattr(backend, name).items()}
    return state


def _capture_outcome(function, backend, *args):
    try:
        capture_harness.call(function, backend, *args)
        raised = None
    except Exception as error:
        raised = _error(error)
    try:
        state = _capture_state(backend)
    except Exception as error:
        state = "state unreadable: " + _error(error)
    return {"raised": raised, "state": state}


def _paths(a, b, path=""):
    """Where two outcomes differ (``capture_harness.differences``, for tensors too)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b)):
            out.extend(
                ["%s/%s missing on one side" % (path, key)]
                if key not in a or key not in b
                else _paths(a[key], b[key], "%s/%s" % (path, key))
            )
        return out
    return [] if _same(a, b) else [path]


def _capture_difference(cls, forward_mode_cls, oracle):
    """The capture harness's sequences, through the instance and through the
    class, against the oracle; the first difference in words, or None."""

    def through_class(backend, *args, **kwargs):
        return cls.init_forward_metadata_capture_cuda_graph(backend, *args, **kwargs)

    functions = {"patched": capture_harness.via_instance, "class": through_class, "oracle": oracle}
    for swa in (False, True) if hasattr(cls, "_bind_swa_page_table") else (False,):
        for step_id in (0, 1, 2):
            for branch, forward_mode, spec_info, tokens in capture_harness.branches(forward_mode_cls):
                for style in ("positional", "keyword"):
                    backends = {name: _capture_backend(cls, step_id, swa) for name in functions}
                    for bs in (8, 5, 3, 2, 1):
                        req_pool_indices, seq_lens = capture_harness.inputs(bs, seed=bs * 10 + step_id)
                        outcomes = {
                            name: _capture_outcome(
                                functions[name],
                                backends[name],
                                bs,
                                tokens,
                                req_pool_indices,
                                seq_lens,
                                forward_mode,
                                spec_info,
                                style,
                            )
                            for name in functions
                        }
                        for name in ("patched", "class"):
                            if not _same(outcomes[name], outcomes["oracle"]):
                                return "%s differs from the oracle (%s, step %d, bs %d, %s%s): %s; raised %s vs %s" % (
                                    name,
                                    branch,
                                    step_id,
                                    bs,
                                    style,
                                    ", SWA page tables" if swa else "",
                                    ", ".join(_paths(outcomes[name], outcomes["oracle"])[:3]),
                                    outcomes[name]["raised"],
                                    outcomes["oracle"]["raised"],
                                )
    return None


# --------------------------------------------------------------------------
# pr25103: the patched __init__ and helpers, against the mutant with 0.5.13's resolution

ORACLE_RESOLVER = "_UPSTREAM_RESOLVE_SWA_KV_POOL"
# Upstream's resolution, for the three allocator statements: the pool 0.5.13
# resolves; the flag is what 0.5.13's helpers ask instead of it (`_swa_kv_pool is None`).
ORACLE_RESOLUTION = (
    "self._swa_kv_pool = %s(model_runner)\n"
    "self.use_sliding_window_kv_pool = self._swa_kv_pool is not None" % ORACLE_RESOLVER
)
SWA_ATTRIBUTES = ("use_sliding_window_kv_pool", "_swa_kv_pool")


def _init_body(tree):
    cls = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == CLASS_NAME][-1]
    return [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"][-1].body


def allocator_resolution(text):
    """The unmutated release's own allocator statements: the consecutive
    statements of ``__init__`` that use the local ``allocator`` or the two
    attributes (read off the release, not copied from it, nor from the plugin)."""
    body = _init_body(ast.parse(text))
    found = [
        i
        for i, s in enumerate(body)
        if any(
            (isinstance(n, ast.Name) and n.id == "allocator")
            or (isinstance(n, ast.Attribute) and n.attr in SWA_ATTRIBUTES)
            for n in ast.walk(s)
        )
    ]
    assert len(found) == 3 and found == list(range(found[0], found[0] + 3)), found
    return tuple(ast.unparse(body[i]) for i in found)


def _as_0_5_13_runs_it(runner):
    """The same runner, with the installed enum's member of the algorithm's name
    (0.5.13 asks ``is_frozen_kv_mtp()``, which releases before 0.5.12 lack)."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    twin = types.SimpleNamespace(**vars(runner))
    twin.spec_algorithm = SpeculativeAlgorithm[runner.spec_algorithm.name]
    return twin


class PoolRepair:
    """Compiles a mutated module as ``swa_cases`` does, and its oracle: the same
    mutant with the release's three allocator statements replaced by upstream's
    resolution (0.5.13's ``_resolve_swa_kv_pool``, compiled from the 0.5.13 wheel)."""

    def __init__(self, unmutated_text, tmp):
        self.resolution = allocator_resolution(unmutated_text)
        self.upstream = swa_cases.upstream(release_selection.release_dir("0.5.13"))
        self.cases = swa_cases.cases(release_selection.release_dir("0.5.11"))
        self.tmp = tmp

    def oracle_text(self, text):
        tree = ast.parse(text)
        body = _init_body(tree)
        texts = [ast.unparse(s) for s in body]
        n = len(self.resolution)
        starts = [i for i in range(len(texts)) if tuple(texts[i : i + n]) == self.resolution]
        if len(starts) != 1:
            return None
        body[starts[0] : starts[0] + n] = ast.parse(ORACLE_RESOLUTION).body
        return ast.unparse(ast.fix_missing_locations(tree))

    def check(self, index, text, patched=True):
        oracle_text = self.oracle_text(text)
        if oracle_text is None:
            return "no oracle: upstream's change does not apply (the allocator statements are not there once, in order)"
        try:
            oracle_module = swa_cases.load_backend_module(
                _write(self.tmp / ("oracle%d" % index), oracle_text).parents[4]
            )
            module = swa_cases.load_backend_module(_write(self.tmp / ("pool%d" % index), text).parents[4])
        except Exception as error:
            return "the mutated module does not load (%s)" % _error(error)
        upstream = self.upstream
        oracle_module.__dict__[ORACLE_RESOLVER] = lambda runner: upstream._resolve_swa_kv_pool(
            _as_0_5_13_runs_it(runner)
        )
        cls, oracle_cls = module.TRTLLMHAAttnBackend, oracle_module.TRTLLMHAAttnBackend
        if patched:
            outcome = engine.handle(pr25103.HOTFIX, module)
            if outcome != "patched":
                patch.remove_all()
                return "the engine did not patch it (%s)" % outcome
        try:
            built = {name: _construct(cls, runner) for name, (world, runner) in self.cases.items()}
        finally:
            patch.remove_all()
        for name, (world, runner) in self.cases.items():
            got, want = built[name], _construct(oracle_cls, runner)
            problem = _pool_difference(got, want, cls, oracle_cls, world, runner)
            if problem:
                return "case %s: %s" % (name, problem)
        return None


def _construct(cls, runner):
    try:
        return cls(runner), None
    except Exception as error:
        return None, _error(error)


def _attempt(function, *args):
    try:
        return function(*args), None
    except Exception as error:
        return None, _error(error)


def _pool_difference(got, want, cls, oracle_cls, world, runner):
    (backend, raised), (oracle, oracle_raised) = got, want
    if raised != oracle_raised:
        return "construction raised %s vs %s" % (raised, oracle_raised)
    if backend is None:
        return None
    state, oracle_state = vars(backend), vars(oracle)
    if getattr(backend, "_swa_kv_pool", None) is not getattr(oracle, "_swa_kv_pool", None):
        return "_swa_kv_pool %r vs %r" % (getattr(backend, "_swa_kv_pool", None), getattr(oracle, "_swa_kv_pool", None))
    if getattr(backend, "use_sliding_window_kv_pool", None) is not getattr(oracle, "use_sliding_window_kv_pool", None):
        return "use_sliding_window_kv_pool %r vs %r" % (
            getattr(backend, "use_sliding_window_kv_pool", None),
            getattr(oracle, "use_sliding_window_kv_pool", None),
        )
    differing = sorted(
        k
        for k in set(state) | set(oracle_state)
        if k not in state or k not in oracle_state or not _same(state[k], oracle_state[k])
    )
    if differing:
        return "attributes differ: %s" % ", ".join(differing)
    if hasattr(cls, "_alloc_swa_page_table") or hasattr(oracle_cls, "_alloc_swa_page_table"):
        tables = [_attempt(c._alloc_swa_page_table, b, 2, 3) for c, b in ((cls, backend), (oracle_cls, oracle))]
        if tables[0][1] != tables[1][1] or not _same(tables[0][0], tables[1][0]):
            return "_alloc_swa_page_table gives %r vs %r" % (tables[0], tables[1])
    reads = [_attempt(swa_cases.reads, b, c, world, runner) for c, b in ((cls, backend), (oracle_cls, oracle))]
    if reads[0][1] != reads[1][1]:
        return "reads raised %s vs %s" % (reads[0][1], reads[1][1])
    if reads[0][1] is None and not _same(reads[0][0], reads[1][0]):
        layers = [line for line in reads[1][0] if not _same(reads[0][0].get(line), reads[1][0][line])]
        return "reads differ at layers %s" % layers
    return None


# --------------------------------------------------------------------------
# pr28144: what the kernels receive from the patched mutant, against the mutant with PR #28144

# The cases of fp8_cases.cases each mutant runs: a float and a tensor scale, over both KV dtypes,
# XQA both ways where the release has it, the KV write both ways (fused FP8 where the release has
# it) and every mode.
SCALE_CASES = ("float", "tensor")
# The files of a release fp8_cases compiles beside the backend (spec_info where the release has it).
RELEASE_FILES = (isolated_release.FORWARD_BATCH_INFO, "sglang/srt/speculative/spec_info.py", fp8_cases.ATTENTION_UTILS)


class ScaleRepair:
    """Compiles a mutated file as ``fp8_cases`` compiles a release (in a folder named after the
    release, with that release's other files), applies the record as the differential of
    ``test_pr28144_differential`` does, and compares what FlashInfer's kernels receive with the
    oracle: the same mutant with upstream's fix applied from 0.5.15's file (``fp8_cases.upstream_module``)."""

    hotfix = pr28144.HOTFIX

    def __init__(self, release, source_root, tmp, monkeypatch):
        # The oracle's module logs each tensor scale it ignores, once per module: one per mutant.
        monkeypatch.setattr(logging.getLogger(fp8_cases.MODULE_NAME), "disabled", True)
        # The release's ForwardMode, loaded once (each mutant's module and its oracle ask for it).
        forward_mode = isolated_release.load_forward_mode(source_root)
        monkeypatch.setattr(isolated_release, "load_forward_mode", lambda release_dir: forward_mode)
        self.release, self.tmp = release, tmp
        self.fixed_dir = release_selection.release_dir(fp8_cases.FIXED_RELEASE)
        self.cases = self.chosen_cases(release)
        self.files = {}
        # canonicalize_stride's file: attention utils, from 0.5.16 sglang/kernels/ops/attention/utils.py
        utils = fp8_cases._imported_from(source_root, "canonicalize_stride") or fp8_cases.ATTENTION_UTILS
        for member in RELEASE_FILES:
            path = (
                fp8_cases.extra_file(source_root, utils)
                if member == fp8_cases.ATTENTION_UTILS
                else source_root / member
            )
            if path.is_file():
                self.files[utils if member == fp8_cases.ATTENTION_UTILS else member] = path

    def chosen_cases(self, release):
        return {n: c for n, c in fp8_cases.cases(release).items() if c.scales in SCALE_CASES}

    def oracle(self, folder):
        return fp8_cases.upstream_module(folder, self.fixed_dir)

    def load(self, folder):
        """(the mutant's module, its oracle), or a problem in words."""
        try:
            module = fp8_cases.load_backend_module(folder)
        except Exception as error:
            return "the mutated module does not load (%s)" % _error(error)
        try:
            return module, self.oracle(folder)
        except Exception as error:
            return "no oracle: upstream's change cannot be applied (%s)" % _error(error)

    def observe(self, module):
        """name -> what the kernels (and KV writes) receive in that case, or the error raised."""
        return {name: _kernel_calls(module, case) for name, case in self.cases.items()}

    def check(self, index, text, patched=True):
        """None when the (patched) mutant's recorded calls equal the oracle's in every case, else the first
        difference."""
        folder = self.tmp / ("mutant%d" % index) / self.release  # fp8_cases reads the release from the name
        _write(folder, text)
        for member, path in self.files.items():
            (folder / member).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, folder / member)
        loaded = self.load(folder)
        if isinstance(loaded, str):
            return loaded
        module, oracle = loaded
        try:
            want = self.observe(oracle)
            if not patched:
                got = self.observe(module)
            else:
                assessment = detect.assess_module(self.hotfix, module)
                if assessment.verdict is not Verdict.AFFECTED:
                    return "the module is assessed %s: %s" % (assessment.verdict.value, assessment.reason)
                try:
                    patch.wrap(self.hotfix, module, assessment)
                    got = self.observe(module)
                finally:
                    patch.remove_all()
        finally:
            fp8_cases._tree.cache_clear()  # the parsed files, cached by path: one folder per mutant
        differing = [name for name in want if got.get(name) != want[name]]
        if differing:
            first = differing[0]
            return "%d of %d cases differ from the oracle; the first, %s: %s" % (
                len(differing),
                len(want),
                first,
                _calls_difference(got.get(first, "missing"), want[first]),
            )
        return None


class StrideRepair(ScaleRepair):
    """pr17732: as ``ScaleRepair``, the oracle the same mutant with PR #17732 applied from 0.5.9's
    file, on every case with absent or float scales (one KV head: the bug bites in each)."""

    hotfix = pr17732.HOTFIX

    def chosen_cases(self, release):
        return {n: c for n, c in fp8_cases.cases(release).items() if c.scales in ("absent", "float")}

    def oracle(self, folder):
        return fp8_cases.upstream_module(
            folder, self.fixed_dir, scales=False, canonical_strides_dir=release_selection.release_dir("0.5.9")
        )


class WriteRepair(ScaleRepair):
    """pr19107: as ``ScaleRepair`` (the mutant compiled in a folder named 0.5.9, beside that
    release's files), what the fused write and the kernels receive with the write called directly
    and inside both methods on SGLang's real SWAKVPool (``swa_write_cases``), against the mutant
    with PR #19107 applied from 0.5.10's file."""

    hotfix = pr19107.HOTFIX

    def chosen_cases(self, release):
        return {}  # swa_write_cases makes its own

    def load(self, folder):
        try:
            return swa_write_cases.modules(folder)
        except Exception as error:
            return "the mutated module or its oracle does not load (%s)" % _error(error)

    def observe(self, module):
        return dict(swa_write_cases.helper_calls(module, True), **swa_write_cases.method_calls(module, self.release))


class QueryRepair(ScaleRepair):
    """pr31667: as ``ScaleRepair``, the oracle the same mutant with PR #31667 applied from 0.5.16's
    file, on decode cases (both layouts, XQA on and off) without a KV write."""

    hotfix = pr31667.HOTFIX

    def chosen_cases(self, release):
        return {
            n: c
            for n, c in fp8_cases.cases(release).items()
            if c.mode == "decode" and c.kv == "bf16" and c.scales == "absent" and not c.save_kv_cache
        }

    def oracle(self, folder):
        return fp8_cases.upstream_module(
            folder, self.fixed_dir, scales=False, packed_query_dir=release_selection.release_dir("0.5.16")
        )


class MaskRepair(ScaleRepair):
    """encoder_only_mask: as ``ScaleRepair``, the oracle the same mutant with 0.5.22's ``causal=``
    keyword added to its context-kernel call (``fp8_cases.upstream_module``), on extend and target
    verify cases of a decoder and an encoder-only layer; the oracle's ``causal=True`` (FlashInfer's
    default, where the release passes nothing) left out of both recordings."""

    hotfix = encoder_only_mask.HOTFIX

    def chosen_cases(self, release):
        context_parallel = Version(release) >= Version("0.5.16")  # the release's zigzag strategy too
        chosen = {}
        for name, case in fp8_cases.cases(release).items():
            if case.mode != "decode" and case.scales == "absent" and case.layout == "packed":
                for attn_type in ("DECODER", "ENCODER_ONLY"):
                    chosen[name + "-" + attn_type] = dataclasses.replace(case, attn_type=attn_type)
                    if context_parallel and case.mode == "extend":
                        chosen[name + "-cp-" + attn_type] = dataclasses.replace(case, attn_type=attn_type, cp=True)
        return chosen

    def oracle(self, folder):
        return fp8_cases.upstream_module(
            folder, self.fixed_dir, scales=False, encoder_only_dir=release_selection.release_dir("0.5.22")
        )

    def observe(self, module):
        def without_default(calls):
            if isinstance(calls, str):
                return calls
            return [
                (name, {k: v for k, v in arguments.items() if not (k == "causal" and v is True)})
                if isinstance(arguments, dict)
                else (name, arguments)
                for name, arguments in calls
            ]

        return {name: without_default(calls) for name, calls in super().observe(module).items()}


class WorkspaceRepair(ScaleRepair):
    """xqa_workspace: the mutant compiled as ``workspace_cases`` compiles a release (in a folder
    named after it, beside its other files), a target and a draft backend built by its own
    ``__init__``, a prefill then a decode on each, on SM90: the workspace every kernel
    receives (``workspace_cases.run``), against the mutant with 0.5.23's change inserted."""

    hotfix = xqa_workspace.HOTFIX
    STEPS = workspace_cases.STEPS[:2]

    def __init__(self, release, source_root, tmp, monkeypatch):
        forward_mode = isolated_release.load_forward_mode(source_root)
        monkeypatch.setattr(isolated_release, "load_forward_mode", lambda release_dir: forward_mode)
        self.release, self.tmp, self.cases = release, tmp, {}
        # The release's own runtime context (SGLang's get_buffer) and paged views, read from its wheel.
        self.files = {
            member: fp8_cases.extra_file(source_root, member)
            for member in (workspace_cases.RUNTIME_CONTEXT, workspace_cases.PAGED_VIEW)
            if member != workspace_cases.PAGED_VIEW or release != "0.5.19"
        }
        self.files[isolated_release.FORWARD_BATCH_INFO] = source_root / isolated_release.FORWARD_BATCH_INFO

    def load(self, folder):
        fixed_dir = release_selection.release_dir(workspace_cases.FIXED_RELEASE)
        try:
            module = workspace_cases.load_module(folder)
        except Exception as error:
            return "the mutated module does not load (%s)" % _error(error)
        try:
            return module, workspace_cases.load_module(folder, oracle=True, fixed_dir=fixed_dir)
        except Exception as error:
            return "no oracle: upstream's change cannot be applied (%s)" % _error(error)

    def observe(self, module):
        observed = {}
        for sm in ("sm90",):  # SM100, where the record changes nothing: test_xqa_workspace
            try:
                # A prefill then a decode on each backend: what the workspace goes through, once.
                observed[sm] = workspace_cases.run(module, workspace_cases.Process(module, sm=sm), self.STEPS)
            except Exception as error:
                observed[sm] = "raised " + _error(error)
        return observed


def _kernel_calls(module, case):
    try:
        return fp8_cases.kernel_calls(module, case)
    except Exception as error:
        return "raised " + _error(error)


def _calls_difference(got, want):
    """Where two recordings (or errors) part, in words."""
    if isinstance(got, str) or isinstance(want, str):
        return "%s vs %s" % (got if isinstance(got, str) else "calls", want if isinstance(want, str) else "calls")
    if not isinstance(got, list) or not isinstance(want, list):
        return "%r vs %r" % (got, want) if len(repr(got)) < 300 else "the recordings differ"
    for (name, arguments), (oracle_name, oracle_arguments) in zip(got, want):
        if name != oracle_name:
            return "call %s vs %s" % (name, oracle_name)
        if arguments != oracle_arguments:
            if isinstance(arguments, dict) and isinstance(oracle_arguments, dict):
                keys = sorted(
                    k for k in set(arguments) | set(oracle_arguments) if arguments.get(k) != oracle_arguments.get(k)
                )
                return "%s differs in %s" % (name, ", ".join(keys))
            return "%s differs" % name
    return "%d calls vs %d" % (len(got), len(want))


# --------------------------------------------------------------------------


@pytest.fixture
def release_source(installed_backend_path, installed_backend_source):
    def get(release):
        if release == INSTALLED:
            return installed_backend_source, installed_backend_path.parents[4]
        root = release_selection.release_dir(release)
        return (root / isolated_release.BACKEND).read_text(encoding="utf-8"), root

    return get


@pytest.mark.parametrize("name, release", PARAMS, ids=["%s-%s" % p for p in PARAMS])
def test_every_mutant_is_refused_or_repaired_exactly(name, release, release_source, tmp_path, monkeypatch, no_switches):
    spec = RECORDS[name]
    record = spec["record"]
    text, root = release_source(release)
    label = "%s %s" % (
        name,
        release if release != INSTALLED else "installed SGLang %s" % importlib.metadata.version("sglang"),
    )
    started = time.perf_counter()

    assert record.classify(ast.parse(text)).verdict is Verdict.AFFECTED, label
    if name == "pr26521":
        repair = CaptureRepair(root, tmp_path, monkeypatch)
    elif name == "pr25103":
        repair = PoolRepair(text, tmp_path)
    else:  # the kernel-call records and pr19107: the installed release's files are named as its release
        repair = {
            "pr31667": QueryRepair,
            "pr17732": StrideRepair,
            "pr19107": WriteRepair,
            "xqa_workspace": WorkspaceRepair,
            "encoder_only_mask": MaskRepair,
        }.get(name, ScaleRepair)(
            importlib.metadata.version("sglang") if release == INSTALLED else release, root, tmp_path, monkeypatch
        )
    # The differential can fail: unpatched, the unmutated code is not upstream's.
    assert repair.check(0, text, patched=False) is not None, (
        "%s: the differential does not tell the bug from the fix" % label
    )
    assert repair.check(0, text) is None, "%s: the unmutated source is not repaired exactly" % label

    generated = list(mutants.generate(text, CLASS_NAME, spec["methods"], spec["writes"]))
    verdicts = collections.Counter()
    repaired = 0
    violations = []
    for index, mutant in enumerate(generated, 1):
        # the record's classify as the import hook runs it (one walk of the tree for all its checks)
        classification = record.HOTFIX.classify(mutant.tree())
        verdict = classification.verdict
        verdicts[verdict.value] += 1
        if verdict is Verdict.UNKNOWN:
            continue
        if mutant.method in spec.get("pinned", ()):
            violations.append(
                "%s\n      wrongly %s (a method the record pins): %s"
                % (mutant.describe(), verdict.value, classification.reason)
            )
            continue
        if verdict is not Verdict.AFFECTED:
            violations.append("%s\n      wrongly %s: %s" % (mutant.describe(), verdict.value, classification.reason))
            continue
        problem = repair.check(index, mutant.text)
        if problem is None:
            repaired += 1
        else:
            violations.append("%s\n      wrongly affected: %s" % (mutant.describe(), problem))

    summary = "%s: %d mutants: %s; %d affected ones repaired exactly; %d violations; %.1f s" % (
        label,
        len(generated),
        ", ".join("%s %d" % (v.value, verdicts[v.value]) for v in Verdict),
        repaired,
        len(violations),
        time.perf_counter() - started,
    )
    print(summary)
    assert len(generated) >= FLOORS[(name, release)], summary
    assert not violations, "%s\nmutants neither refused nor repaired exactly:\n  %s" % (
        summary,
        "\n  ".join(violations),
    )


SMALL_MODULE = '''import torch


class TRTLLMHAAttnBackend:
    @staticmethod
    def first(x):
        return x


    def forward_decode(self, q, k, v, layer):
        """Decode."""
        scale = 1.0
        if layer is None:
            scale = 2.0
        return q * scale
after = TRTLLMHAAttnBackend


def tail(a=1):
    return {"a": a}
'''


@pytest.mark.parametrize("where", ["small", INSTALLED])
def test_a_mutants_tree_is_the_parse_of_its_text(where, release_source):
    """``Mutant.tree`` (what the tests classify, made without parsing the whole file) equals
    ``ast.parse(mutant.text)``, positions included: for every mutant of a method that ends its class
    (the class's end moves with it) and for a sample of the installed release's."""
    if where == "small":
        text, names, step = SMALL_MODULE, ("forward_decode", "first"), 1
    else:
        text, names, step = release_source(INSTALLED)[0], ("forward_decode", "__init__"), 9
    generated = list(mutants.generate(text, CLASS_NAME, names, {"write": "q = q"}))[::step]
    assert len(generated) >= 20
    lengths = set()
    for mutant in generated:
        want = ast.dump(ast.parse(mutant.text), include_attributes=True)
        assert ast.dump(mutant.tree(), include_attributes=True) == want, mutant.describe()
        assert ast.dump(mutant.tree(), include_attributes=True) == want, mutant.describe()  # made again, alike
        lengths.add(mutant.text.count("\n"))
    assert len(lengths) >= 3  # mutants shorter and longer than the method, so later lines moved both ways


@pytest.mark.parametrize("name", ["pr28144", "pr31667"])
def test_code_outside_the_edited_methods_is_repaired_exactly(name, release_source, tmp_path, monkeypatch, no_switches):
    """Code other than the methods pr28144 and pr31667 edit, reaching FlashInfer's kernels or
    changed (``code_variants``; each refused until 0.14.0, as a route around the gate): the record
    repairs it, and what the kernels receive equals upstream's change applied to that variant, in
    every case of ``ScaleRepair`` (pr28144) and ``QueryRepair`` (pr31667)."""
    record = RECORDS[name]["record"]
    text, root = release_source(INSTALLED)
    repair = {"pr28144": ScaleRepair, "pr31667": QueryRepair}[name](
        importlib.metadata.version("sglang"), root, tmp_path, monkeypatch
    )
    wrong = {}
    for index, (variant, edit) in enumerate(sorted(code_variants.OUTSIDE_THE_EDITED_METHODS.items()), 1):
        tree = ast.parse(text)
        edit(tree)
        changed = ast.unparse(ast.fix_missing_locations(tree))
        verdict = record.classify(ast.parse(changed)).verdict
        if verdict is not Verdict.AFFECTED:
            wrong[variant] = verdict.value
        elif index == 1 and repair.check(index, changed, patched=False) is None:
            wrong[variant] = "the differential does not tell the bug from the fix"
        else:
            wrong[variant] = repair.check(index, changed)
    assert {variant: problem for variant, problem in wrong.items() if problem is not None} == {}
