"""Feed executor telemetry to the controller in the topology's units (paper §3.1 ③).

The controller compares measured throughput with the nominal capacity of each overlay
link.  Executor timings include software overheads (and on gloo CPU ranks are far from
any GPU fabric), so :class:`CalibratedReporter` does what the paper's startup probing
does: the first ``warmup`` flushes of each GPU pair set its healthy baseline, and later
samples are reported as ``nominal * measured / baseline`` (capped at nominal), as the
controller's ``pair`` samples.  Pairs without an overlay link in the topology (no
switch-only path) are not reported.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from typing import Any, Callable, Mapping

from mccl_opt.topology import Topology

from .telemetry import LinkSample

__all__ = ["CalibratedReporter", "pair_nominal"]


def pair_nominal(topo: Topology) -> dict[tuple[str, str], float]:
    """Nominal Gbps of every GPU pair's overlay link (the controller's own mapping)."""
    from mccl_runtime.telemetry import LinkMap, RejectedSample, Sample

    links = LinkMap(topo)
    out = {}
    for s in topo.gpus:
        for d in topo.gpus:
            if s != d:
                try:
                    out[(s, d)] = links.resolve(Sample("pair", s, d, 0.0, 0.0))[1]
                except RejectedSample:
                    continue
    return out


class CalibratedReporter:
    """``on_flush`` callback of :class:`~executor_cuda.telemetry.Telemetry` that pushes
    calibrated ``pair`` samples with ``push(samples)`` (e.g.
    ``ControllerClient.push_telemetry``)."""

    def __init__(self, push: Callable[[list[dict[str, Any]]], Any],
                 nominal: Mapping[tuple[str, str], float], warmup: int = 5,
                 clock: Callable[[], float] = time.time) -> None:
        self.push = push
        self.nominal = dict(nominal)
        self.warmup = warmup
        self.clock = clock
        self.baseline: dict[tuple[str, str], list[float]] = defaultdict(list)
        self.sent = 0

    def __call__(self, samples: list[LinkSample]) -> None:
        out = []
        for s in samples:
            key = (s.src, s.dst)
            nominal = self.nominal.get(key)
            if nominal is None or s.gbps <= 0:
                continue
            hist = self.baseline[key]
            if len(hist) < self.warmup:
                hist.append(s.gbps)
                continue
            ratio = s.gbps / statistics.median(hist)
            out.append({"kind": "pair", "src": s.src, "dst": s.dst,
                        "gbps": nominal * min(1.0, ratio), "t": self.clock()})
        if out:
            self.push(out)
            self.sent += len(out)
