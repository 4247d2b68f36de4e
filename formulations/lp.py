"""A solver-neutral sparse linear program: ``max/min c·x  s.t.  lo <= A x <= hi, l <= x <= u``.

This container is what every builder in :mod:`formulations` returns and what every
backend adapter in :mod:`mccl_opt.backends` loads in bulk.  It depends on numpy and
scipy only.  Infinite bounds are ``±numpy.inf``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from .errors import FormulationError

__all__ = ["LinearProgram"]


@dataclass
class LinearProgram:
    """Sparse LP/MIP in row-bounded form.

    Attributes:
        c: objective coefficients, shape (n,).
        A: constraint matrix, shape (m, n); stored as CSR.
        row_lo, row_hi: row bounds, shape (m,); ``-inf``/``inf`` for one-sided rows,
            equal values for an equality row.
        col_lo, col_hi: variable bounds, shape (n,).
        integrality: boolean mask of integer variables, shape (n,).
        sense: ``"max"`` or ``"min"``.
        col_names, row_names: optional names (used by MPS/LP export).
        name: model name.
        objective_offset: constant added to the objective.
    """

    c: np.ndarray
    A: sp.csr_matrix
    row_lo: np.ndarray
    row_hi: np.ndarray
    col_lo: np.ndarray
    col_hi: np.ndarray
    integrality: np.ndarray | None = None
    sense: str = "max"
    col_names: list[str] | None = None
    row_names: list[str] | None = None
    name: str = "mccl"
    objective_offset: float = 0.0
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.c = np.asarray(self.c, dtype=float)
        self.A = sp.csr_matrix(self.A, dtype=float)
        n = self.c.shape[0]
        m = self.A.shape[0]
        self.row_lo = np.asarray(self.row_lo, dtype=float).reshape(-1)
        self.row_hi = np.asarray(self.row_hi, dtype=float).reshape(-1)
        self.col_lo = np.asarray(self.col_lo, dtype=float).reshape(-1)
        self.col_hi = np.asarray(self.col_hi, dtype=float).reshape(-1)
        if self.integrality is None:
            self.integrality = np.zeros(n, dtype=bool)
        self.integrality = np.asarray(self.integrality, dtype=bool).reshape(-1)
        if self.sense not in ("max", "min"):
            raise FormulationError(f"sense must be 'max' or 'min', got {self.sense!r}")
        if self.A.shape[1] != n:
            raise FormulationError(f"A has {self.A.shape[1]} columns but c has {n} entries")
        for label, arr, size in (
            ("row_lo", self.row_lo, m), ("row_hi", self.row_hi, m),
            ("col_lo", self.col_lo, n), ("col_hi", self.col_hi, n),
            ("integrality", self.integrality, n),
        ):
            if arr.shape[0] != size:
                raise FormulationError(f"{label} has {arr.shape[0]} entries, expected {size}")
        for label, arr in (("c", self.c), ("A", self.A.data), ("row_lo", self.row_lo),
                           ("row_hi", self.row_hi), ("col_lo", self.col_lo), ("col_hi", self.col_hi)):
            if np.isnan(arr).any():
                raise FormulationError(f"{label} contains NaN")
        if (self.row_lo > self.row_hi).any():
            i = int(np.flatnonzero(self.row_lo > self.row_hi)[0])
            raise FormulationError(f"row {i}: lower bound {self.row_lo[i]} > upper bound {self.row_hi[i]}")
        if (self.col_lo > self.col_hi).any():
            j = int(np.flatnonzero(self.col_lo > self.col_hi)[0])
            raise FormulationError(f"column {j}: lower bound {self.col_lo[j]} > upper bound {self.col_hi[j]}")
        if self.col_names is not None and len(self.col_names) != n:
            raise FormulationError("col_names must have one name per column")
        if self.row_names is not None and len(self.row_names) != m:
            raise FormulationError("row_names must have one name per row")

    @property
    def num_cols(self) -> int:
        return int(self.c.shape[0])

    @property
    def num_rows(self) -> int:
        return int(self.A.shape[0])

    @property
    def is_mip(self) -> bool:
        return bool(self.integrality.any())
