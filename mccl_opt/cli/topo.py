"""``mccl topo``: build HPN instances and inspect topology files."""

from __future__ import annotations

import argparse
from collections import Counter

from ..tables import print_json, print_table


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("topo", help="build or inspect topologies")
    tsub = p.add_subparsers(dest="topo_command", metavar="ACTION")
    tsub.required = True
    h = tsub.add_parser("hpn", help="build an HPN rail-optimized fabric SxHxN (paper §6.1)")
    h.add_argument("shape", help="segments x hosts x GPUs per host, e.g. 1x2x8")
    h.add_argument("--fail", choices=["fail1", "fail2", "fail3"], help="apply a paper failure")
    h.add_argument("--gpu", type=int, default=None, help="rank of the GPU the failure hits (default 0)")
    h.add_argument("-o", "--output", help="write the topology JSON here")
    h.add_argument("--json", action="store_true", help="print the summary as JSON")
    h.set_defaults(handler=_hpn)
    s = tsub.add_parser("show", help="summarise a mccl-topology/1 file")
    s.add_argument("file", help="topology: a mccl-topology/1 file, a library name (hpn-1x2x8-fail2, dgx-8) or hpn-SxHxN[-failK]")
    s.add_argument("--json", action="store_true", help="print the summary as JSON")
    s.set_defaults(handler=_show)


def summary(topo) -> dict:
    caps = Counter((round(l.capacity_gbps, 6), round(l.latency_us, 6)) for l in topo.links)
    return {
        "name": topo.name, "gpus": topo.num_gpus, "switches": len(topo.switches),
        "links": topo.num_links,
        "link_classes": [{"capacity_gbps": c, "latency_us": lat, "count": n}
                         for (c, lat), n in sorted(caps.items(), reverse=True)],
    }


def _report(topo, as_json: bool) -> None:
    info = summary(topo)
    if as_json:
        print_json(info)
        return
    print(f"topology {info['name']}: {info['gpus']} GPUs, {info['switches']} switches, "
          f"{info['links']} directed links")
    print_table(["capacity_gbps", "latency_us", "links"],
                [(c["capacity_gbps"], c["latency_us"], c["count"]) for c in info["link_classes"]])


def _hpn(args: argparse.Namespace) -> int:
    from instances import apply_failure, hpn, parse_shape

    from ..errors import MCCLError
    from ._guard import output_path

    if args.gpu is not None and args.fail is None:
        raise MCCLError("--gpu picks the GPU a failure hits; give --fail too")
    output_path(args.output, "-o")
    topo = apply_failure(hpn(*parse_shape(args.shape)), args.fail, 0 if args.gpu is None else args.gpu)
    if args.output:
        topo.save(args.output)
    _report(topo, args.json)
    if args.output and not args.json:
        print(f"wrote {args.output}")
    return 0


def _show(args: argparse.Namespace) -> int:
    from ._inputs import load_topology

    _report(load_topology(args.file), args.json)
    return 0
