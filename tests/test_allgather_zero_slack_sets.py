"""What the guarded split's zero-slack sets are (:func:`...removal.cut_guard.zero_slack_sets`;
why they are not :mod:`...packing.contraction`'s tight sets: its module docstring), checked
against every node set of small random split graphs."""

from __future__ import annotations

import numpy as np

from mccl_opt.allgather.forestcoll.removal.cut_guard import zero_slack_sets


def _random_split_graph(rng: np.random.Generator, n: int, gpus: int, k: int):
    """``k`` random spanning arborescences per GPU over ``n`` nodes (nodes from ``gpus`` on
    are switches, rooting nothing), plus a spare unit or two: the rooted cut condition
    holds, some sets tightly."""
    units: dict[tuple[int, int], int] = {}
    for r in range(gpus):
        for _ in range(k):
            order = [r] + [int(v) for v in rng.permutation([v for v in range(n) if v != r])]
            for i in range(1, n):
                u = order[int(rng.integers(0, i))]
                units[u, order[i]] = units.get((u, order[i]), 0) + 1
    for _ in range(int(rng.integers(0, 3))):
        a, b = (int(x) for x in rng.choice(n, 2, replace=False))
        units[a, b] = units.get((a, b), 0) + 1
    keys = sorted(units)
    return (np.array([a for a, _ in keys]), np.array([b for _, b in keys]),
            np.array([units[x] for x in keys], np.int64))


def test_zero_slack_sets_are_gpu_minimal_and_switch_maximal():
    """Each set has no slack, and for a GPU in it holds exactly the GPUs of the smallest
    zero-slack set holding that GPU, with every switch any zero-slack set of those GPUs
    holds (the minimum cut's sink side farthest from the source)."""
    rng = np.random.default_rng(3)
    rows = 0
    for _ in range(40):
        n = int(rng.integers(4, 9))
        ng, k = int(rng.integers(2, n)), int(rng.integers(1, 3))
        tail, head, units = _random_split_graph(rng, n, ng, k)
        bits = (np.arange(1, 1 << n)[:, None] >> np.arange(n)) & 1 == 1
        bits = bits[bits[:, :ng].any(axis=1) & ~bits[:, :ng].all(axis=1)]
        into = (bits[:, head] & ~bits[:, tail]) @ units
        slack = into - k * (~bits[:, :ng]).sum(axis=1)
        tight = bits[slack == 0]
        for row in zero_slack_sets(n, np.arange(ng), k, (tail, head, units), ng):
            rows += 1
            assert row.sum() > 1 and any((row == t).all() for t in tight)
            found = False
            for g in np.flatnonzero(row[:ng]):
                holding = tight[tight[:, g]]
                smallest = holding.all(axis=0)[:ng]
                same = holding[(holding[:, :ng] == smallest).all(axis=1)]
                found |= bool((row[:ng] == smallest).all() and (row == same.any(axis=0)).all())
            assert found
    assert rows > 5
