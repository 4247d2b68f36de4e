"""Telemetry samples: the wire format, its checks and the topology links a sample
measures (paper §3.3, §5; the store that turns them into ``M`` is
:mod:`mccl_runtime.telemetry`, whose docstring gives the format and the link mapping).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from itertools import repeat
from operator import contains, methodcaller
from typing import Any, Mapping

import numpy as np

from mccl_opt.errors import TelemetryError, TopologyError
from mccl_opt.paths import switch_path
from mccl_opt.topology import Topology

__all__ = ["Sample", "RejectedSample", "IngestReport", "LinkMap", "REASONS", "KINDS",
           "parse_sample", "early_problem", "Early", "EarlyColumn", "early_column"]

#: Why a sample can be rejected (keys of the rejection counters).
REASONS = ("malformed", "nan", "negative", "unknown_link", "future", "too_old", "stale", "above_nominal",
           "too_many_channels")
KINDS = ("pair", "gpu", "link")

class RejectedSample(TelemetryError):
    """A sample the controller will not use; ``reason`` is one of :data:`REASONS`."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Sample:
    """One parsed sample.  For ``gpu`` samples ``src`` is the GPU and ``dst`` the
    direction (``"out"`` or ``"in"``); ``early``: a ``pair`` sample's drop its sender is
    still confirming (Gbps, docs/executor.md "Speculation on real ranks"), or ``None``."""

    kind: str
    src: str
    dst: str
    gbps: float
    t: float
    early: float | None = None


@dataclass(frozen=True)
class IngestReport:
    """Outcome of one batch: accepted count and rejected counts per reason."""

    accepted: int
    rejected: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"accepted": self.accepted, "rejected": dict(self.rejected)}


def early_problem(kind: Any, early: Any) -> RejectedSample | None:
    """Why a sample of ``kind`` cannot carry ``early`` (``None``: absent or fine): only a
    ``pair`` sample carries one, a plain number (``malformed``), finite (``nan``) and
    at least zero (``negative``), the rules of ``gbps``."""
    if early is None:
        return None
    if kind != "pair":
        return RejectedSample("malformed", f"only a pair sample carries 'early', got one on a {kind!r} sample")
    if type(early) is not float and (isinstance(early, bool) or not isinstance(early, (int, float))):
        return RejectedSample("malformed", f"sample 'early' must be a number (Gbps), got {type(early).__name__}")
    try:
        value = float(early)
    except OverflowError:           # an integer beyond float range
        return RejectedSample("nan", "sample 'early' is beyond float range")
    if not math.isfinite(value):
        return RejectedSample("nan", f"sample 'early' is not finite ({value})")
    if value < 0:
        return RejectedSample("negative", f"sample 'early' is a negative throughput ({value})")
    return None


class Early(enum.Enum):
    """What a batch's ``early`` column holds (:class:`EarlyColumn`)."""

    ABSENT = "absent"           # no sample carries one (the common case)
    VALUES = "values"           # some do, every one well formed
    MALFORMED = "malformed"     # one is malformed: the batch is rejected sample by sample


@dataclass(frozen=True)
class EarlyColumn:
    """A JSON batch's ``early`` values, read once for the vectorised ingest
    (:func:`early_column`): ``values`` per sample, NaN where a sample has none (state
    ``VALUES`` only).  A ``MALFORMED`` one sends the batch down the sample-by-sample
    path, which rejects that sample whole under :func:`early_problem`'s reason
    (``malformed``, ``nan`` or ``negative``) and words it."""

    state: Early
    values: np.ndarray | None = None


_ABSENT = EarlyColumn(Early.ABSENT)
_GET_EARLY = methodcaller("get", "early")


def early_column(batch: list[Any]) -> EarlyColumn:
    """The ``early`` column of a batch of wire samples (mappings with a ``kind``; other
    objects raise ``TypeError``, ``KeyError``... as reading any other column does)."""
    if not any(map(contains, batch, repeat("early"))):      # the common case, at C speed
        return _ABSENT
    raw = list(map(_GET_EARLY, batch))
    values = np.full(len(raw), math.nan)
    for i in (i for i, e in enumerate(raw) if e is not None):
        if early_problem(batch[i]["kind"], raw[i]) is not None:
            return EarlyColumn(Early.MALFORMED)
        values[i] = raw[i]
    return EarlyColumn(Early.VALUES, values)


