"""Training-time speedup estimate for a workload profile (``mccl loop --workload``),
in the spirit of paper §6.3.

A profile lists one training iteration's collectives (``mccl-workload/1`` JSON)::

    {"format": "mccl-workload/1", "name": "llama-like", "compute_share": 0.66,
     "collectives": [{"name": "fsdp-ag", "kind": "allgather", "bytes": 16777216, "count": 126},
                     {"name": "grads", "kind": "allreduce", "bytes": 67108864, "count": 2},
                     {"name": "moe", "kind": "alltoall", "bytes": 33554432, "count": 58}]}

``bytes`` is the per-GPU input (AllGather shard, AllToAll send buffer, ReduceScatter /
AllReduce buffer), ``count`` the calls per iteration, ``compute_share`` the fraction of
the *healthy* iteration spent outside these collectives.  Each collective's time is its
bandwidth term at the schedule's fluid rate (``min_a cap_a / L_a``; latency ignored):
AllGather ``8 b / x``; AllToAll ``8 (b/N) / z``; ReduceScatter ``8 (b/N) / x_ring``
(the vendor's ring, :func:`mccl_opt.baselines.ring_allgather`, run in reverse; never
re-synthesized); AllReduce = ReduceScatter + AllGather of ``b/N``.  Three cases: healthy
(schedules synthesized for the healthy fabric), *static* (the same schedules on the
degraded fabric) and *MCCL* (AllGather/AllToAll re-synthesized warm for the degraded
fabric).  Speedup = static iteration time / MCCL iteration time.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Mapping, TextIO

from mccl_opt.errors import MCCLError
from mccl_opt.files import SMALL_PARSE_BYTES, read_json
from mccl_opt.schedule import Schedule, schedule_rate, share_loads
from mccl_opt.topology import Topology

from .synthesizer import Synthesizer, solver_synthesizer
from .scenario import MAX_MESSAGE_BYTES

__all__ = ["WORKLOAD_FORMAT", "load_workload", "estimate_speedup", "main"]

WORKLOAD_FORMAT = "mccl-workload/1"
#: calls of one collective per iteration (1e308 calls of 1e308 bytes made the times inf)
MAX_CALLS = 1e9
KINDS = ("allgather", "alltoall", "reducescatter", "allreduce")


def load_workload(data: Any) -> dict[str, Any]:
    """Validate a profile (dict or path); raises :class:`MCCLError` naming the bad entry."""
    if isinstance(data, (str, Path)):
        data = read_json(data, MCCLError, "workload profile", SMALL_PARSE_BYTES)
    if not isinstance(data, Mapping) or data.get("format") != WORKLOAD_FORMAT:
        raise MCCLError(f"a workload profile is a JSON object with \"format\": \"{WORKLOAD_FORMAT}\"")
    share = data.get("compute_share")
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 <= share < 1.0:
        raise MCCLError(f"'compute_share' must be a number in [0, 1), got {share!r}")
    colls = data.get("collectives")
    if not isinstance(colls, list) or not colls:
        raise MCCLError("'collectives' must be a non-empty list")
    for i, c in enumerate(colls):
        where = f"collectives[{i}]"
        if not isinstance(c, Mapping) or c.get("kind") not in KINDS:
            raise MCCLError(f"{where}: 'kind' must be one of {KINDS}")
        for key, top in (("bytes", MAX_MESSAGE_BYTES), ("count", MAX_CALLS)):
            v = c.get(key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= top:
                raise MCCLError(f"{where}: '{key}' must be a positive number at most {top:g}, got {v!r}")
    return dict(data)


def _rate(topo: Topology, schedule: Schedule) -> float:
    return schedule_rate(topo, share_loads(topo, schedule.chunks))


def _seconds(kind: str, nbytes: float, n: int, rates: Mapping[str, float]) -> float:
    bits = 8.0 * nbytes
    if kind == "allgather":
        return bits / (rates["allgather"] * 1e9)
    if kind == "alltoall":
        return bits / n / (rates["alltoall"] * 1e9)
    rs = bits / n / (rates["ring"] * 1e9)
    return rs if kind == "reducescatter" else rs + bits / n / (rates["allgather"] * 1e9)


def estimate_speedup(profile: Mapping[str, Any], healthy: Topology, degraded: Topology,
                     synthesize: Synthesizer | None = None) -> dict[str, Any]:
    """Iteration times (healthy / static / MCCL) and the speedup of MCCL over static."""
    from mccl_opt.baselines import ring_allgather

    profile = load_workload(profile)
    synthesize = synthesize or solver_synthesizer()
    kinds = {c["kind"] for c in profile["collectives"]}
    needed = ({"allgather"} if kinds & {"allgather", "allreduce"} else set()) | (kinds & {"alltoall"})
    ring = ring_allgather(healthy)
    rates = {"healthy": {"ring": _rate(healthy, ring)}, "static": {"ring": _rate(degraded, ring)},
             "mccl": {"ring": _rate(degraded, ring)}}
    for kind in sorted(needed):
        base = synthesize(kind, healthy, None, None)
        rates["healthy"][kind] = _rate(healthy, base)
        rates["static"][kind] = _rate(degraded, base)
        rates["mccl"][kind] = _rate(degraded, synthesize(kind, degraded, base, None))
    n = healthy.num_gpus
    rows, totals = [], {case: 0.0 for case in rates}
    for i, c in enumerate(profile["collectives"]):
        row = {"name": c.get("name", f"#{i}"), "kind": c["kind"]}
        for case in rates:
            row[f"{case}_s"] = c["count"] * _seconds(c["kind"], float(c["bytes"]), n, rates[case])
            totals[case] += row[f"{case}_s"]
        rows.append(row)
    compute = profile["compute_share"] / (1.0 - profile["compute_share"]) * totals["healthy"]
    iteration = {case: compute + t for case, t in totals.items()}
    return {"workload": profile.get("name", ""), "topology": degraded.name, "compute_s": compute,
            "collectives": rows, "iteration_s": iteration,
            "speedup": iteration["static"] / iteration["mccl"],
            "rates_gbps": rates}


def main(args: argparse.Namespace, out: TextIO) -> int:
    """``mccl loop --workload F [--shape S --fail F --gpu G --json]``."""
    from instances import apply_failure, hpn, parse_shape

    healthy = hpn(*parse_shape(args.shape))
    res = estimate_speedup(load_workload(args.workload), healthy,
                           apply_failure(healthy, args.failure, args.gpu), solver_synthesizer(args.backend))
    if args.json:
        print(json.dumps(res), file=out)
        return 0
    from mccl_opt.tables import print_table

    print(f"workload {res['workload']!r} on {res['topology']}: compute {res['compute_s'] * 1e3:.3f} ms "
          "per iteration", file=out)
    print_table(["collective", "kind", "healthy_ms", "static_ms", "mccl_ms"],
                [(r["name"], r["kind"], r["healthy_s"] * 1e3, r["static_s"] * 1e3, r["mccl_s"] * 1e3)
                 for r in res["collectives"]], file=out)
    it = res["iteration_s"]
    print(f"iteration: healthy {it['healthy'] * 1e3:.3f} ms, static {it['static'] * 1e3:.3f} ms, "
          f"MCCL {it['mccl'] * 1e3:.3f} ms -> speedup {res['speedup']:.2f}x", file=out)
    return 0
