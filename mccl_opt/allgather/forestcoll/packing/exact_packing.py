"""Phase 3's exact fallback: Lovász's proof of Edmonds' branching theorem (paper §4.3).

As in ForestColl, a class ``j`` (a partial arborescence with a multiplicity) is extended
over ``u -> v`` only by the amount every dangerous set allows: ``min`` over ``S`` with
``u ∉ S ∋ v``, ``S ∩ R_j ≠ ∅`` of ``units(δ⁻(S)) - p(S)``, ``p(S)`` the multiplicity of
classes with no vertex in ``S``; one max-flow each.  This never gets stuck when the
logical graph meets the cut condition for ``k`` trees per root.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mccl_opt import anytime
from mccl_opt.errors import SolveError
from ..maxflow import INF, FlowNetwork
from .trees import TreeClass

__all__ = ["exact_pack", "exact_pack_stage", "EXACT_PACK_MAX_EDGES"]

#: the exact packer is tried only up to this many tree edges ``k·n·(n-1)``: it runs one
#: max-flow per tree extension, and past a few hundred edges it never finishes within its
#: budget (below), so trying it only spends that budget before the chain's next method
#: (docs/allgather_history.md "Why the exact packer was a cliff"; with few trees per root the
#: compiled :mod:`.few_trees` packing runs before it)
EXACT_PACK_MAX_EDGES = 512

#: the exact packer may take this many times what the fast packers took, at least
#: :data:`EXACT_PACK_FLOOR_S`; past it ForestColl declines and the chain's next method
#: (the general method) solves the fabric
EXACT_PACK_SHARE = 2.0
EXACT_PACK_FLOOR_S = 0.5


@dataclass
class _Growing:
    """A class of :func:`exact_pack` while it grows: ``member[v]`` marks its ranks."""

    root: int
    mult: int
    parent_arc: np.ndarray
    member: np.ndarray

    @classmethod
    def at_root(cls, n: int, root: int, mult: int) -> "_Growing":
        member = np.zeros(n, bool)
        member[root] = True
        return cls(root, mult, np.full(n, -1, np.int64), member)


def exact_pack(n: int, tail: np.ndarray, head: np.ndarray, units: np.ndarray,
               k: int) -> list[TreeClass]:
    """Lovász-style exact packing with max-flow-bounded extensions (see module doc)."""
    cap = units.astype(np.int64).copy()
    out_arcs = [np.flatnonzero(tail == u) for u in range(n)]
    classes = [_Growing.at_root(n, r, k) for r in range(n)]
    i = 0
    while i < len(classes):
        cls = classes[i]
        while not cls.member.all():
            anytime.check("the exact tree packing")
            amount, arc = 0, -1
            for u in _bfs_order(cls, tail):
                for a in out_arcs[u]:
                    v = int(head[a])
                    if cls.member[v] or cap[a] == 0:
                        continue
                    want = min(cls.mult, int(cap[a]))
                    amount = min(want, _allowance(n, tail, head, cap, classes, i, u, v, want))
                    if amount > 0:
                        arc = int(a)
                        break
                if arc >= 0:
                    break
            if arc < 0:
                raise SolveError("exact tree packing stuck: the logical graph violates "
                                 "the cut condition for k trees per root")
            if amount < cls.mult:
                classes.append(_Growing(cls.root, cls.mult - amount, cls.parent_arc.copy(),
                                        cls.member.copy()))
                cls.mult = amount
            cap[arc] -= amount
            cls.parent_arc[int(head[arc])] = arc
            cls.member[int(head[arc])] = True
        i += 1
    return sorted((TreeClass(c.root, c.mult, c.parent_arc) for c in classes),
                  key=lambda t: (t.root, -t.mult))


def _bfs_order(cls: _Growing, tail: np.ndarray) -> list[int]:
    """The class's ranks breadth-first from its root (children by rank)."""
    kids: dict[int, list[int]] = {}
    for v in np.flatnonzero(cls.parent_arc >= 0).tolist():
        kids.setdefault(int(tail[cls.parent_arc[v]]), []).append(v)
    seq = [cls.root]
    for u in seq:
        seq.extend(sorted(kids.get(u, [])))
    return seq


def _allowance(n: int, tail: np.ndarray, head: np.ndarray, cap: np.ndarray,
               classes: list[_Growing], j: int, u: int, v: int, want: int) -> int:
    """``min`` slack over sets ``S`` with ``u ∉ S ∋ v`` meeting class ``j``'s vertices."""
    others = [i for i in range(len(classes)) if i != j]
    nx = n + len(others)
    extra_t, extra_h = [], []
    for p, i in enumerate(others):
        for w in np.flatnonzero(classes[i].member).tolist():
            extra_t.append(n + p)
            extra_h.append(w)
    t_all = np.concatenate([tail, np.array(extra_t, np.int64)])
    h_all = np.concatenate([head, np.array(extra_h, np.int64)])
    net = FlowNetwork(nx, t_all, h_all)
    caps = net.caps()
    caps[: tail.size] = cap
    caps[tail.size: net.m] = INF
    for p, i in enumerate(others):
        caps[net.s_arc0 + n + p] = classes[i].mult
    caps[net.s_arc0 + u] = INF
    caps[net.t_arc0 + v] = INF
    total = sum(c.mult for c in classes)
    mj = classes[j].mult
    flow = net.max_flow(caps, limit=total - mj + want)
    return flow + mj - total


def exact_pack_stage(n: int, tail: np.ndarray, head: np.ndarray, units: np.ndarray, k: int,
                     spent: float) -> list[TreeClass]:
    """:func:`exact_pack` as a stage of ``max(EXACT_PACK_FLOOR_S, EXACT_PACK_SHARE x
    spent)`` seconds: one max-flow per tree extension takes minutes on some fabrics (an
    8-leaf leaf-spine) where the general method takes a fraction of a second, so past its
    budget it raises :class:`SolveError` and the method chain moves on."""
    budget = max(EXACT_PACK_FLOOR_S, EXACT_PACK_SHARE * spent)
    classes, declined = anytime.stage(budget, lambda: exact_pack(n, tail, head, units, k))
    if declined:
        raise SolveError(f"the exact tree packing passed its budget of {budget:.2g} s")
    return classes
