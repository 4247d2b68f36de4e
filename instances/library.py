"""The instance library: families of shipped fabrics and a manifest of their optima
(docs/benchmarks.md).

Every catalogue entry (:mod:`.catalog`) is a deterministic generator call; its ``mccl-topology/1`` file
lives in ``instances/data/<name>.json`` and its manifest record in
``instances/data/manifest.json`` holds, per instance:

* sizes (GPUs, switches, directed links, nodes);
* the optimal AllToAll rate ``z*`` (Gbps per ordered pair) from two independent
  methods: path-column generation (``solve_alltoall(max_chunks=None).lp_rate_gbps``,
  paper §4.2) and the compact arc-flow LP (paper App. G.3) solved by HiGHS; they must
  agree to :data:`REL_TOL`;
* the optimal AllGather rate ``x*`` (Gbps per shard) from ForestColl's cut search
  (``solve_allgather(...).lp_rate_gbps``, paper §4.3), certified by an independent
  networkx max-flow test (Edmonds' branching theorem: with a super-source feeding every
  GPU at ``x``, every GPU must receive ``N·x``): feasible at ``x*``, infeasible at
  ``x*·(1 + REL_STEP)``;
* for every exported model (:mod:`mccl_opt.models`) its size and known optimum: the
  AllToAll models' optima must match ``z*`` (or ``1/z*``); the switch-removal model
  (only on fabrics with switches and at most :data:`SWITCH_REMOVAL_MAX_GPUS` GPUs)
  has no closed form, so its exported LP, solved from scratch, must match the optimum
  its cutting-plane loop converged to, and that optimum must pass
  :func:`switch_removal_certificate`.  Its stored optimum is a record of the model the
  pipeline built then (the model lives on the pipeline's balanced split, so another
  valid split changes it): ``check`` certifies the recomputed model and bounds the
  stored value by :func:`utility_bound` instead of comparing the two.

``python -m instances.library build`` writes the topology files and the manifest;
``python -m instances.library check [--max-gpus N]`` recomputes and compares;
``python -m instances.library build --tier medium|hard [--out DIR]`` writes a solver
benchmarking tier (:mod:`instances.tiers`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from mccl_opt.errors import MCCLError
from mccl_opt.topology import Topology

from . import DATA_DIR
from .catalog import (CATALOG, EXPORTED_MODELS, FORMAT, MANIFEST, REL_STEP, REL_TOL,
                      SWITCH_REMOVAL_MAX_GPUS, Instance, catalog, instance, read_manifest)

__all__ = ["Instance", "CATALOG", "MANIFEST", "REL_TOL", "REL_STEP", "catalog", "instance",
           "load_manifest", "measure", "alltoall_cg_rate", "alltoall_compact_rate",
           "allgather_rate", "allgather_maxflow_certificate", "switch_removal_certificate",
           "utility_bound", "exported_models", "model_optima", "build", "check"]


# ------------------------------------------------------------------- the methods
def alltoall_cg_rate(topo: Topology, backend: str = "highs") -> float:
    """``z*`` by path-column generation (paper §4.2), unrounded."""
    from mccl_opt.alltoall import solve_alltoall

    return float(solve_alltoall(topo, backend=backend, max_chunks=None).lp_rate_gbps)


def alltoall_compact_rate(topo: Topology, backend: str = "highs") -> float:
    """``z*`` by the compact arc-flow LP (paper App. G.3, per-source commodities)."""
    from mccl_opt.backends import get_backend

    from mccl_opt.models import build_model

    lp, _ = build_model(topo, "compact")
    with get_backend(backend) as be:
        be.load(lp)
        return float(_optimal(be.solve(), "compact LP", topo).objective)


def allgather_rate(topo: Topology) -> float:
    """``x*`` by ForestColl's Phase 1 cut search (paper §4.3), without building trees:
    ``solve_allgather``'s ``lp_rate_gbps`` on balanced fabrics; where switches are
    unbalanced it is the cut bound (``stats['cut_bound_gbps']`` when above the
    forwarding-only optimum, docs/allgather_history.md "General method")."""
    from fractions import Fraction

    from mccl_opt.allgather.fabric import fabric_of
    from mccl_opt.allgather.forestcoll.throughput import optimal_rate

    fab, quantum = fabric_of(topo)
    p1 = optimal_rate(fab)
    return float(Fraction(p1.num, p1.den) * Fraction(quantum).limit_denominator(10**12))


def _edmonds(arcs: list[tuple[object, object, float]], gpus: list, x: float) -> bool:
    """Edmonds' condition with networkx on the graph of ``arcs`` ``(tail, head,
    capacity)``: a super-source with an ``x`` arc to every GPU sends ``N·x`` to each GPU
    (relative tolerance 1e-9), i.e. every GPU set ``S`` has ``x·|V \\ S|`` entering it."""
    import networkx as nx

    g = nx.DiGraph()
    for tail, head, capacity in arcs:
        g.add_edge(tail, head, capacity=capacity)
    source = "__super_source__"
    for gpu in gpus:
        g.add_edge(source, gpu, capacity=x)
    need = len(gpus) * x
    return all(nx.maximum_flow_value(g, source, gpu) >= need * (1 - 1e-9) for gpu in gpus)


def _allgather_feasible(topo: Topology, x: float) -> bool:
    """:func:`_edmonds` on the fabric's links: ``x`` per shard is feasible."""
    return _edmonds([(l.src, l.dst, l.capacity_gbps) for l in topo.links], topo.gpus, x)


