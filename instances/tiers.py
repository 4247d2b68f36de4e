"""Instance tiers of the solver benchmarking suite (docs/benchmarks.md, "Solver
benchmarking suite"): AllToAll compact LPs (paper App. G.3) and column-generation
masters (§4.2) exported as MPS files, each with its certified optimum.

=======  ===========  =====================================================================
tier     GPUs         fabrics
=======  ===========  =====================================================================
tiny     4-8          HPN 1x2x2 / 1x2x4 with each failure (a smoke tier for tests)
easy     <= 32        the shipped library (:mod:`instances.library`; its manifest is shipped)
medium   64-128       HPN 1x8x8, 2x8x8 with each failure; irregular fabrics (68, 77 GPUs)
hard     256-512      HPN 1x32x8, 2x32x8 with each failure; irregular fabrics (264, 485 GPUs)
=======  ===========  =====================================================================

Certified optimum ``z*`` per instance: column generation (``solve_alltoall(max_chunks=
None)``) gives the master's rate and a Farley bound (a dual-feasible certificate, paper
§4.2); where the compact LP is attempted and finishes, it must agree with column
generation to :data:`~instances.library.REL_TOL` and both times are recorded; beyond,
``z*`` is column generation's rate with its bound and relative gap.  The compact model
is attempted only up to ``compact_max_cols`` columns and ``compact_time_limit`` seconds;
the manifest says which and why not.

Only the easy tier's optima are shipped (``instances/data/manifest.json``); the other
tiers are built on demand into a cache directory (:func:`default_dir`) by
``python -m instances.library build --tier medium|hard [--out DIR]``, which writes the
topologies, the MPS files and ``tier-manifest.json`` (``mccl-lp-tier/1``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from mccl_opt.errors import MCCLError
from mccl_opt.topology import Topology

from .fabrics import irregular
from .catalog import CATALOG, FAILURES, MANIFEST, REL_TOL, Instance, hpn_entry, read_manifest

__all__ = ["TIERS", "TIER_MANIFEST", "TierSpec", "tier_instances", "default_dir", "build_tier",
           "load_tier", "COMPACT_MAX_COLS", "COMPACT_TIME_LIMIT", "TIER_MODELS"]

TIER_FORMAT = "mccl-lp-tier/1"
TIER_MANIFEST = "tier-manifest.json"
TIER_MODELS = ("compact", "master")
COMPACT_MAX_COLS = 400_000      # compact LPs above this are not attempted (docs/benchmarks.md)
COMPACT_TIME_LIMIT = 1800.0     # seconds for one compact LP solve at build time


@dataclass(frozen=True)
class TierSpec:
    """A tier: its GPU range, HPN shapes (each with every failure) and irregular
    fabrics ``(seed, max_hosts, max_gpus_per_host, direct_link_prob)``."""

    name: str
    gpus: tuple[int, int]
    shapes: tuple[tuple[int, int, int], ...]
    irregular: tuple[tuple[int, int, int, float], ...] = ()


TIERS: dict[str, TierSpec] = {
    "tiny": TierSpec("tiny", (4, 8), ((1, 2, 2), (1, 2, 4))),
    "easy": TierSpec("easy", (2, 32), ()),
    "medium": TierSpec("medium", (64, 128), ((1, 8, 8), (2, 8, 8)),
                       ((4, 16, 8, 0.01), (7, 16, 8, 0.01))),
    "hard": TierSpec("hard", (256, 512), ((1, 32, 8), (2, 32, 8)),
                     ((1, 64, 16, 0.001), (2, 64, 16, 0.001))),
}


def _irregular_entry(tier: str, seed: int, hosts: int, per_host: int, p: float) -> Instance:
    name = f"irregular-{tier}-{seed}"
    params = {"seed": seed, "max_hosts": hosts, "max_gpus_per_host": per_host,
              "direct_link_prob": p}
    return Instance(name, "irregular", params,
                    lambda: irregular(seed, max_hosts=hosts, max_gpus_per_host=per_host,
                                      direct_link_prob=p).renamed(name))


def tier_instances(tier: str) -> list[Instance]:
    """The instances of ``tier`` (one of :data:`TIERS`), smallest shapes first."""
    spec = _spec(tier)
    if tier == "easy":
        return list(CATALOG)
    out = [hpn_entry(shape, f) for shape in spec.shapes for f in FAILURES]
    return out + [_irregular_entry(tier, *args) for args in spec.irregular]


def _spec(tier: str) -> TierSpec:
    if tier not in TIERS:
        raise MCCLError(f"unknown tier {tier!r}; choose one of {', '.join(TIERS)}")
    return TIERS[tier]


def default_dir(tier: str) -> Path:
    """``$MCCL_CACHE_DIR/lp-tiers/<tier>`` (default ``$XDG_CACHE_HOME/mccl`` or
    ``~/.cache/mccl``): outside the package, so large files never land in the repository."""
    root = os.environ.get("MCCL_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "mccl")
    return Path(root) / "lp-tiers" / _spec(tier).name


# ------------------------------------------------------------------ certification
def _cg(topo: Topology, backend: str):
    """Column generation to the LP optimum: (schedule, wall seconds, CPU seconds)."""
    from mccl_opt.alltoall import solve_alltoall

    t, cpu = time.perf_counter(), time.process_time()
    sched = solve_alltoall(topo, backend=backend, max_chunks=None)
    return sched, time.perf_counter() - t, time.process_time() - cpu


def _compact(topo: Topology, backend: str, max_cols: int, time_limit: float) -> tuple[dict, object]:
    """The compact LP's record (attempted or why not) and the model itself."""
    from mccl_opt.backends import get_backend
    from mccl_opt.backends.base import SolveStatus
    from mccl_opt.models import build_model

    lp, _ = build_model(topo, "compact")
    if lp.num_cols > max_cols:
        return {"attempted": False, "reason": f"{lp.num_cols} columns > {max_cols}"}, lp
    t, cpu = time.perf_counter(), time.process_time()
    with get_backend(backend) as be:
        be.load(lp)
        sol = be.solve(time_limit=time_limit)
    rec = {"attempted": True, "status": sol.status.value, "seconds": time.perf_counter() - t,
           "cpu_seconds": time.process_time() - cpu, "iterations": int(sol.iterations)}
    if sol.status == SolveStatus.OPTIMAL:
        rec["rate_gbps"] = float(sol.objective)
    return rec, lp


