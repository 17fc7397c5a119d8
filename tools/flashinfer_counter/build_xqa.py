# Build FlashInfer's XQA JIT modules (bf16 Q, bf16 KV, page 64, head 128, group 4) for SM90 on a CPU host.
import sys
import time
import os
import torch
import flashinfer
from flashinfer.jit.xqa import gen_xqa_module

print("flashinfer", flashinfer.__version__, flashinfer.__file__)
for sw in (True, False):
    spec = gen_xqa_module(torch.bfloat16, torch.bfloat16, 64, 128, 4, sw, torch.bfloat16, 1, False)
    print("spec", spec.name, "sources", [str(s).split("/")[-1] for s in spec.sources])
    print("aot_path", spec.aot_path)
    if "--gen-only" not in sys.argv:
        t = time.time()
        spec.build(verbose=True)
        print(
            "build s",
            round(time.time() - t, 1),
            spec.jit_library_path,
            os.path.getsize(spec.jit_library_path),
            flush=True,
        )
