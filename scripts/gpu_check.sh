#!/bin/bash
# The whole GPU check on one machine, as run on the device machines: build, GPU tests, benchmark,
# training step times. With >= 2 GPUs: one rank per GPU against NCCL, and the same on 4 GPUs when
# there are 4. With one GPU: the CUDA engine's tests and the simulated-hosts tests with 2 and 4
# ranks sharing it (rank r on GPU r % count, PYCOLL_CUDA_SAME_DEVICE=kernels), the staged path once,
# the default path (auto), and the examples and the benchmark on it against Gloo (NCCL refuses
# ranks that share a GPU). Every step
# has a time limit (a hung collective costs its limit, not the session); logs, JSON and plots land
# in OUTDIR, one line per step in OUTDIR/summary.txt: NAME pass|fail|skip, exit status, seconds,
# and pytest's counts.
#   usage: scripts/gpu_check.sh [--mps] [OUTDIR]      (default: gpu-check-<date>)
#   GPU_CHECK_STEPS="build gpu_all_reduce_shared_2 ...": run only the steps named (each fits in
#          10 minutes on one GPU); the others are left out of the summary.
#   --mps: start an MPS control daemon for this run (pipes and logs in OUTDIR, stopped at exit);
#          ranks sharing a GPU then run concurrently, each limited to 100/world percent of its
#          threads (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE).
set -u
MPS=0
if [ "${1:-}" = "--mps" ]; then
  MPS=1
  shift
fi
OUTDIR=${1:-gpu-check-$(date +%F)}
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
SUMMARY="$OUTDIR/summary.txt"
# Never NVLink multicast (it can take a shared host's GPUs down); pycoll does not use it.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-16}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

note() { echo "$*" | tee -a "$SUMMARY"; }

selected() { [ -z "${GPU_CHECK_STEPS:-}" ] || [[ " $GPU_CHECK_STEPS " == *" $1 "* ]]; }

step() {  # step NAME SECONDS CMD...: pass (exit 0), fail (else; 124: the time limit)
  local name=$1 limit=$2 t0 rc verdict counts
  shift 2
  selected "$name" || return 0
  t0=$(date +%s)
  timeout -k 30 "$limit" "$@" > "$OUTDIR/$name.log" 2>&1
  rc=$?
  verdict=pass
  [ $rc -eq 0 ] || verdict=fail
  [ $rc -eq 124 ] && verdict="fail (time limit ${limit}s)"
  # pytest's last line, e.g. "12 passed, 3 skipped in 80.1s"; a run where everything skipped is a skip.
  counts=$(grep -E "^=*\s*[0-9]+ (passed|failed|skipped|error)" "$OUTDIR/$name.log" | tail -n 1 | tr -d '=')
  if [ $rc -eq 0 ] && [ -n "$counts" ] && ! echo "$counts" | grep -q "passed"; then verdict=skip; fi
  note "$name $verdict rc=$rc $(( $(date +%s) - t0 ))s ${counts:+-$counts}"
}

skip() { selected "$1" && note "$1 skip ($2)"; }

if [ $MPS -eq 1 ]; then
  export CUDA_MPS_PIPE_DIRECTORY="$OUTDIR/mps-pipe" CUDA_MPS_LOG_DIRECTORY="$OUTDIR/mps-log"
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if nvidia-cuda-mps-control -d; then
    trap 'echo quit | nvidia-cuda-mps-control' EXIT
    note "mps daemon started (pipes in $CUDA_MPS_PIPE_DIRECTORY)"
  else
    note "mps daemon did not start: running without MPS"
    MPS=0
  fi
fi

step build 900 python3 setup.py build_ext --inplace
NG=$(python3 -c "import torch; print(torch.cuda.device_count())")
note "gpus=$NG mps=$MPS"
[ "$NG" -ge 1 ] || { note "no GPU visible"; exit 1; }
GPU_TESTS=(tests/test_gpu_*.py)

