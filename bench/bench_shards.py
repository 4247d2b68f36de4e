"""Fail2 on a 2048-GPU fabric served by one controller or by shards (docs/scale.md).

HPN 4x64x8 (2048 GPUs) with ``--comms`` AllGather communicators of 256 GPUs (32 hosts each,
on the sub-fabric they induce), served by ``mccl controller serve --shards N`` (N = 1 is
the unsharded controller).  The load generator (:class:`mccl_runtime.loadgen.FabricEmulator`)
sends every link's sample every 50 ms as binary columns to every shard; after ``--healthy-s``
a Fail2 (GPU 0's NIC cable at 50 Gbps) hits the first GPU of every communicator at once.
Reaction = from the first failed flush until the last communicator's new version is
seen (subscribed on every shard, and ``list`` polled after every flush); the versions and rates published are compared
between the runs.

    python bench/bench_shards.py --shards 1,2 --repeat 2
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from instances import hpn
from mccl_runtime.client import ShardedClient
from mccl_runtime.loadgen import FabricEmulator

ROOT = Path(__file__).resolve().parents[1]


def _comms(topo, n: int) -> dict[str, list[str]]:
    per = 32 * 8
    return {f"comm{k}": list(topo.gpus[k * per:(k + 1) * per]) for k in range(n)}


def run(topo, topo_path: Path, comms: dict[str, list[str]], shards: int, healthy_s: float) -> dict:
    cmd = [sys.executable, "-m", "mccl_opt.cli", "controller", "serve", "--estimator", "ewma", "--topology", str(topo_path),
           "--bind", "tcp://127.0.0.1:0", "--alpha", "1", "--dwell", "0", "--shards", str(shards)]
    for comm, gpus in comms.items():
        cmd += [f"--collective={comm}/ag:allgather", f"--members={comm}={','.join(gpus)}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        line = ""
        while not line.startswith("controller on"):
            line = proc.stdout.readline()
            if not line:
                raise SystemExit("the controller did not start")
        cli = ShardedClient(line.split()[2], timeout_s=60.0)
        subs = cli.subscribe()
        for s in subs:
            s.wait_connected(10.0)
        while any(c["version"] < 1 for c in cli.list()):
            time.sleep(0.1)
        emu = FabricEmulator(topo, "link", noise=0.0)
        cap = np.array(topo.arrays.capacity, dtype=float)
        failed = cap.copy()
        for gpus in comms.values():
            g = gpus[0]
            tor = g.split("h")[0] + "tor0"
            failed[[topo.link_index(g, tor), topo.link_index(tor, g)]] = 50.0
        start, t_fail, published, flush_cpu = time.time(), None, {}, []
        while len(published) < len(comms) and time.time() - start < healthy_s + 60.0:
            now = time.time()
            if t_fail is None and now - start >= healthy_s:
                t_fail = now
            batch = emu.flush(failed if t_fail is not None else cap, now)
            c0 = time.perf_counter()
            cli.push_columns(batch)
            flush_cpu.append(time.perf_counter() - c0)
            for s in subs:
                while (upd := s.recv(0.001)) is not None:
                    if upd[2] >= 2 and upd[0] not in published:
                        published[upd[0]] = (time.time(), upd[2], upd[3].rate_gbps)
            for c in cli.list():               # a publication the subscription missed (joined late)
                if c["version"] >= 2 and c["comm"] not in published:
                    version, sched = cli.get_schedule(c["comm"], "ag")
                    published[c["comm"]] = (time.time(), version, sched.rate_gbps)
            time.sleep(max(0.0, now + 0.05 - time.time()))
        rows = {c["comm"]: c["version"] for c in cli.list()}
        for s in subs:
            s.close()
        cli.close()
    finally:
        proc.terminate()
        proc.wait(30)
    times = sorted(t for t, _, _ in published.values())
    return {"shards": shards, "versions": rows, "rates": {c: round(r, 6) for c, (_, _, r) in published.items()},
            "first_s": times[0] - t_fail if times else None, "last_s": times[-1] - t_fail if times else None,
            "push_ms": 1e3 * float(np.median(flush_cpu))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shards", default="1,2")
    ap.add_argument("--comms", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--healthy-s", type=float, default=1.0)
    args = ap.parse_args()
    topo = hpn(4, 64, 8)
    comms = _comms(topo, args.comms)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.json"
        topo.save(path)
        results = []
        for _ in range(args.repeat):
            for n in (int(x) for x in args.shards.split(",")):
                results.append(run(topo, path, comms, n, args.healthy_s))
    print(f"HPN 4x64x8, {args.comms} AllGather communicators of 256 GPUs, Fail2 on each; "
          f"load average {os.getloadavg()[0]:.1f}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print("| shards | first new version s | all new versions s | versions | push of one flush ms |")
    print("|---|---|---|---|---|")
    for r in results:
        vs = sorted(set(r["versions"].values()))
        print(f"| {r['shards']} | {r['first_s']:.3f} | {r['last_s']:.3f} | {vs} | {r['push_ms']:.1f} |")
    same = all(r["versions"] == results[0]["versions"] and r["rates"] == results[0]["rates"] for r in results)
    print(f"same versions and rates in every run: {same}")
    for r in results:
        print(f"{r['shards']} shard(s), new versions' rates (Gbps): "
              + ", ".join(f"{c} {v:g}" for c, v in sorted(r["rates"].items())))


if __name__ == "__main__":
    main()
