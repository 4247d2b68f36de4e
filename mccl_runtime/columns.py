"""Binary telemetry: a batch of samples as five numpy columns (docs/scale.md, "Binary telemetry").

The JSON wire format (:mod:`mccl_runtime.telemetry`) names every node by its id; decoding
it costs microseconds per sample, which at 10,000 GPUs is cores (paper §3.3 sends a sample
per link or GPU pair every flush).  A :class:`ColumnBatch` carries the same samples as
columns of fixed-size numbers, sent as ZeroMQ frames after a signed header
(:func:`mccl_runtime.protocol.encode_frames`), and read without a copy:

========  =======  ==============================================================
column    dtype    meaning per sample
========  =======  ==============================================================
``kind``  ``u1``   0 ``link``, 1 ``pair``, 2 ``gpu``, 3 ``host`` (a host's reduction),
                   4 ``max`` (a front end's largest pair estimate over a link)
``a``     ``<i4``  link: link index; pair/gpu: GPU rank (source); host, max: link index
``b``     ``<i4``  link: 0; pair: destination GPU rank; gpu: 0 out / 1 in; host, max: reporter
``gbps``  ``<f8``  throughput, Gbps
``t``     ``<f8``  sample time, seconds on the controller's clock
========  =======  ==============================================================

Indices follow the topology file (link order; GPU rank = order of the ``gpu`` nodes), so
sender and controller must load the same fabric: the header names its link and GPU counts
and a batch for another fabric is refused.  A ``host`` sample is the largest ``pair``
value a host received over one link in a flush (:mod:`mccl_runtime.host_reduce`); the
controller keeps one channel per (reporter, link), and ``M`` takes the largest over them
as it does over pairs.  A ``max`` row is a front end's (:mod:`mccl_runtime.frontend`): the
largest current estimate of the pair and host channels it folds that cross the link; the
controller keeps it as one channel per (front end, link) whose value the next row replaces
(reporters below 2^30).

A *folded* batch (a telemetry front end's, :mod:`mccl_runtime.frontend`) has a sixth
column ``count`` (``<u4``): row ``i`` stands for ``count[i]`` samples of one channel folded
with the EWMA factor ``alpha`` named in the header, ``gbps`` their equivalent value
(``v <- (1-alpha)^count v + (1 - (1-alpha)^count) gbps`` is the fold of the samples).
A row's ``count`` is bounded by the time its samples can span (:func:`check_fold_counts`),
so one message cannot outweigh a channel's history.

**Early estimates** (issue 26, docs/executor.md "Speculation on real ranks"): a batch may
carry, in its signed header, ``early``: a list of ``[kind, a, b, gbps, t]`` rows keyed as
the columns (``pair`` or ``max`` only), each a drop its sender is still confirming for a
channel that has a row in the same batch (``gbps`` its early estimate, below that row's).
A controller that speculates keeps them apart from ``M``; a batch without the field is the
same message as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import numpy as np

from mccl_opt.errors import TelemetryError
from mccl_opt.topology import Topology

from .protocol import ProtocolError, brief
from .samples import early_problem

__all__ = ["ColumnBatch", "COLUMNS", "COUNT", "KIND_CODES", "MAX_COLUMN_SAMPLES", "MAX_REPORTER",
           "MAX_SAMPLE_RATE", "check_fold_counts"]

#: the columns in frame order, with their wire dtypes
COLUMNS = (("kind", np.dtype("u1")), ("a", np.dtype("<i4")), ("b", np.dtype("<i4")),
           ("gbps", np.dtype("<f8")), ("t", np.dtype("<f8")))
#: the sixth column of a folded batch: samples per row
COUNT = ("count", np.dtype("<u4"))
KIND_CODES = {"link": 0, "pair": 1, "gpu": 2, "host": 3, "max": 4}
#: the kinds an ``early`` row may name
EARLY_KINDS = (KIND_CODES["pair"], KIND_CODES["max"])
#: reporter ids of ``host`` and ``max`` rows are below this
MAX_REPORTER = 1 << 30
#: samples per binary request (a column frame stays under the request size limit)
MAX_COLUMN_SAMPLES = 1 << 16
#: samples per second one channel can produce (one per microsecond: far beyond any probe)
MAX_SAMPLE_RATE = 1e6


def check_fold_counts(c: np.ndarray, t: np.ndarray, count: np.ndarray, last_t: np.ndarray,
                      oldest: float) -> None:
    """Refuse a folded batch a row of which stands for more samples than its channel
    can have produced: at most ``1 + MAX_SAMPLE_RATE x`` the seconds between the row's
    time and its channel's previous sample (the previous row of the channel in the batch,
    else ``last_t``, the controller's last sample of each row's channel), never earlier
    than ``oldest`` (the oldest sample time accepted: a channel's first row spans at most
    the age window).  A sample older than its channel's last one is stale, and an
    equal-time repeat is dropped, so the folded samples have distinct times in that span
    (paper §3.2's EWMA weighs each sample once).  Raises
    :class:`~mccl_opt.errors.TelemetryError` naming the first such row, applying nothing."""
    if not len(c):
        return
    order = np.lexsort((t, c))
    c, t, count, last = c[order], t[order], count[order], last_t[order]
    start = np.maximum(np.nan_to_num(last, nan=-np.inf), oldest)
    after = np.r_[False, c[1:] == c[:-1]]                    # a row after another of its channel
    start[after] = np.maximum(start[after], t[:-1][after[1:]])
    bound = 1.0 + MAX_SAMPLE_RATE * np.maximum(t - start, 0.0)
    bad = np.flatnonzero(count > bound)
    if len(bad):
        i = bad[0]
        raise TelemetryError(f"a folded row stands for {int(count[i])} samples, more than one channel can "
                             f"produce in the {max(t[i] - start[i], 0.0):.6g} s since its previous sample "
                             f"(at most {int(bound[i])}: 1 + {MAX_SAMPLE_RATE:.0e} per second); "
                             f"{len(bad)} such row(s), batch refused")


@dataclass(frozen=True)
class ColumnBatch:
    """One batch of samples as columns (module docstring); ``links``/``gpus``: the
    fabric's link and GPU counts the indices refer to; ``count`` and ``alpha``: a folded
    batch's samples per row and EWMA factor (``None`` for raw samples); ``early``: the
    header's early estimates as a batch of their own (module docstring), or ``None``."""

    kind: np.ndarray
    a: np.ndarray
    b: np.ndarray
    gbps: np.ndarray
    t: np.ndarray
    links: int
    gpus: int
    count: np.ndarray | None = None
    alpha: float | None = None
    early: "ColumnBatch | None" = None

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
        rows, early = [], []
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
                problem = early_problem(kind, s.get("early"))
                if s.get("early") is not None and problem is None:
                    early.append((*row, s["early"], s["t"]))
            except (KeyError, ValueError, TypeError, LookupError) as exc:
                raise ProtocolError("bad_body", f"sample #{i} cannot be sent as columns: {str(exc)[:60]}") from None
            if problem is not None:
                raise ProtocolError("bad_body", f"sample #{i} cannot be sent as columns: {str(problem)[:60]}")
        cols = list(zip(*rows)) if rows else [(), (), (), (), ()]
        batch = cls.build(topo, *cols)
        return batch.with_early(cls.build(topo, *zip(*early))) if early else batch

    def with_early(self, early: "ColumnBatch | None") -> "ColumnBatch":
        """This batch carrying ``early`` (module docstring)."""
        return ColumnBatch(self.kind, self.a, self.b, self.gbps, self.t, links=self.links, gpus=self.gpus,
                           count=self.count, alpha=self.alpha, early=early)

    def rows(self, lo: int, hi: int) -> "ColumnBatch":
        """Rows ``lo:hi`` (views), with the early estimates whose channel's last row is
        among them (a receiver refuses an early row naming no row of its batch)."""
        early = None
        if self.early is not None and len(self.early):
            last = {key: i for i, key in enumerate(zip(self.kind.tolist(), self.a.tolist(), self.b.tolist()))}
            e = self.early
            mine = np.array([lo <= last.get(key, -1) < hi for key in zip(e.kind.tolist(), e.a.tolist(), e.b.tolist())])
            early = ColumnBatch(*(getattr(e, name)[mine] for name, _ in COLUMNS), links=e.links, gpus=e.gpus) \
                if mine.any() else None
        return ColumnBatch(*(getattr(self, name)[lo:hi] for name, _ in COLUMNS), links=self.links, gpus=self.gpus,
                           count=None if self.count is None else self.count[lo:hi], alpha=self.alpha, early=early)

    def to_frames(self) -> tuple[dict[str, Any], tuple[bytes, ...]]:
        """The header body and the column frames (six for a folded batch)."""
        body: dict[str, Any] = {"n": len(self), "links": self.links, "gpus": self.gpus}
        frames = tuple(getattr(self, name).tobytes() for name, _ in COLUMNS)
        if self.count is not None:
            body["alpha"] = self.alpha
            frames += (np.ascontiguousarray(self.count, dtype=COUNT[1]).tobytes(),)
        if self.early is not None and len(self.early):
            e = self.early
            body["early"] = [[int(k), int(a), int(b), float(g), float(t)]
                             for k, a, b, g, t in zip(e.kind, e.a, e.b, e.gbps, e.t)]
        return body, frames

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
        alpha = body.get("alpha")
        folded = alpha is not None
        if folded and (isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 < alpha <= 1.0):
            raise ProtocolError("bad_body", "a folded batch's 'alpha' is its EWMA factor, a number in (0, 1]")
        spec = COLUMNS + (COUNT,) if folded else COLUMNS
        if len(frames) != len(spec):
            raise ProtocolError("bad_body", f"a telemetry_columns message{' with alpha' if folded else ''} has "
                                            f"{len(spec)} column frames ({', '.join(c for c, _ in spec)}), "
                                            f"got {len(frames)}")
        cols = []
        for frame, (name, dt) in zip(frames, spec):
            if len(frame) != n * dt.itemsize:
                raise ProtocolError("bad_body", f"column {name!r} has {len(frame)} bytes; {n} samples of "
                                                f"{dt.itemsize} bytes need {n * dt.itemsize}")
            cols.append(np.frombuffer(frame, dtype=dt))
        count = cols.pop() if folded else None
        if count is not None and n and int(count.min()) < 1:
            raise ProtocolError("bad_body", "a folded row stands for at least one sample ('count' >= 1)")
        batch = cls(*cols, links=topo.num_links, gpus=topo.num_gpus, count=count,
                    alpha=float(alpha) if folded else None)
        return batch.with_early(_early_rows(body.get("early"), batch, topo))


def _early_rows(early: Any, batch: ColumnBatch, topo: Topology) -> ColumnBatch | None:
    """A header's ``early`` field as a batch (module docstring); ``None`` when absent.
    Raises :class:`~mccl_runtime.protocol.ProtocolError` (``bad_body``) for anything but a
    list of at most ``len(batch)`` rows ``[kind, a, b, gbps, t]``: ``kind`` ``pair`` (1) or
    ``max`` (4), ``a``/``b`` integers in ``[0, 2^30)`` naming a row of ``batch``, ``gbps``
    and ``t`` finite, ``gbps >= 0``."""
    if early is None:
        return None
    n = len(batch)
    if not isinstance(early, list) or len(early) > n:
        raise ProtocolError("bad_body", f"'early' is a list of at most the batch's {n} rows")
    for i, row in enumerate(early):
        ints = isinstance(row, list) and len(row) == 5 and all(type(x) is int for x in row[:3])
        nums = ints and all(type(x) in (int, float) and -1e300 < x < 1e300 for x in row[3:])   # finite
        if not (nums and row[0] in EARLY_KINDS and 0 <= row[1] < MAX_REPORTER and 0 <= row[2] < MAX_REPORTER
                and row[3] >= 0):
            raise ProtocolError("bad_body", f"'early' row #{i} is not [kind (1 pair, 4 max), a, b, gbps >= 0, "
                                            f"t]: {brief(row, 80)}")
    if early:
        keys = set(zip(batch.kind.tolist(), batch.a.tolist(), batch.b.tolist()))
        stray = next((i for i, row in enumerate(early) if tuple(row[:3]) not in keys), None)
        if stray is not None:
            raise ProtocolError("bad_body", f"'early' row #{stray} names no row of the batch: {brief(early[stray], 80)} "
                                            "(an early estimate rides beside its channel's row)")
    return ColumnBatch.build(topo, *zip(*early)) if early else None
