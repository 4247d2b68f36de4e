"""Controller-side cost of telemetry at scale: decode + fold per flush, binary vs JSON (docs/scale.md).

The emulated hosts of an HPN fabric (:class:`mccl_runtime.loadgen.FabricEmulator`) build one
flush (link level: every link once; pair level: every pair of a communicator group of 64
with a switch path, with and without the host-side reduction); each request is encoded and
signed as the sender would, outside the timer.  The timer covers what the controller does:
split the frames, check the header's signature and replay fields, read the columns and fold
them into ``M`` (``ingest_columns``), or decode the JSON and ``ingest``.  ``cores`` is the
time per flush over the 50 ms flush interval.  ``--hosts-per-request`` sends several hosts'
samples per request (a front end that aggregates a pod).

    python bench/bench_telemetry_scale.py --shapes 4x64x8,20x64x8 --flushes 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from instances import hpn
from mccl_runtime.columns import ColumnBatch
from mccl_runtime.loadgen import FabricEmulator
from mccl_runtime.protocol import (REQUESTS, ReplayGuard, SequenceGuard, decode, encode, encode_frames,
                                   split_frames)
from mccl_runtime.telemetry import MeasurementStore

KEY = b"bench-key-0123456789abcdef"
FLUSH_S = 0.05


def _requests(emu: FabricEmulator, t: float, per_request: int, binary: bool, epoch: str, seq: list[int]):
    """One flush as the signed requests the hosts would send (built outside the timer)."""
    from mccl_runtime.loadgen import _as_json

    out, cap = [], emu.topo.arrays.capacity
    for i in range(0, len(emu.hosts), per_request):
        parts = [emu.batch(h, cap, t) for h in emu.hosts[i:i + per_request]]
        batch = ColumnBatch(*(np.concatenate([getattr(p, c) for p in parts]) for c in ("kind", "a", "b", "gbps", "t")),
                            links=emu.topo.num_links, gpus=emu.topo.num_gpus)
        seq[0] += 1
        fields = {"epoch": epoch, "client": "c" * 32, "seq": seq[0]}
        if binary:
            body, frames = batch.to_frames()
            out.append([b"id", b"", *encode_frames("telemetry_columns", body, frames, KEY, **fields)])
        else:
            for lo in range(0, len(batch), 2048):
                seq[0] += 1
                samples = _as_json(emu.topo, ColumnBatch(*(getattr(batch, c)[lo:lo + 2048] for c in
                                                           ("kind", "a", "b", "gbps", "t")),
                                                         links=batch.links, gpus=batch.gpus))
                out.append([b"id", b"", encode("telemetry", {"samples": samples}, KEY, **{**fields, "seq": seq[0]})])
    return out


def _controller(store: MeasurementStore, requests, replay: ReplayGuard, sequence: SequenceGuard,
                now: float) -> int:
    """What the service does per request (its ``_handle``): returns samples accepted."""
    accepted = 0
    for frames in requests:
        _, header, cols = split_frames(frames)
        msg = decode(header, KEY, REQUESTS, replay, frames=cols)
        sequence.check(msg)
        if cols:
            accepted += store.ingest_columns(ColumnBatch.from_frames(msg.body, cols, store.topo), now).accepted
        else:
            accepted += store.ingest(msg.body["samples"], now).accepted
    return accepted


def run(shape: str, level: str, reduce: bool, binary: bool, per_request: int, flushes: int) -> dict:
    s, h, g = (int(x) for x in shape.split("x"))
    topo = hpn(s, h, g)
    t0 = time.perf_counter()
    emu = FabricEmulator(topo, level, group=64, reduce=reduce)
    setup = time.perf_counter() - t0
    store = MeasurementStore(topo)
    sequence = SequenceGuard()
    replay, seq = ReplayGuard(), [0]
    times, cpu, sent = [], [], 0
    for k in range(flushes + 1):                     # the first flush registers the channels
        now = time.time()
        reqs = _requests(emu, now, per_request, binary, sequence.epoch, seq)
        c0, w0 = time.process_time(), time.perf_counter()
        accepted = _controller(store, reqs, replay, sequence, now)
        if k:
            times.append(time.perf_counter() - w0)
            cpu.append(time.process_time() - c0)
            sent = accepted
    per_flush = statistics.median(cpu)
    return {"gpus": topo.num_gpus, "links": topo.num_links, "level": level, "reduced": reduce,
            "format": "binary" if binary else "json", "hosts/request": per_request,
            "samples/flush": sent, "raw samples/flush": emu.samples_per_flush(), "requests/flush": len(reqs),
            "ms/flush (cpu)": 1e3 * per_flush, "ms/flush (wall)": 1e3 * statistics.median(times),
            "us/sample": 1e6 * per_flush / max(sent, 1), "cores at 20 flushes/s": per_flush / FLUSH_S,
            "emulator setup s": setup}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="4x64x8,20x64x8", help="HPN shapes SxHxN, comma separated")
    ap.add_argument("--flushes", type=int, default=5)
    ap.add_argument("--pair-shapes", default="4x64x8", help="shapes for the pair-level rows")
    ap.add_argument("--json-shapes", default="4x64x8", help="shapes for the JSON rows")
    args = ap.parse_args()
    rows = []
    for shape in args.shapes.split(","):
        for per in (1, 64):
            rows.append(run(shape, "link", False, True, per, args.flushes))
        if shape in args.json_shapes.split(","):
            rows.append(run(shape, "link", False, False, 1, max(1, args.flushes // 2)))
        if shape in args.pair_shapes.split(","):
            for reduce in (False, True):
                rows.append(run(shape, "pair", reduce, True, 64, args.flushes))
    cols = ["gpus", "links", "level", "reduced", "format", "hosts/request", "requests/flush", "raw samples/flush",
            "samples/flush", "ms/flush (cpu)", "us/sample", "cores at 20 flushes/s"]
    print(f"load average {os.getloadavg()[0]:.1f}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(f"{r[c]:.3g}" if isinstance(r[c], float) else str(r[c]) for c in cols) + " |")


if __name__ == "__main__":
    main()
