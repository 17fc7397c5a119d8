"""Assemble what the H200 machine lacks for the xqa_workspace proof (tests/gpu/test_workspace.py).

    python tools/workspace_carry.py                    # 0.5.19: fills .gpu/workspace/ (ignored)
    python tools/workspace_carry.py --release 0.5.22 --flashinfer-wheel REPACKED.whl

* ``wheels/``: the release's FlashInfer pin and apache-tvm-ffi 0.1.11 (cp312, 2.7 MB): all that
  ``import flashinfer`` and its fmha_v2 and XQA kernels need on the image (its JIT builds them
  there with the machine's nvcc). 0.5.19 to 0.5.21 pin FlashInfer 0.6.18 (py3, 18.3 MB), downloaded
  here; 0.5.22 pins 0.7.1, whose wheel (67 MB) is over the carry limit alone, so it is given
  repacked (``--flashinfer-wheel``: benchmarks' or a helper's repack, without the sources of kernels
  the run does not build; docs/gpu.md says what was kept);
* ``releases/<release>/``: the release's backend file, ``forward_batch_info.py`` (``ForwardMode``),
  ``runtime_context.py`` (``get_buffer``) and, from 0.5.22, ``mem_cache/layout/paged_view.py``:
  what ``tests/support/workspace_cases.load_module`` compiles; ``releases/0.5.23/``: 0.5.23's
  backend file, for the oracle. Taken from the release cache of the CPU tests
  (``.cache/releases``, ``tools/scan_releases.py``) and, for the other files, from the release's
  wheel (``fp8_cases.extra_file``).

Under the 64 MiB carry limit. On the device, with ``.gpu/workspace`` carried (and
``WORKSPACE_RELEASE=<release>`` for another release than 0.5.19): see docs/gpu.md (record
xqa_workspace).
"""

import argparse
import pathlib
import shutil
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tools")]
import gpu_carry  # noqa: E402

CARRY = REPO / ".gpu" / "workspace"
TVM_FFI = "apache-tvm-ffi==0.1.11"
FLASHINFER_PIN = {"0.5.19": "0.6.18", "0.5.20": "0.6.18", "0.5.21": "0.6.18", "0.5.22": "0.7.1"}
FIXED = "0.5.23"
PAGED_VIEW = "sglang/srt/mem_cache/layout/paged_view.py"
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
    parser = argparse.ArgumentParser()
    parser.add_argument("--release", choices=sorted(FLASHINFER_PIN), default="0.5.19")
    parser.add_argument("--flashinfer-wheel", help="a FlashInfer wheel to carry instead of downloading the pin")
    args = parser.parse_args()
    pin = "flashinfer_python==%s" % FLASHINFER_PIN[args.release]
    if args.flashinfer_wheel and FLASHINFER_PIN[args.release] not in pathlib.Path(args.flashinfer_wheel).name:
        parser.error("%s is not FlashInfer %s, the pin of SGLang %s" % (args.flashinfer_wheel, pin, args.release))
    shutil.rmtree(CARRY, ignore_errors=True)
    wheels = CARRY / "wheels"
    wheels.mkdir(parents=True)
    gpu_carry.download(TVM_FFI, wheels)
    if args.flashinfer_wheel:
        shutil.copyfile(args.flashinfer_wheel, wheels / pathlib.Path(args.flashinfer_wheel).name)
    else:
        gpu_carry.download(pin, wheels)
    members = (BACKEND, FORWARD_BATCH_INFO, RUNTIME_CONTEXT)
    if args.release == "0.5.22":  # its forward_extend reads K/V through paged_kv_view
        members += (PAGED_VIEW,)
    for release, members in ((args.release, members), (FIXED, (BACKEND,))):
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
