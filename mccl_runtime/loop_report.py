"""Figures, plot and CLI of the closed loop (``mccl loop``; docs/runtime.md).

Per scenario event (in the file's order), from the rows of :func:`.loop.run_loop`:

* ``algbw_before``: the last collective that ended before the event;
* ``algbw_degraded``: mean of the collectives after the event on the old schedule (for a
  dip: those it overlapped);
* ``algbw_after``: the first collective on the first version published for the event;
* ``algbw_final``: the last collective that ended before the next event (or the end);
* ``algbw_offline``: the schedule synthesized cold for the event's true fabric,
  simulated the same way; ``recovery_ratio = algbw_after / algbw_offline``;
* ``detect_ms`` / ``synth_ms`` / ``swap_ms`` / ``reaction_ms`` as in :mod:`.loop`;
* ``versions``: versions published between the event and the next one.

``false_swaps`` counts versions published before the first event or because of a dip.
"""

from __future__ import annotations

import argparse
import json
from typing import Any, TextIO

import numpy as np

__all__ = ["EVENT_KEYS", "summarize", "public_summary", "plot", "add_arguments", "main"]

EVENT_KEYS = ("t_ms", "kind", "detect_ms", "synth_ms", "swap_ms", "reaction_ms", "algbw_before",
              "algbw_degraded", "algbw_after", "algbw_final", "algbw_offline", "recovery_ratio", "versions")


def _offline(out: Any, cap: np.ndarray, synthesize: Any, fluid: bool) -> float:
    from mccl_opt.sim import simulate

    scn = out.scenario
    topo = scn.topology.with_capacities(cap)
    schedule = synthesize(scn.collective, topo, None, None)
    return simulate(topo, schedule, scn.message_bytes, fluid=fluid).algbw_gbytes_per_s


def _event(out: Any, i: int, synthesize: Any, fluid: bool, state: int) -> dict[str, Any]:
    scn = out.scenario
    ev = scn.events[i]
    te = ev.t_s * 1e3
    tn = scn.events[i + 1].t_s * 1e3 if i + 1 < len(scn.events) else scn.duration_s * 1e3
    rows = out.rows
    seg = [r for r in rows if te <= r["t_ms"] < tn]
    before = [r for r in rows if r["end_ms"] <= te]
    mine = [e for e in out.events if te <= e["t_ms"] < tn]
    pubs = [e for e in mine if e["action"] == "published"]
    starts = [e for e in mine if e["action"] == "resynthesis"]
    first_new = next((r for r in seg if pubs and r["version"] == pubs[0]["version"]), None)
    old_version = seg[0]["version"] if seg else None
    if ev.duration_s is not None:                   # a dip: the collectives it overlapped
        until = te + ev.duration_s * 1e3
        degraded = [r["algbw"] for r in rows if r["end_ms"] > te and r["t_ms"] < until]
    else:
        degraded = [r["algbw"] for r in seg if r["version"] == old_version
                    and (first_new is None or r["t_ms"] < first_new["t_ms"])]
    offline = _offline(out, scn.timeline()[state][1], synthesize, fluid)
    detect = starts[0]["t_ms"] - te if starts else None
    synth = None
    if pubs:
        jobs = [e for e in mine if e["action"] in ("published", "superseded") and e["t_ms"] <= pubs[0]["t_ms"]]
        synth = 1e3 * sum(e["detail"].get("synth_s", 0.0) for e in jobs)
    reaction = first_new["t_ms"] - te if first_new else None
    after = first_new["algbw"] if first_new else None
    span = sum(r["end_ms"] - r["t_ms"] for r in seg)
    final = [r for r in seg if r["end_ms"] <= tn] or seg
    good = next((r for r in seg if r["algbw"] >= 0.95 * offline), None)
    return {
        "t_ms": te, "kind": ev.kind, "detect_ms": detect, "synth_ms": synth,
        "swap_ms": None if reaction is None or detect is None or synth is None else reaction - detect - synth,
        "reaction_ms": reaction,
        "algbw_before": before[-1]["algbw"] if before else None,
        "algbw_degraded": float(np.mean(degraded)) if degraded else None,
        "algbw_after": after, "algbw_final": final[-1]["algbw"] if final else None,
        "algbw_offline": offline, "recovery_ratio": None if after is None else after / offline,
        "versions": [{"version": e["version"], "t_ms": e["t_ms"]} for e in pubs],
        # beyond the fixed JSON fields (benchmark and text output)
        "recovered_ms": None if good is None else good["end_ms"] - te,
        "probe_cost": sum(r["probe_ms"] for r in seg) / span if span else 0.0,
        "superseded": sum(e["action"] == "superseded" for e in mine),
        "dispatch_ms": 1e3 * pubs[0]["detail"]["dispatch_s"] if pubs and "dispatch_s" in pubs[0]["detail"] else None,
        "aborted": sum(e["action"] == "aborted" for e in mine),
    }


