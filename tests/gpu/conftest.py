"""What the real-server tests share: the plugin installed as operators install it."""

import os
import subprocess
import sys

import pytest


@pytest.fixture(scope="module")
def installs(tmp_path_factory):
    """The plugin's wheel (SGLANG_E2E_PLUGIN_WHEEL) in a --target folder, for PYTHONPATH and `run`."""
    target = tmp_path_factory.mktemp("installs") / "target"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--target",
            str(target),
            os.environ["SGLANG_E2E_PLUGIN_WHEEL"],
        ],
        check=True,
        timeout=300,
    )
    return {"target": str(target)}
