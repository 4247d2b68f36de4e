"""Controller service benchmark: telemetry ingest rate and ping latency under a flood.

    python bench/bench_service.py                       # both parts, HPN 1x4x8
    python bench/bench_service.py --shape 2x4x8 --rounds 3 --flood-s 2 --flooders 2

Ingest (samples/s, best of ``--repeat``): one batch of ``MAX_BATCH_SAMPLES`` samples
(a third each ``link``, ``gpu`` and ``pair``) through

* ``store``: :meth:`MeasurementStore.ingest` on parsed samples, channels already
  registered (the 1 M samples/s target);
* ``wire``: ``protocol.decode`` of the encoded request, then ``store``;
* ``service``: a controller in another process, fed by a client that pushes batches
  back to back (encode, zmq, decode, ingest, reply).

State writes: with 1 to 256 registered AllGathers (ring schedules), the first write
(every schedule version file new), a write with nothing new (what telemetry costs) and
one with one new version (what a publish or a registration costs).

Ping under a flood: a controller (``mccl controller serve`` semantics, the test
synthesizer so no solver runs) in its own process; ``--flooders`` processes push
full-size telemetry batches as fast as the controller takes them (8 in flight each),
while this process pings every 10 ms.  Idle and flood phases alternate ``--rounds``
times, so both see the same machine load; the table gives ping round-trip percentiles
per phase and the controller's ingest rate during the flood.  On a shared machine the
absolute numbers are noisy: compare the phases of one run.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from instances import hpn, parse_shape  # noqa: E402
from mccl_opt.tables import print_table  # noqa: E402
from mccl_runtime.protocol import MAX_BATCH_SAMPLES, decode, encode  # noqa: E402
from mccl_runtime.telemetry import MeasurementStore  # noqa: E402


def make_batch(topo, n: int, t: float, seed: int = 0) -> list[dict]:
    """``n`` valid samples: link, gpu and pair kinds in turn, values near nominal, at
    times ``t, t + 1 us, ...`` (a channel's samples differ in time: an equal-``t`` repeat
    would be refused as stale)."""
    from mccl_runtime.telemetry import RejectedSample, Sample

    rng = np.random.default_rng(seed)
    links = [(l.src, l.dst, l.capacity_gbps) for l in topo.links]
    gpus = list(topo.gpus)
    resolve = MeasurementStore(topo).map.resolve
    pairs = []
    for u in gpus:                                   # pairs with a switch-only path
        for v in gpus:
            try:
                if u != v and len(pairs) < 4096:
                    resolve(Sample("pair", u, v, 1.0, 0.0))
                    pairs.append((u, v))
            except RejectedSample:
                pass
    out = []
    for i in range(n):
        y, t_i = float(rng.uniform(0.5, 1.0)), t + 1e-6 * i
        if i % 3 == 0 or not pairs:
            a, b, cap = links[i % len(links)]
            out.append({"kind": "link", "src": a, "dst": b, "gbps": cap * y, "t": t_i})
        elif i % 3 == 1:
            out.append({"kind": "gpu", "gpu": gpus[i % len(gpus)], "dir": "out", "gbps": 100.0 * y, "t": t_i})
        else:
            u, v = pairs[i % len(pairs)]
            out.append({"kind": "pair", "src": u, "dst": v, "gbps": 50.0 * y, "t": t_i})
    return out


# ---------------------------------------------------------------------- ingest rate
def ingest_rates(topo, repeat: int) -> dict[str, float]:
    """Samples/s of one batch into a store that has seen its channels before (the
    steady state: a channel is registered once, on its first sample)."""
    t = time.time()
    first, batch = (make_batch(topo, MAX_BATCH_SAMPLES, t - s) for s in (3.0, 2.0))
    raw = encode("telemetry", {"samples": make_batch(topo, MAX_BATCH_SAMPLES, t - 1.0)})
    best = {"store": 0.0, "wire": 0.0}
    for _ in range(repeat):
        store = MeasurementStore(topo)
        store.ingest(first, t)
        t0 = time.perf_counter()
        rep = store.ingest(batch, t)
        t1 = time.perf_counter()
        assert rep.accepted == len(batch), rep
        store.ingest(decode(raw).body["samples"], t)
        t2 = time.perf_counter()
        best["store"] = max(best["store"], len(batch) / (t1 - t0))
        best["wire"] = max(best["wire"], len(batch) / (t2 - t1))
    return best


# ---------------------------------------------------------------------- state writes
def _no_synthesis(kind, topo, warm, time_limit_s):
    raise AssertionError("the service benchmark registers only given schedules")


def state_writes(topo, counts: list[int], repeat: int) -> list[list]:
    """One state write with ``n`` registered AllGathers (ring schedules): the first
    (every version file new), a later one with nothing new (telemetry), and one after
    one more registration (one new version file, what a publish costs)."""
    import tempfile

    from mccl_opt.baselines import ring_allgather
    from mccl_runtime.service import ControllerService
    from mccl_runtime.state import versions_dir

    ring = ring_allgather(topo)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for n in counts:
            path = Path(d) / f"s{n}.json"
            svc = ControllerService(topo, "tcp://127.0.0.1:0", synthesize=_no_synthesis, state_path=path,
                                    max_collectives=n + repeat)
            for k in range(n):
                svc.manager.register("world", f"ag{k}", "allgather", ring)
            first = _timed(svc.persist)
            steady = min(_timed(svc.persist) for _ in range(repeat))
            one_new = []
            for k in range(repeat):
                svc.manager.register("world", f"extra{k}", "allgather", ring)
                one_new.append(_timed(svc.persist))
            total = path.stat().st_size + sum(f.stat().st_size for f in versions_dir(path).iterdir())
            rows.append([n, f"{path.stat().st_size / 2**10:.0f}", f"{total / 2**20:.1f}", f"{first * 1e3:.0f}",
                         f"{steady * 1e3:.1f}", f"{min(one_new) * 1e3:.1f}"])
            svc.manager.close()
    return rows


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# ---------------------------------------------------------------------- processes
def _spawn(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *args], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})


def serve(shape: str) -> None:
    """``--serve``: a controller on a free loopback port (prints its endpoint)."""
    import signal
    import threading

    from mccl_runtime.manager import Policy
    from mccl_runtime.service import ControllerService

    svc = ControllerService(hpn(*parse_shape(shape)), "tcp://127.0.0.1:0", synthesize=_no_synthesis,
                            policy=Policy(gamma=10.0))          # nothing registered: serving only
    signal.signal(signal.SIGTERM, lambda *_: svc.stop())
    threading.Thread(target=lambda: (svc.ready.wait(), print(svc.endpoint, flush=True)),
                     daemon=True).start()
    svc.serve_forever()


def flood(endpoint: str, shape: str, go: str) -> None:
    """``--flood``: push full batches, 8 in flight, while the file ``go`` exists; end
    when ``go + ".end"`` exists."""
    import zmq

    topo = hpn(*parse_shape(shape))
    payload = encode("telemetry", {"samples": make_batch(topo, MAX_BATCH_SAMPLES, time.time(), seed=os.getpid())})
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    inflight = 0
    print("ready", flush=True)
    while not os.path.exists(go + ".end") or inflight:
        while inflight < 8 and os.path.exists(go):
            sock.send_multipart([b"", payload])
            inflight += 1
        if inflight and sock.poll(100):
            sock.recv_multipart()
            inflight -= 1
        elif not inflight:
            time.sleep(0.005)


def ping_phase(cli, seconds: float) -> list[float]:
    out = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        cli.ping()
        out.append((time.perf_counter() - t0) * 1e3)
        time.sleep(0.01)
    return out


def ping_under_flood(shape: str, flooders: int, flood_s: float, rounds: int) -> list[list]:
    import tempfile

    from mccl_runtime.client import ControllerClient

    server = _spawn("--serve", "--shape", shape)
    endpoint = server.stdout.readline().strip()
    go = Path(tempfile.mkdtemp()) / "go"
    floods = [_spawn("--flood", endpoint, "--shape", shape, "--go", str(go)) for _ in range(flooders)]
    for f in floods:
        assert f.stdout.readline().strip() == "ready"
    pings: dict[str, list[float]] = {"idle": [], "flood": []}
    rates = []
    try:
        with ControllerClient(endpoint, timeout_s=30.0) as cli:
            for _ in range(rounds):
                pings["idle"] += ping_phase(cli, flood_s)
                before = cli.stats()["telemetry"]["accepted"]
                go.touch()
                t0 = time.perf_counter()
                pings["flood"] += ping_phase(cli, flood_s)
                go.unlink()
                rates.append((cli.stats()["telemetry"]["accepted"] - before) / (time.perf_counter() - t0))
    finally:
        go.unlink(missing_ok=True)
        Path(str(go) + ".end").touch()
        for f in floods:
            f.wait(30)
        server.terminate()
        server.wait(30)
    rows = []
    for phase, xs in pings.items():
        x = np.array(xs)
        rows.append([phase, len(x), np.percentile(x, 50), np.percentile(x, 95), np.percentile(x, 99), x.max(),
                     f"{np.median(rates):,.0f}" if phase == "flood" else "-"])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="1x4x8", help="HPN SxHxN of the served fabric (default %(default)s)")
    ap.add_argument("--repeat", type=int, default=5, help="ingest timings per path (best kept)")
    ap.add_argument("--flooders", type=int, default=2, help="flooding processes (default %(default)s)")
    ap.add_argument("--flood-s", type=float, default=2.0, help="seconds per idle and per flood phase")
    ap.add_argument("--rounds", type=int, default=3, help="idle/flood phase pairs (alternating)")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--flood", metavar="ENDPOINT", help=argparse.SUPPRESS)
    ap.add_argument("--go", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        return serve(args.shape)
    if args.flood:
        return flood(args.flood, args.shape, args.go)
    topo = hpn(*parse_shape(args.shape))
    print(f"ingest, HPN {args.shape} ({topo.num_gpus} GPUs), batches of {MAX_BATCH_SAMPLES} samples, "
          f"best of {args.repeat}")
    rates = ingest_rates(topo, args.repeat)
    print_table(["path", "samples/s"], [[k, f"{v:,.0f}"] for k, v in rates.items()])
    print(f"\nstate write (fsync included) with n registered ring AllGathers; later writes best of {args.repeat}")
    print_table(["collectives", "main KiB", "all MiB", "first ms", "nothing new ms", "one new version ms"],
                state_writes(topo, [1, 16, 64, 256], args.repeat))
    print(f"\nping round trip (ms) while {args.flooders} processes flood full batches, "
          f"{args.rounds} alternating rounds of {args.flood_s:g} s")
    print_table(["phase", "pings", "p50", "p95", "p99", "max", "ingested samples/s"],
                ping_under_flood(args.shape, args.flooders, args.flood_s, args.rounds))


if __name__ == "__main__":
    main()
