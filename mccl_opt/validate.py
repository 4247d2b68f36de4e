"""The schedule validator (docs/modelling.md, ``mccl check``).

Independent of both synthesizers: it re-derives everything a schedule claims from its
chunks and the topology.  Checked:

* the schedule's GPU list is the topology's rank order;
* every hop is a real link; AllToAll paths start at ``src``, end at ``dst`` and visit no
  node twice; AllGather edges join two GPUs through switches only, and each tree is a
  spanning arborescence rooted at ``src`` (every other GPU the head of exactly one edge);
* every block (AllToAll pair, AllGather root) is delivered: its shares sum to 1, and in
  a rounded schedule they are multiples of ``1/k`` for some ``k <= max_chunks``
  (AllToAll: exactly ``1/max_chunks``);
* the rate recomputed from the link loads equals ``rate_gbps`` and does not exceed
  ``lp_rate_gbps``.

The loads and the rate are computed here, not with the helpers the synthesizers use
(:func:`mccl_opt.schedule.share_loads`, :func:`~mccl_opt.schedule.schedule_rate`):
AllGather shares are summed per distinct path in a dict (array trees: per path of their
table), AllToAll shares per hop over the chunk arrays (:mod:`.validate_paths`, which
also holds the AllToAll checks), each hop is looked up by its node ids in the topology's
link table, and the rate is ``1 / max_a (L_a / cap_a)``, so a bug in the synthesizers'
load arithmetic cannot hide itself.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from fractions import Fraction
from typing import Iterable, Sequence

import numpy as np

from .errors import ScheduleError
from .schedule import Chunk, PathChunk, Schedule, TreeChunk, TreeChunks
from .schedule_chunks import edge_paths
from .topology import Topology
from .validate_paths import SHOWN, check_alltoall, path_loads

__all__ = ["validate", "inspect", "ValidationReport"]


@dataclass(frozen=True)
class ValidationReport:
    """What the validator recomputed."""

    rate_gbps: float
    loads: np.ndarray
    utilisation: np.ndarray
    num_chunks: int
    max_steps: int
    #: the rate the schedule states (``rate_gbps``); differs from ``rate_gbps`` here only
    #: when validated with ``strict=False`` on a fabric it was not solved for
    stated_rate_gbps: float = float("nan")

    @property
    def rate_as_stated(self) -> bool:
        """Whether the recomputed rate is the stated one (relative 1e-6)."""
        return bool(abs(self.rate_gbps - self.stated_rate_gbps) <= 1e-6 * max(self.stated_rate_gbps, 1e-12))

    @property
    def max_utilisation(self) -> float:
        return float(self.utilisation.max()) if self.utilisation.size else 0.0


def _is_multiple(share: float, k: int, tol: float) -> bool:
    return abs(share * k - round(share * k)) <= tol * max(1, k)


def _check_tree(topo: Topology, c: TreeChunk, where: str, problems: list[str]) -> int:
    parent: dict[str, str] = {}
    for j, e in enumerate(c.edges):
        ew = f"{where} edge {j}"
        if not (topo.has_node(e[0]) and topo.has_node(e[-1]) and topo.is_gpu(e[0]) and topo.is_gpu(e[-1])):
            problems.append(f"{ew}: must start and end at GPUs")
            continue
        if any(topo.has_node(v) and topo.is_gpu(v) for v in e[1:-1]):
            problems.append(f"{ew}: interior nodes must be switches")
        if e[-1] in parent or e[-1] == c.src:
            problems.append(f"{ew}: GPU {e[-1]} receives the shard twice")
        parent[e[-1]] = e[0]
    missing = [g for g in topo.gpus if g != c.src and g not in parent]
    if missing:
        problems.append(f"{where}: GPUs {missing[:4]} never receive the shard")
    depths = c.depths()
    unreachable = [g for g in parent if g not in depths]
    if unreachable:
        problems.append(f"{where}: GPUs {unreachable[:4]} hang off a cycle, not the root")
    return max(depths.values()) if depths else 0


def _well_formed_trees(topo: Topology, trees: Sequence[TreeChunk],
                       srcs: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """``(ok, depth)`` per tree (rooted at ``srcs``), checked for all trees at once: every
    edge is a GPU-to-GPU path through switches, every GPU but the root is the head of
    exactly one edge and reaches the root through its parents (parent pointers doubled
    ``log2 N`` times).  Distinct edge paths are checked once (trees share them; array
    trees are read from their path table)."""
    n = topo.num_gpus
    rank = {g: i for i, g in enumerate(topo.gpus)}
    is_gpu = {nd.id: nd.is_gpu for nd in topo.nodes}
    paths, ids, sizes = edge_paths(trees)
    ends = np.full((len(paths), 2), -1, np.int64)      # (tail, head) rank; -1: not GPU-to-GPU
    for j, e in enumerate(paths):
        if all(is_gpu.get(v) is not True for v in e[1:-1]):
            ends[j] = rank.get(e[0], -1), rank.get(e[-1], -1)
    ok = sizes == n - 1
    depth = np.zeros(len(trees), np.int64)
    good = np.flatnonzero(ok)
    if good.size == 0:                 # (a topology has at least two GPUs)
        return ok, depth
    first = np.cumsum(sizes) - sizes
    edge = ends[ids[first[good][:, None] + np.arange(n - 1)]]          # (trees, n-1, 2)
    tail, head = edge[..., 0], edge[..., 1]
    roots = np.array([rank[srcs[t]] for t in good.tolist()], np.int64)
    rows = np.arange(good.size)[:, None]
    fine = (tail >= 0).all(axis=1) & (head >= 0).all(axis=1)
    tail, head = np.where(fine[:, None], tail, 0), np.where(fine[:, None], head, 0)
    count = np.bincount((rows * n + head).ravel(), minlength=good.size * n).reshape(good.size, n)
    expect = np.ones((good.size, n), np.int64)
    expect[rows[:, 0], roots] = 0
    fine &= (count == expect).all(axis=1)
    parent = np.repeat(np.arange(n)[None, :], good.size, axis=0)
    parent[rows, head] = tail
    parent[rows[:, 0], roots] = roots                        # the root points at itself
    dist = (parent != np.arange(n)).astype(np.int64)
    for _ in range(max(1, int(np.ceil(np.log2(n)))) + 1):
        dist = dist + np.take_along_axis(dist, parent, axis=1)
        parent = np.take_along_axis(parent, parent, axis=1)
    fine &= (parent == roots[:, None]).all(axis=1)
    ok[good] = fine
    depth[good] = np.where(fine, dist.max(axis=1), 0)
    return ok, depth


def _check_allgather(topo: Topology, sched: Schedule, tol: float, problems: list[str]) -> int:
    gpus = set(topo.gpus)
    per_root: dict[str, list[float]] = {}
    keep: list[int] = []
    for i, (src, share) in enumerate(_roots_and_shares(sched.chunks)):
        if src is None:
            problems.append(f"chunk {i}: an AllGather chunk must be a tree")
            continue
        where = f"tree {i} (root {src})"
        if src not in gpus:
            problems.append(f"{where}: root is not a GPU of the topology")
            continue
        if share <= 0:
            problems.append(f"{where}: share must be > 0")
        keep.append(i)
        per_root.setdefault(src, []).append(share)
    chunks = sched.chunks
    trees = chunks if len(keep) == len(chunks) else [chunks[i] for i in keep]
    ok, depth = _well_formed_trees(topo, trees, [s for s, _ in _roots_and_shares(trees)])
    max_depth = int(depth.max()) if depth.size else 0
    for i in (keep[t] for t in np.flatnonzero(~ok).tolist()):        # say what is wrong
        c = chunks[i]
        max_depth = max(max_depth, _check_tree(topo, c, f"tree {i} (root {c.src})", problems))
    for g in topo.gpus:
        shares = per_root.get(g, [])
        if abs(sum(shares) - 1.0) > tol:
            problems.append(f"root {g}: tree shares sum to {sum(shares):.9g}, not 1")
        elif sched.max_chunks and shares:
            if not any(all(_is_multiple(s, k, tol) for s in shares)
                       for k in range(1, sched.max_chunks + 1)):
                fr = Fraction(min(shares)).limit_denominator(10_000)
                problems.append(f"root {g}: shares (e.g. {fr}) are not multiples of 1/k for any "
                                f"k <= {sched.max_chunks}")
    return max_depth


def _roots_and_shares(chunks: Sequence[Chunk]) -> list[tuple[str | None, float]]:
    """``(src, share)`` of every tree chunk (``(None, 0.0)`` for a chunk that is no tree),
    read from the arrays of array trees."""
    if isinstance(chunks, TreeChunks):
        table = chunks.table
        return list(zip([table.node_ids[v] for v in table.src.tolist()], table.shares.tolist()))
    return [(c.src, c.share) if isinstance(c, TreeChunk) else (None, 0.0) for c in chunks]


def validate(topo: Topology, schedule: Schedule, *, tol: float = 1e-6, strict: bool = True) -> ValidationReport:
    """Check ``schedule`` against ``topo``; raise :class:`ScheduleError` listing every
    problem found, or return the recomputed :class:`ValidationReport`.  ``strict``: the
    recomputed rate must also be the stated ``rate_gbps``; ``strict=False`` accepts a
    structurally valid schedule that runs at another rate on this fabric (a schedule
    from before a capacity change; what ``mccl check`` and :func:`mccl_opt.check` do
    without ``--strict``), the rate it runs at in the report."""
    report, problems = inspect(topo, schedule, tol=tol, strict=strict)
    if report is None:
        shown = "\n  ".join(problems[:SHOWN])
        more = f"\n  ... and {len(problems) - SHOWN} more" if len(problems) > SHOWN else ""
        raise ScheduleError(f"schedule is invalid for topology {topo.name!r}:\n  {shown}{more}")
    return report


def inspect(topo: Topology, schedule: Schedule, *, tol: float = 1e-6,
            strict: bool = True) -> tuple[ValidationReport | None, list[str]]:
    """The validator without raising: ``(report, [])`` for a valid schedule, ``(None,
    problems)`` otherwise (see :func:`validate`)."""
    problems: list[str] = []
    if tuple(schedule.gpus) != tuple(topo.gpus):
        return None, [f"schedule GPUs {list(schedule.gpus)[:4]}... do not match topology {topo.name!r} "
                      f"ranks {list(topo.gpus)[:4]}...; was it synthesized for another topology?"]
    if schedule.collective == "alltoall":
        steps, table = check_alltoall(topo, schedule, tol, problems)
        loads = path_loads(topo, table, problems)
    else:
        steps = _check_allgather(topo, schedule, tol, problems)
        loads = _link_loads(topo, schedule.chunks, problems)
    rate = _rate(topo, loads)
    problems.extend(f"bottleneck link {b.src[:40]!r} -> {b.dst[:40]!r} is no link of {topo.name!r}"
                    for b in schedule.bottleneck if not topo.has_link(b.src, b.dst))
    as_stated = bool(np.isclose(rate, schedule.rate_gbps, rtol=tol * 10, atol=1e-9))
    if strict and not as_stated:
        problems.append(f"recomputed rate {rate:.9g} Gbps differs from rate_gbps {schedule.rate_gbps:.9g}")
    if strict and schedule.rate_gbps > schedule.lp_rate_gbps * (1 + tol * 10) + 1e-9:
        problems.append(f"rate_gbps {schedule.rate_gbps:.9g} exceeds lp_rate_gbps {schedule.lp_rate_gbps:.9g}")
    if problems:
        return None, problems
    util = rate * loads / topo.arrays.capacity
    return ValidationReport(rate, loads, util, len(schedule.chunks), steps, float(schedule.rate_gbps)), []


def _link_loads(topo: Topology, chunks: Iterable[Chunk], problems: list[str]) -> np.ndarray:
    """``L_a``: the shares crossing each link, summed per distinct path first (AllGather
    trees share their GPU-to-GPU paths); a hop that is no link is a problem (not loaded)."""
    per_path: defaultdict[tuple[str, ...], float] = defaultdict(float)
    if isinstance(chunks, TreeChunks):          # array trees: shares summed per table path
        paths, ids, sizes = edge_paths(chunks)
        weight = np.repeat(chunks.table.shares, sizes)
        for path, share in zip(paths, np.bincount(ids, weights=weight, minlength=len(paths)).tolist()):
            per_path[path] += share             # a table may list one path twice
        chunks = ()
    for c in chunks:
        if isinstance(c, PathChunk):
            per_path[tuple(c.path)] += c.share
        else:
            for e in c.edges:
                per_path[tuple(e)] += c.share
    link_of = {(link.src, link.dst): a for a, link in enumerate(topo.links)}
    arcs: list[int] = []
    weights: list[float] = []
    missing: set[tuple[str, str]] = set()
    for path, share in per_path.items():
        for hop in zip(path, path[1:]):
            a = link_of.get(hop)
            if a is None:
                missing.add(hop)
            else:
                arcs.append(a)
                weights.append(share)
    for u, v in sorted(missing)[:5]:
        problems.append(f"hop {u} -> {v} is not a link of the topology")
    return np.bincount(np.asarray(arcs, dtype=np.int64), weights=np.asarray(weights, dtype=float),
                       minlength=topo.num_links)


def _rate(topo: Topology, loads: np.ndarray) -> float:
    """``1 / max_a (L_a / cap_a)`` over the loaded links (``inf`` when none is loaded)."""
    used = loads > 1e-12
    if not used.any():
        return float("inf")
    return float(1.0 / np.max(loads[used] / topo.arrays.capacity[used]))
