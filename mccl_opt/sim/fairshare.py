"""Max-min fair bandwidth sharing by progressive filling (docs/sim.md §Sharing).

Every flow crosses a set of links (a CSR row) and stands for ``weight`` identical flows.
All unfrozen flows grow at the same rate until a link saturates; the flows crossing it
freeze at that level; repeat.  The result is the max-min fair allocation: no flow can
get more without taking from a flow that has no more.  The kernel is numba-compiled on
first use (cached); one call costs O(nnz + levels x links).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

__all__ = ["max_min_rates", "fill"]

_REL_TOL = 1e-9
_kernel = None


def _compile():
    from numba import njit

    @njit(cache=True)
    def kernel(indptr, indices, act, weight, growth, cap, rel_tol):  # pragma: no cover - numba
        n_links = cap.size
        n_act = act.size
        rates = np.zeros(n_act)
        load = np.zeros(n_links)
        wl = np.zeros(n_links)
        count = np.zeros(n_links + 1, np.int64)
        for k in range(n_act):
            f = act[k]
            for p in range(indptr[f], indptr[f + 1]):
                a = indices[p]
                wl[a] += weight[f] * growth[f]
                count[a + 1] += 1
        for a in range(n_links):
            count[a + 1] += count[a]
        flows_of = np.empty(count[n_links], np.int64)
        pos = count[:n_links].copy()
        for k in range(n_act):
            f = act[k]
            for p in range(indptr[f], indptr[f + 1]):
                a = indices[p]
                flows_of[pos[a]] = k
                pos[a] += 1
        remaining = cap.astype(np.float64).copy()
        free = np.ones(n_act, np.bool_)
        n_free = n_act
        level = 0.0
        while n_free > 0:
            delta = np.inf
            first = -1
            for a in range(n_links):
                if wl[a] > 0.0:
                    d = remaining[a] / wl[a]
                    if d < delta:
                        delta = d
                        first = a
            if first < 0:
                break
            if delta < 0.0:
                delta = 0.0
            level += delta
            for a in range(n_links):
                if wl[a] > 0.0:
                    remaining[a] -= delta * wl[a]
                    if remaining[a] < 0.0:
                        remaining[a] = 0.0
            for a in range(n_links):
                if wl[a] > 0.0 and (a == first or remaining[a] <= rel_tol * cap[a]):
                    for q in range(count[a], count[a + 1]):
                        k = flows_of[q]
                        if free[k]:
                            free[k] = False
                            n_free -= 1
                            f = act[k]
                            rates[k] = level * growth[f]
                            for p in range(indptr[f], indptr[f + 1]):
                                wl[indices[p]] -= weight[f] * growth[f]
                    wl[a] = 0.0
            for a in range(n_links):
                if wl[a] < 1e-12:
                    wl[a] = 0.0
        for k in range(n_act):
            f = act[k]
            for p in range(indptr[f], indptr[f + 1]):
                load[indices[p]] += weight[f] * rates[k]
        return rates, load

    return kernel


def fill(indptr: np.ndarray, indices: np.ndarray, act: np.ndarray, weight: np.ndarray,
         growth: np.ndarray, capacity: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rates of flows ``act`` (rows of the CSR ``indptr/indices``) and the resulting
    per-link load, both in the unit of ``capacity``.  Flow ``f`` grows at ``growth[f]``
    times the common fill level (all ones: plain max-min fairness)."""
    global _kernel
    if _kernel is None:
        _kernel = _compile()
    return _kernel(indptr, indices, np.ascontiguousarray(act, dtype=np.int64),
                   np.ascontiguousarray(weight, dtype=np.float64),
                   np.ascontiguousarray(growth, dtype=np.float64),
                   np.ascontiguousarray(capacity, dtype=np.float64), _REL_TOL)


def max_min_rates(inc: sp.csr_matrix, weight: np.ndarray, capacity: np.ndarray,
                  growth: np.ndarray | None = None) -> np.ndarray:
    """Max-min fair rate of each flow (row of ``inc``), in the unit of ``capacity``.

    ``weight[f]`` is the number of identical flows row ``f`` stands for; the returned
    rate is per flow, so link ``a`` carries ``sum_f inc[f, a] * weight[f] * rate[f]``
    (an entry repeated in a row counts that many times).  ``growth`` makes the sharing
    weighted (rates proportional to ``growth`` until a link saturates).  Every row must
    cross at least one link.
    """
    inc = sp.csr_matrix(inc)
    n = inc.shape[0]
    rates, _ = fill(inc.indptr.astype(np.int64), inc.indices.astype(np.int64), np.arange(n),
                    np.asarray(weight, dtype=np.float64),
                    np.ones(n) if growth is None else np.asarray(growth, dtype=np.float64),
                    np.asarray(capacity, dtype=np.float64))
    return rates
