"""A rank's stall told from a link's drop (docs/executor.md, "A rank's stall is not a link's
drop"): per collective, a stalled rank slows all of its pairs, a dropped link only the pairs
crossing it; the stalled rank's readings are no link evidence, and a drop is still
reported, also on a link of a rank that stalls."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch  # noqa: F401 - imported before the ranks fork
from hypothesis import given, settings, strategies as st

from executor_cuda.faults import FabricEmulator
from executor_cuda.stalls import MAX_RUN, StallDetector
from instances import hpn
from mccl_opt.errors import TopologyError

TOPO = hpn(1, 2, 4)
G = TOPO.gpus
EMU = FabricEmulator(TOPO, G)


def _pairs() -> list[tuple[int, int]]:
    """Rank pairs with a switch-only path (HPN 1x2x4: a host's GPUs, and rail peers)."""
    out = []
    for s in range(len(G)):
        for d in range(len(G)):
            try:
                if s != d and len(EMU.route(s, d)):
                    out.append((s, d))
            except TopologyError:
                continue
    return out


PAIRS = _pairs()


def _cable(rank: int, other: str) -> set[int]:
    """Both directions of rank ``rank``'s link to node ``other``'s (``nvs`` or ``tor``)."""
    g = G[rank]
    peer = g[:4] + "nvs" if other == "nvs" else "s0tor" + g[-1]
    return {k for k, x in enumerate(TOPO.links) if {x.src, x.dst} == {g, peer}}


def _marks(down: set[int], stalled: set[int]) -> list[int]:
    """The all-reduced matrix when every pair crossing a link of ``down`` reads slow, and
    every pair of a rank of ``stalled`` (both roles, all links)."""
    det = StallDetector(EMU)
    readings = {(s, d): 0.5 if s in stalled or d in stalled or down & set(EMU.route(s, d).tolist()) else 1.0
                for s, d in PAIRS}
    return det.row(readings)


def test_a_stalled_rank_is_found_and_a_dropped_cable_is_not_a_stall():
    det = StallDetector(EMU)
    assert det.stalled(_marks(set(), {5})) == {5}
    sends = det.row({(s, d): 0.5 if s == 6 else 1.0 for s, d in PAIRS})          # a late sender
    receives = det.row({(s, d): 0.5 if d == 6 else 1.0 for s, d in PAIRS})       # a late receiver
    assert det.stalled(sends) == {6} and det.stalled(receives) == {6}
    assert det.stalled(_marks(_cable(0, "tor"), set())) == set()     # fail2: GPU0's NIC, both ways
    assert det.stalled(_marks(_cable(0, "nvs"), set())) == set()     # its NVSwitch link: peers' pairs too
    three = _cable(0, "nvs") | _cable(1, "tor") | {k for k, x in enumerate(TOPO.links)
                                                  if (x.src, x.dst) == ("s0h1g3", "s0h1nvs")}
    assert det.stalled(_marks(three, set())) == set()                # the `three` class
    assert det.stalled(_marks(_cable(0, "tor"), {0})) == {0}         # both at once: that collective only
    assert det.stalled(_marks(_cable(0, "tor"), set())) == set()


_DROPS = st.lists(st.sampled_from([None, "nvs", "tor"]), min_size=len(G), max_size=len(G))


def _down(which: list[str | None], one_way: int) -> set[int]:
    """The links of each GPU's chosen cable (one direction of it when ``one_way`` picks)."""
    links: set[int] = set()
    for r, c in enumerate(which):
        if c is not None:
            cable = sorted(_cable(r, c))
            links |= {cable[one_way % 3]} if one_way % 3 < 2 else set(cable)
    return links


def _one_per_rail(which: list[str | None]) -> None:
    """A rail pair crosses both ends' NICs: with a drop at one end and the other end's NIC
    dropped, the first end's pairs read slow on both its cables, as in a stall of it (the
    next collectives tell, ``MAX_RUN``): keep one end's drop."""
    for r in range(4):
        if which[r] is not None and which[r + 4] is not None and "tor" in (which[r], which[r + 4]):
            which[r + 4] = None


@settings(max_examples=150, deadline=None)
@given(which=_DROPS, one_way=st.integers(0, 8))
def test_drops_on_one_cable_per_gpu_are_never_a_stall(which, one_way):
    """Any GPUs' cables dropped (one per GPU, one or both directions; not both ends of a
    rail through a dropped NIC, :func:`_one_per_rail`): no rank stalls."""
    _one_per_rail(which)
    assert StallDetector(EMU).stalled(_marks(_down(which, one_way), set())) == set()


@settings(max_examples=150, deadline=None)
@given(which=_DROPS, one_way=st.integers(0, 8), stalled=st.integers(0, len(G) - 1))
def test_a_stalled_rank_is_found_beside_drops_elsewhere(which, one_way, stalled):
    """One rank stalled and a drop on another GPU's cable: the stalled rank is found; a rank
    found beside it is its rail peer with a dropped cable (the one reading both explain, left
    to the next collective).  (Two drops in the stalled rank's host can explain all of its
    NVSwitch pairs: the stall is then not found and the 3-of-5 rule is what is left.)"""
    which[stalled] = None
    for r, c in enumerate(which):
        if c is not None and any(x is not None for x in which[:r]):
            which[r] = None
    _one_per_rail(which)
    got = StallDetector(EMU).stalled(_marks(_down(which, one_way), {stalled}))
    assert stalled in got
    assert got <= {stalled, (stalled + 4) % 8}
    assert all(which[r] is not None for r in got - {stalled})


def test_a_gpu_that_loses_two_cables_is_a_stall_for_at_most_max_run_collectives():
    det = StallDetector(EMU)
    both = _marks(_cable(2, "nvs") | _cable(2, "tor"), set())
    got = [det.stalled(both, seq) for seq in range(MAX_RUN + 3)]
    assert got == [{2}] * MAX_RUN + [set()] * 3
    assert det.stalled(_marks(set(), {2})) == set() and det.stalled(_marks(set(), set())) == set()
    assert det.stalled(_marks(set(), {2})) == {2}          # a run ends with a collective read healthy


def _program() -> SimpleNamespace:
    """One message per pair with a path, all in one round (what the reporter reads)."""
    return SimpleNamespace(messages=[SimpleNamespace(src=s, dst=d, round=0, numel=1000) for s, d in PAIRS])


def _feed(rep, det, prog, links: dict[int, float], stalled: set[int], use: bool) -> dict:
    """One collective's samples of every pair: emulated on capacities ``links`` (link ->
    share of nominal), the pairs of ``stalled`` ranks twice as long; folded with the
    detector's verdict when ``use``.  The levels reported, Gbps per GPU pair."""
    from executor_cuda.telemetry import LinkSample

    cap = TOPO.arrays.capacity.astype(float).copy()
    for k, share in links.items():
        cap[k] *= share
    delays = EMU.program_delays(prog, 4, cap)
    samples = [LinkSample(G[s], G[d], 4000, delays[(0, s, d)] * (2.0 if {s, d} & stalled else 1.0), 1, 0, 0)
               for s, d in PAIRS]
    found = det.stalled(det.row(rep.readings(samples, prog, 4))) if use else set()
    return {(x["src"], x["dst"]): x["gbps"] for x in rep(samples, prog, 4, 0.0, stalled=frozenset(G[r] for r in found))}


@pytest.mark.parametrize("share", [0.5, 1 / 8])
def test_stalls_of_a_rank_lower_no_level_and_a_drop_on_its_cable_is_still_reported(share):
    """GPU0 stalls in 3 of 5 collectives (at load 10-17, stalls pass the 3-of-5 rule: the
    reporter alone lowers its pairs), then its NIC drops to ``share`` while it stalls in
    every other collective: with the detector no level moves before the drop, and the drop
    is reported within twice the collectives it needs without stalls."""
    from executor_cuda.pair_levels import ModelReporter
    from executor_cuda.reporting import pair_nominal

    prog = _program()
    rail = (G[0], G[4])
    reps, dets = [ModelReporter(EMU, pair_nominal(TOPO)) for _ in range(2)], [StallDetector(EMU) for _ in range(2)]
    for rep, det in zip(reps, dets):
        _feed(rep, det, prog, {}, set(), False)                    # the warm-up
        rep.calibrating = False
    nominal = pair_nominal(TOPO)
    for k, stall in enumerate([{0}, {0}, set(), {0}, set()]):
        with_det = _feed(reps[0], dets[0], prog, {}, stall, True)
        alone = _feed(reps[1], dets[1], prog, {}, stall, False)
        assert with_det == pytest.approx({p: nominal[p] for p in with_det})
    assert alone[rail] < nominal[rail]                             # the reporter alone took it for a drop
    nic = {k: share for k in _cable(0, "tor")}
    got = [_feed(reps[0], dets[0], prog, nic, {0} if k % 2 == 0 else set(), True)[rail] for k in range(6)]
    needs = 2 if share < 0.3 else 3                                # collectives without stalls (DEEP, 3 of 5)
    assert got[2 * needs - 1] == pytest.approx(share * nominal[rail])


class _Stalling(FabricEmulator):
    """An emulated fabric whose rank sleeps ``stall`` s before posting each round: a
    descheduled rank, late in both roles on all its links."""

    stall = 0.0
    slept: set[int] = set()

    def message_delay_s(self, prog, rnd, msg, nbytes) -> float:
        if self.stall and rnd not in self.slept:
            self.slept.add(rnd)
            time.sleep(self.stall)
        return super().message_delay_s(prog, rnd, msg, nbytes)


#: collective -> rank 0's stall per round (s): on its NIC at 1/4 (0.41 s a message) a shorter
#: stall hides under the emulated time and leaves the reading exact
GLOO_WARM, GLOO_STALLS, GLOO_DROPS = 3, {1: 0.15, 5: 0.6}, (3, 4, 5)


def _gloo_rank(rank: int, world: int) -> dict:
    """Rank 0 stalls in collectives ``GLOO_STALLS``, its NIC runs at 1/4 from
    ``GLOO_DROPS[0]``: per collective, the ranks found stalled; the levels reported last."""
    import torch.distributed as dist

    from executor_cuda.communicator import Communicator
    from executor_cuda.pair_levels import ModelReporter
    from executor_cuda.reporting import pair_nominal
    from executor_cuda.telemetry import Telemetry
    from mccl_opt.baselines import rail_allgather

    topo = hpn(1, 2, 2)
    sched = rail_allgather(topo, version=1)
    emu = _Stalling(topo, sched.gpus, time_scale=5e6)
    tel = Telemetry(flush_interval=None)
    comm = Communicator(None, sched, faults=emu, telemetry=tel, stage_timeout=5.0, oob_timeout=30.0, timeout_s=60.0)
    side = dist.new_group(backend="gloo")
    rep, det = ModelReporter(emu, pair_nominal(topo)), StallDetector(emu)
    cap = topo.arrays.capacity.astype(float).copy()
    nic = [k for k, x in enumerate(topo.links) if {x.src, x.dst} == {"s0h0g0", "s0tor0"}]
    cap[nic] /= 4
    inp, out = torch.full((256,), float(rank)), torch.empty(256 * world)
    found, shown = [], {}
    for i in range(GLOO_WARM + 6):
        k = i - GLOO_WARM
        rep.calibrating = k < 0
        emu.stall, emu.slept = (GLOO_STALLS.get(k, 0.0) if rank == 0 else 0.0), set()
        if k == GLOO_DROPS[0]:
            emu.set_capacities(cap)
        comm.all_gather_into_tensor(out, inp)
        samples = tel.drain()
        prog = comm.cache.get(comm.active["allgather"], 256, comm.pipeline)
        _, stalled = det.agree(rep.readings(samples, prog, 4), [0], side, comm.seq)
        shown.update({(x["src"], x["dst"]): x["gbps"] for x in rep(samples, prog, 4, 0.0, stalled=frozenset(
            sched.gpus[r] for r in stalled))})
        if k >= 0:
            found.append(sorted(stalled))
    comm.close()
    return {"found": found, "shown": shown}


def test_on_gloo_ranks_a_stalled_rank_is_found_and_a_drop_on_its_nic_reported():
    """4 gloo ranks (HPN 1x2x2, rail AllGather): the ranks agree on every verdict; rank 0 is
    found in the collectives it stalls in, the drop of its NIC alone is not a stall, and the
    drop is reported by the receiving rank though rank 0 also stalls."""
    from executor_cuda.launch import run_ranks
    from executor_cuda.reporting import pair_nominal

    res = run_ranks(_gloo_rank, 4, timeout=60)
    found = res[0]["found"]
    assert all(r["found"] == found for r in res)
    assert all(0 in found[k] for k in GLOO_STALLS)
    assert any(0 not in found[k] for k in GLOO_DROPS if k not in GLOO_STALLS)   # a busy core may stall it too
    rail = ("s0h0g0", "s0h1g0")
    assert res[2]["shown"][rail] == pytest.approx(pair_nominal(hpn(1, 2, 2))[rail] / 4, rel=0.05)
    assert all(v == pytest.approx(pair_nominal(hpn(1, 2, 2))[p]) for p, v in res[1]["shown"].items())


def test_a_stalled_ranks_rise_is_read_and_a_new_programs_pairs_give_no_verdict():
    """A stall only slows: a pair of a stalled rank that reads above its level (its NIC back
    from 1/4) is read as without the verdict, its slower pairs are not.  After a swap, pairs
    whose level was measured on the old program read through other bottlenecks: they are
    left out of the verdict until the new program's readings agree with their levels."""
    from executor_cuda.pair_levels import ModelReporter
    from executor_cuda.reporting import pair_nominal

    prog, new = _program(), _program()
    reps = [ModelReporter(EMU, pair_nominal(TOPO)) for _ in range(2)]
    nic = TOPO.arrays.capacity.astype(float).copy()
    nic[sorted(_cable(0, "tor"))] /= 4
    for rep in reps:
        rep(_samples(prog), prog, 4, 0.0)
        rep.calibrating = False
        for _ in range(3):
            rep(_samples(prog, nic), prog, 4, 0.0)
    rail, intra = (G[0], G[4]), (G[0], G[1])
    for _ in range(3):                                   # back, while GPU0 stalls (all its pairs 2x)
        got = [{(x["src"], x["dst"]): x["gbps"] for x in rep(_samples(prog, stall=0), prog, 4, 0.0, stalled=v)}
               for rep, v in zip(reps, (frozenset({G[0]}), frozenset()))]
        assert got[0][rail] == got[1][rail]
        assert got[0][intra] == pytest.approx(2880)
    assert got[1][intra] < 2880                           # without the verdict: 3 of 5 windows
    assert len(reps[0].readings(_samples(prog), prog, 4)) == len(PAIRS)
    after_swap = reps[0].readings(_samples(new), new, 4)
    assert (0, 1) not in after_swap                       # its level was measured on ``prog``
    assert all(reps[0].folded.get((G[s], G[d])) != id(prog) for s, d in after_swap)


def _samples(prog, cap=None, stall: int | None = None) -> list:
    """One collective's samples of every pair on capacities ``cap`` (nominal), the pairs of
    rank ``stall`` twice as long."""
    from executor_cuda.telemetry import LinkSample

    delays = EMU.program_delays(prog, 4, TOPO.arrays.capacity.astype(float) if cap is None else cap)
    return [LinkSample(G[s], G[d], 4000, delays[(0, s, d)] * (2.0 if stall in (s, d) else 1.0), 1, 0, 0)
            for s, d in PAIRS]
