"""The compact arc-flow model of AllToAll (paper App. G), as an independent optimum.

``max z`` such that every ordered GPU pair ``(s, d)`` receives ``z`` units of flow and the
summed flow on each physical link stays within its capacity.  Two commodity groupings
give the same LP optimum (flow decomposition):

* ``commodities="pair"``: one commodity per ordered pair, as in App. G (the baseline the
  benchmark compares with; ``N(N-1)·|A|`` flow variables);
* ``commodities="source"``: one commodity per source GPU that sends ``(N-1)·z`` and drops
  ``z`` at every other GPU (the Dantzig-Wolfe blocks of App. G.4; ``N·|A|`` variables).

With ``max_steps`` the flow runs on the time-expanded graph of paper §4.2 (copies
``0..max_steps`` of every node, numbered step-major ``i·n + v``; an arc into a switch
stays in its step, any other arc advances one step; a commodity may be absorbed at its
destination at any step), and the capacity of a link bounds the flow summed over all
its time copies (all copies share one capacity, as in the master).

:func:`build_chunked_milp` is the compact MILP of App. G.2 for tiny cases: integer
chunk counts per pair and arc, minimising ``t = 1/z``.

Takes plain arrays (numpy/scipy only), never :class:`mccl_opt.Topology`.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from .errors import FormulationError
from .lp import LinearProgram
from .names import FabricLabels

__all__ = ["build_compact_lp", "build_chunked_milp"]


def _check(n_nodes: int, tails: np.ndarray, heads: np.ndarray, capacities: np.ndarray,
           is_switch: np.ndarray, gpus: np.ndarray) -> tuple[np.ndarray, ...]:
    tails = np.asarray(tails, dtype=np.int64)
    heads = np.asarray(heads, dtype=np.int64)
    capacities = np.asarray(capacities, dtype=float)
    is_switch = np.asarray(is_switch, dtype=bool)
    gpus = np.asarray(gpus, dtype=np.int64)
    if not (tails.shape == heads.shape == capacities.shape):
        raise FormulationError("tails, heads and capacities must have the same length")
    if is_switch.shape != (n_nodes,):
        raise FormulationError(f"is_switch must have n_nodes={n_nodes} entries")
    if gpus.size < 2 or is_switch[gpus].any():
        raise FormulationError("gpus must list at least two non-switch nodes")
    for label, arr in (("tails", tails), ("heads", heads)):
        if arr.size and (arr.min() < 0 or arr.max() >= n_nodes):
            raise FormulationError(f"{label} has a node index outside 0..{n_nodes - 1}")
    if (capacities <= 0).any():
        raise FormulationError("capacities must be > 0")
    return tails, heads, capacities, is_switch, gpus


def _expanded_arcs(n_nodes: int, tails: np.ndarray, heads: np.ndarray, is_switch: np.ndarray,
                   max_steps: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Arcs of the (time-expanded) graph: (tail, head, physical link) and node count."""
    if max_steps is None:
        return tails, heads, np.arange(tails.size), n_nodes
    if max_steps < 1:
        raise FormulationError("max_steps must be >= 1")
    copies = max_steps + 1
    into_switch = is_switch[heads]
    et, eh, el = [], [], []
    for i in range(copies):
        stay = into_switch
        et.append(i * n_nodes + tails[stay]); eh.append(i * n_nodes + heads[stay])
        el.append(np.flatnonzero(stay))
        if i + 1 < copies:
            move = ~into_switch
            et.append(i * n_nodes + tails[move]); eh.append((i + 1) * n_nodes + heads[move])
            el.append(np.flatnonzero(move))
    return (np.concatenate(et), np.concatenate(eh), np.concatenate(el), copies * n_nodes)


