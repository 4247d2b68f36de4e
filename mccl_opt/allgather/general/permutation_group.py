"""Arithmetic of the abelian permutation groups that :mod:`.symmetry` finds: a
permutation's order, a group's elements from commuting generators, orbits, generator
clusters, and the coupling of uniform distributions over clusters (docs/allgather_history.md
"Symmetric quotient")."""

from __future__ import annotations

from fractions import Fraction
from math import lcm

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

__all__ = ["coupling", "cycle_order", "elements", "orbits", "clusters_of"]


def coupling(sizes: list[int]) -> list[tuple[tuple[int, ...], float]]:
    """North-west-corner coupling of uniform distributions over ``sizes`` elements each
    (:meth:`Symmetry.pieces`): ``(element index per cluster, weight)``, the weights
    multiples of ``1 / lcm(sizes)`` summing to 1."""
    if not sizes:
        return [((), 1.0)]
    den = lcm(*sizes)
    cuts = sorted({i * (den // n) for n in sizes for i in range(n + 1)})
    return [(tuple(lo * n // den for n in sizes), float(Fraction(hi - lo, den)))
            for lo, hi in zip(cuts, cuts[1:])]


def cycle_order(perm: np.ndarray) -> int:
    """The order of the permutation ``perm`` (its smallest power that is the identity)."""
    k, p = 1, perm.copy()
    ident = np.arange(perm.size)
    while not np.array_equal(p, ident):
        p = perm[p]
        k += 1
    return k


def elements(gens: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Every product ``g1^e1 ... gm^em`` of commuting generators, as stacked node and
    link permutations (uniform over the group they generate)."""
    nodes = [np.arange(gens[0][0].size)]
    links = [np.arange(gens[0][1].size)]
    for node, link in gens:
        k = cycle_order(node)
        pn, pl = list(nodes), list(links)
        for _ in range(k - 1):
            pn = [node[p] for p in pn]
            pl = [link[p] for p in pl]
            nodes += pn
            links += pl
    return np.stack(nodes), np.stack(links)


def orbits(n: int, maps: list[np.ndarray]) -> np.ndarray:
    """Orbit labels of ``range(n)`` under the permutations ``maps``."""
    if not maps:
        return np.arange(n)
    src = np.concatenate([np.arange(n)] * len(maps))
    dst = np.concatenate(maps)
    graph = coo_matrix((np.ones(src.size), (src, dst)), shape=(n, n))
    return connected_components(graph, directed=True, connection="weak")[1]


def clusters_of(support: list[np.ndarray]) -> np.ndarray:
    """Cluster label per generator: connected components of 'moves a common link'."""
    m = len(support)
    owner = np.concatenate([np.full(s.size, i) for i, s in enumerate(support)])
    links = np.concatenate(support)
    order = np.argsort(links, kind="stable")
    same = np.flatnonzero(np.diff(links[order]) == 0)
    a, b = owner[order][same], owner[order][same + 1]
    graph = coo_matrix((np.ones(a.size), (a, b)), shape=(m, m))
    return connected_components(graph, directed=False)[1]
