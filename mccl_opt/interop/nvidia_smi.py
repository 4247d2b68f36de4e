"""The matrix ``nvidia-smi topo -m`` prints, as a :class:`~.cluster.HostSpec`
(docs/interop.md "nvidia-smi topo -m").

The matrix gives relations, not speeds, so capacities are options.  Modelling (the same
node ids and capacities as :mod:`.nccl_xml` gives the same host):

* ``NV#`` between GPUs: ``#`` NVLinks of ``nvlink_gbps`` each per direction.  When every
  GPU pair shows the same ``NV#`` and a GPU would need more than :data:`MAX_NVLINKS`
  links for that (``(n-1) x #``), the GPUs meet at one NVSwitch ``nvs`` with ``#`` links
  each (``nvswitch`` forces either reading);
* devices related by ``PIX`` or ``PXB`` share a PCIe switch ``pcisw{i}`` (numbered by
  their first device); each device's PCIe link, and each switch's uplink to its CPU, is
  ``pcie_gbps``; a device with no such partner hangs off its CPU directly;
* the CPU of a GPU is ``cpu{NUMA Affinity}`` (``cpu0`` when ``N/A``); a NIC's is that of a
  GPU it shares a switch or a ``NODE`` relation with; CPUs are joined pairwise by an SMP
  link of ``smp_gbps``;
* every NIC column (``NIC#`` or an HCA name such as ``mlx5_0``) is a switch ``nic{k}``
  with one port of ``nic_gbps``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Sequence

from ..errors import TopologyError
from ..files import read_bounded
from .cluster import HostSpec, join_host_files
from .nccl_xml import NIC_LATENCY_US, NVLINK_LATENCY_US, PCIE_LATENCY_US, SMP_GBPS, SMP_LATENCY_US

__all__ = ["parse_nvidia_smi", "read_nvidia_smi", "smi_cluster", "MAX_NVLINKS", "MAX_DEVICES"]

#: the most NVLinks one GPU has (NVLink 4 and 5: 18)
MAX_NVLINKS = 18
#: devices (GPUs and NICs) of one host's matrix: a real one has tens; parsing is quadratic
MAX_DEVICES = 1024
_RELATIONS = re.compile(r"X|SYS|NODE|PHB|PXB|PIX|NV\d+|C2C|PXN")


def _table(text: str, name: str) -> tuple[list[str], dict[str, list[str]], dict[str, str]]:
    """Device names, each device's relation row, and each GPU's NUMA affinity."""
    lines = [l.rstrip() for l in text.splitlines()]
    header_at = next((i for i, l in enumerate(lines) if re.match(r"\s+GPU0\b", l)), None)
    if header_at is None:
        raise TopologyError(f"{name}: no header line starting with GPU0; is this `nvidia-smi topo -m` output?")
    words = lines[header_at].split()
    cut = next((i for i, w in enumerate(words) if w == "CPU"), len(words))
    devices = words[:cut]
    if len(devices) > MAX_DEVICES:
        raise TopologyError(f"{name}: {len(devices)} devices in the header; one host has at most {MAX_DEVICES}")
    repeated = sorted({d for d in devices if devices.count(d) > 1}) if len(set(devices)) < len(devices) else []
    if repeated:
        raise TopologyError(f"{name}: device {repeated[0]} appears twice in the header; fix the header line")
    rows: dict[str, list[str]] = {}
    numa: dict[str, str] = {}
    for line in lines[header_at + 1:]:
        cells = line.split()
        if not cells or cells[0] not in devices:
            if rows and (not cells or cells[0] in ("Legend:", "NIC")):
                break
            continue
        rel = cells[1:1 + len(devices)]
        bad = [r for r in rel if not _RELATIONS.fullmatch(r)]
        if len(rel) < len(devices) or bad:
            raise TopologyError(f"{name}: row {cells[0]} has {len(rel)} relations for {len(devices)} devices"
                                + (f" and unknown ones {bad[:3]}" if bad else "") + "; fix the row")
        rows[cells[0]] = rel
        rest = cells[1 + len(devices):]
        if cells[0].startswith("GPU") and len(rest) >= 2:
            numa[cells[0]] = rest[-2] if len(rest) >= 3 else rest[-1]
    missing = [d for d in devices if d not in rows]
    if missing:
        raise TopologyError(f"{name}: no row for {', '.join(missing[:4])}")
    _check_matrix(devices, rows, name)
    return devices, rows, numa


def _check_matrix(devices: list[str], rows: dict[str, list[str]], name: str) -> None:
    """The relation matrix is ``X`` on the diagonal only, symmetric, and an ``NV#`` names
    1 to :data:`MAX_NVLINKS` links."""
    for i, a in enumerate(devices):
        row = rows[a]
        if row[i] != "X" or row.count("X") != 1:
            raise TopologyError(f"{name}: row {a} must have X in its own column {a} and nowhere else")
        for j in range(i + 1, len(devices)):
            b = devices[j]
            if row[j] != rows[b][i]:
                raise TopologyError(f"{name}: {a}->{b} is {row[j]} but {b}->{a} is {rows[b][i]}; the "
                                    "matrix of `nvidia-smi topo -m` is symmetric")
            if row[j].startswith("NV") and not 1 <= int(row[j][2:]) <= MAX_NVLINKS:
                raise TopologyError(f"{name}: {a}->{b} is {row[j]}; a GPU pair has 1 to {MAX_NVLINKS} NVLinks")


def parse_nvidia_smi(text: str, name: str = "host", *, nvlink_gbps: float = 200.0,
                     pcie_gbps: float = 32 * 16 * 128 / 130, nic_gbps: float = 400.0,
                     smp_gbps: float = SMP_GBPS, nic_latency_us: float = NIC_LATENCY_US,
                     nvswitch: bool | None = None) -> HostSpec:
    """One host from ``nvidia-smi topo -m`` text (module docstring).  Defaults: NVLink 4
    (25 GB/s per link), PCIe Gen5 x16, 400 Gb/s NICs."""
    devices, rows, numa = _table(text, name)
    gpus = [d for d in devices if re.fullmatch(r"GPU\d+", d)]
    nics = [d for d in devices if d not in gpus]
    if len(gpus) < 1:
        raise TopologyError(f"{name}: no GPU column")
    col = {d: i for i, d in enumerate(devices)}
    local = {d: f"g{i}" for i, d in enumerate(gpus)} | {d: f"nic{k}" for k, d in enumerate(nics)}
    spec = HostSpec(name)
    spec.nodes += [(local[g], "gpu", {"smi": g}) for g in gpus]

    def cable(a: str, b: str, gbps: float, lat: float, medium: str) -> None:
        spec.links.extend([(a, b, gbps, lat, medium), (b, a, gbps, lat, medium)])

    _nvlinks(spec, gpus, rows, col, local, nvlink_gbps, nvswitch, cable)
    cpu_of = {g: f"cpu{numa.get(g, '0') if numa.get(g, 'N/A').isdigit() else '0'}" for g in gpus}
    groups = _pcie_groups(devices, rows, col)
    for nic in nics:
        partner = next((g for g in gpus if _same_group(groups, g, nic) or rows[g][col[nic]] == "NODE"), None)
        cpu_of[nic] = cpu_of[partner] if partner else "cpu0"
    cpus = sorted(set(cpu_of.values()), key=lambda c: int(c[3:]))
    spec.nodes += [(c, "switch", {"role": "cpu"}) for c in cpus]
    for i, a in enumerate(cpus):
        for b in cpus[i + 1:]:
            cable(a, b, smp_gbps, SMP_LATENCY_US, "smp")
    seen: set[int] = set()
    for d in devices:
        gid = groups[d]
        if gid is None:
            cable(local[d], cpu_of[d], pcie_gbps, PCIE_LATENCY_US, "pcie")
            continue
        sw = f"pcisw{sorted(set(g for g in groups.values() if g is not None)).index(gid)}"
        if gid not in seen:
            seen.add(gid)
            spec.nodes.append((sw, "switch", {"role": "pci-switch"}))
            cable(sw, cpu_of[d], pcie_gbps, PCIE_LATENCY_US, "pcie")
        cable(local[d], sw, pcie_gbps, PCIE_LATENCY_US, "pcie")
    spec.nodes += [(local[n], "switch", {"role": "nic", "smi": n}) for n in nics]
    spec.nic_ports = [(local[n], nic_gbps, nic_latency_us) for n in nics]
    return spec


def _nvlinks(spec: HostSpec, gpus: list[str], rows: dict, col: dict, local: dict, gbps: float,
             nvswitch: bool | None, cable: Any) -> None:
    counts = {(a, b): int(rows[a][col[b]][2:]) for a in gpus for b in gpus
              if a != b and rows[a][col[b]].startswith("NV")}
    uniform = len(gpus) > 1 and len(counts) == len(gpus) * (len(gpus) - 1) and len(set(counts.values())) == 1
    k = next(iter(counts.values()), 0)
    if nvswitch is None:
        nvswitch = uniform and (len(gpus) - 1) * k > MAX_NVLINKS
    if nvswitch:
        if not uniform:
            raise TopologyError("an NVSwitch reading needs every GPU pair at the same NV#; "
                                "drop the nvswitch option to read direct NVLinks")
        spec.nodes.append(("nvs", "switch", {"role": "nvswitch"}))
        for g in gpus:
            cable(local[g], "nvs", k * gbps, NVLINK_LATENCY_US, "nvlink")
        return
    for (a, b), n in counts.items():
        spec.links.append((local[a], local[b], n * gbps, NVLINK_LATENCY_US, "nvlink"))


def _pcie_groups(devices: list[str], rows: dict, col: dict) -> dict[str, int | None]:
    """Each device's PCIe switch group (devices joined by PIX/PXB; a union-find keyed by
    the first device), ``None`` for a device alone."""
    parent = {d: d for d in devices}

    def find(d: str) -> str:
        while parent[d] != d:
            parent[d] = parent[parent[d]]
            d = parent[d]
        return d
    for a in devices:
        for b in devices:
            if a != b and rows[a][col[b]] in ("PIX", "PXB"):
                ra, rb = find(a), find(b)
                if ra != rb:
                    first, second = sorted((ra, rb), key=devices.index)
                    parent[second] = first
    sizes: dict[str, int] = {}
    for d in devices:
        sizes[find(d)] = sizes.get(find(d), 0) + 1
    return {d: devices.index(find(d)) if sizes[find(d)] > 1 else None for d in devices}


def _same_group(groups: dict, a: str, b: str) -> bool:
    return groups[a] is not None and groups[a] == groups[b]


def read_nvidia_smi(path: str | Path, **options: Any) -> HostSpec:
    """:func:`parse_nvidia_smi` of a file."""
    raw = read_bounded(path, TopologyError, "nvidia-smi topo -m output")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise TopologyError(f"{path}: not UTF-8 text; save `nvidia-smi topo -m` output as text") from None
    return parse_nvidia_smi(text, Path(path).name, **options)


def smi_cluster(paths: Sequence[str | Path], network: str | None = None, *, hosts: int | None = None,
                name: str | None = None, **options: Any) -> dict[str, Any]:
    """The ``mccl-topology/1`` document of one ``nvidia-smi topo -m`` file per host
    (:func:`mccl_opt.interop.cluster.join_host_files`)."""
    return join_host_files(paths, read_nvidia_smi, network, hosts=hosts, name=name, source="nvidia-smi",
                           **options)
