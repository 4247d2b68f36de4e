"""One error contract for both synthesizers (issue 28): the same bad argument gets the
same typed error from ``solve_alltoall`` and ``solve_allgather``; every error type
derives from ``MCCLError`` (the model builders' ``FormulationError`` included) and from
the built-in type older callers catch; no raw ``TypeError``/``ValueError`` is raised in
the packages."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import formulations
import mccl_opt as mo
from instances import hpn
from mccl_opt import errors
from mccl_opt.allgather import AllGatherWarmState
from mccl_opt.alltoall import AllToAllWarmState
from mccl_opt.backends import backend_class

ROOT = Path(__file__).resolve().parents[1]
TOPO = hpn(1, 2, 2)
SOLVERS = {"alltoall": mo.solve_alltoall, "allgather": mo.solve_allgather}
OTHER = {"alltoall": "allgather", "allgather": "alltoall"}


@pytest.fixture(scope="module")
def schedules():
    return {name: solve(TOPO) for name, solve in SOLVERS.items()}


BAD_TOPOLOGIES = [None, "hpn-1x2x2", {"nodes": [], "links": []}, 42]
BAD_CHUNKS = [0, -3, 2.5, True, "10", [10]]
BAD_BACKENDS = ["cplex", "", 7, None]


@pytest.mark.parametrize("collective", SOLVERS)
@pytest.mark.parametrize("topo", BAD_TOPOLOGIES, ids=repr)
def test_not_a_topology(collective, topo):
    with pytest.raises(errors.TopologyError, match="expected a mccl_opt.Topology"):
        SOLVERS[collective](topo)


@pytest.mark.parametrize("collective", SOLVERS)
@pytest.mark.parametrize("max_chunks", BAD_CHUNKS, ids=repr)
def test_bad_chunk_budget(collective, max_chunks):
    with pytest.raises(errors.InputError, match="max_chunks must be a positive integer or None"):
        SOLVERS[collective](TOPO, max_chunks=max_chunks)


@pytest.mark.parametrize("collective", SOLVERS)
@pytest.mark.parametrize("backend", BAD_BACKENDS, ids=repr)
def test_unknown_backend(collective, backend):
    with pytest.raises(errors.SolverNotAvailableError, match="unknown backend"):
        SOLVERS[collective](TOPO, backend=backend)


@pytest.mark.parametrize("collective", SOLVERS)
def test_backend_not_installed(collective, monkeypatch):
    """Also where the solve would not need an LP (a balanced AllGather): the name is
    checked up front, so a typo or a missing package shows at once on both."""
    monkeypatch.setattr(backend_class("scip"), "is_available", classmethod(lambda cls: False))
    with pytest.raises(errors.SolverNotAvailableError, match="pip install"):
        SOLVERS[collective](TOPO, backend="scip")


@pytest.mark.parametrize("collective", SOLVERS)
def test_warm_schedule_of_the_other_collective(collective, schedules):
    with pytest.raises(errors.ScheduleError, match="cannot warm-start"):
        SOLVERS[collective](TOPO, warm=schedules[OTHER[collective]])


@pytest.mark.parametrize("collective", SOLVERS)
def test_warm_that_is_not_a_schedule(collective, schedules):
    other_state = schedules[OTHER[collective]].warm_state
    assert isinstance(other_state, (AllGatherWarmState, AllToAllWarmState))
    for warm in ("previous.json", 3, other_state):
        with pytest.raises(errors.ScheduleError, match="warm must be"):
            SOLVERS[collective](TOPO, warm=warm)


def test_own_warm_state_is_accepted_by_alltoall(schedules):
    state = schedules["alltoall"].warm_state
    assert isinstance(state, AllToAllWarmState)
    assert mo.solve_alltoall(TOPO, warm=state).rate_gbps == pytest.approx(schedules["alltoall"].rate_gbps)


@pytest.mark.parametrize("kwargs", [{"max_steps": 0}, {"max_steps": "max"}, {"max_steps": 1.5},
                                    {"time_limit": 0}, {"time_limit": -1.0}, {"time_limit": "1"},
                                    {"time_limit": True}], ids=repr)
def test_alltoall_only_arguments(kwargs):
    with pytest.raises(errors.InputError):
        mo.solve_alltoall(TOPO, **kwargs)


def test_every_error_is_an_mccl_error_and_keeps_its_builtin_base():
    assert mo.MCCLError is errors.MCCLError is formulations.MCCLError
    assert issubclass(formulations.FormulationError, mo.MCCLError)
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, mo.MCCLError)
        if cls is not mo.MCCLError:
            assert issubclass(cls, (ValueError, ImportError, RuntimeError)), name
    assert issubclass(errors.InputError, ValueError)                 # old `except ValueError`


def test_with_capacity_keywords_are_checked():
    with pytest.raises(errors.InputError, match="missing"):
        TOPO.with_capacity(src="s0h0g0", gbps=1.0)
    with pytest.raises(errors.InputError, match="unexpected"):
        TOPO.with_capacity(src="s0h0g0", dst="s0h0nvs", gbps=1.0, both=True)


def _raw_raises(path: Path, root: Path = ROOT) -> list[str]:
    """``raise TypeError(...)`` / ``raise ValueError(...)`` statements of one module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) \
                and isinstance(node.exc.func, ast.Name) and node.exc.func.id in ("TypeError", "ValueError"):
            found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_no_raw_type_or_value_errors_in_the_packages():
    """errors.py promises that everything derives from MCCLError."""
    raw = [hit for pkg in ("formulations", "mccl_opt", "instances", "mccl_runtime", "executor_cuda")
           for path in sorted((ROOT / pkg).rglob("*.py")) for hit in _raw_raises(path)]
    assert raw == []


def test_raw_raise_finder_sees_one(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f(x):\n    if x:\n        raise ValueError('bad')\n")
    assert [hit.split(":")[1] for hit in _raw_raises(module, tmp_path)] == ["3"]
