"""How many pieces a chunk is cut into, one rule for the simulator and the executor
(docs/runtime.md "Equal-rate forests and pipeline fill", docs/executor.md "Compiler").

A relay forwards a piece once it has the whole piece (paper §4.2 steps, store-and-forward
at GPUs), so a chunk of ``n`` pieces crossing ``d`` GPU hops takes about ``(n + d - 1) / n``
of its fluid time.  Fixed 512 KiB pieces (NCCL's Simple slice) leave a chunk of 2 MiB
only 4 pieces: 1.5x on 3 hops.  The rule: pieces of at most ``max_bytes`` (512 KiB), at
least ``min_pieces`` (8) of them per chunk (fill at most ``(d - 1) / 8``), but none
smaller than ``floor_bytes`` (64 KiB, where the per-message cost starts to count; a
chunk below it is one piece)::

    n(b) = max(ceil(b / max_bytes), min(min_pieces, floor(b / floor_bytes)), 1)

so a piece is ``b / n`` bytes, ``<= max_bytes`` always and ``>= floor_bytes`` whenever
``b >= floor_bytes``.  The executor counts a chunk's bytes as its elements times
``element_bytes`` (real ranks that stand for a larger message count the fabric bytes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .errors import InputError

__all__ = ["PieceRule", "PIECE_RULE", "MAX_PIECE_BYTES", "MIN_PIECES", "PIECE_FLOOR_BYTES"]

#: NCCL's Simple-protocol slice (``NCCL_BUFFSIZE`` 4 MiB / 8 slice steps): the largest piece
MAX_PIECE_BYTES = 512 * 1024
#: pieces per chunk the rule aims for: pipeline fill at most ``(d - 1) / 8`` on ``d`` hops
MIN_PIECES = 8
#: the smallest piece the rule makes (docs/executor.md "Pieces per chunk": per-message cost)
PIECE_FLOOR_BYTES = 64 * 1024
_EPS = 1e-9


@dataclass(frozen=True)
class PieceRule:
    """Pieces per chunk (module docstring); ``element_bytes`` converts the executor's
    element counts to the bytes the rule is stated in."""

    max_bytes: float = MAX_PIECE_BYTES
    min_pieces: int = MIN_PIECES
    floor_bytes: float = PIECE_FLOOR_BYTES
    element_bytes: float = 1.0

    def __post_init__(self) -> None:
        for name in ("max_bytes", "floor_bytes", "element_bytes"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
                raise InputError(f"PieceRule.{name} must be a finite number > 0, got {v!r}")
        if not isinstance(self.min_pieces, int) or isinstance(self.min_pieces, bool) or self.min_pieces < 1:
            raise InputError(f"PieceRule.min_pieces must be an integer >= 1, got {self.min_pieces!r}")
        if self.floor_bytes > self.max_bytes:
            raise InputError(f"PieceRule.floor_bytes ({self.floor_bytes:g}) must not exceed "
                             f"max_bytes ({self.max_bytes:g})")

    def count(self, chunk_bytes: float) -> int:
        """Pieces of a chunk of ``chunk_bytes`` bytes."""
        return int(self.counts(np.array([chunk_bytes], float))[0])

    def counts(self, chunk_bytes: np.ndarray) -> np.ndarray:
        """:meth:`count` of every entry (int64)."""
        b = np.asarray(chunk_bytes, float)
        cap = np.ceil(b / self.max_bytes - _EPS)
        fill = np.minimum(self.min_pieces, np.floor(b / self.floor_bytes + _EPS))
        return np.maximum(np.maximum(cap, fill), 1).astype(np.int64)

    def of_elements(self, numel: np.ndarray) -> np.ndarray:
        """Pieces of chunks of ``numel`` elements (``element_bytes`` each), never more
        pieces than elements (an empty chunk: 1)."""
        n = np.asarray(numel, np.int64)
        return np.maximum(np.minimum(self.counts(n * self.element_bytes), n), 1)


#: the rule the simulator and the executor use by default
PIECE_RULE = PieceRule()