def _flow_blocks(n_nodes: int, tails: np.ndarray, heads: np.ndarray, is_switch: np.ndarray,
                 gpus: np.ndarray, max_steps: int | None, commodities: str):
    """Conservation and capacity structure shared by the LP and the MILP.

    Flow columns start at index 1 (column 0 is the rate variable).  Returns the COO
    triplets of the conservation rows (without the rate/demand terms), the (row, sign)
    of the demand terms per commodity, the capacity triplets, and the sizes.
    """
    if commodities not in ("pair", "source"):
        raise FormulationError(f"commodities must be 'pair' or 'source', got {commodities!r}")
    et, eh, el, n_exp = _expanded_arcs(n_nodes, tails, heads, is_switch, max_steps)
    copies = 1 if max_steps is None else max_steps + 1
    n_g = gpus.size
    if commodities == "pair":
        comm = [(s, d) for s in range(n_g) for d in range(n_g) if s != d]
    else:
        comm = [(s, -1) for s in range(n_g)]
    n_e = et.size
    # Sink arcs: destination copy (d, i) -> super-sink sigma_d (one per GPU), every step.
    sink_node = n_exp + np.arange(n_g)
    st = (np.arange(copies)[:, None] * n_nodes + gpus[None, :]).ravel()
    sh = np.tile(sink_node, copies)
    n_v = n_exp + n_g
    rows, cols, vals, demand_rows, demand_vals, cap_rows, cap_cols = [], [], [], [], [], [], []
    col = 1
    for k, (s, d) in enumerate(comm):
        dests = [d] if d >= 0 else [x for x in range(n_g) if x != s]
        sinks = np.concatenate([np.flatnonzero(sh == sink_node[x]) for x in dests])
        ct = np.concatenate([et, st[sinks]])
        ch = np.concatenate([eh, sh[sinks]])
        idx = col + np.arange(ct.size)
        r0 = k * n_v
        rows += [r0 + ch, r0 + ct]          # inflow - outflow
        cols += [idx, idx]
        vals += [np.ones(ct.size), -np.ones(ct.size)]
        demand_rows.append(r0 + np.array([gpus[s]] + [sink_node[x] for x in dests]))
        demand_vals.append(np.array([-float(len(dests))] + [1.0] * len(dests)))
        cap_rows.append(el)
        cap_cols.append(col + np.arange(n_e))
        col += ct.size
    n_cons = len(comm) * n_v
    cap = (np.concatenate(cap_rows), np.concatenate(cap_cols))
    return ((np.concatenate(rows), np.concatenate(cols), np.concatenate(vals)),
            (np.concatenate(demand_rows), np.concatenate(demand_vals)), cap, n_cons, col)


def _names(labels: FabricLabels, n_nodes: int, tails: np.ndarray, heads: np.ndarray,
           is_switch: np.ndarray, gpus: np.ndarray, max_steps: int | None,
           commodities: str) -> tuple[list[str], list[str]]:
    """Column and row names in :func:`_flow_blocks`' order (docs/benchmarks.md): ``z``;
    per commodity ``f_<comm>_<tail>_<head>[_<step>]`` (flow on a link, at the step of
    its tail) and ``a_<comm>_<gpu>[_<step>]`` (absorbed at a destination); rows
    ``n_<comm>_<node>[_<step>]`` (conservation), ``s_<comm>_<gpu>`` (a destination's
    super-sink) and ``cap_<tail>_<head>``.  ``<comm>`` is ``<src>_<dst>`` (pair) or
    ``<src>`` (source)."""
    if len(labels.node) != n_nodes or len(labels.link) != tails.size:
        raise FormulationError("labels must name every node and link of the model")
    et, _, el, n_exp = _expanded_arcs(n_nodes, tails, heads, is_switch, max_steps)
    copies = 1 if max_steps is None else max_steps + 1
    timed = max_steps is not None
    arc = [labels.link[a] + (f"_{t // n_nodes}" if timed else "")
           for a, t in zip(el.tolist(), et.tolist())]
    node = [labels.node[v % n_nodes] + (f"_{v // n_nodes}" if timed else "")
            for v in range(n_exp)]
    gpu = labels.gpu
    n_g = len(gpus)
    if commodities == "pair":
        comm = [(s, [d], f"{gpu[s]}_{gpu[d]}") for s in range(n_g) for d in range(n_g) if s != d]
    else:
        comm = [(s, [d for d in range(n_g) if d != s], gpu[s]) for s in range(n_g)]
    cols, rows = ["z"], []
    for _, dests, c in comm:
        cols += [f"f_{c}_{a}" for a in arc]
        cols += [f"a_{c}_{gpu[d]}" + (f"_{i}" if timed else "") for d in dests
                 for i in range(copies)]
        rows += [f"n_{c}_{v}" for v in node] + [f"s_{c}_{g}" for g in gpu]
    return cols, rows + labels.capacity_rows()


