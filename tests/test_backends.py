"""LP/MIP backend adapters: hand-computed primal and dual values, warm incremental
re-solves against cold solves, limits, statuses, MIPs, licence and availability errors.

Every test runs against every installed backend.
"""

from __future__ import annotations

import importlib.util
import itertools

import numpy as np
import pytest
import scipy.sparse as sp

from formulations.lp import FormulationError, LinearProgram
from mccl_opt.backends import available_backends, get_backend
from mccl_opt.backends.base import SolveStatus
from mccl_opt.errors import InputError, SolverLicenseError, SolverNotAvailableError

INF = np.inf
BACKENDS = available_backends()


@pytest.fixture(params=BACKENDS)
def backend(request):
    b = get_backend(request.param)
    yield b
    b.close()


def lp_of(c, rows, lo, hi, col_lo=None, col_hi=None, sense="max", integrality=None):
    n = len(c)
    return LinearProgram(c=c, A=sp.csr_matrix(np.array(rows, dtype=float)), row_lo=lo, row_hi=hi,
                         col_lo=np.zeros(n) if col_lo is None else col_lo,
                         col_hi=np.full(n, INF) if col_hi is None else col_hi,
                         sense=sense, integrality=integrality)


def max_case() -> LinearProgram:
    """max 3x + 2y - z + 0v
    r0: x + y + z + v = 4.5   (=)
    r1: 1 <= x <= 3            (single-variable range row, binding above)
    r2: z - y >= -0.5          (>=)
    r3: x + 2y <= 10           (<=, slack)
    Optimum x=3, y=1, z=0.5, v=0, objective 10.5.  Duals from c_B = A_B^T y over x,y,z:
    y0=0.5, y1=2.5, y2=-1.5, y3=0; reduced cost of v is 0 - y0 = -0.5.
    Shadow-price check: raising r1's bound by d gives x=3+d, y=1-d/2, z=0.5-d/2,
    objective 10.5 + 2.5 d."""
    return lp_of([3, 2, -1, 0],
                 [[1, 1, 1, 1], [1, 0, 0, 0], [0, -1, 1, 0], [1, 2, 0, 0]],
                 [4.5, 1, -0.5, -INF], [4.5, 3, INF, 10])


def min_case() -> LinearProgram:
    """min 2x + 3y + z
    r0: x + y >= 4             (>=)
    r1: x <= 2.5               (single-variable <= row)
    r2: y - z = 1              (=)
    r3: -10 <= x + y + z <= 20 (range, slack)
    Optimum x=2.5, y=1.5, z=0.5, objective 10; duals y0=4, y1=-2, y2=-1, y3=0
    (raising r1's rhs by d lowers the cost by 2d)."""
    return lp_of([2, 3, 1], [[1, 1, 0], [1, 0, 0], [0, 1, -1], [1, 1, 1]],
                 [4, -INF, 1, -10], [INF, 2.5, 1, 20], sense="min")


def assert_consistent(lp: LinearProgram, sol, tol=1e-6):
    """Reduced costs are c - A^T y (the one documented convention)."""
    assert sol.reduced_costs is not None and sol.row_duals is not None
    np.testing.assert_allclose(sol.reduced_costs, lp.c - lp.A.T @ sol.row_duals, atol=tol)


@pytest.mark.parametrize("method", ["auto", "primal", "dual", "ipm"])
def test_max_case_primal_and_duals(backend, method):
    lp = max_case()
    backend.load(lp)
    sol = backend.solve(method=method)
    assert sol.status is SolveStatus.OPTIMAL
    assert sol.objective == pytest.approx(10.5, abs=1e-6)
    np.testing.assert_allclose(sol.x, [3, 1, 0.5, 0], atol=1e-6)
    np.testing.assert_allclose(sol.row_duals, [0.5, 2.5, -1.5, 0], atol=1e-6)
    np.testing.assert_allclose(sol.reduced_costs, [0, 0, 0, -0.5], atol=1e-6)
    assert_consistent(lp, sol)


