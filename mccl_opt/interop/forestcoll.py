"""AllGather trees in ForestColl's tree XML (docs/interop.md "ForestColl").

ForestColl (paper §4.3 builds on it) prints its spanning trees as ``<tree root=R
index=I nchunks=C height=H>`` elements holding ``<send src=U dst=V path="U,...,V"/>``
(a GPU-to-GPU transfer through switches), each tree carrying ``C`` of the ``k`` equal
parts of its root's shard.  :func:`to_forestcoll_xml` writes an MCCL AllGather schedule
that way (inside one ``<trees>`` element with ``k``, the GPU count and the topology's
name); :func:`from_forestcoll_xml` reads such trees back as a schedule of a topology,
its rate recomputed there, so trees from ForestColl itself can be validated, simulated
and exported (MSCCL XML) with MCCL.  Node names must be the topology's node ids, or be
mapped to them with ``rename`` (ForestColl names nodes like ``(0, 'GPU', 3)``).
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from fractions import Fraction
from typing import Callable, Mapping

from ..errors import ScheduleError, TopologyError
from ..files import check_xml
from ..schedule import Schedule, TreeChunk, bottleneck_links, schedule_rate, share_loads
from ..topology import Topology

__all__ = ["to_forestcoll_xml", "from_forestcoll_xml", "share_denominator"]

#: the largest ``k`` an export looks for (shares are multiples of ``1/k``)
MAX_K = 1 << 16


def share_denominator(shares: list[float], hint: int | None) -> int:
    """The smallest ``k`` with every share a multiple of ``1/k`` (within 1e-9)."""
    candidates = [hint] if hint else []
    candidates.append(math.lcm(*(Fraction(s).limit_denominator(MAX_K).denominator for s in shares)))
    for k in candidates:
        if all(abs(s * k - round(s * k)) <= 1e-6 for s in shares):
            return k
    raise ScheduleError(f"tree shares are not multiples of 1/k for any k <= {MAX_K}; ForestColl's "
                        "format needs whole chunk counts")


def to_forestcoll_xml(schedule: Schedule) -> str:
    """``schedule`` (AllGather) as ForestColl tree XML (module docstring)."""
    if schedule.collective != "allgather":
        raise ScheduleError(f"ForestColl trees describe AllGather; this is an {schedule.collective} schedule")
    chunks = list(schedule.chunks)
    bad = next((n for c in chunks for e in c.edges for n in e if "," in n), None)
    if bad is not None:
        raise ScheduleError(f"node id {bad!r} holds a comma, which ForestColl's path attribute separates nodes by")
    k = share_denominator([c.share for c in chunks], schedule.max_chunks)
    root = ET.Element("trees", {"collective": "allgather", "topology": schedule.topology,
                                "ngpus": str(schedule.num_gpus), "k": str(k)})
    index: dict[str, int] = {}
    for c in chunks:
        depth = c.depths()
        tree = ET.SubElement(root, "tree", {"root": c.src, "index": str(index.get(c.src, 0)),
                                            "nchunks": str(round(c.share * k)),
                                            "height": str(max(depth.values(), default=0))})
        index[c.src] = index.get(c.src, 0) + 1
        for e in sorted(c.edges, key=lambda e: depth.get(e[0], 0)):      # parents before children
            ET.SubElement(tree, "send", {"src": e[0], "dst": e[-1], "path": ",".join(e)})
    ET.indent(root)
    return ET.tostring(root, encoding="unicode") + "\n"


def from_forestcoll_xml(text: str | bytes, topo: Topology, *,
                        rename: Mapping[str, str] | Callable[[str], str] | None = None) -> Schedule:
    """ForestColl trees as an AllGather :class:`Schedule` of ``topo``: each tree's share
    is ``nchunks / k`` (``k``: the ``<trees k>`` attribute, else a root's total
    ``nchunks``), the rate recomputed on ``topo``.  Raises :class:`ScheduleError` naming
    the bad element; the result is not validated (:func:`mccl_opt.check` it)."""
    name = (rename.get if isinstance(rename, Mapping) else rename) or (lambda s: s)
    check_xml(text, "ForestColl tree XML", ScheduleError)
    raw = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
    try:
        root = ET.fromstring(raw)
    except ET.ParseError:
        try:                                          # bare <tree> elements, as ForestColl prints them
            root = ET.fromstring(f"<trees>{raw}</trees>")
        except ET.ParseError as exc:
            raise ScheduleError(f"not well-formed ForestColl tree XML ({exc})") from None
    trees = [root] if root.tag == "tree" else root.findall("tree")
    if not trees:
        raise ScheduleError("no <tree> element; ForestColl's trees look like <tree root=... nchunks=...>")
    raw_trees = []
    for i, t in enumerate(trees):
        try:
            src, count_text = str(name(t.attrib["root"])), t.get("nchunks", "1")
            count = int(count_text) if count_text.isascii() else 0   # int() reads other scripts' digits too
            edges = tuple(tuple(str(name(n.strip())) for n in _split_path(s.attrib["path"])) for s in t.findall("send"))
        except (KeyError, ValueError) as exc:
            raise ScheduleError(f"<tree> #{i}: missing or bad attribute ({exc}); each tree needs root and "
                                "nchunks, each send a path") from None
        if count < 1:
            raise ScheduleError(f"<tree> #{i}: nchunks must be a whole number >= 1 in ASCII digits, "
                                f"got {count_text[:40]!r}")
        raw_trees.append((src, count, edges))
    totals: dict[str, int] = {}
    for src, count, _ in raw_trees:
        totals[src] = totals.get(src, 0) + count
    k_text = root.get("k") or "0"
    if not k_text.isascii() or not k_text.isdigit():
        raise ScheduleError(f"<trees k={k_text[:40]!r}>: k must be a whole number of chunks per GPU")
    k = int(k_text) or max(totals.values())
    if any(t != k for t in totals.values()) or set(totals) != set(topo.gpus):
        raise ScheduleError(f"every GPU of {topo.name!r} must root trees carrying k = {k} chunks in all; "
                            f"got {dict(list(totals.items())[:4])}")
    chunks = [TreeChunk(src, count / k, edges) for src, count, edges in raw_trees]
    try:
        loads = share_loads(topo, chunks)
    except TopologyError as exc:                     # a hop that is no link, an unknown node
        raise ScheduleError(f"the trees do not fit {topo.name!r}: {exc}") from None
    rate = schedule_rate(topo, loads)
    return Schedule("allgather", topo.name, topo.gpus, rate, rate, k, chunks,
                    bottleneck_links(topo, loads, rate, k), solver={"backend": "forestcoll-import"})


def _split_path(path: str) -> list[str]:
    """``"a,b,c"``, or ForestColl's tuples ``"(0, 'GPU', 0),(-1, 'IB', 0)"``."""
    if path.lstrip().startswith("("):
        return ["(" + p.strip().strip("()") + ")" for p in path.split("),")]
    return path.split(",")
