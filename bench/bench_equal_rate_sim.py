"""Equal-rate AllGather forests that simulate apart (issue 26, fuzz_loop seed 2 #17;
docs/runtime.md "Equal-rate forests and pipeline fill").

    python bench/bench_equal_rate_sim.py                  # the case, then 40 irregular fabrics
    python bench/bench_equal_rate_sim.py --survey 0       # the case only

Part 1: fuzz seed 2 #17's fabric (``instances.irregular(6173)``) healthy and with
``h0g1 -> spine`` at 37.77 Gbps (its first event): the loop's initial schedule and the offline
one of the degraded fabric, both at 360 Gbps (fluid), simulated on the degraded fabric with
pieces of 2 MiB ... 32 KiB, with the piece rule (``rule``, :mod:`mccl_opt.piece_rule`, the
simulator's default), in fluid mode, and their deepest tree's pieces (of 512 KiB).

Part 2 (``--survey N``): on ``irregular(0..N-1)`` healthy and with one random link at 50 % /
12.5 %, the default forest (``max_chunks=10``) against the exact one (``None``), simulated
with fixed 512 KiB pieces (``fixed``, the simulator's default before the rule) and with the
rule: where their times differ by more than 1 %, how often the higher fluid rate, and a
static pipeline-fill estimate (per chunk ``(depth - 1) / pieces``, share-weighted), name the
faster one (fixed pieces); both forests' GB/s with fixed pieces and with the rule over all
states (geometric mean of rule / fixed, and the worst); and what one packet simulation
costs next to one solve (CPU ms, best of 3, with the rule).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MSG = 16 * 2**20            # bytes per GPU, as the loop's AllGather scenarios
SLICE = 512 * 1024          # the simulator's default piece (NCCL Simple slice)


def fill(schedule: Any) -> float:
    """Share-weighted ``(depth - 1) / pieces`` over the chunks: the relay fill a chunk of
    ``pieces`` 512 KiB pieces pays on a ``depth``-hop tree, over its fluid time."""
    tot = sum(c.share for c in schedule.chunks)
    return sum(c.share * (max(c.depths().values()) - 1) / math.ceil(c.share * MSG / SLICE)
               for c in schedule.chunks) / tot


def deepest(schedule: Any) -> str:
    """``depth x pieces`` of the deepest trees (the fewest pieces among them)."""
    d = max(max(c.depths().values()) for c in schedule.chunks)
    n = min(math.ceil(c.share * MSG / SLICE) for c in schedule.chunks if max(c.depths().values()) == d)
    return f"{d} x {n}"


def best_cpu_ms(fn: Callable[[], Any], repeats: int = 3) -> float:
    out = math.inf
    for _ in range(repeats):
        c = time.process_time()
        fn()
        out = min(out, time.process_time() - c)
    return 1e3 * out


def the_case() -> None:
    from instances import irregular
    from mccl_opt.sim import simulate
    from mccl_runtime.synthesizer import solver_synthesizer

    syn = solver_synthesizer()
    healthy = irregular(6173)
    degraded = healthy.with_capacities([37.766337230692294 if (l.src, l.dst) == ("h0g1", "spine")
                                        else l.capacity_gbps for l in healthy.links])
    init, off = syn("allgather", healthy, None, None), syn("allgather", degraded, None, None)
    print("fuzz seed 2 #17, irregular(6173), h0g1 -> spine at 37.77; simulated on that fabric, GB/s")
    print(f"{'schedule':10s} {'rate':>7s} {'chunks':>6s} {'deepest':>8s} {'fill':>6s}  " +
          " ".join(f"{s // 1024:>6d}K" for s in (2**21, 2**20, 2**19, 2**18, 2**17, 2**16, 2**15)) + "    rule   fluid")
    for name, s in (("initial", init), ("offline", off)):
        cells = [simulate(degraded, s, MSG, slice_bytes=sb).algbw_gbytes_per_s
                 for sb in (2**21, 2**20, 2**19, 2**18, 2**17, 2**16, 2**15)]
        cells.append(simulate(degraded, s, MSG).algbw_gbytes_per_s)
        fl = simulate(degraded, s, MSG, fluid=True).algbw_gbytes_per_s
        print(f"{name:10s} {s.rate_gbps:7.2f} {len(s.chunks):6d} {deepest(s):>8s} {fill(s):6.3f}  " +
              " ".join(f"{c:7.1f}" for c in cells) + f" {fl:7.1f}")


def survey(n: int) -> None:
    import mccl_opt
    from instances import irregular
    from mccl_opt.sim import simulate

    rng = np.random.default_rng(1)
    right = {"rate": 0, "fill": 0}
    pairs, rule_pairs, sim_ms = 0, 0, []
    gain: dict[str, list[float]] = {"default": [], "exact": []}       # rule / fixed GB/s per state
    for seed in range(n):
        topo = irregular(seed)
        if topo.num_gpus < 3:
            continue
        for variant in range(3):
            cap = topo.arrays.capacity.copy()
            if variant:
                cap[int(rng.integers(cap.size))] *= (0.5, 0.125)[variant - 1]
            t = topo.with_capacities(cap)
            try:
                a, b = mccl_opt.solve_allgather(t), mccl_opt.solve_allgather(t, max_chunks=None)
            except mccl_opt.MCCLError:
                continue
            ta, tb = (simulate(t, x, MSG, slice_bytes=SLICE).completion_s for x in (a, b))
            ra, rb = simulate(t, a, MSG).completion_s, simulate(t, b, MSG).completion_s
            gain["default"].append(ta / ra)
            gain["exact"].append(tb / rb)
            rule_pairs += abs(ra / rb - 1) >= 0.01
            if variant == 0 and seed % 10 == 7:
                sim_ms.append((t.num_gpus, best_cpu_ms(lambda: simulate(t, a, MSG)),
                               best_cpu_ms(lambda: mccl_opt.solve_allgather(t))))
            if abs(ta / tb - 1) < 0.01:
                continue
            pairs += 1
            faster_b = tb < ta
            right["rate"] += (b.rate_gbps > a.rate_gbps * (1 + 1e-9)) == faster_b
            right["fill"] += ((1 + fill(b)) / b.rate_gbps < (1 + fill(a)) / a.rate_gbps) == faster_b
            print(f"  irregular({seed}) variant {variant}: exact/default simulated time {tb / ta:.3f} "
                  f"(rule: {rb / ra:.3f}), rate {b.rate_gbps / a.rate_gbps:.3f}, fill estimate "
                  f"{(1 + fill(b)) / b.rate_gbps / ((1 + fill(a)) / a.rate_gbps):.3f}")
    print(f"pairs simulating > 1 % apart: {pairs} with 512 KiB pieces, {rule_pairs} with the rule; faster one "
          f"(512 KiB) named by the fluid rate: {right['rate']}, by the fill estimate: {right['fill']}")
    for name, g in gain.items():
        if g:
            print(f"  {name} forest, {len(g)} states: rule / 512 KiB GB/s geometric mean "
                  f"{math.exp(np.mean(np.log(g))):.3f}, min {min(g):.3f}, max {max(g):.3f}, "
                  f"states > 1 % faster {sum(x > 1.01 for x in g)}, > 1 % slower {sum(x < 0.99 for x in g)}")
    for gpus, s, v in sim_ms:
        print(f"  {gpus} GPUs: packet simulation {s:.1f} ms CPU, solve {v:.1f} ms CPU (best of 3)")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--survey", type=int, default=40, help="irregular fabric seeds 0..N-1 (0: none)")
    args = ap.parse_args(argv)
    the_case()
    if args.survey:
        survey(args.survey)


if __name__ == "__main__":
    main()
