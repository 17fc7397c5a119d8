"""Issue 36, item 7, as one interleaving, made deterministically: thread A looks a watched module up
(importlib's ``_find_spec`` holds the global import lock while it asks each meta-path finder, and
the ``.pth`` finder then imports the startup module) while thread B, here the main thread, is
importing the startup module itself (``apply()``, SGLang's plugin entry point): B holds that
module's lock (``_find_and_load``'s first step) and next needs the global lock (its ``_find_spec``).
A finder that imports while holding the global lock waits for B, which waits for A: the process
hangs. Prints ``RESULT:done`` when both finish (the caller's timeout catches the hang).

Run as ``python import_lock_probe.py LINE MODULE`` with ``LINE`` the ``.pth`` line (armed here if
the interpreter's site did not arm it) and ``MODULE`` the module B is importing: the startup module
(the ``.pth`` finder's own import), or ``sglang_hotfix_trtllm`` (``apply()``'s package, which the
startup module's finder imports the hook from; the startup module is then loaded first)."""

import _imp
import importlib._bootstrap as bootstrap
import sys
import threading
import time

line = sys.argv[1]
exec(line)  # the .pth line: arms the finder (once)
NAME = "sglang.srt.layers.attention.trtllm_mha_backend"
importing = sys.argv[2]
if importing != "sglang_hotfix_trtllm_autoload":
    import sglang_hotfix_trtllm_autoload  # noqa: F401 (loaded: A's finder imports the package next)
assert importing not in sys.modules
module_lock = bootstrap._get_module_lock(importing)
module_lock.acquire()  # B: _find_and_load's first step for the startup module


def lookup():
    bootstrap._find_spec(NAME, None)  # A: as importlib does for an import or util.find_spec


a = threading.Thread(target=lookup, daemon=True)
a.start()
deadline = time.monotonic() + 10
while not _imp.lock_held() and time.monotonic() < deadline:  # A is inside the lookup
    time.sleep(0.0005)
time.sleep(0.3)  # A reaches the finder's import of the startup module
_imp.acquire_lock()  # B: _find_and_load's next step (_find_spec) takes the global lock
_imp.release_lock()
module_lock.release()
a.join(30)
print("RESULT:" + ('"hung"' if a.is_alive() else '"done"'))
