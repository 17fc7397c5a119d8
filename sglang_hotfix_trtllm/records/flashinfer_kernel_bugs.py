"""What the records of FlashInfer's own kernel bugs share (flashinfer4161, flashinfer4382): the bug
is in FlashInfer's CUDA code, which SGLang's backend calls, so no change of SGLang's code is
upstream's repair and the hotfix never patches it. Each record recognises whether the backend's code
reaches the kernel path (``classify``: ``unrepairable`` where it does, ``not-applicable`` where it
does not); the FlashInfer that runs decides the rest (``Hotfix.flashinfer_fix``, applied by
``detect.in_this_environment`` for an installed source, by ``tools/scan_releases.py`` with each
release's pin for the release tables).

Standard library only. The routes are read from the class's methods, never from a version string:
a method reaches a kernel when its body calls it, or calls (``self.name(...)``) a method of the class
that does, at any depth.
"""

import ast
import os

from .. import detect
from ..record import FlashInferFix, Hotfix, reports_only
from ..release_table import ReleaseTable
from . import trtllm_backend

DECODE_KERNEL = "flashinfer.decode.%s" % trtllm_backend.KERNELS["decode"]  # TRT-LLM-GEN on SM100, XQA on SM90/SM120


def methods_reaching(cls, kernel=DECODE_KERNEL):
    """The names of the class's methods that call ``kernel`` (dotted, as written in the backend:
    ``flashinfer.decode.trtllm_batch_decode_with_kv_cache``), themselves or through other methods
    of the class."""
    methods = {f.name: f for f in cls.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
    calls = {}
    reaching = set()
    last = kernel.rpartition(".")[2]  # the text of an attribute ends with its own name
    for name, function in methods.items():
        called = set()
        for node in detect.walk(function):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            if node.func.attr == last and ast.unparse(node.func) == kernel:
                reaching.add(name)
            elif isinstance(node.func.value, ast.Name) and node.func.value.id == "self":
                called.add(node.func.attr)
        calls[name] = called
    grown = True
    while grown:  # a helper of a helper reaches it too
        grown = False
        for name, called in calls.items():
            if name not in reaching and called & reaching:
                reaching.add(name)
                grown = True
    return reaching


def sets_attribute(function, attribute):
    """True where ``function`` assigns ``self.<attribute>`` anywhere in its body."""
    target = "self." + attribute
    for node in detect.walk(function):
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        if any(ast.unparse(t) == target for t in targets):
            return True
    return False


def live_class_and_method(tree, method):
    """(refusal, cls, function, verdict) as ``detect.live_method_classified`` gives them."""
    refusal, cls, function, _, verdict = detect.live_method_classified(tree, trtllm_backend.CLASS_NAME, method)
    return refusal, cls, function, verdict


def reason(who, reference, first, where):
    """A kernel bug's reason: ``who`` it concerns, then why no repair is offered and what fixes it
    (``where``: for whom the upgrade matters)."""
    return (
        "%s. Not repaired: the bug is FlashInfer's kernel code (%s, first in FlashInfer %s), which no change of "
        "SGLang's code repairs; upgrade FlashInfer to %s or later %s" % (who, reference, first, first, where)
    )


def hotfix(name, summary, effect, method, classify, first, reference):
    """The record: reported only (it never says ``affected``, so nothing is wrapped), judged by the
    FlashInfer that runs (``first``: the first FlashInfer release with ``reference``'s fix)."""
    return Hotfix(
        name=name,
        upstream="FlashInfer %s (%s)" % (first, reference.replace("FlashInfer ", "")),
        summary=summary,
        effect=effect,
        distribution="sglang",
        target="%s.%s.%s" % (trtllm_backend.MODULE, trtllm_backend.CLASS_NAME, method),
        classify=detect.walked_once(classify),
        wrapper=reports_only,
        flashinfer_fix=FlashInferFix(first, reference),
        known_fingerprints=ReleaseTable(
            os.path.join(os.path.dirname(os.path.abspath(__file__)), name + "_releases.json")
        ),
    )