if [ "$NG" -eq 1 ]; then
  export CUDA_VISIBLE_DEVICES=0 PYCOLL_CUDA_SAME_DEVICE=kernels
  SMS=$(python3 -c "import torch; print(torch.cuda.get_device_properties(0).multi_processor_count)")
  for W in 2 4; do
    export PYCOLL_GPU_WORLD=$W
    if [ $MPS -eq 1 ]; then
      # Every CTA of a collective must be resident while its peers' CTAs run: each rank gets
      # 100/W percent. Where the driver does not report that share as the SM count, the engine's
      # CTA caps are set to it.
      export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$(( 100 / W ))
      SEEN=$(python3 -c "import torch; print(torch.cuda.get_device_properties(0).multi_processor_count)")
      note "world $W under MPS at ${CUDA_MPS_ACTIVE_THREAD_PERCENTAGE}%: $SEEN of $SMS SMs reported"
      if [ "$SEEN" -ge "$SMS" ]; then
        CAP=$(( SMS / W / 2 )); [ $CAP -ge 1 ] || CAP=1; [ $CAP -le 64 ] || CAP=64
        P2P_CAP=$(( (CAP + 1) / 2 ))
        export PYCOLL_CUDA_MAX_BLOCKS=$CAP PYCOLL_CUDA_SMALL_MAX_BLOCKS=$CAP PYCOLL_CUDA_P2P_MAX_BLOCKS=$P2P_CAP
        note "world $W: PYCOLL_CUDA_MAX_BLOCKS=$CAP PYCOLL_CUDA_P2P_MAX_BLOCKS=$P2P_CAP"
      fi
    fi
    for f in "${GPU_TESTS[@]}"; do
      n=$(basename "$f" .py)
      step "${n#test_}_shared_$W" 570 python3 -m pytest -q -m gpu "$f" -p no:cacheprovider
    done
    unset PYCOLL_CUDA_MAX_BLOCKS PYCOLL_CUDA_SMALL_MAX_BLOCKS PYCOLL_CUDA_P2P_MAX_BLOCKS
  done
  # Simulated hosts (2x1, 2x2, 4x1 ranks) on the one GPU: the CUDA engine inside a host, NCCL
  # between hosts with one NCCL_HOSTID per rank.
  export PYCOLL_GPU_WORLD=4
  [ $MPS -eq 1 ] && export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25
  step multihost_shared 570 python3 -m pytest -q -m gpu tests/test_multihost_cuda.py -p no:cacheprovider
  # The staged path, forced, for ranks sharing the GPU.
  export PYCOLL_GPU_WORLD=2
  [ $MPS -eq 1 ] && export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50
  step gpu_staged_2 570 env PYCOLL_CUDA_SAME_DEVICE=staged python3 -m pytest -q -m gpu \
    tests/test_gpu_all_reduce.py tests/test_gpu_other_collectives.py -p no:cacheprovider
  # The default (auto: staging below a measured size, the events path above it), 2 and 4 ranks;
  # the benchmark and the examples below run it too.
  unset PYCOLL_CUDA_SAME_DEVICE
  step gpu_auto_2 570 python3 -m pytest -q -m gpu tests/test_gpu_same_device_auto.py -p no:cacheprovider
  step gpu_auto_4 570 env PYCOLL_GPU_WORLD=4 python3 -m pytest -q -m gpu tests/test_gpu_same_device_auto.py \
    -p no:cacheprovider
  # The benchmark with 2 ranks on the one GPU, against Gloo (pycoll-bench leaves NCCL out there).
  step bench_shared_2 570 python3 -m pycollectives.bench --device cuda --nproc 2 --backends pycoll,gloo \
    --ops all_reduce,all_gather,reduce_scatter -e 16M -f 4 --no-progress --out "$OUTDIR" --name shared-gpu-2
  step ddp_gpt_shared_2 570 python3 examples/ddp_gpt.py --nproc 2 --compare gloo --steps 10 --warmup 3
  step fsdp_gpt_shared_2 570 python3 examples/fsdp_gpt.py --nproc 2 --compare gloo --steps 10 --warmup 3
  grep -h "ms/step\|step time" "$OUTDIR"/ddp_gpt*.log "$OUTDIR"/fsdp_gpt*.log 2>/dev/null
  exit 0
fi

# The CUDA engine's own tests (tests/test_gpu_*.py), then every other GPU test.
export CUDA_VISIBLE_DEVICES=0,1 PYCOLL_GPU_WORLD=2
step gpu_tests 600 python3 -m pytest -q -m gpu "${GPU_TESTS[@]}" -p no:cacheprovider
step integration 900 python3 -m pytest -q -m gpu tests "${GPU_TESTS[@]/#/--ignore=}" -p no:cacheprovider
step bench 600 python3 -m pycollectives.bench --nproc 2 --ops all_reduce,all_gather,reduce_scatter --out "$OUTDIR"
# torch's DistributedTest suite with CUDA tensors, in parallel shards (needs expecttest installed).
if python3 -c "import expecttest" 2>/dev/null; then
  SETS="0,1"; [ "$NG" -ge 4 ] && SETS="0,1;2,3"  # each shard's 2 ranks on one pair of GPUs
  step conformance_gpu 900 env PYCOLL_CONFORMANCE_GPU=1 python3 tests/conformance/run_shards.py --shards 16 \
    --gpu-sets "$SETS" --logs "$OUTDIR/conformance"
  tail -n 30 "$OUTDIR/conformance_gpu.log" | grep -v "^W" >> "$SUMMARY"
else
  skip conformance_gpu "expecttest is not installed"
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
else
  skip gpu_tests_4 "needs 4 GPUs, $NG visible"
fi
grep -h "ms/step\|step time" "$OUTDIR"/ddp_gpt*.log "$OUTDIR"/fsdp_gpt.log 2>/dev/null