@pytest.mark.parametrize("method", ["auto", "primal", "dual", "ipm"])
def test_min_case_primal_and_duals(backend, method):
    lp = min_case()
    backend.load(lp)
    sol = backend.solve(method=method)
    assert sol.status is SolveStatus.OPTIMAL
    assert sol.objective == pytest.approx(10.0, abs=1e-6)
    np.testing.assert_allclose(sol.x, [2.5, 1.5, 0.5], atol=1e-6)
    np.testing.assert_allclose(sol.row_duals, [4, -2, -1, 0], atol=1e-6)
    np.testing.assert_allclose(sol.reduced_costs, [0, 0, 0], atol=1e-6)
    assert_consistent(lp, sol)


def test_duals_are_shadow_prices_by_finite_difference(backend):
    """Perturb each binding rhs and compare the objective change with the dual."""
    for lp in (max_case(), min_case()):
        backend.load(lp)
        base = backend.solve()
        act = lp.A @ base.x
        for i in range(lp.num_rows):
            d = 1e-3
            lo, hi = lp.row_lo.copy(), lp.row_hi.copy()
            # move the side the solution touches (equalities move both)
            if np.isclose(act[i], hi[i]):
                hi[i] += d
                if lp.row_lo[i] == lp.row_hi[i]:
                    lo[i] += d
            elif np.isclose(act[i], lo[i]):
                lo[i] += d
            else:
                assert base.row_duals[i] == pytest.approx(0.0, abs=1e-9)
                continue
            pert = LinearProgram(c=lp.c, A=lp.A, row_lo=lo, row_hi=hi, col_lo=lp.col_lo,
                                 col_hi=lp.col_hi, sense=lp.sense)
            backend.load(pert)
            moved = backend.solve()
            assert (moved.objective - base.objective) / d == pytest.approx(base.row_duals[i], abs=1e-4)
            backend.load(lp)


def random_lp(seed: int, m: int = 30, n: int = 45) -> LinearProgram:
    """A packing LP max c x, A x <= b, x >= 0 with random positive data (bounded)."""
    rng = np.random.default_rng(seed)
    A = sp.random(m, n, density=0.3, random_state=seed, format="csr",
                  data_rvs=lambda k: rng.uniform(0.5, 2.0, k))
    A = A + sp.csr_matrix((np.ones(n), (rng.integers(0, m, n), np.arange(n))), shape=(m, n))
    return LinearProgram(c=rng.uniform(1, 3, n), A=A, row_lo=np.full(m, -INF),
                         row_hi=rng.uniform(2, 5, m), col_lo=np.zeros(n), col_hi=np.full(n, INF))


def cold(name: str, lp: LinearProgram):
    with get_backend(name) as b:
        b.load(lp)
        return b.solve(method="dual")


def check_dual_certificate(lp: LinearProgram, sol, tol=1e-6):
    """An independent optimality proof for the packing LP: y >= 0, c - A^T y <= 0 and
    b^T y equals the primal objective (strong duality)."""
    y = sol.row_duals
    assert (y >= -tol).all()
    assert (lp.c - lp.A.T @ y <= tol).all()
    assert float(lp.row_hi @ y) == pytest.approx(sol.objective, rel=1e-7)
    assert (lp.A @ sol.x <= lp.row_hi + tol).all() and (sol.x >= -tol).all()


