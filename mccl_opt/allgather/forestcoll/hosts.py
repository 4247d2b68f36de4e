"""Hosts of a fabric or split graph: one grouping of the GPUs by host (paper §4.3's
switch removal, whose sweeps and guesses go host by host).

A GPU's *hub* is the node at the end of its widest out-link: its host's NVSwitch on every
fabric with hosts, whatever the nodes are named or listed in (links of equal width, the
only case where the listing could matter, are taken nearest first in a breadth-first
order).  Two users share it:

* the rooted sweeps' sink order (:func:`.throughput.near_gpus` on a fabric,
  :func:`.removal.splitting.sink_order` on a split graph): a host's GPUs together, hosts
  in breadth-first order (docs/allgather_history.md "Sweeps in structural order");
* the exact split's host seeds (:func:`.removal.exact_split._block_sets`): the hubs of a
  switch's GPU neighbours, with their GPUs (docs/allgather_history.md "Single GPUs and hosts known
  before the guesses").
"""

from __future__ import annotations

import numpy as np

__all__ = ["host_hubs", "order_by_host"]


def _positions(n: int, seen: np.ndarray) -> np.ndarray:
    """Each node's position in ``seen``; ``n`` for a node not in it and for index ``n``."""
    pos = np.full(n + 1, n, np.int64)
    pos[seen] = np.arange(seen.size)
    return pos


def host_hubs(n: int, tail: np.ndarray, head: np.ndarray, width: np.ndarray,
              seen: np.ndarray) -> np.ndarray:
    """Per node, the head of its widest out-link (ties to the earliest in ``seen``, nodes
    in breadth-first order; ``n`` where a node has none): a GPU's host hub."""
    pos = _positions(n, seen)
    by = np.lexsort((pos[head], -np.asarray(width), tail))   # per tail: the widest, then nearest
    first = np.ones(by.size, bool)
    first[1:] = tail[by][1:] != tail[by][:-1]
    hub = np.full(n, n, np.int64)
    hub[tail[by][first]] = head[by][first]
    return hub


def order_by_host(gpus: np.ndarray, hub: np.ndarray, seen: np.ndarray) -> np.ndarray:
    """``gpus`` by the position in ``seen`` of their hub (:func:`host_hubs`; a GPU
    without one last), then by their own: a host's GPUs together."""
    pos = _positions(hub.size, seen)
    return gpus[np.lexsort((pos[gpus], pos[hub[gpus]]))]
