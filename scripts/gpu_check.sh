#!/bin/bash
# The whole GPU check on one machine with >= 2 GPUs, as run on the device machines:
# build, GPU tests, pycoll-vs-NCCL benchmark, training step times against NCCL, and the
# same on 4 GPUs when there are 4. Every step has a time limit (a hung collective costs
# its limit, not the session); logs, JSON and plots land in OUTDIR, one line per step
# in OUTDIR/summary.txt.
#   usage: scripts/gpu_check.sh [OUTDIR]      (default: gpu-check-<date>)
set -u
OUTDIR=${1:-gpu-check-$(date +%F)}
mkdir -p "$OUTDIR"
# Never NVLink multicast (it can take a shared host's GPUs down); pycoll does not use it.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-16}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

step() {  # step NAME SECONDS CMD...
  local name=$1 limit=$2 t0
  shift 2
  t0=$(date +%s)
  timeout "$limit" "$@" > "$OUTDIR/$name.log" 2>&1
  echo "$name rc=$? $(( $(date +%s) - t0 ))s" | tee -a "$OUTDIR/summary.txt"
}

step build 900 python3 setup.py build_ext --inplace
NG=$(python3 -c "import torch; print(torch.cuda.device_count())")
echo "gpus=$NG" | tee -a "$OUTDIR/summary.txt"
[ "$NG" -ge 2 ] || { echo "needs 2 GPUs"; exit 1; }

# The CUDA engine's own tests (tests/test_gpu_*.py), then every other GPU test.
GPU_TESTS=(tests/test_gpu_*.py)
export CUDA_VISIBLE_DEVICES=0,1 PYCOLL_GPU_WORLD=2
step gpu_tests 600 python3 -m pytest -q -m gpu "${GPU_TESTS[@]}" -p no:cacheprovider
step integration 900 python3 -m pytest -q -m gpu tests "${GPU_TESTS[@]/#/--ignore=}" -p no:cacheprovider
step bench 600 python3 -m pycollectives.bench --nproc 2 --ops all_reduce,all_gather,reduce_scatter --out "$OUTDIR"
# torch's DistributedTest suite with CUDA tensors, in parallel shards (needs expecttest installed).
if python3 -c "import expecttest" 2>/dev/null; then
  SETS="0,1"; [ "$NG" -ge 4 ] && SETS="0,1;2,3"  # each shard's 2 ranks on one pair of GPUs
  step conformance_gpu 900 env PYCOLL_CONFORMANCE_GPU=1 python3 tests/conformance/run_shards.py --shards 16 \
    --gpu-sets "$SETS" --logs "$OUTDIR/conformance"
  tail -n 30 "$OUTDIR/conformance_gpu.log" | grep -v "^W" >> "$OUTDIR/summary.txt"
fi
step ddp_gpt 300 python3 examples/ddp_gpt.py --compare nccl --steps 20 --warmup 5
step fsdp_gpt 300 python3 examples/fsdp_gpt.py --compare nccl --steps 20 --warmup 5
step ddp_gpt_torch_powersgd 300 python3 examples/ddp_gpt.py --compare nccl --steps 20 --warmup 5 --hook powersgd --powersgd-rank 4
step ddp_gpt_pycoll_powersgd 300 python3 examples/ddp_gpt.py --compare nccl --steps 20 --warmup 5 --hook pycoll-powersgd --powersgd-rank 4

if [ "$NG" -ge 4 ]; then
  export CUDA_VISIBLE_DEVICES=0,1,2,3 PYCOLL_GPU_WORLD=4
  step gpu_tests_4 600 python3 -m pytest -q -m gpu "${GPU_TESTS[@]}" -p no:cacheprovider
  step bench_4 900 python3 -m pycollectives.bench --nproc 4 --ops all_reduce,all_gather,reduce_scatter \
    --algo auto,oneshot,twoshot,ring,tree -f 4 --out "$OUTDIR"
  # Across hosts: 4 GPUs as 2 simulated hosts x 2 (and 4 x 1) against NCCL split the same way,
  # the two-torchrun-agents command, and the table of forms (flat / hierarchical) calibrated on
  # this layout (written beside the logs, not into the user's cache).
  step multihost_4 600 python3 -m pytest -q -m gpu tests/test_multihost_cuda.py tests/test_multihost_torchrun.py \
    -p no:cacheprovider
  step bench_hosts_4 900 python3 -m pycollectives.bench --hosts 2 --nproc 4 --ops all_reduce,all_gather,reduce_scatter \
    --algo auto,flat,hierarchical -f 4 --rounds 3 --calibrate --calibrate-out "$OUTDIR/hosts2x2-cost-model.json" \
    --out "$OUTDIR" --name hosts2x2-pycoll-vs-nccl
fi
grep -h "ms/step\|step time" "$OUTDIR"/ddp_gpt*.log "$OUTDIR"/fsdp_gpt.log 2>/dev/null