def parse_sample(data: Any) -> Sample:
    """Parse the wire form of a sample; raises :class:`RejectedSample` (``malformed``,
    ``nan`` or ``negative``), also for a bad ``early`` (:func:`early_problem`)."""
    if isinstance(data, Sample):
        s = data
    else:
        if not isinstance(data, (dict, Mapping)):
            raise RejectedSample("malformed", f"a sample must be an object, got {type(data).__name__}")
        kind = data.get("kind")
        if kind not in KINDS:
            raise RejectedSample("malformed", f"sample 'kind' must be one of {KINDS}, got {kind!r}")
        if kind == "gpu":
            src, dst = data.get("gpu"), data.get("dir", "out")
            if dst not in ("out", "in"):
                raise RejectedSample("malformed", f"gpu sample 'dir' must be 'out' or 'in', got {dst!r}")
        else:
            src, dst = data.get("src"), data.get("dst")
        if not isinstance(src, str) or not isinstance(dst, str):
            raise RejectedSample("malformed", f"{kind} sample needs string node ids, got {src!r}, {dst!r}")
        gbps, t = data.get("gbps"), data.get("t")
        for label, v in (("gbps", gbps), ("t", t)):
            if type(v) is not float and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise RejectedSample("malformed", f"sample '{label}' must be a number, got {v!r}")
        early = data.get("early")
        problem = early_problem(kind, early)
        if problem is not None:
            raise problem
        try:
            s = Sample(kind, src, dst, float(gbps), float(t), None if early is None else float(early))
        except OverflowError:           # an integer beyond float range
            raise RejectedSample("nan", f"sample {src}->{dst} has a value beyond float range") from None
    if not (math.isfinite(s.gbps) and math.isfinite(s.t)):
        raise RejectedSample("nan", f"sample {s.src}->{s.dst} has a non-finite value ({s.gbps}, t={s.t})")
    if s.gbps < 0:
        raise RejectedSample("negative", f"sample {s.src}->{s.dst} has negative throughput {s.gbps}")
    return s


class LinkMap:
    """Resolves samples to topology links (the mapping in the module docstring)."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self._resolved: dict[tuple[str, str, str], tuple[tuple[int, ...], float]] = {}

    def resolve(self, s: Sample) -> tuple[tuple[int, ...], float]:
        """``(links, nominal)`` of a sample's channel, cached; raises :class:`RejectedSample`."""
        key = (s.kind, s.src, s.dst)
        hit = self._resolved.get(key)
        if hit is None:
            links = self.links_of(s)
            hit = self._resolved[key] = (links, float(min(self.topo.arrays.capacity[a] for a in links)))
        return hit

    def links_of(self, s: Sample) -> tuple[int, ...]:
        """Link indices a sample measures; raises :class:`RejectedSample` (``unknown_link``)."""
        topo = self.topo
        if s.kind == "link":
            if not topo.has_link(s.src, s.dst):
                raise RejectedSample("unknown_link", f"no link {s.src!r} -> {s.dst!r} in {topo.name!r}")
            return (topo.link_index(s.src, s.dst),)
        if not topo.has_node(s.src) or not topo.is_gpu(s.src):
            raise RejectedSample("unknown_link", f"{s.src!r} is not a GPU of {topo.name!r}")
        if s.kind == "gpu":
            sw = self._intra_switch(s.src)
            return (topo.link_index(s.src, sw) if s.dst == "out" else topo.link_index(sw, s.src),)
        if not topo.has_node(s.dst) or not topo.is_gpu(s.dst) or s.src == s.dst:
            raise RejectedSample("unknown_link", f"pair sample {s.src!r} -> {s.dst!r} needs two distinct GPUs")
        return self._switch_path(s.src, s.dst)

    def _intra_switch(self, gpu: str) -> str:
        cands = sorted((l.latency_us, l.dst) for l in self.topo.links
                       if l.src == gpu and not self.topo.is_gpu(l.dst))
        if not cands:
            raise RejectedSample("unknown_link", f"GPU {gpu!r} has no intra-node switch for a gpu sample")
        return cands[0][1]

    def _switch_path(self, src: str, dst: str) -> tuple[int, ...]:
        """The pair's overlay link: :func:`mccl_opt.paths.switch_path` as arc indices."""
        topo = self.topo
        try:
            return switch_path(topo, topo.node_index(src), topo.node_index(dst))
        except TopologyError as exc:
            raise RejectedSample("unknown_link", str(exc)) from None
