"""Degraded copies of a fabric that remember what they came from (docs/interop.md
"Degrade, then re-solve warm").

:func:`degrade_links` returns a topology with some links' capacities changed and a
``degraded_from`` record in its metadata: the parent's name, each changed link with its
capacity before and after, and the parent's own record (a chain).  :func:`ancestor`
rebuilds any fabric of that chain by name, so a warm start from a schedule solved for
the healthy fabric finds that fabric without being told (paper §3.2: a warm
re-synthesis measures the change against the fabric the old schedule was solved for).
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

from .errors import InputError, TopologyError
from .topology import Topology

__all__ = ["degrade_links", "ancestor", "RECORD_KEY"]

RECORD_KEY = "degraded_from"


def degrade_links(topo: Topology, links: Iterable[tuple[str, str]], *, gbps: float | None = None,
                  fraction: float | None = None, both_directions: bool = True,
                  name: str | None = None) -> Topology:
    """``topo`` with each link ``(src, dst)`` set to ``gbps``, or to ``fraction`` of its
    capacity (and its reverse link too unless ``both_directions`` is false), named
    ``name`` (default ``<name>-degraded``) and recording its parent (module docstring)."""
    if (gbps is None) == (fraction is None):
        raise InputError("give exactly one of gbps (the new capacity) and fraction (of the current one)")
    value = gbps if gbps is not None else fraction
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value <= 0 or (fraction is not None and value > 1):
        what = "gbps must be a number > 0" if gbps is not None else "fraction must be in (0, 1]"
        raise InputError(f"{what}, got {value!r}")
    pairs = []
    for src, dst in links:
        pairs.append((src, dst))
        if both_directions:
            if not topo.has_link(dst, src):
                raise TopologyError(f"no link {dst!r} -> {src!r} in {topo.name!r} (the reverse of the "
                                    f"link to degrade); degrade one way only")
            pairs.append((dst, src))
    if not pairs:
        raise InputError("no link to degrade; name at least one SRC,DST pair")
    changes = {}
    for pair in dict.fromkeys(pairs):
        before = topo.link(*pair).capacity_gbps
        changes[pair] = float(gbps) if gbps is not None else before * float(fraction)
    record: dict[str, Any] = {
        "name": topo.name,
        "links": [{"src": s, "dst": d, "gbps": c, "was_gbps": topo.link(s, d).capacity_gbps}
                  for (s, d), c in changes.items()]}
    parent = topo.extra.get(RECORD_KEY)
    if isinstance(parent, Mapping):
        record["parent"] = parent
    out = topo.with_capacity(changes)
    extra = {**out.extra, RECORD_KEY: record}
    return Topology(name or f"{topo.name}-degraded", out.nodes, out.links, extra)


def ancestor(topo: Topology, name: str) -> Topology | None:
    """The fabric called ``name`` in ``topo``'s degrade chain, rebuilt by undoing the
    recorded changes (``topo`` itself when it has that name), or ``None``."""
    current, record = topo, topo.extra.get(RECORD_KEY)
    while current.name != name:
        if not isinstance(record, Mapping):
            return None
        try:
            undo = {(str(l["src"]), str(l["dst"])): float(l["was_gbps"]) for l in record["links"]}
            parent_name = str(record["name"])
        except (KeyError, TypeError, ValueError):
            raise TopologyError(f"topology {topo.name!r}: its '{RECORD_KEY}' record is malformed; "
                                "remove it or write it with mccl topo degrade") from None
        extra = {k: v for k, v in current.extra.items() if k != RECORD_KEY}
        record = record.get("parent")
        if isinstance(record, Mapping):
            extra[RECORD_KEY] = record
        reverted = current.with_capacity(undo)
        current = Topology(parent_name, reverted.nodes, reverted.links, extra)
    return current
