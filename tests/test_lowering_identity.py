"""The vectorized lowering (issue 26) gives exactly the per-hop lowering's program.

``lowering_reference.reference_compile`` is the compiler before vectorization; every
field of the global program (rounds, messages, segment order on both ends, staging
sizes) must be equal, and a faulty schedule must be refused with the same message.
Schedules: baselines on HPN, and random ones on irregular GPU names with switch hops,
relays and unrounded shares.
"""

from __future__ import annotations

import random

import pytest

from instances import hpn
from tests.lowering_reference import reference_compile
from mccl_opt.baselines import pxn_alltoall, rail_allgather, rail_alltoall, ring_allgather
from mccl_opt.errors import ScheduleError
from mccl_opt.lowering.program import compile_schedule, direct_schedule
from mccl_opt.schedule import PathChunk, Schedule, TreeChunk

GPUS = tuple(f"gpu{c}" for c in "qwertyu")          # 7 GPUs, names not in rank order


def _shares(rng: random.Random, k: int, rounded: bool) -> list[float]:
    if rounded:
        cuts = sorted(rng.sample(range(1, 8), k - 1))
        return [(b - a) / 8 for a, b in zip([0] + cuts, cuts + [8])]
    w = [rng.random() + 0.05 for _ in range(k)]
    return [x / sum(w) for x in w]


def _random_tree(rng: random.Random, root: str) -> tuple[tuple[str, ...], ...]:
    order = [root] + rng.sample([g for g in GPUS if g != root], len(GPUS) - 1)
    edges = []
    for i, v in enumerate(order[1:], 1):
        u = order[i - 1 if rng.random() < 0.6 else rng.randrange(i)]   # chains and fans
        edges.append((u, "sw0", v) if rng.random() < 0.5 else (u, v))
    rng.shuffle(edges)
    return tuple(edges)


def random_allgather(seed: int, rounded: bool) -> Schedule:
    rng = random.Random(seed)
    chunks = [TreeChunk(r, f, _random_tree(rng, r)) for r in GPUS
              for f in _shares(rng, rng.randint(1, 3), rounded)]
    rng.shuffle(chunks)
    return Schedule("allgather", "irregular", GPUS, 1.0, 1.0, 8 if rounded else None, tuple(chunks))


def random_alltoall(seed: int, rounded: bool) -> Schedule:
    rng = random.Random(seed)
    chunks = []
    for s in GPUS:
        for d in GPUS:
            if s != d:
                for f in _shares(rng, rng.randint(1, 3), rounded):
                    relays = rng.sample([g for g in GPUS if g not in (s, d)], rng.randint(0, 2))
                    path = [s] + [x for r in relays for x in (("leaf1", r) if rng.random() < 0.5 else (r,))]
                    chunks.append(PathChunk(s, d, f, tuple(path + ["spine", d])))
    rng.shuffle(chunks)
    return Schedule("alltoall", "irregular", GPUS, 1.0, 1.0, 8 if rounded else None, tuple(chunks))


SCHEDULES = {
    "a2a-direct": lambda: direct_schedule("alltoall", hpn(1, 2, 2).gpus),
    "a2a-rail-split": lambda: rail_alltoall(hpn(1, 2, 4), split=True),
    "a2a-pxn": lambda: pxn_alltoall(hpn(2, 2, 2)),
    "ag-direct": lambda: direct_schedule("allgather", hpn(1, 2, 2).gpus),
    "ag-rail-split": lambda: rail_allgather(hpn(1, 2, 4), split=True),
    "ag-ring": lambda: ring_allgather(hpn(1, 2, 2)),
    **{f"a2a-random{s}-{r}": (lambda s=s, r=r: random_alltoall(s, r)) for s in (1, 2) for r in (0, 1)},
    **{f"ag-random{s}-{r}": (lambda s=s, r=r: random_allgather(s, r)) for s in (1, 2) for r in (0, 1)},
}


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_vectorized_program_equals_per_hop_program(name):
    schedule = SCHEDULES[name]()
    for block, pipeline in [(0, 1), (1, 2), (5, 1), (13, 2), (97, 3), (1000, 2)]:
        assert compile_schedule(schedule, block, pipeline) == reference_compile(schedule, block, pipeline)


def _replace(s: Schedule, i: int, chunk) -> Schedule:
    chunks = list(s.chunks)
    chunks[i:i + 1] = [chunk] if chunk is not None else []
    return Schedule(s.collective, s.topology, s.gpus, 1.0, 1.0, None, tuple(chunks))


def _faults():
    a2a, ag = random_alltoall(3, False), random_allgather(3, False)
    c, t = a2a.chunks[5], ag.chunks[4]
    i, j = next((i, j) for i, e in enumerate(t.edges) for j, f in enumerate(t.edges) if f[0] == e[-1])
    cycle = t.edges[:i] + ((t.edges[j][-1], t.edges[i][-1]),) + t.edges[i + 1:]
    yield _replace(a2a, 5, None)                                                  # shares / missing
    yield _replace(a2a, 5, PathChunk(c.src, c.dst, c.share, c.path[:-1]))        # wrong end
    yield _replace(a2a, 5, PathChunk(c.src, c.dst, c.share, (c.src, c.src) + c.path[1:]))  # revisit
    yield _replace(ag, 4, None)
    yield _replace(ag, 4, TreeChunk(t.src, t.share, t.edges[1:]))                # a GPU not reached
    yield _replace(ag, 4, TreeChunk(t.src, t.share, cycle))                     # a cycle
    yield _replace(ag, 4, TreeChunk(t.src, t.share, (("sw0", t.edges[0][-1]),) + t.edges[1:]))
    yield _replace(ag, 4, TreeChunk(t.src, t.share, ((t.src, t.src),) + t.edges[1:]))
    yield Schedule("alltoall", "t", GPUS[:3], 1.0, 1.0, None,
                   tuple(c for c in a2a.chunks if c.src in GPUS[:3] and c.dst in GPUS[:3]) * 2)


def test_faulty_schedules_refused_with_the_per_hop_message():
    for schedule in _faults():
        with pytest.raises(ScheduleError) as old:
            reference_compile(schedule, 16, 2)
        with pytest.raises(ScheduleError) as new:
            compile_schedule(schedule, 16, 2)
        assert str(new.value) == str(old.value)
    c = random_alltoall(3, False).chunks[5]            # the per-hop lowering's IndexError
    with pytest.raises(ScheduleError, match="must start at the source GPU"):
        compile_schedule(_replace(random_alltoall(3, False), 5,
                                  PathChunk(c.src, c.dst, c.share, ("spine",))), 16, 1)
