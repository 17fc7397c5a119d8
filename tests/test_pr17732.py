"""The fifth record, pr17732: with one KV head on the rank, FlashInfer's TRT-LLM kernels get K/V
cache views with canonical strides (PR #17732, SGLang 0.5.9).

TRT-LLM-GEN runs on SM100 only: the proof is on CPU. Verdicts: every release of the shipped
table from its own source, hand-made variants refused. The record's ``canonical_strides``
against 0.5.9's own ``canonicalize_stride`` (compiled from 0.5.9's attention utils, fetched at
test time) over every view the backend makes and strided tensors beyond them. Differential:
every affected release's own ``forward_decode`` and ``forward_extend`` (``fp8_cases``: compiled
from the release's file, FlashInfer's kernels recorded; one KV head, so the bug bites in every
case) against the oracle, the same release with 0.5.9's statements inserted by AST and, where
pr28144 is on too (it is affected on every one of these releases), PR #28144 as #29423 revised
it from 0.5.15's file. Every on/off assignment of the two, both apply orders; what the kernel
receives is compared in dtype, shape, strides, storage offset and values.
"""

import ast
import functools
import itertools

import pytest
import torch
from packaging.version import Version

import fp8_cases
import release_selection
from sglang_hotfix_trtllm import detect, patch
from sglang_hotfix_trtllm.record import Verdict
from sglang_hotfix_trtllm.records import pr17732, pr28144

HOTFIX = pr17732.HOTFIX
TABLE = release_selection.table(HOTFIX)
CANONICAL_RELEASE = "0.5.9"
AFFECTED = release_selection.with_verdict(HOTFIX)
QUICK = ("0.5.1", "0.5.4.post2", "0.5.6", "0.5.8.post1")
RELEASES = release_selection.selected(AFFECTED, QUICK)
RECORDS = {"pr28144": pr28144.HOTFIX, "pr17732": HOTFIX}


def expected_verdict(release):
    """PR #17732 landed in 0.5.9 (REFERENCE: the releases before lack canonicalize_stride)."""
    return Verdict.AFFECTED if Version(release) < Version("0.5.9") else Verdict.FIXED


def test_shipped_table_gives_every_release_its_verdict():
    assert HOTFIX.known_fingerprints.problem is None
    assert len([r for r in TABLE if Version(r) <= Version("0.5.23")]) == 42
    assert {r: row["verdict"] for r, row in TABLE.items() if row["verdict"] != expected_verdict(r).value} == {}
    assert AFFECTED[0] == "0.5.1" and AFFECTED[-1] == "0.5.8.post1" and len(AFFECTED) == 23


@pytest.mark.parametrize(
    "release", release_selection.selected(TABLE, ("0.5.1", "0.5.8.post1", "0.5.9", "0.5.16", "0.5.19", "0.5.23"))
)
def test_release_gets_its_verdict_from_its_own_source(release):
    path = release_selection.release_dir(release) / fp8_cases.BACKEND
    assessment = detect.assess_source(HOTFIX, str(path))
    assert assessment.verdict is expected_verdict(release), assessment.reason
    assert assessment.fingerprint == TABLE[release]["fingerprint"]


def _edited(release, edit):
    tree = ast.parse((release_selection.release_dir(release) / fp8_cases.BACKEND).read_text())
    edit(tree)
    return ast.unparse(tree)


def _method(tree, name):
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == pr17732.CLASS_NAME)
    return next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name)


def _drop_canonicalize(tree, name, side):
    method = _method(tree, name)
    for node in ast.walk(method):
        for field in ("body", "orelse"):
            body = getattr(node, field, None)
            if isinstance(body, list):
                body[:] = [s for s in body if ast.unparse(s) != pr17732.UPSTREAM_STATEMENTS[side]]


def _one_head_guard_on_q(tree):
    for node in ast.walk(_method(tree, "forward_decode")):
        if isinstance(node, ast.If) and ast.unparse(node) == pr17732.UPSTREAM_STATEMENTS["k"]:
            node.test.left.attr = "tp_q_head_num"


def _upstream_ifs(release="0.5.9"):
    tree = ast.parse((release_selection.release_dir(release) / fp8_cases.BACKEND).read_text())
    return [s for s in _method(tree, "forward_decode").body if ast.unparse(s) in pr17732.UPSTREAM_STATEMENTS.values()]


def _import_upstream(tree):
    tree.body.insert(0, ast.parse("from sglang.srt.layers.attention.utils import canonicalize_stride").body[0])


