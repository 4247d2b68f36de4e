"""Connected components of a directed graph given as arc arrays ``tail -> head``.

Two numba kernels, O(nodes + arcs) each: weakly connected components by union-find and
strongly connected components by an iterative Tarjan search.  Both number the
components in the order of their smallest node (node 0's component is 0), so the
labels depend on the graph only, not on the arc order.  They replace
``scipy.sparse.csgraph.connected_components`` on the synthesizers' paths, whose import
(scipy.sparse.linalg and its dependencies) cost a new process about 60 ms.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["weak_components", "strong_components"]


def weak_components(n: int, tail: np.ndarray, head: np.ndarray) -> np.ndarray:
    """One label per node ``0..n-1``: its weakly connected component over the arcs."""
    return _weak(n, np.asarray(tail, np.int64), np.asarray(head, np.int64))


def strong_components(n: int, tail: np.ndarray, head: np.ndarray) -> tuple[int, np.ndarray]:
    """The number of strongly connected components over the arcs, and one label per node."""
    label = _strong(n, np.asarray(tail, np.int64), np.asarray(head, np.int64))
    return int(label.max()) + 1 if n else 0, label


@njit(cache=True)
def _by_first_node(root):
    """Labels ``0, 1, ...`` in the order of each group's smallest node (``root[v]``:
    any representative of ``v``'s group, in ``0..n-1``)."""
    n = root.size
    number = np.full(n, -1, np.int64)
    label = np.empty(n, np.int64)
    count = 0
    for v in range(n):
        r = root[v]
        if number[r] < 0:
            number[r] = count
            count += 1
        label[v] = number[r]
    return label


@njit(cache=True)
def _weak(n, tail, head):
    parent = np.arange(n)
    for i in range(tail.size):
        a, b = tail[i], head[i]
        while parent[a] != a:               # path halving
            parent[a] = parent[parent[a]]
            a = parent[a]
        while parent[b] != b:
            parent[b] = parent[parent[b]]
            b = parent[b]
        if a != b:
            parent[max(a, b)] = min(a, b)
    for v in range(n):
        r = v
        while parent[r] != r:
            r = parent[r]
        parent[v] = r
    return _by_first_node(parent)


@njit(cache=True)
def _strong(n, tail, head):
    """Tarjan's algorithm with an explicit stack of (node, next arc) frames."""
    start = np.zeros(n + 1, np.int64)
    for i in range(tail.size):
        start[tail[i] + 1] += 1
    for v in range(n):
        start[v + 1] += start[v]
    fill = start[:-1].copy()
    out = np.empty(tail.size, np.int64)
    for i in range(tail.size):
        out[fill[tail[i]]] = head[i]
        fill[tail[i]] += 1
    index = np.full(n, -1, np.int64)
    low = np.zeros(n, np.int64)
    on_stack = np.zeros(n, np.bool_)
    stack = np.empty(n, np.int64)       # Tarjan's stack of visited, unassigned nodes
    frames = np.empty(n, np.int64)      # the search path
    cursor = np.empty(n, np.int64)      # per node: the next out-arc to look at
    root = np.full(n, -1, np.int64)     # per node: its component's first-popped member
    counter = 0
    top = 0
    for s in range(n):
        if index[s] >= 0:
            continue
        depth = -1
        found = s                           # a node to enter next (-1: none)
        while True:
            if found >= 0:                  # enter it: number it, push it, descend
                index[found] = low[found] = counter
                counter += 1
                cursor[found] = start[found]
                stack[top] = found
                top += 1
                on_stack[found] = True
                depth += 1
                frames[depth] = found
                found = -1
            if depth < 0:
                break
            v = frames[depth]
            if cursor[v] < start[v + 1]:
                w = out[cursor[v]]
                cursor[v] += 1
                if index[w] < 0:
                    found = w
                elif on_stack[w] and index[w] < low[v]:
                    low[v] = index[w]
                continue
            if low[v] == index[v]:          # v roots a component: pop it
                while True:
                    top -= 1
                    w = stack[top]
                    on_stack[w] = False
                    root[w] = v
                    if w == v:
                        break
            depth -= 1
            if depth >= 0:
                u = frames[depth]
                if low[v] < low[u]:
                    low[u] = low[v]
    return _by_first_node(root)
