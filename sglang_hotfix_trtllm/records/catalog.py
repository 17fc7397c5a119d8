"""The hotfixes this package carries. Standard library only.

The order is the order records are listed, applied and, on a shared kernel call
(``trtllm_kernel_site``), repaired in: the records' repairs there touch different
arguments (pr28144 the scales, pr31667 the query, pr17732 the K/V cache views; xqa_workspace
fmha_v2's workspace, by its own arguments; encoder_only_mask and xqa_draft_extend only report
where they cannot repair; flashinfer4161 and flashinfer4382, FlashInfer's own kernel bugs, always
only report)."""

from . import (
    encoder_only_mask,
    flashinfer4161,
    flashinfer4382,
    pr17732,
    pr19107,
    pr25103,
    pr26521,
    pr28144,
    pr31667,
    xqa_draft_extend,
    xqa_workspace,
)

HOTFIXES = (
    pr26521.HOTFIX,
    pr25103.HOTFIX,
    pr28144.HOTFIX,
    pr31667.HOTFIX,
    pr17732.HOTFIX,
    pr19107.HOTFIX,
    xqa_workspace.HOTFIX,
    encoder_only_mask.HOTFIX,
    xqa_draft_extend.HOTFIX,
    flashinfer4161.HOTFIX,
    flashinfer4382.HOTFIX,
)


def for_module(module_name):
    return [hotfix for hotfix in HOTFIXES if hotfix.module == module_name]
