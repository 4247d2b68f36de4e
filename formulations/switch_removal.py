"""Step-aware switch removal LP (paper App. C; design in docs/allgather.md).

Every *star* switch ``w`` (all neighbours GPUs) forwards what enters on ``u -> w`` to
its out-neighbours ``t``: a transport problem per switch with variables
``f[u,w,t] >= 0``, ``sum_t f[u,w,t] <= units(u,w)`` and ``sum_u f[u,w,t] <= units(w,t)``.
The logical capacity of a GPU pair is ``L[u,t] = direct[u,t] + sum_w f[u,w,t]``.

Throughput is kept by the rooted cut conditions of the logical graph (Edmonds):
``L(δ⁻(S)) >= k_keep · |V \\ S|`` for every non-empty GPU set ``S``; there are
exponentially many, so the model carries only the sets passed in ``cuts`` (the caller
separates violated ones by max-flow and re-solves: a cutting-plane loop).

Objective (spreading, so breadth-first packing finds shallow trees): a concave
piecewise-linear utility of every switch-sharing pair's logical capacity, maximised
in sum.  Pair ``(u, t)`` has ``segments`` pieces ``s[p,b]`` of width
``step · target[p]``, ``sum_b s[p,b] <= L[u,t]``, worth ``(segments + 1 - b) / segments
/ target[p]`` per unit: the first units of a poor pair are worth more than extra units
of a rich one, so the LP water-fills (an LP stand-in for lexicographic max-min of
``L / target`` up to ``segments · step`` times the target).

Takes plain arrays (numpy/scipy only), never a :class:`mccl_opt.Topology`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import scipy.sparse as sp

from .errors import FormulationError
from .lp import LinearProgram
from .names import FabricLabels

__all__ = ["SwitchRemovalModel", "build_switch_removal_lp", "build_step_lp", "hop_columns",
           "logical_links"]


@dataclass(frozen=True)
class SwitchRemovalModel:
    """Arrays of one switch-removal instance.

    ``arc_units[i]``: units of GPU<->switch arc ``i``; triple ``j`` splits
    ``triple_in[j]`` (arc ``u -> w``) with ``triple_out[j]`` (arc ``w -> t``) into the
    GPU pair ``(triple_u[j], triple_t[j])`` (ranks, ``u != t``).  ``direct_*``: fixed
    GPU-to-GPU logical links (ranks, units).  ``k_keep``: trees per root to keep.
    ``target``: per pair of :attr:`pairs`, the capacity scale of its utility (default:
    the mean transport share, the same for all pairs); ``segments``, ``step``: pieces.
    ``arc_nodes`` (``(tail, head)`` node index per arc) and ``labels`` (the fabric's
    tokens, :mod:`formulations.names`): optional, they name the exported rows/columns.
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
    segments: int = 8
    step: float = 0.25
    arc_nodes: np.ndarray | None = None
    labels: FabricLabels | None = None

    def __post_init__(self) -> None:
        p = len(self.triple_in)
        for label in ("triple_out", "triple_u", "triple_t"):
            if len(getattr(self, label)) != p:
                raise FormulationError(f"{label} must have one entry per triple ({p})")
        if not (len(self.direct_tail) == len(self.direct_head) == len(self.direct_units)):
            raise FormulationError("direct_tail, direct_head, direct_units differ in length")
        if p and (np.asarray(self.triple_u) == np.asarray(self.triple_t)).any():
            raise FormulationError("a triple joins a GPU to itself (u == t)")
        if self.target is not None and (len(self.target) != len(self.pairs)
                                        or (np.asarray(self.target) <= 0).any()):
            raise FormulationError(f"target needs one entry > 0 per pair ({len(self.pairs)})")
        if self.segments < 1 or self.step <= 0:
            raise FormulationError("segments must be >= 1 and step > 0")

    @property
    def pairs(self) -> np.ndarray:
        """Distinct ordered GPU pairs ``(u, t)`` that share a switch, sorted."""
        code = np.unique(np.asarray(self.triple_u, np.int64) * self.num_gpus
                         + np.asarray(self.triple_t, np.int64))
        return np.stack([code // self.num_gpus, code % self.num_gpus], axis=1)

    @property
    def num_triples(self) -> int:
        return len(self.triple_in)

    @property
    def num_cols(self) -> int:
        """Columns ``[f (triples); s (pairs x segments, pair-major)]``."""
        return self.num_triples + len(self.pairs) * self.segments

    def targets(self) -> np.ndarray:
        """Per pair, the utility scale (given, or the mean share ``sum(f max) / pairs``)."""
        if self.target is not None:
            return np.asarray(self.target, float)
        npairs = max(len(self.pairs), 1)
        return np.full(len(self.pairs), max(float(np.sum(self.arc_units)) / 2 / npairs, 1e-9))

    def logical(self, f: np.ndarray) -> np.ndarray:
        """Dense ``N x N`` logical capacity ``L`` for triple amounts ``f``."""
        n = self.num_gpus
        cap = np.zeros((n, n))
        np.add.at(cap, (np.asarray(self.direct_tail, np.int64),
                        np.asarray(self.direct_head, np.int64)), self.direct_units)
        np.add.at(cap, (np.asarray(self.triple_u, np.int64),
                        np.asarray(self.triple_t, np.int64)), f)
        return cap

    def cut_rows(self, cuts: Sequence[np.ndarray], num_cols: int | None = None
                 ) -> tuple[np.ndarray, np.ndarray, sp.csr_matrix]:
        """Rows ``lo <= A x <= inf`` of the cut conditions for GPU sets ``cuts``
        (boolean masks over ranks, ``True`` = inside ``S``) over the triple columns,
        which come first; ``num_cols``: the model's column count (default
        :attr:`num_cols`)."""
        n = self.num_gpus
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
        A = sp.csr_matrix((np.ones(r.size), (r, c)),
                          shape=(len(lo), self.num_cols if num_cols is None else num_cols))
        return np.array(lo, float), np.full(len(lo), np.inf), A


def build_switch_removal_lp(model: SwitchRemovalModel,
                            cuts: Sequence[np.ndarray] = ()) -> LinearProgram:
    """The LP over columns ``[f; s]`` (see :attr:`SwitchRemovalModel.num_cols`) with one
    transport row per arc, one utility row per switch-sharing pair and the cut rows of
    ``cuts`` (see module doc)."""
    p, nb = model.num_triples, model.segments
    units = np.asarray(model.arc_units, float)
    if (units < 0).any():
        raise FormulationError("arc_units must be >= 0")
    tin = np.asarray(model.triple_in, np.int64)
    tout = np.asarray(model.triple_out, np.int64)
    m_arc, ncol = units.size, model.num_cols
    arc_rows = sp.csr_matrix((np.ones(2 * p), (np.concatenate([tin, tout]),
                                               np.tile(np.arange(p), 2))), shape=(m_arc, ncol))
    # utility rows: sum_w f[u,w,t] - sum_b s[p,b] >= -direct[u,t]
    pairs = model.pairs
    n, npair = model.num_gpus, len(pairs)
    code = np.asarray(model.triple_u, np.int64) * n + np.asarray(model.triple_t, np.int64)
    pair_of = np.searchsorted(pairs[:, 0] * n + pairs[:, 1], code)
    seg_pair = np.repeat(np.arange(npair), nb)
    util = sp.csr_matrix((np.concatenate([np.ones(p), -np.ones(npair * nb)]),
                          (np.concatenate([pair_of, seg_pair]),
                           np.concatenate([np.arange(p), p + np.arange(npair * nb)]))),
                         shape=(npair, ncol))
    direct = model.logical(np.zeros(p))[pairs[:, 0], pairs[:, 1]] if npair else np.zeros(0)
    cut_lo, cut_hi, cut_A = model.cut_rows(cuts)
    A = sp.vstack([arc_rows, util, cut_A]).tocsr()
    row_lo = np.concatenate([np.full(m_arc, -np.inf), -direct, cut_lo])
    row_hi = np.concatenate([units, np.full(npair, np.inf), cut_hi])
    target = model.targets()
    weight = (nb + 1 - np.arange(1, nb + 1)) / nb
    c = np.concatenate([np.zeros(p), (weight[None, :] / target[:, None]).ravel()])
    col_hi = np.concatenate([np.full(p, np.inf), np.repeat(model.step * target, nb)])
    cols, names = _names(model, pairs, len(cut_lo))
    return LinearProgram(c=c, A=A, row_lo=row_lo, row_hi=row_hi, col_lo=np.zeros(ncol),
                         col_hi=col_hi, sense="max", col_names=cols, row_names=names,
                         name="switch_removal")


def _names(model: SwitchRemovalModel, pairs: np.ndarray,
           n_cuts: int) -> tuple[list[str], list[str]]:
    """Column and row names of :func:`build_switch_removal_lp`.  With ``arc_nodes`` and
    ``labels``: rows ``arc_<tail>_<head>`` (the units of an arc of the star-reduced
    fabric: a link, or a bundle of switch paths between its ends), ``u_<u>_<t>`` (a
    pair's utility), ``cut_<i>``; columns ``f_<u>_<w>_<t>`` (units ``u -> w`` forwarded
    to ``t``) and ``s_<u>_<t>_<b>``.  Without: ``arc<i>``, ``pair<u>_<t>``, ``cut<i>``,
    ``f<j>``, ``s<u>_<t>_<b>`` over indices and ranks."""
    nb, lab = model.segments, model.labels
    if lab is None or model.arc_nodes is None:
        gpu = [str(r) for r in range(model.num_gpus)]
        arcs = [f"arc{i}" for i in range(len(model.arc_units))]
        triples = [f"f{j}" for j in range(model.num_triples)]
        util, cut, seg = "pair", "cut", "s"
    else:
        gpu = list(lab.gpu)
        ends = np.asarray(model.arc_nodes, np.int64)
        arcs = [f"arc_{lab.node[a]}_{lab.node[b]}" for a, b in ends.tolist()]
        triples = [f"f_{lab.node[u]}_{lab.node[w]}_{gpu[t]}" for (u, w), t in
                   zip(ends[np.asarray(model.triple_in, np.int64)].tolist(),
                       np.asarray(model.triple_t, np.int64).tolist())]
        util, cut, seg = "u_", "cut_", "s_"
    rows = (arcs + [f"{util}{gpu[u]}_{gpu[t]}" for u, t in pairs.tolist()]
            + [f"{cut}{i}" for i in range(n_cuts)])
    cols = triples + [f"{seg}{gpu[u]}_{gpu[t]}_{b}" for u, t in pairs.tolist() for b in range(nb)]
    return cols, rows


def hop_columns(model: SwitchRemovalModel, max_depth: int) -> np.ndarray:
    """Hop variables ``x[r, a, d]`` of :func:`build_step_lp` as rows ``(r, u, v, d)``:
    root ``r``'s trees use logical link ``u -> v`` (a switch-sharing pair or a direct
    link) with ``v`` at depth ``d``; ``d = 1`` only from the root, deeper only between
    non-roots."""
    links = logical_links(model)
    n = model.num_gpus
    out = []
    for r in range(n):
        first = links[(links[:, 0] == r)]
        out += [(r, u, v, 1) for u, v in first.tolist()]
        inner = links[(links[:, 0] != r) & (links[:, 1] != r)]
        for d in range(2, max_depth + 1):
            out += [(r, u, v, d) for u, v in inner.tolist()]
    return np.array(out, np.int64).reshape(-1, 4)


def logical_links(model: SwitchRemovalModel) -> np.ndarray:
    """Candidate logical links ``(u, v)``: switch-sharing pairs and direct links, sorted."""
    n = model.num_gpus
    direct = np.stack([np.asarray(model.direct_tail, np.int64),
                       np.asarray(model.direct_head, np.int64)], axis=1).reshape(-1, 2)
    code = np.unique(np.concatenate([model.pairs[:, 0] * n + model.pairs[:, 1],
                                     direct[:, 0] * n + direct[:, 1]]))
    return np.stack([code // n, code % n], axis=1)


def build_step_lp(model: SwitchRemovalModel, max_depth: int,
                  cuts: Sequence[np.ndarray] = ()) -> tuple[LinearProgram, np.ndarray]:
    """Hop-indexed switch removal (App. C): columns ``[f; x]`` (``x`` as listed by
    :func:`hop_columns`, returned too).  Rows: transport per arc; per root ``r`` and
    GPU ``v != r``, ``sum x[r, ·->v, ·] >= k_keep`` (every tree reaches ``v`` within
    ``max_depth`` hops); ``x[r, u->v, d] <= sum x[r, ·->u, d-1]`` (a tree edge at depth
    ``d`` hangs below a vertex at depth ``d - 1`` of the same root); per logical link
    ``sum_{r,d} x[r, u->v, d] <= L[u, v]``; the cut rows of ``cuts``.  Objective: minimise
    ``sum d · x`` (mean depth of the relaxation).  A relaxation of depth-``max_depth``
    tree packing, so infeasibility proves no such packing exists on any split."""
    if max_depth < 1:
        raise FormulationError("max_depth must be >= 1")
    p, n = model.num_triples, model.num_gpus
    hops = hop_columns(model, max_depth)
    h = len(hops)
    ncol = p + h
    units = np.asarray(model.arc_units, float)
    tin = np.asarray(model.triple_in, np.int64)
    tout = np.asarray(model.triple_out, np.int64)
    blocks, lo, hi = [], [], []
    blocks.append(sp.csr_matrix((np.ones(2 * p), (np.concatenate([tin, tout]),
                                                  np.tile(np.arange(p), 2))),
                                shape=(units.size, ncol)))
    lo.append(np.full(units.size, -np.inf))
    hi.append(units)
    r, u, v, d = hops.T
    # coverage: one row per (r, v != r)
    cov = r * n + v
    blocks.append(sp.csr_matrix((np.ones(h), (cov, p + np.arange(h))), shape=(n * n, ncol)))
    need = np.full(n * n, model.k_keep)
    need[np.arange(n) * n + np.arange(n)] = -np.inf
    lo.append(need)
    hi.append(np.full(n * n, np.inf))
    # depth: x[r,u->v,d] - sum x[r,·->u,d-1] <= 0 for d >= 2
    deep = np.flatnonzero(d >= 2)
    key_in = (r * n + v) * (max_depth + 1) + d           # vertex v of root r at depth d
    order = np.argsort(key_in, kind="stable")
    sorted_keys = key_in[order]
    rows, cols, vals = [deep * 0 + np.arange(deep.size)], [p + deep], [np.ones(deep.size)]
    for i, j in enumerate(deep.tolist()):
        want = (r[j] * n + u[j]) * (max_depth + 1) + d[j] - 1
        a, b = np.searchsorted(sorted_keys, [want, want + 1])
        rows.append(np.full(b - a, i))
        cols.append(p + order[a:b])
        vals.append(-np.ones(b - a))
    blocks.append(sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows),
                                                        np.concatenate(cols))),
                                shape=(deep.size, ncol)))
    lo.append(np.full(deep.size, -np.inf))
    hi.append(np.zeros(deep.size))
    # link capacity: sum_{r,d} x - sum_w f <= direct
    links = logical_links(model)
    lcode = links[:, 0] * n + links[:, 1]
    link_of_hop = np.searchsorted(lcode, u * n + v)
    tcode = np.asarray(model.triple_u, np.int64) * n + np.asarray(model.triple_t, np.int64)
    link_of_triple = np.searchsorted(lcode, tcode)
    blocks.append(sp.csr_matrix((np.concatenate([np.ones(h), -np.ones(p)]),
                                 (np.concatenate([link_of_hop, link_of_triple]),
                                  np.concatenate([p + np.arange(h), np.arange(p)]))),
                                shape=(len(links), ncol)))
    lo.append(np.full(len(links), -np.inf))
    hi.append(model.logical(np.zeros(p))[links[:, 0], links[:, 1]])
    cut_lo, cut_hi, cut_A = model.cut_rows(cuts, ncol)
    blocks.append(cut_A)
    lo.append(cut_lo)
    hi.append(cut_hi)
    c = np.concatenate([np.zeros(p), d.astype(float)])
    lp = LinearProgram(c=c, A=sp.vstack(blocks).tocsr(), row_lo=np.concatenate(lo),
                       row_hi=np.concatenate(hi), col_lo=np.zeros(ncol),
                       col_hi=np.full(ncol, np.inf), sense="min", name="step_switch_removal")
    return lp, hops
