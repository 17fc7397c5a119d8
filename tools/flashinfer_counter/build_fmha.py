# Build (or just generate) FlashInfer's fmha_v2 JIT module for SM90 on a CPU host.
# usage: FLASHINFER_CUDA_ARCH_LIST=9.0a FLASHINFER_WORKSPACE_BASE=DIR PYTHONPATH=/tmp/h7X \
#     python build_fmha.py [--gen-only]
import sys
import time
import os
import torch
import flashinfer
from flashinfer.jit.attention.modules import gen_fmha_v2_module

print("flashinfer", flashinfer.__version__, flashinfer.__file__)
t = time.time()
spec = gen_fmha_v2_module("Q_PAGED_KV_NHD", torch.bfloat16)
print("spec", spec.name, "sources", len(spec.sources), "gen s", round(time.time() - t, 2))
print("aot_path", spec.aot_path, "jit_library_path", spec.jit_library_path)
if "--gen-only" not in sys.argv:
    t = time.time()
    spec.build(verbose=True)
    print("build s", round(time.time() - t, 1), spec.jit_library_path, os.path.getsize(spec.jit_library_path))
