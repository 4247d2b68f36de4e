"""Layered CSR link lists: :class:`Rows`, and the CSR helpers of the warm state.

A warm state (:mod:`.state`) lists a million routes at 1024 GPUs (column ``j`` or chunk
``j`` crossing links ``arcs[start[j]:start[j+1]]``).  A local re-optimisation
(:mod:`.local`) keeps most of them and replaces a few thousand; copying the kept ones
into new arrays cost 0.1-0.3 s per warm solve.  :class:`Rows` keeps them instead as a
selection of a shared, never mutated *base* list plus the new rows, and the numba
kernels of :mod:`._segments` sum over that selection in place, in the same entry order
as the copy, so every load and price is the same float.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

__all__ = ["Rows", "csr_take"]

_EMPTY_START = np.zeros(1, dtype=np.int64)
_EMPTY_ARCS = np.zeros(0, dtype=np.int64)


def csr_take(start: np.ndarray, arcs: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``idx`` (in that order) of the CSR list ``start/arcs``."""
    from ._segments import take_rows
    idx = np.ascontiguousarray(idx, dtype=np.int64)
    lengths = start[idx + 1] - start[idx]
    new_start = np.zeros(idx.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=new_start[1:])
    return new_start, take_rows(np.ascontiguousarray(start, np.int64),
                                np.ascontiguousarray(arcs, np.int64), idx, new_start)


@dataclass(frozen=True, eq=False)
class Rows:
    """A CSR list of link rows: row ``i < n_base`` is row ``base_rows[i]`` (row ``i``
    when ``base_rows`` is None) of the shared ``base_start/base_arcs``; row ``n_base + k``
    is row ``k`` of ``extra_start/extra_arcs``.  Never mutated; :meth:`keep_then`
    derives a new list that shares the base."""

    base_start: np.ndarray
    base_arcs: np.ndarray
    base_rows: np.ndarray | None = None
    extra_start: np.ndarray = field(default_factory=lambda: _EMPTY_START)
    extra_arcs: np.ndarray = field(default_factory=lambda: _EMPTY_ARCS)

    @property
    def n_base(self) -> int:
        return int(self.base_start.size - 1 if self.base_rows is None else self.base_rows.size)

    @property
    def count(self) -> int:
        return self.n_base + int(self.extra_start.size - 1)

    def loads(self, weight: np.ndarray, n_links: int) -> np.ndarray:
        """Per-link sum of ``weight[i]`` over the rows ``i`` crossing it."""
        from ._segments import add_loads
        weight = np.ascontiguousarray(weight, dtype=float)
        out = np.zeros(n_links)
        add_loads(self.base_start, self.base_arcs, self.base_rows, weight, 0, out)
        add_loads(self.extra_start, self.extra_arcs, None, weight, self.n_base, out)
        return out

    def sums(self, value: np.ndarray) -> np.ndarray:
        """Per row, the sum of ``value`` (per link) over its links."""
        from ._segments import put_sums
        value = np.ascontiguousarray(value, dtype=float)
        out = np.zeros(self.count)
        put_sums(self.base_start, self.base_arcs, self.base_rows, value, 0, out)
        put_sums(self.extra_start, self.extra_arcs, None, value, self.n_base, out)
        return out

    def take(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows ``idx`` as a plain CSR list ``(start, arcs)``."""
        idx = np.asarray(idx, dtype=np.int64)
        nb = self.n_base
        in_base = idx < nb
        if in_base.all():
            src = idx if self.base_rows is None else self.base_rows[idx]
            return csr_take(self.base_start, self.base_arcs, src)
        if not in_base.any():
            return csr_take(self.extra_start, self.extra_arcs, idx - nb)
        return csr_take(*self.flat, idx)

    def keep_then(self, mask: np.ndarray, start2: np.ndarray, arcs2: np.ndarray) -> "Rows":
        """The rows where ``mask`` holds (in order), then every row of ``start2/arcs2``
        (``start2[0] == 0``), sharing this list's base: only the index of the kept base
        rows and the (few) other rows are new arrays."""
        mask = np.asarray(mask, dtype=bool)
        nb = self.n_base
        kept = np.flatnonzero(mask[:nb])
        rows = kept if self.base_rows is None else self.base_rows[kept]
        es, ea = csr_take(self.extra_start, self.extra_arcs, np.flatnonzero(mask[nb:]))
        start2 = np.asarray(start2, dtype=np.int64)
        extra_start = np.concatenate([es, es[-1] + start2[1:]])
        extra_arcs = np.concatenate([ea, np.asarray(arcs2[:start2[-1]], dtype=np.int64)])
        return Rows(self.base_start, self.base_arcs, rows, extra_start, extra_arcs)

    @cached_property
    def flat(self) -> tuple[np.ndarray, np.ndarray]:
        """The list as plain ``(start, arcs)`` arrays (copied once, on first use)."""
        if self.base_rows is None and self.extra_start.size == 1:
            return self.base_start, self.base_arcs
        bs, ba = csr_take(self.base_start, self.base_arcs,
                          np.arange(self.n_base) if self.base_rows is None else self.base_rows)
        return (np.concatenate([bs, bs[-1] + self.extra_start[1:]]),
                np.concatenate([ba, self.extra_arcs[:self.extra_start[-1]]]))
