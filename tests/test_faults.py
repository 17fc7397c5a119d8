"""The fault matrix: whatever goes wrong, the host keeps running (unless strict
mode asked otherwise), SGLang's own behaviour is unchanged where the plugin
stands aside, and the log says what happened. Case names say the fault."""

import py_compile

import pytest

import variants
from capture_harness import BRANCH_NAMES
from conftest import (
    PATCHED,
    SUPPORT,
    UNPATCHED,
    clean_env,
    run_python,
    run_scenario,
    sglang_tree,
    shadow,
    status_json,
    wrapped_methods,
)
from sglang_hotfix_trtllm import switches

DISABLED = {"SGLANG_HOTFIX_TRTLLM_DISABLE": "1"}


def warnings_of(ran):
    return [line for line in ran.hotfix_lines() if "WARNING" in line]


# --- missing or broken dependencies -----------------------------------------


@pytest.mark.parametrize(
    "stub",
    ["raise ImportError('simulated: wrapt is not installed')", "raise RuntimeError('simulated: wrapt is broken')"],
    ids=["missing", "failing"],
)
def test_wrapt_missing_or_failing_leaves_sglang_unpatched_and_running(scenario, tmp_path, stub):
    ran = scenario("describe", env=clean_env(PYTHONPATH=shadow(tmp_path, "wrapt", stub)))
    assert ran.returncode == 0, ran
    assert ran.result["attribute_type"] == UNPATCHED
    (line,) = warnings_of(ran)
    assert "could not patch" in line and "simulated" in line and "SGLang runs without this record's fix" in line


def test_wrapt_missing_in_strict_mode_stops_the_import(scenario, tmp_path):
    folder = shadow(tmp_path, "wrapt", "raise ImportError('simulated: wrapt is not installed')")
    ran = scenario("describe", env=clean_env(PYTHONPATH=folder, SGLANG_HOTFIX_TRTLLM_STRICT="1"))
    assert ran.returncode != 0 and "strict mode" in ran.stderr and "could not patch" in ran.stderr


def test_sglang_missing_apply_and_status_are_quiet(tmp_path, bare_python, target_install):
    code = (
        "import sglang_hotfix_trtllm as h;"
        " print('RESULT:' + __import__('json').dumps({'armed': h.apply(), 'removed': h.remove()}))"
    )
    ran = run_python(["-c", code], cwd=tmp_path, env=clean_env(PYTHONPATH=str(target_install)), python=bare_python)
    assert ran.returncode == 0 and ran.result == {"armed": True, "removed": 0} and ran.stderr == ""


# --- the backend source -------------------------------------------------------


def test_sourceless_backend_is_refused(scenario, tmp_path, installed_backend_source):
    folder = tmp_path / "overlay"
    folder.mkdir()
    source = tmp_path / "trtllm_mha_backend.py"
    source.write_text(installed_backend_source)
    py_compile.compile(str(source), cfile=str(folder / "trtllm_mha_backend.pyc"), doraise=True)
    ran = scenario("overlay", str(folder))
    assert ran.returncode == 0, ran
    assert ran.result["attribute_type"] == UNPATCHED
    (line,) = warnings_of(ran)
    assert "not loaded from a .py source" in line


def test_source_removed_after_import_is_refused(fault, overlay_dir, installed_backend_source):
    folder = overlay_dir(installed_backend_source)
    ran = fault("source_removed_after_import", folder, env=clean_env(**DISABLED))
    assert ran.returncode == 0, ran
    assert ran.result["attribute_type"] == UNPATCHED
    (line,) = warnings_of(ran)
    assert "code not recognised" in line and "cannot read" in line


def test_backend_without_the_method_is_refused(scenario, overlay_dir, installed_backend_source):
    import ast

    tree = ast.parse(installed_backend_source)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TRTLLMHAAttnBackend")
    cls.body = [n for n in cls.body if getattr(n, "name", None) != "init_forward_metadata_capture_cuda_graph"]
    ran = scenario("overlay", overlay_dir(ast.unparse(tree)))
    assert ran.returncode == 0, ran
    # the other records' methods are wrapped; pr26521's is not there
    assert ran.result["attribute_type"] is None
    assert sorted(ran.result["patched_in_class"]) == wrapped_methods(leaving_out=("pr26521",))
    (line,) = warnings_of(ran)
    assert "not found" in line


def test_method_replaced_by_someone_else_is_left_alone(fault):
    ran = fault("replaced_by_someone_else", env=clean_env(**DISABLED))
    assert ran.returncode == 0, ran
    assert ran.result["still_theirs"] is True
    (line,) = warnings_of(ran)
    assert "replaced by someone else" in line and "their_version" in line


# --- versions and metadata ---------------------------------------------------


