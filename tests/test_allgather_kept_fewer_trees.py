"""A warm start that keeps a schedule whose chunks the fewer-trees step re-weighted.

The fewer-trees step (``mccl_opt/allgather/fewer_trees.py``) replaces ForestColl's chunks
by fewer trees at the same rate and keeps ForestColl's warm state.  The warm state's link
loads are what a later warm start reads to decide whether the schedule still reaches the
new optimum (``Previous.kept_loads``), so they must be the loads of the chunks the
schedule carries.  Fuzz seed 3533 found a kept schedule that claimed 59.35 Gbps while its
chunks ran at 47.86 (the loads were those of the 441 trees before re-weighting).
"""

from __future__ import annotations

import numpy as np

import mccl_opt as mo
from instances.aggregation import multi_spine, scrambled
from mccl_opt.allgather.canonical import canonical
from mccl_opt.schedule import share_loads


def _chain() -> tuple[mo.Topology, mo.Topology, mo.Topology]:
    """Fuzz seed 3533's multi-spine 2x2x8 chain: a spine cable halved both ways, then a
    NIC cable at 287.154 of 400 Gbps both ways (the names are the scrambled listing's)."""
    base = scrambled(multi_spine(2, 2, 8, spines=2), 464394633)
    first = base.with_capacity({("n00046", "n00044"): 1440.0, ("n00044", "n00046"): 1440.0})
    second = first.with_capacity({("n00014", "n00035"): 287.154, ("n00035", "n00014"): 287.154})
    return base, first, second


def test_the_warm_state_carries_the_loads_of_the_chunks_it_ships() -> None:
    _, first, _ = _chain()
    sched = mo.solve_allgather(first, max_chunks=None)
    assert "fewer_trees_from" in sched.stats          # the step this test is about ran
    loads = share_loads(canonical(first), sched.chunks)
    assert np.allclose(sched.warm_state.trees.loads, loads, rtol=1e-9, atol=1e-9)


def test_a_warm_solve_after_a_re_weighted_schedule_is_valid_at_the_cold_rate() -> None:
    base, first, second = _chain()
    prev = mo.solve_allgather(first, warm=mo.solve_allgather(base, max_chunks=None),
                              max_chunks=None)
    warm = mo.solve_allgather(second, warm=prev, max_chunks=None)
    cold = mo.solve_allgather(second, max_chunks=None)
    mo.validate(second, warm)                          # the rate its chunks reach
    assert abs(warm.rate_gbps - cold.rate_gbps) <= 1e-9 * cold.rate_gbps
