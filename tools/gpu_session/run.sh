#!/bin/bash
# One call on a lent GPU machine with no package index (docs/gpu.md, "The first runs"): the
# environment, `fabricbench gpu-check`, extra training points (EXTRA: "name model parallel
# micro-batch" lines), and a bf16 matmul as the achievable peak beside them. Needs the wheels
# of wheels.sh in .gpu/whl; writes its files to $OUT (a folder the caller names; it comes back from the machine).
#   GC_LIMIT=300 EXTRA=$'mfu-1.3b neox-1.3b ddp 4' bash tools/gpu_session/run.sh
cd "$(dirname "$0")/../.." || exit 1
export PYTHONUNBUFFERED=1
T0=$(date +%s)
{
  date -u; nproc; free -g | head -2; df -h /dev/shm; python3 -V
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  python3 -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version(), torch.cuda.get_device_name(0))"
} > $OUT/env.txt 2>&1
cat $OUT/env.txt
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl > $OUT/pip.txt 2>&1 || { cat $OUT/pip.txt; exit 3; }
export PYTHONPATH=/tmp/site:$PWD
python3 -c "import hydra, omegaconf, deepspeed, orjson, pydantic; print('imports ok', deepspeed.__version__)" 2>&1 | tail -2
echo "# setup $(( $(date +%s) - T0 ))s"
timeout ${GC_LIMIT:-400} python3 -m workloads.commands.gpu_check --out /tmp/gc 2>&1 | tee $OUT/gpu-check.txt
echo "# gpu-check done at $(( $(date +%s) - T0 ))s"
# extra training points: name model parallel micro-batch
while read -r name model par mb; do
  [ -z "$name" ] && continue
  timeout 120 python3 launch/train.py model=$model train.precision=bf16 train.micro_batch_size=$mb train.steps=10 \
    train.warmup_steps=3 parallel=$par fabric=intranode output_root=/tmp/gc run_id=$name launcher.nproc_per_node=1 \
    < /dev/null > /tmp/gc/train-$name.log 2>&1; echo "# $name exit $? at $(( $(date +%s) - T0 ))s"
done <<< "${EXTRA:-mfu-1.3b neox-1.3b ddp 4}"
python3 tools/gpu_session/summary.py /tmp/gc 2>&1 | tee $OUT/summary.txt
python3 - <<'PY' 2>&1 | tee -a $OUT/summary.txt
import torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(a)
for _ in range(3): a @ b
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
s.record()
for _ in range(10): a @ b
e.record(); torch.cuda.synchronize()
print(f"bf16 matmul 8192^3: {2 * 8192**3 * 10 / (s.elapsed_time(e) / 1e3) / 1e12:.0f} TFLOP/s (10 products, CUDA events)")
PY
tar czf $OUT/gc.tgz -C /tmp gc 2>/dev/null
echo "# all done at $(( $(date +%s) - T0 ))s"
