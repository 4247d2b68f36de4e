"""Closed-loop scenario files ``mccl-scenario/1`` (docs/runtime.md, "Scenario files").

A scenario is a fabric, a collective, a message size, a duration and timed events::

    {"format": "mccl-scenario/1",
     "topology": {"format": "mccl-topology/1", ...} | "path/to/topo.json" | "hpn 1x2x8",
     "collective": "allgather", "message_bytes": 16777216, "duration_ms": 1500,
     "noise": 0.01, "seed": 0,
     "events": [{"t_ms": 20, "links": [{"src": "s0h0g0", "dst": "s0tor0",
                                        "capacity_gbps": 50, "both_directions": true}]},
                {"t_ms": 300, "links": [...], "duration_ms": 5},
                {"t_ms": 700, "clear": true}]}

An event with ``links`` sets those capacities (on both directions unless
``both_directions`` is false) on top of the current fabric; with ``duration_ms`` it is
a transient *dip* whose links return to their previous capacities by themselves;
``clear`` restores every link to the scenario's topology.  ``noise`` (relative standard
deviation of telemetry samples, default 0.01) and ``seed`` are optional.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from mccl_opt.errors import MCCLError
from mccl_opt.files import SMALL_PARSE_BYTES, read_json
from mccl_opt.topology import MAX_CAPACITY_GBPS, MIN_CAPACITY_GBPS, Topology

__all__ = ["SCENARIO_FORMAT", "ScenarioError", "Event", "Scenario", "load_scenario", "parse_scenario",
           "MAX_DURATION_MS", "MAX_MESSAGE_BYTES", "MAX_SEED", "MAX_EVENTS"]

SCENARIO_FORMAT = "mccl-scenario/1"
COLLECTIVES = ("allgather", "alltoall")
#: the longest simulated run (10 minutes; the paper's scenarios last seconds): a longer
#: one is a typo that would simulate for hours (``1e300`` never ended)
MAX_DURATION_MS = 600_000.0
#: the largest message (1 PiB, as every byte-size option; ``1e300`` overflowed an int)
MAX_MESSAGE_BYTES = float(1 << 50)
#: seeds are numpy's: non-negative, below 2^63
MAX_SEED = (1 << 63) - 1
#: events of one scenario (20,000 events kept `mccl loop --executor gloo` synthesizing for minutes)
MAX_EVENTS = 1024


class ScenarioError(MCCLError, ValueError):
    """A scenario file that cannot be run; the message names the bad entry."""


@dataclass(frozen=True)
class Event:
    """One timed change: ``kind`` is ``degrade`` (some capacity drops), ``restore``
    (capacities only rise), ``dip`` (transient, ends after ``duration_s``) or ``clear``."""

    t_s: float
    kind: str
    changes: tuple[tuple[int, float], ...] = ()
    duration_s: float | None = None

    def to_dict(self, topo: Topology) -> dict[str, Any]:
        links = [{"src": topo.links[a].src, "dst": topo.links[a].dst, "capacity_gbps": c}
                 for a, c in self.changes]
        out: dict[str, Any] = {"t_ms": self.t_s * 1e3, "kind": self.kind}
        if links:
            out["links"] = links
        if self.duration_s is not None:
            out["duration_ms"] = self.duration_s * 1e3
        return out


@dataclass(frozen=True)
class Scenario:
    """A parsed scenario; :meth:`timeline` gives the true capacities over time."""

    topology: Topology
    collective: str
    message_bytes: float
    duration_s: float
    events: tuple[Event, ...]
    noise: float = 0.01
    seed: int = 0

    def timeline(self) -> list[tuple[float, np.ndarray, int]]:
        """``[(t_s, capacity, event_index)]``: the fabric's capacities from ``t_s`` on
        (``event_index`` -1 before the first event); dip ends are breakpoints too."""
        nominal = self.topology.arrays.capacity
        cap = nominal.copy()
        out: list[tuple[float, np.ndarray, int]] = [(0.0, nominal.copy(), -1)]
        for i, ev in enumerate(self.events):
            before = cap.copy()
            if ev.kind == "clear":
                cap = nominal.copy()
            else:
                for a, c in ev.changes:
                    cap[a] = c
            out.append((ev.t_s, cap.copy(), i))
            if ev.duration_s is not None:
                cap = before
                out.append((ev.t_s + ev.duration_s, cap.copy(), i))
        return out


def load_scenario(path: str | Path, max_gpus: int | None = None) -> Scenario:
    """Read and validate a scenario file; raises :class:`ScenarioError` (or
    :class:`~mccl_opt.errors.TopologyError` for a bad embedded topology).  ``max_gpus``:
    refuse a fabric of more GPUs, an HPN shape before it is generated (real ranks: one
    process per GPU; ``hpn 960x64x8`` was generated, 2 million links, to be refused)."""
    path = Path(path)
    return parse_scenario(read_json(path, ScenarioError, "scenario", SMALL_PARSE_BYTES), base_dir=path.parent,
                          max_gpus=max_gpus)


def _number(d: Mapping[str, Any], key: str, where: str, *, positive: bool = True,
            default: float | None = None) -> float:
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v):
        raise ScenarioError(f"{where}: '{key}' must be a number, got {v!r}")
    if positive and v <= 0:
        raise ScenarioError(f"{where}: '{key}' must be > 0, got {v!r}")
    return float(v)


def _topology(spec: Any, base_dir: Path, max_gpus: int | None) -> Topology:
    if isinstance(spec, Mapping):
        topo = Topology.from_dict(spec)
    elif not isinstance(spec, str) or not spec.strip():
        raise ScenarioError("'topology' must be an inline mccl-topology/1 object, a file path or "
                            "an HPN shape such as \"hpn 1x2x8\"")
    elif len(spec.split()) == 2 and spec.split()[0].lower() == "hpn":
        from instances import hpn, parse_shape

        s, h, n = parse_shape(spec.split()[1])
        _check_gpus(s * h * n, f"hpn-{s}x{h}x{n}", max_gpus)         # before it is generated
        topo = hpn(s, h, n)
    else:
        p = Path(spec)
        topo = Topology.load(p if p.is_absolute() else base_dir / p)
    _check_gpus(topo.num_gpus, topo.name, max_gpus)
    return topo


def _check_gpus(gpus: int, name: str, max_gpus: int | None) -> None:
    """Refuse a fabric ``name`` of more than ``max_gpus`` GPUs (:func:`load_scenario`)."""
    if max_gpus is not None and gpus > max_gpus:
        raise ScenarioError(f"'topology' {name[:80]!r} has {gpus:,} GPUs; real ranks run at most {max_gpus} "
                            "(one process per GPU on this machine)")


def _event(raw: Any, i: int, topo: Topology, cap: np.ndarray) -> Event:
    where = f"events[{i}]"
    if not isinstance(raw, Mapping):
        raise ScenarioError(f"{where} must be an object with 't_ms' and 'links' or 'clear'")
    t = _number(raw, "t_ms", where, positive=False)
    if t < 0:
        raise ScenarioError(f"{where}: 't_ms' must be >= 0, got {t:g}")
    if raw.get("clear") is True:
        if "links" in raw or "duration_ms" in raw:
            raise ScenarioError(f"{where}: a 'clear' event takes no 'links' or 'duration_ms'")
        return Event(t / 1e3, "clear")
    links = raw.get("links")
    if not isinstance(links, list) or not links:
        raise ScenarioError(f"{where}: needs a non-empty 'links' list or \"clear\": true")
    changes: dict[int, float] = {}
    for j, ln in enumerate(links):
        lw = f"{where}.links[{j}]"
        if not isinstance(ln, Mapping) or not isinstance(ln.get("src"), str) or not isinstance(ln.get("dst"), str):
            raise ScenarioError(f"{lw}: needs string 'src' and 'dst'")
        src, dst = ln["src"], ln["dst"]
        if not topo.has_link(src, dst):
            raise ScenarioError(f"{lw}: no link {src!r} -> {dst!r} in topology {topo.name!r}")
        gbps = _number(ln, "capacity_gbps", lw)
        if not MIN_CAPACITY_GBPS <= gbps <= MAX_CAPACITY_GBPS:        # 1e-300 failed later, without a place
            raise ScenarioError(f"{lw}: 'capacity_gbps' must be in [{MIN_CAPACITY_GBPS:g}, {MAX_CAPACITY_GBPS:g}] "
                                f"Gbps, got {gbps:g}")
        both = ln.get("both_directions", True)
        if not isinstance(both, bool):
            raise ScenarioError(f"{lw}: 'both_directions' must be true or false, got {both!r}")
        changes[topo.link_index(src, dst)] = gbps
        if both:
            if not topo.has_link(dst, src):
                raise ScenarioError(f"{lw}: both_directions, but there is no link {dst!r} -> {src!r}")
            changes[topo.link_index(dst, src)] = gbps
    duration = _number(raw, "duration_ms", where) / 1e3 if "duration_ms" in raw else None
    if duration is not None:
        kind = "dip"
    else:
        kind = "degrade" if any(c < cap[a] for a, c in changes.items()) else "restore"
    return Event(t / 1e3, kind, tuple(sorted(changes.items())), duration)


def parse_scenario(data: Any, base_dir: str | Path = ".", max_gpus: int | None = None) -> Scenario:
    """Validate a scenario dictionary (see the module docstring; ``max_gpus``:
    :func:`load_scenario`)."""
    if not isinstance(data, Mapping):
        raise ScenarioError(f"a scenario must be a JSON object with \"format\": \"{SCENARIO_FORMAT}\"")
    if data.get("format") != SCENARIO_FORMAT:
        raise ScenarioError(f"'format' must be {SCENARIO_FORMAT!r}, got {data.get('format')!r}")
    if "topology" not in data:
        raise ScenarioError("'topology' is missing")
    topo = _topology(data["topology"], Path(base_dir), max_gpus)
    coll = data.get("collective")
    if coll not in COLLECTIVES:
        raise ScenarioError(f"'collective' must be one of {COLLECTIVES}, got {coll!r}")
    size = _number(data, "message_bytes", "scenario")
    if size > MAX_MESSAGE_BYTES:
        raise ScenarioError(f"'message_bytes' must be at most {MAX_MESSAGE_BYTES:.0f} (1 PiB), got {size:g}")
    duration = _number(data, "duration_ms", "scenario") / 1e3
    if duration * 1e3 > MAX_DURATION_MS:
        raise ScenarioError(f"'duration_ms' must be at most {MAX_DURATION_MS:g} (10 simulated minutes), "
                            f"got {duration * 1e3:g}")
    noise = _number(data, "noise", "scenario", positive=False, default=0.01)
    if not 0 <= noise < 0.5:
        raise ScenarioError(f"'noise' must be in [0, 0.5), got {noise:g}")
    seed = data.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ScenarioError(f"'seed' must be an integer in [0, 2^63), got {str(seed)[:40]}")
    raw_events = data.get("events", [])
    if not isinstance(raw_events, list) or len(raw_events) > MAX_EVENTS:
        raise ScenarioError(f"'events' must be a list of at most {MAX_EVENTS} events, got "
                            f"{len(raw_events) if isinstance(raw_events, list) else type(raw_events).__name__}")
    events: list[Event] = []
    cap = topo.arrays.capacity.copy()
    for i, raw in enumerate(raw_events):
        ev = _event(raw, i, topo, cap)
        if events:
            prev = events[-1]
            if ev.t_s <= prev.t_s:
                raise ScenarioError(f"events[{i}]: t_ms {ev.t_s * 1e3:g} is not after the previous event's "
                                    f"{prev.t_s * 1e3:g}; list events in time order")
            if prev.duration_s is not None and ev.t_s < prev.t_s + prev.duration_s:
                raise ScenarioError(f"events[{i}] starts before the dip of events[{i - 1}] ends "
                                    f"({(prev.t_s + prev.duration_s) * 1e3:g} ms)")
        if ev.t_s >= duration:
            raise ScenarioError(f"events[{i}]: t_ms {ev.t_s * 1e3:g} is not before the end of the scenario "
                                f"(duration_ms {duration * 1e3:g})")
        if ev.kind == "clear":
            cap = topo.arrays.capacity.copy()
        elif ev.kind != "dip":
            for a, c in ev.changes:
                cap[a] = c
        events.append(ev)
    return Scenario(topo, coll, size, duration, tuple(events), noise, seed)
