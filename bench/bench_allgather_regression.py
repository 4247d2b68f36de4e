"""AllGather regression states of a family-chain fuzz run: method, rate, chunks and CPU s.

    PYTHONPATH=$PWD python bench/bench_allgather_regression.py [--set twelve] \\
        [--repeat 2] [--warm] [--save base.json | --compare base.json]

The states are rebuilt from the fuzz's seed with its own chain drawing
(:func:`bench.replay_allgather_state.draw_chains`, the events of
:mod:`bench.allgather_chains`), so no pickle is needed: ``--seed 3413 --scramble
--steps 3`` (the defaults) are the fuzz run ``python bench/fuzz_allgather.py --random 0
--chains 0 --families --family-chains 1 --steps 3 --scramble --seed 3413``.  Sets:

* ``twelve`` (default): HPN 2x8x8, shared aggregation 2x5x8, leaf-spine 4x2x8 and
  SuperPOD 2x4x8 at ``max_chunks=None``, steps 0-2 (docs/allgather_history.md calls it
  seed 3413's ``tstates.py`` states; the script itself was not kept, this is its set as
  the docs describe it);
* ``seven-families``: every state of the seven first families (hpn, shared-agg,
  multi-spine, leaf-spine, superpod, host-ring, host-torus: 17 fabrics x 2 budgets x 3
  steps = the docs' "102 states of fuzz seed 3413");
* ``all``: every state of every family (``--families`` narrows it);
* ``--state NAME:K:STEP ...`` instead names states as ``bench/fuzz_allgather.py`` prints them.

Each state is solved cold ``--repeat`` times (best CPU s kept; kernels loaded first, as
after ``mccl warmup``); ``--warm`` also solves it warm from the chain's previous warm
schedule, once.  ``--save FILE`` writes the table as JSON; ``--compare FILE`` checks
it against such a file: a different cold method, chunk count, termination or rate
(beyond 1e-9 relative) is a regression (exit status 1); different trees at the same
rate and CPU ratios are printed, not judged (warm answers depend on a time cap).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from typing import Any

import mccl_opt as mo
from bench.allgather_chains import FAMILIES
from bench.replay_allgather_state import Chain, draw_chains, find
from instances import hpn
from mccl_runtime.warmup import load_kernels

#: the ``twelve`` set: fabric name prefixes (of the scrambled seed-3413 chains) at ``None``
TWELVE = ("hpn-2x8x8", "sharedagg-2x5x8", "leafspine2-4x2x8", "superpod-2x4x8")
SEVEN_FAMILIES = ("hpn", "shared-agg", "multi-spine", "leaf-spine", "superpod", "host-ring",
                  "host-torus")
#: a cold rate further than this (relative) from the baseline's is a regression
RATE_TOL = 1e-9


def trees_digest(sched: mo.Schedule) -> str:
    """A short hash of the schedule's chunks (sources, shares, edges), timings left out."""
    text = json.dumps([c.to_dict() for c in sched.chunks], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def row_of(sched: mo.Schedule, cpu: float) -> dict[str, Any]:
    """What the table and the JSON keep of one solve."""
    return {"method": sched.report.method.value, "termination": sched.report.termination.value,
            "rate_gbps": sched.rate_gbps, "lp_rate_gbps": sched.lp_rate_gbps,
            "chunks": len(sched.chunks), "trees": trees_digest(sched), "cpu_s": round(cpu, 4),
            "route": sched.stats.get("warm_route", "cold")}


def selected(chains: dict[tuple[str, str], Chain], which: str, states: list[str] | None
             ) -> list[tuple[str, str, int]]:
    """``(fabric name, budget, step)`` of every state of the set ``which`` (or ``states``)."""
    if states:
        out = []
        for state in states:
            name, budget, step = state.rsplit(":", 2)
            full = find(chains, name, budget)[0]
            if not step.isdigit() or int(step) >= len(chains[(full, budget)][1]):
                sys.exit(f"--state {state}: the step must be 0-{len(chains[(full, budget)][1]) - 1}"
                         " (--steps)")
            out.append((full, budget, int(step)))
        return out
    keys = list(chains)
    if which == "twelve":
        keys = [find(chains, prefix, "None")[0] for prefix in TWELVE]
        keys = [(name, "None") for name in keys]
    return [(name, budget, step) for name, budget in keys
            for step in range(len(chains[(name, budget)][1]))]


def solve_states(chains: dict[tuple[str, str], Chain], todo: list[tuple[str, str, int]],
                 repeat: int, warm: bool) -> dict[str, dict[str, Any]]:
    """Every state of ``todo`` cold (best of ``repeat``) and, with ``warm``, warm once from
    the chain's previous warm schedule (the fuzz's chain: each step warm from the last)."""
    rows: dict[str, dict[str, Any]] = {}
    wanted: dict[tuple[str, str], set[int]] = {}
    for name, budget, step in todo:
        wanted.setdefault((name, budget), set()).add(step)
    for (name, budget), steps in wanted.items():
        base, states = chains[(name, budget)]
        k = None if budget == "None" else int(budget)
        prev = mo.solve_allgather(base, max_chunks=k) if warm else None
        for step, (kind, topo) in enumerate(states[:max(steps) + 1]):
            row = None
            if step in steps:
                best = None
                for _ in range(repeat):
                    t = time.process_time()
                    cold = mo.solve_allgather(topo, max_chunks=k)
                    cpu = time.process_time() - t
                    if best is None or cpu < best[1]:
                        best = (cold, cpu)
                row = {"gpus": topo.num_gpus, "event": kind, **row_of(*best)}
                rows[f"{name}:{budget}:{step}"] = row
            if warm:                                  # the chain goes on from the warm one
                t = time.process_time()
                prev = mo.solve_allgather(topo, warm=prev, max_chunks=k)
                if row is not None:
                    row["warm"] = row_of(prev, time.process_time() - t)
            if row is not None:
                print_row(f"{name}:{budget}:{step}", row)
    return rows


def print_row(state: str, row: dict[str, Any]) -> None:
    """One line of the table: state, cold method, rate, chunks, CPU s (and the warm solve)."""
    warm = row.get("warm")
    tail = "" if warm is None else \
        f"  warm {warm['route']:8} {warm['method']:22} {warm['chunks']:>6} {warm['cpu_s']:7.3f}"
    print(f"{state:58} {row['method']:22} {row['rate_gbps']:12.6f} {row['chunks']:>6} "
          f"{row['cpu_s']:7.3f}{tail}", flush=True)


def compare(rows: dict[str, dict[str, Any]], base: dict[str, dict[str, Any]]) -> list[str]:
    """Regressions of ``rows`` against ``base`` (cold answers only), and notes printed."""
    bad = []
    both = [s for s in rows if s in base]
    for state in both:
        new, old = rows[state], base[state]
        diffs = [f"{key} {old[key]} -> {new[key]}" for key in ("method", "termination", "chunks")
                 if new[key] != old[key]]
        if abs(new["rate_gbps"] - old["rate_gbps"]) > RATE_TOL * old["rate_gbps"]:
            diffs.append(f"rate {old['rate_gbps']:.9g} -> {new['rate_gbps']:.9g}")
        if diffs:
            bad.append(f"{state}: {', '.join(diffs)}")
        elif new["trees"] != old["trees"]:
            print(f"  note {state}: other trees at the same rate, method and chunk count")
        if "warm" in new and "warm" in old and \
                (new["warm"]["rate_gbps"], new["warm"]["route"]) != \
                (old["warm"]["rate_gbps"], old["warm"]["route"]):
            print(f"  note {state}: warm {old['warm']['route']} {old['warm']['rate_gbps']:.9g} "
                  f"-> {new['warm']['route']} {new['warm']['rate_gbps']:.9g}")
    missing = sorted(set(base) ^ set(rows))
    if missing:
        print(f"  note: {len(missing)} states in only one of the two runs, e.g. {missing[0]}")
    old_s = sum(base[s]["cpu_s"] for s in both)
    new_s = sum(rows[s]["cpu_s"] for s in both)
    print(f"cold CPU s summed over {len(both)} common states: base {old_s:.3f}, now {new_s:.3f}")
    return bad


def main(argv: list[str] | None = None) -> int:
    """The table of the chosen states; with ``--compare``, 1 when any regressed."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", choices=["twelve", "seven-families", "all"], default="twelve")
    ap.add_argument("--state", nargs="+", metavar="NAME:K:STEP", help="these states instead")
    ap.add_argument("--seed", type=int, default=3413)
    ap.add_argument("--no-scramble", action="store_true", help="the fuzz ran without --scramble")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--budgets", nargs="+", default=["10", "None"], help="the fuzz run's budgets")
    ap.add_argument("--families", nargs="+", choices=list(FAMILIES),
                    help="the fuzz run's --families (default: all)")
    ap.add_argument("--repeat", type=int, default=2, help="cold solves per state (best kept)")
    ap.add_argument("--warm", action="store_true", help="also one warm solve per state")
    ap.add_argument("--save", metavar="FILE", help="write the table as JSON")
    ap.add_argument("--compare", metavar="FILE", help="compare with a --save file")
    a = ap.parse_args(argv)
    if a.repeat < 1:
        ap.error("--repeat must be at least 1")
    if a.set != "all" and a.families:
        ap.error(f"--set {a.set} is drawn from a run over every family: use --set all")
    # the seven first families draw the same chains with or without the later ones
    families = a.families if a.set == "all" else list(SEVEN_FAMILIES)
    chains = draw_chains(a.seed, not a.no_scramble, a.steps, a.budgets, families)
    todo = selected(chains, a.set, a.state)
    load_kernels(collectives=("allgather",))
    mo.solve_allgather(hpn(1, 2, 4), max_chunks=None)
    print(f"{'state':58} {'method':22} {'rate Gbps':>12} {'chunks':>6} {'CPU s':>7}")
    rows = solve_states(chains, todo, a.repeat, a.warm)
    print(f"{len(rows)} states, cold CPU s summed (best of {a.repeat}): "
          f"{sum(r['cpu_s'] for r in rows.values()):.3f}")
    meta = {"seed": a.seed, "scramble": not a.no_scramble, "steps": a.steps,
            "budgets": a.budgets, "families": a.families}
    if a.save:
        with open(a.save, "w") as f:
            json.dump({"run": meta, "states": rows}, f, indent=1, sort_keys=True)
    if a.compare:
        with open(a.compare) as f:
            base = json.load(f)["states"]
        bad = compare(rows, base)
        print(f"regressions: {len(bad)}")
        for line in bad:
            print(f"  {line}")
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
