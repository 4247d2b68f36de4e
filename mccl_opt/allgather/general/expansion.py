"""The symmetric quotient's schedule built from its columns and the group's maps
(docs/allgather_history.md "Symmetric quotient", *Expansion from the columns*).

Each positive quotient column ``T`` (a tree of root ``r``) is copied over the elements
``h`` of :meth:`.symmetry.Symmetry.pieces`.  A copy ``h(T)`` is ``T`` with every node
renamed by ``h``: its edges are the images of ``T``'s edge paths, its depths ``T``'s, and
``T``'s parents-first edge order stays parents first.  So the work per column (edges,
depths, order) is done once, and per copy only two things remain:

* *which copies are equal* (``h(T) = h'(T)`` when ``h^-1 h'`` fixes ``T``; the LP sees a
  tree as its root and link multiset): an additive multiset hash ``sum_a R[h(a)]`` over
  random 64-bit link values, one product of the pieces' permuted values with ``T``'s link
  counts per column, where hashing sorted copies cost a sort of every copy's links;
* *which edge paths are equal*: a path ``P``'s image depends only on the elements of the
  clusters that move one of its nodes, so images are formed once per distinct
  restriction of the pieces to those clusters (a path inside one segment: one image
  per element of that segment's cluster, not per piece) and hashed once; every copy's
  edge row is then a gather.

A false hash match can only merge two trees of one root, which moves weight between
trees and changes link loads: the schedule is re-rated from its own loads by the caller
and declined below the certified rate, so it cannot pass unnoticed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mccl_opt.errors import SolveError
from mccl_opt.schedule_chunks import FlatPaths, TreeChunks, TreeTable
from mccl_opt.topology import Topology
from .live_master import TreePool
from .sparse_copies import Copies, uniform_copies
from .symmetry import Symmetry
from .tree_table import ColumnEdges, column_edges, distinct_rows

__all__ = ["Expansion", "expand"]

_SEED = 0x5EED
_OWNER_MIX = np.uint64(0xC2B2AE3D27D4EB4F)


@dataclass(frozen=True)
class Expansion:
    """Distinct expanded trees: ``pool`` (root, links) with LP ``weights``, each tree's
    ``edges`` (path indices of ``paths``, parents first) and ``depth``."""

    pool: TreePool
    weights: np.ndarray
    paths: FlatPaths
    edges: np.ndarray
    depth: np.ndarray

    def chunks(self, topo: Topology, pool: TreePool, shares: np.ndarray
               ) -> tuple[TreeChunks, np.ndarray]:
        """The trees of positive share as a tree table, and their depths (the general
        method's ``chunks_of``)."""
        if pool is not self.pool:
            raise SolveError("symmetric expansion: chunks asked for another pool")
        used = np.flatnonzero(shares > 0)
        table = TreeTable([v.id for v in topo.nodes], self.paths,
                          topo.arrays.gpu_nodes[pool.root[used]], shares[used], self.edges[used])
        return TreeChunks(table), self.depth[used]


def _path_images(sym: Symmetry, elements: np.ndarray, node_maps: np.ndarray,
                 nodes: np.ndarray) -> tuple[FlatPaths, np.ndarray]:
    """The distinct images of the base paths ``nodes`` under the pieces, and per
    (base path, piece) the image's index: ``(paths, index)``, ``index`` of shape
    ``(base paths, pieces)``."""
    n = node_maps.shape[1]
    valid = nodes >= 0
    safe = np.where(valid, nodes, 0)
    moved = np.stack([(cl != np.arange(n)).any(axis=0) for cl in sym.nodes])  # (clusters, n)
    mask = (moved[:, safe] & valid).any(axis=2)                               # (clusters, paths)
    code = (mask.astype(np.int64) << np.arange(len(sym.nodes))[:, None]).sum(axis=0)
    codes, code_of = np.unique(code, return_inverse=True)
    restrict = np.empty((codes.size, elements.shape[0]), np.int64)           # per code, piece
    reps: list[np.ndarray] = []                   # per code, a piece of each restriction
    for i, c in enumerate(codes.tolist()):
        on = [b for b in range(len(sym.nodes)) if c >> b & 1]
        if not on:                                # a path no element moves: one image
            restrict[i] = 0
            reps.append(np.zeros(1, np.int64))
            continue
        _, rep, inv = np.unique(elements[:, on], axis=0, return_index=True, return_inverse=True)
        restrict[i] = inv.reshape(-1)
        reps.append(rep)
    count = np.array([reps[c].size for c in code_of.tolist()], np.int64)
    offset = np.zeros(count.size + 1, np.int64)
    np.cumsum(count, out=offset[1:])
    cand_path = np.repeat(np.arange(count.size), count)
    cand_piece = np.concatenate([reps[c] for c in code_of.tolist()])
    image = np.where(valid[cand_path], node_maps[cand_piece[:, None], safe[cand_path]], -1)
    first, path_of = distinct_rows(image, n)      # np.unique(axis=0): 0.63 s on 194 546 x 15
    rows = image[first]
    paths = FlatPaths.of_lengths(rows[rows >= 0], (rows >= 0).sum(axis=1))
    index = path_of.reshape(-1)[offset[:-1, None] + restrict[code_of]]
    return paths, index


def _copy_path_images(node_maps: np.ndarray, cols: ColumnEdges, col: np.ndarray,
                      piece: np.ndarray) -> tuple[FlatPaths, np.ndarray]:
    """Every copy's edge paths, the images of its column's paths under its own element
    (few copies per column: fat-tree 4x2x2x8 one way, 534 copies x 127 edges, where the
    restrictions of the union of their elements gave ~1 M candidate images), told apart:
    ``(paths, edges)``, ``edges`` of shape ``(copies, g - 1)``."""
    base = cols.base[col]                                   # (copies, edges)
    nodes = cols.nodes[base.ravel()]
    valid = nodes >= 0
    image = np.where(valid, node_maps[np.repeat(piece, base.shape[1])[:, None],
                                      np.where(valid, nodes, 0)], -1)
    first, path_of = distinct_rows(image, node_maps.shape[1])
    rows = image[first]
    return FlatPaths.of_lengths(rows[rows >= 0], (rows >= 0).sum(axis=1)), \
        path_of.reshape(base.shape)


def expand(topo: Topology, sym: Symmetry, roots: list[int], trees: list[np.ndarray],
           z: np.ndarray, copies: Copies | None = None) -> Expansion:
    """The columns ``trees`` (roots ``roots``) of positive weight ``z`` copied over the
    group's pieces (module docstring), or as ``copies`` says (columns numbered among
    the positive ones, :mod:`.sparse_copies`; then each copy's paths are mapped by its
    own element, :func:`_copy_path_images`), copies of one tree merged."""
    arr = topo.arrays
    pos = np.flatnonzero(z > 0)
    roots_p = np.asarray(roots, np.int64)[pos]
    trees_p = [np.asarray(trees[j], np.int64) for j in pos.tolist()]
    explicit = copies is not None
    if copies is None:
        copies = uniform_copies(pos.size, sym.pieces())
    elements = copies.elements
    node_maps, link_maps = sym.element_maps(elements)
    lengths_p = np.array([t.size for t in trees_p], np.int64)
    cols = column_edges(topo, roots_p, lengths_p, np.concatenate(trees_p))
    values = np.random.default_rng(_SEED).integers(0, 2**63, topo.num_links, dtype=np.uint64)
    permuted = values[link_maps]                                       # (elements, links)
    code = np.concatenate([permuted[copies.which[copies.column == c]][:, trees_p[c]].sum(axis=1)
                           for c in range(pos.size)])                  # per copy
    owner = arr.rank_of[node_maps[copies.which, arr.gpu_nodes[roots_p[copies.column]]]]
    key = np.stack([owner.astype(np.uint64), code], axis=1)
    _, first, inverse = np.unique(key, axis=0, return_index=True, return_inverse=True)
    weights = np.bincount(inverse.reshape(-1), weights=z[pos][copies.column] * copies.frac)
    order = np.argsort(first)                                          # copies in column order
    first, weights = first[order], weights[order]
    col, piece = copies.column[first], copies.which[first]
    if explicit:
        paths, edges = _copy_path_images(node_maps, cols, col, piece)
    else:
        paths, index = _path_images(sym, elements, node_maps, cols.nodes)
        edges = index[cols.base[col], piece[:, None]]
    lengths = lengths_p[col]
    start = np.zeros(first.size + 1, np.int64)
    np.cumsum(lengths, out=start[1:])
    links = np.concatenate([link_maps[piece[col == c]][:, trees_p[c]].ravel()
                            for c in range(pos.size)])
    owners = owner[first]
    pool = TreePool.of_distinct(owners, start, links,
                                code[first] ^ (owners.astype(np.uint64) * _OWNER_MIX))
    return Expansion(pool, weights, paths, edges, cols.depth[col])
