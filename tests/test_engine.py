"""Verdicts, switches and messages, on the real SGLang import path."""

import pytest

import release_selection
import variants
from conftest import PATCHED, UNPATCHED, clean_env, wrapped_methods


def test_disable_switch_leaves_sglang_alone_and_silent(scenario):
    ran = scenario("describe", env=clean_env(SGLANG_HOTFIX_TRTLLM_DISABLE="1"))
    assert ran.returncode == 0, ran
    assert ran.result["attribute_type"] == UNPATCHED
    assert ran.hotfix_lines() == []


def test_sglang_plugins_allowlist_without_us_means_no_patch(scenario):
    ran = scenario("describe", env=clean_env(SGLANG_PLUGINS="some_other_plugin"))
    assert ran.result["attribute_type"] == UNPATCHED
    lines = ran.hotfix_lines()
    # A WARNING since 0.2.0: on affected code the allowlist leaves a known bug unpatched.
    assert len(lines) == 1 and "WARNING: not patching" in lines[0] and "SGLANG_PLUGINS" in lines[0]


def test_sglang_plugins_allowlist_naming_us_patches(scenario):
    ran = scenario("describe", env=clean_env(SGLANG_PLUGINS="some_other_plugin, sglang_hotfix_trtllm"))
    assert ran.result["attribute_type"] == PATCHED


def test_garbage_switch_values_warn_strict_reads_off_and_disable_turns_everything_off(scenario):
    ran = scenario("describe", env=clean_env(SGLANG_HOTFIX_TRTLLM_DISABLE="maybe", SGLANG_HOTFIX_TRTLLM_STRICT="\x01!"))
    assert ran.returncode == 0, ran
    assert ran.result["attribute_type"] == UNPATCHED  # the kill switch fails safe
    warnings = [line for line in ran.hotfix_lines() if "WARNING" in line]
    assert len(warnings) == 2
    assert any("SGLANG_HOTFIX_TRTLLM_DISABLE='maybe' is not understood" in line for line in warnings)
    assert all("accepted values are 1/true/yes/on" in line for line in warnings)


@pytest.mark.parametrize(
    "variant, level, words",
    [
        (variants.fixed_source_text, "INFO", ("upstream already has the fix", "pip uninstall sglang-hotfix-trtllm")),
        (variants.with_extra_write, "WARNING", ("code not recognised", "fingerprint ast1:")),
    ],
    ids=["upstream-fixed-source-is-not-wrapped", "unknown-source-is-refused-with-a-warning"],
)
def test_sources_not_patched_say_why_in_one_line(
    scenario, overlay_dir, installed_backend_source, variant, level, words
):
    ran = scenario("overlay", overlay_dir(variant(installed_backend_source)))
    assert ran.returncode == 0, ran
    assert ran.result["attribute_type"] == UNPATCHED
    (line,) = ran.hotfix_lines()
    assert "%s: not patching" % level in line and all(w in line for w in words)


def test_strict_mode_stops_the_process_on_unknown_source(scenario, overlay_dir, installed_backend_source):
    folder = overlay_dir(variants.with_renamed_key(installed_backend_source))
    ran = scenario("overlay", folder, env=clean_env(SGLANG_HOTFIX_TRTLLM_STRICT="1"))
    assert ran.returncode != 0
    assert "HotfixError" in ran.stderr and "strict mode" in ran.stderr and "code not recognised" in ran.stderr
    assert ran.result == {"import_error": ran.result["import_error"]}


def test_strict_mode_does_not_interfere_when_patching_works(scenario):
    ran = scenario("describe", env=clean_env(SGLANG_HOTFIX_TRTLLM_STRICT="1"))
    assert ran.returncode == 0 and ran.result["attribute_type"] == PATCHED


def test_release_0_5_13_is_fixed_for_four_records_and_three_records_edit_its_methods(scenario):
    folder = release_selection.installed("0.5.13")
    ran = scenario("describe", env=clean_env(PYTHONPATH=str(folder)))
    assert ran.returncode == 0, ran
    assert ran.result["module_file"].startswith(str(folder))
    # 0.5.13 has no capture method at all; only the methods of pr28144 (fixed in 0.5.14), pr31667
    # (fixed in 0.5.16) and encoder_only_mask (fixed in 0.5.22) run their edits, each method once.
    assert ran.result["attribute_type"] is None
    assert ran.result["patched_in_class"] == wrapped_methods("pr28144", "pr31667", "encoder_only_mask")
    lines = ran.hotfix_lines(record=None)
    fixed = [line for line in lines if "upstream already has the fix" in line and "sglang 0.5.13" in line]
    patched = [line for line in lines if "INFO: patched" in line]
    # pr26521, pr25103 (fixed in 0.5.13), pr17732 (0.5.9) and pr19107 (0.5.10) say so once each;
    # xqa_workspace and xqa_draft_extend (nothing of theirs in 0.5.13) say nothing.
    assert len(fixed) == 4 and len(patched) == 3 and len(lines) == 7, lines
    assert "forward_decode and forward_extend" in patched[0] and "(PR #31667)" in patched[1]
    assert "forward_extend (sglang 0.5.13" in patched[2] and "causal=False for ENCODER_ONLY" in patched[2]


def test_status_and_the_import_hook_act_on_engine_decide_alone(monkeypatch):
    """`decide` is the one place a process's action is chosen: with it answering DISABLED for
    every record, status reports exactly that, and the import hook stands aside (in-process,
    on 0.5.12's own class compiled from its release file)."""
    import isolated_release
    import release_selection

    from sglang_hotfix_trtllm import engine, status
    from sglang_hotfix_trtllm.records import pr26521

    said = engine.Decision(engine.Action.DISABLED, "the test's decide says so")
    monkeypatch.setattr(engine, "decide", lambda hotfix, assessment, current, search_first=None: said)
    report, _, code = status.of_environment(pr26521.HOTFIX)
    assert (report["decision"], report["would_patch"], report["would_patch_reason"], code) == (
        "disabled",
        False,
        "the test's decide says so",
        status.EXIT_UNPROTECTED,
    )
    module = isolated_release.load_backend_module(release_selection.release_dir("0.5.12"))
    before = module.TRTLLMHAAttnBackend.__dict__[pr26521.METHOD_NAME]
    assert engine.handle(pr26521.HOTFIX, module) is engine.Action.DISABLED
    assert module.TRTLLMHAAttnBackend.__dict__[pr26521.METHOD_NAME] is before


def test_the_patched_line_names_every_method_a_record_changes():
    """xqa_workspace edits __init__ and forward_extend; its line named __init__ alone, so an operator
    who searched the log for forward_extend found no record that changed it."""
    from sglang_hotfix_trtllm.records import catalog

    for hotfix in catalog.HOTFIXES:
        changed = {edit.method for edit in hotfix.edits} | set(hotfix.method_names)
        head, _, rest = hotfix.targets_text.rpartition(".%s" % hotfix.method_name)
        named = [hotfix.method_name] + [m for m in rest.split(" and ") if m]
        assert head == "%s.%s" % (hotfix.module, hotfix.class_name), hotfix.targets_text
        assert sorted(named) == sorted(changed), hotfix.name
