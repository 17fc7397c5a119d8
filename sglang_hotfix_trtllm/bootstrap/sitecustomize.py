"""Bootstrap ``sitecustomize`` put first on PYTHONPATH by ``sglang-hotfix-trtllm run``.

Standard library only; never raises into the host and never writes to
stdout. For installs outside site-packages (``pip install --target DIR``),
where no ``.pth`` file is read, it arms the hotfix's import hook, then runs
the ``sitecustomize`` the image would have run without us (the next one on
``sys.path`` that is not a bootstrap of this package, any install of it), so
both take effect, and the image's runs exactly once, even under nested
``run`` or with two installs of the plugin on PYTHONPATH.

If ``sglang_hotfix_trtllm_autoload`` is not importable from ``sys.path`` as it
stands (PYTHONPATH lacks the --target folder), the folder this bootstrap sits
in is appended *last*, so the image's own packages keep precedence.
"""

import sys

_GUARD = "sglang_hotfix_trtllm.bootstrap:done"


def _say(message):
    # Not sglang_hotfix_trtllm_autoload._say: this reports that very module failing to load.
    try:
        sys.stderr.write("sglang-hotfix-trtllm: %s\n" % message)
        sys.stderr.flush()
    except Exception:  # stderr None (AttributeError), closed (ValueError) or a broken pipe (OSError)
        pass


def _install_dir():
    import os

    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _arm_hotfix():
    try:
        try:
            import sglang_hotfix_trtllm_autoload
        except ImportError:
            folder = _install_dir()
            if folder in sys.path:
                raise
            sys.path.append(folder)
            import sglang_hotfix_trtllm_autoload
        sglang_hotfix_trtllm_autoload.install()
    except Exception as error:
        _say("bootstrap could not arm the hotfix (%s: %s)" % (type(error).__name__, error))


def _is_bootstrap_dir(path):
    # The twin of sglang_hotfix_trtllm.launcher.is_bootstrap_dir, kept here because
    # this file must not import the package (it may not be importable yet; see
    # _arm_hotfix). Unlike it, an empty entry means the current folder, as on sys.path.
    import os

    path = os.path.abspath(path or os.curdir)
    return os.path.basename(path) == "bootstrap" and os.path.basename(os.path.dirname(path)) == "sglang_hotfix_trtllm"


def _chain_to_next_sitecustomize():
    """Execute the next sitecustomize on sys.path, under the name sitecustomize."""
    import importlib.machinery
    import importlib.util

    others = [p for p in sys.path if isinstance(p, str) and not _is_bootstrap_dir(p)]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


# Once per process, whichever bootstrap copy runs first (nested `run`, two installs).
if _GUARD not in sys.modules:
    sys.modules[_GUARD] = None
    _arm_hotfix()
    try:
        _chain_to_next_sitecustomize()
    except Exception as error:
        _say("the image's own sitecustomize failed (%s: %s)" % (type(error).__name__, error))
