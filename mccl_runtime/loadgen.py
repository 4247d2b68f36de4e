"""A load generator: emulated executors sending a fabric's telemetry (docs/scale.md).

Each host of an ``N``-GPU fabric flushes its telemetry every ``flush_s`` (the executor's
``Telemetry(flush_interval=0.05)``, paper §3.3): at link level one sample per link it
owns (the links of its GPUs; a switch-to-switch link belongs to one host), at pair level
one sample per (peer, GPU) pair it received in its communicator group (``group`` GPUs of
consecutive ranks, or with ``groups="rails"`` of consecutive hosts' GPUs of one rail: every
peer then has a switch path; pairs without one send nothing), optionally reduced on the host to one
sample per link (:class:`~mccl_runtime.host_reduce.HostReducer`).  Values are the link
capacities of the failure timeline (a pair sees the slowest link of its path) times
``1 + noise * N(0, 1)``.  :class:`FabricEmulator` builds the batches;
:func:`run_emulators` sends them from ``procs`` processes at the real flush rate (or a
reduced one) to a controller, binary or JSON, and counts what was accepted.
"""

from __future__ import annotations

import multiprocessing
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from mccl_opt.errors import InputError
from mccl_opt.topology import Topology

from .columns import KIND_CODES, ColumnBatch
from .host_reduce import HostReducer, PairPaths

__all__ = ["FabricEmulator", "Failure", "run_emulators"]

#: seconds an emulator process may take to start (import, build, connect)
START_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Failure:
    """From ``t_s`` seconds after the start, the links ``links`` run at ``gbps``."""

    t_s: float
    links: tuple[int, ...]
    gbps: float


def host_of(topo: Topology) -> np.ndarray:
    """Each GPU rank's host index (GPUs sharing their intra-node switch)."""
    arr = topo.arrays
    rank = np.argsort(np.argsort(np.array([n.id for n in topo.nodes])))   # node id order
    a = np.arange(topo.num_links)
    a = a[arr.is_switch[arr.head] & ~arr.is_switch[arr.tail]]          # GPU -> switch links
    g = arr.rank_of[arr.tail[a]]
    # a gpu sample's switch (mccl_runtime.samples.LinkMap): the lowest latency, then id
    a = a[np.lexsort((rank[arr.head[a]], arr.latency[a], g))]
    g = arr.rank_of[arr.tail[a]]
    first = a[np.r_[True, g[1:] != g[:-1]]]
    if len(first) != topo.num_gpus:
        raise InputError("every GPU needs a switch to emulate its host's telemetry")
    _, host = np.unique(arr.head[first], return_inverse=True)
    return host


