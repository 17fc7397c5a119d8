"""``sglang-hotfix-trtllm run -- COMMAND``: protect a command when the plugin is
installed outside site-packages (``pip install --target DIR``).

It puts the bootstrap ``sitecustomize`` first on PYTHONPATH and the plugin's
install folder after it, then replaces itself with COMMAND (so the exit status
is COMMAND's). Every Python process COMMAND starts inherits PYTHONPATH, spawned
SGLang schedulers included.
"""

import os
import sys

import sglang_hotfix_trtllm_autoload

BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap")
# The folder holding this package and the startup module (site-packages, or the --target folder).
INSTALL_DIR = os.path.dirname(os.path.abspath(sglang_hotfix_trtllm_autoload.__file__))


def environment(environ):
    env = dict(environ)
    existing = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in (BOOTSTRAP_DIR, INSTALL_DIR)]
    env["PYTHONPATH"] = os.pathsep.join([BOOTSTRAP_DIR, INSTALL_DIR] + existing)
    return env


def run(command):
    if not command:
        print("sglang-hotfix-trtllm run: no command given (usage: sglang-hotfix-trtllm run -- COMMAND [ARGS...])", file=sys.stderr)
        return 2
    try:
        os.execvpe(command[0], command, environment(os.environ))
    except OSError as error:
        print("sglang-hotfix-trtllm run: cannot run %s: %s" % (command[0], error.strerror or error), file=sys.stderr)
        return 127 if isinstance(error, FileNotFoundError) else 126
