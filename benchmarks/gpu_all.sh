#!/usr/bin/env bash
# Everything a session runs when a GPU is lent (one call, about 8 minutes on an H100, 9 with bitsandbytes):
# the allocator accuracy benchmark, the time benchmark, and the fake-cuda tests on a CUDA build that sees a GPU
# (benchmarks/gpu_native_check.sh, about 3 minutes: run it alone where only those are wanted).
# Results go to $OUT (the device tool's folder) or benchmarks/results/gpu/ when OUT is unset.
#   bash benchmarks/gpu_all.sh
set -u
OUT=${OUT:-benchmarks/results/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 FAKEVIZ_CACHE_DIR=${FAKEVIZ_CACHE_DIR:-/tmp/fakeviz-cache}
PY=${PYTHON:-python3}
tag=$($PY -c "import torch,re;print(re.sub(r'[^a-z0-9]+','_',torch.cuda.get_device_name(0).lower()).strip('_') if torch.cuda.is_available() else 'nogpu')")
{
  nvidia-smi -L
  $PY -c "import sys,torch,transformers;print(sys.version.split()[0],torch.__version__,torch.version.cuda,transformers.__version__)"
  echo "== native fake cuda next to a real GPU"
  $PY - <<'PYEOF'
import torch, fakeviz as fv
from fakeviz._engine import cuda_shim
print(cuda_shim.status())
m0 = torch.cuda.memory_allocated()
with fv.record(device="cuda:0") as t:
    w = torch.randn(4096, 4096, device="cuda", requires_grad=True)
    (w @ w).sum().backward()
print("fake ops", t.num_ops, "real bytes allocated by the fake record", torch.cuda.memory_allocated() - m0)
try:
    with fv.record(device="cuda:1"):
        torch.randn(2, device="cuda:1")
    print("cuda:1 accepted on a one-GPU machine")
except Exception as e:
    print("cuda:1 ->", type(e).__name__, str(e)[:400])
PYEOF
  echo "== tests: benchmarks/gpu_native_check.sh (full logs: $OUT/gpu_native_*_$tag.log)"
  bash benchmarks/gpu_native_check.sh
} 2>&1 | tee "$OUT/gpu_checks_$tag.log"
echo "== gpu_time"
timeout 270 $PY benchmarks/gpu_time.py --out "$OUT/gpu_time_$tag.json" 2>&1 | grep -v USDT | tee "$OUT/gpu_time_$tag.log" | tail -60
echo "== gpu_accuracy"
timeout 180 $PY benchmarks/gpu_accuracy.py --out "$OUT/gpu_accuracy_$tag.json" --oplogs "$OUT/${tag}_golden.json" 2>&1 | tee "$OUT/gpu_accuracy_$tag.log" | tail -40
# issue 31: a QLoRA step's peak and the LoRA/QLoRA step times. They need bitsandbytes with its CUDA library; the lent
# machine has none, so carry it: copy .venv's site-packages/bitsandbytes (keep libbitsandbytes_cpu.so and the
# libbitsandbytes_cudaNNN.so of the machine's CUDA) and its dist-info into a folder on PYTHONPATH (with the repo).
if $PY -c "import bitsandbytes" 2>/dev/null; then
  echo "== qlora_gpu"
  timeout 240 $PY benchmarks/qlora_gpu.py --out "$OUT/qlora_gpu_$tag.json" 2>&1 | grep -v -i warn | tail -6
  echo "== finetune_time (real medians; compare here with: python benchmarks/finetune_time.py --measured FILE)"
  timeout 240 $PY benchmarks/finetune_time.py --real --out "$OUT/finetune_time_${tag}_real.json" 2>&1 | grep -v -i warn | tail -6
else
  echo "== qlora_gpu, finetune_time: skipped (bitsandbytes does not import here)"
fi
