"""NCCL's topology XML (what ``NCCL_TOPO_DUMP_FILE`` writes and ``NCCL_TOPO_FILE``
reads) as a :class:`~.cluster.HostSpec` (docs/interop.md "NCCL topology XML").

The file describes one host: ``<system><cpu><pci ...><pci ...><gpu><nvlink/></gpu>
</pci>...<nic><net/></nic></pci></cpu></system>``.  Modelling (paper §6.1 units: Gbps
per direction, µs):

* a ``<gpu>`` is a GPU node ``g{i}`` (``i``: its place in rank order, by the ``rank``
  attribute when every GPU has one, else by ``dev``); its PCI element's link to the
  parent is a cable of ``link_speed`` GT/s x ``link_width`` lanes after line encoding
  (8b/10b up to 5 GT/s, 128b/130b from 8 GT/s, 242/256 FLIT at 64 GT/s); a speed that is
  missing or unknown is taken as 8 GT/s and a missing width as 16 lanes, as NCCL does
  (logged once per file on the ``mccl`` logger);
* ``<nvlink count=C tclass=T>``: ``C`` links of the GPU's NVLink generation (from its
  ``sm``: :data:`NVLINK_GBPS_BY_SM`) in each direction: to the host's NVSwitch ``nvs``
  (class 0x068000; every NVSwitch of a host is merged into one, as NCCL does: forwarding
  through parallel non-blocking planes is forwarding through one), to another GPU
  (class 0x03xxxx; each GPU lists its own direction) or to its CPU (0x068001, POWER9);
* a PCI bridge (class 0x0604xx) is a switch node ``pcisw{n}``, a CPU a switch ``cpu{numa}``
  (the CPUs of a host are joined pairwise by an SMP link of ``smp_gbps``; :mod:`.cluster`
  leaves the CPUs out where NCCL would not route through them);
* a ``<nic>`` is a switch node ``nic{n}``; each ``<net>`` in it is a port of ``speed``
  Mb/s (``latency`` µs when positive, else ``nic_latency_us``) that :mod:`.cluster` joins
  to the network;
* ``<c2c count bw>`` (Grace Hopper) is a GPU-CPU cable of ``count x bw`` GB/s.
"""

from __future__ import annotations

import logging
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Sequence

from ..errors import TopologyError
from ..files import check_xml, read_bounded
from .cluster import HostSpec, join_host_files

__all__ = ["parse_nccl_xml", "read_nccl_xml", "nccl_cluster", "pcie_gbps", "nvlink_gbps_per_link",
           "NVLINK_GBPS_BY_SM"]

#: one NVLink's bandwidth per direction (Gbps) by the smallest compute capability of
#: its generation: NVLink 1 (P100) 20 GB/s, NVLink 2-4 (V100, A100, H100) 25 GB/s,
#: the A40/RTX bridge (sm 86) 14.0625 GB/s, NVLink 5 (B200) 50 GB/s
NVLINK_GBPS_BY_SM = ((100, 400.0), (90, 200.0), (87, 200.0), (86, 112.5), (70, 200.0), (60, 160.0))
NVLINK_LATENCY_US = 0.025
PCIE_LATENCY_US = 0.1
SMP_LATENCY_US = 0.1
NIC_LATENCY_US = 0.5
#: the link between two CPUs of a host (Gbps; a UPI/xGMI link set, roughly)
SMP_GBPS = 320.0
#: NVLink target classes (NCCL's): an NVSwitch, a CPU; a GPU is any 0x03xxxx
NVSWITCH_CLASS = 0x068000
CPU_CLASS = 0x068001
#: a PCI bridge or switch (class 0x0604xx)
BRIDGE_CLASS = 0x0604
#: what NCCL assumes for a PCIe link whose speed or width it cannot read
FALLBACK_GTS = 8.0
FALLBACK_WIDTH = 16
#: PCI switches nested deeper than this are refused (real hosts have 2-3 levels)
MAX_PCI_DEPTH = 32
_SPEED = re.compile(r"\s*(\d+(?:\.\d+)?)\s*GT/s", re.IGNORECASE | re.ASCII)
_log = logging.getLogger("mccl")