def certify(topo: Topology, backend: str = "highs", *, compact_max_cols: int = COMPACT_MAX_COLS,
            compact_time_limit: float = COMPACT_TIME_LIMIT) -> tuple[dict, dict]:
    """``z*`` of ``topo`` with its evidence (module docstring) and the two models
    ``{"compact": lp, "master": lp}``; raises :class:`MCCLError` if column generation
    and a finished compact LP disagree."""
    from formulations.master import build_master_lp
    from formulations.names import FabricLabels

    sched, cg_s, cg_cpu = _cg(topo, backend)
    st = sched.stats
    z_cg = float(sched.lp_rate_gbps)
    compact, compact_lp = _compact(topo, backend, compact_max_cols, compact_time_limit)
    z_lp = compact.get("rate_gbps")
    if z_lp is not None and abs(z_cg - z_lp) > REL_TOL * max(z_cg, z_lp):
        raise MCCLError(f"{topo.name}: column generation {z_cg!r} and compact LP {z_lp!r} "
                        f"disagree (relative tolerance {REL_TOL}); one of the methods is wrong")
    ar, cols = topo.arrays, sched.warm_state.lp
    master = build_master_lp(topo.num_gpus * (topo.num_gpus - 1), ar.capacity, cols.pair,
                             cols.start, cols.arcs, labels=FabricLabels.of(
                                 [n.id for n in topo.nodes], ar.tail, ar.head, ar.gpu_nodes))
    master.name = f"{topo.name}-master"
    alltoall = {
        "rate_gbps": z_cg,
        "certificate": "compact_lp" if z_lp is not None else "cg_farley_bound",
        "column_generation": {"rate_gbps": z_cg, "bound_gbps": float(st["lp_bound_gbps"]),
                              "gap": float(st["lp_gap"]), "status": st["status"],
                              "rounds": int(st["rounds"]), "seconds": cg_s,
                              "cpu_seconds": cg_cpu},
        "compact_lp": compact,
    }
    return alltoall, {"compact": compact_lp, "master": master}


# ---------------------------------------------------------------------- building
def _model_record(lp, path: Path, optimum: float) -> dict:
    return {"file": path.name, "sense": lp.sense,
            "objective": "rate_gbps" if lp.sense == "max" else "inverse_rate",
            "optimum": optimum, "cols": lp.num_cols, "rows": lp.num_rows, "nnz": int(lp.A.nnz)}


def _easy_record(inst: Instance, out: Path, backend: str) -> dict:
    """An easy-tier record: the shipped manifest's certified optima, models re-exported."""
    from mccl_opt.models import build_model

    rec = read_manifest(MANIFEST)["instances"][inst.name]
    topo = inst.load()
    models = {}
    for model in TIER_MODELS:
        lp, _ = build_model(topo, model, backend=backend)
        models[model] = _write(lp, out / f"{inst.name}-{model}.mps",
                               rec["models"][model]["optimum"])
    z = rec["alltoall"]["rate_gbps"]
    return {"alltoall": {"rate_gbps": z, "certificate": "shipped manifest (compact LP and "
                         "column generation agree)"}, "models": models}


