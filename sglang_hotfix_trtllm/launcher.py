"""``sglang-hotfix-trtllm run -- COMMAND``: protect a command when the plugin is
installed outside site-packages (``pip install --target DIR``).

It puts the bootstrap ``sitecustomize`` folder first on PYTHONPATH; the rest
of PYTHONPATH is kept as it was (its order, empty entries meaning the current
folder), so the command sees the ``sys.path`` it would see without ``run``
plus that one entry -- except that this package's own ``--target`` folder, if
PYTHONPATH names it, moves behind the image's packages (see ``environment``). Then it
replaces itself with COMMAND (so the exit status is COMMAND's). Every Python
process COMMAND starts inherits PYTHONPATH, spawned SGLang schedulers
included. The bootstrap finds this package through the folder it sits in
when nothing else provides it, appending that folder *last* to ``sys.path``,
so the image's own packages (its wrapt included) are never shadowed.
"""

import os

BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap")
# The folder holding this package and the startup module (site-packages, or the --target folder).
INSTALL_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def environment(environ):
    """``environ`` with the bootstrap folder first on PYTHONPATH (unchanged when
    a bootstrap of this package is on it already: ``run`` inside ``run``).

    The one other change: when this package sits in a ``pip install --target``
    folder that PYTHONPATH names (how the launcher itself was found), that
    folder leaves PYTHONPATH; the bootstrap appends it behind everything else,
    so the packages it holds (its own wrapt) never shadow the image's."""
    env = dict(environ)
    existing = env.get("PYTHONPATH", "")
    entries = existing.split(os.pathsep) if existing else []
    if any(is_bootstrap_dir(entry) for entry in entries):
        return env
    if not in_site_packages(INSTALL_DIR):
        entries = [e for e in entries if not (e and os.path.realpath(e) == os.path.realpath(INSTALL_DIR))]
    env["PYTHONPATH"] = os.pathsep.join([BOOTSTRAP_DIR] + entries)
    return env


def site_dirs():
    """The site directories Python reads ``.pth`` files from at start."""
    import site

    return list(site.getsitepackages()) + ([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])


def in_site_packages(folder):
    return os.path.realpath(folder) in {os.path.realpath(s) for s in site_dirs()}


def is_bootstrap_dir(path):
    """True for the bootstrap folder of any install of this package."""
    if not path:
        return False
    path = os.path.abspath(path)
    return os.path.basename(path) == "bootstrap" and os.path.basename(os.path.dirname(path)) == "sglang_hotfix_trtllm"


def run(command):
    if not command:
        _error("no command given (usage: sglang-hotfix-trtllm run -- COMMAND [ARGS...])")
        return 2
    if not command[0] or "\0" in command[0]:
        _error("cannot run %r: not a command name (an empty or NUL-bearing argument)" % command[0])
        return 127
    try:
        os.execvpe(command[0], command, environment(os.environ))
    except (OSError, ValueError) as error:  # ValueError: a NUL byte in an argument or the environment
        _error("cannot run %s: %s" % (command[0], getattr(error, "strerror", None) or error))
        return 127 if isinstance(error, FileNotFoundError) else 126


def _error(message):
    # The startup module's writer: one line on stderr, never on stdout, never raising.
    import sglang_hotfix_trtllm_autoload

    sglang_hotfix_trtllm_autoload._say("run: " + message)
