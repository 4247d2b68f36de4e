"""Numba kernels of the pricing step (imported on first use; see :mod:`.pricing`)."""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["price_all", "cheapest_path", "direct_relief"]


@njit(cache=True)
def _close_switches(dist, pred_row, tail, head, price, switch_arcs, moved):
    """Sweep the arcs into switches until no label improves.  Only an arc whose tail
    ``moved`` (improved) in this level can improve its head: at the end of the previous
    level every switch arc had ``dist[tail] + price >= dist[head]``, and heads only
    decrease.  Skipping the others changes nothing (same labels, same predecessors)."""
    changed_any = False
    changed = True
    while changed:
        changed = False
        for i in range(switch_arcs.size):
            a = switch_arcs[i]
            u = tail[a]
            if not moved[u]:
                continue
            nd = dist[u] + price[a]
            v = head[a]
            if nd < dist[v]:
                dist[v] = nd
                pred_row[v] = a
                moved[v] = True
                changed = True
                changed_any = True
    return changed_any


@njit(cache=True)
def price_all(n, tail, head, price, step_arcs, switch_arcs, is_switch, gpu_nodes,
              max_steps, threshold, want, sources):
    """Shortest paths from the GPUs of rank ``sources`` (rows of ``shortest``; the other
    rows stay 0) and the improving paths among them (see :func:`~.pricing.price_paths`).
    Each source is computed on its own, so a subset gives the same rows and paths."""
    g = gpu_nodes.size
    levels = max_steps + 1
    shortest = np.zeros((g, g))
    pred = np.full((levels, n), -1, dtype=np.int64)
    prev = np.empty(n)
    cur = np.empty(n)
    # nodes whose label improved in the previous / the current level: a step arc from a
    # node that did not improve in level k-1 cannot improve its head in level k (it was
    # relaxed from the same label then), so it is skipped -- same result, less work
    moved_prev = np.zeros(n, dtype=np.bool_)
    moved = np.zeros(n, dtype=np.bool_)
    # at most one path per wanted pair: the path arrays are sized once (4M pairs at
    # 2,048 GPUs, where growing them by doubling cost a third of the pass), the arcs
    # when full to 1.25 x the mean path length so far times the pairs left.  Allocated
    # here, not by numpy: its large arrays ask for huge pages, whose first use in a
    # process stalls on memory compaction (measured 1.0-1.2 s instead of 0.4-0.5 s)
    cap = 0
    for s in sources:
        for d in range(g):
            if d != s and want[s, d]:
                cap += 1
    out_src = np.empty(cap, dtype=np.int64)
    out_dst = np.empty(cap, dtype=np.int64)
    out_cost = np.empty(cap)
    out_start = np.zeros(cap + 1, dtype=np.int64)
    arc_cap = 4096
    out_arcs = np.empty(arc_cap, dtype=np.int64)
    count = 0
    buf = np.empty(n, dtype=np.int64)
    for s in sources:
        src = gpu_nodes[s]
        cur[:] = np.inf
        cur[src] = 0.0
        pred[0, :] = -1
        moved[:] = False
        moved[src] = True
        _close_switches(cur, pred[0], tail, head, price, switch_arcs, moved)
        last = 0
        for k in range(1, levels):
            prev[:] = cur
            moved_prev[:] = moved
            moved[:] = False
            pred[k, :] = -1
            changed = False
            for i in range(step_arcs.size):
                a = step_arcs[i]
                u = tail[a]
                if not moved_prev[u]:
                    continue
                nd = prev[u] + price[a]
                v = head[a]
                if nd < cur[v]:
                    cur[v] = nd
                    pred[k, v] = a
                    moved[v] = True
                    changed = True
            if not changed:
                break                   # no GPU improved: the switch closure cannot either
            _close_switches(cur, pred[k], tail, head, price, switch_arcs, moved)
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
            base = out_start[count]
            if base + length > arc_cap:
                need = base + length + (cap - count) * (base + length) // (count + 1)
                arc_cap = max(2 * arc_cap, need + need // 4)
                grown = np.empty(arc_cap, dtype=np.int64)
                grown[:base] = out_arcs[:base]
                out_arcs = grown
            for i in range(length):
                out_arcs[base + i] = buf[length - 1 - i]
            out_src[count] = s
            out_dst[count] = d
            out_cost[count] = cur[dn]
            out_start[count + 1] = base + length
            count += 1
    return (shortest, out_src[:count], out_dst[:count], out_cost[:count],
            out_start[:count + 1], out_arcs[:out_start[count]])


@njit(cache=True)
def balance_chunks(counts, units, pair, start, arcs, pair_start, pair_cols, arc_start, arc_cols,
                   capacity, k, max_moves, base):
    """Greedy completion + bottleneck-relief local search of chunk counts (see
    :mod:`.rounding`).  ``counts`` holds the fixed chunks per column and is completed
    in place: every pair's missing chunks go one at a time (round robin over pairs) to the
    column of that pair with ``units > counts`` whose links would end least utilised;
    then chunks leave the most utilised link for another column of their pair while that
    strictly lowers the utilisation of every link they move to below the maximum.
    ``base`` is a fixed load per link (in chunks) of routes outside ``counts``; pairs
    without columns are skipped."""
    n_links = capacity.size
    n_pairs = pair_start.size - 1
    load = base.copy()
    for j in range(counts.size):
        for i in range(start[j], start[j + 1]):
            load[arcs[i]] += counts[j]
    missing = np.zeros(n_pairs, dtype=np.int64)
    for p in range(n_pairs):
        tot = 0
        for i in range(pair_start[p], pair_start[p + 1]):
            tot += counts[pair_cols[i]]
        missing[p] = k - tot
    left = True
    while left:
        left = False
        for p in range(n_pairs):
            if missing[p] <= 0 or pair_start[p] == pair_start[p + 1]:
                continue
            best_j = -1
            best_u = np.inf
            best_f = -1.0
            for i in range(pair_start[p], pair_start[p + 1]):
                j = pair_cols[i]
                f = units[j] - counts[j]
                if f <= 1e-9:
                    continue
                u = 0.0
                for q in range(start[j], start[j + 1]):
                    a = arcs[q]
                    v = (load[a] + 1.0) / capacity[a]
                    if v > u:
                        u = v
                if u < best_u - 1e-15 or (u <= best_u + 1e-15 and f > best_f):
                    best_u = u
                    best_f = f
                    best_j = j
            if best_j < 0:                      # no fractional column left: widest share
                for i in range(pair_start[p], pair_start[p + 1]):
                    j = pair_cols[i]
                    if units[j] > best_f:
                        best_f = units[j]
                        best_j = j
            counts[best_j] += 1
            for q in range(start[best_j], start[best_j + 1]):
                load[arcs[q]] += 1.0
            missing[p] -= 1
            if missing[p] > 0:
                left = True
    mark = np.zeros(n_links, dtype=np.bool_)
    for _ in range(max_moves):
        top = 0
        top_u = -1.0
        for a in range(n_links):
            u = load[a] / capacity[a]
            if u > top_u:
                top_u = u
                top = a
        moved = False
        for i in range(arc_start[top], arc_start[top + 1]):
            j = arc_cols[i]
            if counts[j] == 0:
                continue
            for q in range(start[j], start[j + 1]):
                mark[arcs[q]] = True
            p = pair[j]
            for r in range(pair_start[p], pair_start[p + 1]):
                j2 = pair_cols[r]
                if j2 == j:
                    continue
                ok = True
                crosses_top = False
                for q in range(start[j2], start[j2 + 1]):
                    a = arcs[q]
                    if a == top:
                        crosses_top = True
                    if not mark[a] and (load[a] + 1.0) / capacity[a] >= top_u - 1e-12:
                        ok = False
                        break
                if ok and not crosses_top:
                    counts[j] -= 1
                    counts[j2] += 1
                    for q in range(start[j], start[j + 1]):
                        load[arcs[q]] -= 1.0
                    for q in range(start[j2], start[j2 + 1]):
                        load[arcs[q]] += 1.0
                    moved = True
                    break
            for q in range(start[j], start[j + 1]):
                mark[arcs[q]] = False
            if moved:
                break
        if not moved:
            break
    return counts


@njit(cache=True)
def cheapest_path(n, tail, head, price, src, dst):
    """The cheapest ``src -> dst`` path under ``price >= 0`` with no step bound
    (Bellman-Ford sweeps over the arcs until no label improves; the chunk repair's
    search, :mod:`.repair`): its cost (``inf`` when unreachable) and its arcs in path
    order."""
    dist = np.full(n, np.inf)
    pred = np.full(n, -1, dtype=np.int64)
    dist[src] = 0.0
    changed = True
    while changed:
        changed = False
        for a in range(tail.size):
            nd = dist[tail[a]] + price[a]
            if nd < dist[head[a]]:
                dist[head[a]] = nd
                pred[head[a]] = a
                changed = True
    if not dist[dst] < np.inf:
        return np.inf, np.zeros(0, dtype=np.int64)
    length = 0
    v = dst
    while v != src:
        length += 1
        v = tail[pred[v]]
    out = np.empty(length, dtype=np.int64)
    v = dst
    for i in range(length - 1, -1, -1):
        out[i] = pred[v]
        v = tail[pred[v]]
    return dist[dst], out


@njit(cache=True)
def direct_relief(cols, counts, start, arcs, src_node, dst_node, load, limit, n, tail, head,
                  blocked):
    """The first column of ``cols`` with a chunk whose pair has a path with room for
    it on every link (``load + 1 <= limit``, the column's own links freed of the
    chunk), cheapest by ``1 + load / limit`` per link: ``(column, path arcs)``, or
    ``(-1, empty)`` (:mod:`.repair`, no step bound)."""
    price = np.empty(tail.size)
    for i in range(cols.size):
        j = cols[i]
        if counts[j] <= 0:
            continue
        for q in range(start[j], start[j + 1]):
            load[arcs[q]] -= 1.0
        for a in range(tail.size):
            price[a] = blocked if load[a] + 1.0 > limit[a] else 1.0 + load[a] / max(limit[a], 1.0)
        cost, path = cheapest_path(n, tail, head, price, src_node[i], dst_node[i])
        for q in range(start[j], start[j + 1]):
            load[arcs[q]] += 1.0
        if cost < blocked:
            return j, path
    return -1, np.zeros(0, dtype=np.int64)
