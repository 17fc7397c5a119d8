"""Shared helpers. The tests run in the environment the README sets up: the
plugin installed from its wheel, SGLang 0.5.12 installed with --no-deps.
Everything that imports SGLang runs in a fresh subprocess (tests/support/
scenarios.py), so the startup module, not the test process, loads the plugin."""

import contextlib
import fcntl
import functools
import importlib.util
import json
import os
import pathlib
import py_compile
import shutil
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

import fork_client  # noqa: E402 (support/, on the path above)

# What a class attribute's type is called when the hotfix wrapped it, and when it did not.
PATCHED, UNPATCHED = "HotfixWrapper", "function"
OUR_VARIABLES = ("SGLANG_HOTFIX_TRTLLM_DISABLE", "SGLANG_HOTFIX_TRTLLM_STRICT", "SGLANG_PLUGINS")
TARGET_RELATIVE = pathlib.Path("srt", "layers", "attention", "trtllm_mha_backend.py")


def record_names():
    """The records the installed package carries, in the catalog's order (status and the log follow it)."""
    from sglang_hotfix_trtllm.records import catalog

    return [hotfix.name for hotfix in catalog.HOTFIXES]


def applied_record_names():
    """The records with a bug in the installed SGLang (``affected``, from its source, as a process
    here decides): the ones a process here patches and logs, in the catalog's order. Records fixed
    there (pr17732, pr19107 on 0.5.12) have a status block but no patch."""
    from sglang_hotfix_trtllm import detect
    from sglang_hotfix_trtllm.record import Verdict
    from sglang_hotfix_trtllm.records import catalog

    with detect.shared_parses():
        return [h.name for h in catalog.HOTFIXES if detect.assess_installed(h).verdict is Verdict.AFFECTED]


def wrapped_methods(*records, leaving_out=()):
    """The methods of the backend class the named records wrap (every applied record's when none
    is named: ``applied_record_names``), sorted, each once (records of one site share a method:
    ``forward_decode``); ``leaving_out``: records whose methods are not counted."""
    from sglang_hotfix_trtllm.records import catalog

    named = records or applied_record_names()
    chosen = [h for h in catalog.HOTFIXES if h.name in named and h.name not in leaving_out]
    return sorted({name for hotfix in chosen for name in hotfix.method_names})


def new_class_names(*records):
    """The class methods upstream's changes add (``Hotfix.new_names`` of class scope) for the named
    records (every applied record's when none is named), sorted."""
    from sglang_hotfix_trtllm.records import catalog

    named = records or applied_record_names()
    chosen = [h for h in catalog.HOTFIXES if h.name in named]
    return sorted({new.name for hotfix in chosen for new in hotfix.new_names if new.scope == "class"})


# Variables that importing SGLang or using torch in a test process puts in its environment: a test
# interpreter gets them only where the run started with them, so what it sees does not depend on which
# test ran before it in the same worker (a fresh interpreter importing SGLang sets them itself).
SET_BY_IMPORTS = (
    "DG_JIT_CACHE_DIR",
    "DG_JIT_USE_NVRTC",
    "TLLM_LOG_LEVEL",
    "TORCHINDUCTOR_CACHE_DIR",
    "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR",
)
AT_START = dict(os.environ)


def clean_env(**overrides):
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in OUR_VARIABLES and k != "PYTHONPATH" and (k not in SET_BY_IMPORTS or k in AT_START)
    }
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

    @property
    def report(self):
        """stdout read as JSON (``status --json``)."""
        return json.loads(self.stdout)

    def flat(self, name="pr26521"):
        """The top level (the answer, the environment) with one record's keys beside it: what a
        test of one record reads (format 1 held the first record's keys at the top level)."""
        return dict(self.report, **self.record(name))

    def record(self, name="pr26521"):
        """One record's report of ``status --json`` (format 2: under "hotfixes")."""
        return next(r for r in self.report["hotfixes"] if r["hotfix"] == name)

    def __repr__(self):
        return "rc=%s\nstdout:\n%s\nstderr:\n%s" % (self.returncode, self.stdout[-3000:], self.stderr[-3000:])


def run_python(args, cwd=None, env=None, timeout=600, python=None):
    """``python ARGS`` (this interpreter unless another is named) in ``cwd``, with a clean environment
    by default: forked from this worker's fork server where that starts it as a fresh interpreter
    would (``support/fork_client.py``), else started fresh."""
    env = env or clean_env()
    cwd = None if cwd is None else str(cwd)
    completed = fork_client.SERVER_OF_THIS_PROCESS.run(list(args), cwd, env, timeout, python=python)
    if completed is None:
        completed = subprocess.run(
            [python or sys.executable] + list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
        )
    return Ran(completed)


SCENARIO_SCRIPTS = {"scenario": SUPPORT / "scenarios.py", "fault": SUPPORT / "fault_scenarios.py"}


def run_scenario(script, name, *args, cwd, env=None, python=None, flags=()):
    """The one runner of scenario scripts: ``support/scenarios.py`` (``script="scenario"``) or
    ``support/fault_scenarios.py`` (``"fault"``), ``NAME ARGS``, in a fresh interpreter started in
    ``cwd`` (outside the repo, so the installed wheel is what runs); ``flags`` go before the script."""
    return run_python(list(flags) + [str(SCENARIO_SCRIPTS[script]), name] + list(args), cwd=cwd, env=env, python=python)


