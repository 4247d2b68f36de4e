"""Step-aware switch removal LP (paper App. C; design in docs/allgather.md).

Every *star* switch ``w`` (all neighbours GPUs) forwards what enters on ``u -> w`` to
its out-neighbours ``t``: a transport problem per switch with variables
``f[u,w,t] >= 0``, ``sum_t f[u,w,t] <= units(u,w)`` and ``sum_u f[u,w,t] <= units(w,t)``.
The logical capacity of a GPU pair is ``L[u,t] = direct[u,t] + sum_w f[u,w,t]``.

Throughput is kept by the rooted cut conditions of the logical graph (Edmonds):
``L(δ⁻(S)) >= k_keep · |V \\ S|`` for every non-empty GPU set ``S``; there are
exponentially many, so the model carries only the sets passed in ``cuts`` (the caller
separates violated ones by max-flow and re-solves: a cutting-plane loop).

Objective (spreading, so breadth-first packing finds shallow trees): maximise
``z + eps · sum(f) / total`` where ``z <= L[u,t] / target[u,t]`` for every pair that
shares a switch, i.e. the smallest fraction of its *target* that any pair receives.
With ``target = 1`` this is the max-min logical capacity over switch-sharing pairs.

Takes plain arrays (numpy/scipy only), never a :class:`mccl_opt.Topology`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import scipy.sparse as sp

from .lp import FormulationError, LinearProgram

__all__ = ["SwitchRemovalModel", "build_switch_removal_lp"]


@dataclass(frozen=True)
class SwitchRemovalModel:
    """Arrays of one switch-removal instance.

    ``arc_units[i]``: units of GPU<->switch arc ``i``; triple ``j`` splits
    ``triple_in[j]`` (arc ``u -> w``) with ``triple_out[j]`` (arc ``w -> t``) into the
    GPU pair ``(triple_u[j], triple_t[j])`` (ranks, ``u != t``).  ``direct_*``: fixed
    GPU-to-GPU logical links (ranks, units).  ``k_keep``: trees per root to keep.
    ``target``: per pair of :attr:`pairs`, the normaliser of the max-min objective.
    """

    num_gpus: int
    arc_units: np.ndarray
    triple_in: np.ndarray
    triple_out: np.ndarray
    triple_u: np.ndarray
    triple_t: np.ndarray
    direct_tail: np.ndarray
    direct_head: np.ndarray
    direct_units: np.ndarray
    k_keep: float
    target: np.ndarray | None = None
    eps: float = 1e-3

    def __post_init__(self) -> None:
        p = len(self.triple_in)
        for label in ("triple_out", "triple_u", "triple_t"):
            if len(getattr(self, label)) != p:
                raise FormulationError(f"{label} must have one entry per triple ({p})")
        if not (len(self.direct_tail) == len(self.direct_head) == len(self.direct_units)):
            raise FormulationError("direct_tail, direct_head, direct_units differ in length")
        if p and (np.asarray(self.triple_u) == np.asarray(self.triple_t)).any():
            raise FormulationError("a triple joins a GPU to itself (u == t)")
        if self.target is not None and len(self.target) != len(self.pairs):
            raise FormulationError(f"target needs one entry per pair ({len(self.pairs)})")

    @property
    def pairs(self) -> np.ndarray:
        """Distinct ordered GPU pairs ``(u, t)`` that share a switch, sorted."""
        code = np.unique(np.asarray(self.triple_u, np.int64) * self.num_gpus
                         + np.asarray(self.triple_t, np.int64))
        return np.stack([code // self.num_gpus, code % self.num_gpus], axis=1)

    @property
    def num_triples(self) -> int:
        return len(self.triple_in)

    def logical(self, f: np.ndarray) -> np.ndarray:
        """Dense ``N x N`` logical capacity ``L`` for triple amounts ``f``."""
        n = self.num_gpus
        cap = np.zeros((n, n))
        np.add.at(cap, (np.asarray(self.direct_tail, np.int64),
                        np.asarray(self.direct_head, np.int64)), self.direct_units)
        np.add.at(cap, (np.asarray(self.triple_u, np.int64),
                        np.asarray(self.triple_t, np.int64)), f)
        return cap

    def cut_rows(self, cuts: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, sp.csr_matrix]:
        """Rows ``lo <= A [f; z] <= inf`` of the cut conditions for GPU sets ``cuts``
        (boolean masks over ranks, ``True`` = inside ``S``)."""
        n, p = self.num_gpus, self.num_triples
        u = np.asarray(self.triple_u, np.int64)
        t = np.asarray(self.triple_t, np.int64)
        dt = np.asarray(self.direct_tail, np.int64)
        dh = np.asarray(self.direct_head, np.int64)
        rows, cols, lo = [], [], []
        for i, mask in enumerate(cuts):
            mask = np.asarray(mask, bool)
            if mask.shape != (n,) or not mask.any():
                raise FormulationError(f"cut {i} must be a non-empty mask over {n} GPUs")
            enter = np.flatnonzero(~mask[u] & mask[t])
            rows.append(np.full(enter.size, i))
            cols.append(enter)
            fixed = float(np.asarray(self.direct_units)[~mask[dt] & mask[dh]].sum())
            lo.append(self.k_keep * float((~mask).sum()) - fixed)
        r = np.concatenate(rows) if rows else np.zeros(0, np.int64)
        c = np.concatenate(cols) if cols else np.zeros(0, np.int64)
        A = sp.csr_matrix((np.ones(r.size), (r, c)), shape=(len(lo), p + 1))
        return np.array(lo, float), np.full(len(lo), np.inf), A


def build_switch_removal_lp(model: SwitchRemovalModel,
                            cuts: Sequence[np.ndarray] = ()) -> LinearProgram:
    """The LP over columns ``[f (one per triple); z]`` with transport rows, one max-min
    row per switch-sharing pair and the cut rows of ``cuts`` (see module doc)."""
    p = model.num_triples
    units = np.asarray(model.arc_units, float)
    if (units < 0).any():
        raise FormulationError("arc_units must be >= 0")
    tin = np.asarray(model.triple_in, np.int64)
    tout = np.asarray(model.triple_out, np.int64)
    m_arc = units.size
    # transport: one row per arc (its triples as u -> w or as w -> t)
    arc_rows = sp.csr_matrix((np.ones(2 * p), (np.concatenate([tin, tout]),
                                               np.tile(np.arange(p), 2))), shape=(m_arc, p + 1))
    # max-min: L[u,t] - target * z >= direct[u,t]
    pairs = model.pairs
    n = model.num_gpus
    code = np.asarray(model.triple_u, np.int64) * n + np.asarray(model.triple_t, np.int64)
    pair_of = np.searchsorted(pairs[:, 0] * n + pairs[:, 1], code)
    target = np.ones(len(pairs)) if model.target is None else np.asarray(model.target, float)
    direct = model.logical(np.zeros(p))[pairs[:, 0], pairs[:, 1]] if len(pairs) else np.zeros(0)
    mm = sp.csr_matrix((np.concatenate([np.ones(p), -target]),
                        (np.concatenate([pair_of, np.arange(len(pairs))]),
                         np.concatenate([np.arange(p), np.full(len(pairs), p)]))),
                       shape=(len(pairs), p + 1))
    cut_lo, cut_hi, cut_A = model.cut_rows(cuts)
    A = sp.vstack([arc_rows, mm, cut_A]).tocsr()
    row_lo = np.concatenate([np.full(m_arc, -np.inf), -direct, cut_lo])
    row_hi = np.concatenate([units, np.full(len(pairs), np.inf), cut_hi])
    total = max(float(units.sum()), 1.0)
    c = np.concatenate([np.full(p, model.eps / total), [1.0]])
    names = ([f"arc{i}" for i in range(m_arc)] + [f"pair{u}_{t}" for u, t in pairs.tolist()]
             + [f"cut{i}" for i in range(len(cut_lo))])
    return LinearProgram(c=c, A=A, row_lo=row_lo, row_hi=row_hi,
                         col_lo=np.zeros(p + 1),
                         col_hi=np.append(np.full(p, np.inf), np.inf if len(pairs) else 0.0),
                         sense="max",
                         col_names=[f"f{j}" for j in range(p)] + ["z"], row_names=names,
                         name="switch_removal")
