"""Re-time one state of an AllGather family-chain fuzz run, alone: cold and warm, CPU s.

    python bench/replay_allgather_state.py --seed 3525 --scramble --steps 2 \\
        --state railhosts-2x8x8-n400-200-400-200-400-200-400-200-scrambled374682085:None:0 \\
        [--repeat 3] [--profile]

``--state NAME:K:STEP`` names a state the way ``bench/fuzz_allgather.py --families``
prints it (the fabric's name, scrambled suffix included, or a prefix that is unique; the
budget ``10`` or ``None``; the step of the chain).  ``--seed``, ``--scramble`` and
``--steps`` must be the fuzz run's (with ``--family-chains 1``), and ``--families`` where
it named some (e.g. ``--families dragonfly``): the chains are drawn again from the same
random stream, the families in the same order.  Each repeat solves the
state cold and warm from the chain's previous schedule; ``--profile`` adds a cProfile of
``--profile-n`` cold solves (cumulative, 60 lines).  Every schedule is validated
(``mccl_opt.validate``); an invalid one is printed as ``INVALID: why``.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time

import numpy as np

import mccl_opt as mo
from bench.allgather_chains import FAMILIES, events
from instances import hpn
from instances.aggregation import scrambled
from mccl_runtime.warmup import load_kernels

Chain = tuple[mo.Topology, list[tuple[str, mo.Topology]]]


def draw_chains(seed: int, scramble: bool, steps: int, budgets: list[str],
                families: list[str] | None = None) -> dict[tuple[str, str], Chain]:
    """Every family's chain per budget, drawn in the fuzz's order from ``seed``:
    ``families`` as the fuzz run's ``--families`` named them (all when ``None``)."""
    rng = np.random.default_rng(seed)
    chains: dict[tuple[str, str], Chain] = {}
    for family in families or FAMILIES:
        for make in FAMILIES[family]:
            base = make()
            if scramble:
                base = scrambled(base, int(rng.integers(1 << 30)))
            for budget in budgets:
                chains[(base.name, budget)] = (base, list(events(base, rng, steps)))
    return chains


def find(chains: dict[tuple[str, str], Chain], name: str, budget: str) -> tuple[str, Chain]:
    """The chain named ``name`` (exactly, else as a unique ``name-`` prefix) at ``budget``."""
    keys = [k for k in chains if k == (name, budget)] or \
        [k for k in chains if k[0].startswith(name + "-") and k[1] == budget]
    if len(keys) != 1:
        near = sorted({k[0] for k in chains if k[0].startswith(name.split("-")[0])})
        sys.exit(f"--state {name}:{budget}: {len(keys)} chains match; candidates: {near}")
    return keys[0][0], chains[keys[0]]


def replay(name: str, chain: Chain, budget: str, step: int, repeat: int) -> tuple[mo.Topology, int | None]:
    """Solve the chain up to ``step`` warm, then time the state cold and warm ``repeat`` times."""
    base, states = chain
    if not 0 <= step < len(states):
        sys.exit(f"step {step} is outside the chain's {len(states)} steps (--steps)")
    k = None if budget == "None" else int(budget)
    prev = mo.solve_allgather(base, max_chunks=k)
    for _, topo in states[:step]:
        prev = mo.solve_allgather(topo, warm=prev, max_chunks=k)
    kind, topo = states[step]
    print(f"{name} K={budget} step {step} ({kind}) gpus {topo.num_gpus}", flush=True)
    for _ in range(repeat):
        t0 = time.process_time()
        cold = mo.solve_allgather(topo, max_chunks=k)
        t1 = time.process_time()
        warm = mo.solve_allgather(topo, warm=prev, max_chunks=k)
        t2 = time.process_time()
        print(f"  cold {t1 - t0:.3f} ({cold.report.method.value}, {len(cold.chunks)} ch, "
              f"{cold.rate_gbps:.6f}{_invalid(topo, cold)})  warm {t2 - t1:.3f} "
              f"({warm.report.warm.value}, {warm.report.method.value}, {len(warm.chunks)} ch, "
              f"{warm.rate_gbps:.6f}{_invalid(topo, warm)})", flush=True)
    return topo, k


def _invalid(topo: mo.Topology, sched: mo.Schedule) -> str:
    """``""`` if ``sched`` is a valid schedule of ``topo`` at its stated rate, else why not
    (the fuzz's check: seed 3533 found a warm schedule kept at a rate its chunks missed)."""
    try:
        mo.validate(topo, sched)
    except mo.MCCLError as e:
        return f", INVALID: {' '.join(str(e).split())}"
    return ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--scramble", action="store_true")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--state", nargs="+", required=True, help="NAME:K:STEP")
    ap.add_argument("--budgets", nargs="+", default=["10", "None"], help="the fuzz run's budgets")
    ap.add_argument("--families", nargs="+", choices=list(FAMILIES),
                    help="the fuzz run's --families (default: all)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--profile-n", type=int, default=5)
    a = ap.parse_args()
    chains = draw_chains(a.seed, a.scramble, a.steps, a.budgets, a.families)
    load_kernels(collectives=("allgather",))
    mo.solve_allgather(hpn(1, 2, 4), max_chunks=None)
    for state in a.state:
        name, budget, step = state.rsplit(":", 2)
        full, chain = find(chains, name, budget)
        topo, k = replay(full, chain, budget, int(step), a.repeat)
        if a.profile:
            prof = cProfile.Profile(time.process_time)
            prof.enable()
            for _ in range(a.profile_n):
                mo.solve_allgather(topo, max_chunks=k)
            prof.disable()
            pstats.Stats(prof).sort_stats("cumulative").print_stats(60)


if __name__ == "__main__":
    main()
