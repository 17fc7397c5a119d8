"""sglang-hotfix-trtllm: upstream fixes of SGLang's TRT-LLM MHA backend (the records of
``sglang_hotfix_trtllm.records.catalog``), applied to installed SGLang releases.

Public API (each call is cheap to import: nothing here imports wrapt, torch or
SGLang until it is needed):

* ``apply()``  arm the import hook and patch the backend now if it is loaded.
* ``remove()`` restore every patched method (or turn it off in place under another
  wrapper) and disarm the hook.
* ``assess()`` the verdict on the installed SGLang, without importing it.
"""

__version__ = "0.16.3"


def apply():
    """Arm the hotfix in this process; patch at once if SGLang's backend is loaded.

    Idempotent: the method is wrapped at most once per class. Returns True when
    the hook is armed (False when disabled by SGLANG_HOTFIX_TRTLLM_DISABLE).
    """
    import sglang_hotfix_trtllm_autoload

    return sglang_hotfix_trtllm_autoload.install()


def remove():
    """Undo ``apply()``: put the original function objects back, disarm the hook.

    Returns the number of methods restored.
    """
    import sys

    import sglang_hotfix_trtllm_autoload

    sglang_hotfix_trtllm_autoload.uninstall()
    # Nothing can have been wrapped unless the patch module was loaded; asking
    # here, rather than importing it, keeps remove() from importing wrapt.
    patch = sys.modules.get(__name__ + ".patch")  # its remove_all restores the edits too
    edits = sys.modules.get(__name__ + ".code_edit")
    restored = patch.remove_all() if patch is not None else edits.remove_all() if edits is not None else 0
    state = sys.modules.get(__name__ + ".process_state")
    if state is not None:  # what `status --pid` reads of this process follows
        state.removed()
    metrics = sys.modules.get(__name__ + ".metrics")
    if metrics is not None:  # and what /metrics reads
        metrics.report_removed()
    return restored


def assess():
    """Assessments of the installed SGLang for every hotfix, without importing it."""
    from . import detect
    from .records import catalog

    return [detect.assess_installed(hotfix) for hotfix in catalog.HOTFIXES]