def allgather_maxflow_certificate(topo: Topology, x: float) -> dict:
    """Whether ``x`` passes the max-flow test and ``x·(1 + REL_STEP)`` fails it."""
    return {"feasible_at_rate": _allgather_feasible(topo, x),
            "infeasible_above": not _allgather_feasible(topo, x * (1 + REL_STEP)),
            "rel_step": REL_STEP}


def utility_bound(num_gpus: int) -> float:
    """An upper bound on the switch-removal utility of any fabric of ``num_gpus`` GPUs,
    from the model's definition (:mod:`formulations.switch_removal`) alone: each of at
    most ``N(N-1)`` pairs earns at most ``step (segments + 1) / 2`` (its ``segments``
    pieces of width ``step·target``, worth ``(segments + 1 - b) / segments / target``)."""
    from formulations.switch_removal import SwitchRemovalModel

    pieces, step = SwitchRemovalModel.segments, SwitchRemovalModel.step
    return num_gpus * (num_gpus - 1) * step * (pieces + 1) / 2


def switch_removal_certificate(topo: Topology, backend: str = "highs") -> dict:
    """Checks of the switch-removal model's optimum (App. C) that do not reuse the
    pipeline's own: ``keeps_rooted_cuts``, the logical GPU graph at the converged optimum
    meets Edmonds' rooted cut condition for ``k`` trees per root (networkx max-flow, not
    the loop's separation: a missed cut breaks it); ``within_bound``, the optimum is in
    ``(0, utility_bound(N)]``."""
    from mccl_opt.allgather.forestcoll.step_aware import converged_switch_removal

    model, loop = converged_switch_removal(topo, backend=backend)
    cap = model.logical(loop.x[: model.num_triples])
    arcs = [(int(u), int(t), float(cap[u, t])) for u, t in zip(*cap.nonzero())]
    return {"keeps_rooted_cuts": _edmonds(arcs, list(range(model.num_gpus)), model.k_keep),
            "within_bound": 0 < loop.objective <= utility_bound(topo.num_gpus)}


