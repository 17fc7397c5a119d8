"""`sglang-hotfix-trtllm status`: the operator's view, without importing SGLang."""

import json
import os
import shutil
import subprocess
import sys

import variants
from conftest import clean_env

CLI = shutil.which("sglang-hotfix-trtllm", path=os.path.dirname(sys.executable))


def status(*args, env=None):
    return subprocess.run(
        [CLI, "status"] + list(args), capture_output=True, text=True, env=env or clean_env(), timeout=60
    )


def test_status_reports_affected_and_protected():
    ran = status("--json")
    assert ran.returncode == 0, ran.stderr
    report = json.loads(ran.stdout)
    assert report["verdict"] == "affected"
    assert report["sglang_version"] == "0.5.12"
    assert report["would_patch"] is True
    assert report["startup_file"].endswith("sglang_hotfix_trtllm.pth")
    assert report["entry_point_installed"] is True


def test_status_exits_1_when_affected_but_disabled():
    ran = status("--json", env=clean_env(SGLANG_HOTFIX_TRTLLM_DISABLE="1"))
    assert ran.returncode == 1
    report = json.loads(ran.stdout)
    assert report["would_patch"] is False and "SGLANG_HOTFIX_TRTLLM_DISABLE" in report["would_patch_reason"]


def test_status_of_a_fixed_source(tmp_path, installed_backend_source):
    path = tmp_path / "trtllm_mha_backend.py"
    path.write_text(variants.fixed_source_text(installed_backend_source))
    ran = status("--source", str(path), "--json")
    assert ran.returncode == 0 and json.loads(ran.stdout)["verdict"] == "fixed"


def test_status_of_unreadable_source_exits_2_with_one_line(tmp_path):
    path = tmp_path / "trtllm_mha_backend.py"
    path.write_bytes(b"def broken(:\n")
    ran = status("--source", str(path))
    assert ran.returncode == 2
    lines = ran.stderr.strip().splitlines()  # one per record
    assert [line.split(": ")[1] for line in lines] == ["pr26521", "pr25103"] and all(
        "unknown" in line for line in lines
    )


def test_status_does_not_import_sglang_or_torch(tmp_path):
    # It does import wrapt, as the import hook will before wrapping: whether
    # wrapt imports is part of the answer (see test_status_predicts_faults.py).
    ran = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "sglang_hotfix_trtllm", "status"],
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=tmp_path,
        timeout=60,
    )
    assert ran.returncode == 0
    imported = [line.split("|")[-1].strip() for line in ran.stderr.splitlines() if line.startswith("import time:")]
    assert "sglang_hotfix_trtllm.status" in imported  # the check can see what it looks for
    heavy = [m for m in imported if m.split(".")[0] in ("torch", "sglang")]
    assert heavy == []


def test_python_m_status_matches_the_console_script(tmp_path):
    ran = subprocess.run(
        [sys.executable, "-m", "sglang_hotfix_trtllm", "status", "--json"],
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=tmp_path,
        timeout=60,
    )
    assert ran.returncode == 0 and json.loads(ran.stdout) == json.loads(status("--json").stdout)


def test_every_json_key_is_documented_in_the_reference():
    from conftest import REPO

    readme = (REPO / "docs" / "reference.md").read_text()
    keys = set(json.loads(status("--json").stdout))
    undocumented = sorted(k for k in keys if "`%s`" % k not in readme)
    assert undocumented == []


def test_status_exits_1_when_excluded_by_sglang_plugins():
    ran = status("--json", env=clean_env(SGLANG_PLUGINS="another_plugin"))
    assert ran.returncode == 1 and "SGLANG_PLUGINS" in json.loads(ran.stdout)["would_patch_reason"]


def test_status_exits_2_for_unknown_installed_code(tmp_path, installed_backend_source):
    # An SGLang whose backend is not recognised, first on PYTHONPATH.
    root = tmp_path / "sglang_copy"
    target = root / "sglang" / "srt" / "layers" / "attention"
    target.mkdir(parents=True)
    (root / "sglang" / "__init__.py").write_text("")
    (target / "trtllm_mha_backend.py").write_text(variants.with_renamed_key(installed_backend_source))
    ran = status("--json", env=clean_env(PYTHONPATH=str(root)))
    assert ran.returncode == 2 and json.loads(ran.stdout)["verdict"] == "unknown"
    assert len(ran.stderr.strip().splitlines()) == 1


def test_status_when_sglang_is_absent(tmp_path, bare_python, target_install):
    ran = subprocess.run(
        [bare_python, "-m", "sglang_hotfix_trtllm", "status", "--json"],
        capture_output=True,
        text=True,
        env=clean_env(PYTHONPATH=str(target_install)),
        cwd=tmp_path,
        timeout=60,
    )
    assert ran.returncode == 0
    report = json.loads(ran.stdout)
    assert report["verdict"] == "not-applicable" and report["sglang_version"] is None


def test_status_of_a_target_install_says_the_startup_file_is_inactive(tmp_path, target_install, venv_site_packages):
    # The interpreter is the test venv's, but the plugin imported is the --target copy.
    ran = subprocess.run(
        [sys.executable, "-s", "-m", "sglang_hotfix_trtllm", "status", "--json"],
        capture_output=True,
        text=True,
        env=clean_env(PYTHONPATH=str(target_install)),
        cwd=tmp_path,
        timeout=60,
    )
    report = json.loads(ran.stdout)
    assert report["plugin_location"] == str(target_install)
    assert report["startup_file_active"] is False
    # SGLang 0.5.12 has the plugin framework and the --target copy's entry point is visible.
    assert report["would_patch"] is True and "plugin loader" in report["would_patch_reason"]


def test_bad_arguments_exit_2():
    ran = subprocess.run([CLI, "frobnicate"], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 2 and "usage" in ran.stderr
