"""The exact split's amounts guessed and verified (:func:`mccl_opt.allgather.forestcoll.
removal.exact_split._exact_split`; docs/allgather_history.md "Leaf-spine 8x2x8 at `None`: guessed
splits and the largest tight sets").

A guess takes, pair by pair in the greedy's order, all it wants within the slack of the
node sets known so far; one rooted sweep accepts it or learns the sets it broke.  An
accepted guess must be ForestColl's greedy split itself: the same logical links, units
and physical paths as splitting every pair by checks."""

from __future__ import annotations

import numpy as np

from instances.aggregation import leaf_spine, scrambled
from mccl_opt.allgather.canonical import canonical
from mccl_opt.allgather.forestcoll.maxflow import FlowNetwork
from mccl_opt.allgather.forestcoll.pipeline import balanced_split, phase_one_budget
from mccl_opt.allgather.forestcoll.removal import exact_split
from mccl_opt.allgather.forestcoll.removal.exact_split import split_all
from mccl_opt.allgather.forestcoll.removal.splitting import SplitGraph


def _balanced(topo) -> SplitGraph:
    topo = canonical(topo)
    budget = phase_one_budget(topo, None, {})
    return balanced_split(budget.fab, topo.arrays.is_switch, budget.k, budget.y, None).split


def test_guessed_split_is_the_checked_greedy(monkeypatch):
    """Leaf-spine 2x2x8 (41 trees per root), scrambled: guesses fail and learn sets on the
    way (their sweeps find violated sets), yet the split equals the greedy's by checks
    alone (no guess), link by link and path by path."""
    broken: list[int] = []
    real = FlowNetwork.failing_sets

    def spy(self, caps, sinks, demand, most, skip=True):
        rows = real(self, caps, sinks, demand, most, skip)
        broken.append(rows.shape[0])
        return rows

    monkeypatch.setattr(FlowNetwork, "failing_sets", spy)
    g = _balanced(scrambled(leaf_spine(2, 2, 8), 7))
    guessed, checked = g.copy(), g.copy()
    assert split_all(guessed)
    assert any(broken) and broken[-1] == 0, "some guess failed, the last one passed"
    assert split_all(checked, 0)
    assert guessed.units == checked.units
    assert guessed.bundles == checked.bundles


def test_neighbour_sets_cover_a_gpu_only_switch():
    """An NVSwitch of 8 GPUs: every set of its neighbours of two or more nodes, with and
    without it (2·255 - 8 rows); a switch with a switch neighbour: each of its GPU
    neighbours alone (a loop through the switch lowers that GPU's cut), in node order,
    then every union of the hosts those GPUs sit on (NVSwitch and GPUs), with and
    without it."""
    g = _balanced(leaf_spine(2, 2, 8))
    nvswitch = next(w for w in np.flatnonzero(g.is_switch)
                    if not g.is_switch[sorted(g.outs[w])].any())
    sides = exact_split._neighbour_sets(g, int(nvswitch))
    assert sides.shape[0] == 2 * 255 - 8
    assert len({row.tobytes() for row in sides}) == sides.shape[0]
    near = sorted(g.outs[nvswitch])
    assert not sides[:, np.setdiff1d(np.arange(g.n), near + [nvswitch])].any()
    for w in np.flatnonzero(g.is_switch):
        ends = sorted(g.ins.get(w, set()) | g.outs.get(w, set()))
        if not g.is_switch[ends].any():
            continue
        gpus = [x for x in ends if not g.is_switch[x]]      # a leaf's 16, a spine's none
        sides = exact_split._neighbour_sets(g, int(w))
        alone, blocks = sides[: len(gpus)], sides[len(gpus):]
        assert (alone.sum(axis=1) == 1).all()
        assert [int(np.flatnonzero(row)[0]) for row in alone] == gpus
        # a leaf's two hosts (NVSwitch and its 8 GPUs): each, both, with and without it
        hosts = {int(v) for x in gpus for v in g.outs[x] if v != w}
        assert blocks.shape[0] == (6 if gpus else 0) and len(hosts) == (2 if gpus else 0)
        for row in blocks:
            held = {int(v) for v in np.flatnonzero(row & g.is_switch) if v != w}
            assert held and held <= hosts
            assert sorted(np.flatnonzero(row & ~g.is_switch).tolist()) == \
                sorted(x for h in held for x in g.outs[h])
        assert blocks[:, w].sum() == blocks.shape[0] // 2


def test_nvswitches_are_guessed_in_one_batch(monkeypatch):
    """Leaf-spine 2x2x8: the four NVSwitches (GPU neighbours only) are guessed and
    verified together, in 4 sweeps; the sets a failed guess learns leave out the switches
    it emptied (with them each choice of emptied switches was a new set: 7 sweeps).  The
    split is still the one by checks."""
    sweeps: list[int] = []
    batches: list[tuple[list[int], int]] = []
    real_sweep, real_batch = FlowNetwork.failing_sets, exact_split._split_batch

    def sweep(self, caps, sinks, demand, most, skip=True):
        rows = real_sweep(self, caps, sinks, demand, most, skip)
        sweeps.append(rows.shape[0])
        return rows

    def batch(g, switches, known, guesses):
        before = len(sweeps)
        done = real_batch(g, switches, known, guesses)
        batches.append((list(switches), len(sweeps) - before))
        return done

    monkeypatch.setattr(FlowNetwork, "failing_sets", sweep)
    monkeypatch.setattr(exact_split, "_split_batch", batch)
    g = _balanced(leaf_spine(2, 2, 8))
    guessed, checked = g.copy(), g.copy()
    assert split_all(guessed)
    nvswitches = [w for w in np.flatnonzero(g.is_switch).tolist()
                  if not g.is_switch[sorted(g.outs[w])].any()]
    assert (nvswitches, 4) in batches
    assert split_all(checked, 0)
    assert guessed.units == checked.units and guessed.bundles == checked.bundles
