"""Feed executor telemetry to the controller in the topology's units (paper §3.1 ③).

The controller compares measured throughput with the nominal capacity of each overlay
link.  Executor timings include software overheads (and on gloo CPU ranks are far from
any GPU fabric), so :class:`CalibratedReporter` does what the paper's startup probing
(§3.1) does: the first ``warmup`` messages of each GPU pair set its healthy baseline, and
later samples are reported as ``nominal * measured / baseline`` (capped at nominal), as
the controller's ``pair`` samples.  Pairs without an overlay link in the topology (no
switch-only path) are not reported.

The warm-up counts *messages* (``LinkSample.count``), not flushes: a flush holds whatever
the collectives of one flush interval sent, so fast warm-up collectives all land in one
flush, and a warm-up of ``warmup`` flushes then took its remaining baselines from the
first flushes after a failure: the degraded link became the "healthy" baseline and was
reported at nominal for good.  :meth:`CalibratedReporter.calibrated` tells when a pair's
warm-up is over.
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from collections import defaultdict
from typing import Any, Callable, Iterable, Mapping, Sequence

from mccl_opt.errors import TelemetryError
from mccl_opt.topology import Topology

from .faults import hold_until
from .pair_levels import PROBE_OVER_COST
from .telemetry import LinkSample

__all__ = ["CalibratedReporter", "PairProber", "pair_nominal"]


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
    ``ControllerClient.push_telemetry``).

    Each pair's baseline is the median throughput of its first ``warmup`` messages
    (each flush's throughput weighted by its message count; the flush that completes
    the warm-up counts whole); its later flushes are reported.
    """

    def __init__(self, push: Callable[[list[dict[str, Any]]], Any],
                 nominal: Mapping[tuple[str, str], float], warmup: int = 5,
                 clock: Callable[[], float] = time.time) -> None:
        if warmup < 1:
            raise TelemetryError(f"warmup must be >= 1 message per pair (the healthy baseline), got {warmup}")
        self.push = push
        self.nominal = dict(nominal)
        self.warmup = warmup
        self.clock = clock
        #: per pair, (Gbps, messages) of each warm-up flush
        self.baseline: dict[tuple[str, str], list[tuple[float, int]]] = defaultdict(list)
        self._ref: dict[tuple[str, str], float] = {}      # the finished baselines, Gbps
        self.sent = 0

    def calibrated(self, pairs: Iterable[tuple[str, str]]) -> bool:
        """Whether every pair of ``pairs`` (``(src, dst)`` GPU ids) has its baseline."""
        return all(p in self._ref for p in pairs)

    def __call__(self, samples: list[LinkSample]) -> None:
        out = []
        for s in samples:
            key = (s.src, s.dst)
            nominal = self.nominal.get(key)
            if nominal is None or s.gbps <= 0:
                continue
            ref = self._ref.get(key)
            if ref is None:
                hist = self.baseline[key]
                hist.append((s.gbps, max(1, s.count)))
                if sum(n for _, n in hist) >= self.warmup:
                    self._ref[key] = _weighted_median(hist)
                continue
            out.append({"kind": "pair", "src": s.src, "dst": s.dst,
                        "gbps": nominal * min(1.0, s.gbps / ref), "t": self.clock()})
        if out:
            self.push(out)
            self.sent += len(out)


def _weighted_median(values: Sequence[tuple[float, int]]) -> float:
    """The median of ``values`` (non-empty) given as ``(value, weight)`` (the lower one on
    a tie)."""
    ordered = sorted(values)
    half = sum(w for _, w in ordered) / 2.0
    seen = 0
    for v, w in ordered:
        seen += w
        if seen >= half:
            break
    return v