@pytest.fixture
def scenario(tmp_path):
    """``scenario(NAME, *ARGS, env=...)``: a ``support/scenarios.py`` scenario in a fresh interpreter."""
    return functools.partial(run_scenario, "scenario", cwd=tmp_path)


@pytest.fixture
def fault(tmp_path):
    """``fault(NAME, *ARGS, env=...)``: a ``support/fault_scenarios.py`` scenario in a fresh interpreter."""
    return functools.partial(run_scenario, "fault", cwd=tmp_path)


CLI = shutil.which("sglang-hotfix-trtllm", path=os.path.dirname(sys.executable))


def run_cli(*args, env=None, cwd=None, python=None, timeout=120):
    """The one way tests run the CLI: the installed console script, or ``PYTHON -m
    sglang_hotfix_trtllm`` when ``python`` names an interpreter. A fresh interpreter, but for
    ``verify``, which imports SGLang's backend: forked where ``run_python`` would fork."""
    env = env or clean_env()
    command = [python, "-m", "sglang_hotfix_trtllm"] if python else [CLI]
    completed = None
    if not python and args[:1] == ("verify",):
        completed = fork_client.SERVER_OF_THIS_PROCESS.run(command + list(args), cwd, env, timeout, console_script=True)
    if completed is None:
        completed = subprocess.run(
            command + list(args), capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout
        )
    return Ran(completed)


def status_json(*args, **kwargs):
    """``status --json ARGS``; the Ran's ``report`` is the parsed output."""
    return run_cli("status", "--json", *args, **kwargs)


def sglang_tree(root, backend_text, *, version=None, init_text="", link_installed=None, sourceless=False):
    """The one builder of an SGLang install for tests: ``root/sglang`` with the backend module
    holding ``backend_text`` (compiled to a sourceless ``.pyc`` when ``sourceless``). The rest is
    an empty ``sglang/__init__.py`` (or ``init_text``), or, with ``link_installed`` (the installed
    ``sglang`` folder), a tree of links to that install; ``version`` adds a dist-info with that
    version. Returns ``root``, the folder to put on PYTHONPATH."""
    backend = root / "sglang" / TARGET_RELATIVE
    if link_installed is not None:
        root.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cp", "-rs", str(link_installed), str(root / "sglang")], check=True, timeout=120)
        backend.unlink()
    else:
        backend.parent.mkdir(parents=True, exist_ok=True)
        (root / "sglang" / "__init__.py").write_text(init_text, encoding="utf-8")
    if sourceless:
        staging = root.parent / (root.name + "_staging.py")
        staging.write_text(backend_text, encoding="utf-8")
        py_compile.compile(str(staging), cfile=str(backend.with_suffix(".pyc")), doraise=True)
    else:
        backend.write_text(backend_text, encoding="utf-8")
    if version is not None:
        dist = root / ("sglang-%s.dist-info" % version.replace("-", "_"))
        dist.mkdir()
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: %s\n" % version)
    return root


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


@contextlib.contextmanager
def exclusive(name):
    """Held by one test process at a time (the README's command runs two, pytest-xdist's
    ``-n 2``): for what they share on disk, the download cache and the repository's build folder."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / (name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def build_wheel(source, out):
    """``source`` (a checkout) built as a wheel into ``out``, the way pip builds it for users; returns the wheel."""
    import plugin_wheel  # tools/, on the path above

    return plugin_wheel.build(source, out)


@pytest.fixture(scope="session")
def plugin_wheel(tmp_path_factory):
    """This repository built as a wheel."""
    out = tmp_path_factory.mktemp("wheel")
    with exclusive("repository-build"):  # setuptools builds in the repository's build/ folder
        return build_wheel(REPO, out)


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


def pytest_collection_modifyitems(config, items):
    """The long tests first, shared between the workers by length (``support/collection_order.py``): the
    README's command runs two work-stealing workers, and a minute-long test started last on one of
    them kept the run waiting on one core."""
    workers = getattr(config, "workerinput", {}).get("workercount") or getattr(config.option, "numprocesses", 0)
    if isinstance(workers, int) and workers > 1:
        import collection_order

        items[:] = collection_order.ordered(items, workers)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session):
    """On a run's controlling process (pytest-xdist's, or the only one), every release the tests
    read is fetched first, six at a time (``support/prefetch.py``: on a clean clone this was minutes
    of two processes downloading one wheel at a time). Nothing to do once the cache holds them."""
    if hasattr(session.config, "workerinput") or os.environ.get("SGLANG_HOTFIX_PREFETCH") == "0":
        return
    # The GPU tests (run alone on a machine without network) read no release from the cache.
    if session.config.args and all("tests/gpu" in str(arg) for arg in session.config.args):
        return
    try:
        import prefetch

        prefetch.fetch_all()
    except Exception as error:  # the tests that need a release then fetch it themselves, or fail saying why
        print("prefetch of the releases failed: %s: %s" % (type(error).__name__, error), file=sys.stderr)