def summarize(out: Any, cfg: Any, synthesize: Any, fluid: bool) -> dict[str, Any]:
    """The loop's figures (module docstring); ``events`` carries extra keys beyond
    :data:`EVENT_KEYS` (``recovered_ms``, ``probe_cost``, ``superseded``, ``aborted``,
    ``dispatch_ms``)."""
    scn = out.scenario
    timeline = scn.timeline()
    states: dict[int, int] = {}                        # event -> its first timeline state
    for k, (_, _, ev_i) in enumerate(timeline):
        states.setdefault(ev_i, k)
    healthy = [r["algbw"] for r in out.rows if r["state"] == 0]
    events = [_event(out, i, synthesize, fluid, states[i]) for i in range(len(scn.events))]
    first_t = scn.events[0].t_s * 1e3 if scn.events else scn.duration_s * 1e3
    false = sum(1 for e in out.events if e["action"] == "published" and e["t_ms"] < first_t)
    false += sum(len(ev["versions"]) for ev in events if ev["kind"] == "dip")
    return {"algbw_healthy": float(np.median(healthy)) if healthy else None, "false_swaps": false,
            "events": events, "collectives": len(out.rows),
            "aborted": sum(e["action"] == "aborted" for e in out.events)}


def public_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """The ``--json`` object of ``mccl loop --scenario``: exactly the issue's fields."""
    return {"algbw_healthy": summary["algbw_healthy"], "false_swaps": summary["false_swaps"],
            "events": [{k: ev[k] for k in EVENT_KEYS} for ev in summary["events"]]}


def builtin_summary(summary: dict[str, Any], cfg: Any) -> dict[str, Any]:
    """The built-in case's flat summary (the first event's figures at top level)."""
    first = summary["events"][0]
    flat = {k: first[k] for k in ("detect_ms", "synth_ms", "swap_ms", "reaction_ms", "algbw_before",
                                  "algbw_degraded", "algbw_after", "algbw_final", "algbw_offline",
                                  "recovery_ratio", "versions")}
    return flat | {"aborted": summary["aborted"], "collectives": summary["collectives"],
                   "failure_cleared_ms": cfg.t1_ms} | public_summary(summary)


