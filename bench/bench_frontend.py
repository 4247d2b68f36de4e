"""Telemetry front ends at scale: the controller's CPU per flush with and without them, and
the front ends' own (docs/scale.md, "Telemetry front ends").

The emulated hosts of an HPN fabric (:class:`mccl_runtime.loadgen.FabricEmulator`) build
each flush once; the same batches go (a) to a controller, one signed request per host, and
(b) to front ends of ``--hosts-per-frontend`` hosts each, which fold the interval and send
the controller one signed folded request each.  Timed per flush (CPU, median of
``--flushes``): what the controller does for its requests (``ControllerService._handle``:
split frames, signature, replay and seq, decode, fold, the signed reply), and what each
front end does (``RequestGate.answer`` on its hosts' requests, the fold, building and
signing the forwarded request).  Building and signing the hosts' requests is outside the
timers.  After the timed flushes a Fail2 (both directions of the first GPU's NIC cable at
1/8) is sent for ``--fail-flushes`` flushes; the two controllers' ``M`` are compared.

    python bench/bench_frontend.py --shape 20x64x8 --level link --flushes 5
    python bench/bench_frontend.py --shape 20x64x8 --level pair --groups rails --flushes 3 [--maxima]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import Counter
from typing import Any

import numpy as np

from instances import hpn
from mccl_runtime.columns import ColumnBatch
from mccl_runtime.frontend_service import FrontEndService
from mccl_runtime.loadgen import FabricEmulator
from mccl_runtime.protocol import REPLIES, Message, decode, encode_frames
from mccl_runtime.service import ControllerService

KEY = b"bench-key-0123456789abcdef"
FLUSH_S = 0.05


class _Sender:
    """A host's (or a front end's) signing session towards one receiver."""

    def __init__(self, epoch: str, client: str) -> None:
        self.epoch, self.client, self.seq = epoch, client, 0

    def frames(self, batch: ColumnBatch) -> list[bytes]:
        self.seq += 1
        body, cols = batch.to_frames()
        return [b"id", b"", *encode_frames("telemetry_columns", body, cols, KEY, epoch=self.epoch,
                                           client=self.client, seq=self.seq)]


class _Upstream:
    """What a front end's client does for the controller (signs the folded request); the
    frames are kept for the controller's timer."""

    def __init__(self, svc: ControllerService, index: int) -> None:
        self.svc, self.endpoints, self.clients = svc, ["bench"], [self]
        self.sender = _Sender(svc.epoch, f"{index:032x}")
        self.sent: list[ColumnBatch] = []

    def ping(self) -> dict[str, Any]:
        return self.svc._dispatch(Message("ping", {}))[1]

    def push_columns(self, batch: ColumnBatch) -> dict[str, Any]:
        self.sender.frames(batch)               # what the front end's client does: sign (timed)
        self.sent.append(batch)                 # signed again just before the controller takes it
        return {}

    def close(self) -> None:
        pass


class _Clock:
    """The flush's time: every store checks samples against it, so a flush that takes long
    on a loaded machine ages no sample (``too_old`` would then differ between the paths)."""

    now = 0.0

    def __call__(self) -> float:
        return self.now


CLOCK = _Clock()


def _controller() -> ControllerService:
    return ControllerService(TOPO, "tcp://127.0.0.1:0", key=KEY, clock=CLOCK)


def _serve(answer: Any, requests: list[tuple[_Sender, ColumnBatch]]) -> float:
    """CPU seconds ``answer`` (a service's request handler) spends on ``requests``, each
    signed just before it is handled (untimed: a long first flush stays inside the replay
    window); every reply must be ``ok``."""
    cpu = 0.0
    for sender, batch in requests:
        frames = sender.frames(batch)
        c0 = time.process_time()
        reply = answer(frames)
        cpu += time.process_time() - c0
        if b'"type":"error"' in reply[-1]:
            raise SystemExit(f"a request was refused: {decode(reply[-1], KEY, REPLIES).body}")
    return cpu


