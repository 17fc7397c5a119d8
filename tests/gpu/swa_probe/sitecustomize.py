"""Arms the test's probe (``swa_probe.py`` beside this file) in every Python
process started with this folder on ``PYTHONPATH`` and ``SWA_PROBE`` set:
SGLang's server, and the scheduler processes it spawns (fresh interpreters
that inherit the environment). Without ``SWA_PROBE`` it does nothing.

A post-import hook, standard library only: a meta-path finder that, for two of
SGLang's modules alone (``trtllm_mha_backend`` and ``swa_memory_pool``), asks the
other finders for the module's spec, and has its loader hand the module to
``swa_probe`` (``install`` and ``watch_swa_pools``) right after the module's
code has run. Nothing is imported, and no SGLang code is touched, before that.
A ``sitecustomize`` that this one shadows (one further down ``sys.path``) is
run afterwards, so that the machine's own start-up stays as it was.
"""

import importlib.machinery
import importlib.util
import os
import sys

TARGETS = {
    "sglang.srt.layers.attention.trtllm_mha_backend": "install",
    "sglang.srt.mem_cache.swa_memory_pool": "watch_swa_pools",
}
HERE = os.path.dirname(os.path.abspath(__file__))


class _ProbeFinder:
    def __init__(self):
        self._busy = False

    def find_spec(self, name, path=None, target=None):
        if name not in TARGETS or self._busy:
            return None
        self._busy = True  # importlib.util.find_spec below walks sys.meta_path again: skip ourselves there
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_then_install(module):
            exec_module(module)
            sys.path.insert(0, HERE)
            try:
                import swa_probe
            finally:
                sys.path.remove(HERE)
            getattr(swa_probe, TARGETS[name])(module)

        loader.exec_module = exec_then_install
        return spec


def _run_shadowed_sitecustomize():
    others = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is None or spec.origin is None or os.path.dirname(os.path.abspath(spec.origin)) == HERE:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


if os.environ.get("SWA_PROBE"):
    sys.meta_path.insert(0, _ProbeFinder())
_run_shadowed_sitecustomize()
