"""The wrapped method against upstream's own fix, on the real SGLang 0.5.12
module, with real tensors on CPU. The oracle is the installed method with
PR #26521's statement inserted (tests/support/upstream_fix.py)."""

from capture_harness import BRANCH_NAMES
from conftest import PATCHED, new_class_names, wrapped_methods


def test_import_patches_the_real_module(scenario):
    ran = scenario("import_only")
    assert ran.returncode == 0, ran
    result = ran.result
    assert result["attribute_type"] == PATCHED
    assert result["wrapped_type"] == "function" and not result["wrapped_is_wrapper"]
    assert result["wrapped_file"] == result["module_file"]
    # SGLang's module keeps its own loader: the hook leaves no trace on it.
    assert result["loader_type"] == result["spec_loader_type"] == "SourceFileLoader"
    lines = ran.hotfix_lines()
    assert len(lines) == 1, ran
    assert "INFO: patched" in lines[0] and "PR #26521" in lines[0] and "sglang 0.5.12" in lines[0]
    assert "fingerprint ast1:" in lines[0]


def test_plugin_under_test_is_the_installed_wheel(scenario):
    result = scenario("import_only").result
    for key in ("plugin_file", "autoload_file"):
        assert "site-packages" in result[key], result[key]


def test_patched_equals_upstream_fix_on_every_branch(scenario):
    ran = scenario("equivalence")
    assert ran.returncode == 0, ran
    result = ran.result
    # Every branch's capture wrote state, so equal snapshots say something.
    assert result["written"] == BRANCH_NAMES
    assert result["mismatches"] == []
    # The comparison can fail: the unpatched method differs from upstream's fix,
    # and only in the draft-decode branch (decode and idle modes).
    assert result["unpatched_differs"] == {"draft_decode": 30, "idle_draft_decode": 30}


def test_draft_decode_buffer_holds_the_lengths(scenario):
    result = scenario("draft_decode_values").result
    # seq_lens [5, 9, 17], speculative_step_id 2: lengths + 3
    assert result["cache_seqlens"] == [8, 12, 20]
    assert result["cu_seqlens_k"] == [0, 8, 20, 40]
    assert result["max_seq_len_k"] == 20
    assert result["buffer"] == [8, 12, 20, 0, 0, 0, 0, 0]


def test_the_replay_method_stays_sglangs_own_function_and_behaves_the_same(scenario):
    result = scenario("replay_untouched").result
    assert result["replay_type"] == "function" and not result["replay_has_wrapped"]
    assert result["replay_file"] == result["module_file"]
    assert result["mismatches"] == 0


def test_only_the_method_changes_and_remove_restores_it(scenario):
    from conftest import clean_env

    ran = scenario("identity_and_cycles", env=clean_env(SGLANG_HOTFIX_TRTLLM_DISABLE="1"))
    assert ran.returncode == 0, ran
    r = ran.result
    assert r["first"] is True and r["second"] is True
    assert r["first_type"] == PATCHED and r["wrapped_is_original"]
    assert r["same_wrapper_after_second_apply"], "applying twice must be a no-op"
    assert r["changed"] == wrapped_methods()  # the methods the records name, nothing else
    assert r["added"] == new_class_names()  # and upstream's new methods, for the edits that call them
    assert r["signature_after"] == r["signature_before"]
    assert r["bound_signature_after"] == r["signature_before"].replace("(self, ", "(", 1)
    assert r["restored"] == len(wrapped_methods()) and r["original_back"] and r["unchanged_after_remove"]
    assert r["final_is_original"] and r["patched_records"] == 0  # after 50 more apply/remove cycles
