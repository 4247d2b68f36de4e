"""Phase 2's exact switch removal: ForestColl's greedy edge splitting (paper §4.3, Fig. 18),
its amounts guessed and verified (docs/allgather.md "Leaf-spine 8x2x8 at `None`: guessed
splits and the largest tight sets").

Every pair ``(u, t)`` of a switch ``w`` in order is split by the largest amount the two
families of dangerous cuts allow (``S ∋ w, u,t ∉ S`` and ``S ∌ w, u,t ∈ S``); by Mader's
splitting theorem this completes on a balanced fabric and keeps every cut condition.  By
checks each amount costs two rooted sweeps; guessed within the slack of the node sets
known so far and verified by one sweep per guess, a switch costs a few sweeps.
"""

from __future__ import annotations

import numpy as np

from ..maxflow import INF, FlowNetwork
from .splitting import SplitGraph, cut_slack, sink_order, switch_order

__all__ = ["split_all", "MAX_GUESSES", "PAIRS_PER_GUESS", "SEED_MAX_NEIGHBOURS"]


#: guessed plans of one switch's split (:func:`_exact_split`) that may fail their
#: verification sweep before the switch is split by checks (each failure learns new sets,
#: so the guesses cannot cycle), and at most one per :data:`PAIRS_PER_GUESS` pairs: a
#: verification sweep moves all ``k·n`` units from sink to sink and costs about as much as
#: the checks of that many pairs (two sweeps each, where an unbounded terminal absorbs
#: most of the flow), so a switch whose guesses keep failing costs at most ~2x its checks
MAX_GUESSES = 16
PAIRS_PER_GUESS = 4

#: a switch with at most this many neighbours, all GPUs (an NVSwitch), starts its guesses
#: knowing every set made of its neighbours, with and without it (``2^(d+1)`` sets): the
#: sets that bound its greedy split (leaf-spine 8x2x8 with 4 spines: 7-12 guesses per
#: NVSwitch without them, 1-3 with them)
SEED_MAX_NEIGHBOURS = 8


class _SlackSets:
    """Node sets (each holding a GPU) met by the exact split, with their slack
    ``units(δ⁻(S)) - k |V_c \\ S|`` kept current.  Splitting ``a`` units off
    ``u -> w -> t`` lowers the cut of exactly the sets ``S ∋ w, u, t ∉ S`` and
    ``S ∌ w, u, t ∈ S``, each by ``a``, and no other cut (neither a split nor a reduction
    raises one), so a set's slack bounds every later split into it: one of slack 0 rules
    the pair out without a max-flow."""

    def __init__(self, n: int) -> None:
        self.at = np.zeros((n, 0), bool)            # node x is in set i: ``at[x, i]``
        self.slack = np.zeros(0, np.int64)

    def add(self, g: SplitGraph, net: FlowNetwork, caps: np.ndarray, sides: np.ndarray) -> None:
        """Remember the rows of ``sides`` with their slacks under ``caps`` (``net``'s real
        arcs)."""
        tail, head = net.arc_tail[: net.m], net.arc_head[: net.m]
        into = sides[:, head] & ~sides[:, tail]
        slack = into.astype(np.int64) @ caps - g.k * (~sides[:, g.gpus]).sum(axis=1)
        self.at = np.ascontiguousarray(np.hstack([self.at, sides.T]))
        self.slack = np.concatenate([self.slack, slack])

    def forget(self, lo: int, hi: int) -> None:
        """Forget the sets ``lo`` to ``hi`` (exclusive), in the order added."""
        self.at = np.ascontiguousarray(np.delete(self.at, np.s_[lo:hi], axis=1))
        self.slack = np.delete(self.slack, np.s_[lo:hi])

    def hit(self, u: int, w: int, t: int) -> np.ndarray:
        """The sets whose cut a split off ``u -> w -> t`` lowers."""
        at_u, at_t = self.at[u], self.at[t]
        return np.where(self.at[w], ~(at_u | at_t), at_u & at_t)

    def room(self, u: int, w: int, t: int, slack: np.ndarray) -> int:
        """The least ``slack`` (this object's, or a trial copy) of the sets hit."""
        hit = self.hit(u, w, t)
        return int(slack[hit].min()) if hit.any() else int(INF)


