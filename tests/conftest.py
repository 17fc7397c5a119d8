"""Shared helpers. The tests run in the environment the README sets up: the
plugin installed from its wheel, SGLang 0.5.12 installed with --no-deps.
Everything that imports SGLang runs in a fresh subprocess (tests/support/
scenarios.py), so the startup module, not the test process, loads the plugin."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
SUPPORT = HERE / "support"
REPO = HERE.parent
sys.path.insert(0, str(SUPPORT))
sys.path.insert(0, str(HERE.parent / "tools"))
# `python -m pytest` puts the working directory first on sys.path; the tests
# must exercise the installed wheel, never the source tree beside them.
sys.path[:] = [p for p in sys.path if pathlib.Path(p or os.getcwd()).resolve() != REPO]

# What a class attribute's type is called when the hotfix wrapped it, and when it did not.
PATCHED, UNPATCHED = "HotfixWrapper", "function"
OUR_VARIABLES = ("SGLANG_HOTFIX_TRTLLM_DISABLE", "SGLANG_HOTFIX_TRTLLM_STRICT", "SGLANG_PLUGINS")
TARGET_RELATIVE = pathlib.Path("srt", "layers", "attention", "trtllm_mha_backend.py")


def clean_env(**overrides):
    env = {k: v for k, v in os.environ.items() if k not in OUR_VARIABLES and k != "PYTHONPATH"}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(overrides)
    return env


class Ran:
    def __init__(self, completed):
        self.returncode = completed.returncode
        self.stdout = completed.stdout
        self.stderr = completed.stderr
        lines = [line for line in completed.stdout.splitlines() if line.startswith("RESULT:")]
        self.result = json.loads(lines[-1][len("RESULT:") :]) if lines else None

    def hotfix_lines(self, record="pr26521"):
        """The hotfix's lines on stderr, without those naming another record's
        target (most tests are about one record); ``record=None``: all of them."""
        from sglang_hotfix_trtllm.records import catalog

        others = [h.target for h in catalog.HOTFIXES if record is not None and h.name != record]
        return [
            line
            for line in self.stderr.splitlines()
            if "sglang-hotfix-trtllm" in line and not any(t in line for t in others)
        ]

    def __repr__(self):
        return "rc=%s\nstdout:\n%s\nstderr:\n%s" % (self.returncode, self.stdout[-3000:], self.stderr[-3000:])


def run_python(args, cwd, env=None, timeout=600):
    completed = subprocess.run(
        [sys.executable] + list(args),
        cwd=str(cwd),
        env=env or clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return Ran(completed)


@pytest.fixture
def scenario(tmp_path):
    """Run ``support/scenarios.py NAME ARGS`` in a fresh interpreter, outside the repo."""

    def run(name, *args, env=None):
        return run_python([str(SUPPORT / "scenarios.py"), name] + list(args), cwd=tmp_path, env=env)

    return run


@pytest.fixture(scope="session")
def installed_backend_path():
    spec = importlib.util.find_spec("sglang")
    assert spec is not None, "SGLang is not installed: run the README's set-up command"
    path = pathlib.Path(list(spec.submodule_search_locations)[0]) / TARGET_RELATIVE
    assert path.is_file(), path
    return path


@pytest.fixture(scope="session")
def installed_backend_source(installed_backend_path):
    return installed_backend_path.read_text(encoding="utf-8")


def shadow(tmp_path, name, body):
    """A folder to put first on PYTHONPATH, holding a module or package
    ``name`` whose code is ``body`` (a broken install, a missing dependency);
    returns the folder."""
    folder = tmp_path / "shadow"
    if name.endswith(".py"):
        folder.mkdir(exist_ok=True)
        (folder / name).write_text(body + "\n")
    else:
        (folder / name).mkdir(parents=True, exist_ok=True)
        (folder / name / "__init__.py").write_text(body + "\n")
    return str(folder)


@pytest.fixture
def overlay_dir(tmp_path):
    """Write a variant of the backend module into a folder that a scenario puts
    first on ``sglang.srt.layers.attention.__path__``."""

    def write(text):
        folder = tmp_path / "overlay"
        folder.mkdir(exist_ok=True)
        (folder / TARGET_RELATIVE.name).write_text(text, encoding="utf-8")
        return str(folder)

    return write


CACHE = pathlib.Path(os.environ.get("SGLANG_HOTFIX_TEST_CACHE", REPO / ".cache"))


@pytest.fixture(scope="session")
def sglang_release():
    """Install a published SGLang release (no dependencies) into a cached folder
    for use on PYTHONPATH; returns that folder."""

    def fetch(version):
        target = CACHE / ("sglang-" + version)
        marker = target / ".complete"
        if not marker.exists():
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "install",
                    "-q",
                    "--no-deps",
                    "--no-compile",
                    "--target",
                    str(target),
                    "--upgrade",
                    "sglang==" + version,
                ],
                check=True,
                timeout=600,
            )
            marker.write_text(version)
        return target

    return fetch


@pytest.fixture(scope="session")
def plugin_wheel(tmp_path_factory):
    """This repository built as a wheel, the way pip builds it for users."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(REPO)],
        check=True,
        timeout=300,
    )
    (path,) = out.glob("sglang_hotfix_trtllm-*.whl")
    return path


@pytest.fixture(scope="session")
def bare_python(tmp_path_factory):
    """A Python with empty site-packages: nothing of ours is read at its start."""
    folder = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    return str(folder / "bin" / "python")


@pytest.fixture(scope="session")
def venv_site_packages():
    import sysconfig

    return sysconfig.get_paths()["purelib"]


@pytest.fixture(scope="session")
def target_install(tmp_path_factory, plugin_wheel):
    """The plugin installed with `pip install --target DIR`, as on a shared volume."""
    folder = tmp_path_factory.mktemp("target") / "hotfix"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(folder), str(plugin_wheel)],
        check=True,
        timeout=300,
    )
    return folder
