"""The fork server that starts the test interpreters importing SGLang (``support/fork_server.py``):
a child it forks starts as a fresh interpreter would, as far as the plugin and SGLang can see, and
what it cannot start that way starts fresh (``support/fork_client.py``)."""

import json
import os
import re
import subprocess
import sys

import fork_client
import pytest

from conftest import clean_env

PROBE = """
import atexit, json, os, sys, threading
import importlib

WATCHED = ("sglang", "wrapt", "_distutils", "setuptools", "site")
state = {
    "argv": sys.argv,
    "path": sys.path,
    "prefix": [sys.prefix, sys.exec_prefix, sys.base_prefix],
    "meta_path": [getattr(f, "__name__", type(f).__name__) for f in sys.meta_path],
    "path_hooks": len(sys.path_hooks),
    "flags": [getattr(sys.flags, f) for f in ("isolated", "ignore_environment", "no_user_site", "dont_write_bytecode")],
    "before_sglang": sorted(m for m in sys.modules if m.startswith(WATCHED)),
    "environment": {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"},
    "cwd": os.getcwd(),
    "main": [__name__, __file__ if "__file__" in globals() else None, sys.modules["__main__"].__dict__ is globals()],
    "stdout": [sys.stdout.isatty(), sys.stdout.line_buffering, sys.stdout.encoding],
}
module = importlib.import_module("sglang.srt.layers.attention.trtllm_mha_backend")
cls = module.TRTLLMHAAttnBackend
state["capture"] = type(cls.__dict__["init_forward_metadata_capture_cuda_graph"]).__name__
state["ours"] = sorted(m for m in sys.modules if m.startswith(("sglang_hotfix", "wrapt")))
print("RESULT:" + json.dumps(state), flush=True)
threading.Thread(target=lambda: (__import__("time").sleep(0.5), print("thread done", flush=True))).start()
atexit.register(lambda: print("atexit ran", flush=True))
raise SystemExit(int(sys.argv[-1]))
"""


def _hotfix_lines(stderr):
    """The plugin's lines, without their time and pid."""
    return [line.split("]", 1)[1] for line in stderr.splitlines() if "sglang-hotfix-trtllm" in line]


def _state(stdout):
    return json.loads(next(line for line in stdout.splitlines() if line.startswith("RESULT:"))[len("RESULT:") :])


@pytest.fixture(scope="session")  # one a test process: the work-stealing scheduler splits this file
def server():
    made = fork_client.ForkServer()
    yield made
    made._stop(None)


