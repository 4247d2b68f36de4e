"""A warm state rebuilt from a schedule's chunk paths: :func:`restore_column_state`.

A schedule read from a file carries its chunks (pair, share, path) but not the final
master's columns, LP shares, basis or pricing certificate, so a warm start from it used
to carry the paths into a full warm master (9 s at 1024 GPUs after Fail2, against
0.3-0.6 s from the schedule kept in memory).  The chunks are enough for the local
re-optimisation (:mod:`.local`): their shares are a *feasible* solution of the master on
the fabric they were rounded for (``t`` = their largest link utilisation), and the local
path needs only that -- it keeps the pairs a capacity change does not touch at those
shares and proves the combined solution optimal with its own Farley certificate over all
pairs, so a rounded starting point costs at most a larger free set, never optimality.

The state is rebuilt when the schedule is loaded (a restarted controller, a CLI run),
not when a failure strikes, as for AllGather (:func:`mccl_opt.allgather.warm.previous.restore_forest_state`); :func:`mccl_opt.restore_warm_state` picks one by collective.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from ..schedule import Schedule
from ..schedule_paths import path_table
from ..topology import Topology
from .problem import Problem, problem_for
from .rows import Rows
from .state import ChunkRoutes, LPColumns, OldFabric, AllToAllWarmState
from .warm import link_lookup

__all__ = ["restore_column_state"]


def restore_column_state(schedule: Schedule, topo: Topology) -> Schedule:
    """``schedule`` (AllToAll, read without its warm state) with a :class:`AllToAllWarmState`
    rebuilt from its chunks on ``topo``, the fabric it was synthesized for (its
    capacities are the ones a later change is compared with).  The schedule is returned
    unchanged if it already has a warm state, is not AllToAll, lists other GPUs, or a
    chunk's path is not a path of ``topo`` from its source to its destination."""
    if schedule.collective != "alltoall" or isinstance(schedule.warm_state, AllToAllWarmState) \
            or tuple(schedule.gpus) != tuple(topo.gpus) or not schedule.chunks:
        return schedule
    state = state_of_chunks(problem_for(topo), schedule.chunks, schedule.max_chunks)
    return schedule if state is None else dataclasses.replace(schedule, warm_state=state)


def state_of_chunks(prob: Problem, chunks: Sequence, max_chunks: int | None) -> AllToAllWarmState | None:
    """The warm state whose LP columns and chunk routes are ``chunks`` themselves (one
    column per chunk, ``y`` = its share); ``None`` if a chunk is not a path of ``prob``'s
    topology between its own GPUs.  Read from the chunks' arrays (:func:`path_table`)."""
    table, positions = path_table(chunks)
    if positions.size < len(chunks):
        return None
    topo = prob.topo
    index = table.node_map([nd.id for nd in topo.nodes])
    rank_of = topo.arrays.rank_of
    src_node, dst_node, nodes = index[table.src], index[table.dst], index[table.paths.flat]
    if (src_node < 0).any() or (dst_node < 0).any() or (nodes < 0).any():
        return None
    src, dst = rank_of[src_node], rank_of[dst_node]
    lengths = table.lengths
    n = lengths.size
    if (src < 0).any() or (dst < 0).any() or (lengths < 2).any() or (src == dst).any():
        return None
    first = table.paths.first[:-1]
    gpu = prob.graph.gpu_nodes
    if (nodes[first] != gpu[src]).any() or (nodes[first + lengths - 1] != gpu[dst]).any():
        return None
    hop = np.ones(nodes.size, dtype=bool)          # node i starts a hop unless it ends a path
    hop[first + lengths - 1] = False
    arcs = link_lookup(prob, nodes[:-1][hop[:-1]], nodes[1:][hop[:-1]])
    if (arcs < 0).any():
        return None
    start = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths - 1, out=start[1:])
    routes = Rows(start, arcs)
    share = table.shares.copy()
    pair = prob.pair_index(src, dst)
    util = routes.loads(share, prob.num_links) / prob.capacity
    lp = LPColumns(pair, routes, share, float(util.max()))
    chunk_routes = ChunkRoutes(pair, routes, share.copy(), np.arange(n, dtype=np.int64), max_chunks)
    return AllToAllWarmState(OldFabric.of(prob), lp, chunk_routes)