@pytest.mark.parametrize(
    "version", ["0.5.12.dev0", "0.5.12+cu128", "0.5.12.post1", "0.5.13.dev12+g1a2b3c4", "not-a-version", None]
)
def test_odd_or_missing_versions_do_not_change_the_verdict(tmp_path, installed_backend_source, version):
    root = sglang_tree(tmp_path / "site", installed_backend_source, version=version)
    ran = status_json(cwd=tmp_path, env=clean_env(PYTHONPATH=str(root)))
    report = ran.flat()
    assert ran.returncode == 0 and report["verdict"] == "affected"
    assert report["sglang_version"] == version


def test_source_fixed_on_main_with_an_old_version_string_is_fixed(tmp_path, installed_backend_source):
    fixed = variants.fixed_source_text(installed_backend_source)
    root = sglang_tree(tmp_path / "site", fixed, version="0.5.12.dev300+g9f8e7d6")
    ran = status_json(cwd=tmp_path, env=clean_env(PYTHONPATH=str(root)))
    assert ran.flat()["verdict"] == "fixed" and ran.returncode == 0


# --- environment values -------------------------------------------------------

GARBAGE = ["", " ", "2", "-1", "yes please", "TRUE ", "\u00fc\u00df", "1" * 10000, "0x1", "None", "on;rm -rf /"]


# The values README's Switches table documents, and whether each is understood.
UNDERSTOOD = {
    "": True,
    " ": True,
    "2": False,
    "-1": False,
    "yes please": False,
    "TRUE ": True,
    "\u00fc\u00df": False,
    "1" * 10000: False,
    "0x1": False,
    "None": False,
    "on;rm -rf /": False,
}


@pytest.mark.parametrize("value", GARBAGE, ids=lambda v: repr(v)[:20])
@pytest.mark.parametrize("variable", [switches.DISABLE, switches.STRICT])
def test_garbage_in_flags_never_raises_and_is_named(variable, value):
    read = switches.read({variable: value})
    understood = UNDERSTOOD[value]
    assert (read.problems == ()) == understood
    if not understood:
        assert variable in read.problems[0] and "accepted values" in read.problems[0]
        # Fails safe: a kill switch that is set but not understood turns everything off; strict stays off.
        assert getattr(read, "disabled" if variable == switches.DISABLE else "strict") is (variable == switches.DISABLE)


@pytest.mark.parametrize("value", [",", " , ,", "\n", "sglang_hotfix_trtllm ,", "x" * 10000, "os:system"])
def test_garbage_in_sglang_plugins_is_read_as_sglangs_own_loader_reads_it(value, monkeypatch):
    """SGLang's real loader (0.5.12's load_plugins_by_group) decides whether it loads this
    plugin's entry point under the value; the hotfix stands aside exactly when it would not."""
    plugins = pytest.importorskip("sglang.srt.plugins")
    monkeypatch.setenv(switches.SGLANG_PLUGINS, value)
    loaded = plugins.load_plugins_by_group(plugins.GENERAL_PLUGINS_GROUP)
    read = switches.read({switches.SGLANG_PLUGINS: value})
    assert read.excluded_by_sglang_plugins == (switches.PLUGIN_NAME not in loaded)


def test_every_variable_garbage_at_once_turns_the_hotfix_off_safely(scenario):
    ran = scenario(
        "describe",
        env=clean_env(
            SGLANG_HOTFIX_TRTLLM_DISABLE="\u00fc",
            SGLANG_HOTFIX_TRTLLM_STRICT="2",
            SGLANG_PLUGINS="sglang_hotfix_trtllm,,,\t",
        ),
    )
    assert ran.returncode == 0, ran
    assert ran.result["attribute_type"] == UNPATCHED
    assert len(warnings_of(ran)) == 2


# --- import order, re-import, threads ----------------------------------------


def test_module_imported_before_the_hook_is_patched_at_once(fault):
    ran = fault("imported_before_hook", env=clean_env(**DISABLED))
    assert ran.result == {"before": UNPATCHED, "after": PATCHED}


def test_module_deleted_and_imported_again_is_patched_again(fault):
    ran = fault("reimported")
    r = ran.result
    assert r["distinct"] and r["first"]["attribute_type"] == PATCHED and r["second"]["attribute_type"] == PATCHED
    assert r["patched_records"] == 2 and r["first_still"] == PATCHED


def test_concurrent_imports_wrap_exactly_once(fault):
    ran = fault("concurrent_imports", "16")
    assert ran.returncode == 0, ran
    assert ran.result["errors"] == [] and ran.result["patched_records"] == 1
    assert ran.result["attribute_type"] == PATCHED and not ran.result["wrapped_is_wrapper"]
    assert sum("INFO: patched" in line for line in ran.hotfix_lines()) == 1