class FabricEmulator:
    """The per-host telemetry batches of a fabric (module docstring); ``hosts``: the host
    indices this emulator sends for (default all)."""

    def __init__(self, topo: Topology, level: str = "link", group: int = 64, reduce: bool = True,
                 noise: float = 0.02, hosts: Sequence[int] | None = None, seed: int = 0,
                 groups: str = "ranks") -> None:
        if level not in ("link", "pair"):
            raise InputError(f"level must be 'link' or 'pair', got {level!r}")
        if groups not in ("ranks", "rails"):
            raise InputError(f"groups must be 'ranks' or 'rails', got {groups!r}")
        self.groups = groups
        self.topo, self.level, self.noise = topo, level, noise
        self.rng = np.random.default_rng(seed)
        self.host = host_of(topo)
        mine = set(range(int(self.host.max()) + 1)) if hosts is None else set(hosts)
        self.hosts = sorted(mine)
        self.paths = PairPaths(topo)
        self._reducers = {h: HostReducer(topo, h, self.paths) for h in self.hosts} \
            if reduce and level == "pair" else {}
        self._rows = self._pair_rows(group) if level == "pair" else {h: self._link_rows(h) for h in self.hosts}

    def _link_rows(self, h: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Link samples of host ``h``: the links touching its GPUs, and a share of the others."""
        arr, topo = self.topo.arrays, self.topo
        rank = np.full(topo.num_nodes, -1, dtype=np.int64)
        rank[arr.gpu_nodes] = np.arange(topo.num_gpus)
        gpu_end = np.where(rank[arr.tail] >= 0, rank[arr.tail], rank[arr.head])
        owner = np.where(gpu_end >= 0, self.host[np.maximum(gpu_end, 0)], np.arange(topo.num_links) % (self.host.max() + 1))
        links = np.flatnonzero(owner == h)
        return np.zeros(len(links), dtype=np.int64), links, links[:, None]

    def _pair_rows(self, group: int) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Pair samples received by each host: every group peer of each of its GPUs with a
        switch path (sources in ``a``, destinations in ``b``), and each pair's links (rows
        of :meth:`PairPaths.of`, -1 padded), all pairs' paths found at once."""
        ranks = np.arange(self.topo.num_gpus)
        if self.groups == "rails":          # by (GPU index in its host, host)
            local = ranks - np.minimum.reduceat(ranks, np.flatnonzero(np.r_[True, np.diff(self.host) != 0]))[self.host]
            order = np.lexsort((self.host, local))
        else:
            order = ranks
        pos = np.empty_like(ranks)
        pos[order] = ranks
        dst = np.repeat(np.flatnonzero(np.isin(self.host, self.hosts)), group)
        peer = np.tile(np.arange(group), len(dst) // group) + (pos[dst] - pos[dst] % group)
        keep = peer < self.topo.num_gpus
        src, dst = order[peer[keep]], dst[keep]
        keep = src != dst
        src, dst = src[keep], dst[keep]
        arcs, hops = self.paths.of(src, dst)
        ok = hops > 0
        src, dst, arcs, owner = src[ok], dst[ok], arcs[ok], self.host[dst[ok]]
        return {h: (src[owner == h], dst[owner == h], arcs[owner == h]) for h in self.hosts}

    def samples_per_flush(self) -> int:
        """Samples the emulated hosts produce per flush, before any reduction."""
        return sum(len(r[1]) for r in self._rows.values())

    def batch(self, h: int, capacity: np.ndarray, t: float) -> ColumnBatch:
        """Host ``h``'s batch at time ``t`` under the link capacities ``capacity``."""
        a, b, paths = self._rows[h]
        true = np.append(capacity, np.inf)[paths].min(axis=1) if self.level == "pair" else capacity[b]
        gbps = true * np.maximum(0.0, 1.0 + self.noise * self.rng.standard_normal(len(true)))
        kind = np.full(len(a), KIND_CODES[self.level])
        if self.level == "link":
            batch = ColumnBatch.build(self.topo, kind, b, a, gbps, np.full(len(a), t))
        else:
            batch = ColumnBatch.build(self.topo, kind, a, b, gbps, np.full(len(a), t))
        return self._reducers[h].reduce(batch) if h in self._reducers else batch

    def flush(self, capacity: np.ndarray, t: float) -> ColumnBatch:
        """One flush of every emulated host, concatenated (one request per emulator)."""
        parts = [self.batch(h, capacity, t) for h in self.hosts]
        return ColumnBatch(*(np.concatenate([getattr(p, c) for p in parts]) for c in ("kind", "a", "b", "gbps", "t")),
                           links=self.topo.num_links, gpus=self.topo.num_gpus)


def capacities(topo: Topology, failures: Sequence[Failure], elapsed_s: float) -> np.ndarray:
    """Link capacities ``elapsed_s`` into the run."""
    cap = np.array(topo.arrays.capacity, dtype=float)
    for f in failures:
        if elapsed_s >= f.t_s:
            cap[list(f.links)] = f.gbps
    return cap


def _emulate(topo_dict: dict[str, Any], endpoints: list[str], key: bytes | None, hosts: list[int],
             opts: dict[str, Any], failures: list[Failure], start: Any, ready: Any, go: Any, out: Any) -> None:
    """One emulator process: once built, say so on ``ready`` and wait for ``go``; then send a
    flush every ``flush_s`` from ``start.value`` (epoch s) until ``duration_s`` after it."""
    from .client import ControllerClient

    topo = Topology.from_dict(topo_dict)
    emu = FabricEmulator(topo, opts["level"], opts["group"], opts["reduce"], opts["noise"], hosts, seed=hosts[0],
                         groups=opts["groups"])
    clients = [ControllerClient(ep, key, timeout_s=30.0) for ep in endpoints]
    ready.put(hosts[0])
    go.wait(START_TIMEOUT_S)
    start = start.value
    time.sleep(max(0.0, start - time.time()))
    sent = accepted = 0
    tick = start
    while (now := time.time()) < start + opts["duration_s"]:
        batch = emu.flush(capacities(topo, failures, now - start), now)
        for cli in clients:
            rep = cli.push_columns(batch) if opts["binary"] else cli.push_telemetry(_as_json(topo, batch))
            accepted += rep["accepted"]
        sent += len(batch)
        tick += opts["flush_s"]
        time.sleep(max(0.0, tick - time.time()))
    for cli in clients:
        cli.close()
    out.put((sent, accepted))


def _as_json(topo: Topology, batch: ColumnBatch) -> list[dict[str, Any]]:
    """The JSON wire samples of a link- or pair-level batch."""
    links, gpus = topo.links, topo.gpus
    out = []
    for k, a, b, y, t in zip(batch.kind.tolist(), batch.a.tolist(), batch.b.tolist(), batch.gbps.tolist(),
                             batch.t.tolist()):
        if k == KIND_CODES["link"]:
            out.append({"kind": "link", "src": links[a].src, "dst": links[a].dst, "gbps": y, "t": t})
        elif k == KIND_CODES["pair"]:
            out.append({"kind": "pair", "src": gpus[a], "dst": gpus[b], "gbps": y, "t": t})
        else:
            raise InputError("host-reduced samples have no JSON form; send them binary")
    return out


def run_emulators(topo: Topology, endpoints: list[str], *, procs: int = 2, level: str = "link",
                  group: int = 64, reduce: bool = True, noise: float = 0.02, flush_s: float = 0.05,
                  duration_s: float = 5.0, failures: Sequence[Failure] = (), binary: bool = True,
                  key: bytes | None = None, start: float | None = None, groups: str = "ranks",
                  pods: bool = False) -> tuple[int, int]:
    """Send a fabric's telemetry from ``procs`` processes (hosts split evenly) to every
    endpoint in ``endpoints`` for ``duration_s``; ``(samples sent, accepted)``.  With
    ``pods`` process ``i`` sends consecutive hosts to ``endpoints[i]`` only (a pod's
    telemetry front end; ``procs`` is then the number of endpoints).  The processes start
    sending together at ``start`` (epoch s), by default as soon as every one is built and
    connected (a fixed delay was too long on an idle machine and too short on a loaded one)."""
    nhosts = int(host_of(topo).max()) + 1
    opts = {"level": level, "group": group, "reduce": reduce, "noise": noise, "flush_s": flush_s,
            "duration_s": duration_s, "binary": binary, "groups": groups}
    ctx = multiprocessing.get_context("spawn")
    out, ready, go, at = ctx.Queue(), ctx.Queue(), ctx.Event(), ctx.Value("d", 0.0)
    if pods:
        procs = len(endpoints)
        share = [(list(range(i * nhosts // procs, (i + 1) * nhosts // procs)), [endpoints[i]]) for i in range(procs)]
    else:
        share = [(list(range(i, nhosts, procs)), endpoints) for i in range(procs)]
    workers = [ctx.Process(target=_emulate, args=(topo.to_dict(), eps, key, hosts, opts, list(failures), at, ready,
                                                  go, out), daemon=True) for hosts, eps in share]
    for w in workers:
        w.start()
    for _ in workers:
        ready.get(timeout=START_TIMEOUT_S)
    at.value = time.time() if start is None else start
    go.set()
    results = [out.get(timeout=duration_s + 120.0) for _ in workers]
    for w in workers:
        w.join(10.0)
    return sum(r[0] for r in results), sum(r[1] for r in results)
