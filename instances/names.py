"""A topology named on a command line: a file, a library instance or an HPN shape
(README "Command line"); every command and the controller read ``--topology`` with it."""

from __future__ import annotations

import re
from pathlib import Path

from mccl_opt.errors import TopologyError
from mccl_opt.topology import Topology

__all__ = ["resolve_topology", "generated_gpus"]

_HPN_NAME = re.compile(r"hpn[- ](\d+)x(\d+)x(\d+)(?:-(fail[123]))?", re.ASCII)   # ASCII digits only


def resolve_topology(spec: str) -> Topology:
    """The topology ``spec`` names: an existing ``mccl-topology/1`` file, a library
    instance (``hpn-1x2x8-fail2``, ``dgx-8``, ``irregular-3``; see
    ``instances/data/manifest.json``) or any HPN shape with an optional paper failure
    (``hpn-4x64x8``, ``hpn-2x32x8-fail1``, also written ``hpn 4x64x8``), generated on the fly."""
    from .failures import apply_failure
    from .hpn import hpn
    from .library import CATALOG

    try:
        is_file = Path(spec).exists()
    except (OSError, ValueError):                # a name the file system refuses (too long, NUL)
        is_file = False
    if is_file or spec.endswith((".json", ".gz")):
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
