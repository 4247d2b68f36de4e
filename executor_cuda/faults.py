"""Fault injection: emulate slow links on CPU ranks (gloo).

gloo cannot throttle a TCP connection, so the executor emulates a slow transfer by a
delay counted from the start of the sender's round.  On CPU ranks the *receiver* holds
the message (:func:`hold_until`): every send is posted at once with the sender's round
start beside it, and the receiver ends its round no earlier than that start plus the
message's delay, the time the emulated link would deliver it; the sender's round also
lasts until its own messages are delivered.  The link's telemetry sample is that
emulated time (or the real transfer, if gloo took longer), so a receiver that posts its
receive late, or whose thread wakes late on a busy core, does not make the link look
slow or fast: holding the send back at the sender instead (what CUDA ranks still do)
charged the receiver's lateness to the link, because the data then arrives exactly
when the receiver is being timed (docs/executor.md, "Late receivers and short probes").

Two injectors share that hook (:meth:`FaultInjector.message_delay_s`, called by the
communicator for every send):

* :class:`FaultInjector`: a set of slow rank-to-rank links ``(src, dst) -> Gbps``; a
  send of ``b`` bytes on one waits ``8 b / (Gbps * 1e9)`` s (paper §6.2.2's halved
  link).
* :class:`FabricEmulator`: a whole fabric (a ``mccl-topology/1`` topology with
  capacities that scenario events change, docs/executor.md "Emulated fabric").  Every
  message of a round is routed on its GPU pair's switch-only path (the route the
  controller's pair telemetry assumes, :mod:`mccl_opt.paths`); a link's *load* in a
  round is the bytes of every message of that round crossing it, across all ranks
  (every rank compiles the same global program, so each computes the same loads
  without communicating).  A message waits until its most loaded link, relative to
  capacity, has drained: ``max over links l of its path of 8 * load_l / cap_l``
  (the step model of paper §4.2: a round lasts as long as its busiest link), in
  fabric seconds, times ``time_scale`` real seconds per fabric second; bytes are
  ``byte_scale`` fabric bytes per real byte (ranks move small tensors that stand for
  the scenario's message).  A capacity change thus slows every transfer whose path
  crosses the link, in proportion to its share of that link's round.
  Latencies are not emulated (microseconds on the fabric).

Both are thread-safe and may be changed while collectives run.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Sequence

import numpy as np

from mccl_opt.errors import InputError, TopologyError
from mccl_opt.topology import Topology

__all__ = ["FaultInjector", "FabricEmulator", "hold_until"]


def hold_until(deliver_s: float, clock: Callable[[], float] = time.monotonic) -> None:
    """The receiving end of an emulated link: wait until ``deliver_s`` seconds on
    ``clock`` (the sender's round start plus the message's emulated time), the moment the
    emulated link delivers a message whose bytes may already be here."""
    left = deliver_s - clock()
    if left > 0:
        time.sleep(left)


class FaultInjector:
    """A mutable set of emulated slow links ``(src rank, dst rank) -> Gbps``."""

    def __init__(self) -> None:
        self._slow: dict[tuple[int, int], float] = {}
        self._lock = threading.Lock()

    def slow_link(self, src: int, dst: int, gbps: float, bidirectional: bool = True) -> None:
        """Make ``src -> dst`` (and ``dst -> src`` if ``bidirectional``) run at ``gbps``."""
        if not gbps > 0:
            raise InputError(f"emulated link rate must be > 0 Gbps, got {gbps}")
        with self._lock:
            self._slow[(src, dst)] = float(gbps)
            if bidirectional:
                self._slow[(dst, src)] = float(gbps)

    def clear(self) -> None:
        """Heal every link."""
        with self._lock:
            self._slow.clear()

    def delay_s(self, src: int, dst: int, nbytes: int) -> float:
        """Seconds to hold back a ``nbytes`` send from ``src`` to ``dst`` (0 if healthy)."""
        with self._lock:
            gbps = self._slow.get((src, dst))
        return 0.0 if gbps is None else 8.0 * nbytes / (gbps * 1e9)

    def message_delay_s(self, prog: Any, rnd: int, msg: Any, nbytes: int) -> float:
        """The communicator's hook: delay of ``msg`` (a lowered
        :class:`~mccl_opt.lowering.program.Message` of ``nbytes`` bytes, round ``rnd``
        of global program ``prog``) from its round's start."""
        return self.delay_s(msg.src, msg.dst, nbytes)

    @property
    def links(self) -> dict[tuple[int, int], float]:
        with self._lock:
            return dict(self._slow)


