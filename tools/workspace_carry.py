"""Assemble what the H200 machine lacks for the xqa_workspace proof (tests/gpu/test_workspace.py).

    python tools/workspace_carry.py        # fills .gpu/workspace/ (ignored: /.gpu/ in .gitignore)

* ``wheels/``: FlashInfer 0.6.18 (the pin of SGLang 0.5.19 to 0.5.21; py3, 18.3 MB) and
  apache-tvm-ffi 0.1.11 (cp312, 2.7 MB): all that ``import flashinfer`` and its fmha_v2 and XQA
  kernels need on the image (its JIT builds them there with the machine's nvcc);
* ``releases/0.5.19/``: SGLang 0.5.19's backend file, ``forward_batch_info.py`` (``ForwardMode``)
  and ``runtime_context.py`` (``get_buffer``), what ``tests/support/workspace_cases.load_module``
  compiles; ``releases/0.5.23/``: 0.5.23's backend file, for the oracle. Taken from the release
  cache of the CPU tests (``.cache/releases``, ``tools/scan_releases.py``) and, for
  ``runtime_context.py``, from the release's wheel (``fp8_cases.extra_file``).

About 21 MB in all, under the 64 MiB carry limit. On the device, with ``.gpu/workspace`` carried:
see docs/gpu.md (record xqa_workspace).
"""

import pathlib
import shutil
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tools")]
import gpu_carry  # noqa: E402

CARRY = REPO / ".gpu" / "workspace"
WHEELS = ["flashinfer_python==0.6.18", "apache-tvm-ffi==0.1.11"]
RELEASE, FIXED = "0.5.19", "0.5.23"
BACKEND = "sglang/srt/layers/attention/trtllm_mha_backend.py"
FORWARD_BATCH_INFO = "sglang/srt/model_executor/forward_batch_info.py"
RUNTIME_CONTEXT = "sglang/srt/runtime_context.py"


def release_file(release, member):
    """``member`` of SGLang ``release``: from the CPU tests' release cache, or its wheel."""
    sys.path[:0] = [str(REPO / "tests" / "support"), str(REPO / "tests")]
    import conftest
    import fp8_cases

    return fp8_cases.extra_file(conftest.CACHE / "releases" / release, member)


def main():
    wheels = CARRY / "wheels"
    shutil.rmtree(wheels, ignore_errors=True)
    wheels.mkdir(parents=True)
    for spec in WHEELS:
        gpu_carry.download(spec, wheels)
    for release, members in ((RELEASE, (BACKEND, FORWARD_BATCH_INFO, RUNTIME_CONTEXT)), (FIXED, (BACKEND,))):
        for member in members:
            target = CARRY / "releases" / release / member
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(release_file(release, member), target)
    files = sorted(p for p in CARRY.rglob("*") if p.is_file())
    for path in files:
        print("%8.2f MB  %s" % (path.stat().st_size / 1e6, path.relative_to(REPO)))
    total = sum(p.stat().st_size for p in files)
    print("%d files, %.1f MB (%.1f MiB)" % (len(files), total / 1e6, total / 2**20))


if __name__ == "__main__":
    main()
