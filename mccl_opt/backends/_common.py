"""Input checks and small helpers shared by the backend adapters (no solver imports)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from formulations.errors import FormulationError

from .solution import Basis

__all__ = ["METHODS", "check_method", "warm_method", "SparseBlock", "as_block", "as_bounds",
           "as_index_array", "as_coefficients", "check_basis"]

#: LP methods every adapter accepts (see each adapter's docstring for the mapping).
METHODS = ("auto", "primal", "dual", "ipm")


def check_method(method: str) -> str:
    """Validate an LP method name."""
    if method not in METHODS:
        raise FormulationError(f"unknown LP method {method!r}; choose one of {METHODS}")
    return method


def warm_method(method: str, last_change: str | None) -> str:
    """Resolve ``"auto"`` to a simplex variant from what changed since the last solve.

    After adding columns the old basis stays primal feasible, so primal simplex
    re-solves fastest; after adding rows or changing bounds it stays dual feasible,
    so dual simplex does.  Anything else keeps the solver's own choice (``"auto"``).
    """
    if method != "auto":
        return method
    return {"cols": "primal", "rows": "dual", "bounds": "dual"}.get(last_change or "", "auto")


@dataclass(frozen=True)
class SparseBlock:
    """A validated compressed block (CSC columns or CSR rows) with int32 indices."""

    starts: np.ndarray   # length count + 1, int32
    indices: np.ndarray  # int32
    values: np.ndarray   # float64

    @property
    def count(self) -> int:
        return int(self.starts.shape[0] - 1)

    def slice(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Indices and values of vector ``k``."""
        s, e = int(self.starts[k]), int(self.starts[k + 1])
        return self.indices[s:e], self.values[s:e]

    def to_csc(self, num_rows: int) -> sp.csc_matrix:
        return sp.csc_matrix((self.values, self.indices, self.starts),
                             shape=(num_rows, self.count))

    def to_csr(self, num_cols: int) -> sp.csr_matrix:
        return sp.csr_matrix((self.values, self.indices, self.starts),
                             shape=(self.count, num_cols))


def as_block(count: int, starts: np.ndarray, indices: np.ndarray, values: np.ndarray,
             bound: int, what: str) -> SparseBlock:
    """Check ``count`` compressed vectors whose indices must lie in ``[0, bound)``.

    ``what`` names the call ("add_columns"/"add_rows") so errors say what to fix.
    """
    st = np.asarray(starts, dtype=np.int64).reshape(-1)
    ix = np.asarray(indices, dtype=np.int64).reshape(-1)
    va = np.asarray(values, dtype=float).reshape(-1)
    if st.shape[0] != count + 1:
        raise FormulationError(f"{what}: starts has {st.shape[0]} entries, expected "
                               f"{count + 1} (one per vector plus the end offset)")
    if count and (st[0] != 0 or (np.diff(st) < 0).any() or st[-1] != ix.shape[0]):
        raise FormulationError(f"{what}: starts must begin at 0, never decrease and end "
                               f"at len(indices)={ix.shape[0]}")
    if ix.shape[0] != va.shape[0]:
        raise FormulationError(f"{what}: {ix.shape[0]} indices but {va.shape[0]} values")
    if ix.size and (ix.min() < 0 or ix.max() >= bound):
        raise FormulationError(f"{what}: index out of range [0, {bound}): "
                               f"min {ix.min()}, max {ix.max()}")
    if not np.isfinite(va).all():
        raise FormulationError(f"{what}: coefficients must be finite (found NaN or inf)")
    return SparseBlock(st.astype(np.int32), ix.astype(np.int32), va)


def as_bounds(count: int, lo: np.ndarray, hi: np.ndarray, what: str) -> tuple[np.ndarray, np.ndarray]:
    """Check a pair of bound vectors of length ``count`` (``±inf`` allowed, no NaN)."""
    lo_a = np.broadcast_to(np.asarray(lo, dtype=float), (count,)).copy()
    hi_a = np.broadcast_to(np.asarray(hi, dtype=float), (count,)).copy()
    if np.isnan(lo_a).any() or np.isnan(hi_a).any():
        raise FormulationError(f"{what}: bounds contain NaN")
    if (lo_a > hi_a).any():
        k = int(np.flatnonzero(lo_a > hi_a)[0])
        raise FormulationError(f"{what}: entry {k} has lower bound {lo_a[k]} > upper bound {hi_a[k]}")
    return lo_a, hi_a


def as_index_array(cols: np.ndarray, bound: int, what: str) -> np.ndarray:
    """Check column indices (in ``[0, bound)``) and return them as int32."""
    ix = np.asarray(cols, dtype=np.int64).reshape(-1)
    if ix.size and (ix.min() < 0 or ix.max() >= bound):
        raise FormulationError(f"{what}: column index out of range [0, {bound})")
    return ix.astype(np.int32)


def as_coefficients(rows: np.ndarray, cols: np.ndarray, values: np.ndarray, num_rows: int,
                    num_cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Check a ``change_coefficients`` triple: equal lengths, indices in range, finite."""
    r = np.asarray(rows, dtype=np.int64).reshape(-1)
    c = np.asarray(cols, dtype=np.int64).reshape(-1)
    v = np.asarray(values, dtype=float).reshape(-1)
    if not r.shape == c.shape == v.shape:
        raise FormulationError(f"change_coefficients: rows, cols and values must have equal "
                               f"lengths, got {r.size}, {c.size}, {v.size}")
    if r.size and (r.min() < 0 or r.max() >= num_rows or c.min() < 0 or c.max() >= num_cols):
        raise FormulationError(f"change_coefficients: entry outside the {num_rows}x{num_cols} "
                               f"model")
    if not np.isfinite(v).all():
        raise FormulationError("change_coefficients: coefficients must be finite (found NaN or inf)")
    return r, c, v


def check_basis(basis: Basis, backend: str, num_cols: int, num_rows: int) -> None:
    """Raise if ``basis`` was made by another backend or has another model's shape."""
    if basis.backend != backend:
        raise FormulationError(f"set_basis: a {basis.backend!r} basis cannot start a "
                               f"{backend!r} model; re-solve without it")
    if basis.col_status.shape != (num_cols,) or basis.row_status.shape != (num_rows,):
        raise FormulationError(
            f"set_basis: basis is {basis.row_status.size}x{basis.col_status.size} "
            f"(rows x cols) but the model is {num_rows}x{num_cols}")
