"""A warm solve whose cold route is the seeded general method takes that route without
ForestColl-warm's guesses: a guess at a tree count cold declines is not certified, so
the warm allowance is not spent on rerouting the previous trees (docs/allgather.md
"Warm skips what cold declines")."""

from __future__ import annotations

import mccl_opt as mo
from bench.fabric_variants import without_cables
from instances.aggregation import multi_spine
from mccl_opt.report import Method
from tests.oracle_allgather import check_schedule, cut_bound


def test_a_warm_solve_takes_the_seeded_general_route_of_cold() -> None:
    # fuzz seed 3525's half-uplinks 2x8x8 (4 spines, s0tor0 without two uplinks): a one-way
    # fault, then a two-way one whose weaker-direction optimum needs 293 trees per root
    base = without_cables(multi_spine(2, 8, 8, spines=4), "s0tor0", ["spine2", "spine3"])
    before = base.with_capacity(src="s0tor1", dst="spine3", gbps=40.0, both_directions=False)
    topo = before.with_capacity(src="s1tor1", dst="s1h1g1", gbps=50.0)
    previous = mo.solve_allgather(before, max_chunks=None)
    assert previous.report.method is Method.WEAKER_DIRECTIONS      # trees to reroute
    cold = mo.solve_allgather(topo, max_chunks=None)
    warm = mo.solve_allgather(topo, warm=previous, max_chunks=None)
    check_schedule(topo, warm)
    bound = cut_bound(topo)
    assert abs(warm.rate_gbps - bound) <= 1e-9 * bound                # the optimum, as cold's
    assert abs(cold.rate_gbps - bound) <= 1e-9 * bound
    assert warm.report.method is cold.report.method is Method.GENERAL
    # the same methods with the same outcomes: no guess certified, none that spent the
    # allowance and was redone cold
    outcomes = [(a.method, a.outcome) for a in warm.report.attempts]
    assert outcomes == [(a.method, a.outcome) for a in cold.report.attempts]
    assert outcomes[0][1].endswith("exact trees per root: the seeded master is cheaper")
    assert warm.stats["warm_route"] == "declined" and "warm_declined" not in warm.stats
    assert len(warm.chunks) <= topo.num_gpus + topo.num_links       # not the rerouted forest
