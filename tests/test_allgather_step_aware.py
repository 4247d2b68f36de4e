"""Step-aware switch removal (paper App. C): valid schedules at the optimum rate, never
deeper than the default, strictly shallower where the hop LP proves depth 2, exported
models, every backend."""

from __future__ import annotations

import highspy
import numpy as np
import pytest

from formulations.export import write_mps
from formulations.lp import FormulationError
from formulations.switch_removal import (SwitchRemovalModel, build_step_lp,
                                         build_switch_removal_lp, hop_columns)
from instances import fail1, fail2, hpn
from mccl_opt import validate
from mccl_opt.allgather import solve_allgather
from mccl_opt.allgather.forestcoll.capped import capped_pack, class_depths
from mccl_opt.allgather.forestcoll.step_aware import StepAware
from mccl_opt.allgather.forestcoll.removal.splitting import LogicalGraph
from mccl_opt.backends import available_backends, get_backend
from mccl_opt.errors import SolverLicenseError

CASES = {
    "1x2x8": lambda: hpn(1, 2, 8),
    "1x2x8-fail1": lambda: fail1(hpn(1, 2, 8)),
    "1x2x8-fail2": lambda: fail2(hpn(1, 2, 8)),
    "1x4x8-fail1": lambda: fail1(hpn(1, 4, 8)),
    "1x4x8-fail2": lambda: fail2(hpn(1, 4, 8)),
}


def _max_depth(schedule) -> int:
    return max(max(c.depths().values()) for c in schedule.chunks)


@pytest.mark.parametrize("name", sorted(CASES))
def test_step_aware_valid_optimal_and_not_deeper(name):
    topo = CASES[name]()
    cold = solve_allgather(topo)
    sa = solve_allgather(topo, step_aware=True)
    report = validate(topo, sa)
    assert report is not None
    # every root's trees reach every GPU with shares summing to one (validate) and the
    # rate is the cold optimum of the same chunk budget
    assert sa.rate_gbps == pytest.approx(cold.rate_gbps, rel=1e-9)
    assert sa.rate_gbps <= sa.lp_rate_gbps * (1 + 1e-9)
    assert sa.stats["max_depth"] == _max_depth(sa)
    assert _max_depth(sa) <= _max_depth(cold)


def test_strictly_shallower_where_the_hop_lp_proves_depth_two():
    """HPN 1x2x8 with Fail1: the default packing needs more hops; the hop-indexed LP is
    feasible at depth 2 and the planned packing realises it (depth 1 is impossible:
    no GPU shares a switch with all others)."""
    topo = fail1(hpn(1, 2, 8))
    cold = solve_allgather(topo)
    sa = solve_allgather(topo, step_aware=True)
    validate(topo, sa)
    assert _max_depth(sa) == 2 == sa.stats["sa_depth_lower_bound"]
    assert _max_depth(sa) < _max_depth(cold)
    assert sa.stats["split"] == "step-aware"


def test_infeasible_depth_is_a_lower_bound():
    """Fail2 on 1x2x8: the relaxation is infeasible at depth 2, so no schedule (neither
    the default nor step-aware) has all trees of depth 2."""
    topo = fail2(hpn(1, 2, 8))
    sa = solve_allgather(topo, step_aware=True)
    assert sa.stats["sa_depth_lower_bound"] == 3
    assert _max_depth(sa) > 2
    assert _max_depth(solve_allgather(topo)) > 2


def test_tolerance_trades_rate_for_depth_within_the_bound():
    topo = fail2(hpn(1, 2, 8))
    sa = solve_allgather(topo, step_aware=StepAware(tolerance=0.3))
    validate(topo, sa)
    cold = solve_allgather(topo)
    assert sa.rate_gbps >= 0.7 * cold.rate_gbps * (1 - 1e-9)
    assert _max_depth(sa) <= _max_depth(cold)


def test_even_objective_is_valid_and_not_deeper():
    topo = fail1(hpn(1, 2, 4))
    sa = solve_allgather(topo, step_aware=StepAware(objective="even"))
    validate(topo, sa)
    assert _max_depth(sa) <= _max_depth(solve_allgather(topo))


@pytest.mark.parametrize("backend", ["highs", "gurobi", "scip"])
def test_every_installed_backend(backend):
    if backend not in available_backends():
        pytest.skip(f"{backend} not installed")
    topo = fail1(hpn(1, 2, 4))
    cold = solve_allgather(topo)
    try:
        sa = solve_allgather(topo, backend=backend, step_aware=True)
    except SolverLicenseError as exc:
        pytest.skip(str(exc))
    validate(topo, sa)
    assert sa.rate_gbps == pytest.approx(cold.rate_gbps, rel=1e-9)
    assert _max_depth(sa) <= _max_depth(cold)


