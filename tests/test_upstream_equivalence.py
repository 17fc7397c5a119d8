"""Each record's edit, applied to the last release with its bug, against the first release upstream
fixed it in (issue 47, item 8a): the edited method and upstream's own method of that release differ
only where other upstream changes intervene, each named here, never in the statements the record
changes. The differential tests prove the repair by what the kernels receive; this proves the edit
*is* upstream's text, line for line, where upstream's release has nothing else new.

The comparison is of the methods' source as ``ast.unparse`` writes it (one line a statement or
clause), so a count of differing lines is exact; a change to an edit, or to what the edit is
compared with, changes it.
"""

import ast
import difflib

import pytest

import fp8_cases
import release_selection
from sglang_hotfix_trtllm.records import catalog

RECORDS = {hotfix.name: hotfix for hotfix in catalog.HOTFIXES}

# (record, method, last affected release, first fixed release) -> (differing lines, what else
# changed between the two releases there).
CASES = {
    ("pr19107", "_fused_fp8_set_kv_buffer", "0.5.9", "0.5.10"): (0, "nothing"),
    ("pr31667", "forward_decode", "0.5.15.post1", "0.5.16"): (
        37,
        "0.5.16's fused FP8 QKV write (_fused_fp8_qkv_kv_cache, use_fused_qkv), its KV write scales "
        "(_kv_write_scales) and the page-table reshape helper (_reshape_paged_kv_cache)",
    ),
    ("pr28144", "forward_decode", "0.5.13.post1", "0.5.15"): (
        7,
        "0.5.14's KVWriteLoc KV write; 0.5.15 sets q_scale = 1.0 before the FP8 cast, the edit where the "
        "release's scale block was (read only by _get_bmm_scales, after both)",
    ),
    ("pr28144", "forward_extend", "0.5.13.post1", "0.5.15"): (
        9,
        "the same two, and 0.5.14's draft-extend-v2 mode on the decode kernel",
    ),
    ("pr17732", "forward_decode", "0.5.8.post1", "0.5.9"): (3, "0.5.9's per-layer page table (_get_layer_page_table)"),
    ("pr17732", "forward_extend", "0.5.8.post1", "0.5.9"): (5, "the same"),
    ("encoder_only_mask", "forward_extend", "0.5.21", "0.5.22"): (
        35,
        "0.5.22's KVWriteLoc.for_batch, paged_kv_view, uses_decode_kernel and its draft-extend mask "
        "(record xqa_draft_extend's fix)",
    ),
    ("xqa_draft_extend", "forward_extend", "0.5.21", "0.5.22"): (
        32,
        "0.5.22's KVWriteLoc.for_batch, paged_kv_view, mixed prefill, its fmha_v2 output buffer and "
        "encoder_only_mask's arguments; its rename of is_decode_mode (the same expression) to "
        "uses_decode_kernel, left out of the edit",
    ),
    ("xqa_workspace", "__init__", "0.5.22", "0.5.23"): (0, "nothing"),
    ("xqa_workspace", "forward_extend", "0.5.22", "0.5.23"): (
        18,
        "0.5.23's HND KV pools for fmha_v2 (_fmha_v2_paged_inputs, kv_pool_is_hnd) and its prefix path",
    ),
}


def _methods(release):
    path = release_selection.release_dir(release) / fp8_cases.BACKEND
    tree = ast.parse(path.read_text(encoding="utf-8"))
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == fp8_cases.CLASS_NAME]
    return tree, {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}


def test_every_edit_of_every_record_is_compared():
    edited = {(h.name, e.method) for h in catalog.HOTFIXES for e in h.edits}
    assert edited == {(record, method) for record, method, _, _ in CASES}


@pytest.mark.parametrize("case", sorted(CASES), ids=lambda c: "%s-%s" % c[:2])
def test_the_edit_on_the_last_affected_release_is_upstreams_text(case):
    record, method, last, first = case
    expected, _ = CASES[case]
    tree, own = _methods(last)
    _, fixed = _methods(first)
    before = ast.unparse(own[method]).splitlines()
    for edit in RECORDS[record].edits:
        if edit.method == method:
            edit.apply(own[method], tree)
    after = ast.unparse(own[method]).splitlines()
    upstream = ast.unparse(fixed[method]).splitlines()
    differing = [
        line
        for line in difflib.unified_diff(after, upstream, lineterm="", n=0)
        if line[:1] in "+-" and line[:3] not in ("+++", "---")
    ]
    assert len(differing) == expected, "\n".join(differing)
    # Every fragment the edit wrote (a new line, or what it wrote into a line: a keyword) is in
    # upstream's method as it is.
    fragments = _written(before, after)
    text = "\n".join(upstream)
    assert fragments and [f for f in fragments if f not in text] == []


def _written(before, after):
    """What the edit wrote: whole new lines, and the new parts of lines it changed."""
    written = []
    lines = difflib.SequenceMatcher(None, before, after, autojunk=False)
    for op, i1, i2, j1, j2 in lines.get_opcodes():
        if op == "insert" or (op == "replace" and i2 - i1 != j2 - j1):
            written += [line.strip() for line in after[j1:j2]]
        elif op == "replace":
            for old, new in zip(before[i1:i2], after[j1:j2]):
                chars = difflib.SequenceMatcher(None, old, new, autojunk=False)
                written += [
                    new[b1:b2].strip(" ,")
                    for tag, _, _, b1, b2 in chars.get_opcodes()
                    if tag in ("insert", "replace") and new[b1:b2].strip(" ,")
                ]
    return written
