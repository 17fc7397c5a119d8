"""Issue 49, item 1, as many trials in one process: in each, one thread imports the watched module,
three look it up with ``importlib.util.find_spec``, and four import small unrelated modules. A trial
is lost when the import ran the module without handing it to the engine (the hook's
``module_executed`` is counted). The finder under test is the ``.pth`` line given as ``argv[1]``;
``argv[2]`` is a folder holding a stand-in package ``sglang.srt.layers.attention`` whose watched
module defines nothing (the engine is not what is tested: only whether it is called), and
``argv[3]`` the number of trials; ``argv[4]``, if given, a variant of what the three other threads do:
``find_spec`` (the default), ``reload`` (``importlib.reload`` of the module once imported, which
looks it up again), or ``finder`` (a pass-through finder put first on ``sys.meta_path`` meanwhile).
Prints ``RESULT:{"trials": N, "lost": L}``."""

import importlib
import importlib.util
import json
import os
import sys
import threading

line, folder, trials = sys.argv[1], sys.argv[2], int(sys.argv[3])
variant = sys.argv[4] if len(sys.argv) > 4 else "find_spec"
sys.path.insert(0, folder)
exec(line)  # arms the finder, unless the interpreter's site did
import sglang_hotfix_trtllm.import_hook as hook  # noqa: E402 (after the finder is armed)


class PassThrough:
    """A finder of someone else's, answering None."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        return None


NAME = "sglang.srt.layers.attention.trtllm_mha_backend"
SMALL = sorted(name[:-3] for name in os.listdir(folder) if name.startswith("small_"))
handed = []
hook.module_executed = lambda module, name=None: handed.append(module)
importlib.import_module("sglang.srt.layers.attention")
lost = 0
for trial in range(trials):
    sys.modules.pop(NAME, None)
    for name in SMALL:
        sys.modules.pop(name, None)
    before = len(handed)
    start = threading.Barrier(8)

    def importing():
        start.wait()
        importlib.import_module(NAME)

    def looking_up():
        start.wait()
        for _ in range(3):
            if variant == "find_spec":
                importlib.util.find_spec(NAME)
            elif variant == "reload":
                module = sys.modules.get(NAME)
                if module is not None and not getattr(module.__spec__, "_initializing", False):
                    importlib.reload(module)
            elif _ == 0:
                sys.meta_path.insert(0, PassThrough)  # taken off after the trial (removing one meanwhile
                # would make a concurrent lookup skip the finder after it, ours or not)

    def importing_small(names):
        start.wait()
        for name in names:
            importlib.import_module(name)

    threads = [threading.Thread(target=importing)]
    threads += [threading.Thread(target=looking_up) for _ in range(3)]
    threads += [threading.Thread(target=importing_small, args=(SMALL[i::4],)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    sys.meta_path[:] = [finder for finder in sys.meta_path if finder is not PassThrough]
    module = sys.modules.get(NAME)
    if module is None or not any(executed is module for executed in handed[before:]):
        lost += 1
print("RESULT:" + json.dumps({"trials": trials, "lost": lost}))
