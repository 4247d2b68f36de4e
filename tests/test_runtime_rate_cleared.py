"""A job is not "cleared" while its collective's rate stays lost (docs/runtime.md,
"Capacity lost: a job is not cleared while the rate stays lost"; issue 26, ramps on real
ranks): Algorithm 1 cannot see a cut whose links all scale together, so a job started on a
partial picture whose deviation vanishes once the rest of the change is read must still
run to its version when the schedule's rate under ``M`` is far below what it was built for."""

from __future__ import annotations

import threading

from mccl_runtime.drift import detect
from tests.test_runtime_manager import TOPO, PruningSynth, _cable, _manager


def _drive(mgr, t0: float, steps: int = 20) -> list:
    events, t = [], t0
    for _ in range(steps):
        assert mgr.wait_idle(10.0)
        events += mgr.step(t)
        t += 0.01
    return events


def test_a_job_whose_deviation_vanished_but_whose_rate_stayed_lost_is_not_aborted_as_cleared():
    gate = threading.Event()
    gate.set()
    synth = PruningSynth(gate=gate)
    store, mgr = _manager(synth, gamma=0.3)
    coll = mgr.get("world", "ag")
    store.ingest(_cable("s0h0g0", "s0tor0", 250.0, 1.0), now=1.0)     # v1 kept for it (no gain)
    _drive(mgr, 1.0, 3)
    nic = TOPO.link_index("s0h0g0", "s0tor0")
    assert coll.version == 1 and list(coll.profile.cut) == [nic]      # its cut: that one link
    gate.clear()
    store.ingest([{"kind": "link", "src": "s0h0g1", "dst": "s0tor1", "gbps": 8.0, "t": 2.0}], now=2.0)
    started = mgr.step(2.0)
    assert [e.action.value for e in started] == ["resynthesis"] and synth.started.wait(5.0)
    # the rest of the picture: the cut's link reads 50 and the first reading was a blip
    store.ingest([{"kind": "link", "src": "s0h0g0", "dst": "s0tor0", "gbps": 50.0, "t": 2.1},
                  {"kind": "link", "src": "s0h0g1", "dst": "s0tor1", "gbps": 400.0, "t": 2.1}], now=2.1)
    m = store.measured()
    assert detect(m, coll.profile, 0.3).max_delta <= 0.15            # Algorithm 1 sees nothing now
    gate.set()
    events = _drive(mgr, 2.2)
    assert not any(e.detail.get("reason") == "cleared" for e in events)
    assert coll.version == 2                                          # ... the job ran to its version
    assert coll.profile.loads[nic] == 0                               # which avoids the slow NIC
    mgr.close()
