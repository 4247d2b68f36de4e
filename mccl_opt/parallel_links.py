"""Parallel links: several links listed for one ordered node pair (docs/modelling.md,
"Parallel links").

A schedule path is a node sequence, so a node pair must name one link.  Fabrics written
by hand or imported from capacity matrices list parallel cables (two NVLinks, two NICs to
one switch) as separate links; :func:`merge_parallel` merges each group into one link of
the summed capacity and the smallest latency (the fastest cable sets when the first byte
arrives; the bandwidth of the group is the sum, as in the paper's fluid model §3) and
returns a record of every merge, which :class:`mccl_opt.Topology` keeps in its metadata
under :data:`METADATA_KEY`.

Refused (:class:`TopologyError`): two links carrying the same explicit ``id`` — that is
one link listed twice, not two cables, and summing it would double its capacity.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Sequence

from .errors import TopologyError

if TYPE_CHECKING:
    from .topology import Link

__all__ = ["METADATA_KEY", "merge_parallel", "check_link_ids"]

#: top-level key of a topology's metadata (``Topology.extra``) listing the merges
METADATA_KEY = "parallel_links"


def check_link_ids(links: Sequence["Link"]) -> None:
    """Links that carry an explicit ``id`` must carry distinct ones (like node ids)."""
    seen: dict[Any, int] = {}
    for i, link in enumerate(links):
        if "id" not in link.extra:
            continue
        key = link.extra["id"]
        try:
            first = seen.setdefault(key, i)
        except TypeError:
            raise TopologyError(f"link #{i} ({link.src!r} -> {link.dst!r}): 'id' must be a "
                                f"string or number, got {key!r}") from None
        if first != i:
            other = links[first]
            same = (other.src, other.dst) == (link.src, link.dst)
            what = ("the same link listed twice; remove one, or give parallel cables "
                    "distinct ids" if same else "link ids must be unique")
            raise TopologyError(f"links #{first} ({other.src!r} -> {other.dst!r}) and #{i} "
                                f"({link.src!r} -> {link.dst!r}) both carry id {key!r}: {what}")


def merge_parallel(links: Sequence["Link"]) -> tuple[list["Link"], list[dict[str, Any]]]:
    """``(merged, records)``: the links with each group of parallel links (same ``src``
    and ``dst``) replaced, at the position of its first member, by one link of the summed
    capacity and the smallest latency whose extra keys are those every member carries
    with the same value; ``records`` has one entry per group (``src``, ``dst``, ``links``,
    the merged ``capacity_gbps`` and ``latency_us``, and the ``parts`` as listed)."""
    check_link_ids(links)
    groups: dict[tuple[str, str], list["Link"]] = {}
    for link in links:
        groups.setdefault((link.src, link.dst), []).append(link)
    merged: list["Link"] = []
    records: list[dict[str, Any]] = []
    for (src, dst), parts in groups.items():
        if len(parts) == 1:
            merged.append(parts[0])
            continue
        capacity = float(sum(p.capacity_gbps for p in parts))
        latency = float(min(p.latency_us for p in parts))
        common = {k: v for k, v in parts[0].extra.items()
                  if all(k in p.extra and p.extra[k] == v for p in parts[1:])}
        merged.append(replace(parts[0], capacity_gbps=capacity, latency_us=latency, extra=common))
        records.append({"src": src, "dst": dst, "links": len(parts), "capacity_gbps": capacity,
                        "latency_us": latency,
                        "parts": [{**p.extra, "capacity_gbps": float(p.capacity_gbps),
                                   "latency_us": float(p.latency_us)} for p in parts]})
    return merged, records
