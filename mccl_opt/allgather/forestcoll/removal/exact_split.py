"""Phase 2's exact switch removal: ForestColl's greedy edge splitting (paper §4.3, Fig. 18),
its amounts guessed and verified (docs/allgather_history.md "Leaf-spine 8x2x8 at `None`: guessed
splits and the largest tight sets", "Exact split in batches").

Every pair ``(u, t)`` of a switch ``w`` in order is split by the largest amount the two
families of dangerous cuts allow (``S ∋ w, u,t ∉ S`` and ``S ∌ w, u,t ∈ S``); by Mader's
splitting theorem this completes on a balanced fabric and keeps every cut condition.  By
checks each amount costs two rooted sweeps; guessed within the slack of the node sets
known so far and verified by one sweep per guess, a switch costs a few sweeps; switches
whose neighbours are all GPUs are guessed in turn and verified together.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..maxflow import INF, FlowNetwork
from . import guess_kernels as kernels
from .splitting import SplitGraph, cut_slack, hubs_of, sink_order, switch_order

__all__ = ["split_all", "MAX_GUESSES", "PAIRS_PER_GUESS", "SEED_MAX_NEIGHBOURS", "MAX_BATCH"]


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

#: most switches guessed and verified together (:func:`_batch`): leaf-spine 8x2x8 with 4
#: spines split its 16 NVSwitches in 37 sweeps one at a time, in 3-4 together
MAX_BATCH = 64

#: most blocks (a host's NVSwitch with its GPUs) next to a switch whose unions are known
#: before its guesses (:func:`_block_sets`; more: each block alone): fat-tree 4x2x2x8 two
#: way, a ToR's GPU neighbours on 2-8 hosts once the ToRs before it are split
MAX_BLOCKS = 8


class _SlackSets:
    """Node sets (each holding a GPU) met by the exact split, with their slack
    ``units(δ⁻(S)) - k |V_c \\ S|`` kept current.  Splitting ``a`` units off
    ``u -> w -> t`` lowers the cut of exactly the sets ``S ∋ w, u, t ∉ S`` and
    ``S ∌ w, u, t ∈ S``, each by ``a``, and no other cut (neither a split nor a reduction
    raises one), so a set's slack bounds every later split into it: one of slack 0 rules
    the pair out without a max-flow.  Node-major columns in a buffer that doubles, read by
    the compiled guesses (:mod:`.guess_kernels`)."""

    def __init__(self, n: int) -> None:
        self.at = np.zeros((n, 64), np.bool_)      # node x is in set i: ``at[x, i]``, i < size
        self.all_slack = np.zeros(64, np.int64)
        self.size = 0

    @property
    def slack(self) -> np.ndarray:
        """The known sets' slacks (a view)."""
        return self.all_slack[: self.size]

    def add(self, g: SplitGraph, net: FlowNetwork, caps: np.ndarray, sides: np.ndarray) -> None:
        """Remember the rows of ``sides`` with their slacks under ``caps`` (``net``'s real
        arcs)."""
        rows = sides.shape[0]
        if self.size + rows > self.all_slack.size:
            cap = max(2 * self.all_slack.size, self.size + rows)
            at = np.zeros((self.at.shape[0], cap), np.bool_)
            at[:, : self.size] = self.at[:, : self.size]
            self.at = at
            self.all_slack = np.concatenate([self.slack, np.zeros(cap - self.size, np.int64)])
        self.at[:, self.size: self.size + rows] = sides.T
        head = net.arc_head[: net.m]
        in_start = np.zeros(g.n + 1, np.int64)
        np.cumsum(np.bincount(head, minlength=g.n), out=in_start[1:])
        kernels.set_slacks(np.ascontiguousarray(sides), in_start,
                           np.argsort(head, kind="stable"), net.arc_tail[: net.m],
                           np.asarray(caps, np.int64), np.array(g.gpus, np.int64), g.k,
                           self.all_slack[self.size: self.size + rows])
        self.size += rows

    def room(self, u: int, w: int, t: int) -> int:
        """The least slack of the sets whose cut a split off ``u -> w -> t`` lowers
        (:data:`INF` if none)."""
        return int(min(kernels.room(self.at, self.size, self.all_slack, u, w, t), INF))

    def lower(self, u: int, w: int, t: int, amount: int) -> None:
        """Account for a split of ``amount`` off ``u -> w -> t``."""
        kernels.lower(self.at, self.size, self.all_slack, u, w, t, amount)


