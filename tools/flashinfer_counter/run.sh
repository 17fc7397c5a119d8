#!/bin/bash
# Issue 50 item 4 on the device machine: fmha_v2 tile counter (FlashInfer 0.7.1 vs 0.7.2), then XQA #4161 stress (0.6.16).
set -o pipefail
T0=$(date +%s)
cd "$(dirname "$0")"
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch,sys; print('torch', torch.__version__, 'python', sys.version.split()[0], torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))"
python3 -c "import flashinfer; print('image flashinfer', flashinfer.__version__)" 2>&1 | tail -1
mkdir -p /tmp/fi && tar -xJf fi.tar.xz -C /tmp/fi || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/tvm apache_tvm_ffi-*.whl || exit 1
echo "setup s $(( $(date +%s) - T0 ))"
export FLASHINFER_DISABLE_JIT=1 PYTHONUNBUFFERED=1
for v in 1 2; do
  FLASHINFER_WORKSPACE_BASE=/tmp/fiws7$v PYTHONPATH=/tmp/fi/fi7$v:/tmp/tvm timeout 150 python3 fmha_v2_counter_worker.py --label 0.7.$v --out $OUT/fmha-0.7.$v.json 2>&1 | tee $OUT/fmha-0.7.$v.log
  echo "rc $? after 0.7.$v: s $(( $(date +%s) - T0 ))"
done
CUOBJ=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
for v in 1 2; do
  f=/tmp/fi/fi7$v/flashinfer/data/aot/trtllm_fmha_v2_q_paged_kv_nhd_bf16_bf16/trtllm_fmha_v2_q_paged_kv_nhd_bf16_bf16.so
  $CUOBJ -sass $f > /tmp/sass7$v.txt 2>&1
  echo "sass 0.7.$v: lines $(wc -l < /tmp/sass7$v.txt); ATOMG*ADD $(grep -cE 'ATOMG[.A-Z0-9]*\.ADD' /tmp/sass7$v.txt); ATOMG*INC $(grep -cE 'ATOMG[.A-Z0-9]*\.INC' /tmp/sass7$v.txt); all ATOM ops: $(grep -oE '(ATOMG|ATOM|RED)\.[.A-Z0-9]+' /tmp/sass7$v.txt | sort | uniq -c | tr '\n' ' ')"
done
echo "before stress: s $(( $(date +%s) - T0 ))"
if [ "${SKIP_STRESS:-0}" != 1 ]; then
  FLASHINFER_WORKSPACE_BASE=/tmp/fiws616 PYTHONPATH=/tmp/fi/fi616:/tmp/tvm timeout ${STRESS_TIMEOUT:-200} python3 xqa_multiblock_worker.py --label 0.6.16 --seconds ${STRESS_SECONDS:-6} --out $OUT/xqa-0.6.16.json 2>&1 | tee $OUT/xqa-0.6.16.log
  echo "rc $? stress"
fi
echo "total s $(( $(date +%s) - T0 ))"
