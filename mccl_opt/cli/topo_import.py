"""``mccl topo nccl|nvidia-smi|matrix|degrade``: fabrics from other tools' files, and a
fabric with some links degraded (docs/interop.md)."""

from __future__ import annotations

import argparse
import sys

from ._inputs import gbps_arg, latency_arg, number_arg

_fraction = number_arg(float, 0, low_open=True, high=1, expected="a fraction in (0, 1]")
_count = number_arg(int, 1, high=4096, expected="an integer in [1, 4096]")

NETWORK_HELP = ("how hosts' NICs meet: 'rail' (NIC port k of every host on switch rail<k>), "
                "'switch' (every port on one switch) or 'none' (one host); default: rail for "
                "several hosts, none for one")


def _outputs(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", metavar="FILE", help="write the topology JSON here (default: none)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--name", help="the topology's name (default: derived from the input)")


def _cluster_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hosts", type=_count, default=None,
                   help="copy the one host file this many times (identical hosts; default: one host per file)")
    p.add_argument("--network", choices=["rail", "switch", "none"], default=None, help=NETWORK_HELP)
    p.add_argument("--nic-latency-us", type=latency_arg, default=0.5,
                   help="latency of a NIC port's link to the network, µs (default 0.5)")
    p.add_argument("--cpu-paths", action="store_true",
                   help="keep the CPUs and SMP links (default: left out when NVLink joins the GPUs and "
                        "every NIC shares a PCIe switch with a GPU, as NCCL routes; docs/interop.md)")


def register(tsub: argparse._SubParsersAction) -> None:
    n = tsub.add_parser("nccl", help="import NCCL topology XML (NCCL_TOPO_DUMP_FILE), one file per host",
                        epilog="NVLink capacity: count x one link of the GPU's generation (from sm); "
                        "PCIe: link_speed x link_width after encoding; NICs: speed (Mb/s). "
                        "See docs/interop.md.")
    n.add_argument("files", nargs="+", metavar="HOST.xml",
                   help="NCCL topology XML, one per host (or a shipped sample: dgx-h100, cloud-a100x8)")
    _cluster_options(n)
    n.add_argument("--nvlink-gbps", type=gbps_arg, default=None,
                   help="one NVLink's Gbps per direction (default: from the GPU's sm, e.g. 200 for sm 90)")
    n.add_argument("--smp-gbps", type=gbps_arg, default=320.0,
                   help="the link between two CPUs of a host, Gbps (default 320)")
    _outputs(n)
    n.set_defaults(handler=_nccl)
    m = tsub.add_parser("nvidia-smi", help="import `nvidia-smi topo -m` output, one file per host",
                        epilog="The matrix gives relations, not speeds: NV# links of --nvlink-gbps, "
                        "PIX/PXB groups on one PCIe switch, NICs of --nic-gbps. See docs/interop.md.")
    m.add_argument("files", nargs="+", metavar="HOST.txt", help="saved `nvidia-smi topo -m` output, one per host (or the shipped sample dgx-h100)")
    _cluster_options(m)
    m.add_argument("--nvlink-gbps", type=gbps_arg, default=200.0,
                   help="one NVLink's Gbps per direction (default 200: NVLink 2-4, 25 GB/s)")
    m.add_argument("--pcie-gbps", type=gbps_arg, default=round(32 * 16 * 128 / 130, 3),
                   help="every PCIe link, Gbps (default 504.123: Gen5 x16)")
    m.add_argument("--nic-gbps", type=gbps_arg, default=400.0, help="every NIC port, Gbps (default 400)")
    m.add_argument("--smp-gbps", type=gbps_arg, default=320.0,
                   help="the link between two CPUs of a host, Gbps (default 320)")
    m.add_argument("--nvswitch", action=argparse.BooleanOptionalAction, default=None,
                   help="GPUs meet at one NVSwitch (default: when every pair shows the same NV# and a "
                        "GPU would need more than 18 direct links)")
    _outputs(m)
    m.set_defaults(handler=_nvidia_smi)
    d = tsub.add_parser("degrade", help="a copy of a topology with one link (cable) degraded",
                        epilog="The copy records the fabric it came from, so `mccl solve ... --warm OLD` "
                        "on it finds OLD's fabric without --warm-topology.")
    d.add_argument("topology", help="topology: a mccl-topology/1 file, a library name (hpn-1x2x8, dgx-8) "
                   "or hpn-SxHxN[-failK]")
    d.add_argument("--link", nargs="+", required=True, metavar="SRC[,DST]",
                   help="the link: SRC,DST or SRC DST (node ids; `mccl topo show --json` lists them)")
    size = d.add_mutually_exclusive_group(required=True)
    size.add_argument("--gbps", type=gbps_arg, help="its new capacity, Gbps")
    size.add_argument("--fraction", type=_fraction, help="its new capacity as a fraction of the current one")
    d.add_argument("--one-way", action="store_true", help="degrade SRC -> DST only (default: both directions)")
    _outputs(d)
    d.set_defaults(handler=_degrade)