# --- processes ----------------------------------------------------------------


def test_fork_child_keeps_the_one_wrapper(fault):
    ran = fault("fork_child")
    assert ran.returncode == 0, ran
    assert ran.result["child"]["attribute_type"] == PATCHED and not ran.result["child"]["wrapped_is_wrapper"]
    assert ran.result["child"]["records"] == 1


def test_python_dash_S_is_protected_by_an_explicit_apply(tmp_path, venv_site_packages):
    # `python -S` reads no .pth (README, Limits): there, `apply()` is the documented remedy.
    code = (
        "import sys; sys.path[1:1] = [%r, %r]; import sglang_hotfix_trtllm as h; h.apply();"
        " import scenarios; scenarios.describe()"
    ) % (str(SUPPORT), venv_site_packages)
    ran = run_python(["-S", "-c", code], cwd=tmp_path)
    assert ran.returncode == 0, ran
    assert ran.result["attribute_type"] == PATCHED


def test_python_dash_I_is_still_patched(tmp_path):
    ran = run_scenario("scenario", "describe", cwd=tmp_path, flags=["-I"])
    assert ran.returncode == 0, ran
    assert ran.result["attribute_type"] == PATCHED


# --- SGLang's HookRegistry -----------------------------------------------------


@pytest.mark.parametrize("order", ["registry-first", "hotfix-first"])
def test_sglang_hook_registry_below_makes_the_hotfix_stand_aside_above_keeps_it_exact(fault, order):
    ran = fault("hook_registry", order, env=clean_env(**DISABLED))
    assert ran.returncode == 0, ran
    r = ran.result
    assert r["written"] == BRANCH_NAMES and r["hook_calls"] > 0
    assert r["top_type"] == "function" and r["top_file"].endswith("hook_registry.py")
    if order == "registry-first":
        # SGLang's wrapper is already there: the hotfix stands aside with one warning, and says so.
        assert r["patched"] is False and r["restored"] == len(wrapped_methods(leaving_out=("pr26521",)))
        assert len(r["mismatches"]) == 120  # both ways of calling, on every draft-decode capture
        (warning,) = warnings_of(ran)
        assert (
            "stands aside" in warning
            and "hook_registry.py" in warning
            and "SGLang runs without this record's fix" in warning
        )
    else:
        # SGLang's wrapper sits on top of ours: the repair is exact; remove() turns ours off in place.
        assert r["mismatches"] == [] and r["patched"] is True
        assert r["unpatched_differs"] == {"draft_decode": 30, "idle_draft_decode": 30}
        assert r["restored"] == len(wrapped_methods()) and r["patched_after_remove"] is False
        assert r["after_remove_top_is_same"]
        assert any("turned off in place" in line for line in warnings_of(ran))


def test_many_apply_remove_cycles_do_not_grow(fault):
    # Cycles under tracemalloc (each apply() compiles the records' edits of the backend's file),
    # the growth of the second of two traced windows of 40, after 40 untraced warm-up cycles.
    # Until 0.16.3 windows grew 50 to 70 bytes a cycle and the bound was 128 bytes a cycle, over
    # 350 cycles (55 s). That growth was CPython's type attribute cache (4096 entries, bounded)
    # keeping the fresh name strings of attribute lookups: emptied before each measurement, a
    # window of 100 run alone grew 0 bytes, and this test's window 32 bytes. So the bound is 512
    # bytes a window: a leak of even the smallest object (16 bytes) a cycle shows, in a third of
    # the cycles.
    cycles = 80
    ran = fault("cycles_memory", str(cycles))
    assert ran.returncode == 0, ran
    r = ran.result
    assert r["meta_path_growth"] == 0 and r["records"] == 1 and r["wrapped_is_original"] and r["single_layer"]
    assert r["growth_bytes"] < 512, r


# --- security -----------------------------------------------------------------


def test_startup_reads_only_its_documented_variable_writes_nothing_opens_no_socket(tmp_path):
    ran = run_scenario(
        "fault",
        "audited_startup",
        cwd=tmp_path,
        flags=["-S"],
        env=clean_env(SGLANG_PLUGINS="os:system", SGLANG_HOTFIX_TRTLLM_STRICT="__import__('os').system('x')"),
    )
    assert ran.returncode == 0, ran
    r = ran.result
    assert r["armed"] is True
    assert r["writes"] == [] and r["other_events"] == []
    # Of the environment, start-up reads nothing: the .pth finder reads the
    # disable switch only when a watched module is looked up.
    assert r["env_keys"] == []
    assert any(path.endswith("sglang_hotfix_trtllm.pth") for path in r["opened"])
