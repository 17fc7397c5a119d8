"""The sliding-window KV pool record (pr25103) on real SGLang objects, on CPU.

* ``load_backend_module(release_dir)``: one release's whole
  ``trtllm_mha_backend`` module, compiled from that release's file (its own
  ``__init__`` and helpers, with their line numbers) over the installed
  SGLang's other modules. The one thing replaced is the base class: FlashInfer's
  backend, whose ``__init__`` needs flashinfer and a GPU, becomes a base that
  accepts the same arguments and sets nothing (it sets none of the attributes
  this record is about: ``use_sliding_window_kv_pool`` and ``_swa_kv_pool`` are
  only set by the TRT-LLM class in 0.5.9 to 0.5.12.post1).
* ``upstream(release_dir)``: SGLang 0.5.13's ``_resolve_swa_kv_pool`` and the
  helpers that read its result, compiled from the 0.5.13 file (the oracle).
* ``CASES``: model runners holding SGLang's real pools (``SWAKVPool``,
  ``MHATokenToKVPool``, the allocators) for a target and for each kind of draft.
* ``reads(backend, functions, runner)``: what a decode step of that backend
  reads, layer by layer: the pool chosen, the page table, the cache location,
  and the key rows behind the page table.
"""

import ast
import enum
import importlib.machinery
import types
import typing

import torch

import isolated_release
from sglang_hotfix_trtllm.records import pr25103_probe

MODULE_NAME = "sglang.srt.layers.attention.trtllm_mha_backend"
BACKEND = "sglang/srt/layers/attention/trtllm_mha_backend.py"
SPEC_INFO = "sglang/srt/speculative/spec_info.py"
BASE = "_FlashInferBaseStandIn"
UPSTREAM_FUNCTIONS = ("_resolve_swa_kv_pool", "_maybe_translate_swa", "_get_layer_cache_loc", "_get_layer_page_table")


class _FlashInferBaseStandIn:
    def __init__(self, model_runner, skip_prefill=False, kv_indptr_buf=None, kv_last_page_len_buf=None):
        pass


def load_backend_module(release_dir):
    path = release_dir / BACKEND
    tree = ast.parse(path.read_text(encoding="utf-8"))
    backend = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TRTLLMHAAttnBackend")
    backend.bases = [ast.copy_location(ast.Name(id=BASE, ctx=ast.Load()), backend.bases[0])]
    module = types.ModuleType(MODULE_NAME)
    module.__file__ = str(path)
    module.__spec__ = importlib.machinery.ModuleSpec(MODULE_NAME, None, origin=str(path))
    module.__dict__[BASE] = _FlashInferBaseStandIn
    isolated_release.run_as_module(compile(tree, str(path), "exec"), module)
    return module


def upstream(release_dir):
    """0.5.13's functions, by name, compiled from its file, with the installed
    SGLang's SWAKVPool as the class they test for."""
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

    path = release_dir / BACKEND
    tree = ast.parse(path.read_text(encoding="utf-8"))
    backend = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TRTLLMHAAttnBackend")
    functions = [n for n in backend.body if isinstance(n, ast.FunctionDef) and n.name in UPSTREAM_FUNCTIONS]
    assert sorted(f.name for f in functions) == sorted(UPSTREAM_FUNCTIONS)
    future = ast.ImportFrom(module="__future__", names=[ast.alias(name="annotations")], level=0)
    holder = ast.ClassDef(name="Upstream", bases=[], keywords=[], body=functions, decorator_list=[])
    if "type_params" in ast.ClassDef._fields:
        holder.type_params = []
    module = ast.fix_missing_locations(ast.Module(body=[future, holder], type_ignores=[]))
    namespace = {"torch": torch, "Optional": typing.Optional, "SWAKVPool": SWAKVPool}
    exec(compile(module, str(path), "exec"), namespace)
    return namespace["Upstream"]


