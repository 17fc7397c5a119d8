"""pr28144 under ``torch.compile`` (default settings), on CPU: code that reaches the wrapped
``forward_decode`` compiles as without the hotfix and gives upstream's kernel arguments.

0.5.0 raised ``AssertionError: Guard failed on the same frame it was created`` here (issue 28,
item 6): TorchDynamo guarded on the gate it had just seen change. Now a call that needs no repair
is SGLang's method alone (traced as without the hotfix), and one that needs a repair runs its noted
call outside the trace (``torch.compiler.disable``: a graph break), its first one arming the gate.
"""

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


def _oracle(release, case):
    release_dir = release_selection.release_dir(release)
    fixed_dir = release_selection.release_dir(fp8_cases.FIXED_RELEASE)
    return fp8_cases.kernel_calls(fp8_cases.upstream_module(release_dir, fixed_dir), case)


@pytest.mark.parametrize("prefix", CASES)
@pytest.mark.parametrize("release", RELEASES)
def test_compiled_code_reaching_the_wrapped_method_gets_upstreams_arguments(release, prefix):
    case = _case(release, prefix)
    module = fp8_cases.load_backend_module(release_selection.release_dir(release))
    patch.wrap(pr28144.HOTFIX, module, detect.assess_module(pr28144.HOTFIX, module))
    torch._dynamo.reset()
    try:
        compiled = torch.compile(lambda: fp8_cases.kernel_calls(module, case))
        first, again = compiled(), compiled()  # the first arms the gate (where a repair is needed)
    finally:
        patch.remove_all()
        torch._dynamo.reset()
    assert first == again == _oracle(release, case)
