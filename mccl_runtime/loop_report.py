"""Figures and plot of the closed loop (``mccl loop``; docs/runtime.md; its command line:
:mod:`.loop_cli`).

Per scenario event (in the file's order), from the rows of :func:`.loop.run_loop`:

* ``algbw_before``: the last collective that ended before the event;
* ``algbw_degraded``: mean of the collectives after the event on the old schedule (for a
  dip: those it overlapped);
* ``algbw_after``: the first collective on the first version published for the event
  that ran (a version superseded before the swap never runs: then the next one's;
  ``first_version`` says which ran);
* ``algbw_final``: the last collective that ended before the next event (or the end);
* ``algbw_offline``: the schedule synthesized cold for the event's true fabric,
  simulated the same way; ``recovery_ratio = algbw_after / algbw_offline``;
* ``detect_ms`` / ``synth_ms`` / ``swap_ms`` / ``reaction_ms`` as in :mod:`.loop`;
* ``versions``: versions published between the event and the next one;
* ``recovered_ms``: from the event to the end of the first collective at >= 0.95 of
  ``algbw_offline`` (null when none in the segment), whatever version ran it.
* where the reaction's time goes (null where it does not apply): ``alarm_ms`` (the event
  to the first alarm, :attr:`.loop.LoopResult.alarms`; ``detect_ms - alarm_ms`` is the
  confirmation), ``job_synth_ms`` (the first job started for the event, also when it ends
  after the segment), ``wait_ms`` (the new version due at the ranks to its first
  collective: the collective in flight, or a swap hold), and ``floor_ms``: the earliest
  ``recovered_ms`` that this detection and synthesis allow: ``detect_ms + job_synth_ms +
  dispatch + oob_ms + one collective at the offline rate``.  ``spec_floor_ms`` is the same
  with synthesis started at the alarm.  ``segment_ms``: the event to the next one (or the
  end); a ``floor_ms`` above it means no loop with this detection and synthesis ends the
  segment at >= 0.95 of offline.

``algbw_after``, ``algbw_final`` and ``recovered_ms`` only read collectives that *finished*
before the next event: one that crossed it ran partly on the next event's fabric, and its
ratio would mix two fabric states (null when none finished in the segment).

Collectives aborted for a new version (:mod:`.loop`) are no rows; ``lost_ms`` sums the
time ran by those aborted in the segment.

``false_swaps`` counts versions published before the first event or because of a dip.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mccl_opt.files import write_figure

__all__ = ["EVENT_KEYS", "DEFAULT_OOB_MS", "summarize", "public_summary", "builtin_summary", "plot"]

#: the out-of-band exchange between ranks before a swap, ms (``LoopConfig.oob_ms``'s default)
DEFAULT_OOB_MS = 5.74

EVENT_KEYS = ("t_ms", "kind", "detect_ms", "synth_ms", "swap_ms", "reaction_ms", "algbw_before",
              "algbw_degraded", "algbw_after", "algbw_final", "algbw_offline", "recovery_ratio", "versions",
              "recovered_ms", "first_version")


def _offline(out: Any, cap: np.ndarray, synthesize: Any, fluid: bool) -> float:
    from mccl_opt.sim import simulate

    scn = out.scenario
    topo = scn.topology.with_capacities(cap)
    schedule = synthesize(scn.collective, topo, None, None)
    return simulate(topo, schedule, scn.message_bytes, fluid=fluid).algbw_gbytes_per_s


def _budget(out: Any, oob_ms: float, te: float, tn: float, mine: list[dict[str, Any]], offline: float,
            detect: float | None, first_new: dict[str, Any] | None) -> dict[str, Any]:
    """Where the reaction's time goes (module docstring)."""
    alarm = next((a - te for a in out.alarms if te <= a < tn), None)
    start = next((e for e in mine if e["action"] == "resynthesis"), None)
    after = out.events[out.events.index(start) + 1:] if start is not None else []
    done = next((e for e in after if e["action"] in ("published", "superseded", "aborted", "held", "failed")), None)
    synth = None if done is None else 1e3 * done["detail"].get("synth_s", 0.0)
    pub = next((e for e in after if e["action"] == "published"), None)
    dispatch = 1e3 * pub["detail"].get("dispatch_s", 0.0) if pub else 0.0
    scn = out.scenario
    tail = dispatch + oob_ms + scn.topology.num_gpus * scn.message_bytes / offline / 1e6
    wait = None
    if first_new is not None:
        due = next((e for e in out.events if e["action"] == "published" and e["version"] == first_new["version"]),
                   None)
        if due is not None:
            wait = first_new["t_ms"] - (due["t_ms"] + 1e3 * due["detail"].get("dispatch_s", 0.0) + oob_ms)
    return {"alarm_ms": alarm, "job_synth_ms": synth, "wait_ms": wait, "segment_ms": tn - te,
            "floor_ms": None if detect is None or synth is None else detect + synth + tail,
            "spec_floor_ms": None if alarm is None or synth is None else alarm + synth + tail}