def _gpu_neighbours(g: SplitGraph, w: int) -> np.ndarray | None:
    """``w``'s neighbours (in node order) where they are at most
    :data:`SEED_MAX_NEIGHBOURS` GPUs, else ``None``."""
    near = np.array(sorted(g.ins.get(w, set()) | g.outs.get(w, set())), np.int64)
    return None if near.size > SEED_MAX_NEIGHBOURS or g.is_switch[near].any() else near


def _neighbour_sets(g: SplitGraph, w: int) -> np.ndarray:
    """Sets (bool rows) whose cut a split of ``w`` lowers, known before any sweep: where
    ``w``'s neighbours are at most :data:`SEED_MAX_NEIGHBOURS` GPUs
    (:func:`_gpu_neighbours`) every set of them of two or more nodes with and without
    ``w`` (one GPU alone held the NVSwitch batches' guesses back: multi-spine 2x8x8, 19
    -> 48 sweeps); else each GPU neighbour alone (a loop ``x -> w -> x`` lowers ``x``'s
    own cut) and the unions of the hosts next to ``w`` (:func:`_block_sets`).  Learnt
    one failed guess at a time, they cost fat-tree 4x2x2x8 two way 34 of its 74 sweeps
    (docs/allgather_history.md "Single GPUs and hosts known before the guesses")."""
    near = _gpu_neighbours(g, w)
    if near is None:
        ends = np.array(sorted(g.ins.get(w, set()) | g.outs.get(w, set())), np.int64)
        ends = ends[~g.is_switch[ends]]
        sides = np.zeros((ends.size, g.n), bool)
        sides[np.arange(ends.size), ends] = True
        return np.concatenate([sides, _block_sets(g, w, ends)])
    bits = _subsets(near.size)
    sides = np.zeros((2 * bits.shape[0], g.n), bool)
    sides[:bits.shape[0], near] = bits
    sides[bits.shape[0]:, near] = bits
    sides[bits.shape[0]:, w] = True
    return sides[(sides.sum(axis=1) > 1)]


def _subsets(count: int) -> np.ndarray:
    """Every non-empty subset of ``count`` items (bool rows, by binary mask)."""
    masks = np.arange(1, 1 << count)
    return ((masks[:, None] >> np.arange(count)) & 1).astype(bool)


def _block_sets(g: SplitGraph, w: int, ends: np.ndarray) -> np.ndarray:
    """The unions of the blocks next to ``w`` (a block: the host hub of one of ``ends``,
    ``w``'s GPU neighbours (:func:`.splitting.hubs_of`, the sink order's grouping), still
    linked to it, other than ``w`` and whose neighbours are at most
    :data:`SEED_MAX_NEIGHBOURS` GPUs, with them: a host's NVSwitch and its GPUs), with and
    without ``w``, where there are at most :data:`MAX_BLOCKS` blocks, else each block
    alone."""
    hub = hubs_of(g)
    hubs = sorted({v for x in ends.tolist() if (v := int(hub[x])) != w and v < g.n
                   and g.is_switch[v] and (v in g.ins.get(x, ()) or v in g.outs.get(x, ()))
                   and _gpu_neighbours(g, v) is not None})
    if not hubs:
        return np.zeros((0, g.n), bool)
    blocks = np.zeros((len(hubs), g.n), bool)
    for i, v in enumerate(hubs):
        blocks[i, v] = True
        blocks[i, _gpu_neighbours(g, v)] = True
    if len(hubs) > MAX_BLOCKS:
        sides = blocks
    else:
        sides = (_subsets(len(hubs)).astype(np.int64) @ blocks.astype(np.int64)) > 0
    with_w = sides.copy()
    with_w[:, w] = True
    return np.concatenate([sides, with_w])


@dataclass
class _Switch:
    """One switch ``w`` of a batch (:func:`_split_batch`): its in- and out-neighbours in
    node order with their units, their arcs' indices in the batch's network (``pair``:
    ``u -> t``, ``-1`` for a loop) and its own known sets (:func:`_neighbour_sets`)."""

    w: int
    ins: np.ndarray
    outs: np.ndarray
    in_units: np.ndarray
    out_units: np.ndarray
    in_idx: np.ndarray
    out_idx: np.ndarray
    pair: np.ndarray
    near: _SlackSets

    @classmethod
    def of(cls, g: SplitGraph, w: int, net: FlowNetwork, caps: np.ndarray,
           index: dict[tuple[int, int], int]) -> "_Switch":
        ins, outs = sorted(g.ins.get(w, ())), sorted(g.outs.get(w, ()))
        pair = np.array([[index[(u, t)] if u != t else -1 for t in outs] for u in ins],
                        np.int64).reshape(len(ins), len(outs))
        near = _SlackSets(g.n)
        near.add(g, net, caps, _neighbour_sets(g, w))
        return cls(w, np.array(ins, np.int64), np.array(outs, np.int64),
                   np.array([g.units[(u, w)] for u in ins], np.int64),
                   np.array([g.units[(w, t)] for t in outs], np.int64),
                   np.array([index[(u, w)] for u in ins], np.int64),
                   np.array([index[(w, t)] for t in outs], np.int64), pair, near)


