"""What a changed ``__code__`` costs a call on this interpreter (issue 47, item 9): Python 3.13 resets
a function's version when its code is assigned and does not specialise calls to it again (CPython's
``func_set_code``). One function untouched, one whose code object was replaced by an identical
compile, each called positionally and with a keyword argument (SGLang's ``AttentionBackend.forward``
passes ``**kwargs``), 200,000 calls a repeat, medians of 15 repeats, in nanoseconds a call (the loop
included: compare the two rows of one style).

    for v in 3.10 3.11 3.12 3.13; do python$v benchmarks/code_change_call.py; done
"""

import statistics
import sys
import timeit

SOURCE = "def f(a, b, c, d, e):\n    return a\n"
CALLS = 200000


def _function():
    namespace = {}
    exec(compile(SOURCE, "f.py", "exec"), namespace)
    return namespace["f"]


def _loops(function):
    def positional():
        for _ in range(CALLS):
            function(1, 2, 3, 4, 5)

    def keyword():
        for _ in range(CALLS):
            function(1, 2, 3, 4, e=5)

    return {"positional": positional, "keyword": keyword}


def main():
    untouched, changed = _function(), _function()
    changed.__code__ = compile(SOURCE, "f.py", "exec").co_consts[0]  # as the hotfix installs its compile
    results = {}
    for name, function in (("untouched", untouched), ("code changed", changed)):
        for style, loop in _loops(function).items():
            loop()
            results[(name, style)] = statistics.median(timeit.repeat(loop, number=1, repeat=15)) / CALLS * 1e9
    print(
        "Python %s: positional %+.1f ns a call, keyword %+.1f ns (untouched %.1f / %.1f ns)"
        % (
            sys.version.split()[0],
            results[("code changed", "positional")] - results[("untouched", "positional")],
            results[("code changed", "keyword")] - results[("untouched", "keyword")],
            results[("untouched", "positional")],
            results[("untouched", "keyword")],
        )
    )


if __name__ == "__main__":
    main()
