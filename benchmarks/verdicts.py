"""Every record's verdict from one parse of a release's backend file: the analysis each process
makes when it first imports SGLang's ``trtllm_mha_backend`` (the file read, parsed once, each
record's ``classify`` on the shared tree), without the wrapping. Wall clock, the median of
``--runs`` passes per release, in milliseconds.

    .venv/bin/python benchmarks/verdicts.py 0.5.12 0.5.19 0.5.22 0.5.23

The releases' files are fetched as the test suite fetches them (``tools/scan_releases.fetch``,
into ``.cache/releases`` or ``$SGLANG_HOTFIX_TEST_CACHE/releases``; a release already there is
read from there). To compare two versions of the plugin, run each in its own process with its
code first on the path and the environment's ``.pth`` files skipped, interleaved (as
``site_call.py`` says):

    PYTHONPATH=CHECKOUT:.venv/lib/python3.11/site-packages .venv/bin/python -S benchmarks/verdicts.py ...
"""

import argparse
import json
import os
import pathlib
import statistics
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
CACHE = pathlib.Path(os.environ.get("SGLANG_HOTFIX_TEST_CACHE", REPO / ".cache"))
sys.path.insert(0, str(REPO / "tools"))

import scan_releases  # noqa: E402


def verdicts_ms(release, runs):
    from sglang_hotfix_trtllm import detect
    from sglang_hotfix_trtllm.records import catalog

    folder = scan_releases.fetch(CACHE / "releases", release)
    files = {hotfix.name: folder / scan_releases.module_file(hotfix) for hotfix in catalog.HOTFIXES}
    texts = {path: path.read_text(encoding="utf-8") for path in set(files.values())}
    times = []
    for run in range(runs):
        started = time.perf_counter()
        with detect.shared_parses():
            for hotfix in catalog.HOTFIXES:
                path = files[hotfix.name]  # another label each pass: nothing kept from the pass before
                detect.assess_source(hotfix, "%s#%d" % (path, run), texts[path])
        times.append(time.perf_counter() - started)
    return round(statistics.median(times) * 1000, 1)


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("releases", nargs="+")
    parser.add_argument("--runs", type=int, default=7)
    options = parser.parse_args(argv)
    import sglang_hotfix_trtllm

    result = {release: verdicts_ms(release, options.runs) for release in options.releases}
    print(json.dumps({"plugin": sglang_hotfix_trtllm.__version__, "verdicts_ms": result}))


if __name__ == "__main__":
    main()
