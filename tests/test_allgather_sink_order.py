"""The exact split's sink order (``removal.splitting.sink_order``): a speed hint only.

The rooted scans of the exact split move the sink from GPU to GPU repairing one flow;
``sink_order`` keeps a host's GPUs together so that a listing with shuffled ranks scans
as cheaply as one in rank order (docs/allgather.md, *Leaf-spine 8x2x8 in any listing*).
Its results are a minimum or a pass/fail over all sinks, so any order must give the same
split.
"""

from __future__ import annotations

import numpy as np

from instances.aggregation import leaf_spine, scrambled
from mccl_opt.allgather.canonical import canonical
from mccl_opt.allgather.forestcoll.removal.exact_split import split_all
from mccl_opt.allgather.forestcoll.removal.splitting import sink_order
from tests.test_allgather_split_arrays import split_of


def test_sink_order_keeps_hosts_together_in_any_listing():
    """Scrambled leaf-spine (ranks shuffled): the order is a permutation of the GPUs in
    which each host's GPUs (one NVSwitch) are consecutive."""
    topo = canonical(scrambled(leaf_spine(2, 2, 4), 7))
    g, _ = split_of(topo)
    order = sink_order(g).tolist()
    assert sorted(order) == sorted(g.gpus.tolist())
    arr = topo.arrays
    host = {}                       # GPU node -> its NVSwitch (the neighbour switch of
    for a, b, c in zip(arr.tail.tolist(), arr.head.tolist(), arr.capacity.tolist()):
        if not arr.is_switch[a] and arr.is_switch[b] and c > host.get(a, (0, -1))[0]:
            host[a] = (c, b)        # the widest link)
    runs = [host[v][1] for v in order]
    changes = sum(x != y for x, y in zip(runs, runs[1:]))
    assert changes == len(set(runs)) - 1 == 3


def test_the_exact_split_does_not_depend_on_the_sink_order():
    """The same logical links and units with the GPUs scanned in reverse or shuffled."""
    g, _ = split_of(scrambled(leaf_spine(2, 2, 4, spines=2), 3))
    results = []
    rng = np.random.default_rng(5)
    for near in (None, g.gpus[::-1].copy(), rng.permutation(g.gpus)):
        h = g.copy()
        h.near = None if near is None else np.asarray(near, np.int64)
        assert split_all(h)
        results.append(h.units)
    assert results[0] == results[1] == results[2]
