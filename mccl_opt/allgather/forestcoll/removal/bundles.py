"""The physical paths under Phase 2's logical links, in arrays (paper §4.3, Fig. 18).

Splitting ``α`` units off ``u -> w -> t`` makes ``α`` units of a logical link ``u -> t``
that ride the physical walk ``u -> w -> t``; a logical link's units can ride several
paths (its *bundle*).  :class:`Bundles` stores every bundle of a logical graph in CSR
form: link ``i`` has the segments ``start[i]:start[i+1]``, segment ``s`` carries
``units[s]`` units on the path ``nodes[path_start[s]:path_start[s+1]]`` (node
indices, GPU to GPU, interior nodes switches).  Within a bundle the paths are distinct,
so a segment is a path.  Indexing or iterating gives the list view
``[[path tuple, units], ...]`` per link that the general mapping peels from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np

__all__ = ["Bundles"]


@dataclass(frozen=True, eq=False)
class Bundles:
    """Every logical link's physical paths with their units (module docstring);
    compare list views (``list(b)``), not objects."""

    start: np.ndarray
    units: np.ndarray
    path_start: np.ndarray
    nodes: np.ndarray
    _paths: list = field(default_factory=list, repr=False, compare=False)

    @classmethod
    def from_lists(cls, bundles: Sequence[Sequence]) -> "Bundles":
        """From the list view: one ``[[path, units], ...]`` per link."""
        counts = np.fromiter(map(len, bundles), np.int64, count=len(bundles))
        segs = [seg for b in bundles for seg in b]
        lens = np.fromiter((len(p) for p, _ in segs), np.int64, count=len(segs))
        start = np.zeros(counts.size + 1, np.int64)
        np.cumsum(counts, out=start[1:])
        path_start = np.zeros(lens.size + 1, np.int64)
        np.cumsum(lens, out=path_start[1:])
        nodes = np.fromiter((v for p, _ in segs for v in p), np.int64, count=int(lens.sum()))
        units = np.fromiter((u for _, u in segs), np.int64, count=len(segs))
        return cls(start, units, path_start, nodes)

    def __len__(self) -> int:
        return self.start.size - 1

    def paths(self) -> list[tuple[int, ...]]:
        """Every segment's path as a tuple of node indices (built once, then kept)."""
        if len(self._paths) != self.units.size:
            self._paths[:] = _tuples(self.path_start, self.nodes)
        return self._paths

    def __getitem__(self, i: int) -> list[list]:
        paths, lo, hi = self.paths(), int(self.start[i]), int(self.start[i + 1])
        return [[paths[s], int(u)] for s, u in zip(range(lo, hi), self.units[lo:hi].tolist())]

    def __iter__(self) -> Iterator[list[list]]:
        paths, units, start = self.paths(), self.units.tolist(), self.start.tolist()
        for lo, hi in zip(start[:-1], start[1:]):
            yield [[paths[s], units[s]] for s in range(lo, hi)]


def _tuples(path_start: np.ndarray, nodes: np.ndarray) -> list[tuple[int, ...]]:
    """The paths as tuples, built in bulk per path length."""
    lens = np.diff(path_start)
    out = np.empty(lens.size, object)
    for length in np.unique(lens).tolist():
        sel = np.flatnonzero(lens == length)
        columns = nodes[path_start[sel][None, :] + np.arange(length)[:, None]].tolist()
        out[sel] = np.fromiter(zip(*columns), object, count=sel.size)
    return out.tolist()
