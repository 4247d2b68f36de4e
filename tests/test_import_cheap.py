"""``import mccl_opt`` (and the other light packages) loads no optional solver, no
numba, no torch and no zmq: those are imported lazily by the code that needs them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ["gurobipy", "pyscipopt", "numba", "torch", "zmq"]


@pytest.mark.parametrize("stmt", ["import mccl_opt", "import formulations", "import instances",
                                  "import mccl_opt, formulations, instances, mccl_opt.backends"])
def test_import_loads_no_heavy_module(stmt):
    code = (f"{stmt}; import sys, json; "
            f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded == [], f"{stmt!r} imported {loaded}"


def test_backend_registry_does_not_import_solvers():
    """Listing available backends checks packages with find_spec only."""
    code = ("import sys; from mccl_opt.backends import available_backends; "
            "available_backends(); print(sorted(m for m in ('gurobipy', 'pyscipopt') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"