def speculative_algorithm(release_dir):
    """That release's SpeculativeAlgorithm enum, from its spec_info.py."""
    path = release_dir / SPEC_INFO
    tree = ast.parse(path.read_text(encoding="utf-8"))
    enum_class = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SpeculativeAlgorithm")
    future = [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "__future__"]
    namespace = {
        "Enum": enum.Enum,
        "IntEnum": enum.IntEnum,
        "auto": enum.auto,
        "TYPE_CHECKING": False,
        **{name: getattr(typing, name) for name in ("List", "Optional", "Tuple", "Type", "Union")},
    }
    exec(compile(ast.Module(body=future + [enum_class], type_ignores=[]), str(path), "exec"), namespace)
    return namespace["SpeculativeAlgorithm"]


# --------------------------------------------------------------------------
# Model runners with real pools

TARGET_SWA_LAYERS, TARGET_FULL_LAYERS = [0, 2], [1, 3]  # layer 0 slides, as in gpt-oss
HEADS, HEAD_DIM, SIZE, SIZE_SWA = 2, 8, 64, 32
REQUEST_LENGTHS = (5, 7)


def _filled(pool):
    """Give every key row of the pool a value of its own, so a read shows which slot it came from."""
    pools = [pool.full_kv_pool, pool.swa_kv_pool] if hasattr(pool, "full_kv_pool") else [pool]
    offset = 0
    for inner in pools:
        for buffer in inner.k_buffer:
            rows = buffer.shape[0]
            buffer.copy_((torch.arange(rows, dtype=torch.float32) + offset).view(rows, 1, 1).expand_as(buffer))
            offset += 1000
    return pool


def _swa_pool(swa_layers, full_layers):
    return _filled(pr25103_probe.swa_pool(torch, swa_layers, full_layers, size=SIZE, size_swa=SIZE_SWA))


def _plain_pool(layers):
    return _filled(pr25103_probe.plain_pool(torch, layers, size=SIZE))


class World:
    """A target's allocator and pools, with two requests allocated through it."""

    def __init__(self, target_is_swa=True):
        from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.swa_memory_pool import SWATokenToKVPoolAllocator

        if target_is_swa:
            self.target_pool = _swa_pool(TARGET_SWA_LAYERS, TARGET_FULL_LAYERS)
            self.allocator = SWATokenToKVPoolAllocator(SIZE, SIZE_SWA, 1, torch.float32, "cpu", self.target_pool, False)
        else:
            self.target_pool = _plain_pool(4)
            self.allocator = TokenToKVPoolAllocator(SIZE, torch.float32, "cpu", self.target_pool, False)
        # A request whose window has slid: its sliding-window slots go back to the
        # allocator, its full slots stay; from here on the two index spaces differ.
        # (The allocator hands out freed slots after fresh ones: a filler takes
        # the fresh sliding-window slots, so the requests get the freed ones.)
        slid = self.allocator.alloc(20)
        if target_is_swa:
            self.allocator.free_swa(slid)
        self.allocator.alloc(SIZE_SWA - 20)
        width = max(REQUEST_LENGTHS) + 1
        self.req_to_token = torch.zeros(len(REQUEST_LENGTHS), width, dtype=torch.int32)
        for row, length in enumerate(REQUEST_LENGTHS):
            self.req_to_token[row, :length] = self.allocator.alloc(length).to(torch.int32)
        self.out_cache_loc = self.allocator.alloc(len(REQUEST_LENGTHS))  # the decode step's new tokens

    def runner(self, pool, draft, algorithm, layers):
        return types.SimpleNamespace(
            token_to_kv_pool=pool,
            token_to_kv_pool_allocator=self.allocator,
            is_draft_worker=draft,
            spec_algorithm=algorithm,
            req_to_token_pool=types.SimpleNamespace(req_to_token=self.req_to_token),
            model_config=types.SimpleNamespace(context_len=1024, hidden_size=HEADS * HEAD_DIM),
            kv_cache_dtype=torch.float32,
            dtype=torch.float32,
            page_size=1,
            device="cpu",
            server_args=types.SimpleNamespace(speculative_eagle_topk=1, speculative_num_draft_tokens=4),
            layers=layers,
        )


