"""pr28144 under ``torch.compile`` (default settings), on CPU: code that reaches the wrapped
``forward_decode`` compiles as without the hotfix and gives upstream's kernel arguments.

0.5.0 raised ``AssertionError: Guard failed on the same frame it was created`` here (issue 28,
item 6): TorchDynamo guarded on the gate it had just seen change. Now a call that needs no repair
is SGLang's method alone behind a graph break (the wrapper is never inlined), and one that needs a repair runs its noted
call outside the trace (``torch.compiler.disable``: a graph break), its first one arming the gate.
"""

import warnings

import pytest
import torch

import fp8_cases
import release_selection
from sglang_hotfix_trtllm import detect, patch
from sglang_hotfix_trtllm.records import pr28144

RELEASES = ("0.5.10", "0.5.12")
# BF16 without scales (nothing to repair), BF16 under a checkpoint K scale and FP8 with scales
# (both repaired), on XQA: strided queries, as Llama-family models pass them.
CASES = ("bf16-absent", "bf16-float", "fp8-float")


def _case(release, prefix):
    name = prefix + "-xqa-no-write-decode-strided"
    return fp8_cases.cases(release)[name]


def _recorded(module, call):
    """What the module's recorded kernel received from ``call()``, as plain data (read outside
    the compiled code: the recorder is the harness's, not SGLang's)."""
    log = fp8_cases._LOGS[module]
    del log[:]
    call()
    calls = [(name, fp8_cases.plain(arguments)) for name, arguments in log]
    del log[:]
    return calls


@pytest.mark.parametrize("prefix", CASES)
@pytest.mark.parametrize("release", RELEASES)
def test_compiled_code_reaching_the_wrapped_method_gets_upstreams_arguments(release, prefix):
    case = _case(release, prefix)
    release_dir = release_selection.release_dir(release)
    oracle = fp8_cases.upstream_module(release_dir, release_selection.release_dir(fp8_cases.FIXED_RELEASE))
    expected = _recorded(oracle, _decode(oracle, case))
    module = fp8_cases.load_backend_module(release_dir)
    patch.wrap(pr28144.HOTFIX, module, detect.assess_module(pr28144.HOTFIX, module))
    torch._dynamo.reset()
    try:
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            compiled = torch.compile(_decode(module, case))
            first, again = _recorded(module, compiled), _recorded(module, compiled)  # the first arms the gate
    finally:
        patch.remove_all()
        torch._dynamo.reset()
    assert first == again == expected
    # The site's check of whether TorchDynamo compiles here is no untraceable builtin (0.11.0's
    # first draft made TorchDynamo print "does not know how to trace the builtin").
    assert [
        str(w.message)[:80] for w in said if "sglang_hotfix" in str(w.filename) or "trace the builtin" in str(w.message)
    ] == []


def _traceable_flashinfer():
    """A kernel TorchDynamo traces through (FlashInfer's is opaque to it today, but a traced one
    is what would inline SGLang's method around the wrapper): its output depends on the query and
    both scales."""

    def kernel(query, bmm1_scale, bmm2_scale, **kwargs):
        return query.float() * bmm1_scale * bmm2_scale

    return fp8_cases.flashinfer_of(kernel)


def _decode(module, case):
    return fp8_cases.decode_call(module, case, seed=1)


@pytest.mark.parametrize("prefix", CASES)
def test_a_traced_kernel_does_not_let_compiled_code_skip_the_wrapper(prefix):
    """wrapt forwards ``__class__``, so TorchDynamo took the wrapper for SGLang's own function and
    inlined that, skipping the repair (and, once the gate was in, failed a guard on it). The
    wrapper now says what it is: TorchDynamo calls it (a graph break) and the result is upstream's."""
    release = "0.5.12"
    case = _case(release, prefix)
    release_dir = release_selection.release_dir(release)
    oracle = fp8_cases.upstream_module(release_dir, release_selection.release_dir(fp8_cases.FIXED_RELEASE))
    oracle.flashinfer = _traceable_flashinfer()
    expected = _decode(oracle, case)()
    module = fp8_cases.load_backend_module(release_dir)
    module.flashinfer = _traceable_flashinfer()
    patch.wrap(pr28144.HOTFIX, module, detect.assess_module(pr28144.HOTFIX, module))
    torch._dynamo.reset()
    try:
        compiled = torch.compile(_decode(module, case))
        first, again = compiled(), compiled()
    finally:
        patch.remove_all()
        torch._dynamo.reset()
    assert torch.equal(first, expected) and torch.equal(again, expected)