def _statements_after_the_kernel_call(tree):
    """0.5.8.post1 with 0.5.9's import and statements, but after each method's last statement but one."""
    _import_upstream(tree)
    for name in pr17732.METHODS:
        body = _method(tree, name).body
        body[-1:-1] = _upstream_ifs()


def _statements_under_if_false(tree):
    _import_upstream(tree)
    for name in pr17732.METHODS:
        body = _method(tree, name).body
        guard = ast.parse("if False:\n    pass").body[0]
        guard.body = _upstream_ifs()
        body.insert(0, guard)


VARIANTS = {
    # Upstream's statements where they run too late, or never (the review's cases: 0.7.0's first cut said fixed).
    "0.5.8.post1 with 0.5.9's statements after the kernel call": ("0.5.8.post1", _statements_after_the_kernel_call),
    "0.5.8.post1 with 0.5.9's statements under if False": ("0.5.8.post1", _statements_under_if_false),
    # 0.5.9 with one of upstream's statements gone: neither the affected code nor the fix.
    "0.5.9 without v's statement in forward_extend": ("0.5.9", lambda t: _drop_canonicalize(t, "forward_extend", "v")),
    "0.5.9 guarding k by the query heads": ("0.5.9", _one_head_guard_on_q),
    # An affected release with one more statement in a pinned method.
    "0.5.8.post1 with an extra statement": (
        "0.5.8.post1",
        lambda t: _method(t, "forward_decode").body.insert(0, ast.parse("k_cache = None").body[0]),
    ),
    # 0.5.9's statements without its import.
    "0.5.9 without the import": (
        "0.5.9",
        lambda t: t.body.__setitem__(
            slice(None),
            [n for n in t.body if not (isinstance(n, ast.ImportFrom) and "canonicalize_stride" in ast.unparse(n))],
        ),
    ),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_hand_made_variants_are_unknown(variant):
    release, edit = VARIANTS[variant]
    classification = HOTFIX.classify(ast.parse(_edited(release, edit)))
    assert classification.verdict is Verdict.UNKNOWN, classification.reason


# --------------------------------------------------------------------------
# canonical_strides is 0.5.9's canonicalize_stride


def _tensors():
    """Every K/V view the backend makes (the pool's per-layer buffer viewed as [pages, page_size,
    heads, head_dim] and permuted), and strided tensors beyond them: size-1 dimensions anywhere,
    storage offsets, non-contiguous strides, zero strides, 0-d and 1-d."""
    made = []
    for heads in (1, 2, 3):
        for page_size in (1, 4, 16):
            for head_dim in (1, 8):
                buffer = torch.arange(6 * page_size * heads * head_dim, dtype=torch.float32).view(-1, heads, head_dim)
                made.append(buffer.view(-1, page_size, heads, head_dim).permute(0, 2, 1, 3))
                made.append(buffer[page_size:].view(-1, page_size, heads, head_dim).permute(0, 2, 1, 3))
    storage = torch.arange(4096, dtype=torch.float32)
    for sizes, strides, offset in [
        ((2, 1, 4, 8), (32, 8, 8, 1), 0),
        ((2, 1, 4, 8), (64, 8, 8, 1), 5),  # not contiguous, degenerate
        ((2, 1, 4, 8), (32, 32, 8, 1), 0),  # already canonical
        ((1, 3, 4), (4, 4, 1), 7),
        ((3, 1, 1, 2), (2, 2, 2, 1), 0),
        ((3, 1, 1, 2), (9, 2, 5, 1), 1),
        ((1,), (1,), 3),
        ((), (), 11),
        ((4, 1), (1, 1), 0),
        ((2, 1, 3), (0, 0, 1), 0),  # zero strides (an expanded tensor)
        ((2, 2, 1, 8), (16, 8, 8, 1), 2),
    ]:
        made.append(storage.as_strided(sizes, strides, offset))
    made.append(torch.zeros(5, 1, 4, dtype=torch.float8_e4m3fn).permute(1, 0, 2))
    return made


def _layout(tensor):
    return (tensor.dtype, tuple(tensor.shape), tensor.stride(), tensor.storage_offset(), tensor.data_ptr())


def test_the_carried_canonicalize_stride_is_0_5_9s_own_definition():
    """The record carries 0.5.9's ``canonicalize_stride`` text: it parses to the definition in 0.5.9's
    wheel, and the function the mechanism makes of it (the backend module's globals) computes what
    0.5.9's does on every tensor, same object where upstream returns it, same layout otherwise."""
    path = fp8_cases.extra_file(release_selection.release_dir(CANONICAL_RELEASE), fp8_cases.ATTENTION_UTILS)
    (upstream_node,) = [
        n
        for n in ast.parse(path.read_text(encoding="utf-8")).body
        if isinstance(n, ast.FunctionDef) and n.name == "canonicalize_stride"
    ]
    (carried,) = ast.parse(pr17732.UPSTREAM_CANONICALIZE_STRIDE).body
    assert ast.dump(carried) == ast.dump(upstream_node)
    upstream = fp8_cases.release_canonicalize_stride(release_selection.release_dir(CANONICAL_RELEASE))
    module = fp8_cases.load_backend_module(release_selection.release_dir(RELEASES[0]))
    try:
        patch.wrap(HOTFIX, module, detect.assess_module(HOTFIX, module))
        made = module.canonicalize_stride
        assert made.__globals__ is vars(module)
        changed = 0
        for tensor in _tensors():
            want, got = upstream(tensor), made(tensor)
            assert (got is tensor) == (want is tensor), _layout(tensor)
            assert _layout(got) == _layout(want), (_layout(tensor), _layout(got), _layout(want))
            changed += want is not tensor
    finally:
        patch.remove_all()
    assert "canonicalize_stride" not in vars(module)  # taken away again
    assert changed >= 10  # the comparison covers tensors upstream changes, not only ones it leaves


# --------------------------------------------------------------------------
# Differential: every assignment of the records on the two methods, against upstream's changes


def _cases(release, scales=None):
    return {n: c for n, c in fp8_cases.cases(release).items() if scales is None or c.scales in scales}


@functools.lru_cache(maxsize=None)
def _oracle_calls(release, on, scales=None):
    module = fp8_cases.upstream_module(
        release_selection.release_dir(release),
        release_selection.release_dir(fp8_cases.FIXED_RELEASE),
        scales="pr28144" in on,
        canonical_strides_dir=release_selection.release_dir(CANONICAL_RELEASE) if "pr17732" in on else None,
    )
    return {name: fp8_cases.kernel_calls(module, case) for name, case in _cases(release, scales).items()}


@pytest.mark.parametrize("release", RELEASES)
def test_the_oracle_tells_the_records_apart(release):
    """With one KV head every case's kernel gets other strides with #17732 on: the harness can fail."""
    on, off = _oracle_calls(release, ("pr17732",)), _oracle_calls(release, ())
    assert fp8_cases.KV_HEADS == 1 and sorted(on) == sorted(off)
    assert [n for n in on if on[n] == off[n]] == []


@pytest.mark.parametrize("release", RELEASES)
def test_the_record_alone_equals_upstreams_change_on_every_case(release):
    module = fp8_cases.load_backend_module(release_selection.release_dir(release))
    expected = _oracle_calls(release, ("pr17732",))
    try:
        assert patch.wrap(HOTFIX, module, detect.assess_module(HOTFIX, module)) == "wrapped"
        wrong = [n for n, c in _cases(release).items() if fp8_cases.kernel_calls(module, c) != expected[n]]
    finally:
        patch.remove_all()
    assert wrong == []


def _assignments():
    names = list(RECORDS)
    return [tuple(r for r, bit in zip(names, bits) if bit) for bits in itertools.product((0, 1), repeat=len(names))]


@pytest.mark.parametrize("reverse", [False, True], ids=["catalog-order", "reversed-apply-order"])
@pytest.mark.parametrize("release", RELEASES)
def test_every_assignment_of_the_records_equals_upstreams_changes(release, reverse):
    scales = ("absent", "float")
    module = fp8_cases.load_backend_module(release_selection.release_dir(release))
    mismatches = []
    for on in _assignments():
        expected = _oracle_calls(release, on, scales)
        order = [RECORDS[name] for name in on]
        try:
            for hotfix in reversed(order) if reverse else order:
                assert patch.wrap(hotfix, module, detect.assess_module(hotfix, module)) in ("wrapped", "already")
            for name, case in _cases(release, scales).items():
                if fp8_cases.kernel_calls(module, case) != expected[name]:
                    mismatches.append("%s %s" % ("+".join(on) or "none", name))
        finally:
            patch.remove_all()
    assert mismatches == []


@pytest.mark.parametrize("release", RELEASES[:1] + RELEASES[-1:])
def test_both_records_compile_into_each_method_once(release):
    """Both records on both methods: each method is SGLang's function with one code object holding
    both edits (0.5.9's two statements and 0.5.15's scales), and remove() restores both originals."""
    module = fp8_cases.load_backend_module(release_selection.release_dir(release))
    cls = module.TRTLLMHAAttnBackend
    originals = {m: cls.__dict__[m].__code__ for m in pr17732.METHODS}
    try:
        for hotfix in RECORDS.values():
            patch.wrap(hotfix, module, detect.assess_module(hotfix, module))
        for method in pr17732.METHODS:
            names = cls.__dict__[method].__code__.co_names
            assert type(cls.__dict__[method]).__name__ == "function"
            assert "canonicalize_stride" in names and "_get_bmm_scales" in names
    finally:
        assert patch.remove_all() == 2
    assert all(cls.__dict__[m].__code__ is originals[m] for m in pr17732.METHODS)


@pytest.mark.parametrize("release", RELEASES[:1] + RELEASES[-1:])
def test_layers_with_more_kv_heads_run_sglangs_method_alone(release, monkeypatch):
    """Two KV heads on the rank: upstream changes nothing; the record leaves the call and the module alone."""
    monkeypatch.setattr(fp8_cases, "KV_HEADS", 2)
    module = fp8_cases.load_backend_module(release_selection.release_dir(release))
    own = module.flashinfer
    unpatched = {n: fp8_cases.kernel_calls(module, c) for n, c in _cases(release, ("absent",)).items()}
    try:
        patch.wrap(HOTFIX, module, detect.assess_module(HOTFIX, module))
        for name, case in _cases(release, ("absent",)).items():
            assert fp8_cases.kernel_calls(module, case) == unpatched[name], name
            assert module.flashinfer is own, name
    finally:
        patch.remove_all()


@pytest.mark.parametrize("heads", [(1, 2), (2, 1)], ids=["one-k-head", "one-v-head"])
@pytest.mark.parametrize("release", RELEASES[:1] + RELEASES[-1:])
def test_k_and_v_are_judged_each_by_its_own_head_count(release, heads, monkeypatch):
    """Upstream asks ``tp_k_head_num`` for K and ``tp_v_head_num`` for V: with one side of one head,
    only that side's view changes, and the other is SGLang's own object."""
    monkeypatch.setattr(fp8_cases, "KV_HEADS", heads[0])
    monkeypatch.setattr(fp8_cases, "V_HEADS", heads[1])
    scales = ("absent", "float")
    on, off = _fresh_oracle(release, ("pr17732",), scales), _fresh_oracle(release, (), scales)
    assert [n for n in on if on[n] == off[n]] == []
    module = fp8_cases.load_backend_module(release_selection.release_dir(release))
    try:
        patch.wrap(HOTFIX, module, detect.assess_module(HOTFIX, module))
        wrong = [n for n, c in _cases(release, scales).items() if fp8_cases.kernel_calls(module, c) != on[n]]
    finally:
        patch.remove_all()
    assert wrong == []


def _fresh_oracle(release, on, scales):
    """``_oracle_calls`` without its cache (the head counts differ from the cached runs')."""
    return _oracle_calls.__wrapped__(release, on, scales)


def test_a_fork_that_defines_canonicalize_stride_itself_is_told_as_what_it_is():
    """Issue 36, item 4: a fork with 0.5.12's methods whose canonicalize_stride is defined in the
    module (not imported from SGLang's attention utils) read "not the code of a release this hotfix
    knows" about methods identical to a release's. It is still unknown (whether its function is
    upstream's is not seen), and the reason says why."""

    def define_it_here(tree):
        imports = [n for n in tree.body if isinstance(n, ast.ImportFrom) and "canonicalize_stride" in ast.unparse(n)]
        assert imports, "0.5.12 imports canonicalize_stride"
        for node in imports:
            tree.body.remove(node)
        tree.body.insert(0, ast.parse("def canonicalize_stride(t):\n    return t").body[0])

    classification = HOTFIX.classify(ast.parse(_edited("0.5.12", define_it_here)))
    assert classification.verdict is Verdict.UNKNOWN
    assert "hold upstream's canonicalize_stride statements" in classification.reason
    assert "does not import canonicalize_stride from SGLang's attention utils" in classification.reason
    assert "not the code of a release" not in classification.reason
