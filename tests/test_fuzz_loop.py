"""bench/fuzz_loop.py draws valid scenario files whose cables are classed by their role
on scrambled names too (issue 26's loop fuzz)."""

import numpy as np

from bench.fuzz_loop import cables, draw_scenario
from instances import hpn, scrambled
from mccl_runtime.scenario import parse_scenario


def test_cable_kinds_survive_scrambling():
    plain = {k: len(v) for k, v in cables(hpn(2, 1, 4)).items()}
    assert plain["nvswitch"] == 8 and plain["nic"] == 8 and plain["spine"] > 0 and "direct" not in plain
    assert {k: len(v) for k, v in cables(scrambled(hpn(2, 1, 4), 5)).items()} == plain


def test_drawn_scenarios_parse_and_tag_every_event():
    rng = np.random.default_rng(7)
    for _ in range(12):
        data, tags = draw_scenario(rng, 0)
        scn = parse_scenario(data)
        assert len(scn.events) == len(tags) >= 1
        assert 0 <= data["noise"] <= 0.05
        times = [e["t_ms"] for e in data["events"]]
        assert times == sorted(times) and times[-1] < data["duration_ms"]
