"""``mccl topo teccl|taccl|networkx`` and ``mccl export forestcoll|teccl-flows|teccl|taccl``:
fabrics and schedules in the formats of other synthesizers (docs/interop.md)."""

from __future__ import annotations

import argparse
import json
import sys

from ..files import write_output
from ._inputs import gbps_arg

TOPO_HELP = "topology: a mccl-topology/1 file, a library name (hpn-1x2x8, dgx-8) or hpn-SxHxN[-failK]"


def register_imports(tsub: argparse._SubParsersAction) -> None:
    for fmt, what in (("teccl", "TE-CCL capacity/alpha/switch_indices matrices (JSON)"),
                      ("taccl", "TACCL links/invbws matrices (JSON)"),
                      ("networkx", "a networkx node-link graph (JSON: nx.node_link_data)")):
        p = tsub.add_parser(fmt, help=f"import {what}")
        p.add_argument("file", help=f"{what} file")
        if fmt == "teccl":
            p.add_argument("--gbps-per-unit", type=gbps_arg, default=8.0,
                           help="Gbps per capacity unit (default 8: capacities in GB/s)")
        if fmt == "networkx":
            p.add_argument("--gbps-per-unit", type=gbps_arg, default=1.0,
                           help="Gbps per capacity unit (default 1; 8 for GB/s, as ForestColl's graphs)")
            p.add_argument("--gpus", metavar="NODE,NODE,...",
                           help="the compute nodes, every other node a switch (default: node attribute 'kind')")
        p.add_argument("-o", "--output", metavar="FILE", help="write the topology JSON here (default: none)")
        p.add_argument("--json", action="store_true", help="print the summary as JSON")
        p.add_argument("--name", help="the topology's name (default: from the file)")
        p.set_defaults(handler=_import, fmt=fmt)


def register_exports(group: argparse._SubParsersAction) -> None:
    f = group.add_parser("forestcoll", help="write an AllGather schedule's trees as ForestColl tree XML")
    f.add_argument("schedule", help="an AllGather schedule file")
    f.add_argument("-o", "--output", required=True, metavar="FILE", help="XML file to write")
    f.set_defaults(handler=_export_forestcoll)
    t = group.add_parser("teccl-flows", help="write a schedule as TE-CCL's output (JSON): AllGather flow lines, "
                                             "AllToAll chunk paths with volumes")
    t.add_argument("schedule", help="an AllGather or AllToAll schedule file")
    t.add_argument("--topology", required=True, help=TOPO_HELP + " (the schedule's fabric: numbers its nodes)")
    t.add_argument("-o", "--output", required=True, metavar="FILE", help="JSON file to write")
    t.set_defaults(handler=_export_flows)
    for fmt in ("teccl", "taccl"):
        p = group.add_parser(fmt, help=f"write a topology as {fmt.upper()} matrices (JSON)")
        p.add_argument("topology", help=TOPO_HELP)
        p.add_argument("-o", "--output", required=True, metavar="FILE", help="JSON file to write")
        p.set_defaults(handler=_export_matrix, fmt=fmt)


def _read(path: str):
    from ..errors import TopologyError
    from ..files import TOPOLOGY_PARSE_BYTES, read_json

    return read_json(path, TopologyError, "topology description", TOPOLOGY_PARSE_BYTES)


def _import(args: argparse.Namespace) -> int:
    from ..interop import capacity_matrix
    from ..topology import Topology
    from .topo_import import _write

    data = _read(args.file)
    if args.fmt == "teccl":
        topo = capacity_matrix.from_teccl(data, gbps_per_unit=args.gbps_per_unit, name=args.name)
    elif args.fmt == "taccl":
        topo = capacity_matrix.from_taccl(data, name=args.name)
    else:
        topo = Topology.from_networkx(_node_link(data), args.name, gbps_per_unit=args.gbps_per_unit,
                                      gpus=args.gpus.split(",") if args.gpus else None)
    return _write(args, topo)


def _node_link(data):
    """A networkx graph from node-link JSON (either edge key networkx has used)."""
    import networkx as nx

    from ..errors import TopologyError

    if not isinstance(data, dict) or "nodes" not in data:
        raise TopologyError("a node-link graph is an object with 'nodes' and 'links' (or 'edges')")
    import inspect

    key = "edges" if "edges" in data else "links"
    # networkx >= 3.4 names the keyword edges=, older ones link=
    keyword = "edges" if "edges" in inspect.signature(nx.node_link_graph).parameters else "link"
    try:
        return nx.node_link_graph(data, **{keyword: key})
    except (KeyError, ValueError, TypeError, nx.NetworkXError) as exc:
        raise TopologyError(f"not a node-link graph ({type(exc).__name__}: {exc}); write it with "
                            "networkx.node_link_data") from None


def _self_consistent(path: str, sched) -> None:
    """A schedule exported without its topology must be a schedule on its own paths
    (:func:`._guard.check_self_consistent`: a repeated GPU, an undelivered block)."""
    from ..errors import ScheduleError
    from ._guard import check_self_consistent

    try:
        check_self_consistent(sched)
    except ScheduleError as exc:
        raise ScheduleError(f"{path}: {exc}") from None


def _export_forestcoll(args: argparse.Namespace) -> int:
    from ..interop.forestcoll import to_forestcoll_xml
    from ..schedule import Schedule
    from ._guard import output_path

    output_path(args.output, "-o")
    sched = Schedule.load(args.schedule)
    _self_consistent(args.schedule, sched)
    write_output(args.output, to_forestcoll_xml(sched))
    print(f"wrote {args.output} ({len(sched.chunks)} trees)", file=sys.stderr)
    return 0


def _export_flows(args: argparse.Namespace) -> int:
    from ..interop.teccl_alltoall import to_teccl_alltoall
    from ..errors import ScheduleError
    from ..interop.teccl_flows import FLOWS_KEY, to_teccl_flows
    from ..schedule import Schedule
    from ._guard import output_path, structure_problem
    from ._inputs import load_topology

    output_path(args.output, "-o")
    sched = Schedule.load(args.schedule)
    topo = load_topology(args.topology)
    problem = structure_problem(topo, sched)         # a GPU list with a stranger was a KeyError
    if problem is not None:
        raise ScheduleError(f"{args.schedule}: {problem}")
    write = to_teccl_alltoall if sched.collective == "alltoall" else to_teccl_flows
    data = write(sched, topo)
    write_output(args.output, json.dumps(data, indent=1))
    print(f"wrote {args.output} ({len(data[FLOWS_KEY])} flow lines)", file=sys.stderr)
    return 0


def _export_matrix(args: argparse.Namespace) -> int:
    from ..interop import capacity_matrix
    from ._guard import output_path
    from ._inputs import load_topology

    output_path(args.output, "-o")
    topo = load_topology(args.topology)
    data = capacity_matrix.to_teccl(topo) if args.fmt == "teccl" else capacity_matrix.to_taccl(topo)
    write_output(args.output, json.dumps(data))
    print(f"wrote {args.output}", file=sys.stderr)
    return 0
