"""Drive SGLang's real capture method on CPU and record everything it touched.

The backend object is a real ``TRTLLMHAAttnBackend`` created without its
GPU-bound ``__init__`` (``backend_without_model_runner``); its CUDA-graph
buffers come from SGLang's own ``init_cuda_graph_state``.
"""

import torch

from sglang_hotfix_trtllm.records.pr26521_probe import backend_without_model_runner

SPEC_INFO = object()  # the capture method only tests it against None

MAX_BS = 8
PAGE_SIZE = 16
MAX_CONTEXT_LEN = 512
NUM_DRAFT_TOKENS = 4


def make_backend(cls, step_id):
    return backend_without_model_runner(
        cls,
        device=torch.device("cpu"),
        step_id=step_id,
        max_bs=MAX_BS,
        max_num_tokens=MAX_BS * NUM_DRAFT_TOKENS,
        max_context_len=MAX_CONTEXT_LEN,
        page_size=PAGE_SIZE,
        num_draft_tokens=NUM_DRAFT_TOKENS,
    )


# The capture method's branches, by the names ``branches`` gives them (sorted).
BRANCH_NAMES = ["draft_decode", "draft_extend", "idle_draft_decode", "normal_decode", "target_verify"]


def branches(forward_mode_cls):
    """(name, forward_mode, spec_info, tokens per request) for all four branches."""
    return [
        ("draft_decode", forward_mode_cls.DECODE, SPEC_INFO, 1),
        ("normal_decode", forward_mode_cls.DECODE, None, 1),
        ("idle_draft_decode", forward_mode_cls.IDLE, SPEC_INFO, 1),
        ("target_verify", forward_mode_cls.TARGET_VERIFY, SPEC_INFO, NUM_DRAFT_TOKENS),
        ("draft_extend", forward_mode_cls.DRAFT_EXTEND, SPEC_INFO, NUM_DRAFT_TOKENS),
    ]


def inputs(bs, seed):
    generator = torch.Generator().manual_seed(seed)
    seq_lens = torch.randint(1, MAX_CONTEXT_LEN // 2, (bs,), generator=generator, dtype=torch.int64)
    req_pool_indices = torch.arange(bs, dtype=torch.int64)
    return req_pool_indices, seq_lens


def via_instance(backend, *args, **kwargs):
    """The bound-method call SGLang makes (goes through the class attribute)."""
    return backend.init_forward_metadata_capture_cuda_graph(*args, **kwargs)


def call(method, backend, bs, tokens_per_req, req_pool_indices, seq_lens, forward_mode, spec_info, style):
    """Call ``method(backend, ...)`` the way SGLang's callers do."""
    num_tokens = bs * tokens_per_req
    if style == "positional":
        return method(backend, bs, num_tokens, req_pool_indices, seq_lens, None, forward_mode, spec_info)
    # TRTLLMHAAttnMultiStepDraftBackend's style: first four positional, the rest by keyword.
    return method(
        backend,
        bs,
        num_tokens,
        req_pool_indices,
        seq_lens,
        encoder_lens=None,
        forward_mode=forward_mode,
        spec_info=spec_info,
    )


def _value(value):
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), tuple(value.shape), value.detach().cpu().tolist())
    if isinstance(value, (int, float, str, bool, type(None))):
        return value
    if hasattr(value, "__dict__"):
        return {k: _value(v) for k, v in sorted(vars(value).items())}
    return repr(value)


def snapshot(backend):
    """Every buffer and stored metadata the capture method can touch, as plain data."""
    state = {"forward_metadata": _value(backend.forward_metadata)}
    for name in ("decode_cuda_graph_metadata", "target_verify_metadata", "draft_extend_metadata"):
        table = getattr(backend, name)
        state[name] = {str(key): _value(value) for key, value in table.items()}
    return state


def differences(left, right, path=""):
    """Paths at which two snapshots differ."""
    if isinstance(left, dict) and isinstance(right, dict):
        out = []
        for key in sorted(set(left) | set(right)):
            if key not in left or key not in right:
                out.append("%s/%s missing on one side" % (path, key))
            else:
                out.extend(differences(left[key], right[key], "%s/%s" % (path, key)))
        return out
    return [] if left == right else [path]


def compare_with_oracle(cls, forward_mode_cls, oracle, unpatched):
    """Run the same capture sequences through the class's (patched) method, the
    class attribute called unbound, the oracle and the unpatched method, on
    fresh backends, and compare every snapshot with the oracle's.

    Returns (branches whose capture wrote state, mismatches, {branch: times unpatched differed}):
    the first says the comparison saw something on each branch (equal snapshots of untouched
    backends would prove nothing).
    """

    def through_class(backend, *args, **kwargs):  # TRTLLMHAAttnBackend.method(self, ...)
        return cls.init_forward_metadata_capture_cuda_graph(backend, *args, **kwargs)

    functions = {"patched": via_instance, "class": through_class, "oracle": oracle, "unpatched": unpatched}
    written, mismatches, unpatched_differs = set(), [], {}
    for step_id in (0, 1, 2):
        untouched = snapshot(make_backend(cls, step_id))
        for branch, forward_mode, spec_info, tokens in branches(forward_mode_cls):
            for style in ("positional", "keyword"):
                backends = {name: make_backend(cls, step_id) for name in functions}
                # A sequence of captures, largest batch first as SGLang's runner does.
                for bs in (8, 5, 3, 2, 1):
                    req_pool_indices, seq_lens = inputs(bs, seed=bs * 10 + step_id)
                    for name, backend in backends.items():
                        call(
                            functions[name],
                            backend,
                            bs,
                            tokens,
                            req_pool_indices,
                            seq_lens,
                            forward_mode,
                            spec_info,
                            style,
                        )
                    states = {name: snapshot(backend) for name, backend in backends.items()}
                    if differences(states["oracle"], untouched):
                        written.add(branch)
                    for name in ("patched", "class"):
                        diff = differences(states[name], states["oracle"])
                        if diff:
                            mismatches.append(
                                {
                                    "via": name,
                                    "branch": branch,
                                    "step": step_id,
                                    "bs": bs,
                                    "style": style,
                                    "paths": diff[:5],
                                }
                            )
                    if differences(states["unpatched"], states["oracle"]):
                        unpatched_differs[branch] = unpatched_differs.get(branch, 0) + 1
    return sorted(written), mismatches, unpatched_differs
