"""Binary telemetry: a batch of samples as five numpy columns (docs/scale.md, "Binary telemetry").

The JSON wire format (:mod:`mccl_runtime.telemetry`) names every node by its id; decoding
it costs microseconds per sample, which at 10,000 GPUs is cores (paper §3.3 sends a sample
per link or GPU pair every flush).  A :class:`ColumnBatch` carries the same samples as
columns of fixed-size numbers, sent as ZeroMQ frames after a signed header
(:func:`mccl_runtime.protocol.encode_frames`), and read without a copy:

========  =======  ==============================================================
column    dtype    meaning per sample
========  =======  ==============================================================
``kind``  ``u1``   0 ``link``, 1 ``pair``, 2 ``gpu``, 3 ``host`` (a host's reduction)
``a``     ``<i4``  link: link index; pair/gpu: GPU rank (source); host: link index
``b``     ``<i4``  link: 0; pair: destination GPU rank; gpu: 0 out / 1 in; host: reporter
``gbps``  ``<f8``  throughput, Gbps
``t``     ``<f8``  sample time, seconds on the controller's clock
========  =======  ==============================================================

Indices follow the topology file (link order; GPU rank = order of the ``gpu`` nodes), so
sender and controller must load the same fabric: the header names its link and GPU counts
and a batch for another fabric is refused.  A ``host`` sample is the largest ``pair``
value a host received over one link in a flush (:mod:`mccl_runtime.host_reduce`); the
controller keeps one channel per (reporter, link), and ``M`` takes the largest over them
as it does over pairs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import numpy as np

from mccl_opt.topology import Topology

from .protocol import ProtocolError

__all__ = ["ColumnBatch", "COLUMNS", "KIND_CODES", "MAX_COLUMN_SAMPLES"]

#: the columns in frame order, with their wire dtypes
COLUMNS = (("kind", np.dtype("u1")), ("a", np.dtype("<i4")), ("b", np.dtype("<i4")),
           ("gbps", np.dtype("<f8")), ("t", np.dtype("<f8")))
KIND_CODES = {"link": 0, "pair": 1, "gpu": 2, "host": 3}
#: samples per binary request (a column frame stays under the request size limit)
MAX_COLUMN_SAMPLES = 1 << 16


@dataclass(frozen=True)
class ColumnBatch:
    """One batch of samples as columns (module docstring); ``links``/``gpus``: the
    fabric's link and GPU counts the indices refer to."""

    kind: np.ndarray
    a: np.ndarray
    b: np.ndarray
    gbps: np.ndarray
    t: np.ndarray
    links: int
    gpus: int

    def __len__(self) -> int:
        return len(self.kind)

    @classmethod
    def build(cls, topo: Topology, kind: Any, a: Any, b: Any, gbps: Any, t: Any) -> "ColumnBatch":
        """A batch from array-likes, cast to the wire dtypes."""
        cols = [np.ascontiguousarray(x, dtype=dt) for x, (_, dt) in zip((kind, a, b, gbps, t), COLUMNS)]
        n = len(cols[0])
        if any(c.ndim != 1 or len(c) != n for c in cols):
            raise ProtocolError("bad_body", "the five telemetry columns must be 1-d and of equal length")
        return cls(*cols, links=topo.num_links, gpus=topo.num_gpus)

    @classmethod
    def from_samples(cls, topo: Topology, samples: Iterable[Mapping[str, Any]]) -> "ColumnBatch":
        """The columns of JSON wire samples (``link``, ``pair``, ``gpu``) on ``topo``;
        raises :class:`~mccl_runtime.protocol.ProtocolError` (``bad_body``) naming a
        sample it cannot encode (an unknown node, a GPU that is not one)."""
        rank = {g: i for i, g in enumerate(topo.gpus)}
        rows = []
        for i, s in enumerate(samples):
            try:
                kind = s["kind"]
                if kind == "link":
                    row = (0, topo.link_index(s["src"], s["dst"]), 0)
                elif kind == "pair":
                    row = (1, rank[s["src"]], rank[s["dst"]])
                elif kind == "gpu":
                    row = (2, rank[s["gpu"]], ("out", "in").index(s.get("dir", "out")))
                else:
                    raise KeyError(kind)
                rows.append((*row, s["gbps"], s["t"]))
            except (KeyError, ValueError, TypeError, LookupError) as exc:
                raise ProtocolError("bad_body", f"sample #{i} cannot be sent as columns: {str(exc)[:60]}") from None
        cols = list(zip(*rows)) if rows else [(), (), (), (), ()]
        return cls.build(topo, *cols)

    def to_frames(self) -> tuple[dict[str, Any], tuple[bytes, ...]]:
        """The header body and the column frames."""
        return ({"n": len(self), "links": self.links, "gpus": self.gpus},
                tuple(getattr(self, name).tobytes() for name, _ in COLUMNS))

    @classmethod
    def from_frames(cls, body: Mapping[str, Any], frames: tuple[bytes, ...], topo: Topology) -> "ColumnBatch":
        """Read a batch without copying; raises :class:`~mccl_runtime.protocol.ProtocolError`
        (``bad_body``, ``too_large``, ``wrong_fabric``) for anything that is not one."""
        n = body.get("n")
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ProtocolError("bad_body", "a telemetry_columns header needs 'n': the number of samples")
        if n > MAX_COLUMN_SAMPLES:
            raise ProtocolError("too_large", f"{n} samples in one request; at most {MAX_COLUMN_SAMPLES} "
                                             "(split the batch)")
        if body.get("links") != topo.num_links or body.get("gpus") != topo.num_gpus:
            raise ProtocolError("wrong_fabric", f"the batch indexes a fabric of {str(body.get('links'))[:20]} links "
                                                f"and {str(body.get('gpus'))[:20]} GPUs; this controller serves "
                                                f"{topo.num_links} links and {topo.num_gpus} GPUs")
        if len(frames) != len(COLUMNS):
            raise ProtocolError("bad_body", f"a telemetry_columns message has {len(COLUMNS)} column frames "
                                            f"({', '.join(c for c, _ in COLUMNS)}), got {len(frames)}")
        cols = []
        for frame, (name, dt) in zip(frames, COLUMNS):
            if len(frame) != n * dt.itemsize:
                raise ProtocolError("bad_body", f"column {name!r} has {len(frame)} bytes; {n} samples of "
                                                f"{dt.itemsize} bytes need {n * dt.itemsize}")
            cols.append(np.frombuffer(frame, dtype=dt))
        return cls(*cols, links=topo.num_links, gpus=topo.num_gpus)