class PairProber:
    """Probes of GPU pairs the active schedule no longer loads (docs/executor.md "Probes").

    Passive telemetry measures only the pairs a schedule sends on, so once the controller
    swapped to a schedule that avoids a degraded link, it would never see that link
    recover.  Like the simulated loop's probes (docs/runtime.md "Links the schedule stops
    using: probes"), every ``every`` collectives the ranks send one ``numel``-element
    float32 message alone on each *suspect* pair: a pair some rank last reported below
    ``LOW`` of nominal and that the active program has no message on, or loads too
    lightly to tell its level from nominal (:attr:`ModelReporter.blind`).  Each rank's
    :meth:`wanted` row is all-reduced (max) with the lock-step flags, so all ranks probe
    the same pairs at the same collective boundary, all pairs at once (each alone on its
    path).  The sender writes its start time into the message (ranks share one host's
    monotonic clock) and sends at once; the receiver holds it until that time plus the
    probe's emulated time on the current fabric (:meth:`FabricEmulator.pair_delay_s`,
    :func:`~executor_cuda.faults.hold_until`) and reports the pair through
    :meth:`ModelReporter.probe`.  A probe that does not arrive in time is an error,
    never a hang.

    A probe is one short message with a fixed cost on gloo (posting, a rendezvous, waking
    the receiving thread): :meth:`warm_up` measures it per pair.  A probe that would take
    less than :data:`PROBE_OVER_COST` times that cost at the pair's current level measures
    the cost, not the link; :meth:`ModelReporter.probe` does not use one, and the prober
    sends none: such a pair's probe emulates a longer message (:meth:`length`).
    """

    def __init__(self, emu: Any, rank: int, world: int, numel: int, every: int) -> None:
        import torch

        self.emu, self.rank, self.world, self.every = emu, rank, world, every
        self.buf = torch.zeros(max(1, numel // 2), dtype=torch.float64)   # numel float32's bytes
        self.nbytes = 8 * self.buf.numel()
        self.nominal_cap = emu.topo.arrays.capacity.astype(float)
        #: per received pair ``(src GPU, dst GPU)``, a probe's real seconds on gloo (:meth:`warm_up`)
        self.cost: dict[tuple[str, str], float] = {}
        #: pairs whose last probe was bound by its cost (:meth:`bound`)
        self.faster: set[tuple[str, str]] = set()
        self._pool: ThreadPoolExecutor | None = None     # waits each receive (gloo p2p
                                                          # completes only inside wait())

    def due(self, i: int) -> bool:
        """Whether collective ``i`` (the same count on every rank) is followed by probes."""
        return self.every > 0 and i % self.every == 0

    def nominal_s(self, src: int, dst: int) -> float:
        """A probe's emulated seconds from rank ``src`` to rank ``dst`` on the nominal fabric."""
        return self.emu.pair_delay_s(src, dst, self.nbytes, self.nominal_cap)

    def length(self, reporter: Any, src: int, dst: int) -> float:
        """How many ``numel``-element probes the probe of ``src -> dst`` (ranks) emulates: 1,
        or more so that at the pair's current level (the reported one; nominal for a pair
        whose last probe was bound by its cost, :meth:`bound`) it takes
        :data:`PROBE_OVER_COST` times its cost.  The receiver holds a probe for its emulated
        time, so a longer probe moves no more real bytes."""
        key = (self.emu.gpus[src], self.emu.gpus[dst])
        level = 1.0 if key in self.faster else (reporter.shown.get(key, reporter.level(key)) or 1.0)
        return max(1.0, PROBE_OVER_COST * self.cost.get(key, 0.0) * level / self.nominal_s(src, dst) * (1 + 1e-9))

    def bound(self, key: tuple[str, str], seconds: float, delay: float) -> bool:
        """Whether a probe of ``key`` that took ``seconds`` real (``delay`` emulated) was
        bound by its cost, and is not reported: the first such probe of a pair only shows
        that the link is faster than its level (a recovery), and the next is sized for a
        healthy link (:meth:`length`), so one reading reports the whole recovery."""
        if seconds <= delay:
            self.faster.discard(key)
            return False
        if key in self.faster:
            return False
        self.faster.add(key)
        return True

    def wanted(self, reporter: Any, prog: Any) -> list[int]:
        """This rank's row of suspect pairs (``world * world``, 1 at ``src * world + dst``)."""
        row = [0] * (self.world * self.world)
        used = {(m.src, m.dst) for m in prog.messages}
        rank = {g: r for r, g in enumerate(self.emu.gpus)}
        for (s, d), low in reporter.low.items():
            if low and s in rank and d in rank and ((rank[s], rank[d]) not in used
                                                    or reporter.blind.get((s, d), False)):
                row[rank[s] * self.world + rank[d]] = 1
        return row

    def warm_up(self, group: Any, rounds: int = 3, timeout_s: float = 20.0) -> None:
        """Measure every pair's probe cost (collective over ``group``): ``rounds`` probes
        of all pairs at once, not held, the median of each received pair's seconds."""
        every = [1 if s != d else 0 for s in range(self.world) for d in range(self.world)]
        seen: dict[int, list[float]] = {}
        for _ in range(rounds):
            for src, seconds, _ in self._exchange(every, group, timeout_s):
                seen.setdefault(src, []).append(seconds)
        me = self.emu.gpus[self.rank]
        self.cost = {(self.emu.gpus[s], me): statistics.median(v) for s, v in seen.items()}

    def run(self, mask: Sequence[int], group: Any, reporter: Any,
            timeout_s: float = 20.0) -> list[dict[str, Any]]:
        """Probe every pair of the agreed ``mask`` at once; the ``pair`` samples this rank
        received.  Raises :class:`~executor_cuda.communicator.CollectiveTimeoutError` naming the
        peers whose probe did not arrive within ``timeout_s``."""
        out: list[dict[str, Any]] = []
        me = self.emu.gpus[self.rank]
        for src, seconds, start in self._exchange(mask, group, timeout_s):
            k = self.length(reporter, src, self.rank)
            delay = self.emu.pair_delay_s(src, self.rank, k * self.nbytes)
            hold_until(start + delay)
            key = (self.emu.gpus[src], me)
            if self.bound(key, seconds, delay):
                continue
            sample = reporter.probe(key[0], me, max(seconds, delay), k * self.nominal_s(src, self.rank),
                                    time.time(), self.cost.get(key, 0.0))
            if sample is not None:
                out.append(sample)
        return out

    def _exchange(self, mask: Sequence[int], group: Any, timeout_s: float) -> list[tuple[int, float, float]]:
        """Send one probe on every pair of ``mask`` at once; per probe this rank received,
        ``(src rank, real seconds from the sender's start to arrival, the sender's start)``
        (monotonic clock)."""
        import torch.distributed as dist

        from .communicator import CollectiveTimeoutError

        pairs = [divmod(k, self.world) for k, v in enumerate(mask) if v]
        recvs = []
        for src, dst in pairs:
            if dst == self.rank:
                buf = self.buf.clone()
                recvs.append((src, buf, dist.irecv(buf, src, group=group)))
        sends = []
        for _, dst in (p for p in pairs if p[0] == self.rank):
            buf = self.buf.clone()
            buf[0] = time.monotonic()
            sends.append(dist.isend(buf, dst, group=group))
        out: list[tuple[int, float, float]] = []
        if recvs:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=max(1, self.world - 1),
                                                thread_name_prefix="mccl-probe")
            arrived = [self._pool.submit(_arrival, w, timeout_s) for _, _, w in recvs]
            late = []
            for (src, buf, _), fut in zip(recvs, arrived):
                end = fut.result()
                if end is None:
                    late.append(src)
                    continue
                start = float(buf[0])
                out.append((src, end - start, start))
            if late:
                raise CollectiveTimeoutError(f"probes from ranks {late} did not arrive within "
                                             f"{timeout_s:g} s; is a peer stopped?")
        for work in sends:
            work.wait()
        return out

    def close(self) -> None:
        """Stop the receive waiters (every wait is bounded, none is left running)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def _arrival(work: Any, timeout_s: float) -> float | None:
    """Monotonic time at which ``work`` (a receive) completed; ``None`` if it did not
    within ``timeout_s``."""
    try:
        work.wait(timeout=timedelta(seconds=timeout_s))
    except RuntimeError:
        return None
    return time.monotonic()
