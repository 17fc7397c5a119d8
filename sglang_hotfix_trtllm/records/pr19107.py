"""The hotfix record for SGLang PR #19107 ("Fix trtllm_mha fp8 SWA KV index translation"): the fused
FP8 KV write of a sliding-window layer writes at the sliding-window pool's indices.

Standard library only at import.

The bug (SGLang 0.5.9 only): 0.5.9 gave ``trtllm_mha`` sliding-window KV pools (PR #18970): reads
translate full-pool indices into the SWA pool's (``_maybe_translate_swa``), and the plain KV write
goes through ``SWAKVPool.set_kv_buffer``, which translates them itself. The fused FP8 write does
not: ``_fused_fp8_set_kv_buffer`` takes the K/V buffers of the layer's own pool (for a
sliding-window layer, the SWA pool's) and writes them at ``forward_batch.out_cache_loc``, the
full pool's indices. With ``--kv-cache-dtype fp8_e4m3`` on a hybrid sliding-window model (Llama 4,
MiMo-V2-Flash, Step-3.5; gpt-oss once its gate is lifted) the sliding-window layers' new K/V land
in other tokens' slots (or past the SWA pool), and what the model then reads is, upstream's words,
"completely broken". Upstream's fix, in 0.5.10::

    cache_loc = self._get_layer_cache_loc(layer, forward_batch.out_cache_loc)

with the new method ``_get_layer_cache_loc``: if ``self.use_sliding_window_kv_pool`` and the
layer is a sliding-window one in ``self._swa_kv_pool.layers_mapping``, the locations through
``self._swa_kv_pool.translate_loc_from_full_to_swa``; else the locations as they are.

The repair is upstream's code (``code_edit``): 0.5.9's own ``_fused_fp8_set_kv_buffer``, compiled
from the installed file with its one ``cache_loc = forward_batch.out_cache_loc`` replaced by 0.5.10's
statement above, runs as SGLang's function; 0.5.10's ``_get_layer_cache_loc`` is added to the
class first. No frame of the hotfix's runs on a call, and where 0.5.10's code would raise (a pool
without ``layers_mapping``), it raises. ``_swa_kv_pool`` is read at each call: with record
``pr25103`` on, it is the pool that record resolves, as in 0.5.13.

Verdicts: ``affected`` when ``_fused_fp8_set_kv_buffer``, ``__init__`` and the two methods that call
the fused write are, by fingerprint, 0.5.9's; ``fixed`` when the live fused write
(``_fused_fp8_set_kv_buffer``, or ``_fused_fp8_qkv_kv_cache`` from 0.5.16) takes its locations from
``self._get_layer_cache_loc`` (0.5.10 on); ``not-applicable`` when there is no fused FP8 write
(before 0.5.6.post1) or the backend has no sliding-window pool (0.5.6.post1 to 0.5.8.post1: its
reads are not translated either, a state #19107 does not address); ``unknown`` otherwise.
"""

import ast
import os

from .. import code_edit, detect
from . import pr28144
from ..fingerprint import of_node
from ..record import Classification, Hotfix, Verdict
from ..release_table import ReleaseTable

CLASS_NAME = "TRTLLMHAAttnBackend"
METHOD = "_fused_fp8_set_kv_buffer"
LATER_METHOD = "_fused_fp8_qkv_kv_cache"  # 0.5.16 on: the fused write's new name
CALLERS = ("forward_decode", "forward_extend")
TRANSLATOR = "_get_layer_cache_loc"
UPSTREAM = "SGLang 0.5.10 (PR #19107)"
POOL_ATTRIBUTES = ("use_sliding_window_kv_pool", "_swa_kv_pool")


# --------------------------------------------------------------------------
# The repair: upstream's change, as an edit of the release's own method

RELEASE_STATEMENT = "cache_loc = forward_batch.out_cache_loc"
UPSTREAM_STATEMENT = "cache_loc = self._get_layer_cache_loc(layer, forward_batch.out_cache_loc)"
# SGLang 0.5.10's new method, verbatim (trtllm_mha_backend.py; unchanged in 0.5.10.post1).
UPSTREAM_TRANSLATOR = '''\
def _get_layer_cache_loc(
    self,
    layer: RadixAttention,
    cache_loc: torch.Tensor,
) -> torch.Tensor:
    """Return cache locations in the correct index space for the given layer."""
    if self.use_sliding_window_kv_pool:
        _, is_swa = self._swa_kv_pool.layers_mapping[layer.layer_id]
        if is_swa:
            return self._swa_kv_pool.translate_loc_from_full_to_swa(cache_loc)
    return cache_loc
'''


def take_upstreams_locations(method, tree):
    """PR #19107 on 0.5.9's ``_fused_fp8_set_kv_buffer``: its one ``cache_loc = ...`` becomes 0.5.10's."""
    code_edit.replace_statement(method, RELEASE_STATEMENT, UPSTREAM_STATEMENT)


EDITS = (code_edit.Edit(METHOD, take_upstreams_locations),)
NEW_NAMES = (code_edit.NewName(TRANSLATOR, UPSTREAM_TRANSLATOR, UPSTREAM),)


# --------------------------------------------------------------------------
# Recognising the code

AFFECTED_METHOD = frozenset(("ast1:87f5ec275018621e",))  # 0.5.6.post1 to 0.5.9, unchanged
AFFECTED_INIT = frozenset(("ast1:9c711ebfbb08b987",))  # 0.5.9's: the one release with SWA pools and this write
AFFECTED_CALLERS = frozenset(pair for pair, releases in pr28144.AFFECTED.items() if releases == "0.5.9")


