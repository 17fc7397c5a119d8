"""The records of SGLang 0.5.22's fixes that report a bug where they cannot repair it:
xqa_draft_extend (EAGLE/MTP draft extend on XQA: repaired on 0.5.21, test_xqa_draft_extend; reported
on 0.5.14 to 0.5.20) and encoder_only_mask
(ENCODER_ONLY layers prefilled causal: repaired on 0.5.11 to 0.5.21, test_encoder_only_mask;
reported on the other releases with the bug). docs/records.md says why.

Verdicts: every release of the shipped tables from its own source. ``fixed`` is 0.5.22's change in
substance: 0.5.21 with 0.5.22's statements or arguments put in by AST reads fixed, and with any one
of them left out it does not. An unrepairable release is said as such by ``status`` (NOT PROTECTED,
exit 1, the record and the release that fixes it named); turned off by name, the bug is accepted
and the first line says so, with exit 0. Mutation: every mutant of 0.5.14's and 0.5.21's
``forward_extend`` is refused by xqa_draft_extend (encoder_only_mask's refusals of the same
mutants: test_mutants); a mutant of 0.5.22 that breaks one of the fix's statements is not called
fixed by xqa_draft_extend.
"""

import ast
import copy

import pytest
from packaging.version import Version

import mutants
import release_selection
from conftest import clean_env, status_json
from sglang_hotfix_trtllm import detect
from sglang_hotfix_trtllm.record import Verdict
from sglang_hotfix_trtllm.records import encoder_only_mask, xqa_draft_extend

BACKEND = "sglang/srt/layers/attention/trtllm_mha_backend.py"
FIXED_IN = "0.5.22"
# record -> the first release with its bug (before it: not-applicable)
FIRST_WITH_THE_BUG = {
    encoder_only_mask: "0.5.1",  # every release's prefill call runs causal
    xqa_draft_extend: "0.5.14",  # draft extend on the decode kernel with an FP8 query and no mask
}
RECORDS = {record.NAME: record for record in FIRST_WITH_THE_BUG}


# record -> [first, end) of the releases it repairs
REPAIRED = {encoder_only_mask: ("0.5.11", "0.5.22"), xqa_draft_extend: ("0.5.21", "0.5.22")}


def expected_verdict(record, release):
    version = Version(release)
    if version < Version(FIRST_WITH_THE_BUG[record]):  # forward_extend never asks is_draft_extend_v2
        return Verdict.NOT_APPLICABLE
    if version >= Version(FIXED_IN):
        return Verdict.FIXED
    first, end = REPAIRED.get(record, ("0", "0"))
    return Verdict.AFFECTED if Version(first) <= version < Version(end) else Verdict.UNREPAIRABLE


