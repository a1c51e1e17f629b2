#!/usr/bin/env bash
# Installs what pycollectives needs and builds the extension, idempotently:
# a second run with nothing changed returns in seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

# torch: keep whatever is installed; otherwise the CUDA 13 build that the
# package index of this machine serves (2.14.1; the GPU machines have 2.11).
if ! $PY -c "import torch" >/dev/null 2>&1; then
  $PY -m pip install -q "torch==2.14.1"
fi
missing=()
for pair in ninja:ninja matplotlib:matplotlib pytest:pytest pytest_timeout:pytest-timeout pytest_benchmark:pytest-benchmark \
    expecttest:expecttest; do
  mod=${pair%%:*}
  pkg=${pair##*:}
  $PY -c "import $mod" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  $PY -m pip install -q "${missing[@]}"
fi

# nvcc lives in /usr/local/cuda on the dev and CI machines; torch looks there
# only if CUDA_HOME is unset and nvcc is not on PATH.
if [ -z "${CUDA_HOME:-}" ] && [ -x /usr/local/cuda/bin/nvcc ]; then
  export CUDA_HOME=/usr/local/cuda
fi

so=$(ls pycollectives/_C*.so 2>/dev/null | head -n 1 || true)
stale=1
if [ -n "$so" ] && $PY -c "import pycollectives" >/dev/null 2>&1 && (cd / && $PY -c "import pycollectives") >/dev/null 2>&1; then
  newer=$(find csrc setup.py -newer "$so" -type f | head -n 1)
  [ -z "$newer" ] && stale=0
fi
if [ "$stale" = 1 ]; then
  export MAX_JOBS=${MAX_JOBS:-2}
  # Builds in place with ninja (incremental) and registers the package and
  # the pycoll-bench console script.
  if ! $PY -m pip install -q --no-build-isolation --no-deps -e .; then
    if [ "${PYCOLL_FORCE_CPU:-0}" = 1 ]; then
      exit 1
    fi
    # The CUDA engine could not be built here (toolkit or torch mismatch):
    # say so loudly and still give the user a working CPU build.
    echo "pycollectives: WARNING: the CUDA build failed (see the error above); building the CPU-only extension" >&2
    PYCOLL_FORCE_CPU=1 $PY -m pip install -q --no-build-isolation --no-deps -e .
  fi
fi
$PY -c "import pycollectives, sys; print('pycollectives ready:', 'CUDA' if pycollectives.cuda_built() else 'CPU-only', 'build', file=sys.stderr)"
