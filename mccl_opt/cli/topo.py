"""``mccl topo``: build fabrics (HPN, DGX-like, ring, mesh, irregular) and inspect
topology files: link classes, degraded links, merged parallel links."""

from __future__ import annotations

import argparse
import sys
from ._inputs import gbps_arg, int_arg, latency_arg, number_arg
from .topo_report import report as _report

TOPO_ARG_HELP = ("topology: a mccl-topology/1 file, a library name (hpn-1x2x8-fail2, dgx-8) "
                 "or hpn-SxHxN[-failK]")
SHOW_EPILOG = (
    "Degraded links: a link's class is the ports of its higher-tier end facing the lower "
    "tier (tier = hops to the nearest GPU): gpu@S are the GPU links of switch S, tier1@S "
    "its links to tier-1 switches; GPU-GPU links form one class; a cable between two "
    "switches of one tier is its own class. The nominal capacity of a class is the one "
    "most of its links run at (ties: the larger); a link below 0.95 x the larger of its "
    "class's nominal and its reverse link's capacity is listed, as 'one way' when its "
    "reverse link is not degraded. Parallel links of one node pair "
    "are merged on loading (summed capacity, smallest latency) and listed. "
    "See docs/modelling.md.")


_count = number_arg(int, 1, high=1 << 31, expected="a positive integer")
_probability = number_arg(float, 0, high=1, expected="a probability in [0, 1]")


def _outputs(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", help="write the topology JSON here")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


def _failure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fail", choices=["fail1", "fail2", "fail3"], help="apply a paper failure (§6.1)")
    p.add_argument("--gpu", type=int_arg, default=None, help="rank of the GPU the failure hits (default 0)")


def _direct_links(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The arguments of a fabric of N GPUs joined by direct links (ring, mesh)."""
    p.add_argument("gpus", type=_count, help="number of GPUs (>= 2)")
    p.add_argument("--gbps", type=gbps_arg, default=100.0, help="link capacity, Gbps (default 100)")
    p.add_argument("--latency-us", type=latency_arg, default=1.0, help="link latency, µs (default 1)")
    return p


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("topo", help="build or inspect topologies")
    tsub = p.add_subparsers(dest="topo_command", metavar="ACTION")
    tsub.required = True
    h = tsub.add_parser("hpn", help="build an HPN rail-optimized fabric SxHxN (paper §6.1)")
    h.add_argument("shape", nargs="?", help="segments x hosts x GPUs per host, e.g. 1x2x8")
    h.add_argument("--shape", dest="shape_option", metavar="SxHxN",
                   help="the same as SHAPE (the spelling `mccl demo` and `mccl loop` use)")
    _failure(h)
    _outputs(h)
    h.set_defaults(handler=_build, make=_hpn)
    d = tsub.add_parser("dgx", help="build a DGX-like box: NVSwitches plus one NIC leaf switch")
    d.add_argument("--gpus", type=_count, default=8, help="GPUs in the box (default 8)")
    d.add_argument("--nvswitches", type=_count, default=4, help="NVSwitches (default 4)")
    d.add_argument("--nvlink-gbps", type=gbps_arg, default=1200.0,
                   help="each GPU's NVLink bundle to each NVSwitch, Gbps (default 1200)")
    d.add_argument("--nic-gbps", type=gbps_arg, default=400.0,
                   help="each GPU's NIC to the leaf switch, Gbps (default 400)")
    _failure(d)
    _outputs(d)
    d.set_defaults(handler=_build, make=_dgx)
    r = _direct_links(tsub.add_parser("ring", help="build a ring of N GPUs joined by direct links"))
    r.add_argument("--one-way", action="store_true", help="links in one direction only (a unidirectional ring)")
    _outputs(r)
    r.set_defaults(handler=_build, make=_ring)
    m = _direct_links(tsub.add_parser("mesh", help="build a full mesh of N GPUs (a direct link per "
                                      "ordered pair)"))
    _outputs(m)
    m.set_defaults(handler=_build, make=_mesh)
    i = tsub.add_parser("irregular", help="build a seeded irregular fabric (uneven hosts, random "
                        "NICs and direct cables, random one-direction degradations)")
    i.add_argument("--seed", type=int_arg, required=True, help="random seed (the same seed, the same fabric)")
    i.add_argument("--max-hosts", type=_count, default=3, help="hosts drawn from 1..this (default 3)")
    i.add_argument("--max-gpus-per-host", type=_count, default=4, help="GPUs per host drawn from 1..this (default 4)")
    i.add_argument("--direct-link-prob", type=_probability, default=0.3,
                   help="probability of a direct cable per GPU pair (default 0.3)")
    i.add_argument("--degrade-prob", type=_probability, default=0.2,
                   help="probability that a link is degraded to 1/8, 1/4 or 1/2 (default 0.2; 0: none)")
    _outputs(i)
    i.set_defaults(handler=_build, make=_irregular)
    s = tsub.add_parser("show", help="summarise a topology: link speeds and classes, degraded "
                        "links, merged parallel links", epilog=SHOW_EPILOG)
    s.add_argument("file", help=TOPO_ARG_HELP)
    s.add_argument("--json", action="store_true", help="print the summary as JSON")
    s.set_defaults(handler=_show)
    from . import peers, topo_import

    topo_import.register(tsub)
    peers.register_imports(tsub)


def _hpn(args: argparse.Namespace):
    from instances import hpn, parse_shape

    from ..errors import InputError

    if (args.shape is None) == (args.shape_option is None):
        raise InputError("give the shape once: `mccl topo hpn 1x2x8` or `mccl topo hpn --shape 1x2x8`")
    return hpn(*parse_shape(args.shape or args.shape_option))


def _dgx(args: argparse.Namespace):
    from instances import dgx

    return dgx(args.gpus, args.nvswitches, args.nvlink_gbps, args.nic_gbps)


def _ring(args: argparse.Namespace):
    from instances import ring

    return ring(args.gpus, args.gbps, bidirectional=not args.one_way, latency_us=args.latency_us)


def _mesh(args: argparse.Namespace):
    from instances import full_mesh

    return full_mesh(args.gpus, args.gbps, args.latency_us)


def _irregular(args: argparse.Namespace):
    from instances import irregular

    return irregular(args.seed, max_hosts=args.max_hosts, max_gpus_per_host=args.max_gpus_per_host,
                     direct_link_prob=args.direct_link_prob, degrade_prob=args.degrade_prob)


def _build(args: argparse.Namespace) -> int:
    """Generate the fabric ``args.make`` builds, apply ``--fail``, write ``-o``, report."""
    from instances import apply_failure

    from ..errors import MCCLError
    from ._guard import output_path

    fail, gpu = getattr(args, "fail", None), getattr(args, "gpu", None)
    if gpu is not None and fail is None:
        raise MCCLError("--gpu picks the GPU a failure hits; give --fail too")
    output_path(args.output, "-o")
    topo = apply_failure(args.make(args), fail, 0 if gpu is None else gpu)
    if args.output:
        topo.save(args.output)
    _report(topo, args.json)
    if args.output:
        print(f"wrote {args.output}", file=sys.stderr)
    return 0


def _show(args: argparse.Namespace) -> int:
    from ._inputs import load_topology

    _report(load_topology(args.file), args.json)
    return 0
