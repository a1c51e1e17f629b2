# Quick start: `make bench` installs and runs the default benchmark;
# `make test` installs and runs the test suite. Both are idempotent.
PYTHON ?= python3
export PYTHON

.PHONY: install bench test test-gpu gpu-check clean

install:
	bash scripts/install.sh

bench: install
	$(PYTHON) -m pycollectives.bench

test: install
	$(PYTHON) -m pytest -q -ra

test-gpu: install
	$(PYTHON) -m pytest -q -ra -m gpu

# Everything the GPU issues measure, with time limits per step (scripts/gpu_check.sh).
gpu-check:
	bash scripts/gpu_check.sh

clean:
	rm -rf build pycollectives/_C*.so *.egg-info