@pytest.mark.parametrize("how", ["script", "-c"])
def test_a_forked_interpreter_starts_as_a_fresh_one(how, server, tmp_path):
    extra = tmp_path / "extra"
    extra.mkdir()
    script = tmp_path / "probe.py"
    script.write_text(PROBE, encoding="utf-8")
    args = [str(script), "x", "3"] if how == "script" else ["-c", PROBE, "x", "3"]
    env = clean_env(PYTHONPATH=str(extra), SGLANG_HOTFIX_TRTLLM_DISABLE="pr25103")
    forked = server.run(args, str(tmp_path), env, 300)
    assert forked is not None, server.broken
    fresh = subprocess.run([sys.executable] + args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert fresh.returncode == forked.returncode == 3, (fresh, forked)
    assert _state(forked.stdout) == _state(fresh.stdout)
    assert _state(fresh.stdout)["capture"] == "HotfixWrapper"  # the plugin ran: the comparison means something
    assert fresh.stdout.splitlines()[1:] == forked.stdout.splitlines()[1:] == ["thread done", "atexit ran"]
    assert _hotfix_lines(forked.stderr) == _hotfix_lines(fresh.stderr) and _hotfix_lines(fresh.stderr)


def test_an_uncaught_exception_is_printed_and_exits_1(server, tmp_path):
    args = ["-c", "import sys; print('before', flush=True); raise ValueError('boom')"]
    forked = server.run(args, str(tmp_path), clean_env(), 60)
    fresh = subprocess.run([sys.executable] + args, cwd=tmp_path, env=clean_env(), capture_output=True, text=True)
    assert forked.returncode == fresh.returncode == 1
    assert forked.stdout == fresh.stdout == "before\n"
    assert forked.stderr.splitlines()[-1] == fresh.stderr.splitlines()[-1] == "ValueError: boom"


def test_what_a_fork_cannot_start_as_a_fresh_interpreter_starts_fresh(server, tmp_path):
    env = clean_env()
    server.run(["-c", "pass"], str(tmp_path), env, 60)  # started, with its preloaded names
    assert "torch" in server.preloaded and "sglang" not in server.preloaded and "wrapt" not in server.preloaded
    assert server._why_not(["-S", "x.py"], env, None)
    assert server._why_not(["x.py"], env, "/usr/bin/python3")
    assert server._why_not([fork_client.SERVER.with_name("scenarios.py").as_posix(), "spawn_child"], env, None)
    assert server._why_not(["x.py"], dict(env, OMP_NUM_THREADS="1"), None)
    assert server._why_not(["x.py"], dict(env, SGLANG_HOTFIX_TRTLLM_DISABLE="1"), None) is None
    shadow = tmp_path / "shadow"
    (shadow / "torch").mkdir(parents=True)
    assert server.run(["-c", "pass"], str(tmp_path), clean_env(PYTHONPATH=str(shadow)), 60) is None
    (tmp_path / "numpy.py").write_text("")
    assert server.run(["-c", "pass"], str(tmp_path), env, 60) is None  # the current folder is -c's first path
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert server.run(["-c", "pass"], str(elsewhere), env, 60).returncode == 0
    zipped = tmp_path / "code.zip"
    zipped.write_bytes(b"")
    assert server.run(["-c", "pass"], str(elsewhere), clean_env(PYTHONPATH=str(zipped)), 60) is None


def test_every_request_starts_fresh_when_asked(server, tmp_path, monkeypatch):
    monkeypatch.setenv(fork_client.ALL_FRESH, "1")
    assert server.run(["-c", "pass"], str(tmp_path), clean_env(), 60) is None


# Programs whose every observable outcome must be a fresh interpreter's (the review of the fork
# server demonstrated each of these differing, before its child exited as an interpreter does).
PROGRAMS = {
    "a finalizer that ends the process": (
        "import os\nclass A:\n    def __del__(self):\n        print('finalizer ran', flush=True); os._exit(7)\n"
        "a = A()\nprint('main done')\n"
    ),
    "a finalizer that raises": (
        "class A:\n    def __del__(self):\n        raise RuntimeError('bad finalizer')\n"
        "a = A(); a.me = a\nprint('main done')\n"
    ),
    "stdout that cannot be flushed at exit": "import os, sys\nsys.stdout.write('x')\nos.close(1)\n",
    "a child left running": (
        "import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', "
        "'import time; time.sleep(1); print(\"from the grandchild\")'])\nprint('parent done')\n"
    ),
    "the umask": "import os\nprint(oct(os.umask(0)))\n",
    "an interrupt": "raise KeyboardInterrupt\n",
    "main's names": (
        "import sys\nprint(sorted(vars(sys.modules['__main__'])), getattr(__loader__, '__name__', type(__loader__)))\n"
    ),
    "a traceback": "def f():\n    raise ValueError('boom')\nf()\n",
    "the path from an empty PYTHONPATH entry": "import sys\nprint(sys.path[:3])\n",
}


def _outcome(completed, folder):
    """Exit status, stdout and stderr, with the test's folder, objects' addresses and a traceback's
    source lines left out (an interpreter tearing down its modules prints a finalizer's without)."""
    stderr = re.sub(r" at 0x[0-9a-f]+", " at ADDRESS", completed.stderr.replace(str(folder), "FOLDER"))
    stderr = "\n".join(line for line in stderr.split("\n") if not line.startswith("    "))
    return completed.returncode, completed.stdout, stderr


@pytest.mark.parametrize("how", ["script", "-c"])
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_a_forked_program_ends_as_a_fresh_one(name, how, server, tmp_path):
    script = tmp_path / "real" / "program.py"
    script.parent.mkdir()
    script.write_text(PROGRAMS[name], encoding="utf-8")
    (tmp_path / "linked").mkdir()
    (tmp_path / "linked" / "program.py").symlink_to(script)  # Python starts from the folder of the file
    args = [str(tmp_path / "linked" / "program.py")] if how == "script" else ["-c", PROGRAMS[name]]
    pythonpath = os.pathsep + str(tmp_path) if "empty PYTHONPATH" in name else str(tmp_path / "real")
    env = clean_env(PYTHONPATH=pythonpath)
    previous = os.umask(0o027)
    try:
        forked = server.run(args, str(tmp_path), env, 60)
        fresh = subprocess.run([sys.executable] + args, cwd=tmp_path, env=env, capture_output=True, text=True)
    finally:
        os.umask(previous)
    assert forked is not None, server.broken
    assert _outcome(forked, tmp_path) == _outcome(fresh, tmp_path)
    after = server.run(["-c", "print('next')"], str(tmp_path), clean_env(), 60)
    assert after.stdout == "next\n"  # nothing of the program's reaches the next one's output