def build_compact_lp(n_nodes: int, tails: np.ndarray, heads: np.ndarray,
                     capacities: np.ndarray, is_switch: np.ndarray, gpus: np.ndarray, *,
                     max_steps: int | None = None, commodities: str = "pair",
                     labels: FabricLabels | None = None) -> LinearProgram:
    """The arc-flow LP ``max z`` (paper App. G.3); column 0 is ``z`` (Gbps per pair).

    ``gpus[r]`` is the node index of rank ``r``.  Rows: per commodity one conservation
    row per (expanded) node and per GPU super-sink (``inflow - outflow = b_v·z``), then
    one capacity row per link.  ``labels`` (:mod:`formulations.names`): name the rows
    and columns after the fabric's nodes and links (for MPS/LP export).
    """
    tails, heads, capacities, is_switch, gpus = _check(n_nodes, tails, heads, capacities,
                                                       is_switch, gpus)
    (r, c_, v), (dr, dv), (cr, cc), n_cons, n_cols = _flow_blocks(
        n_nodes, tails, heads, is_switch, gpus, max_steps, commodities)
    n_links = tails.size
    rows = np.concatenate([r, dr, n_cons + cr])
    cols = np.concatenate([c_, np.zeros(dr.size, dtype=np.int64), cc])
    vals = np.concatenate([v, -dv, np.ones(cc.size)])
    A = sp.csr_matrix((vals, (rows, cols)), shape=(n_cons + n_links, n_cols))
    row_lo = np.concatenate([np.zeros(n_cons), np.full(n_links, -np.inf)])
    row_hi = np.concatenate([np.zeros(n_cons), capacities])
    obj = np.zeros(n_cols)
    obj[0] = 1.0
    col_names = row_names = None
    if labels is not None:
        col_names, row_names = _names(labels, n_nodes, tails, heads, is_switch, gpus,
                                      max_steps, commodities)
    return LinearProgram(obj, A, row_lo, row_hi, np.zeros(n_cols), np.full(n_cols, np.inf),
                         sense="max", name="alltoall-compact", col_names=col_names,
                         row_names=row_names)


def build_chunked_milp(n_nodes: int, tails: np.ndarray, heads: np.ndarray,
                       capacities: np.ndarray, is_switch: np.ndarray, gpus: np.ndarray,
                       max_chunks: int, *, max_steps: int | None = None) -> LinearProgram:
    """The compact MILP (paper App. G.2) for tiny cases: ``min t`` (``t = 1/z``, s/Gbit)
    with integer chunk counts ``n`` per pair and arc, each pair sending ``max_chunks``
    chunks of ``1/max_chunks``; capacity rows ``sum n_a / K - cap_a·t <= 0``.

    Its optimum ``1/t`` is the best rate any chunked schedule reaches.
    """
    tails, heads, capacities, is_switch, gpus = _check(n_nodes, tails, heads, capacities,
                                                       is_switch, gpus)
    if max_chunks < 1:
        raise FormulationError("max_chunks must be >= 1")
    (r, c_, v), (dr, dv), (cr, cc), n_cons, n_cols = _flow_blocks(
        n_nodes, tails, heads, is_switch, gpus, max_steps, "pair")
    n_links = tails.size
    rows = np.concatenate([r, n_cons + cr, n_cons + np.arange(n_links)])
    cols = np.concatenate([c_, cc, np.zeros(n_links, dtype=np.int64)])
    vals = np.concatenate([v, np.full(cc.size, 1.0 / max_chunks), -capacities])
    A = sp.csr_matrix((vals, (rows, cols)), shape=(n_cons + n_links, n_cols))
    rhs = np.zeros(n_cons)
    np.add.at(rhs, dr, dv * max_chunks)
    row_lo = np.concatenate([rhs, np.full(n_links, -np.inf)])
    row_hi = np.concatenate([rhs, np.zeros(n_links)])
    obj = np.zeros(n_cols)
    obj[0] = 1.0
    integrality = np.ones(n_cols, dtype=bool)
    integrality[0] = False
    col_hi = np.full(n_cols, float(max_chunks))
    col_hi[0] = np.inf
    return LinearProgram(obj, A, row_lo, row_hi, np.zeros(n_cols), col_hi, integrality,
                         sense="min", name="alltoall-compact-milp")