def test_add_columns_then_rows_warm_equals_cold(backend):
    full = random_lp(1)
    k = 30
    A = full.A.tocsc()
    first = LinearProgram(c=full.c[:k], A=A[:, :k], row_lo=full.row_lo, row_hi=full.row_hi,
                          col_lo=full.col_lo[:k], col_hi=full.col_hi[:k])
    backend.load(first)
    s1 = backend.solve()
    assert s1.status is SolveStatus.OPTIMAL
    rest = A[:, k:]
    backend.add_columns(full.c[k:], full.col_lo[k:], full.col_hi[k:],
                        rest.indptr, rest.indices, rest.data)
    assert backend.num_cols == full.num_cols
    warm = backend.solve()
    ref = cold(backend.name, full)
    assert warm.status is SolveStatus.OPTIMAL
    assert warm.objective == pytest.approx(ref.objective, rel=1e-9)
    assert warm.objective >= s1.objective - 1e-9
    np.testing.assert_allclose(warm.row_duals, ref.row_duals, atol=1e-7)
    check_dual_certificate(full, warm)

    # add two rows: a cap on the sum of all columns and a single-variable row
    cap = 0.5 * warm.objective / full.c.max()
    j = int(np.argmax(warm.x))
    rows = sp.csr_matrix(np.vstack([np.ones(full.num_cols), np.eye(full.num_cols)[j]]))
    backend.add_rows([-INF, -INF], [cap, 0.5 * warm.x[j]], rows.indptr, rows.indices, rows.data)
    assert backend.num_rows == full.num_rows + 2
    warm2 = backend.solve()
    both = LinearProgram(c=full.c, A=sp.vstack([full.A, rows]),
                         row_lo=np.full(full.num_rows + 2, -INF),
                         row_hi=np.concatenate([full.row_hi, [cap, 0.5 * warm.x[j]]]),
                         col_lo=full.col_lo, col_hi=full.col_hi)
    ref2 = cold(backend.name, both)
    assert warm2.objective == pytest.approx(ref2.objective, rel=1e-9)
    assert warm2.objective < warm.objective
    check_dual_certificate(both, warm2)


def test_bounds_and_delete_columns_equal_cold(backend):
    full = random_lp(2)
    backend.load(full)
    base = backend.solve()
    used = np.flatnonzero(base.x > 1e-6)
    # fixing the largest used column to zero must match a cold solve with that bound
    j = int(used[np.argmax(base.x[used])])
    backend.set_column_bounds(np.array([j]), np.array([0.0]), np.array([0.0]))
    fixed = backend.solve()
    hi = full.col_hi.copy()
    hi[j] = 0.0
    ref = cold(backend.name, LinearProgram(c=full.c, A=full.A, row_lo=full.row_lo,
                                           row_hi=full.row_hi, col_lo=full.col_lo, col_hi=hi))
    assert fixed.objective == pytest.approx(ref.objective, rel=1e-9)
    assert fixed.objective <= base.objective + 1e-9
    # deleting it (and the last column) keeps the others in order
    drop = np.array([j, full.num_cols - 1])
    backend.delete_columns(drop)
    assert backend.num_cols == full.num_cols - 2
    after = backend.solve()
    keep = np.setdiff1d(np.arange(full.num_cols), drop)
    A = full.A.tocsc()[:, keep]
    small = LinearProgram(c=full.c[keep], A=A, row_lo=full.row_lo, row_hi=full.row_hi,
                          col_lo=full.col_lo[keep], col_hi=full.col_hi[keep])
    ref2 = cold(backend.name, small)
    assert after.objective == pytest.approx(ref2.objective, rel=1e-9)
    np.testing.assert_allclose(after.x @ small.c, after.objective, rtol=1e-9)
    check_dual_certificate(small, after)


def _with(lp: LinearProgram, A=None, row_lo=None, row_hi=None) -> LinearProgram:
    return LinearProgram(c=lp.c, A=lp.A if A is None else A,
                         row_lo=lp.row_lo if row_lo is None else row_lo,
                         row_hi=lp.row_hi if row_hi is None else row_hi,
                         col_lo=lp.col_lo, col_hi=lp.col_hi, sense=lp.sense)