def run(args: argparse.Namespace) -> dict[str, Any]:
    global TOPO
    s, h, g = (int(x) for x in args.shape.split("x"))
    TOPO = hpn(s, h, g)
    t0 = time.perf_counter()
    emu = FabricEmulator(TOPO, args.level, group=64, reduce=args.reduce, groups=args.groups)
    setup_s = time.perf_counter() - t0
    hosts = emu.hosts
    direct, via = _controller(), _controller()
    pods = [hosts[i:i + args.hosts_per_frontend] for i in range(0, len(hosts), args.hosts_per_frontend)]
    ups = [_Upstream(via, i) for i in range(len(pods))]
    fes = [FrontEndService(TOPO, up, key=KEY, interval_s=FLUSH_S, clock=CLOCK, reporter=i if args.maxima else None)
           for i, up in enumerate(ups)]
    to_direct = {h: _Sender(direct.epoch, f"{h + 1:032x}") for h in hosts}
    to_fe = {h: _Sender(fes[i].gate.epoch, f"{h + 1:032x}") for i, pod in enumerate(pods) for h in pod}
    cap = np.array(TOPO.arrays.capacity, dtype=float)
    nic = next(l for l in TOPO.links if l.src == TOPO.gpus[0] and "tor" in l.dst)
    fail = [TOPO.link_index(nic.src, nic.dst), TOPO.link_index(nic.dst, nic.src)]
    rows = {"direct": [], "via": [], "fe": [], "fe_max": [], "samples": [], "forwarded": []}
    for k in range(1 + args.flushes + args.fail_flushes):
        if k == 1 + args.flushes:
            cap[fail] /= 8.0
        now = CLOCK.now = time.time()
        batches = {h: emu.batch(h, cap, now) for h in hosts}
        cpu_direct = _serve(direct._handle, [(to_direct[h], batches[h]) for h in hosts])
        fe_cpu = []
        for fe, pod in zip(fes, pods):
            cpu = _serve(lambda f, fe=fe: fe.gate.answer(f, fe._dispatch), [(to_fe[h], batches[h]) for h in pod])
            c0 = time.process_time()
            fe.forward()
            fe_cpu.append(cpu + time.process_time() - c0)
        cpu_via = _serve(via._handle, [(up.sender, b) for up in ups for b in up.sent])
        for up in ups:
            up.sent = []
        if 0 < k <= args.flushes:                        # the first flush registers the channels
            rows["direct"].append(cpu_direct)
            rows["via"].append(cpu_via)
            rows["fe"].append(sum(fe_cpu))
            rows["fe_max"].append(max(fe_cpu))
            rows["samples"].append(sum(len(b) for b in batches.values()))
            rows["forwarded"].append(sum(fe.forwarded["rows"] for fe in fes))
    m_direct, m_via = direct.store.measured(), via.store.measured()
    med = {key: statistics.median(v) for key, v in rows.items()}
    return {"gpus": TOPO.num_gpus, "links": TOPO.num_links, "level": args.level, "groups": args.groups,
            "reduced": args.reduce, "maxima": args.maxima, "hosts": len(hosts),
            "front ends": len(fes), "samples/flush": int(med["samples"]),
            "direct requests/flush": len(hosts), "via requests/flush": len(fes),
            "forwarded rows/flush": int(rows["forwarded"][-1] - rows["forwarded"][-2]) if len(rows["forwarded"]) > 1
            else int(rows["forwarded"][-1]),
            "controller ms/flush direct": 1e3 * med["direct"], "controller ms/flush via": 1e3 * med["via"],
            "front ends ms/flush (all)": 1e3 * med["fe"], "front end ms/flush (slowest)": 1e3 * med["fe_max"],
            "controller cores direct": med["direct"] / FLUSH_S, "controller cores via": med["via"] / FLUSH_S,
            "front end cores (all)": med["fe"] / FLUSH_S,
            "M after Fail2 equal": bool(np.allclose(m_direct, m_via, rtol=1e-9)),
            "max |dM|/M": float(np.max(np.abs(m_direct - m_via) / m_direct)),
            "failed link M direct, via": (round(float(m_direct[fail[0]]), 3), round(float(m_via[fail[0]]), 3)),
            "rejected direct": dict(direct.store.rejected), "rejected via (front ends)":
                dict(sum((fe.fold.store.rejected for fe in fes), Counter())),
            "rejected via (controller)": dict(via.store.rejected), "emulator setup s": round(setup_s, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="20x64x8", help="HPN shape SxHxN (20x64x8: 10,240 GPUs)")
    ap.add_argument("--level", choices=["link", "pair"], default="link")
    ap.add_argument("--groups", choices=["ranks", "rails"], default="ranks",
                    help="pair level: groups of 64 consecutive ranks (HPN: 14 peers with a switch path) "
                         "or of one rail's GPUs of 64 hosts (63 peers)")
    ap.add_argument("--reduce", action="store_true", help="pair level: host-side reduction")
    ap.add_argument("--maxima", action="store_true", help="front ends forward pair channels as link maxima (--id)")
    ap.add_argument("--hosts-per-frontend", type=int, default=64)
    ap.add_argument("--flushes", type=int, default=5)
    ap.add_argument("--fail-flushes", type=int, default=3)
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    for key, value in run(args).items():
        print(f"{key}: {value:.3g}" if isinstance(value, float) else f"{key}: {value}")


if __name__ == "__main__":
    main()