def _neighbour_sets(g: SplitGraph, w: int) -> np.ndarray:
    """Every set of ``w``'s neighbours with and without ``w`` (bool rows) where they are
    at most :data:`SEED_MAX_NEIGHBOURS` GPUs, else none; a neighbour alone without ``w``
    is left out (no split of ``w`` lowers its cut)."""
    near = np.array(sorted(g.ins.get(w, set()) | g.outs.get(w, set())), np.int64)
    if near.size > SEED_MAX_NEIGHBOURS or g.is_switch[near].any():
        return np.zeros((0, g.n), bool)
    masks = np.arange(1, 1 << near.size)
    bits = ((masks[:, None] >> np.arange(near.size)) & 1).astype(bool)
    sides = np.zeros((2 * masks.size, g.n), bool)
    sides[:masks.size, near] = bits
    sides[masks.size:, near] = bits
    sides[masks.size:, w] = True
    return sides[(sides.sum(axis=1) > 1)]


def _exact_split(g: SplitGraph, w: int, known: _SlackSets) -> bool:
    """ForestColl's greedy maximal splitting of ``w``, repeated while a pass makes
    progress (a split can make an earlier pair splittable again); ``False`` if arcs
    remain.  One flow network per switch: the arcs with units plus every pair ``u -> t``
    a split of ``w`` can create (zero units until then), so a split only updates three
    capacities (leaf-spine 4x2x8's exact split: 815 networks built in Python -> 14).

    The greedy's amounts are first *guessed* (:func:`_plan`: each pair takes all it
    wants within the slack of the sets in ``known`` and of :func:`_neighbour_sets`) and
    the guess verified by one rooted sweep over the GPUs; a guess that passes is exactly
    the greedy's split (below), one that fails learns the sweep's violated sets and is
    guessed again; after :data:`MAX_GUESSES` (fewer on few pairs) the switch is split by checks
    (:func:`_split_pass`, two sweeps per pair).  Exact: cuts only fall as pairs are
    split, so if the guess's final units keep every cut, each pair's true slack was at
    least its guessed amount when it was split; that amount is ``min(want, slack of a
    known set)`` and the true slack is at most a known set's, so it equals the greedy's
    ``min(want, true slack)``, pair by pair (leaf-spine 8x2x8 with 4 spines: 1 550
    sweeps -> 81)."""
    ends = [(u, t) for u in g.ins.get(w, ()) for t in g.outs.get(w, ()) if u != t]
    keys = sorted(set(g.units) | set(ends))
    net = FlowNetwork(g.n, np.array([a for a, _ in keys], np.int64),
                      np.array([b for _, b in keys], np.int64))
    caps = np.array([g.units.get(key, 0) for key in keys], np.int64)
    index = {key: i for i, key in enumerate(keys)}
    seeded = known.slack.size
    known.add(g, net, caps, _neighbour_sets(g, w))
    learned = known.slack.size
    for _ in range(min(MAX_GUESSES, max(1, len(ends) // PAIRS_PER_GUESS))):
        plan, trial = _plan(g, w, caps, index, known)
        full = net.caps()
        full[: net.m] = trial
        full[net.s_arc0 + g.gpus] = g.k
        broken = net.failing_sets(full, sink_order(g), g.k * g.gpus.size, g.gpus.size)
        if not broken.shape[0]:
            for u, t, amount in plan:
                _apply(g, w, u, t, amount, caps, index, known)
            break
        known.add(g, net, caps, broken)
    else:
        while g.in_arcs(w) and _split_pass(g, w, net, caps, index, known):
            pass
    known.forget(seeded, learned)   # the neighbours' sets bound only this switch's pairs
    return not g.in_arcs(w) and not g.out_arcs(w)


def _plan(g: SplitGraph, w: int, caps: np.ndarray, index: dict[tuple[int, int], int],
          known: _SlackSets) -> tuple[list[tuple[int, int, int]], np.ndarray]:
    """The greedy's passes over ``w``'s pairs (:func:`_split_pass`, in its order) with
    every pair split by ``min(want, room in the known sets)``: the ``(u, t, amount)``
    splits and the units they leave (``caps``'s arcs); ``g`` is left as it is."""
    ins = {u: g.units[(u, w)] for u in g.ins.get(w, ())}
    outs = {t: g.units[(w, t)] for t in g.outs.get(w, ())}
    slack = known.slack.copy()
    trial = caps.copy()
    plan: list[tuple[int, int, int]] = []
    progress = True
    while progress and any(ins.values()):
        progress = False
        for u in sorted(x for x, left in ins.items() if left):
            for t in sorted(x for x, left in outs.items() if left):
                if not ins[u]:
                    break
                if not outs[t]:
                    continue
                amount = min(ins[u], outs[t], known.room(u, w, t, slack))
                if amount <= 0:
                    continue
                ins[u] -= amount
                outs[t] -= amount
                slack[known.hit(u, w, t)] -= amount
                for key, change in (((u, w), -amount), ((w, t), -amount), ((u, t), amount)):
                    if key in index:                  # (u, u): a loop is dropped
                        trial[index[key]] += change
                plan.append((u, t, amount))
                progress = True
    return plan, trial


def _apply(g: SplitGraph, w: int, u: int, t: int, amount: int, caps: np.ndarray,
           index: dict[tuple[int, int], int], known: _SlackSets) -> None:
    """Split ``amount`` off ``u -> w -> t`` in ``g``, ``caps`` and the known slacks."""
    g.split(u, w, t, amount)
    known.slack[known.hit(u, w, t)] -= amount
    for key in ((u, w), (w, t), (u, t)):
        if key in index:                              # (u, u): a loop is dropped
            caps[index[key]] = g.units.get(key, 0)


def _split_pass(g: SplitGraph, w: int, net: FlowNetwork, caps: np.ndarray,
                index: dict[tuple[int, int], int], known: _SlackSets) -> bool:
    """One pass over the pairs ``(u, t)`` of ``w`` by checks; ``True`` if anything was
    split.  ``net``, ``caps``: :func:`_exact_split`'s network, kept equal to ``g``'s
    units.  A check that finds nothing to split leaves a tight set (the sink side of its
    minimum cut: ``S ∋ w`` with ``u, t ∉ S``, or ``S ∌ w`` with ``u, t ∈ S``), kept in
    ``known`` to rule out later pairs without a max-flow (leaf-spine 4x2x8 with a NIC at
    360 Gbps one way: 1 312 -> 758 sweeps)."""
    progress = False
    for (u, _) in g.in_arcs(w):
        for (_, t) in g.out_arcs(w):
            if (u, w) not in g.units:
                break
            if (w, t) not in g.units or known.room(u, w, t, known.slack) <= 0:
                continue
            want = min(g.units[(u, w)], g.units[(w, t)])
            s_a = cut_slack(g, net, caps, sorted({u, t}), [w], want)
            s_b = cut_slack(g, net, caps, [w], sorted({u, t}), want) if s_a > 0 else 0
            if min(s_a, s_b) <= 0:
                known.add(g, net, caps, net.sink_side()[None, :])
                continue
            _apply(g, w, u, t, min(want, s_a, s_b), caps, index, known)
            progress = True
    return progress


def split_all(g: SplitGraph) -> bool:
    """Split off every switch by the exact greedy (module docstring); ``False`` when it
    could not complete a switch."""
    known = _SlackSets(g.n)
    return all(_exact_split(g, w, known) for w in switch_order(g))
