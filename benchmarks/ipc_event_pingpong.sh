#!/usr/bin/env bash
# Builds benchmarks/ipc_event_pingpong.cu and runs every variant, each under `timeout`, one result
# line per variant (docs/decisions/0039-ipc-event-handoff.md).
#
#   bash benchmarks/ipc_event_pingpong.sh            # without MPS
#   bash benchmarks/ipc_event_pingpong.sh --mps      # under an MPS daemon started here
#   bash benchmarks/ipc_event_pingpong.sh --both     # without, then with MPS
# Other arguments go to the program (e.g. --cpus 2,3, --budget-s 5). With --mps the daemon runs
# with its pipe and log directories in a temporary directory and is stopped when the script ends,
# however it ends. Exit status: 0 when every variant ran, 1 otherwise.
set -u
cd "$(dirname "$0")/.."

mode=plain
args=()
for a in "$@"; do
  case $a in
    --mps) mode=mps ;;
    --both) mode=both ;;
    *) args+=("$a") ;;
  esac
done

NVCC=nvcc
command -v nvcc >/dev/null 2>&1 || NVCC=/usr/local/cuda/bin/nvcc
BIN=/tmp/ipc_pingpong
if ! "$NVCC" -O2 -o "$BIN" benchmarks/ipc_event_pingpong.cu; then
  echo "ipc_event_pingpong.sh: build failed" >&2
  exit 1
fi

mps_dir=""
mps_started=0
stop_mps() {
  [ -n "$mps_dir" ] || return 0
  if [ "$mps_started" = 1 ]; then
    echo quit | timeout 15 nvidia-cuda-mps-control >/dev/null 2>&1 || echo "# mps: 'quit' failed or timed out" >&2
    # the daemon leaves after its servers; give it a moment before removing its directories
    for _ in $(seq 50); do pgrep -u "$(id -u)" -x nvidia-cuda-mps-control >/dev/null 2>&1 || break; sleep 0.1; done
    mps_started=0
  fi
  rm -rf "$mps_dir"
  mps_dir=""
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
}
trap stop_mps EXIT
trap 'stop_mps; exit 130' INT TERM

start_mps() {
  mps_dir=$(mktemp -d /tmp/ipc_pingpong_mps.XXXXXX)
  export CUDA_MPS_PIPE_DIRECTORY=$mps_dir/pipe CUDA_MPS_LOG_DIRECTORY=$mps_dir/log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if ! timeout 20 nvidia-cuda-mps-control -d; then
    echo "ipc_event_pingpong.sh: nvidia-cuda-mps-control -d failed" >&2
    return 1
  fi
  mps_started=1
  for _ in $(seq 100); do
    [ -e "$CUDA_MPS_PIPE_DIRECTORY/control" ] && return 0
    sleep 0.1
  done
  echo "ipc_event_pingpong.sh: the MPS control pipe did not appear in 10 s" >&2
  return 1
}

variants=(host event-sync event-query kernel-sync kernel-query chain chain-kernel)
failed=0
header=1
run_set() {
  local label=$1
  for v in "${variants[@]}"; do
    local extra=()
    if [ "$header" = 0 ]; then extra=(--no-header); fi
    local out rc
    out=$(timeout -k 5 90 "$BIN" --variant "$v" ${extra[@]+"${extra[@]}"} ${args[@]+"${args[@]}"} 2>&1)
    rc=$?
    [ -n "$out" ] && printf '%s\n' "$out"
    if [ $rc -ne 0 ]; then
      failed=1
      if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        echo "$v FAILED ($label): timed out after 90 s"
      else
        echo "$v FAILED ($label): exit status $rc"
      fi
    fi
    # the first CUDA run printed the GPU; later runs print their result line only
    if [ "$v" != host ] && [ $rc -eq 0 ]; then header=0; fi
    if [ "$v" != host ] && [ $rc -eq 2 ]; then
      echo "# no CUDA device: the other CUDA variants are not run ($label)"
      return
    fi
  done
}

echo "# nvidia-smi: $(timeout 20 nvidia-smi --query-gpu=name,driver_version,compute_mode,persistence_mode \
  --format=csv,noheader 2>&1 | head -1)"

if [ "$mode" = plain ] || [ "$mode" = both ]; then
  echo "# --- without MPS"
  run_set "no MPS"
fi
if [ "$mode" = mps ] || [ "$mode" = both ]; then
  echo "# --- under MPS"
  header=1
  if start_mps; then
    run_set "MPS"
    servers=$(echo get_server_list | timeout 10 nvidia-cuda-mps-control 2>&1 | tr '\n' ' ')
    echo "# mps server pids: ${servers:-none (the clients did not go through MPS)}"
  else
    failed=1
  fi
  stop_mps
fi
exit $failed
