"""A fork server for the test interpreters that import SGLang (``python -S fork_server.py``).

An interpreter importing SGLang 0.5.12's backend spent 7 to 9 s of its life here importing torch,
torchvision, transformers and the like, and more than a hundred tests start one. This server
imports those libraries once, before anything of ours or SGLang's, then forks a child for each
request. The child starts as a fresh ``python SCRIPT`` would from that point: the request's
environment, working folder, ``sys.argv`` and ``sys.path`` (the script's folder, PYTHONPATH, the
standard library), then ``site.main()``, so the site-packages' ``.pth`` files run, the plugin's
among them, then the script's folder first on the path, the script as ``__main__``, and what an
interpreter does at exit but tear down every module (``_finish``). The server waits for what the
child leaves running in its process group, as ``subprocess.run`` waits for its pipes.

What differs from a fresh start, and why it does not matter to the requests it serves
(``fork_client.eligible`` sends only those; everything else starts fresh):

* the libraries below are already imported when the ``.pth`` files run: none of them is a module
  the plugin watches, and none is SGLang, wrapt, FlashInfer or setuptools (checked here);
* ``sys.flags.no_site`` is 1, so a child started by ``multiprocessing``'s spawn method would start
  with ``-S``: requests whose scenario spawns are not sent here;
* at exit, only ``__main__`` is torn down: a finalizer of another module's global (SGLang's, the
  plugin's) does not run, as it would in a fresh interpreter's teardown;
* ``sys.orig_argv``, ``/proc/self/cmdline`` and ``/proc/self/environ`` are the server's (a process
  that ``status --pid`` inspects is started by the tests with ``subprocess.Popen``, fresh);
* every child of one server has the server's hash seed (a fresh interpreter draws its own), and
  the modules the libraries imported (a submodule the plugin forgot to import is there anyway:
  the fresh runs, ``SGLANG_HOTFIX_TEST_FRESH=1`` and the CLI, which always starts fresh, see it);
* a variable these libraries read at import holds the server's value: a request may change only
  variables none of them read (``environment_read``, Python's reads; the client allows only
  PYTHONPATH, SGLANG_ variables and the name of the test running, and checks them against it).

The server speaks JSON lines on stdin/stdout: first ``{"preloaded": [top-level names],
"environment_read": [names]}`` (or ``{"refused": why}``), then for each request ``{"pid": N}`` and
``{"returncode": N}``.
"""

import json
import os
import sys

# The libraries SGLang's backend module imports that cost most of an interpreter's start.
PRELOAD = (
    "torch",
    "torchvision",
    "torchvision.io",
    "torch._dynamo",
    "torch._inductor.lowering",
    "transformers",
    "transformers.models.auto",
    "openai",
    "aiohttp",
    "sympy",
    "numpy",
    "triton",
    "pydantic",
    "compressed_tensors",
    "IPython",
    "requests",
    "httpx",
    "networkx",
    "gguf",
    "zmq",
    "psutil",
    "PIL",
    "orjson",
    "pybase64",
    "starlette",
    "tqdm",
    "dill",
    "einops",
    "sentencepiece",
    "partial_json_parser",
)
# What a child must import itself, after its .pth files ran, as a fresh interpreter would.
NEVER_PRELOADED = (
    "sglang",
    "sgl_kernel",
    "flashinfer",
    "wrapt",
    "sglang_hotfix_trtllm",
    "sglang_hotfix_trtllm_autoload",
    "setuptools",
    "_distutils_hack",
    "distutils",
    "pkg_resources",
    "prometheus_client",  # reads PROMETHEUS_MULTIPROC_DIR at import, which tests set
    "sitecustomize",
    "usercustomize",
)


def _send(channel, **message):
    channel.write(json.dumps(message) + "\n")
    channel.flush()


class _ReadsOfTheEnvironment:
    """The variables Python code reads from ``os.environ`` while it is in force (a library that
    reads one at import holds the server's value, so a request may not change it)."""

    def __init__(self):
        self.names = set()
        self.kind = type(os.environ)
        self.saved = self.kind.__getitem__, self.kind.__contains__

    def __enter__(self):
        get, contains = self.saved
        names = self.names
        self.kind.__getitem__ = lambda environ, key: (names.add(key), get(environ, key))[1]
        self.kind.__contains__ = lambda environ, key: (names.add(key), contains(environ, key))[1]
        return self

    def __exit__(self, *exc):
        self.kind.__getitem__, self.kind.__contains__ = self.saved


def _preload(site_packages, reads):
    base_path = sys.path[1:]  # the standard library's folders: what -S leaves, less this file's folder
    sys.path.extend(p for p in site_packages if p not in sys.path)
    try:
        with reads:
            for name in PRELOAD:
                __import__(name)
    finally:
        sys.path[:] = base_path
    present = sorted(name for name in NEVER_PRELOADED if name in sys.modules)
    if present:
        return None, "the preloaded libraries imported %s" % ", ".join(present)
    import threading

    if threading.active_count() != 1:
        return None, "the preloaded libraries started threads: %s" % threading.enumerate()
    return base_path, None


def _main_module(argv):
    """``__main__`` as Python makes it for ``-c`` or a script (the names a fresh one holds)."""
    import builtins
    import importlib.machinery
    import types

    main = types.ModuleType("__main__")
    main.__builtins__, main.__annotations__, main.__spec__ = builtins, {}, None
    if argv[0] == "-c":
        main.__loader__ = importlib.machinery.BuiltinImporter
        return main, compile(argv[1], "<string>", "exec", dont_inherit=True), "<string>"
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", argv[0])
    main.__file__, main.__cached__ = argv[0], None
    with open(argv[0], "rb") as handle:
        return main, compile(handle.read(), argv[0], "exec", dont_inherit=True), argv[0]


