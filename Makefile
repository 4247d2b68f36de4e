# Two commands for a fresh machine: `make demo` and `make test` (see README.md).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
STAMP_DEV := $(VENV)/.installed-dev

.PHONY: demo test test-install bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e .
	touch $@

# --no-compile: pip would byte-compile all ~12,000 files of the venv (torch, ray, sympy...:
# ~35 s of one core); Python compiles the modules a run imports when it first imports them
$(STAMP_DEV): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --no-compile -e '.[dev]'
	touch $@ $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/mccl warmup
	$(VENV)/bin/mccl demo

# The kernels compile in a second process while pytest runs (`mccl warmup` into numba's
# disk cache, AllGather's first as the first test modules need them): on a fresh clone
# that takes their compilation, ~1.5 min of one core, off pytest's own processes.
# TEST_WORKERS pytest processes (pytest-xdist) share the test files, each file whole on one
# worker (`--dist loadfile`: a module's fixtures and caches are built once); 0 runs them
# all in this process (docs/benchmarks.md "Two pytest workers").
TEST_WORKERS ?= 2
test: $(STAMP_DEV)
	$(VENV)/bin/mccl warmup >/dev/null 2>&1 & warm=$$!; \
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile; status=$$?; \
	kill $$warm 2>/dev/null; wait $$warm; exit $$status

# a wheel installed into a fresh virtualenv runs every README command (minutes)
test-install: $(STAMP_DEV)
	$(PY) -m pytest tests/test_wheel_install.py -m slow_install -q -s

bench: $(STAMP_DEV)
	$(PY) -m pytest bench --benchmark-enable -q -s

clean:
	rm -rf $(VENV) build *.egg-info
