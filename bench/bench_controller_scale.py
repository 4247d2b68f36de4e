"""One controller decision at cluster scale: ingest a telemetry batch, Algorithm 1 on all.

    python bench/bench_controller_scale.py                          # 512 and 2048 GPUs
    python bench/bench_controller_scale.py --gpus 512 --copies 16 --estimators level

A *decision* (paper §3.2, Algorithm 1; docs/runtime.md "Schedule manager") is what the
controller does per telemetry batch: :meth:`MeasurementStore.ingest` of a batch that
covers every link of the fabric once (``link`` samples at 1 % noise around nominal),
then :meth:`ScheduleManager.check` (the estimator's ``M``, Algorithm 1 and the
capacity-gained test on every registered collective).  The collectives are the ring
AllGather of the fabric (the NCCL-style baseline: every link used, a cut of one link per
GPU), registered under ``--copies`` communicators, so the check's cost per collective
shows; ``--job-groups`` registers the communicators of ``--groups`` (below) instead, each
with the NCCL-style baseline of its sub-fabric (ring AllGather, direct AllToAll).  ``--pairs`` adds one ``pair`` sample per same-rail GPU pair of a segment (what
executors report for inter-node traffic).  Both estimators: the paper's EWMA and the
change-point level estimator (:mod:`mccl_runtime.level`).  ``--early F`` measures the
real ranks' speculation path instead (EWMA at ``alpha`` 1, ``Policy.speculate``,
docs/runtime.md "Speculative synthesis"): the links a same-rail pair crosses are measured
by the pairs only, and a fraction ``F`` of the pair samples (the same ones every batch)
carry an ``early`` drop to 0.99 of their reading (0.5 % noise), so every check evaluates
Algorithm 1 on the confirmed ``M`` and on the early estimates (nothing flags: the drop is
within ``Gamma``).  ``--direct`` keeps a link sample on every link: the direct channels
set ``M``, the early drops move no link, and no link is pending.

Per row: the mean registration time per collective (its profile, paper §3.2), and the
median and the worst of ``--rounds`` decisions after one warm-up batch (channels and pair
paths resolved), split into ingest and check, in CPU time, and the median decision per
sample.  One process on a shared machine: the load average is printed; compare rows of one run.

``--swap`` measures a cluster event instead: ``--comms`` communicators on one HPN fabric
(``--swap-shape``, default 1x8x8 = 64 GPUs), alternately AllGather and AllToAll, each with
its healthy schedule, all hit by one Fail2 (rank 0's NIC cable to 50 Gbps) at once.  The
loop ingests a batch covering every link each turn and makes one decision
(:meth:`ScheduleManager.step`); the figure is the time from the failure's batch until
every communicator has its new version, and the loop's turn times meanwhile (what
telemetry waits for).  Synthesis runs in the manager's worker thread (``thread``, the
default before the pool) or in a :class:`~mccl_runtime.pool.SynthesisPool` of 1 or 2
processes (``pool1``, ``pool2``), in the order given by ``--modes``.

``--groups`` measures one controller serving a job's communicators over sub-fabrics
(docs/runtime.md, "Communicators over sub-fabrics") on one HPN fabric (``--swap-shape``):
a tensor-parallel AllGather per host (its GPUs), a data-parallel AllGather per rail (one
GPU per host) and an expert-parallel AllToAll per ``--ep-hosts`` consecutive hosts (all
their GPUs), each with the healthy schedule of its own sub-fabric.  ``--event fail2``
degrades rank 0's NIC cable to 50 Gbps; ``--event tor`` degrades every cable of rail 0's
ToR to 100 Gbps (a gray ToR).  Per mode: how many communicators' sub-fabrics hold a
degraded link, how many were re-synthesized and swapped, the time until the last swap,
and the largest relative difference between a swapped schedule's LP rate and a cold solve
of its degraded sub-fabric (every swapped schedule is also validated there).  ``--layout
overlap`` registers ``--comms`` communicators of ``--ep-hosts`` whole hosts instead, all
holding host 0 and alternately AllGather and AllToAll, so one Fail2 hits every one.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from instances import hpn  # noqa: E402
from mccl_opt.baselines import ring_allgather  # noqa: E402
from mccl_runtime.manager import Policy, ScheduleManager  # noqa: E402
from mccl_runtime.telemetry import MeasurementStore  # noqa: E402

SHAPES = {64: (1, 8, 8), 128: (1, 16, 8), 512: (2, 32, 8), 1024: (2, 64, 8), 2048: (4, 64, 8), 4096: (8, 64, 8)}


def _no_synthesis(kind, topo, warm, time_limit_s):
    raise RuntimeError("the decision benchmark must not re-synthesize")


def same_rail_pairs(topo) -> list[tuple[str, str]]:
    """Ordered GPU pairs on one rail of one segment (a switch-only path through one ToR)."""
    groups: dict[tuple[str, str], list[str]] = {}
    for g in topo.gpus:
        groups.setdefault((g.split("h")[0], g[g.rindex("g"):]), []).append(g)
    return [(u, v) for members in groups.values() for u in members for v in members if u != v]


def setup(gpus: int):
    """The fabric and its ring AllGather."""
    topo = hpn(*SHAPES[gpus])
    return topo, ring_allgather(topo)


def make_batches(topo, rounds: int, pairs: bool, seed: int = 0, early: float = 0.0,
                 direct: bool = False) -> list[list[dict]]:
    """``rounds + 1`` batches: every link once (1 % noise), plus same-rail pairs if ``pairs``;
    ``early > 0``: no link sample on a link a pair crosses (unless ``direct``), that fraction of the pairs
    (spread evenly) carries ``early`` at 0.99 of its reading, and the noise is 0.5 % (at
    ``alpha`` 1 each reading is ``M``: 1 % flagged a ring's capacity-lost test in 100 rounds)."""
    rng = np.random.default_rng(seed)
    cap = topo.arrays.capacity
    prs = same_rail_pairs(topo) if pairs or early else []
    crossed = set()
    if early and not direct:
        from mccl_opt.paths import switch_path
        for u, v in prs:
            crossed.update(switch_path(topo, topo.node_index(u), topo.node_index(v)))
    ends = [(l.src, l.dst) for a, l in enumerate(topo.links) if a not in crossed]
    every = round(1 / early) if early else 0
    out = []
    for i in range(rounds + 1):
        t = 1e-3 * (i + 1)
        noise = 1.0 + (0.005 if early else 0.01) * rng.standard_normal(len(ends) + len(prs))
        batch = [{"kind": "link", "src": s, "dst": d, "gbps": float(cap[topo.link_index(s, d)] * noise[a]),
                  "t": t}
                 for a, (s, d) in enumerate(ends)]
        batch += [{"kind": "pair", "src": u, "dst": v, "gbps": float(400.0 * noise[len(ends) + j]), "t": t}
                  for j, (u, v) in enumerate(prs)]
        for j in range(0, len(prs) if every else 0, every or 1):
            pair = batch[len(ends) + j]
            pair["early"] = 0.99 * pair["gbps"]
        out.append(batch)
    return out


def measure(topo, registrations: list[tuple], estimator: str, batches: list[list[dict]],
            early: bool = False) -> dict:
    """Decisions with ``registrations`` (``(comm, kind, schedule, members)``) registered;
    ``early``: the real ranks' speculation path (EWMA at alpha 1, module docstring)."""
    store = MeasurementStore(topo, alpha=1.0 if early else 0.012, estimator=estimator, clock=lambda: 1e9)
    store.watch_early = early
    mgr = ScheduleManager(store, _no_synthesis, Policy(gamma=0.1, min_dwell_s=0.0, speculate=early))
    t0 = time.perf_counter()
    for comm, kind, schedule, gpus in registrations:
        mgr.register(comm, "c", kind, schedule, gpus=gpus)
    register_s = time.perf_counter() - t0
    copies = len(registrations)
    ingest_ms, check_ms = [], []
    for i, batch in enumerate(batches):
        now = batch[0]["t"]
        t0 = time.process_time()
        store.ingest(batch, now=now)
        t1 = time.process_time()
        flagged = mgr.check(now)
        t2 = time.process_time()
        if flagged:
            raise RuntimeError(f"1 % noise flagged {len(flagged)} collectives at round {i}")
        if early and i and store.early() is None:
            raise RuntimeError("--early: no early estimate was kept")
        if i:
            ingest_ms.append(1e3 * (t1 - t0))
            check_ms.append(1e3 * (t2 - t1))
    mgr.close()
    total = np.add(ingest_ms, check_ms)
    samples = len(batches[0])
    return {"gpus": topo.num_gpus, "links": topo.num_links, "samples": samples,
            "estimator": estimator + ("+early" if early else ""),
            "us_per_sample": 1e3 * float(np.median(total)) / samples,
            "collectives": copies, "ingest_ms": float(np.median(ingest_ms)), "check_ms": float(np.median(check_ms)),
            "decision_ms": float(np.median(total)), "worst_ms": float(np.max(total)),
            "register_ms": 1e3 * register_s / max(copies, 1)}


def link_batch(topo, m: np.ndarray, t: float) -> list[dict]:
    """One ``link`` sample per link at the capacities ``m``."""
    return [{"kind": "link", "src": l.src, "dst": l.dst, "gbps": float(m[a]), "t": t}
            for a, l in enumerate(topo.links)]


def measure_swap(shape: str, comms: int, mode: str, healthy: dict, limit_s: float = 600.0) -> dict:
    """Fail2 on ``comms`` communicators at once: time until every one has a new version."""
    import functools

    from instances import fail2, parse_shape
    from mccl_runtime.synthesizer import solver_synthesizer
    from mccl_runtime.pool import SynthesisPool

    topo = hpn(*parse_shape(shape))
    store = MeasurementStore(topo, alpha=1.0)
    policy = Policy(gamma=0.1, min_dwell_s=0.0, time_limit_s=limit_s)
    pool, start_s = None, 0.0
    if mode.startswith("pool"):
        t0 = time.perf_counter()
        pool = SynthesisPool(topo, functools.partial(solver_synthesizer, "highs", 10), workers=int(mode[4:]))
        pool.start()
        start_s = time.perf_counter() - t0
    mgr = ScheduleManager(store, None if pool else solver_synthesizer(), policy, pool=pool)
    kinds = ("allgather", "alltoall")
    for c in range(comms):
        mgr.register(f"comm{c}", "c", kinds[c % 2], healthy[kinds[c % 2]])
    m = fail2(topo).arrays.capacity
    turns, done, synth = [], {}, []
    t_fail = time.perf_counter()
    while len(done) < comms and time.perf_counter() - t_fail < limit_s:
        t0 = time.perf_counter()
        store.ingest(link_batch(topo, m, t0), now=t0)
        for e in mgr.step(t0):
            if e.action in ("published", "aborted", "failed", "timeout"):
                done[e.comm] = (e.action, time.perf_counter() - t_fail)
                synth.append(e.detail.get("synth_s", float("nan")))
        turns.append(time.perf_counter() - t0)
        time.sleep(0.002)
    mgr.close()
    actions = sorted({a for a, _ in done.values()})
    return {"mode": mode, "comms": comms, "gpus": topo.num_gpus,
            "swapped": sum(a == "published" for a, _ in done.values()),
            "outcomes": ",".join(actions), "all_swapped_s": max((t for _, t in done.values()), default=float("nan")),
            "first_s": min((t for _, t in done.values()), default=float("nan")),
            "job_s_median": float(np.nanmedian(synth)) if synth else float("nan"),
            "turn_ms_p50": 1e3 * float(np.median(turns)), "turn_ms_max": 1e3 * float(np.max(turns)),
            "pool_start_s": start_s}


def job_groups(topo, ep_hosts: int) -> dict[str, tuple[str, list[str]]]:
    """``comm -> (kind, members)``: TP per host, DP per rail, EP per ``ep_hosts`` hosts."""
    hosts: dict[str, list[str]] = {}
    for g in topo.gpus:
        hosts.setdefault(g[:g.rindex("g")], []).append(g)
    names = list(hosts)
    out = {f"tp{h}": ("allgather", hosts[n]) for h, n in enumerate(names)}
    out.update({f"dp{r}": ("allgather", [hosts[n][r] for n in names]) for r in range(len(hosts[names[0]]))})
    out.update({f"ep{k}": ("alltoall", [g for n in names[k * ep_hosts:(k + 1) * ep_hosts] for g in hosts[n]])
                for k in range(len(names) // ep_hosts)})
    return out


def overlapping_groups(topo, comms: int, hosts: int) -> dict[str, tuple[str, list[str]]]:
    """``comms`` communicators of ``hosts`` whole hosts each, alternately AllGather and
    AllToAll, that all hold host 0 (so rank 0's NIC is in every sub-fabric); the other
    hosts are dealt round robin from the rest."""
    names = sorted({g[:g.rindex("g")] for g in topo.gpus}, key=lambda h: topo.gpus.index(h + "g0"))
    rest = names[1:]
    if not 1 < hosts <= len(names):
        raise SystemExit(f"--ep-hosts must be in [2, {len(names)}] for {topo.name}")
    out = {}
    for k in range(comms):
        chosen = [names[0]] + [rest[(k * (hosts - 1) + j) % len(rest)] for j in range(hosts - 1)]
        out[f"c{k}"] = (("allgather", "alltoall")[k % 2], [g for g in topo.gpus if g[:g.rindex("g")] in chosen])
    return out


def job_baselines(topo, ep_hosts: int) -> list[tuple]:
    """The :func:`job_groups` communicators with the NCCL-style baselines of their
    sub-fabrics (ring AllGather, direct AllToAll), as ``(comm, kind, schedule, members)``."""
    from mccl_opt.baselines import direct_alltoall
    from mccl_opt.subfabric import induced

    return [(comm, kind, (ring_allgather if kind == "allgather" else direct_alltoall)(induced(topo, g).topology), g)
            for comm, (kind, g) in job_groups(topo, ep_hosts).items()]


def event_capacity(topo, event: str) -> np.ndarray:
    """The fabric's capacities after ``event`` (``fail2`` or ``tor``)."""
    from instances import fail2

    if event == "fail2":
        return fail2(topo).arrays.capacity
    tor = next(s for s in topo.switches if "tor" in s)
    m = topo.arrays.capacity.copy()
    for a, l in enumerate(topo.links):
        if tor in (l.src, l.dst):
            m[a] = 100.0
    return m


def measure_groups(topo, groups: dict, healthy: dict, event: str, mode: str, limit_s: float = 600.0) -> dict:
    """One event on a job's communicators over sub-fabrics (module docstring)."""
    import functools

    import mccl_opt as mo
    from mccl_opt.subfabric import induced
    from mccl_runtime.synthesizer import solver_synthesizer
    from mccl_runtime.pool import SynthesisPool

    store = MeasurementStore(topo, alpha=1.0)
    pool = None
    if mode.startswith("pool"):
        pool = SynthesisPool(topo, functools.partial(solver_synthesizer, "highs", 10), workers=int(mode[4:]))
        pool.start()
    mgr = ScheduleManager(store, None if pool else solver_synthesizer(),
                          Policy(gamma=0.1, min_dwell_s=0.0, time_limit_s=limit_s), pool=pool)
    for comm, (kind, gpus) in groups.items():
        mgr.register(comm, "c", kind, healthy[comm], gpus=gpus)
    m = event_capacity(topo, event)
    changed = np.flatnonzero(m != topo.arrays.capacity)
    holding = [c for c, (_, g) in groups.items() if np.isin(changed, mgr.groups.fabric(tuple(g)).links).any()]
    turns, started, done, synth = [], set(), {}, []
    t_fail = time.perf_counter()
    while time.perf_counter() - t_fail < limit_s:
        t0 = time.perf_counter()
        store.ingest(link_batch(topo, m, t0), now=t0)
        for e in mgr.step(t0):
            if e.action == "resynthesis":
                started.add(e.comm)
            elif e.action in ("published", "aborted", "failed", "timeout"):
                done[e.comm] = (e.action, time.perf_counter() - t_fail)
                synth.append(e.detail.get("synth_s", float("nan")))
        turns.append(time.perf_counter() - t0)
        if not mgr.busy():
            break
        time.sleep(0.002)
    mgr.close()
    degraded, gap = topo.with_capacities(m), 0.0
    for coll in mgr.collectives():
        if coll.version > 1:
            on = induced(degraded, coll.gpus).topology
            mo.validate(on, coll.schedule)
            cold = (mo.solve_allgather if coll.kind == "allgather" else mo.solve_alltoall)(on)
            gap = max(gap, abs(coll.schedule.lp_rate_gbps / cold.lp_rate_gbps - 1.0))
    swapped = sorted(c for c, (a, _) in done.items() if a == "published")
    return {"mode": mode, "event": event, "comms": len(groups), "gpus": topo.num_gpus,
            "holding": len(holding), "resynthesized": len(started), "swapped": len(swapped),
            "swapped_names": ",".join(swapped),
            "touched_outside": len(started - set(holding)),
            "all_swapped_s": max((t for _, t in done.values()), default=0.0),
            "job_s_median": float(np.nanmedian(synth)) if synth else float("nan"),
            "turn_ms_p50": 1e3 * float(np.median(turns)), "turn_ms_max": 1e3 * float(np.max(turns)),
            "lp_vs_cold": gap}


def groups_main(a) -> list[dict]:
    import mccl_opt as mo
    from instances import parse_shape
    from mccl_opt.subfabric import induced
    from mccl_opt.tables import print_table
    from mccl_runtime.warmup import load_kernels

    load_kernels()
    topo = hpn(*parse_shape(a.swap_shape))
    groups = job_groups(topo, a.ep_hosts) if a.layout == "job" else overlapping_groups(topo, a.comms, a.ep_hosts)
    t0 = time.perf_counter()
    healthy = {c: (mo.solve_allgather if k == "allgather" else mo.solve_alltoall)(induced(topo, g).topology)
               for c, (k, g) in groups.items()}
    print(f"{len(groups)} communicators on {topo.name}: healthy schedules in {time.perf_counter() - t0:.2f} s",
          flush=True)
    rows = []
    for event in a.event.split(","):
        for mode in a.modes.split(","):
            rows.append(measure_groups(topo, groups, healthy, event, mode))
            print(rows[-1], flush=True)
    print_table(["event", "mode", "communicators", "GPUs", "sub-fabric holds a link", "re-synthesized",
                 "swapped", "touched outside", "all swapped s", "job s (median)", "turn ms p50", "turn ms max",
                 "LP vs cold"],
                [[r["event"], r["mode"], r["comms"], r["gpus"], r["holding"], r["resynthesized"], r["swapped"],
                  r["touched_outside"], r["all_swapped_s"], r["job_s_median"], r["turn_ms_p50"],
                  r["turn_ms_max"], r["lp_vs_cold"]] for r in rows])
    print(f"load average {os.getloadavg()}")
    return rows


def swap_main(a) -> list[dict]:
    import mccl_opt as mo
    from instances import parse_shape
    from mccl_opt.tables import print_table
    from mccl_runtime.warmup import load_kernels

    load_kernels()
    topo = hpn(*parse_shape(a.swap_shape))
    healthy = {"allgather": mo.solve_allgather(topo), "alltoall": mo.solve_alltoall(topo)}
    rows = []
    for mode in a.modes.split(","):
        rows.append(measure_swap(a.swap_shape, a.comms, mode, healthy))
        print(rows[-1], flush=True)
    print_table(["mode", "communicators", "GPUs", "swapped", "outcomes", "first done s", "all swapped s",
                 "job s (median)", "turn ms p50", "turn ms max", "pool start s"],
                [[r["mode"], r["comms"], r["gpus"], r["swapped"], r["outcomes"], r["first_s"], r["all_swapped_s"],
                  r["job_s_median"], r["turn_ms_p50"], r["turn_ms_max"], r["pool_start_s"]] for r in rows])
    print(f"load average {os.getloadavg()}")
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    from mccl_opt.tables import print_table

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--swap", action="store_true", help="Fail2 on many communicators at once (module docstring)")
    p.add_argument("--groups", action="store_true",
                   help="TP, DP and EP communicators over sub-fabrics, one event (module docstring)")
    p.add_argument("--event", default="fail2", help="--groups: fail2 and/or tor, comma separated")
    p.add_argument("--ep-hosts", type=int, default=2,
                   help="--groups: hosts per expert-parallel group (--layout overlap: per communicator)")
    p.add_argument("--layout", choices=["job", "overlap"], default="job",
                   help="--groups: a job's TP/DP/EP groups, or --comms communicators that all hold host 0")
    p.add_argument("--swap-shape", default="1x8x8")
    p.add_argument("--comms", type=int, default=64)
    p.add_argument("--modes", default="thread,pool1,pool2")
    p.add_argument("--gpus", default="512,2048", help=f"comma separated, from {sorted(SHAPES)}")
    p.add_argument("--copies", type=int, default=1, help="communicators the ring AllGather is registered under")
    p.add_argument("--estimators", default="ewma,level")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--pairs", action="store_true", help="add one pair sample per same-rail GPU pair")
    p.add_argument("--early", type=float, default=0.0,
                   help="the fraction of pair samples that carry an early drop (the EWMA speculation path, "
                        "module docstring; implies --pairs and --estimators ewma)")
    p.add_argument("--direct", action="store_true", help="--early: a link sample on every link too (none pending)")
    p.add_argument("--job-groups", action="store_true",
                   help="register the --groups communicators (NCCL-style baselines of their sub-fabrics) "
                        "instead of --copies whole-fabric ring AllGathers")
    a = p.parse_args(argv)
    if a.swap:
        return swap_main(a)
    if a.groups:
        return groups_main(a)
    rows = []
    for gpus in (int(x) for x in a.gpus.split(",")):
        if gpus not in SHAPES:
            p.error(f"no HPN shape for {gpus} GPUs; choose from {sorted(SHAPES)}")
        topo, schedule = setup(gpus)
        batches = make_batches(topo, a.rounds, a.pairs, early=a.early, direct=a.direct)
        regs = job_baselines(topo, a.ep_hosts) if a.job_groups else [
            (f"comm{c}", "allgather", schedule, None) for c in range(a.copies)]
        for est in ("ewma",) if a.early else a.estimators.split(","):
            rows.append(measure(topo, regs, est, batches, early=a.early > 0))
            print(rows[-1], flush=True)
    print_table(["GPUs", "links", "samples", "estimator", "collectives", "register ms/coll", "ingest ms",
                 "check ms", "decision ms (median)", "worst ms", "us/sample"],
                [[r["gpus"], r["links"], r["samples"], r["estimator"], r["collectives"], r["register_ms"],
                  r["ingest_ms"], r["check_ms"], r["decision_ms"], r["worst_ms"], r["us_per_sample"]] for r in rows])
    print(f"load average {os.getloadavg()}")
    return rows


if __name__ == "__main__":
    main()
