"""Checks of a parsed controller state against the served topology (docs/runtime.md,
"Limits and guarantees"): the topology must be the served one, every telemetry channel
must name a link or GPU pair of it with a finite, believable value and a time not in the
future, every collective must have a known kind, a non-negative version and (if it has
one) a schedule that :func:`mccl_opt.validate` accepts on the capacities it was
synthesized for.  Anything else is refused with one :class:`~mccl_opt.errors.MCCLError`
naming the field (``manager.collectives[2].version``), never a ``KeyError`` or a
poisoned EWMA.
"""

from __future__ import annotations

import math
from typing import Any, Mapping
from unicodedata import is_normalized

from mccl_opt.errors import MCCLError
from mccl_opt.files import too_deep
from mccl_opt.subfabric import induced
from mccl_opt.topology import Topology

__all__ = ["check_state", "name_problem", "MAX_STATE_DEPTH", "MAX_COLLECTIVES", "MAX_NAME_CHARS"]

#: nesting depth of a state file (the path of an AllGather tree edge sits at level 10)
MAX_STATE_DEPTH = 24
#: registered collectives per controller (each costs a schedule in every state write)
MAX_COLLECTIVES = 256
#: characters of a communicator or collective name
MAX_NAME_CHARS = 128
_KINDS = {"allgather": True, "alltoall": True, "reducescatter": False}


