"""Where a decode step's time goes, from py-spy's raw output (``py-spy record -f raw``) of
``tests/gpu/decode_step_anchor_worker.py --spin``: of the samples whose stack holds the worker's
``decode_step``, the share of each function on the stack (inclusive, line numbers dropped) and of
each innermost Python line. Run on the device machine: the raw files are too big to come back.

    python3 tools/spy_summary.py /tmp/spy.txt > $OUT/summary.txt
"""

import collections
import re
import sys


def summary(path, top=30):
    total, inner, inclusive = 0, collections.Counter(), collections.Counter()
    with open(path, encoding="utf-8", errors="replace") as lines:
        for line in lines:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            frames = stack.split(";")
            if not any("decode_step (" in frame for frame in frames):
                continue
            samples = int(count)
            total += samples
            python = [frame for frame in frames if ".py" in frame]
            inner[re.sub(r"\(.*/", "(", python[-1]) if python else "?"] += samples
            for name in {re.sub(r":\d+\)", ")", re.sub(r"\(.*/", "(", frame)) for frame in frames}:
                inclusive[name] += samples
    out = ["samples in decode_step %d" % total, "-- inclusive"]
    out += ["%5.1f%% %s" % (100.0 * n / total, name[:110]) for name, n in inclusive.most_common(top)]
    out += ["-- innermost python frame"]
    out += ["%5.1f%% %s" % (100.0 * n / total, name[:110]) for name, n in inner.most_common(top)]
    return "\n".join(out)


if __name__ == "__main__":
    print(summary(sys.argv[1]))
