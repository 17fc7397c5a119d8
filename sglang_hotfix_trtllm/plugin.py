"""SGLang plugin entry point (group ``sglang.srt.plugins``, SGLang 0.5.11+).

SGLang calls ``register()`` in its launcher, engine and scheduler processes.
It arms the same import hook as the startup file, so whichever runs first
wins and the method is still wrapped once. It must not import the attention
module itself: importing it here would pull in torch and SGLang's backend in
processes that never use it.
"""


def register():
    import sglang_hotfix_trtllm_autoload

    sglang_hotfix_trtllm_autoload.install()
