"""SGLang's own plugin path, and processes SGLang spawns."""

from conftest import PATCHED, wrapped_methods


def test_sglang_load_plugins_arms_the_hook_without_importing_the_backend(scenario):
    ran = scenario("sglang_plugin_loader")
    assert ran.returncode == 0, ran
    r = ran.result
    assert r["hook_armed"] and not r["loaded_backend_early"]
    assert r["attribute_type"] == PATCHED and not r["wrapped_is_wrapper"]
    # Startup module and entry point both ran again: still exactly one wrapper.
    assert r["after_both"]["attribute_type"] == PATCHED and not r["after_both"]["wrapped_is_wrapper"]
    assert r["after_both"]["patched_in_class"] == wrapped_methods()
    assert sum("INFO: patched" in line for line in ran.hotfix_lines()) == 1


def test_a_child_started_with_the_spawn_method_is_patched(scenario):
    ran = scenario("spawn_child")
    assert ran.returncode == 0, ran
    r = ran.result
    assert r["exitcode"] == 0 and not r["parent_imported_sglang"]
    assert r["child"]["attribute_type"] == PATCHED