def nvlink_gbps_per_link(sm: int) -> float:
    """One NVLink's Gbps per direction for a GPU of compute capability ``sm`` (e.g. 90)."""
    for low, gbps in NVLINK_GBPS_BY_SM:
        if sm >= low:
            return gbps
    raise TopologyError(f"sm {sm}: no NVLink generation before sm 60 (P100); pass nvlink_gbps")


def pcie_gbps(link_speed: str | None, link_width: str | None, where: str) -> tuple[float, bool]:
    """Gbps per direction of a PCIe link (``"32.0 GT/s PCIe"``, ``"16"``) after encoding,
    and whether the speed or width was unknown (then 8 GT/s, 16 lanes, as NCCL assumes)."""
    match = _SPEED.match(link_speed or "")
    try:
        width = int(link_width or 0)
    except ValueError:
        width = -1
    if width < 0 or width > 64:
        raise TopologyError(f"{where}: link_width {link_width!r} is not a lane count in 1..64; fix the file "
                            "or remove the attribute")
    gts = float(match.group(1)) if match else FALLBACK_GTS
    if not 0 < gts <= 1000:
        raise TopologyError(f"{where}: link_speed {link_speed!r} is out of range; fix the file or remove it")
    encoding = 8 / 10 if gts < 8 else 242 / 256 if gts >= 64 else 128 / 130
    return gts * (width or FALLBACK_WIDTH) * encoding, match is None or width == 0


