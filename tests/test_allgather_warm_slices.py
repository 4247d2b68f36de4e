"""The warm steps' compiled work is cut into pieces the warm allowance can stop
(docs/allgather.md, *Warm never slower than cold*).

* ForestColl-warm's rerouting runs in slices of counted work with the clock checked
  between them: resuming at a slice's end gives the moves of one unsliced pass, and an
  allowance that passes during the rerouting stops it before the next slice;
* the packing seeded with the previous trees is sized to the allowance left and gives
  the warm stage up (:func:`mccl_opt.anytime.give_up`) when it cannot finish within it;
* the general method's warm column generation checks the clock within a round too;
* either way the solve carries on cold: valid, and at ``max_chunks=None`` cold's rate.

No test here times anything: an allowance is made to pass after a counted number of
slices, or a packing is told it has no room.
"""

from __future__ import annotations

import numpy as np
import pytest

import mccl_opt as mo
from instances import hpn
from mccl_opt import anytime
from mccl_opt.allgather import chain, solve as ag_solve
from mccl_opt.allgather.forestcoll import sized
from mccl_opt.allgather.general import tree_colgen
from mccl_opt.allgather.warm import certify, reroute
from mccl_opt.allgather.warm import route as warm_route
from mccl_opt.report import Method

from .oracle_allgather import check_schedule

#: a NIC degraded one way on HPN 1x2x8: at ``max_chunks=None`` the x* guess is
#: certified by rerouting the previous trees, in several slices of :data:`SLICE` work
ONE_WAY_NIC = {("s0h0g0", "s0tor0"): 100.0}
SLICE = 50