def _batch(g: SplitGraph, order: list[int], first: int) -> list[int]:
    """``order[first]`` alone, or with the switches after it while they are all, like it,
    seeded with their neighbour sets (:func:`_gpu_neighbours`: a host's NVSwitches once
    the leaves are split), at most :data:`MAX_BATCH`.  Their neighbours are GPUs, so no
    two are adjacent: splitting one neither adds nor removes a link at another, and each
    one's pairs and units are those it would have after the others' splits."""
    batch = [order[first]]
    if _gpu_neighbours(g, batch[0]) is None:
        return batch
    for w in order[first + 1: first + MAX_BATCH]:
        if _gpu_neighbours(g, w) is None:
            break
        batch.append(w)
    return batch


def _split_batch(g: SplitGraph, batch: list[int], known: _SlackSets, guesses: int) -> bool:
    """ForestColl's greedy maximal splitting of each switch of ``batch`` in turn
    (:func:`_batch`), repeated per switch while a pass makes progress (a split can make
    an earlier pair splittable again); ``False`` if arcs remain at one.  One flow network
    per batch: the arcs with units plus every pair ``u -> t`` a split can create (zero
    units until then), so a split only updates three capacities (leaf-spine 4x2x8's
    exact split: 815 networks built in Python -> 14).

    The greedy's amounts are first *guessed* (:func:`_plan`: each pair takes all it
    wants within the slack of the sets in ``known`` and of its switch's
    :func:`_neighbour_sets`) and the guess of the whole batch verified by one rooted sweep
    over the GPUs; a guess that passes is exactly the greedy's split (below), one that
    fails learns the sweep's violated sets and is guessed again.  After
    ``guesses`` (fewer on few pairs) a batch's switches are split one by one, and
    a single switch by checks (:func:`_split_pass`, two sweeps per pair).  Exact: cuts
    only fall as pairs are split, so if the guess's final units keep every cut, each
    pair's true slack was at least its guessed amount when it was split; that amount is
    ``min(want, slack of a known set)`` and the true slack is at most a known set's, so
    it equals the greedy's ``min(want, true slack)``, pair by pair (leaf-spine 8x2x8 with
    4 spines: 1 550 sweeps -> 81 one switch at a time, -> 45 in batches)."""
    ends = [(u, t) for w in batch for u in g.ins.get(w, ()) for t in g.outs.get(w, ())
            if u != t]
    keys = sorted(set(g.units) | set(ends))
    net = FlowNetwork(g.n, np.array([a for a, _ in keys], np.int64),
                      np.array([b for _, b in keys], np.int64))
    caps = np.array([g.units.get(key, 0) for key in keys], np.int64)
    index = {key: i for i, key in enumerate(keys)}
    switches = [_Switch.of(g, w, net, caps, index) for w in batch]
    for _ in range(min(guesses, max(1, len(ends) // PAIRS_PER_GUESS))):
        plans, trial, slack = _plan(switches, caps, known)
        full = net.caps()
        full[: net.m] = trial
        full[net.s_arc0 + g.gpus] = g.k
        broken = net.failing_sets(full, sink_order(g), g.k * g.gpus.size, g.gpus.size)
        if not broken.shape[0]:                # the plans are the greedy's: applied
            for sw, plan in zip(switches, plans):
                for u, t, amount in plan.tolist():
                    g.split(u, sw.w, t, amount)
            known.all_slack[: known.size] = slack
            return all(_complete(g, w) for w in batch)
        known.add(g, net, caps, _without_idle(g, net, trial, broken))
    if len(batch) > 1:
        return all(_split_batch(g, [w], known, guesses) for w in batch)
    while g.in_arcs(batch[0]) and _split_pass(g, switches[0], net, caps, index, known):
        pass
    return _complete(g, batch[0])


def _without_idle(g: SplitGraph, net: FlowNetwork, trial: np.ndarray, sides: np.ndarray
                  ) -> np.ndarray:
    """``sides`` (a failed guess's violated sets) without the switches no arc of
    ``trial`` touches: the same cut under the guess, and one set however many of the
    batch's switches the guess emptied (they lie on the sink side of every failing
    sweep; kept, each choice of them was a new set: 13 failed guesses for one GPU's loop
    on leaf-spine 8x2x8's 16 NVSwitches)."""
    live = np.zeros(g.n, np.bool_)
    used = trial > 0
    live[net.arc_tail[: net.m][used]] = True
    live[net.arc_head[: net.m][used]] = True
    out = sides.copy()
    out[:, g.is_switch & ~live] = False
    return out


def _complete(g: SplitGraph, w: int) -> bool:
    """Whether ``w`` has no arc left."""
    return not g.in_arcs(w) and not g.out_arcs(w)


def _plan(switches: list[_Switch], caps: np.ndarray, known: _SlackSets
          ) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """The greedy's passes over each switch's pairs in turn (:func:`_split_pass`, in its
    order) with every pair split by ``min(want, room in the known sets)``
    (:func:`.guess_kernels.plan_switch`): each switch's ``(u, t, amount)`` splits (rows),
    the units they leave (``caps``'s arcs) and the known sets' slacks after them; the
    graph and the sets are left as they are."""
    trial = caps.copy()
    slack = known.all_slack.copy()
    plans = []
    for sw in switches:
        plan = np.zeros((sw.ins.size + sw.outs.size + known.size + sw.near.size, 3), np.int64)
        count = kernels.plan_switch(sw.w, sw.ins, sw.in_units.copy(), sw.outs,
                                    sw.out_units.copy(), known.at, known.size, slack,
                                    sw.near.at, sw.near.size, sw.near.all_slack.copy(), trial,
                                    sw.in_idx, sw.out_idx, sw.pair, plan)
        plans.append(plan[:count])
    return plans, trial, slack[: known.size]


def _apply(g: SplitGraph, sw: _Switch, u: int, t: int, amount: int, caps: np.ndarray,
           index: dict[tuple[int, int], int], known: _SlackSets) -> None:
    """Split ``amount`` off ``u -> w -> t`` in ``g``, ``caps`` and the known slacks."""
    w = sw.w
    g.split(u, w, t, amount)
    known.lower(u, w, t, amount)
    sw.near.lower(u, w, t, amount)
    for key in ((u, w), (w, t), (u, t)):
        if key in index:                              # (u, u): a loop is dropped
            caps[index[key]] = g.units.get(key, 0)


def _split_pass(g: SplitGraph, sw: _Switch, net: FlowNetwork, caps: np.ndarray,
                index: dict[tuple[int, int], int], known: _SlackSets) -> bool:
    """One pass over the pairs ``(u, t)`` of ``sw`` by checks; ``True`` if anything was
    split.  ``net``, ``caps``: :func:`_split_batch`'s network, kept equal to ``g``'s
    units.  A check that finds nothing to split leaves a tight set (the sink side of its
    minimum cut: ``S ∋ w`` with ``u, t ∉ S``, or ``S ∌ w`` with ``u, t ∈ S``), kept in
    ``known`` to rule out later pairs without a max-flow (leaf-spine 4x2x8 with a NIC at
    360 Gbps one way: 1 312 -> 758 sweeps)."""
    w = sw.w
    progress = False
    for (u, _) in g.in_arcs(w):
        for (_, t) in g.out_arcs(w):
            if (u, w) not in g.units:
                break
            if (w, t) not in g.units or min(known.room(u, w, t), sw.near.room(u, w, t)) <= 0:
                continue
            want = min(g.units[(u, w)], g.units[(w, t)])
            s_a = cut_slack(g, net, caps, sorted({u, t}), [w], want)
            s_b = cut_slack(g, net, caps, [w], sorted({u, t}), want) if s_a > 0 else 0
            if min(s_a, s_b) <= 0:
                known.add(g, net, caps, net.sink_side()[None, :])
                continue
            _apply(g, sw, u, t, min(want, s_a, s_b), caps, index, known)
            progress = True
    return progress


def split_all(g: SplitGraph, max_guesses: int = MAX_GUESSES) -> bool:
    """Split off every switch by the exact greedy, in batches of switches that are not
    neighbours (module docstring, :func:`_split_batch`), each guessed at most
    ``max_guesses`` times (0: by checks alone, ForestColl's greedy as published; the
    same split); ``False`` when it could not complete a switch."""
    known = _SlackSets(g.n)
    order = switch_order(g)
    first = 0
    while first < len(order):
        batch = _batch(g, order, first)
        if not _split_batch(g, batch, known, max_guesses):
            return False
        first += len(batch)
    return True