class _Host:
    """The walk over one ``<system>`` element (module docstring)."""

    def __init__(self, name: str, nvlink_gbps: float | None, smp_gbps: float, nic_latency_us: float):
        self.spec = HostSpec(name)
        self.nvlink_gbps, self.smp_gbps, self.nic_latency_us = nvlink_gbps, smp_gbps, nic_latency_us
        self.gpu_by_busid: dict[str, str] = {}
        self.cpu_of: dict[str, str] = {}
        self.switches = 0
        self.nics = 0
        self.has_nvswitch = False
        self.pending_nvlinks: list[tuple[str, ET.Element, int]] = []
        self.assumed: list[str] = []

    def cable(self, a: str, b: str, gbps: float, lat: float, medium: str) -> None:
        self.spec.links += [(a, b, gbps, lat, medium), (b, a, gbps, lat, medium)]

    def walk(self, system: ET.Element) -> None:
        cpus = [c for c in system if c.tag == "cpu"]
        if not cpus:
            raise TopologyError(f"{self.spec.name}: <system> holds no <cpu>; is this an NCCL topology dump?")
        gpus = self._gpus(system)
        for i, (_, busid, _) in enumerate(gpus):
            self.gpu_by_busid[busid] = f"g{i}"
            self.spec.nodes.append((f"g{i}", "gpu", {"busid": busid}))
        cpu_ids = [f"cpu{cpu.get('numaid', n)}" for n, cpu in enumerate(cpus)]
        if len(set(cpu_ids)) < len(cpu_ids):
            raise TopologyError(f"{self.spec.name}: two <cpu> elements share a numaid; each NUMA node is listed once")
        for cid, cpu in zip(cpu_ids, cpus):
            self.spec.nodes.append((cid, "switch", {"role": "cpu"}))
            for child in cpu:
                self._child(child, cid, cid, 0)
        lost = [busid for busid, gid in self.gpu_by_busid.items() if gid not in self.cpu_of]
        if lost:
            raise TopologyError(f"{self.spec.name}: the GPU at busid {lost[0]!r} is not under a <cpu> (through "
                                "PCI switches); move its <pci> element under its CPU")
        cids = [i for i, _, extra in self.spec.nodes if extra.get("role") == "cpu"]
        for a in range(len(cids)):
            for b in range(a + 1, len(cids)):
                self.cable(cids[a], cids[b], self.smp_gbps, SMP_LATENCY_US, "smp")
        for gid, element, sm in self.pending_nvlinks:
            self._nvlink(gid, element, sm)
        self._mirror_gpu_links()

    def _gpus(self, system: ET.Element) -> list[tuple[tuple[int, int], str, ET.Element]]:
        found = []
        for pci in system.iter("pci"):
            for gpu in pci.findall("gpu"):
                found.append((pci.get("busid", ""), gpu))
        if not found:
            raise TopologyError(f"{self.spec.name}: no <gpu> element; the file describes no GPU")
        use_rank = all(g.get("rank") is not None for _, g in found)
        out = []
        for busid, gpu in found:
            key = _int(gpu.get("rank" if use_rank else "dev"), f"{self.spec.name}: <gpu> {busid!r} "
                       f"{'rank' if use_rank else 'dev'}")
            out.append(((key, len(out)), busid.lower(), gpu))
        out.sort(key=lambda t: t[0])
        keys = [k[0] for k, _, _ in out]
        busids = [b for _, b, _ in out]
        if len(set(busids)) < len(busids):
            raise TopologyError(f"{self.spec.name}: two GPUs share a PCI busid; each <pci> of a GPU has its own")
        if len(set(keys)) < len(keys):
            raise TopologyError(f"{self.spec.name}: two GPUs share a {'rank' if use_rank else 'dev'} number")
        return out

    def _child(self, el: ET.Element, parent: str, cpu: str, depth: int) -> None:
        if el.tag == "nic":
            self._nic(el, parent, None)
        elif el.tag == "pci":
            self._pci(el, parent, cpu, depth)

    def _pci(self, el: ET.Element, parent: str, cpu: str, depth: int) -> None:
        busid = el.get("busid", "?").lower()
        where = f"{self.spec.name}: <pci busid={busid!r}>"
        if depth >= MAX_PCI_DEPTH:
            raise TopologyError(f"{where}: PCI elements nested more than {MAX_PCI_DEPTH} deep; "
                                "is this an NCCL topology dump?")
        klass = _int(el.get("class", "0"), f"{where} class", base=16) >> 8
        gbps, assumed = pcie_gbps(el.get("link_speed"), el.get("link_width"), where)
        if assumed and (el.find("gpu") is not None or el.find("nic") is not None or klass == BRIDGE_CLASS):
            self.assumed.append(busid)
        gpu = el.find("gpu")
        nic = el.find("nic")
        if gpu is not None:
            gid = self.gpu_by_busid[busid]
            self.cpu_of[gid] = cpu
            self.cable(gid, parent, gbps, PCIE_LATENCY_US, "pcie")
            sm = _int(gpu.get("sm"), f"{where} <gpu> sm")
            for sub in gpu:
                if sub.tag == "nvlink":
                    self.pending_nvlinks.append((gid, sub, sm))
                elif sub.tag == "c2c":
                    count = _int(sub.get("count"), f"{where} <c2c> count")
                    bw = _float(sub.get("bw"), f"{where} <c2c> bw")
                    self.cable(gid, cpu, count * bw * 8, PCIE_LATENCY_US, "c2c")
        elif nic is not None:
            self._nic(nic, parent, (gbps, where))
        elif klass == BRIDGE_CLASS:
            sid = f"pcisw{self.switches}"
            self.switches += 1
            self.spec.nodes.append((sid, "switch", {"busid": busid, "role": "pci-switch"}))
            self.cable(sid, parent, gbps, PCIE_LATENCY_US, "pcie")
            for child in el:
                self._child(child, sid, cpu, depth + 1)
        # other PCI devices (storage, ...) carry no collective traffic: left out

    def _nic(self, el: ET.Element, parent: str, pci: tuple[float, str] | None) -> None:
        nid = f"nic{self.nics}"
        self.nics += 1
        self.spec.nodes.append((nid, "switch", {"role": "nic"}))
        total = 0.0
        for n, net in enumerate(el.findall("net")):
            where = f"{self.spec.name}: <net name={net.get('name', '?')!r}>"
            gbps = _float(net.get("speed"), f"{where} speed (Mb/s)") / 1000.0
            lat = _float(net.get("latency", "0"), f"{where} latency")
            self.spec.nic_ports.append((nid, gbps, lat if lat > 0 else self.nic_latency_us))
            total += gbps
        if total == 0:
            raise TopologyError(f"{self.spec.name}: a <nic> holds no <net> port")
        # a NIC straight under a CPU (no PCI element) is joined at its ports' speed
        gbps = total if pci is None else pci[0]
        self.cable(nid, parent, gbps, PCIE_LATENCY_US, "pcie")

    def _nvlink(self, gid: str, el: ET.Element, sm: int) -> None:
        where = f"{self.spec.name}: GPU {gid} <nvlink target={el.get('target', '?')!r}>"
        count = _int(el.get("count"), f"{where} count")
        klass = _int(el.get("tclass", "0"), f"{where} tclass", base=16)
        per_link = self.nvlink_gbps or nvlink_gbps_per_link(sm)
        gbps = count * per_link
        if count < 1:
            raise TopologyError(f"{where}: count must be >= 1, got {count}")
        if klass == NVSWITCH_CLASS:
            if not self.has_nvswitch:
                self.spec.nodes.append(("nvs", "switch", {"role": "nvswitch"}))
                self.has_nvswitch = True
            self.cable(gid, "nvs", gbps, NVLINK_LATENCY_US, "nvlink")
        elif klass >> 16 == 0x03:
            other = self.gpu_by_busid.get(el.get("target", "").lower())
            if other is None:
                raise TopologyError(f"{where}: no GPU with that busid in this file")
            self.spec.links.append((gid, other, gbps, NVLINK_LATENCY_US, "nvlink"))
        elif klass == CPU_CLASS:
            self.cable(gid, self.cpu_of[gid], gbps, NVLINK_LATENCY_US, "nvlink")
        else:
            raise TopologyError(f"{where}: tclass {el.get('tclass')!r} is neither an NVSwitch (0x068000), "
                                "a GPU (0x03xxxx) nor a CPU (0x068001)")

    def _mirror_gpu_links(self) -> None:
        """A GPU-GPU NVLink listed by one side only gets the same capacity back."""
        have = {(s, d) for s, d, *_ in self.spec.links}
        for s, d, gbps, lat, medium in list(self.spec.links):
            if medium == "nvlink" and (d, s) not in have:
                self.spec.links.append((d, s, gbps, lat, medium))
                have.add((d, s))


