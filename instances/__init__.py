"""Topology generators and shipped instances (docs/modelling.md).

``hpn`` builds the paper's rail-optimized S×H×N fabric, ``fail1/fail2/fail3`` the
paper's gray failures; ``dgx``, ``ring``, ``full_mesh`` and ``irregular`` are small test
fabrics; ``instances.aggregation`` the aggregation-layer families (shared aggregation
switch, several spines, leaf-spine, SuperPOD-like, host ring and torus) and ``scrambled``.
``load_instance(name)`` reads a JSON file shipped under ``instances/data``.
"""

from __future__ import annotations

from pathlib import Path

from mccl_opt.topology import Topology

from .aggregation import (AGGREGATION_FAMILIES, host_ring, host_torus, leaf_spine, multi_spine,
                          scrambled, shared_aggregation, superpod)
from .fabrics import dgx, full_mesh, irregular, ring
from .failures import FAILURES, apply_failure, degrade, fail1, fail2, fail3
from .hpn import hpn, parse_shape

__all__ = ["hpn", "parse_shape", "fail1", "fail2", "fail3", "FAILURES", "apply_failure", "degrade",
           "dgx", "ring", "full_mesh", "irregular", "shared_aggregation", "multi_spine", "leaf_spine",
           "superpod", "host_ring", "host_torus", "scrambled", "AGGREGATION_FAMILIES", "DATA_DIR",
           "shipped_instances", "load_instance"]

DATA_DIR = Path(__file__).parent / "data"


def shipped_instances() -> list[str]:
    """Names of the topology files shipped under ``instances/data`` (without ``.json``)."""
    return sorted(p.stem for p in DATA_DIR.glob("*.json") if p.stem != "manifest")


def load_instance(name: str) -> Topology:
    """Load a shipped instance by name (see :func:`shipped_instances`)."""
    return Topology.load(DATA_DIR / f"{name}.json")
