"""A fork server for the test interpreters that import SGLang (``python -S fork_server.py``).

An interpreter importing SGLang 0.5.12's backend spent 7 to 9 s of its life here importing torch,
torchvision, transformers and the like, and more than a hundred tests start one. This server
imports those libraries once, before anything of ours or SGLang's, then forks a child for each
request. The child starts as a fresh ``python SCRIPT`` would from that point: the request's
environment, working folder, ``sys.argv`` and ``sys.path`` (the script's folder, PYTHONPATH, the
standard library), then ``site.main()``, so the site-packages' ``.pth`` files run, the plugin's
among them, then the script's folder first on the path, the script as ``__main__``, and what an
interpreter does at exit.

What differs from a fresh start, and why it does not matter to the requests it serves
(``fork_client.eligible`` sends only those; everything else starts fresh):

* the libraries below are already imported when the ``.pth`` files run: none of them is a module
  the plugin watches, and none is SGLang, wrapt, FlashInfer or setuptools (checked here);
* ``sys.flags.no_site`` is 1, so a child started by ``multiprocessing``'s spawn method would start
  with ``-S``: requests whose scenario spawns are not sent here;
* ``sys.orig_argv`` is the server's;
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


def _exit_code(error):
    code = error.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _child(request, base_path):
    """Become ``python ARGV`` as started in the request's folder and environment (never returns)."""
    code = 1
    try:
        stdin = os.open(os.devnull, os.O_RDONLY)
        stdout = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        stderr = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        argv = request["argv"]
        python_path = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        if argv[0] == "-c":
            sys.argv, first = ["-c"] + argv[2:], ""
        else:
            sys.argv, first = list(argv), os.path.dirname(os.path.abspath(argv[0]))
        sys.path[:] = python_path + base_path
        import site

        site.main()
        sys.path.insert(0, first)  # as Python puts it there: after site ran
        import runpy

        try:
            if argv[0] == "-c":
                import builtins
                import types

                main = types.ModuleType("__main__")
                main.__builtins__ = builtins
                sys.modules["__main__"] = main
                exec(compile(argv[1], "<string>", "exec"), vars(main))
            else:
                runpy.run_path(argv[0], run_name="__main__")
            code = 0
        except SystemExit as error:
            code = _exit_code(error)
        except BaseException:
            sys.excepthook(*sys.exc_info())
            code = 1
        import threading

        threading._shutdown()  # as an interpreter does at exit: wait for the threads it started
        import atexit

        atexit._run_exitfuncs()
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


def serve(site_packages):
    control_in, control_out = sys.stdin, os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # what the libraries print goes to the server's log, never into the replies
    reads = _ReadsOfTheEnvironment()
    base_path, refused = _preload(site_packages, reads)
    if refused:
        _send(control_out, refused=refused)
        return
    _send(
        control_out,
        preloaded=sorted({name.partition(".")[0] for name in sys.modules}),
        environment_read=sorted(reads.names),
    )
    for line in control_in:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            control_out.close()
            _child(request, base_path)
        _send(control_out, pid=pid)
        _, status = os.waitpid(pid, 0)
        _send(control_out, returncode=os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    serve(json.loads(sys.argv[1]))
