"""Keeping the rooted cut condition through a switch's pairing (Phase 2, paper §4.3).

Splitting ``m`` units off ``u -> w -> t`` lowers the in-units of every node set ``T``
with ``u, t ∈ T ∌ w`` (the unit ``w -> t`` entered ``T``, ``u -> t`` is inside it) and of
every ``T ∋ w`` with ``u, t ∉ T`` (``u -> w`` entered ``T``); any other set keeps its
in-units.  The spread proposal pairs a switch's links by proportional shares, blind to
such sets: where one switch joins several groups of GPUs whose own links are tight (two
segments under one aggregation switch, leaves under shared spines) it pairs links of
one group with each other, and the rooted cut condition of Edmonds' theorem
(``units(δ⁻(T)) >= k·|GPUs ∉ T|`` for every ``T`` holding a GPU) breaks: no packing of
``k`` trees per root exists in the logical graph it leaves.

A guard repairs one switch's pairing ``A[i, j]`` (in-link from ``us[i]``, out-link to
``ts[j]``) against a violated set ``T``: units of a pair inside ``T`` ``(u1, t1)`` and of
a pair outside it ``(u2, t2)`` are exchanged for ``(u1, t2)`` and ``(u2, t1)``: every in-
and out-link of the switch keeps its units, no loop appears (``u1 ∈ T ∌ t2``), and ``T``
gains one in-unit per unit exchanged, whichever side ``w`` is on.  If the graph met the
condition before the switch, a violated ``T`` lost exactly its inside (or outside)
pairs, and exchanging ``min(deficit, inside, outside)`` units restores it as far as
``T ∪ {w}`` allows (a Mader-type splitting: some admissible pairing exists).

* :class:`KnownCuts` (cheap): guards every switch against a list of node sets, each
  check ``O(arcs)``; the sets are learned from the logical graphs that failed
  (:meth:`KnownCuts.learn`: the violated GPU set of the logical graph, closed over the
  switches by one minimum cut in the physical graph).
* :class:`SweepGuard` (the fallback): one rooted max-flow sweep over the GPUs per check
  finds any violated set, repeated until none is or :data:`MAX_ROUNDS` exchanges did
  not get there.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from mccl_opt import anytime
from ..maxflow import INF, FlowNetwork

__all__ = ["KnownCuts", "SweepGuard", "violated_set", "violated_sets", "zero_slack_sets",
           "MAX_ROUNDS"]

#: exchange rounds per switch before a guard gives up
MAX_ROUNDS = 64

Arcs = tuple[np.ndarray, np.ndarray, np.ndarray]       # tails, heads, units


def violated_set(n: int, gpus: np.ndarray, k: int, arcs: Arcs, roots: np.ndarray | None = None
                 ) -> tuple[np.ndarray, int, int] | None:
    """A node set ``T`` violating the rooted cut condition for ``k`` trees per root of
    ``roots`` (default ``gpus``), found by a rooted sweep over the sinks ``gpus`` in
    their order: the set (a boolean mask over the ``n`` nodes, holding the failing
    sink), its deficit ``k·|roots ∉ T| - units(δ⁻(T))`` and the failing sink; ``None``
    when no sink fails."""
    roots = gpus if roots is None else roots
    net, caps = _rooted_network(n, roots, k, arcs)
    failing = net.first_failing_sink(caps, gpus, k * roots.size)
    if failing < 0:
        return None
    inside = ~net.source_side()
    return inside, _deficit(inside, roots, k, arcs), int(gpus[failing])


def violated_sets(n: int, gpus: np.ndarray, k: int, arcs: Arcs, most: int,
                  sinks: np.ndarray | None = None) -> np.ndarray:
    """Up to ``most`` node sets violating the rooted cut condition for ``k`` trees per root
    of every GPU in ``gpus``, found by one rooted sweep that goes on past a failing sink
    (:meth:`FlowNetwork.failing_sets`): the sink side of each failing sink's minimum cut,
    in sink order, none from a sink an earlier set holds; no rows when no sink fails.
    One sweep where :func:`violated_set` takes one per set (the 64 hosts of HPN 4x16x8
    whose rounded-down ingress falls short, docs/allgather_history.md "Scaled packing on the
    restriction").  ``sinks``: only these sinks swept (default ``gpus``)."""
    net, caps = _rooted_network(n, gpus, k, arcs)
    return net.failing_sets(caps, gpus if sinks is None else sinks, k * gpus.size, most)


def zero_slack_sets(n: int, gpus: np.ndarray, k: int, arcs: Arcs, most: int,
                    sinks: np.ndarray | None = None) -> np.ndarray:
    """Up to ``most`` node sets with no slack in ``arcs`` (a graph meeting the rooted cut
    condition for ``k`` trees per root of ``gpus``): ``units(δ⁻(T)) = k·|GPUs ∉ T|``, so
    any unit a pairing takes from ``T`` breaks the condition.  One rooted sweep
    (:func:`violated_sets`) at scaled capacities, ``M·units`` and ``k·M + 1`` per root
    with ``M`` above the GPU count: a set fails there iff ``units < k·|out| + |out|/M``,
    i.e. (integers, ``|out| < M``) iff it is tight; each row the failing sink's set with
    the most GPUs outside: in GPUs the smallest zero-slack set holding the sink (such sets
    are closed under intersection), with every switch one of them may hold (the minimum
    cut's sink side farthest from ``s``).  Sets of one node are left out: a lone GPU's
    in-units no pairing can take (a pair inside it would be a loop).  The tight sets of
    :mod:`~..packing.contraction` by definition (``k`` roots per GPU, none per switch), not
    by search: there, one max-flow per node of a logical graph without switches, disjoint
    proper sets only (that module's docstring: why the two stay apart).  ``sinks``: as
    for :func:`violated_sets`."""
    tail, head, units = arcs
    scale = int(gpus.size) + 1
    sets = violated_sets(n, gpus, k * scale + 1, (tail, head, units * scale), most, sinks)
    return sets[sets.sum(axis=1) > 1]


def _rooted_network(n: int, roots: np.ndarray, k: int, arcs: Arcs
                    ) -> tuple[FlowNetwork, np.ndarray]:
    """The network of the rooted test: ``arcs`` at their units, ``s -> root`` at ``k``."""
    tail, head, units = arcs
    net = FlowNetwork(n, tail, head)
    caps = net.caps()
    caps[: net.m] = units
    caps[net.s_arc0 + roots] = k
    return net, caps


def _deficit(inside: np.ndarray, gpus: np.ndarray, k: int, arcs: Arcs) -> int:
    tail, head, units = arcs
    return k * int((~inside[gpus]).sum()) - int(units[inside[head] & ~inside[tail]].sum())


class SweepGuard:
    """Checks every pairing with a rooted sweep (module docstring)."""

    def __init__(self, n: int, gpus: np.ndarray, k: int) -> None:
        self.n, self.gpus, self.k = n, gpus, k

    def start(self) -> None:
        """A new split begins (nothing to reset)."""

    def pairing(self, w: int, ends: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
                amounts: np.ndarray, rest: Callable[[], Arcs]) -> np.ndarray | None:
        """Switch ``w``'s pairing exchanged until the graph ``rest()`` (the other arcs)
        plus its pairs meets the rooted cut condition (``amounts`` is not changed);
        ``None`` if it could not.  ``ends``: in-link tails, out-link heads and their
        units."""
        us, ts = ends[0], ends[1]
        A, others = amounts.copy(), rest()
        for _ in range(MAX_ROUNDS):
            i, j = np.nonzero(A)
            found = violated_set(self.n, self.gpus, self.k,
                                 (np.concatenate([others[0], us[i]]),
                                  np.concatenate([others[1], ts[j]]),
                                  np.concatenate([others[2], A[i, j]])))
            if found is None:
                return A
            inside, deficit, _ = found
            if exchange(A, inside[us], inside[ts], deficit) == 0:
                return None
        return None


class KnownCuts:
    """Guards every pairing against the node sets learned so far (module docstring).

    The in-units of every set are kept up to date as switches are split (a split
    removes the switch's links and adds its pairs), so a check costs the size of the
    switch's pairing, not of the graph."""

    def __init__(self, n: int, gpus: np.ndarray, k: int, arcs: Arcs) -> None:
        self.n, self.gpus, self.k, self.arcs = n, gpus, k, arcs
        self.sets = np.zeros((0, n), bool)
        self.need = np.zeros(0, np.int64)          # k·|GPUs outside| per set
        self.initial = np.zeros(0, np.int64)       # in-units in the physical graph
        self.in_units = np.zeros(0, np.int64)      # in-units in the graph split so far

    def learn(self, ranks_inside: np.ndarray) -> bool:
        """Add the node set with the fewest in-units of the physical graph ``arcs`` that
        holds the GPUs of ``ranks_inside`` (a mask over ranks) and none of the others;
        ``False`` if it is already known, or a known set holds exactly those GPUs."""
        if (self.sets[:, self.gpus] == ranks_inside).all(axis=1).any():
            return False
        tail, head, units = self.arcs
        net = FlowNetwork(self.n, tail, head)
        caps = net.caps()
        caps[: net.m] = units
        caps[net.s_arc0 + self.gpus[~ranks_inside]] = INF
        caps[net.t_arc0 + self.gpus[ranks_inside]] = INF
        net.max_flow(caps)
        return self.add(~net.source_side())

    def add(self, inside: np.ndarray) -> bool:
        """Add the node set ``inside`` (a mask over the ``n`` nodes); ``False`` if known."""
        tail, head, units = self.arcs
        if (self.sets == inside).all(axis=1).any():
            return False
        self.sets = np.vstack([self.sets, inside])
        self.need = np.append(self.need, self.k * int((~inside[self.gpus]).sum()))
        self.initial = np.append(self.initial,
                                 int(units[inside[head] & ~inside[tail]].sum()))
        return True

    def start(self) -> None:
        """A new split of the physical graph begins."""
        self.in_units = self.initial.copy()

    def pairing(self, w: int, ends: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
                amounts: np.ndarray, rest: Callable[[], Arcs]) -> np.ndarray:
        """Switch ``w``'s pairing exchanged until no known set lacks in-units, as far as
        exchanges can (the final rooted test judges the result); records the split."""
        us, ts, a_u, b_t = ends
        S = self.sets
        out_u, in_t = ~S[:, us], S[:, ts]
        at_w = S[:, w]                        # the switch's links entering each set, removed
        kept = self.in_units - np.where(at_w, out_u @ a_u, in_t @ b_t)
        A = amounts.copy()
        for _ in range(MAX_ROUNDS):
            # one round exchanges over every short set: seconds at a 1024-GPU fabric's
            # aggregation switch, so the limit is checked per round, not per switch
            anytime.check("Phase 2: a guarded pairing's exchange round")
            gained = ((out_u @ A) * in_t).sum(axis=1)
            short = np.flatnonzero(kept + gained < self.need)
            moved = sum(exchange(A, S[s, us], S[s, ts], int(self.need[s] - kept[s] - gained[s]))
                        for s in short.tolist())
            if moved == 0:
                break
        self.in_units = kept + ((out_u @ A) * in_t).sum(axis=1)
        return A


def exchange(A: np.ndarray, tail_in: np.ndarray, head_in: np.ndarray, deficit: int) -> int:
    """Exchange up to ``deficit`` units of pairs inside ``T`` (tail and head in it) with
    pairs outside it, in pair order; returns the units exchanged (module docstring)."""
    # the pairs' rows and columns as lists (``tolist``), not a tuple per pair built in
    # Python: that was 1.1 s of 3 s at shared aggregation 2x16x8, ``max_chunks=None``
    in_i, in_j = (x.tolist() for x in np.nonzero(A * np.outer(tail_in, head_in)))
    out_i, out_j = (x.tolist() for x in np.nonzero(A * np.outer(~tail_in, ~head_in)))
    moved = p = q = 0
    while moved < deficit and p < len(in_i) and q < len(out_i):
        i1, j1, i2, j2 = in_i[p], in_j[p], out_i[q], out_j[q]
        m = min(int(A[i1, j1]), int(A[i2, j2]), deficit - moved)
        A[i1, j1] -= m
        A[i2, j2] -= m
        A[i1, j2] += m
        A[i2, j1] += m
        moved += m
        p += A[i1, j1] == 0
        q += A[i2, j2] == 0
    return moved
