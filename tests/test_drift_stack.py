"""ProfileStack (Algorithm 1 on every collective at once, paper §3.2) against the
per-collective reference: :func:`detect` plus the capacity-gained test on the
collective's own links, on random batches, with whole-fabric and sub-fabric
communicators, equal capacity rows (shared slots) and rows with no finite link."""

from __future__ import annotations

import numpy as np
import pytest

from instances import fail2, hpn
from mccl_opt.baselines import direct_alltoall, ring_allgather
from mccl_runtime.drift import ProfileStack, detect, profile_schedule
from mccl_runtime.groups import Groups

GAMMA = 0.1
TOPO = hpn(1, 4, 4)


def _collectives():
    """``(profile, gain capacity row, links or None)`` of whole-fabric and sub-fabric
    communicators; the gain row is ``inf`` outside a sub-fabric, as the manager builds it."""
    groups = Groups(TOPO)
    cap = TOPO.arrays.capacity
    degraded = fail2(TOPO).arrays.capacity
    hosts = [TOPO.gpus[i:i + 4] for i in range(0, 16, 4)]
    rails = [TOPO.gpus[r::4] for r in range(4)]
    out = []
    for synth in (cap, degraded):
        whole = TOPO.with_capacities(synth)
        for build in (ring_allgather, direct_alltoall):
            prof = profile_schedule(whole, build(whole))
            out += [(prof, synth.copy(), None), (prof, synth.copy(), None)]   # equal rows: one slot
        for members, builds in [(g, (ring_allgather, direct_alltoall)) for g in hosts[:2] + rails[:2]] + [
                (hosts[0] + hosts[1], (direct_alltoall,))]:         # a ring across hosts crosses rails
            sub = groups.fabric(tuple(members))
            on = sub.measured(synth)
            for build in builds:
                prof = groups.lift(tuple(members), profile_schedule(on, build(on)))
                row = np.full(TOPO.num_links, np.inf)
                row[sub.links] = synth[sub.links]
                out.append((prof, row, sub.links))
    # a collective whose gain row has no finite link: never flagged by a gain
    out.append((out[0][0], np.full(TOPO.num_links, np.inf), np.zeros(0, dtype=np.int64)))
    return out


COLLECTIVES = _collectives()


def _reference(m: np.ndarray) -> list[bool]:
    flags = []
    for prof, row, links in COLLECTIVES:
        sel = slice(None) if links is None else links
        gained = bool(np.any(m[sel] > (1.0 + GAMMA) * row[sel]))
        flags.append(detect(m, prof, GAMMA).flagged or gained)
    return flags


@pytest.mark.parametrize("seed", range(6))
def test_stack_flags_what_each_collective_flags(seed):
    rng = np.random.default_rng(seed)
    stack = ProfileStack([c[0] for c in COLLECTIVES], [c[1] for c in COLLECTIVES], GAMMA)
    cap = TOPO.arrays.capacity
    seen = set()
    for _ in range(40):
        m = cap * (1.0 + 0.01 * rng.standard_normal(cap.size))
        hit = rng.choice(cap.size, size=int(rng.integers(0, 4)), replace=False)
        m[hit] *= rng.choice([0.1, 0.5, 0.85, 1.15, 1.5, 9.0], size=hit.size)
        got = stack.flags(m).tolist()
        assert got == _reference(m)
        seen.update(got)
    assert seen == {False, True}                     # both answers occur


def test_equal_rows_share_a_slot_and_empty_rows_have_none():
    stack = ProfileStack([c[0] for c in COLLECTIVES], [c[1] for c in COLLECTIVES], GAMMA)
    assert stack.gain_of[0] == stack.gain_of[1]
    assert stack.gain_of[-1] == len(stack.gain_start)          # the always-False entry
    sub_rows = [i for i, c in enumerate(COLLECTIVES) if c[2] is not None and len(c[2])]
    # a sub-fabric row keeps only its own links
    assert len(stack.gain_link) < len(set(stack.gain_of.tolist())) * TOPO.num_links
    i = sub_rows[0]
    k = stack.gain_of[i]
    end = stack.gain_start[k + 1] if k + 1 < len(stack.gain_start) else len(stack.gain_link)
    np.testing.assert_array_equal(stack.gain_link[stack.gain_start[k]:end], COLLECTIVES[i][2])