def cases(release_dir_of_0_5_11):
    """name -> (world, model runner) for every situation the record must get right."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    algorithm_without_frozen_kv = speculative_algorithm(release_dir_of_0_5_11)
    assert not hasattr(algorithm_without_frozen_kv.EAGLE3, "is_frozen_kv_mtp")
    built = {}
    world = World()
    built["target"] = world, world.runner(world.target_pool, False, SpeculativeAlgorithm.EAGLE3, [0, 1, 2, 3])
    world = World()
    built["eagle3_draft"] = world, world.runner(_plain_pool(1), True, SpeculativeAlgorithm.EAGLE3, [0])
    world = World()
    built["eagle3_draft_before_0_5_12"] = (
        world,
        world.runner(_plain_pool(1), True, algorithm_without_frozen_kv.EAGLE3, [0]),
    )
    world = World()
    own = _swa_pool([1], [0])  # its own layout: its layer 0 is a full-attention layer
    own.register_mapping(world.target_pool.full_to_swa_index_mapping)  # as the shared allocator maps its tokens
    built["mtp_draft_own_swa_pool"] = world, world.runner(own, True, SpeculativeAlgorithm.EAGLE, [0, 1])
    world = World()
    built["frozen_kv_mtp_draft"] = world, world.runner(_plain_pool(1), True, SpeculativeAlgorithm.FROZEN_KV_MTP, [0])
    world = World(target_is_swa=False)
    built["no_swa_model"] = world, world.runner(world.target_pool, False, SpeculativeAlgorithm.NONE, [0, 1, 2, 3])
    world = World(target_is_swa=False)
    built["no_swa_model_draft"] = world, world.runner(_plain_pool(1), True, SpeculativeAlgorithm.EAGLE3, [0])
    return built


# --------------------------------------------------------------------------
# What a decode step reads


def reads(backend, functions, world, runner):
    """Per layer of ``runner``: the page table, the cache location of the new
    token, and the key rows the page table points at in the runner's pool.
    ``functions`` holds the helpers to use (the release's, or 0.5.13's) and
    ``backend`` the state they read (``_swa_kv_pool`` and the flag)."""
    page_table = world.req_to_token[:, : max(REQUEST_LENGTHS)]
    backend.forward_metadata = types.SimpleNamespace(
        page_table=page_table, swa_page_table=functions._maybe_translate_swa(backend, page_table)
    )
    batch = types.SimpleNamespace(out_cache_loc=world.out_cache_loc, out_cache_loc_swa=None)
    result = {}
    for layer_id in runner.layers:
        layer = types.SimpleNamespace(layer_id=layer_id)
        table = functions._get_layer_page_table(backend, layer, batch).to(torch.int64)
        keys = runner.token_to_kv_pool.get_key_buffer(layer_id)
        loc = getattr(functions, "_get_layer_cache_loc", None)
        result[layer_id] = {
            "page_table": table,
            "cache_loc": None if loc is None else _cache_loc(loc, backend, layer, batch),
            "keys": _gathered(keys, table),
        }
    return result


def _gathered(keys, table):
    """The key rows the page table points at, or, where it points past the
    buffer (a read out of bounds: garbage or a crash on the GPU), a note saying so."""
    slots = torch.cat([table[row, :length] for row, length in enumerate(REQUEST_LENGTHS)])
    if int(slots.max()) >= keys.shape[0]:
        return "out of bounds: slot %d of %d rows" % (int(slots.max()), keys.shape[0])
    return keys[slots, 0, 0]


def same(a, b):
    """Tensors equal, or the same note."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return torch.equal(a, b)
    return a == b


def _cache_loc(function, backend, layer, batch):
    """``_get_layer_cache_loc`` as the release declares it: 0.5.10 takes the
    new tokens' locations, 0.5.11 on the ForwardBatch."""
    import inspect

    takes_batch = list(inspect.signature(function).parameters)[2] == "forward_batch"
    return function(backend, layer, batch if takes_batch else batch.out_cache_loc).to(torch.int64)