def _get(d: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in d:
        raise MCCLError(f"{where}.{key} is missing")
    return d[key]


def _obj(v: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(v, Mapping):
        raise MCCLError(f"{where} must be an object, got {type(v).__name__}")
    return v


def _list(v: Any, where: str) -> list[Any]:
    if not isinstance(v, list):
        raise MCCLError(f"{where} must be a list, got {type(v).__name__}")
    return v


def name_problem(v: str) -> str | None:
    """What is wrong with a communicator or collective name (one a registration would
    refuse: a state file holds only registered names), or ``None``."""
    if len(v) > MAX_NAME_CHARS or not v.isprintable() or not is_normalized("NFC", v):
        return f"must be printable, in Unicode NFC form, at most {MAX_NAME_CHARS} characters"
    return None


def _str(v: Any, where: str) -> str:
    if not isinstance(v, str) or not v:
        raise MCCLError(f"{where} must be a non-empty string")
    return v


def _num(v: Any, where: str, lo: float = -math.inf, hi: float = math.inf) -> float:
    """A finite number in ``[lo, hi]`` (ints beyond float range are refused too)."""
    try:
        x = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan
    except OverflowError:
        x = math.inf
    if not math.isfinite(x) or not lo <= x <= hi:
        raise MCCLError(f"{where} must be a finite number in [{lo:g}, {hi:g}], got {str(v)[:40]}")
    return x


#: how far a stored time may be ahead of now (a wall clock stepped back since it was written)
MAX_CLOCK_STEP_S = 86400.0


def _stamp(v: Any, where: str, latest: float) -> float:
    """A time the controller wrote: a finite number at most :data:`MAX_CLOCK_STEP_S`
    after ``latest`` (now), taken as ``latest`` when after it.  Its own state, written
    before the wall clock stepped back (an NTP correction), holds such times: refused,
    the controller could not restart until the state was deleted (issue 27, eighth pass);
    kept, they made telemetry stale."""
    return min(_num(v, where, -math.inf, latest + MAX_CLOCK_STEP_S), latest)


def _count(v: Any, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**63:
        raise MCCLError(f"{where} must be a non-negative integer, got {str(v)[:40]}")
    return v


def _counters(v: Any, where: str) -> dict[str, int]:
    return {str(k): _count(n, f"{where}.{str(k)[:40]}") for k, n in _obj(v, where).items()}


def check_state(data: Mapping[str, Any], topo: Topology, *, now: float | None = None,
                max_ratio: float = 1.5, future_tolerance_s: float = 0.5,
                max_collectives: int = MAX_COLLECTIVES) -> dict[str, Any]:
    """Check a parsed state file against the served topology; returns it normalised
    (numbers as floats/ints; each collective's checked :class:`~mccl_opt.schedule.Schedule`
    also as ``parsed_schedule``, so a resume does not parse it twice).  Raises
    :class:`MCCLError` naming the first bad field.  ``now`` (default: the wall clock)
    bounds every stored time from above; at most ``max_collectives`` collectives, their
    names as a registration's (:func:`name_problem`)."""
    import time

    now = time.time() if now is None else now
    if too_deep(_outside_version_files(data), MAX_STATE_DEPTH):
        raise MCCLError(f"the file nests deeper than {MAX_STATE_DEPTH} levels")
    try:
        saved = Topology.from_dict(_get(data, "topology", "state"))
    except MCCLError as exc:
        raise MCCLError(f"state.topology: {exc}") from None
    if saved != topo:
        raise MCCLError("it was written for another topology; pass that topology")
    return {**data, "topology": data["topology"],
            "telemetry": _telemetry(data.get("telemetry", {}), topo, now + future_tolerance_s, max_ratio),
            "manager": _manager(data.get("manager", {}), topo, now + future_tolerance_s, max_ratio, max_collectives),
            "protocol_errors": _counters(data.get("protocol_errors", {}), "protocol_errors")}


def _outside_version_files(data: Mapping[str, Any]) -> Any:
    """``data`` without the schedules inlined from version files (``schedule_file``):
    reading a file already bounded their depth (:func:`mccl_opt.files.read_json`, as for
    any schedule file), and walking them again cost 2 s at 512 GPUs."""
    mgr = data.get("manager")
    colls = mgr.get("collectives") if isinstance(mgr, Mapping) else None
    if not isinstance(colls, list):
        return data
    colls = [{**c, "schedule": None} if isinstance(c, Mapping) and "schedule_file" in c else c for c in colls]
    return {**data, "manager": {**mgr, "collectives": colls}}


def _channel(d: Any, where: str, latest: float, cap: float) -> dict[str, Any]:
    d = _obj(d, where)
    return {"src": _str(_get(d, "src", where), f"{where}.src"),
            "dst": _str(_get(d, "dst", where), f"{where}.dst"),
            "value": _num(_get(d, "value", where), f"{where}.value", 0.0, cap),
            "t": _stamp(_get(d, "t", where), f"{where}.t", latest)}


def _telemetry(v: Any, topo: Topology, latest: float, max_ratio: float) -> dict[str, Any]:
    tel = _obj(v, "telemetry")
    top = max_ratio * float(topo.arrays.capacity.max())
    direct = []
    for i, d in enumerate(_list(tel.get("direct", []), "telemetry.direct")):
        where = f"telemetry.direct[{i}]"
        c = _channel(d, where, latest, top)
        if not topo.has_link(c["src"], c["dst"]):
            raise MCCLError(f"{where}: no link {c['src'][:40]!r} -> {c['dst'][:40]!r} in {topo.name!r}")
        nominal = float(topo.arrays.capacity[topo.link_index(c["src"], c["dst"])])
        _num(c["value"], f"{where}.value", 0.0, max_ratio * nominal)
        direct.append(c)
    pairs = []
    for i, d in enumerate(_list(tel.get("pairs", []), "telemetry.pairs")):
        where = f"telemetry.pairs[{i}]"
        c = _channel(d, where, latest, top)
        for end in ("src", "dst"):
            if not topo.has_node(c[end]) or not topo.is_gpu(c[end]):
                raise MCCLError(f"{where}.{end}: {c[end][:40]!r} is not a GPU of {topo.name!r}")
        pairs.append(c)
    hosts = []
    for i, d in enumerate(_list(tel.get("hosts", []), "telemetry.hosts")):
        where = f"telemetry.hosts[{i}]"
        c = _channel(d, where, latest, top)
        if not topo.has_link(c["src"], c["dst"]):
            raise MCCLError(f"{where}: no link {c['src'][:40]!r} -> {c['dst'][:40]!r} in {topo.name!r}")
        reporter = _get(d, "reporter", where)
        if isinstance(reporter, bool) or not isinstance(reporter, int) or not 0 <= reporter < 1 << 30:
            raise MCCLError(f"{where}.reporter must be an integer in [0, 2^30), got {str(reporter)[:40]}")
        kind = d.get("kind", "host")
        if kind not in ("host", "max"):
            raise MCCLError(f"{where}.kind must be 'host' (a host's reduction) or 'max' (a front end's), "
                            f"got {str(kind)[:40]!r}")
        hosts.append({**c, "kind": kind, "reporter": reporter})
    return {**tel, "direct": direct, "pairs": pairs, "hosts": hosts,
            "accepted": _count(tel.get("accepted", 0), "telemetry.accepted"),
            "rejected": _counters(tel.get("rejected", {}), "telemetry.rejected")}


def _manager(v: Any, topo: Topology, latest: float, max_ratio: float, max_collectives: int) -> dict[str, Any]:
    from mccl_opt.schedule import Schedule

    mgr = _obj(v, "manager")
    seen: set[tuple[str, str]] = set()
    colls = []
    entries = _list(mgr.get("collectives", []), "manager.collectives")
    if len(entries) > max_collectives:
        raise MCCLError(f"manager.collectives holds {len(entries)} collectives; a controller serves at most "
                        f"{max_collectives}")
    for i, d in enumerate(entries):
        where = f"manager.collectives[{i}]"
        d = _obj(d, where)
        comm, name = _str(_get(d, "comm", where), f"{where}.comm"), _str(_get(d, "name", where), f"{where}.name")
        for label, v in (("comm", comm), ("name", name)):
            if name_problem(v):
                raise MCCLError(f"{where}.{label} {name_problem(v)}")
        if (comm, name) in seen:
            raise MCCLError(f"{where}: {comm[:40]}/{name[:40]} appears twice")
        seen.add((comm, name))
        kind = _get(d, "kind", where)
        if kind not in _KINDS:
            raise MCCLError(f"{where}.kind must be one of {tuple(_KINDS)}, got {str(kind)[:40]!r}")
        dynamic = _get(d, "dynamic", where)
        if dynamic is not _KINDS[kind]:
            raise MCCLError(f"{where}.dynamic must be {_KINDS[kind]} for a {kind}")
        version = _count(_get(d, "version", where), f"{where}.version")
        ldt = d.get("last_decision_t")
        out = {**d, "comm": comm, "name": name, "kind": kind, "dynamic": dynamic, "version": version,
               "last_decision_t": None if ldt is None else _stamp(ldt, f"{where}.last_decision_t", latest),
               "schedule": None, "synth_capacity": None}
        fabric = topo
        if d.get("gpus") is not None:           # a communicator over a sub-fabric: check it there
            try:
                sub = induced(topo, d["gpus"])
            except MCCLError as exc:
                raise MCCLError(f"{where}.gpus: {exc}") from None
            fabric, out["gpus"] = sub, list(sub.gpus)
        if d.get("schedule") is not None:
            out["parsed_schedule"], out["synth_capacity"] = _schedule(d, where, kind, version, topo, max_ratio,
                                                                      Schedule, fabric)
            out["schedule"] = d["schedule"]
        elif version != 0 and dynamic:
            raise MCCLError(f"{where}.schedule is missing for version {version}")
        colls.append(out)
    return {**mgr, "collectives": colls, "counters": _counters(mgr.get("counters", {}), "manager.counters")}


def _schedule(d: Mapping[str, Any], where: str, kind: str, version: int, topo: Topology,
              max_ratio: float, schedule_cls: type, fabric: Any) -> tuple[Any, list[float]]:
    """A stored schedule, parsed and checked valid (:func:`mccl_opt.validate`: every block
    delivered, hops real links, trees spanning, shares summing to 1) on its synthesis
    capacities, on ``fabric``: ``topo`` or the communicator's sub-fabric
    (:class:`mccl_opt.subfabric.SubFabric`); and those capacities."""
    from dataclasses import replace

    import numpy as np

    from mccl_opt.schedule import schedule_rate, share_loads
    from mccl_opt.validate import validate

    if version < 1:
        raise MCCLError(f"{where}.version must be >= 1 for a collective with a schedule, got {version}")
    caps = _list(_get(d, "synth_capacity", where), f"{where}.synth_capacity")
    if len(caps) != topo.num_links:
        raise MCCLError(f"{where}.synth_capacity has {len(caps)} entries; {topo.name!r} has "
                        f"{topo.num_links} links")
    nominal = topo.arrays.capacity
    cap = np.array([_num(c, f"{where}.synth_capacity[{a}]", 0.0, max_ratio * float(nominal[a]))
                    for a, c in enumerate(caps)])
    if (cap <= 0).any():
        raise MCCLError(f"{where}.synth_capacity[{int(np.argmin(cap))}] must be positive")
    try:
        sched = schedule_cls.from_dict(d["schedule"])
        if sched.collective != kind:
            raise MCCLError(f"a {kind} needs a {kind} schedule, got {sched.collective}")
        if sched.version != version:
            raise MCCLError(f"its version {sched.version} differs from the collective's {version}")
        ceiling = max_ratio * float(nominal.sum())     # no rate beats every link at once
        if sched.rate_gbps > ceiling:
            raise MCCLError(f"its rate_gbps {sched.rate_gbps:.6g} exceeds {ceiling:.6g}, the fabric's total "
                            "capacity: the file is corrupt or edited")
        on = topo.with_capacities(cap) if fabric is topo else fabric.measured(cap)
        try:        # the stated rate is not trusted (the manager profiles the schedule on ``cap``)
            rate = schedule_rate(on, share_loads(on, sched.chunks))
        except MCCLError:
            rate = sched.rate_gbps                      # validate names the hop that is no link
        validate(on, replace(sched, rate_gbps=rate, lp_rate_gbps=max(rate, sched.lp_rate_gbps)))
    except (MCCLError, TypeError, ValueError, OverflowError) as exc:
        raise MCCLError(f"{where}.schedule: {exc}") from None
    return sched, cap.tolist()
