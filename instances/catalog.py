"""The catalogue of the instance library (docs/benchmarks.md): its families, entries
and constants, and the reader of instance manifests; shared by :mod:`.library` (the
shipped manifest) and :mod:`.tiers` (the solver benchmarking tiers)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from mccl_opt.errors import MCCLError
from mccl_opt.topology import Topology

from . import DATA_DIR
from .fabrics import dgx, full_mesh, irregular, ring
from .failures import apply_failure
from .hpn import hpn

__all__ = ["Instance", "CATALOG", "MANIFEST", "FORMAT", "REL_TOL", "REL_STEP", "FAILURES",
           "HPN_SHAPES", "IRREGULAR_SEEDS", "EXPORTED_MODELS", "SWITCH_REMOVAL_MAX_GPUS",
           "catalog", "hpn_entry", "instance", "read_manifest"]

MANIFEST = DATA_DIR / "manifest.json"
FORMAT = "mccl-instance-manifest/1"
REL_TOL = 1e-6          # two methods agree to this relative tolerance
REL_STEP = 1e-4         # "infeasible just above": x*(1 + REL_STEP) must fail the max-flow test
HPN_SHAPES = ((1, 2, 4), (1, 2, 8), (1, 4, 8), (2, 2, 4), (2, 2, 8))
FAILURES = (None, "fail1", "fail2", "fail3")
IRREGULAR_SEEDS = (1, 2, 3, 4, 5, 6)
EXPORTED_MODELS = ("compact", "master", "switch-removal")
SWITCH_REMOVAL_MAX_GPUS = 16   # the cutting-plane loop runs at build and check time


@dataclass(frozen=True)
class Instance:
    """One catalogue entry: a family, its parameters and the generator call."""

    name: str
    family: str
    params: dict = field(hash=False)
    make: Callable[[], Topology] = field(hash=False, repr=False, compare=False)

    @property
    def path(self):
        return DATA_DIR / f"{self.name}.json"

    def load(self) -> Topology:
        """The shipped file (generated on the fly if the file is missing)."""
        return Topology.load(self.path) if self.path.exists() else self.make()


def hpn_entry(shape: tuple[int, int, int], failure: str | None) -> Instance:
    """The catalogue entry of HPN ``shape`` under ``failure`` (``None``: healthy)."""
    topo_name = "hpn-{}x{}x{}".format(*shape) + (f"-{failure}" if failure else "")
    return Instance(topo_name, "hpn", {"shape": "x".join(map(str, shape)), "failure": failure},
                    lambda: apply_failure(hpn(*shape), failure))


def catalog() -> list[Instance]:
    """The families: HPN S×H×N with each failure (paper §6.1), DGX-like, ring, full mesh,
    seeded irregular fabrics; ordered by family, then size."""
    out = [hpn_entry(shape, f) for shape in HPN_SHAPES for f in FAILURES]
    out.append(Instance("dgx-8", "dgx", {"gpus": 8, "nvswitches": 4}, lambda: dgx()))
    out.append(Instance("ring-8", "ring", {"gpus": 8}, lambda: ring(8)))
    out.append(Instance("mesh-6", "full_mesh", {"gpus": 6}, lambda: full_mesh(6)))
    out += [Instance(f"irregular-{s}", "irregular", {"seed": s}, (lambda s=s: irregular(s)))
            for s in IRREGULAR_SEEDS]
    return out


CATALOG: tuple[Instance, ...] = tuple(catalog())


def instance(name: str) -> Instance:
    """The catalogue entry called ``name``."""
    for inst in CATALOG:
        if inst.name == name:
            return inst
    raise MCCLError(f"no instance {name!r} in the library; known: {', '.join(i.name for i in CATALOG)}")



def read_manifest(path: Path) -> dict:
    """An instance manifest, keyed by instance name under ``"instances"``."""
    if not path.exists():
        raise MCCLError(f"{path} is missing; run `python -m instances.library build`")
    data = json.loads(path.read_text())
    if data.get("format") != FORMAT:
        raise MCCLError(f"{path}: format {data.get('format')!r}, expected {FORMAT!r}")
    data["instances"] = {rec["name"]: rec for rec in data["instances"]}
    return data
