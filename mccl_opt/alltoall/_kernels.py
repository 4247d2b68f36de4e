"""Numba kernels of the pricing step (imported on first use; see :mod:`.pricing`)."""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["price_all"]


@njit(cache=True)
def _close_switches(dist, pred_row, tail, head, price, switch_arcs):
    changed_any = False
    changed = True
    while changed:
        changed = False
        for i in range(switch_arcs.size):
            a = switch_arcs[i]
            nd = dist[tail[a]] + price[a]
            v = head[a]
            if nd < dist[v]:
                dist[v] = nd
                pred_row[v] = a
                changed = True
                changed_any = True
    return changed_any

@njit(cache=True)
def price_all(n, tail, head, price, step_arcs, switch_arcs, is_switch, gpu_nodes,
              max_steps, threshold, want):
    g = gpu_nodes.size
    levels = max_steps + 1
    shortest = np.zeros((g, g))
    pred = np.full((levels, n), -1, dtype=np.int64)
    prev = np.empty(n)
    cur = np.empty(n)
    cap = 1024
    out_src = np.empty(cap, dtype=np.int64)
    out_dst = np.empty(cap, dtype=np.int64)
    out_cost = np.empty(cap)
    out_start = np.zeros(cap + 1, dtype=np.int64)
    arc_cap = 4096
    out_arcs = np.empty(arc_cap, dtype=np.int64)
    count = 0
    buf = np.empty(n, dtype=np.int64)
    for s in range(g):
        src = gpu_nodes[s]
        cur[:] = np.inf
        cur[src] = 0.0
        pred[0, :] = -1
        _close_switches(cur, pred[0], tail, head, price, switch_arcs)
        last = 0
        for k in range(1, levels):
            prev[:] = cur
            pred[k, :] = -1
            changed = False
            for i in range(step_arcs.size):
                a = step_arcs[i]
                nd = prev[tail[a]] + price[a]
                v = head[a]
                if nd < cur[v]:
                    cur[v] = nd
                    pred[k, v] = a
                    changed = True
            if _close_switches(cur, pred[k], tail, head, price, switch_arcs):
                changed = True
            if not changed:
                break
            last = k
        for d in range(g):
            if d == s:
                continue
            dn = gpu_nodes[d]
            shortest[s, d] = cur[dn]
            if not want[s, d] or not cur[dn] < threshold[s, d]:
                continue
            # walk the predecessors back from level `last`
            v = dn
            k = last
            length = 0
            while v != src:
                a = pred[k, v]
                if a < 0:
                    k -= 1
                    continue
                buf[length] = a
                length += 1
                if not is_switch[v]:
                    k -= 1
                v = tail[a]
            if count == cap:
                cap *= 2
                out_src = np.concatenate((out_src, np.empty(cap - count, dtype=np.int64)))
                out_dst = np.concatenate((out_dst, np.empty(cap - count, dtype=np.int64)))
                out_cost = np.concatenate((out_cost, np.empty(cap - count)))
                out_start = np.concatenate((out_start, np.zeros(cap - count, dtype=np.int64)))
            base = out_start[count]
            while base + length > arc_cap:
                arc_cap *= 2
                out_arcs = np.concatenate((out_arcs, np.empty(arc_cap - out_arcs.size,
                                                              dtype=np.int64)))
            for i in range(length):
                out_arcs[base + i] = buf[length - 1 - i]
            out_src[count] = s
            out_dst[count] = d
            out_cost[count] = cur[dn]
            out_start[count + 1] = base + length
            count += 1
    return (shortest, out_src[:count], out_dst[:count], out_cost[:count],
            out_start[:count + 1], out_arcs[:out_start[count]])
