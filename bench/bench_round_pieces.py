"""The round model in pieces against the packet simulator (issue 26; docs/executor.md "The
round model in pieces").

    python bench/bench_round_pieces.py [--fabrics 10] [--survey 12]

For every state, the candidates the round-aware pick chooses from, each estimated three
ways on the fabric the pick sees: ``one`` = :func:`mccl_opt.lowering.rounds.round_time` with
one piece per chunk (the model before the piece rule), ``rule`` = the same with the pieces
of :mod:`mccl_opt.piece_rule` at the message size, ``sim`` = the packet simulator
(:func:`mccl_opt.sim.simulate`, its default pieces).  Times in ms for one collective;
``pick`` is the candidate each estimate chooses (the lowest among those of the warm rate,
ties keep the earlier), ``sim/pick`` the simulated time of that pick over the simulated best.
``sw ms`` is the simulator with every GPU-to-GPU hop on its switch-only path, the routing
of the round model (and of the emulated executor); on HPN that is the schedule's own path.
Last, for AllToAll: the pick with the real ranks' cut (``executor_cuda.scenario_run.rank_pipeline``
at its default 60 ms collective) against the one-piece pick, both timed in the ranks' model.

* AllToAll, HPN 1x2x4, ``bench_round_aware.py``'s states (GPU0's NIC at 4 / 50 Gbps, 10 %
  of the other links 0-15 % low), 16 MiB per block (the loop's 128 MiB in all): warm, warm
  with the smallest step bound, cold with it, cold (``_round_aware_alltoall``'s candidates);
* AllGather, 16 MiB per GPU: HPN 1x2x4 / 1x2x8 with GPU0's NIC at 4 / 50 / 100 Gbps, warm
  from the healthy forest and cold (the ``--shallow-trees`` AllGather candidates);
  ``bench_equal_rate_sim.py``'s case (fuzz seed 2 #17, the loop's initial forest and the
  offline one) and ``--survey`` irregular fabrics with one link at 50 % (the default forest
  against the exact one).  On irregular fabrics the round model routes each GPU pair on its
  switch-only path (the emulated executor's routing), the simulator on the tree's own path.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MIB = 2**20


def on_switch_paths(schedule: Any, topo: Any) -> Any:
    """``schedule`` with every GPU-to-GPU hop on its switch-only path."""
    from mccl_opt.paths import switch_path
    from mccl_opt.schedule import PathChunk, TreeChunk

    def route(u: str, v: str) -> tuple[str, ...]:
        return (u, *(topo.links[i].dst for i in switch_path(topo, topo.node_index(u), topo.node_index(v))))

    chunks = []
    for c in schedule.chunks:
        if isinstance(c, TreeChunk):
            chunks.append(TreeChunk(c.src, c.share, tuple(route(e[0], e[-1]) for e in c.edges)))
        else:
            gpus = [v for v in c.path if topo.is_gpu(v)]
            chunks.append(PathChunk(c.src, c.dst, c.share,
                                    (gpus[0], *(x for u, v in zip(gpus, gpus[1:]) for x in route(u, v)[1:]))))
    return dataclasses.replace(schedule, chunks=tuple(chunks))


def estimates(topo: Any, cands: list[Any], message: float) -> dict[str, list[float]]:
    """ms of one collective of every candidate: one piece per chunk, the rule, the simulator
    (on the schedule's paths, and on switch-only paths)."""
    from mccl_opt.lowering.rounds import RoundPieces, round_time
    from mccl_opt.sim import simulate

    return {"one": [1e3 * message * round_time(c, topo) for c in cands],
            "rule": [1e3 * round_time(c, topo, pieces=RoundPieces(message)) for c in cands],
            "sim": [1e3 * simulate(topo, c, message).completion_s for c in cands],
            "sw": [1e3 * simulate(topo, on_switch_paths(c, topo), message).completion_s for c in cands]}


def ranks_cut(topo: Any, cands: list[Any], message: float) -> tuple[bool, float]:
    """Whether the pick with the real ranks' pieces differs from the one-piece pick, and
    the one-piece pick's time over the ranks' pick's, both in the ranks' round model."""
    from executor_cuda.scenario_run import GlooLoopConfig, rank_pipeline
    from mccl_opt.lowering.rounds import RoundPieces, round_time

    cut = RoundPieces(message, rank_pipeline(GlooLoopConfig(), message, 1.0))
    rates = [c.rate_gbps for c in cands]
    one = pick([round_time(c, topo) for c in cands], rates)
    times = [round_time(c, topo, pieces=cut) for c in cands]
    mine = pick(times, rates)
    return one != mine, times[one] / times[mine]


def pick(times: list[float], rates: list[float]) -> int:
    """The round-aware pick's rule: the lowest time among candidates of the first one's rate."""
    best = 0
    for i in range(1, len(times)):
        if rates[i] >= rates[best] * (1 - 1e-9) and times[i] < times[best] * (1 - 1e-6):
            best = i
    return best


def alltoall_states(fabrics: int) -> list[tuple[str, Any, list[Any], float]]:
    import mccl_opt
    from bench.bench_round_aware import TOPO, measured

    healthy = mccl_opt.solve_alltoall(TOPO, max_chunks=10)
    out = []
    for gbps in (4.0, 50.0):
        for seed in range(fabrics):
            t = TOPO.with_capacities(measured(gbps, seed))
            cands = [mccl_opt.solve_alltoall(t, warm=w, max_chunks=10, max_steps=s)
                     for w, s in ((healthy, None), (healthy, "min"), (None, "min"), (None, None))]
            out.append((f"a2a NIC {gbps:g} s{seed}", t, cands, 128 * MIB / TOPO.num_gpus))
    return out


def allgather_states(survey: int) -> list[tuple[str, Any, list[Any], float]]:
    import mccl_opt
    from instances import hpn, irregular

    out = []
    for shape in ((1, 2, 4), (1, 2, 8)):
        topo = hpn(*shape)
        warm = mccl_opt.solve_allgather(topo)
        for gbps in (4.0, 50.0, 100.0):
            cap = topo.arrays.capacity.astype(float).copy()
            for a, b in (("s0h0g0", "s0tor0"), ("s0tor0", "s0h0g0")):
                cap[topo.link_index(a, b)] = gbps
            t = topo.with_capacities(cap)
            out.append((f"ag {topo.name} NIC {gbps:g}", t,
                        [mccl_opt.solve_allgather(t, warm=warm), mccl_opt.solve_allgather(t)], 16.0 * MIB))
    healthy = irregular(6173)
    degraded = healthy.with_capacities([37.766337230692294 if (l.src, l.dst) == ("h0g1", "spine")
                                        else l.capacity_gbps for l in healthy.links])
    out += [("ag fuzz 2 #17", degraded, [mccl_opt.solve_allgather(healthy), mccl_opt.solve_allgather(degraded)],
            16.0 * MIB)]
    rng = np.random.default_rng(1)
    for seed in range(survey):
        topo = irregular(seed)
        if topo.num_gpus < 3:
            continue
        cap = topo.arrays.capacity.copy()
        cap[int(rng.integers(cap.size))] *= 0.5
        t = topo.with_capacities(cap)
        try:
            cands = [mccl_opt.solve_allgather(t), mccl_opt.solve_allgather(t, max_chunks=None)]
        except mccl_opt.MCCLError:
            continue
        out.append((f"ag irregular({seed})", t, cands, 16.0 * MIB))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fabrics", type=int, default=10, help="AllToAll noisy fabrics per NIC level")
    ap.add_argument("--survey", type=int, default=12, help="irregular AllGather fabrics (seeds 0..N-1)")
    args = ap.parse_args(argv)
    print(f"{'state':22s} {'cand':>4s} {'rate':>7s} {'one ms':>8s} {'rule ms':>8s} {'sim ms':>8s} {'sw ms':>8s} "
          f"{'one/sim':>7s} {'rule/sim':>8s} {'rule/sw':>8s}")
    from mccl_opt.lowering.rounds import RoundPieces, round_time

    ratios: list[tuple[str, str, float]] = []               # group, model, estimate / simulated
    picks: list[tuple[str, str, bool, float]] = []          # group, model, the simulator's pick?, its regret
    cpu: dict[str, float] = {"one": 0.0, "rule": 0.0}
    ranks: list[tuple[bool, float]] = []                    # AllToAll: pick moved?, one-piece pick / ranks' pick
    states = alltoall_states(args.fabrics) + allgather_states(args.survey)
    for name, topo, cands, message in states:
        group = name.split(" ")[0] + (" irregular" if "irregular" in name or "fuzz" in name else " hpn")
        est = estimates(topo, cands, message)
        rates = [c.rate_gbps for c in cands]
        for i, c in enumerate(cands):
            print(f"{name:22s} {i:4d} {c.rate_gbps:7.2f} {est['one'][i]:8.3f} {est['rule'][i]:8.3f} "
                  f"{est['sim'][i]:8.3f} {est['sw'][i]:8.3f} {est['one'][i] / est['sim'][i]:7.3f} "
                  f"{est['rule'][i] / est['sim'][i]:8.3f} {est['rule'][i] / est['sw'][i]:8.3f}")
        best = pick(est["sim"], rates)
        line = []
        for k in ("one", "rule"):
            p = pick(est[k], rates)
            ratios += [(group, k, e / s) for e, s in zip(est[k], est["sim"])]
            ratios += [(group, k + "/sw", e / s) for e, s in zip(est[k], est["sw"])]
            picks.append((group, k, p == best, est["sim"][p] / est["sim"][best]))
            line.append(f"{k} picks {p} (sim/pick {est['sim'][p] / est['sim'][best]:.3f})")
            c0 = time.process_time()
            for c in cands:
                round_time(c, topo, pieces=None if k == "one" else RoundPieces(message))
            cpu[k] += time.process_time() - c0
        print(f"{'':22s} sim picks {best}; " + "; ".join(line))
        if name.startswith("a2a"):
            ranks.append(ranks_cut(topo, cands, message))
    for group in dict.fromkeys(r[0] for r in picks):
        for k in ("one", "rule"):
            e = np.asarray([r[2] for r in ratios if r[:2] == (group, k)])
            mine = [r for r in picks if r[:2] == (group, k)]
            regret = [r[3] for r in mine]
            sw = np.asarray([r[2] for r in ratios if r[:2] == (group, k + "/sw")])
            print(f"{group:13s} {k:4s}: estimate/sim median {np.median(e):.3f}, range {e.min():.3f}-{e.max():.3f} "
                  f"(on switch paths {np.median(sw):.3f}, {sw.min():.3f}-{sw.max():.3f}); "
                  f"the simulator's pick in {sum(r[2] for r in mine)} of {len(mine)} states; its pick's "
                  f"simulated time over the best: geometric mean {math.exp(np.mean(np.log(regret))):.4f}, "
                  f"worst {max(regret):.3f}")
    if ranks:
        slower = [r for moved, r in ranks if r > 1 + 1e-9]
        print(f"AllToAll, the ranks' cut: the pick moves on {sum(m for m, _ in ranks)} of {len(ranks)} states; in "
              f"the ranks' model the one-piece pick is slower on {len(slower)}"
              + (f" ({min(slower):.3f}-{max(slower):.3f}x)" if slower else "")
              + f", geometric mean over all {math.exp(np.mean(np.log([r for _, r in ranks]))):.4f}")
    for k in ("one", "rule"):
        print(f"{k}: model CPU {1e3 * cpu[k] / sum(len(s[2]) for s in states):.2f} ms per candidate")


if __name__ == "__main__":
    main()
