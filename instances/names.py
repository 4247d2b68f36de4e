"""A topology named on a command line: a file, a library instance or an HPN shape
(README "Command line"); every command and the controller read ``--topology`` with it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Sequence

from mccl_opt.errors import TopologyError
from mccl_opt.topology import Topology

__all__ = ["resolve_topology", "generated_gpus", "resolve_part"]

_HPN_NAME = re.compile(r"hpn[- ](\d{1,18})x(\d{1,18})x(\d{1,18})(?:-(fail[123]))?", re.ASCII)   # ASCII digits only


def _names_file(spec: str) -> bool:
    """Whether ``spec`` is read as a topology file (an existing path, or ``.json``/``.gz``)."""
    try:
        is_file = Path(spec).exists()
    except (OSError, ValueError):                # a name the file system refuses (too long, NUL)
        is_file = False
    return is_file or spec.endswith((".json", ".gz"))


def resolve_topology(spec: str) -> Topology:
    """The topology ``spec`` names: an existing ``mccl-topology/1`` file, a library
    instance (``hpn-1x2x8-fail2``, ``dgx-8``, ``irregular-3``; see
    ``instances/data/manifest.json``) or any HPN shape with an optional paper failure
    (``hpn-4x64x8``, ``hpn-2x32x8-fail1``, also written ``hpn 4x64x8``), generated on the fly."""
    from .failures import apply_failure
    from .hpn import hpn
    from .library import CATALOG

    if _names_file(spec):
        return Topology.load(spec)
    for inst in CATALOG:
        if inst.name == spec:
            return inst.load()
    match = _HPN_NAME.fullmatch(spec.strip())
    if match:
        s, h, n = (int(g) for g in match.groups()[:3])
        return apply_failure(hpn(s, h, n), match.group(4))
    raise TopologyError(f"{spec[:80]!r} is neither a topology file nor an instance name; give a "
                        "mccl-topology/1 file, a library name (e.g. hpn-1x2x8-fail2, dgx-8, "
                        "ring-8) or hpn-SxHxN[-fail1|-fail2|-fail3]")


def generated_gpus(spec: str) -> int | None:
    """The GPU count of the HPN shape ``spec`` names (``hpn-SxHxN[-failK]``: S*H*N),
    known without generating it; ``None`` for any other name.  A reader that needs the
    fabric only when it has given GPUs skips generating a large one in vain (issue 27,
    seventh pass: an 8-GPU schedule naming ``hpn-960x64x8`` took 54 s and 1.2 GB)."""
    match = _HPN_NAME.fullmatch(spec.strip())
    if match is None:
        return None
    s, h, n = (int(g) for g in match.groups()[:3])
    return s * h * n


def resolve_part(spec: str, members: Sequence[str]) -> Topology:
    """The fabric ``spec`` names, or for a generated HPN shape only the part of it the GPUs
    ``members`` can use (:func:`instances.hpn.hpn_part`, with its failure): the
    sub-fabric they induce is the same, without generating the whole fabric (issue 27,
    eighth pass).  Any other name: :func:`resolve_topology`."""
    from .failures import apply_failure
    from .hpn import hpn_part
    from .library import CATALOG

    match = _HPN_NAME.fullmatch(spec.strip())
    if match is None or _names_file(spec) or any(inst.name == spec for inst in CATALOG):
        return resolve_topology(spec)
    s, h, n = (int(g) for g in match.groups()[:3])
    return apply_failure(hpn_part(s, h, n, members), match.group(4))
