"""Finding SGLang's backend source without importing SGLang: wheel installs
(the test environment) and editable installs from a source checkout, the way
SGLang's official images install it. The editable installs are real
`pip install -e` runs (setuptools' editable finder, and its path-entry mode)
of a checkout holding SGLang 0.5.12's own files."""

import json
import pathlib
import shutil
import subprocess
import sys

import pytest

from conftest import TARGET_RELATIVE, clean_env
from sglang_hotfix_trtllm import source

PYPROJECT = """\
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "sglang"
version = "0.5.12"

[tool.setuptools.packages.find]
include = ["sglang*"]
"""


def test_locate_finds_the_installed_wheel_without_importing(installed_backend_path):
    before = set(sys.modules)
    located = source.locate("sglang.srt.layers.attention.trtllm_mha_backend")
    assert located.path == str(installed_backend_path)
    assert not [m for m in set(sys.modules) - before if m.split(".")[0] in ("sglang", "torch")]
    assert source.distribution("sglang").install_kind == "wheel"


def test_locate_reports_a_missing_package():
    located = source.locate("no_such_package_here.sub.module")
    assert located.path is None and not located.package_found and "not installed" in located.reason


@pytest.fixture(scope="module")
def checkout(tmp_path_factory, installed_backend_path):
    """A source checkout's python/ folder with SGLang's own __init__ and backend files."""
    root = tmp_path_factory.mktemp("checkout") / "sglang" / "python"
    installed_package = installed_backend_path.parents[3]
    for relative in (pathlib.Path("__init__.py"), TARGET_RELATIVE):
        destination = root / "sglang" / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(installed_package / relative, destination)
    (root / "pyproject.toml").write_text(PYPROJECT)
    return root


@pytest.mark.parametrize("mode", ["lenient", "compat"])
def test_status_on_an_editable_sglang(tmp_path, checkout, plugin_wheel, mode):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps"]
    subprocess.run(
        pip + ["--config-settings", "editable_mode=" + mode, "-e", str(checkout)],
        check=True,
        timeout=300,
        env=clean_env(),
    )
    subprocess.run(pip + [str(plugin_wheel)], check=True, timeout=300, env=clean_env())
    ran = subprocess.run(
        [str(venv / "bin" / "sglang-hotfix-trtllm"), "status", "--json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=clean_env(),
        timeout=60,
    )
    report = json.loads(ran.stdout)
    assert report["sglang_install_kind"] == "editable"
    assert report["source_path"] == str(checkout / "sglang" / TARGET_RELATIVE)
    assert report["verdict"] == "affected" and report["sglang_version"] == "0.5.12"