def _event(out: Any, i: int, synthesize: Any, fluid: bool, state: int, cfg: Any = None) -> dict[str, Any]:
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
    # only collectives that finished before the next event: one that crossed it ran partly
    # under the next fabric, and its ratio would mix the two
    next_t = scn.events[i + 1].t_s * 1e3 if i + 1 < len(scn.events) else np.inf
    done = [r for r in seg if r["end_ms"] <= next_t]
    first_new = next((r for r in done if pubs and r["version"] >= pubs[0]["version"]), None)
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
    good = next((r for r in done if r["algbw"] >= 0.95 * offline), None)
    return {
        "t_ms": te, "kind": ev.kind, "detect_ms": detect, "synth_ms": synth,
        "swap_ms": None if reaction is None or detect is None or synth is None else reaction - detect - synth,
        "reaction_ms": reaction,
        "algbw_before": before[-1]["algbw"] if before else None,
        "algbw_degraded": float(np.mean(degraded)) if degraded else None,
        "algbw_after": after, "algbw_final": done[-1]["algbw"] if done else None,
        "algbw_offline": offline, "recovery_ratio": None if after is None else after / offline,
        "versions": [{"version": e["version"], "t_ms": e["t_ms"]} for e in pubs],
        # beyond the fixed JSON fields (benchmark and text output)
        "recovered_ms": None if good is None else good["end_ms"] - te,
        "first_version": None if first_new is None else first_new["version"],
        "probe_cost": sum(r["probe_ms"] for r in seg) / span if span else 0.0,
        "superseded": sum(e["action"] == "superseded" for e in mine),
        "dispatch_ms": 1e3 * pubs[0]["detail"]["dispatch_s"] if pubs and "dispatch_s" in pubs[0]["detail"] else None,
        "aborted": sum(e["action"] == "aborted" for e in mine),
        "held": sum(e["action"] == "held" for e in mine),
        "swap_held": sum(e["action"] == "swap_held" for e in mine),
        "lost_ms": sum(a["end_ms"] - a["t_ms"] for a in out.aborted if te <= a["end_ms"] < tn),
    } | _budget(out, cfg.oob_ms if cfg is not None else DEFAULT_OOB_MS, te, tn, mine, offline, detect, first_new)


def summarize(out: Any, cfg: Any, synthesize: Any, fluid: bool) -> dict[str, Any]:
    """The loop's figures (module docstring); ``events`` carries extra keys beyond
    :data:`EVENT_KEYS` (``probe_cost``, ``superseded``, ``aborted``, ``held``,
    ``swap_held``, ``dispatch_ms``, ``lost_ms`` and the time budget of :func:`_budget`)."""
    scn = out.scenario
    timeline = scn.timeline()
    states: dict[int, int] = {}                        # event -> its first timeline state
    for k, (_, _, ev_i) in enumerate(timeline):
        states.setdefault(ev_i, k)
    healthy = [r["algbw"] for r in out.rows if r["state"] == 0]
    events = [_event(out, i, synthesize, fluid, states[i], cfg) for i in range(len(scn.events))]
    first_t = scn.events[0].t_s * 1e3 if scn.events else scn.duration_s * 1e3
    false = sum(1 for e in out.events if e["action"] == "published" and e["t_ms"] < first_t)
    false += sum(len(ev["versions"]) for ev in events if ev["kind"] == "dip")
    return {"algbw_healthy": float(np.median(healthy)) if healthy else None, "false_swaps": false,
            "events": events, "collectives": len(out.rows),
            "aborted": sum(e["action"] == "aborted" for e in out.events)}


def public_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """The ``--json`` object of ``mccl loop --scenario``: exactly the fields docs/runtime.md names."""
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
    """Algorithm bandwidth over time with each event's offline level, like Fig. 13(a);
    each event is labelled with the links it changed and marked where it was detected,
    its schedule synthesized and swapped in; the figure says it is simulated."""
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
        marks = [("detected", ev["detect_ms"], "tab:orange", ":"),
                 ("synthesized", None if ev["detect_ms"] is None or ev["synth_ms"] is None
                  else ev["detect_ms"] + ev["synth_ms"], "tab:blue", ":"),
                 ("swapped: new schedule", ev["reaction_ms"], "tab:green", "-.")]
        for label, after, color, style in marks:
            if after is not None:
                ax.axvline(ev["t_ms"] + after, color=color, ls=style, lw=0.8, label=label if i == 0 else None)
        ax.annotate(f"{ev['kind']}: {_changed_links(out.scenario, spec)}", (ev["t_ms"], 0), fontsize=6,
                    rotation=90, va="bottom")
    ax.set_xlabel("time (ms)")
    ax.set_ylabel("algbw (GB/s)")
    ax.set_title(f"{title} (simulated)", fontsize=9)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    write_figure(fig, path)
    plt.close(fig)


def _changed_links(scenario: Any, event: Any) -> str:
    """``s0h0g0->s0tor0 50 Gbps`` for the first two links an event changes (``+N`` more)."""
    links = scenario.topology.links
    words = [f"{links[a].src}->{links[a].dst} {c:g} Gbps" for a, c in event.changes[:2]]
    more = f" +{len(event.changes) - 2}" if len(event.changes) > 2 else ""
    return ", ".join(words) + more if words else "all links back"
