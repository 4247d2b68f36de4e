"""The sparse copies' cluster LP on cosets, then on the positive cosets' elements
(``general.cluster_lp``; docs/allgather.md "The cluster LP on cosets, then on their
elements"): every root keeps the uniform expansion's share and every link at most its
capacity, the schedule reaches the full master's optimum (an independent solve), and
clearing a column's majority entries changes no row's value."""

from __future__ import annotations

import numpy as np
import pytest

import mccl_opt as mo
from mccl_opt.allgather.canonical import canonical
from mccl_opt.allgather.general import cluster_lp, quotient
from mccl_opt.allgather.general.method import solve_general
from mccl_opt.allgather.general.quotient import solve_quotient
from mccl_opt.allgather.general.sparse_copies import sparse_copies
from tests.oracle_allgather import check_schedule
from tests.test_allgather_quotient import STATES, _quotient_columns, check_copies


def _state():
    """Shared aggregation 2x3x4, GPU 0's NIC at 150.8 Gbps one way: clusters ``Z_2 x Z_3``
    and ``Z_3 x Z_4``, so each has two generators' subgroups to take cosets of."""
    topo = canonical(STATES["shared-agg 2x3x4 NIC 150.8"]())
    sym, q, z, capacity = _quotient_columns(topo)
    return topo, sym, q, z, capacity, np.flatnonzero(z > 0)


@pytest.mark.parametrize("refine", [True, False])
def test_the_coset_path_keeps_every_share_and_capacity(monkeypatch, refine):
    """With the coset LPs forced (every LP counted large) the copies keep the uniform
    expansion's root shares and link bounds, both after the LP on the cosets' elements
    and with the coset vertex alone (that LP over its nonzero cap)."""
    topo, sym, q, z, capacity, pos = _state()
    monkeypatch.setattr(cluster_lp, "LARGE_NONZEROS", 0)
    if not refine:
        monkeypatch.setattr(cluster_lp, "MAX_CLUSTER_NONZEROS", 0)
    coarse = []
    on_cosets = cluster_lp._on_cosets
    monkeypatch.setattr(cluster_lp, "_on_cosets", lambda *a: coarse.append(on_cosets(*a)) or coarse[-1])
    copies = sparse_copies(topo, sym, np.asarray(q.roots)[pos], [q.trees[j] for j in pos],
                           z[pos], capacity, "highs")
    assert len(coarse) == len(sym.nodes) and all(m is not None for m in coarse)
    uniform, few = check_copies(topo, sym, q, z, capacity, copies)
    assert len(few.pool) < len(uniform.pool)


def test_the_coset_path_reaches_the_full_masters_optimum(monkeypatch):
    """The quotient's schedule on the coset path's copies has the full master's rate
    (solved without symmetry) and passes the independent checker."""
    topo = _state()[0]
    full = solve_general(topo, max_chunks=None)
    monkeypatch.setattr(cluster_lp, "LARGE_NONZEROS", 0)
    monkeypatch.setattr(quotient, "SPARSE_COPIES_MIN_RATIO", 0)
    s = solve_quotient(topo)
    assert "copies_short" not in s.stats
    assert s.rate_gbps == pytest.approx(full.lp_rate_gbps, rel=1e-9)
    assert mo.validate(topo, s).rate_gbps == pytest.approx(s.rate_gbps, rel=1e-9)
    check_schedule(topo, s)


def test_clearing_majority_entries_keeps_every_row_value():
    """``_majority_cleared``: for any fractions summing to 1 per column, every link row's
    value drops by exactly its shift, other rows are unchanged, and rows lose nonzeros."""
    topo, sym, q, z, capacity, pos = _state()
    trees = [np.asarray(q.trees[j], np.int64) for j in pos]
    im = cluster_lp._images(topo, sym, 1, np.asarray(q.roots)[pos], trees, z[pos])
    rows = cluster_lp._rows(im, np.arange(topo.num_links), np.arange(topo.num_gpus))
    col, elem = cluster_lp._variables(im, rows.link_row, rows.rank_row,
                                      np.ones((pos.size, sym.nodes[1].shape[0]), bool))
    a = cluster_lp._matrix(im, rows, z[pos], col, elem)
    cleared, shift = cluster_lp._majority_cleared(a, rows.links, col)
    assert cleared.nnz < a.nnz and (shift[rows.links:] == 0).all() and (shift > 0).any()
    f = np.random.default_rng(3).uniform(0.1, 1.0, col.size)
    f /= np.bincount(col, f)[col]
    assert cleared @ f == pytest.approx(a @ f - shift, abs=1e-12)
