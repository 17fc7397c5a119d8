"""The startup module: cheap, silent, armed once, never fatal."""

import sglang_hotfix_trtllm_autoload as autoload
from conftest import clean_env, run_python, shadow
from sglang_hotfix_trtllm import catalog, switches

HOOK = "sglang_hotfix_trtllm_autoload.find_spec"


def test_plain_process_loads_nothing_heavy_and_prints_nothing(scenario):
    ran = scenario("startup_only")
    assert ran.returncode == 0 and ran.stderr == "", ran
    assert ran.result["heavy_modules"] == []
    assert ran.result["autoload_loaded"]
    assert ran.result["meta_path"][0] == HOOK
    assert ran.result["meta_path"].count(HOOK) == 1


def test_disabled_process_arms_nothing(scenario):
    ran = scenario("startup_only", env=clean_env(SGLANG_HOTFIX_TRTLLM_DISABLE="1"))
    assert HOOK not in ran.result["meta_path"]


def test_watched_modules_match_the_catalog():
    assert autoload.WATCHED_MODULES == {h.module for h in catalog.HOTFIXES}


def test_switch_vocabulary_matches_the_engine():
    assert autoload.TRUE_VALUES == switches.TRUE_VALUES
    assert (autoload.DISABLE_VARIABLE, autoload.STRICT_VARIABLE) == (switches.DISABLE, switches.STRICT)


def test_broken_engine_reports_one_line_and_import_proceeds(tmp_path, scenario):
    folder = shadow(tmp_path, "sglang_hotfix_trtllm", "raise RuntimeError('simulated partial install')")
    ran = scenario("describe", env=clean_env(PYTHONPATH=folder))
    assert ran.returncode == 0, ran
    assert ran.result["attribute_type"] == "function"
    lines = ran.hotfix_lines()
    assert len(lines) == 1, ran
    assert "cannot load the hotfix" in lines[0] and "imported unpatched" in lines[0]


def test_missing_autoload_module_prints_one_line_and_python_starts(tmp_path):
    folder = shadow(tmp_path, "sglang_hotfix_trtllm_autoload.py", "raise ImportError('simulated broken install')")
    ran = run_python(["-c", "print('alive')"], cwd=tmp_path, env=clean_env(PYTHONPATH=folder))
    assert ran.returncode == 0 and ran.stdout.strip() == "alive"
    assert len(ran.stderr.strip().splitlines()) == 1, ran
    assert "startup module failed" in ran.stderr


def test_broken_engine_in_strict_mode_stops_the_import(tmp_path, scenario):
    folder = shadow(tmp_path, "sglang_hotfix_trtllm", "raise RuntimeError('simulated partial install')")
    ran = scenario("describe", env=clean_env(PYTHONPATH=folder, SGLANG_HOTFIX_TRTLLM_STRICT="1"))
    assert ran.returncode != 0 and ran.result is None
    assert "sglang-hotfix-trtllm (strict mode)" in ran.stderr
