"""The summary of a real-rank closed-loop run (``mccl loop --executor gloo --json``).

Per collective, the time is the slowest rank's (a collective ends when its last rank
does).  Per scenario event, in the file's order (real times in ms from the scenario's
start; ``algbw_*`` in GB/s of the emulated fabric, README "Units and definitions", i.e. the real time
divided by ``time_scale``):

* ``time_before_ms``: median of the last 5 collectives that ended before the event;
* ``time_degraded_ms``: median of the collectives after the event on the old version
  (for a dip: those that started during it);
* ``time_after_ms``: the first collective on a new version (``time_after3_ms``: median
  of its first three, less noisy on shared cores);
* ``time_offline_ms``: median over repetitions of the event's offline schedule run
  directly on the event's fabric;
* ``recovery_ratio = algbw_after / algbw_offline`` (``recovery_ratio3`` with
  ``time_after3_ms``);
* ``reaction_ms``: from the event to the start of the first collective on a new version,
  made of ``received_ms`` (the event to the version's arrival at rank 0: detection,
  synthesis and publishing in the controller) and ``swap_ms`` (arrival to the first
  collective on it: staging, the out-of-band exchange, the next collective boundary);
  ``synth_ms`` is the synthesizer's time written in the schedule;
* ``time_final3_ms``: median of the last three collectives before the next event;
* ``probes``, ``probe_ms``: probe rounds (:class:`~executor_cuda.reporting.PairProber`)
  between the event and the next one and their real time (the slowest rank's);
  ``probe_share``: their share of the time from the first new version on (probes plus
  collectives), i.e. the algbw the probes cost while a schedule avoids a link;
* ``versions``: versions the ranks received from the controller between the event and
  the next one, with the time each arrived and its rate (``rate_gbps``, the controller's
  for the fabric it estimated: a version built for a link it still believes degraded has
  a lower rate than the healthy schedule);
* ``recovered_ms``: from the event to the end of the first collective at >= 0.95 of the
  offline algbw (whatever version ran it; null when none did before the next event).

A version that arrives and is superseded before any collective runs on it never counts
as the "first new version": ``time_after_ms``, ``reaction_ms`` and ``recovery_ratio``
are those of the first version that ran.
"""

from __future__ import annotations

import statistics
from typing import Any, Sequence, TextIO

__all__ = ["summarize", "print_summary"]


