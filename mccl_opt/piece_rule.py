"""How many pieces a chunk is cut into, one rule for the simulator and the executor
(docs/runtime.md "Equal-rate forests and pipeline fill", docs/executor.md "Pieces per chunk").

A relay forwards a piece once it has the whole piece (paper §4.2 steps, store-and-forward
at GPUs), so a chunk of ``n`` pieces crossing ``d`` GPU hops (its deepest path or tree
branch) takes about ``(n + d - 1) / n`` of its fluid time.  Fixed 512 KiB pieces (NCCL's
Simple slice) leave a 1.86 MB chunk 4 pieces: 1.5x on 3 hops.  The rule: pieces of at most
``max_bytes`` (512 KiB), and at least ``per_hop`` (16) per relay hop, ``per_hop * (d - 1)``,
so the fill stays under ``1 / per_hop``, but none smaller than ``floor_bytes`` (64 KiB,
where the per-message cost starts to count)::

    n(b, d) = max(1, ceil(b / max_bytes), min(per_hop * (d - 1), floor(b / floor_bytes)))

A one-hop chunk has no fill and keeps 512 KiB pieces (the model before the rule); a piece
is ``<= max_bytes`` always and ``>= floor_bytes`` unless the 512 KiB cap asks for more.
The executor counts a chunk's bytes as its elements times ``element_bytes`` (real ranks
that stand for a larger message count the fabric bytes, with their own floor and no cap:
docs/executor.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .errors import InputError

__all__ = ["PieceRule", "PIECE_RULE", "MAX_PIECE_BYTES", "PIECES_PER_HOP", "PIECE_FLOOR_BYTES"]

#: NCCL's Simple-protocol slice (``NCCL_BUFFSIZE`` 4 MiB / 8 slice steps): the largest piece
MAX_PIECE_BYTES = 512 * 1024
#: pieces per relay hop: pipeline fill at most 1/16 of a chunk's fluid time
PIECES_PER_HOP = 16
#: the smallest piece the rule makes for the fill (docs/executor.md "Pieces per chunk")
PIECE_FLOOR_BYTES = 64 * 1024
_EPS = 1e-9


@dataclass(frozen=True)
class PieceRule:
    """Pieces per chunk (module docstring); ``element_bytes`` converts the executor's
    element counts to the bytes the rule is stated in; ``max_bytes`` may be ``inf``."""

    max_bytes: float = MAX_PIECE_BYTES
    per_hop: int = PIECES_PER_HOP
    floor_bytes: float = PIECE_FLOOR_BYTES
    element_bytes: float = 1.0

    def __post_init__(self) -> None:
        for name in ("max_bytes", "floor_bytes", "element_bytes"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or math.isnan(v) or v <= 0 \
                    or (math.isinf(v) and name != "max_bytes"):
                raise InputError(f"PieceRule.{name} must be a number > 0, got {v!r}")
        if not isinstance(self.per_hop, int) or isinstance(self.per_hop, bool) or self.per_hop < 0:
            raise InputError(f"PieceRule.per_hop must be an integer >= 0, got {self.per_hop!r}")

    def count(self, chunk_bytes: float, hops: int) -> int:
        """Pieces of a chunk of ``chunk_bytes`` bytes whose deepest GPU path has ``hops`` hops."""
        return int(self.counts(np.array([chunk_bytes], float), np.array([hops]))[0])

    def counts(self, chunk_bytes: np.ndarray, hops: np.ndarray) -> np.ndarray:
        """:meth:`count` of every entry (int64)."""
        b = np.asarray(chunk_bytes, float)
        cap = np.ceil(b / self.max_bytes - _EPS)
        fill = np.minimum(self.per_hop * np.maximum(np.asarray(hops) - 1, 0), np.floor(b / self.floor_bytes + _EPS))
        return np.maximum(np.maximum(cap, fill), 1).astype(np.int64)

    def of_elements(self, numel: np.ndarray, hops: np.ndarray) -> np.ndarray:
        """Pieces of chunks of ``numel`` elements (``element_bytes`` each), never more
        pieces than elements (an empty chunk: 1)."""
        n = np.asarray(numel, np.int64)
        return np.maximum(np.minimum(self.counts(n * self.element_bytes, hops), n), 1)


#: the rule the simulator and the executor use by default
PIECE_RULE = PieceRule()
