# Quick start: `make bench` installs and runs the default benchmark;
# `make test` installs and runs the test suite. Both are idempotent.
PYTHON ?= python3
export PYTHON

BASE ?= HEAD

.PHONY: install bench test test-gpu gpu-check bench-regression bench-compare clean

install:
	bash scripts/install.sh

bench: install
	$(PYTHON) -m pycollectives.bench

# The regression benchmarks run once here, one short round each, so that they keep working;
# timings mean nothing on CI machines, so nothing fails on them.
test: install
	$(PYTHON) -m pytest -q -ra tests benchmarks/regression --regression-rounds 1 --regression-round-ms 1 \
		--benchmark-columns=median,rounds

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
bench-compare: install
	$(PYTHON) benchmarks/regression/compare.py --base $(BASE) $(ARGS)

clean:
	rm -rf build pycollectives/_C*.so *.egg-info