@pytest.fixture(name="slices")
def _slices(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Small slices; the work of every slice run, in order."""
    monkeypatch.setattr(reroute, "REROUTE_SLICE_WORK", SLICE)
    work: list[int] = []
    real = reroute._reroute_edges

    def counted(*args):
        out = real(*args)
        work.append(int(out[4]))
        return out

    monkeypatch.setattr(reroute, "_reroute_edges", counted)
    return work


def _states() -> tuple[mo.Topology, mo.Schedule, mo.Schedule]:
    base = hpn(1, 2, 8)
    prev = mo.solve_allgather(base, max_chunks=None)
    topo = base.with_capacity(ONE_WAY_NIC)
    return topo, prev, mo.solve_allgather(topo, max_chunks=None)


def _rerouted(monkeypatch: pytest.MonkeyPatch) -> list[reroute.Rerouted | None]:
    """Every rerouting result of the warm guesses, in order."""
    found: list[reroute.Rerouted | None] = []
    real = certify.reroute

    def kept(*args):
        found.append(real(*args))
        return found[-1]

    monkeypatch.setattr(certify, "reroute", kept)
    return found


def test_slices_resume_where_they_stopped(slices, monkeypatch):
    """Sliced and in one slice, the rerouting makes the same moves and certifies the
    same optimum (the allowance and the rerouting's cold cap lifted: small slices on a
    loaded machine must not turn the route cold, which the other tests here check)."""
    monkeypatch.setattr(warm_route, "WARM_SHARE", 1e3)
    monkeypatch.setattr(warm_route, "COLD_SHARE", 1e6)
    monkeypatch.setattr(reroute, "REROUTE_COLD_SHARE", 1e6)
    topo, prev, cold = _states()
    found = _rerouted(monkeypatch)
    warm = mo.solve_allgather(topo, warm=prev, max_chunks=None)
    assert warm.stats["phase1_guess"] == certify.Certificate.REROUTED.value
    assert len(slices) > 2 and sum(slices) > 2 * SLICE           # it needed several slices
    sliced = found[-1]

    monkeypatch.setattr(reroute, "REROUTE_SLICE_WORK", 1 << 40)
    slices.clear()
    whole = mo.solve_allgather(topo, warm=prev, max_chunks=None)
    assert len(slices) == 1
    one = found[-1]
    assert sliced is not None and one is not None
    assert sliced.moved_edges == one.moved_edges and sliced.rebuilt_trees == one.rebuilt_trees
    assert np.array_equal(sliced.loads, one.loads)
    assert np.array_equal(sliced.forest.parent, one.forest.parent)
    for sched in (warm, whole):
        mo.validate(topo, sched)
        assert sched.rate_gbps == pytest.approx(cold.rate_gbps, rel=1e-9)


def test_the_rerouting_stops_within_its_allowance(slices, monkeypatch):
    """The allowance passes after the second slice: no third slice runs, the warm
    guesses are declined and the solve carries on cold, valid at cold's rate."""
    topo, prev, cold = _states()
    real = reroute._reroute_edges          # the counting wrapper

    def then_spent(*args):
        out = real(*args)
        if len(slices) == 2:
            anytime.current().deadline = float("-inf")     # the warm stage's allowance
        return out

    monkeypatch.setattr(reroute, "_reroute_edges", then_spent)
    warm = mo.solve_allgather(topo, warm=prev, max_chunks=None)
    assert len(slices) == 2
    assert "spent in ForestColl-warm's guesses" in warm.stats["warm_declined"]
    assert warm.stats["warm_route"] == "declined"
    mo.validate(topo, warm)
    check_schedule(topo, warm, None)
    assert warm.rate_gbps == pytest.approx(cold.rate_gbps, rel=1e-9)


def test_a_seeded_packing_without_room_gives_the_warm_stage_up(monkeypatch):
    """Guesses and rerouting fail (made to), so the warm path reaches the packing
    seeded with the previous trees; told that the allowance left cannot pay for it, it
    gives the stage up at once and the cold packing runs: valid, cold's rate."""
    topo, prev, cold = _states()
    monkeypatch.setattr(ag_solve, "_certified_guess", lambda run: None)
    monkeypatch.setattr(ag_solve, "keep_or_reroute", lambda run, budget: None)
    asked: list[int] = []

    def no_room(entries: int, visits: int) -> int | None:
        if anytime.time_left() is None:                 # no limit: nothing to size
            return visits
        asked.append(entries)
        return None

    monkeypatch.setattr(sized, "sized_visits", no_room)
    warm = mo.solve_allgather(topo, warm=prev, max_chunks=None)
    assert len(asked) == 1                              # the cold packing has no limit
    assert "spent in the packing seeded with the previous trees" in warm.stats["warm_declined"]
    mo.validate(topo, warm)
    assert warm.rate_gbps == pytest.approx(cold.rate_gbps, rel=1e-9)


def test_sized_visits_and_give_up():
    """The visit cap follows the stage's time left (no stage: the cap asked for); giving
    up ends the innermost stage only, and outside a stage does nothing."""
    entries = 1000
    assert sized.sized_visits(entries, 7) == 7                     # no limit, no cut
    capped, _ = anytime.stage(0.5, lambda: sized.sized_visits(entries * 10**6, entries))
    assert capped is None                                             # growth outlasts it
    small, _ = anytime.stage(0.5, lambda: sized.sized_visits(entries, entries))
    assert 0 < small <= entries

    anytime.give_up("nowhere")                                        # no stage: a no-op
    assert anytime.limited(60.0, lambda: anytime.give_up("a limit is no stage") or "done") \
        == ("done", None)

    def abandoned() -> str:
        anytime.give_up("too little left")
        return "finished"

    assert anytime.stage(60.0, abandoned) == (None, True)


def test_the_general_method_stops_within_a_round(monkeypatch):
    """The general method warm-started from its own columns: the allowance passes at
    its first pricing point; no further point is priced in that round (the clock was
    checked only between rounds), the warm step is declined and the cold run's rate
    is returned."""
    monkeypatch.setattr(chain, "solve_by_restriction", lambda *args, **kwargs: None)
    monkeypatch.setattr(chain, "_restriction_seed", lambda *args, **kwargs: chain.SeedOnce(lambda: None))   # no seed
    base = hpn(1, 2, 4)
    topo = base.with_capacity({("s0h0g0", "s0h0nvs"): 180.0})
    first = mo.solve_allgather(topo, max_chunks=None)
    assert first.report.method is Method.GENERAL
    later = topo.with_capacity({("s0h1g2", "s0tor2"): 150.0})
    cold = mo.solve_allgather(later, max_chunks=None)
    priced: list[bool] = []
    real = tree_colgen._candidates

    def then_spent(*args):
        stage = anytime.current()
        priced.append(stage is not None and stage.is_stage)
        if priced == [True]:
            stage.deadline = float("-inf")          # the warm step's allowance
        return real(*args)

    monkeypatch.setattr(tree_colgen, "_candidates", then_spent)
    warm = mo.solve_allgather(later, warm=first, max_chunks=None)
    assert priced[0] and priced.count(True) == 1      # nothing priced warm after it passed
    assert "spent in the general method" in warm.stats["warm_declined"]
    mo.validate(later, warm)
    assert warm.rate_gbps == pytest.approx(cold.rate_gbps, rel=1e-9)