def _int(text: Any, what: str, base: int = 10) -> int:
    try:
        return int(str(text), base)
    except (TypeError, ValueError):
        raise TopologyError(f"{what} must be an integer, got {text!r}") from None


def _float(text: Any, what: str) -> float:
    try:
        value = float(str(text))
    except (TypeError, ValueError):
        value = float("nan")
    if not value >= 0 or value == float("inf"):
        raise TopologyError(f"{what} must be a number >= 0, got {text!r}")
    return value


def parse_nccl_xml(text: str | bytes, name: str = "host", *, nvlink_gbps: float | None = None,
                   smp_gbps: float = SMP_GBPS, nic_latency_us: float = NIC_LATENCY_US) -> HostSpec:
    """One host of an NCCL topology XML document (module docstring).  ``nvlink_gbps``
    overrides the per-link NVLink bandwidth the GPUs' ``sm`` implies."""
    check_xml(text, name, TopologyError)
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise TopologyError(f"{name}: not well-formed XML ({exc})") from None
    if root.tag != "system":
        raise TopologyError(f"{name}: the root element is <{root.tag}>, an NCCL topology file's is <system>")
    host = _Host(name, nvlink_gbps, smp_gbps, nic_latency_us)
    host.walk(root)
    if host.assumed:
        _log.warning("%s: %d PCIe link(s) without a known speed or width (%s...) taken as %g GT/s x %d, "
                     "as NCCL assumes", name, len(host.assumed), host.assumed[0], FALLBACK_GTS, FALLBACK_WIDTH)
    return host.spec


def read_nccl_xml(path: str | Path, **options: Any) -> HostSpec:
    """:func:`parse_nccl_xml` of a file (at most the project's input size limit)."""
    raw = read_bounded(path, TopologyError, "NCCL topology XML")
    return parse_nccl_xml(raw, Path(path).name, **options)


def nccl_cluster(paths: Sequence[str | Path], network: str | None = None, *, hosts: int | None = None,
                 name: str | None = None, **options: Any) -> dict[str, Any]:
    """The ``mccl-topology/1`` document of one NCCL XML file per host (or one file for
    ``hosts`` identical hosts) joined by ``network`` (:mod:`.cluster`; default ``rail``
    for several hosts, ``none`` for one).  ``Topology.from_nccl_xml`` reads it."""
    return join_host_files(paths, read_nccl_xml, network, hosts=hosts, name=name, source="nccl", **options)
