"""The test process's side of ``fork_server.py``: which interpreters it may start, and starting them.

A request goes to the fork server only where a child forked there starts as ``python ARGV`` would
(``fork_server``'s docstring says what differs): this interpreter; a ``.py`` script or ``-c``, no
flags (of the CLI, only ``verify``, which imports SGLang's backend: a fresh ``status`` holds only
the modules the CLI imports, and forking it saved 0.02 s a run);
an environment that differs from the server's only in ``MAY_DIFFER`` and SGLANG_ variables, none
of them read by the server's libraries at import; no folder on the child's path that holds a module
of a name the server imported (a shadowed ``torch``, a ``wrapt.py`` in the current folder: the
child would get the server's); no scenario of ``MUST_START_FRESH`` (one that spawns a child, one
that asserts torch is not imported). Anything else, or ``SGLANG_HOTFIX_TEST_FRESH=1``, starts fresh.
"""

import atexit
import io
import json
import locale
import os
import pathlib
import select
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time

SERVER = pathlib.Path(__file__).with_name("fork_server.py")
ALL_FRESH = "SGLANG_HOTFIX_TEST_FRESH"
# Scenarios a fork cannot stand in for: (script, scenario) -> why.
MUST_START_FRESH = {
    ("scenarios.py", "spawn_child"): "the scenario spawns a child, which would inherit the server's -S",
    ("scenarios.py", "startup_only"): "the scenario asserts that nothing heavy (torch) is imported at start",
}
START_TIMEOUT = 300


# Variables a request's environment may change (unless the server's libraries read them at import):
# PYTEST_CURRENT_TEST names the test running (pytest sets it for each, clean_env copies it).
# PROMETHEUS_MULTIPROC_DIR: the metrics tests set it; the server never imports prometheus_client.
MAY_DIFFER = ("PYTHONPATH", "PYTEST_CURRENT_TEST", "PROMETHEUS_MULTIPROC_DIR")


def _may_differ(key):
    return key in MAY_DIFFER or key.startswith("SGLANG_")


def _module_names(folder):
    """The top-level names importable from ``folder``: packages (any folder, a namespace package
    too) and modules (None: not a folder that can be read, a zip among them)."""
    try:
        with os.scandir(folder) as entries:
            return {
                entry.name.split(".", 1)[0]
                for entry in entries
                if entry.is_dir() or entry.name.endswith((".py", ".pyc", ".so", ".pyd"))
            }
    except OSError:
        return None if os.path.exists(folder) else set()