def model_optima(topo: Topology, rate_gbps: float, backend: str = "highs") -> dict:
    """Size and optimum of each exported model, solved by ``backend`` and compared with
    the optimum implied by the AllToAll rate."""
    from mccl_opt.backends import get_backend

    from mccl_opt.models import build_model

    out = {}
    for model in exported_models(topo):
        lp, info = build_model(topo, model, backend=backend)
        with get_backend(backend) as be:
            be.load(lp)
            solved = float(_optimal(be.solve(), f"{model} model", topo).objective)
        if info.optimum is not None:
            expected, what = info.optimum, "re-solved vs cutting-plane"
            cert = switch_removal_certificate(topo, backend)
            if not all(cert.values()):
                raise MCCLError(f"{topo.name}: the {model} model's optimum fails its "
                                f"certificate {cert}; the cutting-plane loop is wrong")
        else:
            expected = info.optimum_from_rate(rate_gbps)
            what = "vs z*" if info.objective == "rate_gbps" else "vs 1/z*"
        _agree(solved, expected, f"{model} model optimum {what}", topo)
        out[model] = {"sense": info.sense, "objective": info.objective, "optimum": solved,
                      "cols": info.num_cols, "rows": info.num_rows, "nnz": info.nnz}
    return out


def exported_models(topo: Topology) -> tuple[str, ...]:
    """The models recorded in the manifest for ``topo`` (switch-removal only on small
    fabrics with switches)."""
    small = topo.num_gpus <= SWITCH_REMOVAL_MAX_GPUS and bool(topo.switches)
    return tuple(m for m in EXPORTED_MODELS if m != "switch-removal" or small)


def _optimal(sol, what: str, topo: Topology):
    from mccl_opt.backends.base import SolveStatus

    if sol.status != SolveStatus.OPTIMAL:
        raise MCCLError(f"{topo.name}: {what} ended with status {sol.status.name}, not optimal")
    return sol


def _agree(a: float, b: float, what: str, topo: Topology) -> None:
    if abs(a - b) > REL_TOL * max(abs(a), abs(b)):
        raise MCCLError(f"{topo.name}: {what} disagree: {a!r} vs {b!r} "
                        f"(relative tolerance {REL_TOL}); one of the methods is wrong")


def measure(inst: Instance, backend: str = "highs") -> dict:
    """The manifest record of ``inst``: sizes and optima by two methods each (raises
    :class:`MCCLError` if the methods disagree or the max-flow certificate fails)."""
    topo = inst.load()
    z_cg, z_lp = alltoall_cg_rate(topo, backend), alltoall_compact_rate(topo, backend)
    _agree(z_cg, z_lp, "AllToAll rates (column generation vs compact LP)", topo)
    x = allgather_rate(topo)
    cert = allgather_maxflow_certificate(topo, x)
    if not (cert["feasible_at_rate"] and cert["infeasible_above"]):
        raise MCCLError(f"{topo.name}: AllGather rate {x} fails the networkx max-flow "
                        f"certificate {cert}; the ForestColl cut search is wrong")
    return {
        "name": inst.name, "family": inst.family, "params": inst.params,
        "file": inst.path.name, "gpus": topo.num_gpus, "switches": len(topo.switches),
        "links": topo.num_links, "nodes": topo.num_nodes,
        "alltoall": {"rate_gbps": z_cg, "methods": {"column_generation": z_cg,
                                                    "compact_lp_highs": z_lp}},
        "allgather": {"rate_gbps": x, "methods": {"forestcoll_cut_search": x,
                                                  "networkx_maxflow": cert}},
        "models": model_optima(topo, z_cg, backend),
    }


# ------------------------------------------------------------- manifest I/O
def load_manifest() -> dict:
    """The committed manifest, keyed by instance name under ``"instances"``."""
    return read_manifest(MANIFEST)