# ---------------------------------------------------------------------- formulation
def _star(units: float, k: float, n: int = 3) -> SwitchRemovalModel:
    """``n`` GPUs on one switch; arcs ``g -> w`` are 0..n-1, ``w -> g`` are n..2n-1."""
    triples = [(u, t) for u in range(n) for t in range(n) if u != t]
    return SwitchRemovalModel(
        num_gpus=n, arc_units=np.full(2 * n, units),
        triple_in=np.array([u for u, _ in triples]), triple_out=np.array([n + t for _, t in triples]),
        triple_u=np.array([u for u, _ in triples]), triple_t=np.array([t for _, t in triples]),
        direct_tail=np.zeros(0, np.int64), direct_head=np.zeros(0, np.int64),
        direct_units=np.zeros(0), k_keep=k)


def _highs_objective(lp) -> tuple[str, float | None]:
    backend = get_backend("highs")
    backend.load(lp)
    sol = backend.solve()
    return sol.status.value, sol.objective


def test_hop_lp_star_optimum_and_infeasibility():
    # 3 GPUs, 2 units in and out each, k = 1: every root reaches both others directly,
    # sum of depths = 3 roots x 2 vertices x 1 hop x 1 tree
    lp, hops = build_step_lp(_star(2.0, 1.0), max_depth=1)
    assert len(hops) == 6 and (hops[:, 3] == 1).all()
    assert _highs_objective(lp) == ("optimal", pytest.approx(6.0))
    # k = 2 needs 4 units into every GPU: infeasible at any depth
    lp2, _ = build_step_lp(_star(2.0, 2.0), max_depth=2)
    assert _highs_objective(lp2)[0] == "infeasible"


def test_exported_models_reimport_into_highs(tmp_path):
    model = _star(3.0, 1.0, n=4)
    cuts = [np.array([True, False, False, False]), np.array([False, True, True, True])]
    for lp in (build_step_lp(model, 2, cuts)[0], build_switch_removal_lp(model, cuts)):
        status, ours = _highs_objective(lp)
        assert status == "optimal"
        h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        assert h.readModel(str(write_mps(lp, tmp_path / f"{lp.name}.mps"))) == \
            highspy.HighsStatus.kOk
        h.run()
        assert h.getModelStatus() == highspy.HighsModelStatus.kOptimal
        assert h.getInfo().objective_function_value == pytest.approx(ours, rel=1e-9)


def test_hop_columns_respect_depth_rules():
    model = _star(3.0, 1.0, n=4)
    hops = hop_columns(model, 3)
    r, u, v, d = hops.T
    assert ((d == 1) == (u == r)).all()          # depth 1 only from the root
    assert (v != r).all()                        # nothing enters the root


def test_hop_lp_beyond_max_columns_keeps_the_default_packing():
    """The column count the size guard uses is the hop LP's; above ``max_columns`` no
    LP is built, the default packing is returned and ``sa_skipped`` says why."""
    from formulations.switch_removal import logical_links

    model = _star(3.0, 1.0, n=5)
    links, n = len(logical_links(model)), model.num_gpus
    for depth in (1, 2, 4):
        assert len(hop_columns(model, depth)) == links * (1 + (depth - 1) * (n - 2))
    topo = fail1(hpn(1, 2, 8))
    sa = solve_allgather(topo, step_aware=StepAware(max_columns=100))
    validate(topo, sa)
    assert "max_columns=100" in sa.stats["sa_skipped"] and "sa_lp_cols" not in sa.stats
    assert _max_depth(sa) == _max_depth(solve_allgather(topo))
    with pytest.raises(ValueError, match="max_columns"):
        StepAware(max_columns=0)


def test_even_lp_water_fills_the_star():
    # 4 GPUs, 3 units each way: the even optimum gives every ordered pair one unit
    lp = build_switch_removal_lp(_star(3.0, 1.0, n=4))
    backend = get_backend("highs")
    backend.load(lp)
    sol = backend.solve()
    f = sol.x[:12]
    assert np.allclose(f, 1.0)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="tolerance"):
        StepAware(tolerance=1.5)
    with pytest.raises(ValueError, match="objective"):
        StepAware(objective="deepest")
    with pytest.raises(FormulationError, match="u == t"):
        SwitchRemovalModel(num_gpus=2, arc_units=np.ones(2), triple_in=np.array([0]),
                           triple_out=np.array([1]), triple_u=np.array([0]),
                           triple_t=np.array([0]), direct_tail=np.zeros(0, np.int64),
                           direct_head=np.zeros(0, np.int64), direct_units=np.zeros(0),
                           k_keep=1.0)
    with pytest.raises(FormulationError, match="max_depth"):
        build_step_lp(_star(2.0, 1.0), 0)


def test_capped_packing_respects_units_and_depth():
    # complete digraph on 4 GPUs, 1 unit per link, 1 tree per root: stars (depth 1)
    n = 4
    tail, head = np.nonzero(~np.eye(n, dtype=bool))
    lg = LogicalGraph(n, tail.astype(np.int64), head.astype(np.int64),
                      np.ones(tail.size, np.int64), [])
    classes = capped_pack(lg, 1, 1)
    assert classes is not None and (class_depths(classes, lg) == 1).all()
    used = np.zeros(tail.size, np.int64)
    for c in classes:
        for v in np.flatnonzero(c.parent_arc >= 0):
            used[c.parent_arc[v]] += c.mult
    assert (used <= lg.units).all()
    # two trees per root cannot fit in one unit per link
    assert capped_pack(lg, 2, 3) is None