def _start_as_fresh(request, base_path):
    """The request's process settings, folder, environment, ``sys.argv``, ``sys.path`` (then
    ``site.main()``: the ``.pth`` files) and ``__main__``; returns the code to run and its file."""
    os.setpgid(0, 0)  # its own group: the server waits for what it leaves running, as a pipe would
    os.umask(request["umask"])
    stdin = os.open(os.devnull, os.O_RDONLY)
    stdout = os.open(request["stdout"], os.O_WRONLY | os.O_TRUNC)
    stderr = os.open(request["stderr"], os.O_WRONLY | os.O_TRUNC)
    for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    argv = request["argv"]
    # Python's own rules: every PYTHONPATH entry, an empty one naming the current folder; a script's
    # folder is that of the file it links to; -c's first entry is "" (the current folder).
    value = request["env"].get("PYTHONPATH", "")
    python_path = [os.path.abspath(p) for p in value.split(os.pathsep)] if value else []
    first = "" if argv[0] == "-c" else os.path.dirname(os.path.realpath(argv[0]))
    sys.argv = ["-c"] + argv[2:] if argv[0] == "-c" else list(argv)
    sys.path[:] = python_path + base_path
    import site

    site.main()
    sys.path.insert(0, first)  # as Python puts it there: after site ran
    main, code, filename = _main_module(argv)
    sys.modules["__main__"] = main
    return main, code, filename


def _print_uncaught(error, filename):
    """The traceback Python prints, from the script's first frame (none of this file's)."""
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != filename:
        tb = tb.tb_next
    tb = tb or error.__traceback__
    sys.excepthook(type(error), error.with_traceback(tb), tb)


def _exit_status(error):
    """The exit status Python gives a ``SystemExit`` (its message, where it is one, on stderr)."""
    if error.code is None:
        return 0
    if isinstance(error.code, int):
        return error.code
    print(error.code, file=sys.stderr)
    return 1


def _finish(status, main):
    """What an interpreter does at exit, but tearing down every module (the server's preloaded ones
    took 1.5 s a child, and hold nothing of a test's): threads joined, ``atexit``, ``__main__``'s
    names dropped (their finalizers run), a collection (finalizers of cycles), the last flush of
    stdout and stderr (exit 120 where it fails), as ``Py_FinalizeEx`` orders them."""
    import atexit
    import gc
    import threading
    import traceback

    threading._shutdown()
    atexit._run_exitfuncs()
    names = vars(main)
    for name in [n for n in reversed(names) if n != "__builtins__"]:  # the last bound first
        names.pop(name, None)
    gc.collect()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception as error:
            message = "Exception ignored in: %r\n%s" % (stream, "".join(traceback.format_exception_only(error)))
            os.write(2, message.encode())
            status = 120
    os._exit(status)


def _child(request, base_path):
    """Become ``python ARGV``; never returns to the server's loop."""
    try:
        main, code, filename = _start_as_fresh(request, base_path)
    except BaseException:
        import traceback

        traceback.print_exc()
        os._exit(1)  # the server's own failure, said on the test's stderr; never the server's loop
    try:
        exec(code, vars(main))
        status = 0
    except SystemExit as error:
        status = _exit_status(error)
    except BaseException as error:
        _print_uncaught(error, filename)
        if isinstance(error, KeyboardInterrupt):  # Python ends such a process by SIGINT
            import signal

            sys.stdout.flush()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        status = 1
    _finish(status, main)


def _reap_the_group(pid, deadline):
    """Wait, until ``deadline``, for the processes the child left in its group (this server is
    their subreaper): ``subprocess.run`` waits for them too, as they hold its pipes. True when some
    were still running at the deadline (then killed)."""
    import time

    while True:
        try:
            reaped, _ = os.waitpid(-pid, os.WNOHANG)
        except ChildProcessError:
            return False
        if reaped == 0:
            if time.monotonic() > deadline:
                try:
                    os.killpg(pid, 9)
                except ProcessLookupError:
                    pass
                return True
            time.sleep(0.02)


def _become_subreaper():
    """Orphans of a child come to this server (Linux ``PR_SET_CHILD_SUBREAPER``), which reaps them."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)


def serve(site_packages):
    import time

    control_in, control_out = sys.stdin, os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # what the libraries print goes to the server's log, never into the replies
    reads = _ReadsOfTheEnvironment()
    base_path, refused = _preload(site_packages, reads)
    if refused:
        _send(control_out, refused=refused)
        return
    _become_subreaper()
    _send(
        control_out,
        preloaded=sorted({name.partition(".")[0] for name in sys.modules}),
        environment_read=sorted(reads.names),
    )
    for line in control_in:
        request = json.loads(line)
        deadline = time.monotonic() + request["timeout"]
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            control_out.close()
            _child(request, base_path)
        try:
            os.setpgid(pid, pid)
        except OSError:
            pass  # the child did it first
        _send(control_out, pid=pid)
        _, status = os.waitpid(pid, 0)
        lingering = _reap_the_group(pid, deadline)
        _send(control_out, returncode=os.waitstatus_to_exitcode(status), lingering=lingering)


if __name__ == "__main__":
    serve(json.loads(sys.argv[1]))
