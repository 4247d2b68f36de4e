"""What ``mccl topo`` prints about a fabric: sizes, link speeds, link classes, degraded
links and merged parallel links (``mccl topo show`` and every builder and importer)."""

from __future__ import annotations

from collections import Counter

from ..tables import print_json, print_table

__all__ = ["summary", "report"]


def summary(topo) -> dict:
    """What ``topo show`` prints: sizes, links by capacity and latency, the link classes
    with their nominal capacities, the degraded links (:mod:`mccl_opt.link_classes`)
    and the merged parallel links."""
    from ..link_classes import DEGRADED_BELOW, degraded_links, link_classes, nominal_capacities

    speeds = Counter((round(l.capacity_gbps, 6), round(l.latency_us, 6)) for l in topo.links)
    labels = link_classes(topo)
    nominal = nominal_capacities(topo, labels=labels)
    return {
        "name": topo.name, "gpus": topo.num_gpus, "switches": len(topo.switches),
        "links": topo.num_links,
        "link_speeds": [{"capacity_gbps": c, "latency_us": lat, "count": n}
                        for (c, lat), n in sorted(speeds.items(), reverse=True)],
        "link_classes": [{"class": label, "links": n, "nominal_gbps": nominal[label]}
                         for label, n in Counter(labels).items()],
        "degraded_below": DEGRADED_BELOW,
        "degraded_links": [d.to_dict() for d in degraded_links(topo, labels=labels)],
        "parallel_links": topo.parallel_links,
    }


def report(topo, as_json: bool) -> None:
    """Print :func:`summary` as tables, or as JSON."""
    info = summary(topo)
    if as_json:
        print_json(info)
        return
    print(f"topology {info['name']}: {info['gpus']} GPUs, {info['switches']} switches, "
          f"{info['links']} directed links")
    print_table(["capacity_gbps", "latency_us", "links"],
                [(c["capacity_gbps"], c["latency_us"], c["count"]) for c in info["link_speeds"]])
    print(f"link classes: {len(info['link_classes'])} (each with its nominal capacity in --json)")
    degraded = info["degraded_links"]
    print(f"degraded links (below {info['degraded_below']:g} x nominal): "
          f"{len(degraded) or 'none'}")
    if degraded:
        print_table(["src", "dst", "gbps", "nominal", "class", "reverse_gbps", "direction"],
                    [(d["src"], d["dst"], d["capacity_gbps"], d["nominal_gbps"], d["link_class"],
                      "none" if d["reverse_gbps"] is None else d["reverse_gbps"],
                      "one way" if d["one_direction"] else "both ways" if d["reverse_gbps"] is not None else "-")
                     for d in degraded])
    merged = info["parallel_links"]
    if merged:
        print(f"parallel links merged (summed capacity, smallest latency): {len(merged)} node pair(s)")
        print_table(["src", "dst", "links", "gbps", "latency_us", "parts_gbps"],
                    [(r["src"], r["dst"], r["links"], r["capacity_gbps"], r["latency_us"],
                      "+".join(f"{p['capacity_gbps']:g}" for p in r["parts"])) for r in merged])
