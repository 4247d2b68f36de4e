"""MPS/LP export: files re-read by HiGHS (and Gurobi/our own reader) give the same model
and the same optimum, including ranges, equalities, free and integer columns and
infinite bounds."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import scipy.sparse as sp

from formulations.export import read_mps, write_lp, write_mps
from formulations.lp import FormulationError, LinearProgram
from mccl_opt.backends import get_backend

INF = np.inf


def mixed_lp(integer: bool) -> LinearProgram:
    """max 2a + 3b - c + d + 5 (offset) with every row and bound kind:
    r0: -2 <= a + b + c <= 6      (range)
    r1: a - d = 1                 (equality)
    r2: b + 2c >= -3              (>=)
    r3: 3a + b + d <= 12          (<=)
    r4: a + d >= -inf             (free row; no constraint)
    bounds: a in [0, 4] (integer when ``integer``), b in [-inf, 2.5], c free,
    d in [-1, inf) (integer when ``integer``), e fixed at 0.5 with cost 0."""
    A = np.array([[1, 1, 1, 0, 0], [1, 0, 0, -1, 0], [0, 1, 2, 0, 0], [3, 1, 0, 1, 0],
                  [1, 0, 0, 1, 0]], dtype=float)
    return LinearProgram(
        c=[2, 3, -1, 1, 0], A=sp.csr_matrix(A), row_lo=[-2, 1, -3, -INF, -INF],
        row_hi=[6, 1, INF, 12, INF], col_lo=[0, -INF, -INF, -1, 0.5],
        col_hi=[4, 2.5, INF, INF, 0.5], integrality=[integer, False, False, integer, False],
        sense="max", objective_offset=5.0, name="mixed")


def highs_optimum(lp: LinearProgram, mip: bool) -> float:
    with get_backend("highs") as b:
        b.load(lp)
        sol = b.solve_mip(mip_gap=0.0) if mip else b.solve()
    assert sol.status.value == "optimal"
    return float(sol.objective)


def highs_read(path) -> tuple[float, int, int]:
    import highspy

    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    assert h.readModel(str(path)) != highspy.HighsStatus.kError
    h.run()
    assert h.getModelStatus() == highspy.HighsModelStatus.kOptimal
    return h.getInfo().objective_function_value, h.getNumCol(), h.getNumRow()


@pytest.mark.parametrize("integer", [False, True])
def test_mps_reread_by_highs_same_optimum(tmp_path, integer):
    lp = mixed_lp(integer)
    expected = highs_optimum(lp, mip=integer)
    path = write_mps(lp, tmp_path / "m.mps")
    obj, n, m = highs_read(path)
    assert n == lp.num_cols
    assert m == lp.num_rows - 1  # HiGHS drops the extra N (free) row by default
    assert obj == pytest.approx(expected, abs=1e-7)


@pytest.mark.parametrize("integer", [False, True])
def test_lp_reread_by_highs_same_optimum(tmp_path, integer):
    lp = mixed_lp(integer)
    expected = highs_optimum(lp, mip=integer)
    path = write_lp(lp, tmp_path / "m.lp")
    obj, n, m = highs_read(path)
    assert n == lp.num_cols + 2  # the range row's Rg column and the obj_constant column
    assert m == lp.num_rows
    assert obj == pytest.approx(expected, abs=1e-7)


def test_mixed_optimum_matches_hand_value():
    """By hand: r1 gives d = a - 1, r3 then reads 4a + b <= 13, and the free c (cost -1)
    sits at its lower limit max(-2 - a - b, (-3 - b)/2).  Where 2a + b >= -1 the
    objective is 3a + 3.5b + 5.5, maximal at b = 2.5, a = 2.625: 22.125 (c = -2.75).
    With a, d integer: a = 2, b = 2.5 gives 20.25 (a = 3 allows only b = 1: 18)."""
    assert highs_optimum(mixed_lp(False), mip=False) == pytest.approx(22.125)
    assert highs_optimum(mixed_lp(True), mip=True) == pytest.approx(20.25)
    with get_backend("highs") as b:
        b.load(mixed_lp(False))
        sol = b.solve()
    np.testing.assert_allclose(sol.x, [2.625, 2.5, -2.75, 1.625, 0.5], atol=1e-9)


def test_read_mps_round_trip_is_exact(tmp_path):
    lp = mixed_lp(True)
    back = read_mps(write_mps(lp, tmp_path / "m.mps"))
    assert back.sense == "max" and back.objective_offset == 5.0 and back.name == "mixed"
    np.testing.assert_array_equal(back.c, lp.c)
    np.testing.assert_array_equal(back.A.toarray(), lp.A.toarray())
    np.testing.assert_array_equal(back.row_lo, lp.row_lo)
    np.testing.assert_array_equal(back.row_hi, lp.row_hi)
    np.testing.assert_array_equal(back.col_lo, lp.col_lo)
    np.testing.assert_array_equal(back.col_hi, lp.col_hi)
    np.testing.assert_array_equal(back.integrality, lp.integrality)
    assert highs_optimum(back, mip=True) == pytest.approx(highs_optimum(lp, mip=True))


def test_names_are_kept_when_valid_and_replaced_otherwise(tmp_path):
    lp = mixed_lp(False)
    lp.col_names = ["a", "b", "c", "d", "e"]
    lp.row_names = ["cap", "link", "ge", "le", "free"]
    text = write_mps(lp, tmp_path / "n.mps").read_text()
    assert " a cap 1.0" in text
    assert read_mps(tmp_path / "n.mps").col_names == lp.col_names
    lp.col_names = ["has space", "b", "c", "d", "e"]
    back = read_mps(write_mps(lp, tmp_path / "n2.mps"))
    assert back.col_names == ["x0", "x1", "x2", "x3", "x4"]
    lp.col_names = ["e1", "b", "c", "d", "x"]  # "e1" would read as a number in LP files
    assert "e1" not in write_lp(lp, tmp_path / "n.lp").read_text().split()


def test_fractional_data_survives_exactly(tmp_path):
    rng = np.random.default_rng(4)
    A = sp.random(20, 30, density=0.2, random_state=4, format="csr")
    lp = LinearProgram(c=rng.random(30) / 7, A=A, row_lo=np.full(20, -INF),
                       row_hi=rng.random(20) + 1 / 3, col_lo=np.zeros(30), col_hi=np.ones(30) / 3)
    back = read_mps(write_mps(lp, tmp_path / "f.mps"))
    np.testing.assert_array_equal(back.c, lp.c)
    np.testing.assert_array_equal(back.A.toarray(), lp.A.toarray())
    np.testing.assert_array_equal(back.row_hi, lp.row_hi)
    obj, _, _ = highs_read(write_lp(lp, tmp_path / "f.lp"))
    assert obj == pytest.approx(highs_optimum(lp, mip=False), rel=1e-12)


@pytest.mark.skipif(importlib.util.find_spec("gurobipy") is None, reason="gurobipy not installed")
def test_gurobi_reads_both_files(tmp_path):
    import gurobipy as gp

    lp = mixed_lp(True)
    expected = highs_optimum(lp, mip=True)
    with gp.Env(params={"OutputFlag": 0}) as env:
        for path in (write_mps(lp, tmp_path / "g.mps"), write_lp(lp, tmp_path / "g.lp")):
            with gp.read(str(path), env=env) as model:
                model.optimize()
                assert model.ObjVal == pytest.approx(expected, abs=1e-7)


def test_read_mps_errors_name_the_line(tmp_path):
    p = tmp_path / "bad.mps"
    p.write_text("NAME x\nROWS\n N obj\n Q r0\nENDATA\n")
    with pytest.raises(FormulationError, match="line 4.*row type"):
        read_mps(p)
    p.write_text("NAME x\nROWS\n N obj\nCOLUMNS\n    x0 nope 1\nENDATA\n")
    with pytest.raises(FormulationError, match="line 5.*unknown row 'nope'"):
        read_mps(p)
