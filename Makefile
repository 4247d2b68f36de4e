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

$(STAMP_DEV): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@ $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/mccl warmup
	$(VENV)/bin/mccl demo

test: $(STAMP_DEV)
	$(PY) -m pytest -q

# a wheel installed into a fresh virtualenv runs every README command (minutes)
test-install: $(STAMP_DEV)
	$(PY) -m pytest tests/test_wheel_install.py -m slow_install -q -s

bench: $(STAMP_DEV)
	$(PY) -m pytest bench --benchmark-enable -q -s

clean:
	rm -rf $(VENV) build *.egg-info
