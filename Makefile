# Quick start: `make bench` installs and runs the default benchmark;
# `make test` installs and runs the test suite. Both are idempotent.
PYTHON ?= python3
export PYTHON

.PHONY: install bench test test-gpu clean

install:
	bash scripts/install.sh

bench: install
	$(PYTHON) -m pycollectives.bench

test: install
	$(PYTHON) -m pytest -q -ra

test-gpu: install
	$(PYTHON) -m pytest -q -ra -m gpu

clean:
	rm -rf build pycollectives/_C*.so *.egg-info
