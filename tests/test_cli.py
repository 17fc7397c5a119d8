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
    return subprocess.run([CLI, "status"] + list(args), capture_output=True, text=True, env=env or clean_env(), timeout=60)


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
    assert len(ran.stderr.strip().splitlines()) == 1 and "unknown" in ran.stderr


def test_status_does_not_import_sglang_or_torch(tmp_path):
    code = ("import sys; from sglang_hotfix_trtllm import cli; cli.main(['status', '--json']);"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'sglang', 'wrapt')))")
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(), cwd=tmp_path, timeout=60)
    assert ran.stdout.strip().splitlines()[-1] == "[]"


def test_bad_arguments_exit_2():
    ran = subprocess.run([CLI, "frobnicate"], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 2 and "usage" in ran.stderr