def plot(out: Any, path: str, title: str) -> None:
    """Algorithm bandwidth over time with each event's offline level, like Fig. 13(a)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 3.4))
    ax.step([r["t_ms"] for r in out.rows], [r["algbw"] for r in out.rows], where="post", label="algbw")
    s, end = out.summary, out.scenario.duration_s * 1e3
    if s["algbw_healthy"] is not None:
        ax.axhline(s["algbw_healthy"], color="tab:gray", lw=0.6, ls=":", label="healthy")
    for i, (ev, spec) in enumerate(zip(s["events"], out.scenario.events)):
        nxt = s["events"][i + 1]["t_ms"] if i + 1 < len(s["events"]) else end
        if spec.duration_s is not None:
            nxt = ev["t_ms"] + spec.duration_s * 1e3          # a dip's fabric lasts only the dip
        ax.axvline(ev["t_ms"], color="tab:red", ls="--", lw=0.8)
        ax.hlines(ev["algbw_offline"], ev["t_ms"], nxt, colors="tab:purple", ls="--", lw=1.0,
                  label="offline re-optimization" if i == 0 else None)
        if ev["reaction_ms"] is not None:
            ax.axvline(ev["t_ms"] + ev["reaction_ms"], color="tab:green", ls="-.", lw=0.8,
                       label="new schedule" if i == 0 else None)
        ax.annotate(ev["kind"], (ev["t_ms"], 0), fontsize=7, rotation=90, va="bottom")
    ax.set_xlabel("time (ms)")
    ax.set_ylabel("algbw (GB/s)")
    ax.set_title(title)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from .loop import LoopConfig

    d = LoopConfig()
    p.add_argument("--scenario", help="mccl-scenario/1 file (replaces the built-in case's flags)")
    p.add_argument("--shape", default=d.shape, help="HPN SxHxN of the built-in case (default %(default)s)")
    p.add_argument("--collective", choices=["allgather", "alltoall"], default=d.collective)
    p.add_argument("--fail", dest="failure", choices=["fail1", "fail2"], default=d.failure)
    p.add_argument("--gpu", type=int, default=d.gpu, help="rank hit by the failure")
    p.add_argument("--size-mib", type=float, default=d.message_bytes / 2**20,
                   help="per-GPU shard (AllGather) or per-pair block (AllToAll) in MiB")
    p.add_argument("--t0-ms", type=float, default=d.t0_ms, help="failure time")
    p.add_argument("--t1-ms", type=float, default=None, help="failure clears at this time (optional)")
    p.add_argument("--duration-ms", type=float, default=d.duration_ms)
    p.add_argument("--noise", type=float, default=d.noise, help="telemetry noise (relative std)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--estimator", choices=["level", "ewma"], default=d.estimator,
                   help="link estimate: change-point level (default) or the paper's EWMA")
    p.add_argument("--alpha", type=float, default=d.alpha, help="EWMA smoothing factor (--estimator ewma)")
    p.add_argument("--gamma", type=float, default=d.gamma, help="Algorithm 1 threshold")
    p.add_argument("--probe-period-ms", type=float, default=d.probe_period_ms,
                   help="probe links held below nominal this often (0: never)")
    p.add_argument("--oob-ms", type=float, default=d.oob_ms, help="hot-swap out-of-band sync cost")
    p.add_argument("--backend", default=d.backend)
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.add_argument("--png", help="write an algbw-over-time plot (paper Fig. 13(a))")
    p.add_argument("--workload", help="instead: estimate training speedup for a workload profile JSON")


def _fmt(v: Any, unit: str) -> str:
    return "n/a" if v is None else f"{v:.2f} {unit}"


def main(args: argparse.Namespace, out: TextIO) -> int:
    from .loop import LoopConfig, run_loop
    from .scenario import load_scenario

    if args.workload:
        from .workload import main as workload_main

        return workload_main(args, out)
    cfg = LoopConfig(shape=args.shape, collective=args.collective, failure=args.failure, gpu=args.gpu,
                     message_bytes=args.size_mib * 2**20, t0_ms=args.t0_ms, t1_ms=args.t1_ms,
                     duration_ms=args.duration_ms, noise=args.noise, seed=args.seed, estimator=args.estimator,
                     alpha=args.alpha, gamma=args.gamma, probe_period_ms=args.probe_period_ms,
                     oob_ms=args.oob_ms, backend=args.backend)
    scenario = load_scenario(args.scenario) if args.scenario else None
    res = run_loop(cfg, scenario=scenario)
    scn = res.scenario
    title = f"{scn.topology.name} {scn.collective}, {scn.message_bytes / 2**20:g} MiB"
    if args.png:
        plot(res, args.png, title)
    if args.json:
        summary = public_summary(res.summary) if scenario else builtin_summary(res.summary, cfg)
        print(json.dumps(summary), file=out)
        return 0
    s = res.summary
    print(f"closed loop: {title}, {len(scn.events)} event(s), {s['collectives']} collectives, "
          f"healthy {_fmt(s['algbw_healthy'], 'GB/s')}, false swaps {s['false_swaps']}", file=out)
    for ev in s["events"]:
        print(f"event at {ev['t_ms']:g} ms ({ev['kind']})", file=out)
        for label, k, unit in (("detection", "detect_ms", "ms"), ("synthesis", "synth_ms", "ms"),
                               ("swap", "swap_ms", "ms"), ("reaction", "reaction_ms", "ms"),
                               ("algbw before", "algbw_before", "GB/s"), ("algbw degraded", "algbw_degraded", "GB/s"),
                               ("algbw after", "algbw_after", "GB/s"), ("algbw final", "algbw_final", "GB/s"),
                               ("algbw offline", "algbw_offline", "GB/s")):
            print(f"  {label:<15} {_fmt(ev[k], unit)}", file=out)
        ratio = ev["recovery_ratio"]
        print(f"  recovery ratio  {'n/a' if ratio is None else f'{ratio:.3f}'}", file=out)
        print("  versions        " + (", ".join(f"v{v['version']} at {v['t_ms']:.1f} ms" for v in ev["versions"])
                                      or "none published"), file=out)
    if args.png:
        print(f"wrote {args.png}", file=out)
    return 0