def test_change_coefficients_in_place_equals_cold(backend):
    full = random_lp(3)
    backend.load(full)
    base = backend.solve()
    # scale a used column's entries up (it gets dearer), add a new entry, remove one
    j = int(np.argmax(base.x))
    A = full.A.tolil()
    rows = full.A.tocsc()[:, j].indices
    new_row = int(np.setdiff1d(np.arange(full.num_rows), rows)[0])
    r = np.concatenate([rows, [new_row], [rows[0]]])
    c = np.full(r.size, j)
    v = np.concatenate([3.0 * full.A.tocsc()[:, j].data, [1.5], [0.0]])   # last entry wins
    for i, jj, a in zip(r, c, v):
        A[i, jj] = a
    backend.change_coefficients(r, c, v)
    warm = backend.solve()
    changed = _with(full, A=A.tocsr())
    ref = cold(backend.name, changed)
    assert warm.status is SolveStatus.OPTIMAL
    assert warm.objective == pytest.approx(ref.objective, rel=1e-9)
    assert warm.objective < base.objective
    check_dual_certificate(changed, warm)
    # the same model still takes columns after the change
    k = backend.num_cols
    backend.add_columns([2.0], [0.0], [INF], [0, 1], [new_row], [1.0])
    assert backend.num_cols == k + 1 and backend.solve().objective >= warm.objective - 1e-9


def test_set_row_bounds_in_place_equals_cold(backend):
    full = random_lp(4)
    backend.load(full)
    backend.solve()
    rows = np.array([0, 5, 7])
    hi = full.row_hi.copy()
    hi[rows] = [0.5, 10.0, 1.0]
    lo = full.row_lo.copy()
    lo[7] = 0.25                                   # row 7 becomes a range row
    backend.set_row_bounds(rows, lo[rows], hi[rows])
    warm = backend.solve()
    ref = cold(backend.name, _with(full, row_lo=lo, row_hi=hi))
    assert warm.status is SolveStatus.OPTIMAL
    assert warm.objective == pytest.approx(ref.objective, rel=1e-9)
    activity = full.A @ warm.x
    assert (activity <= hi + 1e-7).all() and (activity >= lo - 1e-7).all()
    # and back: the original bounds give the original optimum
    backend.set_row_bounds(rows, full.row_lo[rows], full.row_hi[rows])
    assert backend.solve().objective == pytest.approx(cold(backend.name, full).objective, rel=1e-9)


def test_basis_survives_a_rebuild_and_restarts_warm(backend):
    lp = random_lp(5, m=40, n=80)
    backend.load(lp)
    first = backend.solve(method="dual")
    basis = backend.get_basis()
    assert basis is not None and basis.backend == backend.name
    assert basis.col_status.shape == (lp.num_cols,) and basis.row_status.shape == (lp.num_rows,)
    assert int((basis.col_status == basis.BASIC).sum() + (basis.row_status == basis.BASIC).sum()) \
        == lp.num_rows
    with get_backend(backend.name) as again:
        again.load(lp)
        again.set_basis(basis)
        re = again.solve(method="primal")
        assert re.objective == pytest.approx(first.objective, rel=1e-9)
        assert re.iterations <= 1 < first.iterations      # the optimal basis needs no pivot
        with pytest.raises(FormulationError, match="model is"):
            again.set_basis(type(basis)(basis.col_status[:-1], basis.row_status, backend.name))
        with pytest.raises(FormulationError, match="cannot start"):
            again.set_basis(type(basis)(basis.col_status, basis.row_status, "other"))


def test_change_coefficients_rejects_bad_input(backend):
    backend.load(random_lp(6))
    with pytest.raises(FormulationError, match="outside"):
        backend.change_coefficients([0], [10_000], [1.0])
    with pytest.raises(FormulationError, match="equal"):
        backend.change_coefficients([0, 1], [0], [1.0])
    with pytest.raises(FormulationError, match="finite"):
        backend.change_coefficients([0], [0], [np.nan])


@pytest.mark.parametrize("method", ["dual", "primal"])
def test_iteration_limit(backend, method):
    lp = random_lp(3, m=150, n=220)
    backend.load(lp)
    sol = backend.solve(method=method, iteration_limit=1)
    assert sol.status is SolveStatus.ITERATION_LIMIT
    assert sol.iterations <= 1
    if sol.x is not None:  # a point reported at a limit is feasible
        assert (lp.A @ sol.x <= lp.row_hi + 1e-7).all() and (sol.x >= -1e-9).all()
        assert sol.objective == pytest.approx(float(lp.c @ sol.x))
    full = backend.solve(method="dual")  # lifting the limit finishes the solve
    assert full.status is SolveStatus.OPTIMAL
    check_dual_certificate(lp, full)