class ForkServer:
    def __init__(self):
        self.lock = threading.Lock()
        self.process = None
        self.preloaded = None
        self.environment_read = set()
        self.broken = None
        self.env = None
        self.folder = None
        self.unread = b""  # what _read has taken from the server's pipe beyond the last reply

    def _start(self, env):
        self.env = dict(env)
        self.folder = tempfile.mkdtemp(prefix="fork-server-")
        site_packages = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
        log = open(os.path.join(self.folder, "server.log"), "w")
        self.process = subprocess.Popen(
            [sys.executable, "-S", str(SERVER), json.dumps(site_packages)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            env=self.env,
            cwd=self.folder,
            bufsize=0,  # replies are read by _read, line by line from its own buffer
        )
        log.close()
        reply = self._read(START_TIMEOUT)
        if reply is None or "preloaded" not in reply:
            self._stop("the fork server did not start: %s" % (reply or "no reply"))
            return
        self.preloaded = set(reply["preloaded"])
        self.environment_read = set(reply["environment_read"])
        atexit.register(self._stop, None)

    def _stop(self, why):
        self.broken = self.broken or why
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def _read(self, timeout):
        """The server's next reply, or None (no reply within ``timeout``, or the server is gone)."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.unread:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.process.stdout], [], [], left)[0]:
                return None
            chunk = os.read(self.process.stdout.fileno(), 65536)
            if not chunk:
                return None
            self.unread += chunk
        line, self.unread = self.unread.split(b"\n", 1)
        return json.loads(line)

    def _why_not(self, args, env, python, console_script=False):
        """Why ``python ARGS`` with ``env`` must start fresh, or None (``console_script``: ARGS[0] is
        a console script of this interpreter, which the caller vouches for)."""
        if os.environ.get(ALL_FRESH) == "1":
            return "%s=1" % ALL_FRESH
        if python not in (None, sys.executable):
            return "another interpreter"
        if not args:
            return "no script"
        if args[0] != "-c" and (args[0].startswith("-") or not (console_script or args[0].endswith(".py"))):
            return "interpreter flags or no script"
        fresh_only = MUST_START_FRESH.get((os.path.basename(args[0]), args[1] if len(args) > 1 else None))
        if fresh_only:
            return fresh_only
        if self.env is not None:
            changed = {k for k in set(env) | set(self.env) if env.get(k) != self.env.get(k)}
            unsafe = sorted(k for k in changed if not _may_differ(k) or k in self.environment_read)
            if unsafe:
                return "the environment differs in %s" % unsafe
        return None

    def _shadowed(self, args, env, cwd):
        first = cwd if args[0] == "-c" else os.path.dirname(os.path.realpath(os.path.join(cwd, args[0])))
        value = env.get("PYTHONPATH", "")
        for folder in [first] + (value.split(os.pathsep) if value else []):
            names = _module_names(os.path.join(cwd, folder))  # an empty entry: the current folder
            if names is None:
                return "%s is not a folder that can be listed" % folder
            if names & self.preloaded:
                return "%s holds a module the server imported" % folder
        return None

    def run(self, args, cwd, env, timeout, python=None, console_script=False):
        """``subprocess.run``'s CompletedProcess (text) for ``python ARGS``, or None: start it fresh."""
        cwd = os.path.abspath(cwd or os.getcwd())
        why = self._why_not(args, env, python, console_script)
        if why or not self.lock.acquire(blocking=False):
            return _trace(why or "another request is running", args)
        try:
            if self.process is None and not self.broken:
                self._start({k: v for k, v in env.items() if not _may_differ(k)})
            why = self.broken or self._why_not(args, env, python, console_script)
            shadowing = None if why else self._shadowed(args, env, cwd)
            if why or shadowing:
                return _trace(why or shadowing, args)
            _trace(None, args)
            return self._request(args, cwd, env, timeout)
        finally:
            self.lock.release()

    def _request(self, args, cwd, env, timeout):
        out, err = (tempfile.mkstemp(dir=self.folder, prefix=name) for name in ("stdout-", "stderr-"))
        try:
            for fd, _ in (out, err):
                os.close(fd)
            return self._requested(args, cwd, env, timeout, out[1], err[1])
        finally:
            for _, path in (out, err):
                os.unlink(path)

    def _requested(self, args, cwd, env, timeout, out, err):
        umask = os.umask(0)
        os.umask(umask)
        request = {"argv": list(args), "env": env, "cwd": cwd, "stdout": out, "stderr": err}
        request.update(umask=umask, timeout=timeout)
        try:
            self.process.stdin.write((json.dumps(request) + "\n").encode())
        except OSError as error:
            self._stop("the fork server is gone (%s)" % error)
            return None
        started = self._read(60)
        if started is None or "pid" not in started:
            self._stop("the fork server did not fork: %s" % started)
            return None
        done = self._read(timeout)
        if done is None:  # the child runs on: the server has not reaped it, so the pid is still its own
            try:
                os.kill(started["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass  # it ended and was reaped as the time ran out: the server's reply is on its way
            if self._read(60) is None:
                self._stop("the fork server did not answer after its child was killed")
        if done is None or done["lingering"]:
            raise subprocess.TimeoutExpired(list(args), timeout, output=_text(out), stderr=_text(err))
        return subprocess.CompletedProcess(list(args), done["returncode"], _text(out), _text(err))


def _trace(why, args):
    """With SGLANG_HOTFIX_TEST_FORK_TRACE=FILE, a line there for each interpreter: forked, or started
    fresh and why (what ``docs/development.md`` counts). Returns None."""
    trace = os.environ.get("SGLANG_HOTFIX_TEST_FORK_TRACE")
    if trace:
        with open(trace, "a") as handle:
            shown = " ".join(args).replace("\n", " ")[:200]
            handle.write("%s\t%s\t%s\n" % ("fresh" if why else "forked", why or "", shown))


def _text(path):
    """A file read as ``subprocess.run(text=True)`` reads a pipe: the locale's encoding, universal newlines."""
    with open(path, "rb") as handle:
        data = handle.read()
    return io.TextIOWrapper(io.BytesIO(data), encoding=locale.getpreferredencoding(False)).read()


SERVER_OF_THIS_PROCESS = ForkServer()
