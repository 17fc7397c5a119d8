"""Bootstrap ``sitecustomize`` put first on PYTHONPATH by ``sglang-hotfix-trtllm run``.

Standard library only; never raises into the host. For installs outside
site-packages (``pip install --target DIR``), where no ``.pth`` file is read,
it arms the hotfix's import hook, then runs the ``sitecustomize`` the image
would have run without us (the next one on ``sys.path``), so both take effect.
"""

import sys


def _arm_hotfix():
    try:
        import sglang_hotfix_trtllm_autoload

        sglang_hotfix_trtllm_autoload.install()
    except Exception as error:
        sys.stderr.write("sglang-hotfix-trtllm: bootstrap could not arm the hotfix (%s: %s)\n" % (type(error).__name__, error))


def _chain_to_next_sitecustomize():
    """Execute the next sitecustomize on sys.path, under the name sitecustomize."""
    import importlib.machinery
    import importlib.util
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    others = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_arm_hotfix()
try:
    _chain_to_next_sitecustomize()
except Exception as error:
    sys.stderr.write("sglang-hotfix-trtllm: the image's own sitecustomize failed (%s: %s)\n" % (type(error).__name__, error))