def _write(lp, path: Path, optimum: float) -> dict:
    from formulations.export import write_mps

    write_mps(lp, path)
    return _model_record(lp, path, optimum)


def build_tier(tier: str, out: Path | None = None, backend: str = "highs", *,
               max_gpus: int | None = None, compact_max_cols: int = COMPACT_MAX_COLS,
               compact_time_limit: float = COMPACT_TIME_LIMIT, log=sys.stderr) -> dict:
    """Write ``tier``'s topologies, MPS files and ``tier-manifest.json`` into ``out``
    (default :func:`default_dir`); ``max_gpus`` skips larger instances.  Returns the
    manifest."""
    out = Path(out) if out is not None else default_dir(tier)
    out.mkdir(parents=True, exist_ok=True)
    spec = _spec(tier)
    records: list[dict] = []
    manifest = {"format": TIER_FORMAT, "tier": tier, "backend": backend, "rel_tol": REL_TOL,
                "generated_by": f"python -m instances.library build --tier {tier}",
                "compact_max_cols": compact_max_cols, "compact_time_limit": compact_time_limit,
                "complete": False, "instances": records}
    todo = tier_instances(tier)
    for k, inst in enumerate(todo, 1):
        topo = inst.load()
        if max_gpus is not None and topo.num_gpus > max_gpus:
            continue
        if not spec.gpus[0] <= topo.num_gpus <= spec.gpus[1]:
            raise MCCLError(f"{inst.name} has {topo.num_gpus} GPUs, outside the {tier} tier's "
                            f"{spec.gpus[0]}-{spec.gpus[1]}")
        t = time.perf_counter()
        topo.save(out / f"{inst.name}.json")
        rec = {"name": inst.name, "family": inst.family, "params": inst.params,
               "topology": f"{inst.name}.json", "gpus": topo.num_gpus,
               "switches": len(topo.switches), "links": topo.num_links, "nodes": topo.num_nodes}
        if tier == "easy":
            rec.update(_easy_record(inst, out, backend))
        else:
            alltoall, lps = certify(topo, backend, compact_max_cols=compact_max_cols,
                                    compact_time_limit=compact_time_limit)
            z = alltoall["rate_gbps"]
            rec["alltoall"] = alltoall
            rec["models"] = {m: _write(lp, out / f"{inst.name}-{m}.mps",
                                       z if m == "compact" else 1.0 / z)
                             for m, lp in lps.items()}
        records.append(rec)
        # rewritten after each instance: an interrupted build keeps what it finished
        (out / TIER_MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        print(f"[{k}/{len(todo)}] {inst.name}: {time.perf_counter() - t:.1f} s", file=log,
              flush=True)
    manifest["complete"] = True
    (out / TIER_MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def load_tier(directory: Path) -> dict:
    """A tier manifest written by :func:`build_tier` (raises :class:`MCCLError` naming
    what to run when it is missing or of another format)."""
    path = Path(directory) / TIER_MANIFEST
    if not path.exists():
        raise MCCLError(f"{path} is missing; run `python -m instances.library build --tier "
                        f"TIER --out {directory}`")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise MCCLError(f"{path}: not a readable tier manifest ({exc}); rebuild it") from None
    if not isinstance(data, dict) or data.get("format") != TIER_FORMAT:
        raise MCCLError(f"{path}: format {data.get('format') if isinstance(data, dict) else None!r}, "
                        f"expected {TIER_FORMAT!r}; rebuild it")
    _check_records(path, data)
    return data


def _check_records(path: Path, data: dict) -> None:
    """Every field the suite reads is there (a hand-edited manifest names its bad entry)."""
    recs = data.get("instances")
    ok = isinstance(recs, list) and isinstance(data.get("tier"), str)
    for k, rec in enumerate(recs if ok else []):
        models = rec.get("models") if isinstance(rec, dict) else None
        good = (isinstance(models, dict) and isinstance(rec.get("name"), str)
                and isinstance(rec.get("gpus"), int) and all(
                    isinstance(m, dict) and isinstance(m.get("file"), str)
                    and all(isinstance(m.get(f), (int, float)) and m.get(f) is not True
                            for f in ("cols", "rows", "nnz", "optimum"))
                    and m["optimum"] != 0 for m in models.values()))
        if not good:
            raise MCCLError(f"{path}: instance entry {k} lacks name, gpus or a model's file, "
                            "sizes and nonzero optimum; rebuild the tier")
    if not ok:
        raise MCCLError(f"{path}: no tier name or instance list; rebuild the tier")