def test_a_time_limit_counts_from_the_solve_it_is_given_to(backend):
    """A model solved many times (column generation) and then given a limit longer than
    its next solve needs finishes that solve: HiGHS before 2.0 compared the limit with the
    run time of all its solves so far and stopped at once."""
    big = random_lp(5, m=300, n=600)
    spent = 0.0
    while spent < 0.3:                                # solves totalling 0.3 s of run time
        backend.load(big)
        spent += backend.solve(method="dual").seconds
    backend.load(max_case())
    sol = backend.solve(time_limit=0.25)              # far more than this 4x4 LP needs
    assert sol.status is SolveStatus.OPTIMAL and sol.objective == pytest.approx(10.5)


def test_infeasible_and_unbounded(backend):
    infeasible = lp_of([1, 1], [[1, 0], [1, 1]], [5, -INF], [INF, 3])
    backend.load(infeasible)
    sol = backend.solve()
    assert sol.status is SolveStatus.INFEASIBLE
    assert sol.row_duals is None

    unbounded = lp_of([1, 1], [[1, -1]], [-INF], [3])
    backend.load(unbounded)
    assert backend.solve().status is SolveStatus.UNBOUNDED

    min_unbounded = lp_of([1, 0], [[1, 1]], [-INF], [3], col_lo=[-INF, 0], sense="min")
    backend.load(min_unbounded)
    assert backend.solve().status is SolveStatus.UNBOUNDED


def knapsack() -> tuple[LinearProgram, float]:
    """max 5a + 4b + 3c over three <= rows, integers in [0, 4]; optimum by enumeration."""
    c = np.array([5.0, 4.0, 3.0])
    A = np.array([[2, 3, 1], [4, 1, 2], [3, 4, 2]], dtype=float)
    b = np.array([6.0, 11.0, 9.0])
    best = max(float(c @ p) for p in itertools.product(range(5), repeat=3)
               if (A @ np.array(p) <= b).all())
    return lp_of(c, A, [-INF] * 3, b, col_hi=[4, 4, 4], integrality=[True] * 3), best


def test_small_mip(backend):
    lp, best = knapsack()
    assert best == 14.0
    backend.load(lp)
    relax = backend.solve()  # the LP relaxation: 14.5 (scipy.optimize.linprog agrees)
    assert relax.status is SolveStatus.OPTIMAL and relax.objective == pytest.approx(14.5)
    sol = backend.solve_mip(time_limit=30, mip_gap=0.0)
    assert sol.status is SolveStatus.OPTIMAL
    assert sol.objective == pytest.approx(best)
    np.testing.assert_allclose(sol.x, np.round(sol.x), atol=1e-6)
    assert (lp.A @ sol.x <= lp.row_hi + 1e-6).all()
    assert sol.mip_bound == pytest.approx(best, abs=1e-6)
    assert sol.mip_gap == pytest.approx(0.0, abs=1e-6)
    # the LP relaxation is still available afterwards
    assert backend.solve().objective == pytest.approx(relax.objective)


@pytest.mark.parametrize("name", BACKENDS)
def test_presolve_off_gives_the_same_answers(name):
    """``presolve=False`` (used for warm re-solves of small LPs) changes nothing but the
    solver's route: same optimum and duals, same infeasible/unbounded statuses, same MIP."""
    backend = get_backend(name, presolve=False)
    assert backend.presolve is False
    if name == "highs":
        assert backend._h.getOptionValue("presolve")[-1] == "off"
    backend.load(max_case())
    sol = backend.solve()
    assert sol.objective == pytest.approx(10.5, abs=1e-6)
    np.testing.assert_allclose(sol.row_duals, [0.5, 2.5, -1.5, 0], atol=1e-6)
    backend.load(lp_of([1, 1], [[1, 0], [1, 1]], [5, -INF], [INF, 3]))
    assert backend.solve().status is SolveStatus.INFEASIBLE
    backend.load(lp_of([1, 1], [[1, -1]], [-INF], [3]))
    assert backend.solve().status is SolveStatus.UNBOUNDED
    lp, best = knapsack()
    backend.load(lp)
    assert backend.solve_mip(time_limit=30, mip_gap=0.0).objective == pytest.approx(best)
    backend.close()