def _mentions(tree, words):
    """Any name, attribute or imported name of the module among ``words``."""
    return any(
        (isinstance(node, ast.Attribute) and node.attr in words)
        or (isinstance(node, ast.Name) and node.id in words)
        or (isinstance(node, ast.alias) and node.name.rpartition(".")[2] in words)
        for node in detect.nodes(tree)
    )


# Never in a backend without sliding-window pools (0.5.6.post1 to 0.5.8.post1), all in 0.5.9's.
SWA_WORDS = frozenset(POOL_ATTRIBUTES + ("SWAKVPool", "SWATokenToKVPoolAllocator", "translate_loc_from_full_to_swa"))
FUSED_WORDS = frozenset((METHOD, LATER_METHOD, "fused_fp8_set_kv_buffer", "_should_use_fused_fp8_path"))


# Where a release's ``_get_layer_cache_loc`` takes a sliding-window layer's locations from: the pool's
# translation (0.5.10 on), the batch's translated copy (0.5.11 on), the metadata's (0.5.18 on).
SWA_LOCATIONS = frozenset(("translate_loc_from_full_to_swa", "out_cache_loc_swa", "swa_out_cache_loc"))


def _translator_translates(function):
    """0.5.10's ``_get_layer_cache_loc`` in substance: it asks the pool's layer mapping and takes a
    sliding-window layer's locations from a translation (a helper that returns the locations as
    they are is not it)."""
    attributes = {node.attr for node in ast.walk(function) if isinstance(node, ast.Attribute)}
    return "layers_mapping" in attributes and bool(attributes & SWA_LOCATIONS)


def _translates(function):
    """The fused write's first ``cache_loc`` is ``self._get_layer_cache_loc(layer, ...)``, a
    statement of its own body (not under another), and no other statement sets ``cache_loc``."""
    assigned = [
        node
        for node in ast.walk(function)
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign))
        and "cache_loc" in {ast.unparse(t) for t in (node.targets if isinstance(node, ast.Assign) else [node.target])}
    ]
    if len(assigned) != 1 or assigned[0] not in function.body:
        return False
    value = assigned[0].value
    return (
        isinstance(value, ast.Call)
        and ast.unparse(value.func) == "self.%s" % TRANSLATOR
        and bool(value.args)
        and ast.unparse(value.args[0]) == "layer"
    )


def classify(tree):
    """Classify the source of ``trtllm_mha_backend`` (an ``ast.Module``)."""
    cls, class_problem = detect.live_class(tree, CLASS_NAME)
    if cls is None:
        return Classification(Verdict.UNKNOWN, class_problem, of_node(tree))
    live = detect.live_methods(tree, cls, (METHOD, LATER_METHOD, TRANSLATOR, "__init__") + CALLERS)
    for name in (METHOD, LATER_METHOD, TRANSLATOR):
        if live[name][1]:
            return Classification(Verdict.UNKNOWN, live[name][1], of_node(cls))
    write = live[METHOD][0] or live[LATER_METHOD][0]
    if write is None:
        if _mentions(tree, FUSED_WORDS):  # a fused write under another name, or only its parts
            return Classification(Verdict.UNKNOWN, "the fused FP8 KV write is not where a release has it", of_node(cls))
        return Classification(
            Verdict.NOT_APPLICABLE, "this backend has no fused FP8 KV write (added in SGLang 0.5.6.post1)", of_node(cls)
        )
    fingerprint = of_node(write)

    def verdict(value, reason):
        return Classification(value, reason, fingerprint, detect.first_line_of(write))

    translator = live[TRANSLATOR][0]
    if translator is not None and _translator_translates(translator) and _translates(write):
        return verdict(
            Verdict.FIXED,
            "the fused FP8 KV write takes its locations from %s (SGLang 0.5.10, PR #19107)" % TRANSLATOR,
        )
    if live[METHOD][0] is None or fingerprint not in AFFECTED_METHOD:
        return verdict(Verdict.UNKNOWN, "%s is not the code of a release this hotfix knows" % write.name)
    if not _mentions(tree, SWA_WORDS):
        return verdict(
            Verdict.NOT_APPLICABLE,
            "this backend has no sliding-window KV pool (added to trtllm_mha in SGLang 0.5.9, PR #18970)",
        )
    init, problem = live["__init__"]
    callers = tuple(live[name][0] for name in CALLERS)
    if problem or init is None or of_node(init) not in AFFECTED_INIT:
        return verdict(Verdict.UNKNOWN, problem or "__init__ is not SGLang 0.5.9's (the one release with this bug)")
    if None in callers or tuple(of_node(c) for c in callers) not in AFFECTED_CALLERS:
        return verdict(Verdict.UNKNOWN, "forward_decode / forward_extend are not SGLang 0.5.9's")
    return verdict(
        Verdict.AFFECTED,
        "the fused FP8 KV write writes a sliding-window layer's K/V at full-pool indices (forward_batch."
        "out_cache_loc) into the sliding-window pool",
    )


HOTFIX = Hotfix(
    gpu_proof=(
        "none: on 0.5.9, the one release it repairs, trtllm_mha runs on Blackwell (SM100) only, and no "
        "Blackwell card was at hand"
    ),
    name="pr19107",
    upstream=UPSTREAM,
    summary="TRT-LLM MHA's fused FP8 KV write translates a sliding-window layer's locations into the "
    "sliding-window pool's",
    effect="the fused FP8 KV write of sliding-window layers now writes at the sliding-window pool's indices",
    distribution="sglang",
    target="sglang.srt.layers.attention.trtllm_mha_backend.%s.%s" % (CLASS_NAME, METHOD),
    classify=detect.walked_once(classify),
    edits=EDITS,
    new_names=NEW_NAMES,
    known_fingerprints=ReleaseTable(os.path.join(os.path.dirname(os.path.abspath(__file__)), "pr19107_releases.json")),
)