def build(backend: str = "highs", *, log=sys.stderr) -> dict:
    """Write every catalogue topology file and the manifest; returns the manifest."""
    DATA_DIR.mkdir(exist_ok=True)
    records = []
    for k, inst in enumerate(CATALOG, 1):
        inst.make().save(inst.path)
        t = time.perf_counter()
        records.append(measure(inst, backend))
        print(f"[{k}/{len(CATALOG)}] {inst.name}: {time.perf_counter() - t:.2f} s", file=log)
    manifest = {"format": FORMAT, "generated_by": "python -m instances.library build",
                "rel_tol": REL_TOL, "backend": backend, "instances": records}
    MANIFEST.write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def check(max_gpus: int | None = None, backend: str = "highs", names: list[str] | None = None,
          *, log=sys.stderr) -> list[str]:
    """Recompute the instances with at most ``max_gpus`` GPUs (or those in ``names``);
    returns the names checked, raises :class:`MCCLError` on the first mismatch."""
    stored = load_manifest()["instances"]
    checked = []
    for inst in CATALOG:
        rec = stored.get(inst.name)
        if rec is None:
            raise MCCLError(f"{inst.name} is in the catalogue but not in {MANIFEST.name}; rebuild it")
        if (names is not None and inst.name not in names) or (
                max_gpus is not None and rec["gpus"] > max_gpus):
            continue
        if inst.make().to_dict() != inst.load().to_dict():
            raise MCCLError(f"{inst.path} differs from its generator; rebuild the library")
        new = measure(inst, backend)
        for key in ("alltoall", "allgather"):
            _agree(new[key]["rate_gbps"], rec[key]["rate_gbps"], f"manifest {key} rate", inst.load())
        for model, info in rec["models"].items():
            if info["objective"] != "utility":
                _agree(new["models"][model]["optimum"], info["optimum"],
                       f"manifest {model} optimum", inst.load())
            elif not 0 < info["optimum"] <= utility_bound(rec["gpus"]):
                raise MCCLError(f"{inst.name}: manifest {model} optimum {info['optimum']!r} "
                                f"is outside (0, {utility_bound(rec['gpus'])}], the bound "
                                "of any switch-removal utility")
        checked.append(inst.name)
        print(f"ok {inst.name}", file=log)
    return checked


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m instances.library",
        description="Build or check the instance library manifest; build a solver "
                    "benchmarking tier (docs/benchmarks.md).")
    parser.add_argument("action", choices=["build", "check"])
    parser.add_argument("--max-gpus", type=int, default=None,
                        help="only instances with at most this many GPUs")
    parser.add_argument("--backend", default="highs")
    parser.add_argument("--tier", default=None, choices=["tiny", "easy", "medium", "hard"],
                        help="build: write this tier's MPS files and tier manifest to --out "
                             "instead of rebuilding the shipped library")
    parser.add_argument("--out", default=None,
                        help="build --tier: the directory (default: a cache directory, "
                             "$MCCL_CACHE_DIR/lp-tiers/TIER or ~/.cache/mccl/lp-tiers/TIER)")
    parser.add_argument("--compact-max-cols", type=int, default=None,
                        help="build --tier: attempt compact LPs up to this many columns")
    parser.add_argument("--compact-time-limit", type=float, default=None,
                        help="build --tier: seconds for one compact LP solve")
    args = parser.parse_args(argv)
    try:
        if args.tier is not None:
            if args.action != "build":
                raise MCCLError("--tier goes with build; check a tier with "
                                "`mccl bench --suite lp --tier TIER`")
            from . import tiers

            limits = {k: v for k, v in (("compact_max_cols", args.compact_max_cols),
                                        ("compact_time_limit", args.compact_time_limit))
                      if v is not None}
            out = args.out or tiers.default_dir(args.tier)
            done = tiers.build_tier(args.tier, out, args.backend, max_gpus=args.max_gpus, **limits)
            print(f"wrote {len(done['instances'])} instances to {out}")
        elif args.action == "build":
            build(args.backend)
        else:
            print(f"{len(check(args.max_gpus, args.backend))} instances agree with {MANIFEST.name}")
    except MCCLError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