def test_one_gained_link_flags_only_communicators_holding_it():
    stack = ProfileStack([c[0] for c in COLLECTIVES], [c[1] for c in COLLECTIVES], GAMMA)
    m = np.minimum(TOPO.arrays.capacity, fail2(TOPO).arrays.capacity)
    base = stack.flags(m)
    nvs = TOPO.link_index("s0h3g2", "s0h3nvs")          # host 3: in no listed sub-fabric
    m[nvs] *= 2.0
    got = stack.flags(m)
    holding = [links is None or nvs in links for _, _, links in COLLECTIVES]
    assert got.tolist() == [b or h for b, h in zip(base.tolist(), holding)]
    assert got.tolist() == _reference(m)


def test_empty_stack():
    stack = ProfileStack([], [], GAMMA)
    assert stack.flags(TOPO.arrays.capacity).tolist() == []


def test_equal_profiles_share_a_row_and_different_ones_do_not():
    """One schedule registered twice (two profile objects) is one row of Algorithm 1; a
    profile differing only in its base slacks or its cut keeps its own row and answer."""
    from mccl_runtime.drift import ScheduleProfile

    whole = [c for c in COLLECTIVES if c[2] is None]
    p, row = whole[0][0], whole[0][1]
    twin = ScheduleProfile(p.n.copy(), p.cut.copy(), p.base_slack.copy(), p.loads.copy())
    shifted = ScheduleProfile(p.n, p.cut, p.base_slack + 0.2, p.loads)        # flags on a healthy fabric
    fewer = ScheduleProfile(p.n, p.cut[1:], p.base_slack[1:], p.loads)
    other = np.setdiff1d(np.flatnonzero(p.n), p.cut)[0]                     # a used link outside the cut
    moved = ScheduleProfile(p.n, np.r_[other, p.cut[1:]], p.base_slack, p.loads)
    profiles = [p, twin, shifted, fewer, moved, whole[2][0]]
    stack = ProfileStack(profiles, [row] * len(profiles), GAMMA)
    assert stack.row_of[0] == stack.row_of[1] and len(set(stack.row_of.tolist())) == 5
    rng = np.random.default_rng(7)
    cap = TOPO.arrays.capacity
    for _ in range(30):
        m = cap * (1.0 + 0.01 * rng.standard_normal(cap.size))
        m[rng.integers(cap.size)] *= rng.choice([0.1, 0.5, 1.5])
        want = [detect(m, q, GAMMA).flagged or bool(np.any(m > (1.0 + GAMMA) * row)) for q in profiles]
        assert stack.flags(m).tolist() == want
    assert stack.flags(cap).tolist() == [False, False, True, False, True, False]


def test_rate_loss_after_a_rebase_adds_up_from_the_built_for_fabric():
    """A schedule re-based (``no_gain``) part-way down a ramp: the ``gamma`` rate test reads
    the fabric it was built for, so later small steps add up, yet a loss no schedule can
    undo does not flag again (issue 26 item 3).  Scaling every link keeps every slack, so
    only the rate tests can flag."""
    cap = TOPO.arrays.capacity

    def flags(rebased: float, now: float, built_for: bool = True) -> bool:
        prof = profile_schedule(TOPO.with_capacities(rebased * cap), direct_alltoall(TOPO))
        stack = ProfileStack([prof], [rebased * cap], GAMMA, 0.05, 0.5 * GAMMA, [cap] if built_for else None)
        return bool(stack.flags(now * cap)[0])

    assert flags(0.95, 0.88)                    # 12 % below the built-for rate, 7 % since the re-base
    assert not flags(0.95, 0.88, built_for=False)   # measured from the re-base: never adds up
    assert not flags(0.95, 0.92)                # 8 % since it was built: within gamma
    assert not flags(0.85, 0.83)                # 2 % since the re-base: the loss already had no gain
