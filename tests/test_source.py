"""Finding SGLang's backend source without importing SGLang: wheel installs
(the test environment) and editable installs from a source checkout, the way
SGLang's official images install it. The editable installs are real
`pip install -e` runs (setuptools' editable finder, and its path-entry mode)
of a checkout holding SGLang 0.5.12's own files."""

import subprocess
import sys

import pytest

from conftest import TARGET_RELATIVE, clean_env, sglang_tree, status_json
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
    init_text = (installed_backend_path.parents[3] / "__init__.py").read_text(encoding="utf-8")
    sglang_tree(root, installed_backend_path.read_text(encoding="utf-8"), init_text=init_text)
    (root / "pyproject.toml").write_text(PYPROJECT)
    return root


@pytest.mark.parametrize("mode", ["lenient", "compat"])
def test_status_finds_the_backend_of_an_editable_sglang_in_its_checkout(tmp_path, checkout, plugin_wheel, mode):
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
    report = status_json(python=str(venv / "bin" / "python"), cwd=tmp_path).flat()
    assert report["sglang_install_kind"] == "editable"
    assert report["source_path"] == str(checkout / "sglang" / TARGET_RELATIVE)
    assert report["verdict"] == "affected" and report["sglang_version"] == "0.5.12"


@pytest.mark.parametrize(
    "headers",
    [
        "Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.12\n",
        "Metadata-Version: 2.1\nName: sglang\nSummary: a long\n  folded summary: Version: 9\nVersion:  0.5.12.post1 \n",
        "Metadata-Version: 2.1\nName: sglang\n\nVersion: 1.0 in the description, not a header\n",
        "Metadata-Version: 2.1\nName: sglang\nversion: 0.5.13.dev12+g1a2b3c4\n",
        "Metadata-Version: 2.1\nName: sglang\nVersion: 0.5\n .12\n",
        "Metadata-Version: 2.1\nName: sglang\nVersion:\t0.5.12\t\n",
    ],
    ids=["plain", "folded-header-before", "in-the-body", "lower-case-key", "folded-version", "tabs"],
)
def test_the_version_read_from_the_headers_is_importlib_metadatas(tmp_path, headers):
    """source.distribution reads only the header lines (the whole file went through the email
    parser four times per import); what it reads must be what importlib.metadata reads."""
    from importlib import metadata

    dist_info = tmp_path / "sglang-0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(headers + "\n" + "Long description.\n" * 1000)
    (dist, *_) = metadata.distributions(path=[str(tmp_path)])
    assert source._version(dist) == dist.version