class FabricEmulator(FaultInjector):
    """A fabric whose link capacities pace every message (module docstring).

    ``gpus`` are the GPU ids in rank order (a schedule's ``gpus``); ``time_scale`` real
    seconds per fabric second and ``byte_scale`` fabric bytes per real byte.
    """

    def __init__(self, topo: Topology, gpus: Sequence[str], *, time_scale: float = 1.0,
                 byte_scale: float = 1.0) -> None:
        super().__init__()
        if not (time_scale > 0 and byte_scale > 0):
            raise InputError(f"time_scale and byte_scale must be > 0, got {time_scale}, {byte_scale}")
        missing = [g for g in gpus if not (topo.has_node(g) and topo.is_gpu(g))]
        if missing:
            raise TopologyError(f"ranks {missing} are not GPUs of {topo.name!r}")
        self.topo = topo
        self.gpus = tuple(gpus)
        self.time_scale = float(time_scale)
        self.byte_scale = float(byte_scale)
        self._cap = topo.arrays.capacity.astype(float).copy()
        self._epoch = 0
        self._routes: dict[tuple[int, int], np.ndarray] = {}
        self._cache: dict[tuple[int, int], tuple[Any, dict[tuple[int, int, int], float]]] = {}

    # ------------------------------------------------------------------ the fabric
    def set_capacities(self, capacity: np.ndarray) -> None:
        """Give every link its current capacity (Gbps, topology link order)."""
        cap = np.asarray(capacity, dtype=float)
        if cap.shape != self._cap.shape or not np.all(cap > 0):
            raise InputError(f"need {self._cap.size} positive capacities, got shape {cap.shape}")
        with self._lock:
            self._cap = cap.copy()
            self._epoch += 1
            self._cache.clear()

    @property
    def capacities(self) -> np.ndarray:
        with self._lock:
            return self._cap.copy()

    def route(self, src: int, dst: int) -> np.ndarray:
        """Link indices of the switch-only path from rank ``src`` to rank ``dst``."""
        key = (src, dst)
        hit = self._routes.get(key)
        if hit is None:
            from mccl_opt.paths import switch_path

            t = self.topo
            hit = self._routes[key] = np.asarray(
                switch_path(t, t.node_index(self.gpus[src]), t.node_index(self.gpus[dst])), dtype=np.int64)
        return hit

    # ------------------------------------------------------------------ pacing
    def message_delay_s(self, prog: Any, rnd: int, msg: Any, nbytes: int) -> float:
        elem = nbytes // max(1, msg.numel) if msg.numel else 0
        key = (id(prog), elem)
        with self._lock:
            cap, epoch = self._cap, self._epoch
            hit = self._cache.get(key)
        if hit is None or hit[0] is not prog:        # the program is kept: its id stays its own
            hit = (prog, self.program_delays(prog, elem, cap))
            with self._lock:
                if epoch == self._epoch:
                    if len(self._cache) > 16:
                        self._cache.clear()
                    self._cache[key] = hit
        return hit[1].get((rnd, msg.src, msg.dst), 0.0)

    def program_delays(self, prog: Any, elem_bytes: int,
                       capacity: np.ndarray | None = None) -> dict[tuple[int, int, int], float]:
        """Real-time delay of every message ``(round, src, dst)`` of ``prog`` on
        ``capacity`` (default: the current fabric)."""
        return {key: float(d.max()) for key, d in self.route_drains(prog, elem_bytes, capacity).items()}

    def route_drains(self, prog: Any, elem_bytes: int,
                     capacity: np.ndarray | None = None) -> dict[tuple[int, int, int], np.ndarray]:
        """Per message ``(round, src, dst)`` of ``prog``: the real seconds each link of its
        route (:meth:`route` order) needs to drain the round's load on ``capacity``; the
        message's delay is the largest."""
        cap = self.capacities if capacity is None else np.asarray(capacity, dtype=float)
        by_round: dict[int, list[Any]] = {}
        for m in prog.messages:
            by_round.setdefault(m.round, []).append(m)
        out: dict[tuple[int, int, int], np.ndarray] = {}
        for rnd, msgs in by_round.items():
            load = np.zeros(cap.size)
            for m in msgs:
                np.add.at(load, self.route(m.src, m.dst), m.numel * elem_bytes)
            drain = 8.0 * load * self.byte_scale / (cap * 1e9) * self.time_scale
            for m in msgs:
                out[(rnd, m.src, m.dst)] = drain[self.route(m.src, m.dst)]
        return out

    def pair_delay_s(self, src: int, dst: int, nbytes: int, capacity: np.ndarray | None = None) -> float:
        """Real-time delay of ``nbytes`` sent alone from rank ``src`` to rank ``dst`` (a
        probe): its path's slowest link on ``capacity`` (default: the current fabric)."""
        cap = self.capacities if capacity is None else np.asarray(capacity, dtype=float)
        slowest = float(cap[self.route(src, dst)].min())
        return 8.0 * nbytes * self.byte_scale / (slowest * 1e9) * self.time_scale

    def program_time_s(self, prog: Any, elem_bytes: int, capacity: np.ndarray | None = None) -> float:
        """Emulated real time of one collective of ``prog`` if ranks stepped rounds in
        lock step: the sum over rounds of the round's longest delay.  Ranks do not wait
        for each other between rounds (a rank starts its next round when its own
        messages are done), so a run takes at most this, and exactly this for
        schedules whose every round has the same slowest rank."""
        per_round: dict[int, float] = {}
        for (rnd, _, _), d in self.program_delays(prog, elem_bytes, capacity).items():
            per_round[rnd] = max(per_round.get(rnd, 0.0), d)
        return sum(per_round.values())