def _write(args: argparse.Namespace, topo) -> int:
    from ._guard import output_path
    from .topo_report import report

    output_path(args.output, "-o")
    if args.output:
        topo.save(args.output)
    report(topo, args.json)
    if args.output:
        print(f"wrote {args.output}", file=sys.stderr)
    return 0


def host_file(spec: str, suffix: str) -> str:
    """``spec`` itself, or the shipped sample host it names (``dgx-h100``, ``cloud-a100x8``
    in ``instances/data/hosts``) when no such file exists."""
    from pathlib import Path

    from instances import DATA_DIR

    sample = DATA_DIR / "hosts" / f"{spec}{suffix}"
    return str(sample) if not Path(spec).exists() and sample.is_file() else spec


def _nccl(args: argparse.Namespace) -> int:
    from ..topology import Topology

    topo = Topology.from_nccl_xml([host_file(f, ".xml") for f in args.files], args.network, hosts=args.hosts,
                                  name=args.name, nvlink_gbps=args.nvlink_gbps, smp_gbps=args.smp_gbps,
                                  nic_latency_us=args.nic_latency_us, cpu_paths=args.cpu_paths)
    return _write(args, topo)


def _nvidia_smi(args: argparse.Namespace) -> int:
    from ..topology import Topology

    topo = Topology.from_nvidia_smi([host_file(f, ".smi.txt") for f in args.files], args.network,
                                    hosts=args.hosts, name=args.name, nvlink_gbps=args.nvlink_gbps,
                                    pcie_gbps=args.pcie_gbps, nic_gbps=args.nic_gbps,
                                    smp_gbps=args.smp_gbps, nic_latency_us=args.nic_latency_us,
                                    nvswitch=args.nvswitch, cpu_paths=args.cpu_paths)
    return _write(args, topo)


def link_pair(words: list[str]) -> tuple[str, str]:
    """``["a,b"]`` or ``["a", "b"]`` -> ``("a", "b")``."""
    from ..errors import InputError

    parts = [p.strip() for w in words for p in w.split(",") if p.strip()]
    if len(parts) != 2:
        raise InputError(f"--link takes SRC,DST or SRC DST (two node ids), got {' '.join(words)!r}")
    return parts[0], parts[1]


def _degrade(args: argparse.Namespace) -> int:
    from ..lineage import degrade_links
    from ._inputs import load_topology

    src, dst = link_pair(args.link)
    topo = load_topology(args.topology)
    new = degrade_links(topo, [(src, dst)], gbps=args.gbps, fraction=args.fraction,
                        both_directions=not args.one_way, name=args.name)
    record = new.extra["degraded_from"]["links"]
    for change in record:
        print(f"{change['src']} -> {change['dst']}: {change['was_gbps']:g} -> {change['gbps']:g} Gbps",
              file=sys.stderr)
    return _write(args, new)