def _merge(res: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per collective (per attempt of an aborted one, each on its own version):
    rank 0's start, version and fabric state, the slowest rank's duration, and whether
    the attempt was aborted (its time is partial: not a degraded collective's)."""
    slowest: dict[tuple[int, int], float] = {}
    for r in res:
        for seq, _, _, _, dt, attempt in r["rows"]:
            slowest[(seq, attempt)] = max(slowest.get((seq, attempt), 0.0), dt)
    last: dict[int, int] = {}                   # the last attempt of each collective (an earlier one was aborted)
    for seq, k in slowest:
        last[seq] = max(last.get(seq, k), k)
    return [{"seq": seq, "version": v, "state": st, "start": start, "dt": slowest[(seq, k)],
             "end": start + slowest[(seq, k)], "aborted": k < last[seq]}
            for seq, v, st, start, _, k in res[0]["rows"]]


def _merge_probes(res: Sequence[dict[str, Any]]) -> list[tuple[int, float, float, int]]:
    """One row per probe round ``(seq, start, seconds, pairs)``: rank 0's start, the
    slowest rank's seconds (the next collective starts when every rank is done)."""
    slowest: dict[int, float] = {}
    for r in res:
        for seq, _, dt, _ in r.get("probes", []):
            slowest[seq] = max(slowest.get(seq, 0.0), dt)
    return [(seq, start, slowest[seq], n) for seq, start, _, n in res[0].get("probes", [])]


def _median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _event(i: int, scenario: Any, plan: Any, rows: list[dict[str, Any]], received: list[tuple[int, float, Any]],
           offline: dict[int, float], state: int, algbw: Any,
           probe_rows: Sequence[tuple[int, float, float, int]],
           rates: dict[int, float]) -> dict[str, Any]:
    ev = scenario.events[i]
    te = plan.timeline[state][0]
    nxt = [plan.timeline[k][0] for k in range(len(plan.timeline)) if plan.timeline[k][0] > te + 1e-12]
    tn = scenario.events[i + 1].t_s * plan.time_scale if i + 1 < len(scenario.events) else plan.duration_s
    until = nxt[0] if ev.duration_s is not None and nxt else tn
    seg = [r for r in rows if te <= r["start"] < tn]
    before = [r["dt"] for r in rows if r["end"] <= te][-5:]
    old = seg[0]["version"] if seg else None
    first_new = next((r for r in seg if r["version"] != old), None)
    degraded = [r["dt"] for r in seg if r["version"] == old and r["start"] < until and not r["aborted"]
                and (first_new is None or r["start"] < first_new["start"])]   # an aborted attempt is partial
    after3 = [r["dt"] for r in seg if first_new and r["version"] == first_new["version"]][:3]
    final = [r for r in seg if r["end"] <= tn] or seg
    probes = [p for p in probe_rows if te <= p[1] < tn]
    since = first_new["start"] if first_new else tn          # probes run once a schedule avoids a pair
    busy = sum(r["dt"] for r in seg if r["start"] >= since) + sum(p[2] for p in probes if p[1] >= since)
    t_off = offline.get(state)
    t_after = first_new["dt"] if first_new else None
    ms = (lambda x: None if x is None else 1e3 * x)
    out = {
        "t_ms": ev.t_s * 1e3, "kind": ev.kind, "t_real_ms": 1e3 * te,
        "time_before_ms": ms(_median(before)), "time_degraded_ms": ms(_median(degraded)),
        "time_after_ms": ms(t_after), "time_after3_ms": ms(_median(after3)),
        "time_final_ms": ms(final[-1]["dt"] if final else None),
        "time_final3_ms": ms(_median([r["dt"] for r in final[-3:]])), "time_offline_ms": ms(t_off),
        "probes": len(probes), "probe_ms": 1e3 * sum(p[2] for p in probes),
        "probe_share": sum(p[2] for p in probes if p[1] >= since) / busy if busy > 0 else 0.0,
        "reaction_ms": None if first_new is None else 1e3 * (first_new["start"] - te),
        "degraded_collectives": len(degraded),
        "versions": [{"version": v, "t_ms": 1e3 * t, "rate_gbps": rates.get(v)}
                     for v, t, _ in received if te <= t < tn],
    }
    mine = [(v, t, sec) for v, t, sec in received if te <= t < tn]
    out["received_ms"] = 1e3 * (mine[0][1] - te) if mine else None
    out["synth_ms"] = 1e3 * mine[0][2] if mine and mine[0][2] is not None else None
    out["swap_ms"] = (None if not (mine and first_new) else 1e3 * (first_new["start"] - mine[0][1]))
    for key in ("before", "degraded", "after", "after3", "final", "offline"):
        out[f"algbw_{key}"] = algbw(out[f"time_{key}_ms"])
    good = next((r for r in seg if t_off and r["dt"] <= t_off / 0.95), None)
    out["recovered_ms"] = None if good is None else 1e3 * (good["end"] - te)
    out["recovery_ratio"] = (None if not (t_after and t_off) else t_off / t_after)
    out["recovery_ratio3"] = (None if not (after3 and t_off) else t_off / statistics.median(after3))
    return out


def summarize(scenario: Any, res: Sequence[dict[str, Any]], plan: Any, fabric_s: float,
              wall_s: float, controller: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``--json`` object of a real-rank run (module docstring)."""
    rows = _merge(res)
    n = scenario.topology.num_gpus
    received = sorted(res[0]["received"])

    def algbw(ms: float | None) -> float | None:
        return None if not ms else n * scenario.message_bytes / (ms / 1e3 / plan.time_scale) / 1e9

    reps = [r["offline"] for r in res]
    offline = {state: statistics.median(max(rep[state][k] for rep in reps) for k in range(len(reps[0][state])))
               for state in reps[0]}
    first_state: dict[int, int] = {}
    for k, (_, _, ev) in enumerate(scenario.timeline()):
        first_state.setdefault(ev, k)
    probe_rows = _merge_probes(res)
    rates = res[0].get("rates", {})
    events = [_event(i, scenario, plan, rows, received, offline, first_state[i], algbw, probe_rows, rates)
              for i in range(len(scenario.events))]
    t_first = plan.timeline[1][0] if len(plan.timeline) > 1 else plan.duration_s
    healthy = [r["dt"] for r in rows if r["state"] == 0 and r["end"] <= t_first]
    false = sum(1 for _, t, _ in received if t < t_first)
    false += sum(len(e["versions"]) for e in events if e["kind"] == "dip")
    return {
        "executor": "gloo", "world": n, "collective": scenario.collective,
        "message_bytes": scenario.message_bytes, "block_bytes": 4 * plan.block_numel,
        "time_scale": plan.time_scale, "healthy_fabric_ms": 1e3 * fabric_s,
        "time_healthy_ms": 1e3 * statistics.median(healthy) if healthy else None,
        "algbw_healthy": algbw(1e3 * statistics.median(healthy)) if healthy else None,
        "false_swaps": false, "collectives": len(rows),
        "wrong_results": sum(r["wrong"] for r in res),
        "swap_rounds": res[0]["swaps"], "probe_every": plan.probe_every,
        "pieces": plan.pieces, "inflight_switches": res[0].get("inflight", []),
        "aborts": res[0].get("aborts", []), "stalls": res[0].get("stalls", []),
        "probes": len(probe_rows), "probe_ms": 1e3 * sum(p[2] for p in probe_rows),
        "real_s": wall_s, "controller": controller or {},
        "events": events,
    }


def print_summary(s: dict[str, Any], out: TextIO) -> None:
    """The human-readable table of :func:`summarize`'s result."""
    def f(v: Any, unit: str = "") -> str:
        return "n/a" if v is None else f"{v:.2f}{unit}"

    print(f"closed loop on {s['world']} gloo ranks: {s['collective']}, {s['collectives']} collectives in "
          f"{s['real_s']:.1f} s, fabric time x{s['time_scale']:.0f}, healthy {f(s['time_healthy_ms'], ' ms')} "
          f"({f(s['algbw_healthy'], ' GB/s')}), false swaps {s['false_swaps']}, wrong results "
          f"{s['wrong_results']}", file=out)
    for ev in s["events"]:
        print(f"event at {ev['t_ms']:g} ms ({ev['kind']}, {ev['t_real_ms']:.0f} ms real)", file=out)
        for label in ("before", "degraded", "after", "after3", "final", "offline"):
            print(f"  {label:<9} {f(ev[f'time_{label}_ms'], ' ms'):>12}  {f(ev[f'algbw_{label}'], ' GB/s'):>14}",
                  file=out)
        print(f"  reaction  {f(ev['reaction_ms'], ' ms')} (version received after {f(ev['received_ms'], ' ms')}, "
              f"synthesis {f(ev['synth_ms'], ' ms')}, swap {f(ev['swap_ms'], ' ms')})", file=out)
        print(f"  recovery ratio {f(ev['recovery_ratio'])} "
              f"(first 3: {f(ev['recovery_ratio3'])}), at 0.95 of offline after {f(ev['recovered_ms'], ' ms')}",
              file=out)
        print(f"  probes    {ev['probes']} rounds, {ev['probe_ms']:.1f} ms, "
              f"{100 * ev['probe_share']:.1f} % of the time", file=out)
        print("  versions  " + (", ".join(f"v{v['version']} at {v['t_ms']:.0f} ms" for v in ev["versions"])
                                or "none received"), file=out)
