"""How the PR #26521 record classifies sources: real ones and hand-made variants."""

import ast

import pytest

import isolated_release
import release_selection
import variants
from sglang_hotfix_trtllm.records import pr26521
from sglang_hotfix_trtllm.record import Verdict


def classify(text):
    return pr26521.classify(ast.parse(text))


def test_installed_0_5_12_is_affected_with_an_ast_fingerprint(installed_backend_source):
    result = classify(installed_backend_source)
    assert result.verdict is Verdict.AFFECTED, result.reason
    assert result.fingerprint.startswith("ast1:")


def test_upstream_statement_inserted_is_fixed(installed_backend_source):
    result = classify(variants.fixed_source_text(installed_backend_source))
    assert result.verdict is Verdict.FIXED, result.reason
    assert result.fingerprint != classify(installed_backend_source).fingerprint


@pytest.mark.parametrize(
    "variant",
    [
        variants.with_renamed_key,
        variants.without_draft_branch,
        variants.with_extra_write,
        variants.with_write_after_use,
    ],
    ids=lambda f: f.__name__,
)
def test_unrecognised_variants_are_unknown(installed_backend_source, variant):
    result = classify(variant(installed_backend_source))
    assert result.verdict is Verdict.UNKNOWN, result.reason


def test_extra_write_after_upstream_fix_is_not_fixed(installed_backend_source):
    text = variants.with_extra_write(
        variants.fixed_source_text(installed_backend_source), "metadata.cache_seqlens_int32.zero_()"
    )
    assert classify(text).verdict is Verdict.UNKNOWN


def test_reformatting_keeps_verdict_and_fingerprint(installed_backend_source):
    original = classify(installed_backend_source)
    again = classify(variants.reformatted(installed_backend_source))
    assert (again.verdict, again.fingerprint) == (original.verdict, original.fingerprint)


def test_changed_signature_is_unknown(installed_backend_source):
    text = installed_backend_source.replace(
        '        spec_info: Optional[SpecInput],\n    ):\n        """Initialize metadata for CUDA graph capture.',
        '        spec_info: Optional[SpecInput] = None,\n    ):\n        """Initialize metadata for CUDA graph capture.',  # noqa: E501 (verbatim data)
        1,
    )
    assert text != installed_backend_source
    assert classify(text).verdict is Verdict.UNKNOWN


def test_module_without_the_class_is_unknown():
    assert classify("x = 1\n").verdict is Verdict.UNKNOWN


def test_release_0_5_13_is_fixed():
    path = release_selection.release_dir("0.5.13") / isolated_release.BACKEND
    result = classify(path.read_text(encoding="utf-8"))
    assert result.verdict is Verdict.FIXED, result.reason
