#!/usr/bin/env python3
"""Repack the FlashInfer 0.7.1 wheel down to what two SM90 JIT kernels need.

    python3 tools/repack_flashinfer.py ORIGINAL_WHEEL OUT_DIR [--extra-keep FILE] [--keep-list-out FILE]

Kernels kept buildable (JIT, nvcc, SM90):
  * XQA decode   flashinfer.jit.xqa.gen_xqa_module  (trtllm_batch_decode_with_kv_cache,
                 backend "xqa"; bf16/fp16 Q, bf16/fp16/fp8-e4m3 KV)
  * fmha_v2      flashinfer.jit.attention.modules.gen_fmha_v2_module
                 (trtllm_fmha_v2_prefill; code generated from jinja templates)

Keep rule (everything else under flashinfer/data/ is dropped):
  1. every file NOT under flashinfer/data/  (all .py files of the package, its
     json/md/cu/typed package data, top-level build_backend.py/build_utils.py,
     dist-info; RECORD is regenerated);
  2. under flashinfer/data/, the roots in KEEP_ROOTS below (whole dirs/files);
  3. the textual #include closure (every `#include "..."`/`<...>` line, macro
     conditions ignored, every match on the JIT include path) of SEEDS;
  4. optionally the union with --extra-keep (one package-relative path per line,
     e.g. the nvcc -M closure); each such path must exist in the wheel.
Only the Python standard library is used. Output: OUT_DIR/<same wheel filename>.
"""

import argparse
import base64
import hashlib
import posixpath
import re
import sys
import zipfile

PKG = "flashinfer/"
DATA = "flashinfer/data/"

# Whole directories (trailing '/') or single files under flashinfer/data/.
KEEP_ROOTS = [
    "csrc/xqa/",  # XQA kernel sources + headers (all variants)
    "csrc/fmha_v2/",  # fmha_v2 headers + jinja templates (templates/)
    "csrc/fmha_v2_run.cu",  # copied by gen_fmha_v2_module into generated dir
    "csrc/fmha_v2_jit_binding.cu",  # idem
    "csrc/flashinfer_xqa_binding.cu",
    "csrc/tvm_ffi_utils.h",
    "include/",  # flashinfer headers (-isystem / -I); small
    "cccl/",  # vendored CCCL, first on the -I path; kept whole
    # as margin against CUDA-version-dependent includes
    "spdlog/",  # on the -isystem path of every JIT module; small
    "cutlass/include/cutlass/arch/arch.h",  # read by compilation_context.cutlass_supports_sm107()
    "build_backend.py",
    "build_utils.py",
]

# Seeds of the textual include closure (relative to flashinfer/data/).
SEEDS_PREFIX = ["csrc/xqa/", "csrc/fmha_v2/"]
SEEDS = [
    "csrc/fmha_v2_run.cu",
    "csrc/fmha_v2_jit_binding.cu",
    "csrc/flashinfer_xqa_binding.cu",
]
# Include search dirs used by the two JIT specs (jit/cpp_ext.py build_common_cflags
# + fmha_v2 extra -I), relative to flashinfer/data/.
SEARCH_DIRS = [
    "csrc/fmha_v2",
    "include",
    "cccl/cub",
    "cccl/libcudacxx/include",
    "cccl/thrust",
    "csrc",
    "cutlass/include",
    "cutlass/tools/util/include",
    "spdlog/include",
]
INCLUDE_RE = re.compile(rb'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)


def textual_closure(names, read):
    """names: set of data-relative file paths in the wheel. read(rel)->bytes."""
    todo = [n for n in names if any(n.startswith(p) for p in SEEDS_PREFIX)]
    todo += [s for s in SEEDS if s in names]
    seen = set()
    unresolved = set()
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        for m in INCLUDE_RE.finditer(read(f)):
            inc = m.group(1).decode("utf-8", "replace").strip()
            cands = [posixpath.normpath(posixpath.join(posixpath.dirname(f), inc))]
            cands += [posixpath.normpath(posixpath.join(d, inc)) for d in SEARCH_DIRS]
            hit = [c for c in cands if c in names]
            if not hit:
                unresolved.add(inc)  # system/CUDA/tvm-ffi header or jinja placeholder
            todo.extend(c for c in hit if c not in seen)
    return seen, unresolved


def record_hash(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("wheel")
    ap.add_argument("out_dir")
    ap.add_argument("--extra-keep", help="file with extra package-relative paths to keep")
    ap.add_argument("--keep-list-out", help="write the kept flashinfer/data/ files here")
    a = ap.parse_args()

    import os

    zin = zipfile.ZipFile(a.wheel)
    infos = [i for i in zin.infolist() if not i.is_dir()]
    dist_info = [i.filename.split("/")[0] for i in infos if i.filename.split("/")[0].endswith(".dist-info")][0]
    record_name = f"{dist_info}/RECORD"

    data_names = {i.filename[len(DATA) :] for i in infos if i.filename.startswith(DATA)}
    keep_data = set()
    for n in data_names:
        for r in KEEP_ROOTS:
            if (r.endswith("/") and n.startswith(r)) or n == r:
                keep_data.add(n)
    closure, unresolved = textual_closure(data_names, lambda rel: zin.read(DATA + rel))
    keep_data |= closure
    if a.extra_keep:
        for line in open(a.extra_keep):
            p = line.strip()
            if not p or p.startswith("#"):
                continue
            p = p[len(PKG) :] if p.startswith(PKG) else p
            assert p.startswith("data/"), p
            rel = p[len("data/") :]
            if rel not in data_names:
                sys.exit(f"--extra-keep path not in wheel: {p}")
            keep_data.add(rel)

    os.makedirs(a.out_dir, exist_ok=True)
    out_path = os.path.join(a.out_dir, os.path.basename(a.wheel))
    assert os.path.abspath(out_path) != os.path.abspath(a.wheel)
    records = []
    kept = dropped = 0
    with zipfile.ZipFile(out_path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
        for i in infos:
            name = i.filename
            if name == record_name:
                continue
            if name.startswith(DATA) and name[len(DATA) :] not in keep_data:
                dropped += 1
                continue
            data = zin.read(name)
            zi = zipfile.ZipInfo(name, date_time=i.date_time)
            zi.external_attr = i.external_attr
            zi.compress_type = zipfile.ZIP_DEFLATED
            zout.writestr(zi, data, compresslevel=9)
            records.append(f"{name},{record_hash(data)},{len(data)}")
            kept += 1
        records.append(f"{record_name},,")
        zi = zipfile.ZipInfo(record_name, date_time=zin.getinfo(record_name).date_time)
        zi.external_attr = zin.getinfo(record_name).external_attr
        zout.writestr(zi, "\n".join(records) + "\n", compress_type=zipfile.ZIP_DEFLATED)

    if a.keep_list_out:
        with open(a.keep_list_out, "w") as f:
            for n in sorted(keep_data):
                f.write(DATA + n + "\n")
    print(
        f"wrote {out_path}: {os.path.getsize(out_path) / 1e6:.2f} MB, kept {kept} files "
        f"({len(keep_data)} under data/), dropped {dropped}"
    )
    print(f"textual closure: {len(closure)} files; unresolved include names (outside wheel): {len(unresolved)}")


if __name__ == "__main__":
    main()