def test_bad_arrays_raise_formulation_error(backend):
    backend.load(max_case())
    with pytest.raises(FormulationError, match="starts"):
        backend.add_columns([1.0], [0.0], [1.0], [0], [0], [1.0])
    with pytest.raises(FormulationError, match="out of range"):
        backend.add_columns([1.0], [0.0], [1.0], [0, 1], [99], [1.0])
    with pytest.raises(FormulationError, match="method"):
        backend.solve(method="barrier")


@pytest.mark.skipif("gurobi" not in BACKENDS, reason="gurobipy not installed")
def test_gurobi_size_limited_licence_raises():
    n = 2100
    lp = LinearProgram(c=np.ones(n), A=sp.csr_matrix(np.ones((1, n))), row_lo=[-INF],
                       row_hi=[10.0], col_lo=np.zeros(n), col_hi=np.ones(n))
    with get_backend("gurobi") as b:
        b.load(lp)
        try:
            sol = b.solve()
        except SolverLicenseError as exc:
            msg = str(exc)
            assert "2100 variables" in msg and "2000" in msg and "highs" in msg
            return
    assert sol.objective == pytest.approx(10.0)
    pytest.skip("a full Gurobi licence is installed: the model solved")


def test_unknown_backend():
    with pytest.raises(SolverNotAvailableError, match="unknown backend"):
        get_backend("nonexistent")


@pytest.mark.parametrize("name,package", [("gurobi", "gurobipy"), ("scip", "pyscipopt"),
                                          ("highs", "highspy")])
def test_missing_package_names_pip_package(monkeypatch, name, package):
    real = importlib.util.find_spec

    def fake(mod, *args, **kwargs):
        return None if mod == package else real(mod, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", fake)
    assert name not in available_backends()
    with pytest.raises(SolverNotAvailableError, match=f"pip install {package}"):
        get_backend(name)


def test_highs_recovers_when_another_highs_started_the_thread_pool():
    """HiGHS's scheduler is process-wide; a Highs object run with default threads before
    our single-thread adapter must not make the adapter return NOT_SOLVED."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import highspy, numpy as np, scipy.sparse as sp
        from formulations.lp import LinearProgram
        from mccl_opt.backends import get_backend
        other = highspy.Highs()
        other.setOptionValue("output_flag", False)
        other.addVar(0, 1)
        other.run()
        lp = LinearProgram(c=[1.0, 1.0], A=sp.csr_matrix(np.array([[1.0, 2.0]])),
                           row_lo=[-np.inf], row_hi=[4.0], col_lo=[0, 0], col_hi=[3, 3])
        b = get_backend("highs")
        b.load(lp)
        sol = b.solve()
        print(sol.status.value, round(sol.objective, 9))
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split()[-2:] == ["optimal", "3.5"]


@pytest.mark.parametrize("name", BACKENDS)
def test_feasibility_tolerance_is_an_option_of_every_backend(name):
    """``feasibility_tol`` (the general method's tree master sets it) reaches the solver
    and changes no answer; a value outside (0, 1) is a typed error naming the option."""
    backend = get_backend(name, feasibility_tol=1e-9)
    assert backend.feasibility_tol == 1e-9
    if name == "highs":
        assert backend._h.getOptionValue("primal_feasibility_tolerance")[-1] == 1e-9
    backend.load(max_case())
    sol = backend.solve()
    assert sol.objective == pytest.approx(10.5, abs=1e-9)
    np.testing.assert_allclose(sol.row_duals, [0.5, 2.5, -1.5, 0], atol=1e-9)
    backend.close()
    for bad in (0.0, -1e-9, 1.0, float("nan")):
        with pytest.raises(InputError, match="feasibility_tol"):
            get_backend(name, feasibility_tol=bad)
