# Quick start: `make bench` installs and runs the default benchmark;
# `make test` installs and runs the test suite. Both are idempotent.
PYTHON ?= python3
export PYTHON

BASE ?= HEAD

.PHONY: install bench test test-slow test-gpu gpu-check bench-regression bench-compare soak conformance clean

install:
	bash scripts/install.sh

bench: install
	$(PYTHON) -m pycollectives.bench

# The regression benchmarks run once here, one short round each, so that they keep working;
# timings mean nothing on CI machines, so nothing fails on them.
# Tests marked slow (the full matrices; a subset of each runs here) have their own target.
test: install
	$(PYTHON) -m pytest -q -ra -m "not slow" tests benchmarks/regression --regression-rounds 1 \
		--regression-round-ms 1 --benchmark-columns=median,rounds

test-slow: install
	$(PYTHON) -m pytest -q -ra -m slow tests

test-gpu: install
	$(PYTHON) -m pytest -q -ra -m gpu

# Everything the GPU issues measure, with time limits per step (scripts/gpu_check.sh).
gpu-check:
	bash scripts/gpu_check.sh

# pytest-benchmark cases of pycoll's own calls (benchmarks/regression; ARGS: more pytest options,
# e.g. --benchmark-autosave, --benchmark-compare, --regression-world 2,4).
bench-regression: install
	$(PYTHON) -m pytest -q benchmarks/regression $(ARGS)

# Is the working tree slower than BASE? Both built, timed in one launch, interleaved round by round.
# BASE_ENV="NAME=VALUE ...": one build under two settings instead (BASE with those variables).
BASE_ENV ?=
bench-compare: install
	$(PYTHON) benchmarks/regression/compare.py $(if $(BASE_ENV),$(foreach e,$(BASE_ENV),--base-env $(e)),--base $(BASE)) $(ARGS)

# Soak (benchmarks/soak.py, docs/testing.md): 100,000 random ops on 2 ranks, each checked against
# Gloo; fails on a mismatch or error, on RSS growth of 1% or more after a 1,000-op warm-up, on fd or
# thread growth, or on pycoll files left in /dev/shm. Prints a JSON summary. ARGS: more options,
# e.g. --ops 5000, --nproc 3, --seed 7, --warmup 20000.
soak: install
	$(PYTHON) benchmarks/soak.py $(ARGS)

# PyTorch's own DistributedTest suite on pycoll (tests/conformance/torch_suite.py),
# CPU, 2 ranks (PYCOLL_CONFORMANCE_GPU=1: CUDA tensors too). ARGS: e.g. ARGS="-k test_all_reduce".
# SHARDS=N runs it in N parallel shards and sums their counts (tests/conformance/run_shards.py).
SHARDS ?= 1
conformance: install
	$(PYTHON) -c "import expecttest" 2>/dev/null || $(PYTHON) -m pip install -q expecttest
	if [ "$(SHARDS)" -gt 1 ]; then \
		$(PYTHON) tests/conformance/run_shards.py --shards $(SHARDS) $(ARGS); \
	else \
		d=$$(mktemp -d) && mkdir -p $$d/barrier && \
		BACKEND=pycoll WORLD_SIZE=2 TEMP_DIR=$$d $(PYTHON) tests/conformance/torch_suite.py $(ARGS); \
	fi

clean:
	rm -rf build pycollectives/_C*.so *.egg-info