def _tree(release):
    return ast.parse((release_selection.release_dir(release) / BACKEND).read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_shipped_table_gives_every_release_its_verdict(name):
    record = RECORDS[name]
    table = release_selection.table(record.HOTFIX)
    assert record.HOTFIX.known_fingerprints.problem is None
    assert len([r for r in table if Version(r) <= Version("0.5.23")]) == 42
    wrong = {r: row["verdict"] for r, row in table.items() if row["verdict"] != expected_verdict(record, r).value}
    assert wrong == {}


QUICK = ("0.5.1", "0.5.11", "0.5.12", "0.5.13.post1", "0.5.14", "0.5.21", "0.5.22", "0.5.23")


@pytest.mark.parametrize("name", sorted(RECORDS))
@pytest.mark.parametrize("release", release_selection.selected(release_selection.table(xqa_draft_extend.HOTFIX), QUICK))
def test_release_gets_its_verdict_from_its_own_source(name, release):
    record = RECORDS[name]
    assessment = detect.assess_source(record.HOTFIX, str(release_selection.release_dir(release) / BACKEND))
    assert assessment.verdict is expected_verdict(record, release), assessment.reason
    assert assessment.fingerprint == release_selection.table(record.HOTFIX)[release]["fingerprint"]
    if assessment.verdict is Verdict.UNREPAIRABLE:
        assert "0.5.22" in assessment.reason


def _extend(tree):
    cls, _ = detect.live_class(tree, xqa_draft_extend.CLASS_NAME)
    return detect.live_methods(tree, cls, ("forward_extend",))["forward_extend"][0]


def _draft_extend_change(release_tree, fixed_tree, leave_out=()):
    """``release_tree`` with 0.5.22's three statements put into its forward_extend, taken from
    0.5.22's own method: ``uses_decode_kernel`` before ``q_scale = 1.0``, the FP8 cast's condition on
    it, the mask on ``max_seq_len_q > 1`` alone."""
    tree = copy.deepcopy(release_tree)
    extend, fixed = _extend(tree), _extend(fixed_tree)
    by_text = {ast.unparse(n): n for n in ast.walk(fixed) if isinstance(n, (ast.stmt, ast.expr))}
    assignment = by_text[xqa_draft_extend.USES_DECODE_KERNEL]
    condition = by_text[xqa_draft_extend.CAST_CONDITION]
    mask = by_text[xqa_draft_extend.MASK]
    done = set()
    for node in ast.walk(extend):
        for field, value in ast.iter_fields(node):
            if isinstance(value, list):
                for i, child in enumerate(value):
                    text = ast.unparse(child) if isinstance(child, ast.AST) else None
                    if text == "q_scale = 1.0" and "assignment" not in leave_out and "assignment" not in done:
                        value.insert(i, copy.deepcopy(assignment))
                        done.add("assignment")
                        break
                    if text == "not self.is_xqa_impl or not forward_batch.forward_mode.is_target_verify()":
                        if "condition" not in leave_out:
                            value[i] = copy.deepcopy(condition)
                            done.add("condition")
            elif isinstance(value, ast.IfExp) and ast.unparse(value.body) == "self._xqa_spec_dec_mask":
                if "mask" not in leave_out:
                    setattr(node, field, copy.deepcopy(mask))
                    done.add("mask")
    assert done == {"assignment", "condition", "mask"} - set(leave_out), done
    return ast.fix_missing_locations(tree)


def _encoder_only_change(release_tree, fixed_tree, leave_out=()):
    """``release_tree`` with 0.5.22's two arguments, taken from 0.5.22's own calls: the context
    kernel's ``causal`` added, fmha_v2's ``mask_mode`` replaced."""
    tree = copy.deepcopy(release_tree)
    upstream = {}
    for name, call in encoder_only_mask.kernel_calls(_extend(fixed_tree)):
        keyword = encoder_only_mask.UPSTREAM_ARGUMENTS[name][0]
        upstream[name] = next(k for k in call.keywords if k.arg == keyword)
    done = set()
    for name, call in encoder_only_mask.kernel_calls(_extend(tree)):
        if name in leave_out:
            continue
        keyword = upstream[name]
        call.keywords = [k for k in call.keywords if k.arg != keyword.arg] + [copy.deepcopy(keyword)]
        done.add(name)
    assert done == set(upstream) - set(leave_out), done
    return ast.fix_missing_locations(tree)


CHANGES = {
    "xqa_draft_extend": (_draft_extend_change, ("assignment", "condition", "mask")),
    "encoder_only_mask": (_encoder_only_change, (encoder_only_mask.CONTEXT_KERNEL, encoder_only_mask.FMHA_V2_KERNEL)),
}


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_upstream_change_inserted_into_the_last_affected_release_reads_fixed(name):
    record, (change, _) = RECORDS[name], CHANGES[name]
    release, fixed = _tree("0.5.21"), _tree(FIXED_IN)
    assert record.classify(release).verdict is expected_verdict(record, "0.5.21")
    assert record.classify(change(release, fixed)).verdict is Verdict.FIXED


@pytest.mark.parametrize("name, left_out", [(name, part) for name in sorted(CHANGES) for part in CHANGES[name][1]])
def test_upstream_change_with_a_part_left_out_is_not_called_fixed(name, left_out):
    """Half of the fix is not the fix: the query still FP8 (condition), no mask for draft extend,
    one of the two prefill kernels still causal."""
    record, (change, _) = RECORDS[name], CHANGES[name]
    changed = change(_tree("0.5.21"), _tree(FIXED_IN), leave_out=(left_out,))
    classification = record.classify(changed)
    assert classification.verdict is Verdict.UNKNOWN, classification.reason


# Mutation: every mutant of the method a reporting record reads, on a release with the bug, is
# refused (``unknown``): a mutant is not a release this hotfix knows, and no single mutation makes
# 0.5.14's or 0.5.21's code upstream's fix (``fixed``) or code without the route (``not-applicable``).
# Mutants the generator makes, measured: 168 of 0.5.14's forward_extend, 431 of 0.5.21's.
MUTATED = {"0.5.14": 160, "0.5.21": 420}


# encoder_only_mask's mutants of the same method on 0.5.14 and 0.5.21 are test_mutants' (the same
# generator, every one refused there): xqa_draft_extend's here.
@pytest.mark.parametrize("name", ["xqa_draft_extend"])
@pytest.mark.parametrize("release", sorted(MUTATED))
def test_every_mutant_of_a_release_with_the_bug_is_refused(name, release):
    record = RECORDS[name]
    text = (release_selection.release_dir(release) / BACKEND).read_text(encoding="utf-8")
    assert record.classify(ast.parse(text)).verdict is expected_verdict(record, release)
    generated = list(mutants.generate(text, record.CLASS_NAME, ["forward_extend"], {}))
    assert len(generated) >= MUTATED[release]
    wrong = {}
    for mutant in generated:
        classification = record.HOTFIX.classify(mutant.tree())  # as the import hook runs it
        if classification.verdict is not Verdict.UNKNOWN:
            wrong[mutant.describe()] = "%s: %s" % (classification.verdict.value, classification.reason)
    assert wrong == {}


def _fix_statement_lines(extend):
    """The lines of 0.5.22's three statements in its forward_extend: the ``uses_decode_kernel``
    binding, the FP8 cast's test, the mask's binding."""
    lines = set()
    for node in ast.walk(extend):
        if isinstance(node, ast.Assign) and ast.unparse(node) == xqa_draft_extend.USES_DECODE_KERNEL:
            lines.update(range(node.lineno, node.end_lineno + 1))
        if isinstance(node, ast.Assign) and ast.unparse(node.value) == xqa_draft_extend.MASK:
            lines.update(range(node.lineno, node.end_lineno + 1))
        if isinstance(node, ast.If) and xqa_draft_extend.CAST_CONDITION in ast.unparse(node.test):
            lines.update(range(node.test.lineno, node.test.end_lineno + 1))
    return lines


def test_a_mutant_that_breaks_one_of_the_fixs_statements_is_not_called_fixed():
    """``fixed`` rests on 0.5.22's three statements in their roles: a mutant of 0.5.22 that drops,
    negates or changes one of them (the binding, the cast's test, the mask) is not the fix, while
    the other mutants of 0.5.22 (its fix untouched) still read fixed."""
    text = (release_selection.release_dir(FIXED_IN) / BACKEND).read_text(encoding="utf-8")
    lines = _fix_statement_lines(_extend(ast.parse(text)))
    assert len(lines) >= 3
    breaking, called_fixed, wrong = 0, 0, {}
    for mutant in mutants.generate(text, xqa_draft_extend.CLASS_NAME, ["forward_extend"], {}):
        verdict = xqa_draft_extend.HOTFIX.classify(mutant.tree()).verdict
        if mutant.line in lines and mutant.operator in ("drop", "negate", "const", "attr"):
            breaking += 1
            if verdict is Verdict.FIXED:
                wrong[mutant.describe()] = verdict.value
        elif verdict is Verdict.FIXED:
            called_fixed += 1
    assert breaking >= 10
    assert called_fixed >= 400  # the check is not a fingerprint: 0.5.22's other statements may differ
    assert wrong == {}


def _status(release, disable=None):
    env = clean_env(PYTHONPATH=str(release_selection.installed(release)))
    if disable:
        env["SGLANG_HOTFIX_TRTLLM_DISABLE"] = disable
    ran = status_json(env=env, timeout=300)
    return ran.returncode, ran.report


def test_an_unrepairable_release_is_not_protected_and_says_what_fixes_it():
    """SGLang 0.5.19 installed (the real package): NOT PROTECTED with exit 1, xqa_draft_extend named
    with the release that fixes it, and not patched; encoder_only_mask (repaired there since it
    repairs 0.5.19 to 0.5.21) and xqa_workspace would patch. (The import's WARNING:
    test_toy_record's unrepairable case, through the same engine path; encoder_only_mask's
    unrepairable verdict with a FlashInfer lacking the argument: test_encoder_only_mask.)"""
    code, document = _status("0.5.19")
    assert code == 1 and document["exit_status"] == 1
    headline = document["headline"]
    assert headline.startswith("NOT PROTECTED: SGLang 0.5.19: record xqa_draft_extend ")
    assert headline.count("SGLang 0.5.22 fixes it") == 1
    assert "(records xqa_workspace, encoder_only_mask would be patched)" in headline
    blocks = {r["hotfix"]: r for r in document["hotfixes"]}
    block = blocks["xqa_draft_extend"]
    assert block["verdict"] == "unrepairable" and block["would_patch"] is False and "0.5.22" in block["reason"]
    assert blocks["encoder_only_mask"]["verdict"] == "affected" and blocks["encoder_only_mask"]["would_patch"] is True


@pytest.mark.parametrize(
    "release, disable, code, opening",
    [
        # the record that only reports turned off by name: accepted, and the first line says so
        (
            "0.5.19",
            "xqa_draft_extend",
            0,
            "PROTECTED: SGLang 0.5.19 has the bugs of records xqa_workspace, encoder_only_mask;",
        ),
        # 0.5.17: encoder_only_mask repairs (0.5.16 to 0.5.18), xqa_draft_extend only reports
        (
            "0.5.17",
            "xqa_draft_extend",
            0,
            "PROTECTED: SGLang 0.5.17 has the bug of record encoder_only_mask;",
        ),
        (
            "0.5.17",
            "encoder_only_mask,xqa_draft_extend",
            1,
            "NOT PROTECTED: SGLang 0.5.17: record encoder_only_mask would run unpatched",
        ),
        # a record that could repair turned off, the one that only reports on: both named
        (
            "0.5.19",
            "encoder_only_mask",
            1,
            "NOT PROTECTED: SGLang 0.5.19: records encoder_only_mask, xqa_draft_extend would run",
        ),
        # a record that could repair, turned off: its bug runs, NOT PROTECTED as before
        (
            "0.5.19",
            "xqa_workspace,encoder_only_mask,xqa_draft_extend",
            1,
            "NOT PROTECTED: SGLang 0.5.19: records xqa_workspace, encoder_only_mask would run",
        ),
    ],
)
def test_an_unrepairable_record_turned_off_by_name_is_accepted_and_said(release, disable, code, opening):
    got, document = _status(release, disable)
    assert (got, document["exit_status"]) == (code, code), document["headline"]
    assert document["headline"].startswith(opening), document["headline"]
    if code == 0:
        assert "its bug runs unrepaired" in document["headline"]
        assert document["headline"].endswith("accepted by SGLANG_HOTFIX_TRTLLM_DISABLE"), document["headline"]
