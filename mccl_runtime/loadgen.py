"""A load generator: emulated executors sending a fabric's telemetry (docs/scale.md).

Each host of an ``N``-GPU fabric flushes its telemetry every ``flush_s`` (the executor's
``Telemetry(flush_interval=0.05)``, paper §3.3): at link level one sample per link it
owns (the links of its GPUs; a switch-to-switch link belongs to one host), at pair level
one sample per (peer, GPU) pair it received in its communicator group (``group`` GPUs of
consecutive ranks; pairs with a switch path), optionally reduced on the host to one
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
from .host_reduce import HostReducer
from .samples import LinkMap, RejectedSample, Sample

__all__ = ["FabricEmulator", "Failure", "run_emulators"]


@dataclass(frozen=True)
class Failure:
    """From ``t_s`` seconds after the start, the links ``links`` run at ``gbps``."""

    t_s: float
    links: tuple[int, ...]
    gbps: float


def host_of(topo: Topology) -> np.ndarray:
    """Each GPU rank's host index (GPUs sharing their intra-node switch)."""
    lm = LinkMap(topo)
    switches = [lm.resolve(Sample("gpu", g, "out", 0.0, 0.0))[0][0] for g in topo.gpus]
    _, host = np.unique(topo.arrays.head[switches], return_inverse=True)
    return host


class FabricEmulator:
    """The per-host telemetry batches of a fabric (module docstring); ``hosts``: the host
    indices this emulator sends for (default all)."""

    def __init__(self, topo: Topology, level: str = "link", group: int = 64, reduce: bool = True,
                 noise: float = 0.02, hosts: Sequence[int] | None = None, seed: int = 0) -> None:
        if level not in ("link", "pair"):
            raise InputError(f"level must be 'link' or 'pair', got {level!r}")
        self.topo, self.level, self.noise = topo, level, noise
        self.rng = np.random.default_rng(seed)
        self.host = host_of(topo)
        mine = set(range(int(self.host.max()) + 1)) if hosts is None else set(hosts)
        self.hosts = sorted(mine)
        self._reducers = {h: HostReducer(topo, h) for h in self.hosts} if reduce and level == "pair" else {}
        self._rows = {h: self._pair_rows(h, group) if level == "pair" else self._link_rows(h) for h in self.hosts}

    def _link_rows(self, h: int) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        """Link samples of host ``h``: the links touching its GPUs, and a share of the others."""
        arr, topo = self.topo.arrays, self.topo
        rank = np.full(topo.num_nodes, -1, dtype=np.int64)
        rank[arr.gpu_nodes] = np.arange(topo.num_gpus)
        gpu_end = np.where(rank[arr.tail] >= 0, rank[arr.tail], rank[arr.head])
        owner = np.where(gpu_end >= 0, self.host[np.maximum(gpu_end, 0)], np.arange(topo.num_links) % (self.host.max() + 1))
        links = np.flatnonzero(owner == h)
        return np.zeros(len(links), dtype=np.int64), links, [np.array([a]) for a in links]

    def _pair_rows(self, h: int, group: int) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        """Pair samples received by host ``h``: every group peer of each of its GPUs with a
        switch path (sources in ``a``, destinations in ``b``), and each pair's links."""
        lm, gpus = LinkMap(self.topo), self.topo.gpus
        src, dst, paths = [], [], []
        for d in np.flatnonzero(self.host == h).tolist():
            lo = d - d % group
            for s in range(lo, min(lo + group, len(gpus))):
                if s == d:
                    continue
                try:
                    path = lm.resolve(Sample("pair", gpus[s], gpus[d], 0.0, 0.0))[0]
                except RejectedSample:
                    continue
                src.append(s)
                dst.append(d)
                paths.append(np.asarray(path, dtype=np.int64))
        return np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64), paths

    def samples_per_flush(self) -> int:
        """Samples the emulated hosts produce per flush, before any reduction."""
        return sum(len(r[1]) for r in self._rows.values())

    def batch(self, h: int, capacity: np.ndarray, t: float) -> ColumnBatch:
        """Host ``h``'s batch at time ``t`` under the link capacities ``capacity``."""
        a, b, paths = self._rows[h]
        true = np.array([capacity[p].min() for p in paths]) if self.level == "pair" else capacity[b]
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
             opts: dict[str, Any], failures: list[Failure], start: float, out: Any) -> None:
    """One emulator process: send a flush every ``flush_s`` until ``duration_s``."""
    from .client import ControllerClient

    topo = Topology.from_dict(topo_dict)
    emu = FabricEmulator(topo, opts["level"], opts["group"], opts["reduce"], opts["noise"], hosts, seed=hosts[0])
    clients = [ControllerClient(ep, key, timeout_s=30.0) for ep in endpoints]
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
                  key: bytes | None = None, start: float | None = None) -> tuple[int, int]:
    """Send a fabric's telemetry from ``procs`` processes (hosts split evenly) to every
    endpoint in ``endpoints`` for ``duration_s``; ``(samples sent, accepted)``."""
    nhosts = int(host_of(topo).max()) + 1
    opts = {"level": level, "group": group, "reduce": reduce, "noise": noise, "flush_s": flush_s,
            "duration_s": duration_s, "binary": binary}
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    start = time.time() + 3.0 if start is None else start
    workers = [ctx.Process(target=_emulate, args=(topo.to_dict(), endpoints, key, list(range(i, nhosts, procs)),
                                                  opts, list(failures), start, out), daemon=True)
               for i in range(procs)]
    for w in workers:
        w.start()
    results = [out.get(timeout=duration_s + 120.0) for _ in workers]
    for w in workers:
        w.join(10.0)
    return sum(r[0] for r in results), sum(r[1] for r in results)
