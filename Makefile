# Two commands for a fresh machine: `make demo` and `make test` (see README.md).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
STAMP_DEV := $(VENV)/.installed-dev

.PHONY: demo test bench clean

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

bench: $(STAMP_DEV)
	$(PY) -m pytest bench --benchmark-enable -q -s

clean:
	rm -rf $(VENV) build *.egg-info
