"""The general method's restriction seed uses the restriction's headroom (issue 25;
docs/allgather_history.md "Why the restriction seed packed nothing").

Shared aggregation 2x5x8 with one NIC at 0.9 one way: ForestColl on the balanced
restriction ``c'`` floored every link's tree units on its own, which unbalanced the
switches, and the exact switch removal failed at every chunk count from 10 to 1; the
general method then started from its multiplicative-weights trees (231 rounds, 6.9 s,
stalled).  With the headroom (as the chain's own ForestColl on ``c'`` has it) the seed
packs and the general method reaches the certified optimum in its first master solve."""

from __future__ import annotations

import mccl_opt as mo
from instances.aggregation import shared_aggregation
from mccl_opt.allgather.general.restriction_seed import restriction_seed
from mccl_opt.allgather.restriction.stages import restrict
from mccl_opt.allgather.solve import sub_forestcoll
from mccl_opt.allgather.stage import Trail
from tests.oracle_allgather import check_schedule, cut_bound


def _fabric() -> mo.Topology:
    return shared_aggregation(2, 5, 8).with_capacity(src="s0h2g0", dst="s0tor0", gbps=360.0,
                                                     both_directions=False)


def test_the_seed_packs_on_the_restriction_and_fits_the_fabric():
    topo = _fabric()
    restricted = restrict(topo, "highs")
    assert restricted is not None
    seed = restriction_seed(restricted, sub_forestcoll("highs", Trail()))
    assert seed is not None
    check_schedule(restricted.sub, seed.schedules[0])          # valid trees on c' (so on c)
    assert seed.rate_gbps == restricted.restriction.rate_gbps


def test_the_seeded_solve_reaches_the_certified_optimum(monkeypatch):
    from mccl_opt.allgather import quotient_stages

    monkeypatch.setattr(quotient_stages, "QUOTIENT_MIN_GPUS", 10**9)  # not the quotients
    topo = _fabric()
    s = mo.solve_allgather(topo, max_chunks=None)
    check_schedule(topo, s)
    assert s.stats["seed"] == "balanced restriction"
    optimum = restrict(topo, "highs").restriction.rate_gbps
    assert s.rate_gbps >= optimum * (1 - 1e-6)
    assert s.rate_gbps <= cut_bound(topo) * (1 + 1e-9)
