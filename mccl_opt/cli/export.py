"""``mccl export mps --model compact|master|switch-removal TOPO -o F [--lp]``.

Writes an instance's model (see :mod:`instances.models`) as free MPS, and with ``--lp``
also as a CPLEX LP file next to it, so any LP solver can be run on it.  When the
topology is a library instance (same name and content as the shipped file), the
manifest's known optimum is printed with the file.

``export`` is a group shared with ``mccl export msccl`` (``executor_cuda.cli``): whichever
module registers first creates it, the other attaches its format to it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

MODEL_CHOICES = ("compact", "master", "switch-removal")


def export_group(sub: argparse._SubParsersAction) -> argparse._SubParsersAction:
    """The ``export`` group's subparsers (created on first use, shared afterwards)."""
    parser = sub.choices.get("export")
    if parser is None:
        parser = sub.add_parser("export", help="export schedules and models to other formats")
        group = parser.add_subparsers(dest="export_command", metavar="FORMAT")
        group.required = True
        return group
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    raise RuntimeError("the 'export' command has no format subcommands to extend")


def register(sub: argparse._SubParsersAction) -> None:
    p = export_group(sub).add_parser(
        "mps", help="write an instance's LP model as MPS (and LP) for any solver")
    p.add_argument("topology", help="mccl-topology/1 file, or a library instance name (hpn-1x2x8-fail2)")
    p.add_argument("--model", choices=MODEL_CHOICES, default="compact",
                   help="compact: AllToAll arc-flow LP (max z); master: column-generation "
                        "master over its final columns (min 1/z); switch-removal: App. C model")
    p.add_argument("--commodities", choices=["source", "pair"], default="source",
                   help="compact model: one commodity per source (default) or per ordered pair")
    p.add_argument("-o", "--output", required=True, help="MPS file to write")
    p.add_argument("--lp", action="store_true", help="also write a CPLEX LP file (OUTPUT with .lp)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(handler=_export_mps)


def _load_topology(spec: str):
    from mccl_opt.errors import TopologyError
    from mccl_opt.topology import Topology

    if Path(spec).exists():
        return Topology.load(spec)
    from instances.library import instance

    try:
        return instance(spec).load()
    except Exception:
        raise TopologyError(f"{spec!r} is neither a topology file nor a library instance name "
                            "(see instances/data/manifest.json)") from None


def known_optimum(topo, model: str) -> float | None:
    """The manifest's optimum of ``model`` if ``topo`` is a library instance, else None."""
    from instances.library import MANIFEST, instance, load_manifest
    from mccl_opt.errors import MCCLError

    if not MANIFEST.exists():
        return None
    try:
        inst = instance(topo.name)
    except MCCLError:
        return None
    if not inst.path.exists() or inst.load().to_dict() != topo.to_dict():
        return None
    rec = load_manifest()["instances"].get(topo.name)
    return None if rec is None or model not in rec["models"] else rec["models"][model]["optimum"]


def _export_mps(args: argparse.Namespace) -> int:
    from formulations.export import write_lp, write_mps
    from instances.models import build_model

    from ._table import print_json, print_table

    topo = _load_topology(args.topology)
    lp, info = build_model(topo, args.model, commodities=args.commodities)
    files = [str(write_mps(lp, args.output))]
    if args.lp:
        files.append(str(write_lp(lp, Path(args.output).with_suffix(".lp"))))
    summary = {"files": files, "model": info.model, "topology": topo.name, "sense": info.sense,
               "objective": info.objective, "cols": info.num_cols, "rows": info.num_rows,
               "nnz": info.nnz, "known_optimum": known_optimum(topo, args.model)}
    if args.json:
        print_json(summary)
    else:
        print_table(list(summary), [[", ".join(files), *list(summary.values())[1:]]])
    return 0
