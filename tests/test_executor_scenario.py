"""``mccl loop --executor gloo``: a scenario on real gloo ranks with a controller process
(paper §6.2.2, Fig. 13a; docs/executor.md "Scenarios on real ranks").

Timing on 2 shared CPU cores is noisy, so the bounds are loose and the measured values
are printed: the emulated fabric predicts a 4x slower collective after Fail2 on HPN
1x2x2 (431 vs 104 ms per collective at the default 60 ms healthy time) and a
recovery ratio of 1.0; the test asks for 1.5x and 0.5.
"""

from __future__ import annotations

import json
import threading
from collections import deque

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import torch  # noqa: F401 - imported before the ranks fork

from mccl_opt.cli import main
from mccl_opt.errors import MCCLError

FAIL2 = {"src": "s0h0g0", "dst": "s0tor0", "capacity_gbps": 50, "both_directions": True}


def _scenario(tmp_path, shape: str = "1x2x2", duration_ms: float = 40, t_ms: float = 10) -> str:
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps({
        "format": "mccl-scenario/1", "topology": f"hpn {shape}", "collective": "allgather",
        "message_bytes": 16 * 2**20, "duration_ms": duration_ms,
        "events": [{"t_ms": t_ms, "links": [FAIL2]}]}))
    return str(path)


def test_emulator_slows_transfers_crossing_a_degraded_link():
    from executor_cuda.faults import FabricEmulator
    from instances import hpn
    from mccl_opt.lowering.program import compile_schedule, direct_schedule

    topo = hpn(1, 1, 4)                       # every pair through the NVSwitch
    emu = FabricEmulator(topo, topo.gpus, time_scale=1.0, byte_scale=1.0)
    prog = compile_schedule(direct_schedule("allgather", topo.gpus), 1000)
    healthy = emu.program_delays(prog, 4)
    # a root sends its shard to 3 GPUs at once and each GPU receives 3 shards: every
    # message waits until 3 shards crossed its links
    assert len(healthy) == 12 and all(t == pytest.approx(3 * 4000 * 8 / 2880e9) for t in healthy.values())
    cap = topo.arrays.capacity.copy()
    cap[topo.link_index("s0h0g0", "s0h0nvs")] /= 8
    slow = emu.program_delays(prog, 4, cap)
    for (rnd, src, dst), t in healthy.items():
        assert slow[(rnd, src, dst)] == pytest.approx(8 * t if src == 0 else t)
    emu.set_capacities(cap)
    assert emu.program_time_s(prog, 4) == pytest.approx(8 * emu.program_time_s(prog, 4, topo.arrays.capacity))


def test_reporter_removes_the_per_message_cost_and_ignores_one_slow_collective():
    from executor_cuda.faults import FabricEmulator
    from executor_cuda.reporting import pair_nominal
    from executor_cuda.pair_levels import ModelReporter
    from executor_cuda.telemetry import LinkSample
    from instances import hpn
    from mccl_opt.lowering.program import compile_schedule, direct_schedule

    topo = hpn(1, 1, 4)
    g = topo.gpus
    emu = FabricEmulator(topo, g, time_scale=1.0, byte_scale=1.0)
    prog = compile_schedule(direct_schedule("allgather", g), 1000)
    e = 3 * 4000 * 8 / 2880e9                 # every message's nominal time (see above)
    cost = 4 * e                              # gloo's per-message cost dominates
    rep = ModelReporter(emu, pair_nominal(topo))

    def push(slow: float, slow_pair=(g[0], g[1])) -> dict:
        samples = [LinkSample(a, b, 4000, (slow if (a, b) == slow_pair else 1.0) * e + cost, 1, 0, 0)
                   for a in g for b in g if a != b]
        return {(x["src"], x["dst"]): x["gbps"] for x in rep(samples, prog, 4, 0.0)}

    assert push(1.0) == {}                    # calibrating: nothing reported
    rep.calibrating = False
    for _ in range(2):
        assert all(v == pytest.approx(2880) for v in push(1.0).values())
    assert push(9.0)[(g[0], g[1])] == pytest.approx(2880)       # one slow collective: median of 3
    got = push(9.0)
    assert got[(g[0], g[1])] == pytest.approx(2880 / 9)          # a lasting one: the link's level
    assert got[(g[1], g[0])] == pytest.approx(2880)
    # a link slowed 2x keeps its messages under 3x their cost: they cannot tell it from the
    # cost, so they carry no news (the pair is probed alone instead); a sample past that does
    assert push(2.0, (g[2], g[3]))[(g[2], g[3])] == pytest.approx(2880)
    assert push(2.0, (g[2], g[3]))[(g[2], g[3])] == pytest.approx(2880)
    assert not rep.blind[(g[2], g[3])]
    rep.recent[(g[2], g[3])] = deque([0.25] * 3, maxlen=3)       # low, then a short sample reads it up:
    rep.shown[(g[2], g[3])] = 0.25
    assert push(1.0)[(g[2], g[3])] == pytest.approx(720)        # no news, the pair is probed alone
    assert rep.blind[(g[2], g[3])]


@settings(max_examples=100, deadline=None)
@given(stall=st.floats(1.5, 3.5), drop=st.floats(1.3, 50.0), noise=st.floats(0.0, 0.05))
def test_stalls_are_not_drops_and_a_drop_is_reported_once_its_windows_agree(stall, drop, noise):
    """A pair stalled ``stall`` times (a busy core: at most 0.38 of nominal measured) in
    the first collective after the warm-up, and again two collectives later, is reported
    at nominal throughout; a link slowed ``drop`` times is reported at its level from
    the third collective that reads it (3 of 5 windows), or from the second when it reads
    below ``DEEP`` (a dead or 1/8 link), never before its second."""
    from executor_cuda.faults import FabricEmulator
    from executor_cuda.pair_levels import DEEP, ModelReporter
    from executor_cuda.reporting import pair_nominal
    from executor_cuda.telemetry import LinkSample
    from instances import hpn
    from mccl_opt.lowering.program import compile_schedule, direct_schedule

    topo = hpn(1, 1, 4)
    g = topo.gpus
    emu = FabricEmulator(topo, g, time_scale=1.0, byte_scale=1.0)
    prog = compile_schedule(direct_schedule("allgather", g), 1000)
    e = 3 * 4000 * 8 / 2880e9
    rep = ModelReporter(emu, pair_nominal(topo))
    key = (g[0], g[1])

    def push(slow: float) -> float | None:
        samples = [LinkSample(a, b, 4000, (slow if (a, b) == key else 1.0 + noise) * e, 1, 0, 0)
                   for a in g for b in g if a != b]
        return {(x["src"], x["dst"]): x["gbps"] for x in rep(samples, prog, 4, 0.0)}.get(key)

    for _ in range(3):
        assert push(1.0) is None                            # the warm-up reports nothing
    rep.calibrating = False
    for slow in [stall, 1.0, stall] + [1.0] * rep.drop_window:   # stalls, until they leave the window
        assert push(slow) == pytest.approx(2880)
    assert push(drop) == pytest.approx(2880)                # a drop's first window: not yet
    second = push(drop)
    if 1 / drop < DEEP:
        assert second == pytest.approx(2880 / drop)         # deep: two windows
    else:
        assert second == pytest.approx(2880)
        assert push(drop) == pytest.approx(2880 / drop)     # 3 of 5 windows


def _prober_on_hpn_1x2x2():
    """HPN 1x2x2 emulated at 100x time and 512x bytes, a reporter out of calibration and
    rank 2's prober: ``(topology, gpus, emulator, reporter, prober)``."""
    from executor_cuda.faults import FabricEmulator
    from executor_cuda.pair_levels import ModelReporter
    from executor_cuda.reporting import PairProber, pair_nominal
    from instances import hpn

    topo = hpn(1, 2, 2)
    emu = FabricEmulator(topo, topo.gpus, time_scale=100.0, byte_scale=512.0)
    rep = ModelReporter(emu, pair_nominal(topo))
    rep.calibrating = False
    return topo, topo.gpus, emu, rep, PairProber(emu, rank=2, world=4, numel=256, every=4)


def test_probes_target_low_pairs_the_schedule_no_longer_loads():
    """Only a pair reported below 0.95 of nominal *and* absent from the active program
    is probed; a probe's sample joins the pair's median, so one fast probe after a long
    low level does not yet report recovery, two do; a slow probe never lowers a level."""
    from types import SimpleNamespace

    topo, g, emu, rep, prober = _prober_on_hpn_1x2x2()
    nominal = emu.pair_delay_s(0, 2, prober.nbytes, prober.nominal_cap)
    rep.recent[(g[0], g[2])] = deque([1 / 8] * 3, maxlen=3)     # a long low level: 1/8 of nominal
    # a late probe (a busy core) never lowers a level, even to a slower one
    assert rep.probe(g[0], g[2], 80 * nominal, nominal, 0.0)["gbps"] == pytest.approx(400 / 8)
    prog = SimpleNamespace(messages=[SimpleNamespace(src=0, dst=1), SimpleNamespace(src=1, dst=3)])
    want = prober.wanted(rep, prog)
    assert [divmod(k, 4) for k, v in enumerate(want) if v] == [(0, 2)]
    assert not any(prober.wanted(rep, SimpleNamespace(messages=[SimpleNamespace(src=0, dst=2)])))
    assert rep.probe(g[0], g[2], nominal, nominal, 1.0)["gbps"] < 0.95 * 400
    assert rep.probe(g[0], g[2], nominal, nominal, 2.0)["gbps"] == pytest.approx(400)
    assert not any(prober.wanted(rep, prog))
    assert [prober.due(i) for i in range(5)] == [True, False, False, False, True]
    cap = topo.arrays.capacity.copy()
    cap[topo.link_index("s0h0g0", "s0tor0")] = 8
    assert emu.pair_delay_s(0, 2, 1000, cap) == pytest.approx(8000 * 512 / 8e9 * 100)
    prober.close()


@settings(max_examples=40, deadline=None)
@given(level=st.floats(1e-3, 1.0), cost_share=st.floats(0.0, 2.0), fast=st.floats(0.01, 1.0))
def test_a_probe_shorter_than_three_times_its_cost_is_not_used(level, cost_share, fast):
    """Short probes measure gloo's per-message cost, not the link: a probe that at the
    pair's current level would take less than 3x its measured cost never moves the level,
    however fast it read; the prober lengthens such a pair's probe (the emulated message,
    held by the receiver) to exactly what is used, and a probe only raises a level."""
    from types import SimpleNamespace

    from executor_cuda.pair_levels import PROBE_OVER_COST

    _, g, _, rep, prober = _prober_on_hpn_1x2x2()
    nominal = prober.nominal_s(0, 2)
    key = (g[0], g[2])
    rep.recent[key] = deque([level] * 3, maxlen=3)
    rep._report(key, level, 0.0)
    at_level = nominal / level                                  # the probe's time at the pair's level
    cost = prober.cost[key] = cost_share * at_level
    short = at_level < PROBE_OVER_COST * cost
    unused = SimpleNamespace(messages=[SimpleNamespace(src=0, dst=1)])
    assert (prober.wanted(rep, unused)[0 * 4 + 2] == 1) == (level < 0.95)
    if short:       # what the plain probe read, from the link's time at its level down to nominal
        assert rep.probe(g[0], g[2], max(fast * at_level, nominal), nominal, 1.0, cost) is None
        assert rep.level(key) == pytest.approx(level)
    k = prober.length(rep, 0, 2)
    assert (k > 1) >= short and k * at_level >= PROBE_OVER_COST * cost
    assert k <= max(1.0, PROBE_OVER_COST * cost / at_level) * (1 + 1e-8)
    sample = rep.probe(g[0], g[2], k * max(fast * at_level, nominal), k * nominal, 1.0, cost)
    assert sample is not None and sample["gbps"] >= level * 400 * (1 - 1e-9)
    # a probe bound by its cost (real time over the emulated one) is not reported; the next
    # one is sized so that a healthy link takes 3x its cost, and is reported
    assert not prober.bound(key, k * at_level, k * at_level)
    assert prober.bound(key, 2 * k * at_level, k * at_level)
    assert prober.length(rep, 0, 2) * nominal >= PROBE_OVER_COST * cost
    assert not prober.bound(key, 2 * k * at_level, k * at_level) and key in prober.faster
    assert not prober.bound(key, nominal, nominal) and key not in prober.faster
    prober.close()


def test_real_ranks_swap_and_recover_with_telemetry_through_a_front_end(tmp_path, capsys):
    """``--no-abort``: every collective on the old version runs whole, so the degraded time
    is measured (with the default abort the first degraded collective is often aborted, and
    an aborted attempt's time is partial: ``time_degraded_ms`` is then None).

    ``--telemetry-frontend`` (one run serves both checks: a real-rank run costs seconds):
    the ranks send telemetry to a front end started with the controller; it reaches the
    controller only as folded ``telemetry_columns`` requests, and the controller still
    swaps the ranks to a new version (fetched and subscribed at the controller)."""
    rc = main(["loop", "--executor", "gloo", "--world", "4", "--scenario", _scenario(tmp_path), "--json",
               "--no-abort", "--telemetry-frontend"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    s = json.loads(out.out)
    ev = s["events"][0]
    print(f"real ranks: healthy {s['time_healthy_ms']:.1f} ms, degraded {ev['time_degraded_ms']:.1f} ms, "
          f"after {ev['time_after_ms']:.1f} ms, offline {ev['time_offline_ms']:.1f} ms, recovery "
          f"{ev['recovery_ratio']:.2f} (first 3: {ev['recovery_ratio3']:.2f}), versions {ev['versions']}")
    assert s["wrong_results"] == 0
    assert 1 <= len(ev["versions"]) <= 2, ev["versions"]
    assert ev["time_after_ms"] is not None, "no collective ran on a new version"
    assert ev["time_degraded_ms"] / ev["time_after3_ms"] >= 1.5
    assert ev["recovery_ratio3"] >= 0.5
    assert ev["algbw_after"] == pytest.approx(ev["recovery_ratio"] * ev["algbw_offline"])
    requests = s["controller"]["requests"]
    assert requests.get("telemetry", 0) == 0 and requests["telemetry_columns"] >= 1
    assert s["controller"]["telemetry"]["accepted"] > 0


def test_real_ranks_abort_the_collective_stuck_on_a_dead_link(tmp_path, capsys):
    """The default (docs/executor.md, "Aborting a stale collective"; no flag): GPU0 <-> its
    ToR at 1 % of nominal; the collective stuck on it is aborted once the ranks agreed on
    the new version and re-run on it (the summary's ``aborts``, rows per attempt), every
    result exact, one or two versions for the event."""
    path = tmp_path / "dead.json"
    path.write_text(json.dumps({
        "format": "mccl-scenario/1", "topology": "hpn 1x2x2", "collective": "allgather",
        "message_bytes": 16 * 2**20, "duration_ms": 40,
        "events": [{"t_ms": 10, "links": [FAIL2 | {"capacity_gbps": 4}]}]}))
    rc = main(["loop", "--executor", "gloo", "--world", "4", "--scenario", str(path), "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    s = json.loads(out.out)
    ev = s["events"][0]
    print(f"real ranks, dead link, abort (default): reaction {ev['reaction_ms']:.0f} ms, aborts {s['aborts']}, "
          f"versions {ev['versions']}")
    assert s["wrong_results"] == 0
    assert 1 <= len(ev["versions"]) <= 2, ev["versions"]
    assert s["aborts"], "the collective stuck on the dead link was not aborted"
    received = {v["version"] for v in ev["versions"]}
    assert all(new > old and new in received for _, old, new in s["aborts"]), s["aborts"]
    assert ev["time_after_ms"] is not None and ev["recovery_ratio"] is not None


@pytest.mark.parametrize("flag, abort", [((), True), (("--abort",), True), (("--no-abort",), False)])
def test_abort_is_the_real_rank_default_and_no_abort_turns_it_off(tmp_path, capsys, monkeypatch, flag, abort):
    """``mccl loop --executor gloo`` aborts a stale collective unless ``--no-abort``: the
    configuration handed to the ranks (no ranks run here)."""
    from executor_cuda import scenario_run

    seen = []

    def fake(scenario, cfg):
        seen.append(cfg)
        raise scenario_run.MCCLError("stop here")

    monkeypatch.setattr(scenario_run, "run_gloo_loop", fake)
    assert main(["loop", "--executor", "gloo", "--world", "4", "--scenario", _scenario(tmp_path), *flag]) != 0
    assert [cfg.abort for cfg in seen] == [abort]
    assert scenario_run.GlooLoopConfig().abort is True


def test_telemetry_frontend_needs_real_ranks(tmp_path, capsys):
    assert main(["loop", "--scenario", _scenario(tmp_path), "--telemetry-frontend"]) == 2
    assert "--telemetry-frontend apply to --executor gloo" in capsys.readouterr().err


def test_real_ranks_notice_a_cleared_failure_by_probes(tmp_path, capsys):
    """GPU0 <-> its ToR at 8 Gbps from 10 ms, ``clear`` at 90 ms (fabric time; ~6 s real
    after it at 30 ms per healthy collective): the first swap avoids s0h0g0's NIC, so only
    probes of the pairs it no longer loads can see the link come back.  Asserted on the
    loop's decisions, not on timings: the failure's version is built for a degraded fabric
    (rate below the healthy schedule's), probes ran while it lasted, and after the clear a
    version arrives whose rate is near the healthy schedule's (the controller's picture of
    the NIC is whole again, or within gamma of it).  Without probes no version follows the clear
    (bench/bench_executor_loop.py --clear)."""
    from mccl_runtime.synthesizer import solver_synthesizer
    from mccl_runtime.scenario import load_scenario

    path = tmp_path / "clear.json"
    path.write_text(json.dumps({
        "format": "mccl-scenario/1", "topology": "hpn 1x2x2", "collective": "allgather",
        "message_bytes": 16 * 2**20, "duration_ms": 170,
        "events": [{"t_ms": 10, "links": [FAIL2 | {"capacity_gbps": 8}]}, {"t_ms": 90, "clear": True}]}))
    healthy = solver_synthesizer("highs")("allgather", load_scenario(str(path)).topology, None, None).rate_gbps
    rc = main(["loop", "--executor", "gloo", "--world", "4", "--scenario", str(path),
               "--collective-ms", "30", "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    s = json.loads(out.out)
    fail, clear = s["events"]
    print(f"probes: healthy {s['time_healthy_ms']:.1f} ms, degraded {fail['time_degraded_ms']} (None: aborted), "
          f"after swap {fail['time_final3_ms']:.1f} ({fail['probes']} probes, "
          f"{100 * fail['probe_share']:.1f} % of the time), after clear: reaction {clear['reaction_ms']} ms, "
          f"final {clear['time_final3_ms']:.1f} ms, versions {clear['versions']}, healthy rate {healthy:.1f}")
    assert s["wrong_results"] == 0
    assert fail["versions"] and fail["versions"][-1]["rate_gbps"] < 0.95 * healthy, "the swap did not avoid the NIC"
    assert fail["probes"] >= 1, "no probe of the avoided pairs while the failure lasted"
    assert clear["versions"], "the recovery after the clear was never noticed"
    # the recovery is published on the first reading that crosses the capacity-gained
    # threshold; on a loaded machine that reading can be a partial one (363.6 of 400 Gbps
    # seen once in a clean-clone run), and a rest of 10 % stays within gamma: the version
    # must be far above the failure's and near the healthy rate, not always at it
    assert clear["versions"][-1]["rate_gbps"] > fail["versions"][-1]["rate_gbps"]
    assert clear["versions"][-1]["rate_gbps"] >= 0.85 * healthy, "the NIC's recovery was only partly seen"


def test_dead_controller_is_a_clear_error(tmp_path, monkeypatch):
    """The controller is killed while the ranks run: they stop at the same collective
    and the run ends with an error naming the controller (or, if it died before the
    first schedule, the ranks' bounded request fails).  Its kernels load lazily: it is
    killed before any event, so it never synthesizes."""
    from executor_cuda import scenario_run
    from mccl_runtime.scenario import load_scenario

    ready = scenario_run.ControllerProcess.wait_ready

    def ready_then_die(self, timeout_s):
        endpoint = ready(self, timeout_s)
        threading.Timer(1.0, self.proc.kill).start()    # the ranks start in milliseconds
        return endpoint

    monkeypatch.setattr(scenario_run.ControllerProcess, "wait_ready", ready_then_die)
    scn = load_scenario(_scenario(tmp_path, duration_ms=60, t_ms=50))
    with pytest.raises(MCCLError, match="controller stopped answering|no reply from the controller"):
        scenario_run.run_gloo_loop(scn, scenario_run.GlooLoopConfig(world=4, client_timeout_s=1.0, kernels="lazy"))


def test_world_must_match_the_scenario(tmp_path, capsys):
    rc = main(["loop", "--executor", "gloo", "--world", "3", "--scenario", _scenario(tmp_path)])
    assert rc == 2
    assert "--world 3 does not match" in capsys.readouterr().err
    assert main(["loop", "--executor", "gloo"]) == 2
    assert main(["loop", "--executor", "gloo", "--pieces", "0", "--scenario", _scenario(tmp_path)]) == 2
    assert "--pieces must be in [1, 1024]" in capsys.readouterr().err


def test_real_rank_report_says_when_an_event_was_recovered_and_skips_versions_that_never_ran():
    """``recovered_ms`` is the event to the end of the first collective at >= 0.95 of the
    offline algbw, whatever version ran it (None when none did), and a version received but
    superseded before any collective ran on it is never the "first new version"."""
    from types import SimpleNamespace

    from executor_cuda.scenario_report import summarize
    from mccl_runtime.scenario import parse_scenario

    scn = parse_scenario({"format": "mccl-scenario/1", "topology": "hpn 1x1x2", "collective": "allgather",
                          "message_bytes": 2**20, "duration_ms": 10, "events": [
                              {"t_ms": 2, "links": [{"src": "s0h0g0", "dst": "s0h0nvs", "capacity_gbps": 100}]},
                              {"t_ms": 6, "links": [{"src": "s0h0g0", "dst": "s0h0nvs", "capacity_gbps": 50}]}]})
    tl = scn.timeline()
    plan = SimpleNamespace(timeline=tuple((t, cap) for t, cap, _ in tl), time_scale=1.0, duration_s=0.010,
                           probe_every=4, block_numel=1024, pieces=1)
    # (seq, version, state, start s, seconds): healthy, degraded on v1, v3 (v2 never ran) slow then fast
    rows = [(1, 1, 0, 0.000, 0.001, 0), (2, 1, 1, 0.002, 0.001, 0), (3, 3, 1, 0.003, 0.0008, 0),
            (4, 3, 1, 0.0045, 0.0005, 0), (5, 3, 2, 0.006, 0.0030, 0), (6, 3, 2, 0.009, 0.0009, 0)]
    rank = {"rows": rows, "probes": [], "received": [(2, 0.0025, 0.0), (3, 0.0028, 0.0)], "swaps": [],
            "offline": {1: [0.0005], 2: [0.002]}, "wrong": 0, "dead": "", "pushed": 0, "first_version": 1}
    s = summarize(scn, [rank], plan, 0.001, 1.0)
    first, second = s["events"]
    assert first["time_after_ms"] == pytest.approx(0.8)                 # v3, not v2 (never ran)
    assert first["reaction_ms"] == pytest.approx(1.0)
    assert [v["version"] for v in first["versions"]] == [2, 3]
    # offline 0.5 ms: 1 ms (v1) and 0.8 ms (v3) are below 0.95 of it, 0.5 ms ends at 5 ms
    assert first["recovered_ms"] == pytest.approx(3.0)
    # offline 2 ms: the 3 ms collective is below 0.95, the 0.9 ms one above (ends 9.9 ms)
    assert second["recovered_ms"] == pytest.approx(3.9)
    assert second["time_after_ms"] is None                               # no new version after 6 ms


def test_an_aborted_collective_counts_from_its_rerun():
    """A collective aborted and re-run on a new version (executor_cuda.abort) is two rows:
    its aborted attempt on the old version (partial: not in the degraded time, which the
    whole collectives on the old version give) and its re-run on the new one, which starts
    the reaction; the slowest rank's time is taken per attempt."""
    from types import SimpleNamespace

    from executor_cuda.scenario_report import summarize
    from mccl_runtime.scenario import parse_scenario

    scn = parse_scenario({"format": "mccl-scenario/1", "topology": "hpn 1x1x2", "collective": "allgather",
                          "message_bytes": 2**20, "duration_ms": 10, "events": [
                              {"t_ms": 2, "links": [{"src": "s0h0g0", "dst": "s0h0nvs", "capacity_gbps": 1}]}]})
    plan = SimpleNamespace(timeline=tuple((t, cap) for t, cap, _ in scn.timeline()), time_scale=1.0,
                           duration_s=0.010, probe_every=4, block_numel=1024, pieces=1)
    rows = [(1, 1, 0, 0.000, 0.001, 0), (2, 1, 1, 0.002, 0.0030, 0), (3, 1, 1, 0.005, 0.0009, 0),
            (3, 2, 1, 0.0061, 0.0010, 1), (4, 2, 1, 0.0072, 0.0010, 0)]
    slow = [r[:4] + (r[4] + 0.0002,) + r[5:] for r in rows]          # another rank, 0.2 ms slower
    ranks = [{"rows": rr, "probes": [], "received": [(2, 0.0058, 0.0)], "swaps": [], "aborts": [(3, 1, 2)],
              "offline": {1: [0.001]}, "wrong": 0, "dead": "", "pushed": 0, "first_version": 1}
             for rr in (rows, slow)]
    ev = summarize(scn, ranks, plan, 0.001, 1.0)["events"][0]
    assert ev["reaction_ms"] == pytest.approx(4.1)          # the re-run's start, not the aborted attempt's
    assert ev["time_degraded_ms"] == pytest.approx(3.2)     # the whole collective, slowest rank; not the aborted one
    assert ev["time_after_ms"] == pytest.approx(1.2)
    assert ev["swap_ms"] == pytest.approx(0.3)


_drains = st.integers(1, 4).flatmap(lambda m: st.integers(2, 3).flatmap(
    lambda k: st.lists(st.lists(st.floats(0.01, 10.0), min_size=k, max_size=k), min_size=m, max_size=m)))


@settings(max_examples=150, deadline=None)
@given(rows=_drains, link=st.integers(0, 2), ratio=st.floats(0.01, 1.0), delay=st.floats(0.0, 5.0))
def test_reporter_never_folds_in_more_than_the_degraded_links_level(rows, link, ratio, delay):
    """A pair's route has one link at ``ratio`` of nominal; whatever the schedule's load
    on each link of the route and whatever delay a busy core adds, the proven level
    never exceeds that link's (one grid step), and a pair already at that level never
    folds in more than ``1 + tol`` times it from another program's samples (the per-swap
    overestimate on real ranks)."""
    from executor_cuda.pair_levels import ModelReporter

    drains = np.array(rows)
    link %= drains.shape[1]
    slow = drains.copy()
    slow[:, link] /= ratio
    seconds = float(slow.max(axis=1).sum()) + delay
    step = ModelReporter.GRID[1] / ModelReporter.GRID[0]
    assert ModelReporter.proven(drains, seconds) <= ratio * step * (1 + 1e-9)
    rep = ModelReporter.__new__(ModelReporter)
    rep.tol, rep.blind, rep.overhead, rep.folded, rep._agree, rep.window, rep.shown = 0.2, {}, {}, {}, {}, 3, {}
    rep.recent = {("a", "b"): deque([ratio], maxlen=3)}
    got = rep._ratio(("a", "b"), drains, seconds, prog=1)      # a level measured on another program
    assert got is None or got <= (1 + rep.tol) * ratio * step
    if delay == 0.0 and ratio == 1.0:          # a healthy path reads healthy
        assert got == pytest.approx(1.0)
    # on the program the level was folded in from, a sample is taken as it is (a dip recovers)
    rep.folded[("a", "b")] = 2
    high = float(drains.max(axis=1).sum()) / seconds
    assert rep._ratio(("a", "b"), drains, seconds, prog=2) == pytest.approx(high)


def test_a_pair_faster_than_its_model_proves_nothing_about_its_lightly_loaded_link():
    """Messages that ran faster than the nominal model (the per-message cost subtracted
    too generously) on a path whose first link carries a tenth of the bottleneck's load
    prove at most a tenth of nominal for that link, not nominal."""
    from executor_cuda.pair_levels import ModelReporter

    drains = np.array([[0.1, 1.0], [0.1, 1.0]])
    assert ModelReporter.proven(drains, 1.5) <= 0.11
    assert ModelReporter.proven(drains, 2.0) <= 0.11


def _bare_reporter(tol: float = 0.2, window: int = 3, drop_window: int = 3):
    """A :class:`ModelReporter` with one pair of nominal 1 and no emulator (the level rules only)."""
    from executor_cuda.pair_levels import ModelReporter

    rep = ModelReporter.__new__(ModelReporter)
    rep.tol, rep.window, rep.drop_window, rep.nominal = tol, window, drop_window, {("a", "b"): 1.0}
    rep.recent, rep.low, rep.shown, rep._held = {}, {}, {}, {}
    return rep


@settings(max_examples=200, deadline=None)
@given(old=st.floats(0.01, 0.5), new=st.floats(0.6, 1.0), between=st.floats(0.0, 1.0),
       noise=st.lists(st.floats(1 / 1.09, 1.09), min_size=6, max_size=6))
def test_a_cleared_link_is_reported_at_its_new_level_in_one_step(old, new, between, noise):
    """A link back from ``old`` to ``new`` (more than 1.2x above), read through one
    collective that straddles the clear (``between``, anywhere from the old level to the
    new), then at ``new`` within +-9 % noise: no report lies between the two levels (the
    in-between reading published a version for a partial recovery; one within ``1 + tol``
    of the new samples is the new level), and the new level is reported within ``window``
    samples of the clear."""
    rep = _bare_reporter()
    for _ in range(3):
        rep._level(("a", "b"), old, 0.0)
    t = old + between * (new - old)
    got = [rep._level(("a", "b"), r, 0.0)["gbps"] for r in [t] + [min(1.0, new * x) for x in noise]]
    assert all(g <= old * 1.0001 or g >= new / 1.09 / (1 + rep.tol) * 0.9999 for g in got)
    assert got[2] >= new / 1.09 * 0.9999


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.01, 1.0), min_size=1, max_size=30))
def test_a_held_rise_never_reports_more_than_the_median_nor_waits_longer_than_the_window(ratios):
    """Whatever the samples: each report is the median of the last ``window`` samples or
    the previous report, a report above the previous one is the median, never more, and
    the median is reported at least once in every ``window`` samples in a row (a rise is
    held, never ignored); drops are never held."""
    import statistics

    rep = _bare_reporter()
    recent: deque[float] = deque(maxlen=3)
    last, since = None, 0
    for r in ratios:
        recent.append(r)
        med = statistics.median(recent)
        got = rep._level(("a", "b"), r, 0.0)["gbps"]
        assert got == pytest.approx(med) or got == pytest.approx(last)
        if last is not None and med <= last:
            assert got == pytest.approx(med)                   # a drop (or no change) at once
        since = 0 if got == pytest.approx(med) else since + 1
        assert since < rep.window
        last = got


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(0.01, 1.0), min_size=1, max_size=30))
def test_a_drop_is_reported_only_on_the_evidence_of_several_windows(ratios):
    """Whatever the samples (default windows: 3 for rises, 5 for drops): a report below the
    previous one rests on 3 of the last 5 samples below it, or on the two newest both below
    ``DEEP`` times it (a stall of a busy core reads no lower than ~0.4 of nominal); it is
    never below the median of the last 3; and a drop that 3 of the last 3 samples show is
    reported."""
    import statistics

    from executor_cuda.pair_levels import DEEP

    rep = _bare_reporter(drop_window=5)
    recent: deque[float] = deque(maxlen=5)
    last = None
    for r in ratios:
        recent.append(r)
        got = rep._level(("a", "b"), r, 0.0)["gbps"]
        if last is not None and got < last * (1 - 1e-9):
            newest = list(recent)[-2:]
            assert statistics.median(recent) < last or (len(newest) == 2 and max(newest) < DEEP * last)
            assert got >= statistics.median(list(recent)[-3:]) * (1 - 1e-9)
        if last is not None and len(recent) >= 3 and max(list(recent)[-3:]) < last:
            assert got < last
        last = got


@pytest.mark.parametrize("between, new", [(278 / 400, 225 / 400), (163 / 400, 137.5 / 400)])
def test_a_shallow_drop_is_reported_at_the_level_its_newest_windows_agree_on(between, new):
    """A ramp step read through one straddling window (``between``, as on gloo ranks: 278
    and 163 Gbps for steps to 225 and 137.5 of 400) and then at ``new``: the third window
    reports ``new`` (3 of 5 below the old level), not the in-between median of the five,
    which cost a version more; two newest windows that disagree still report that median."""
    rep = _bare_reporter(drop_window=5)
    for _ in range(5):
        rep._level(("a", "b"), 1.0, 0.0)
    got = [rep._level(("a", "b"), r, 0.0)["gbps"] for r in (between, new, new, new)]
    assert got == pytest.approx([1.0, 1.0, new, new])
    rep = _bare_reporter(drop_window=5)
    for r in (1.0, 1.0, 1.0, 1.0, 1.0, between, new):
        rep._level(("a", "b"), r, 0.0)
    assert rep._level(("a", "b"), new / 1.5, 0.0)["gbps"] == pytest.approx(between)   # the median of the five


def _nices(rank: int, world: int) -> tuple[int, int]:
    """A rank's nice value, and that of a thread it starts (as gloo's are)."""
    import os

    seen = []
    t = threading.Thread(target=lambda: seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))
    t.start()
    t.join()
    return os.getpriority(os.PRIO_PROCESS, 0), seen[0]


def test_ranks_yield_by_the_nice_they_are_given_and_their_threads_inherit_it():
    """``run_ranks(nice=)`` (the real-rank loop's ``rank_nice``): every rank, and the threads
    it starts after, run that much below the launcher (docs/executor.md, "Synthesis inside
    the loop")."""
    import os

    from executor_cuda.launch import run_ranks

    base = os.getpriority(os.PRIO_PROCESS, 0)
    want = min(19, base + 3)
    assert run_ranks(_nices, 2, nice=3, timeout=60) == [(want, want)] * 2


@pytest.mark.parametrize("nice, group", [(10, {"process_group": 0}), (0, {"start_new_session": True})])
def test_the_controller_shares_the_ranks_session_only_when_they_yield(tmp_path, monkeypatch, nice, group):
    """With ranks that yield (``rank_nice`` > 0) the controller is started in the caller's
    session (the ranks' scheduling group under autogroup, where their nice value ranks
    them below it), in a process group of its own; else in a session of its own, as before.
    No controller runs: the launch is recorded."""
    import io

    from executor_cuda import scenario_run

    seen = []

    class FakePopen:
        def __init__(self, cmd, **kwargs):
            seen.append(kwargs)
            self.stdout = io.StringIO("")

    monkeypatch.setattr(scenario_run.subprocess, "Popen", FakePopen)
    cfg = scenario_run.GlooLoopConfig(rank_nice=nice)
    scenario_run.ControllerProcess(str(tmp_path / "topo.json"), "allgather", cfg, str(tmp_path / "log"))
    assert {k: v for k, v in seen[0].items() if k in ("process_group", "start_new_session")} == group
    assert scenario_run.GlooLoopConfig().rank_nice == scenario_run.RANK_NICE > 0


@pytest.mark.parametrize("nice", [-1, 20])
def test_ranks_never_run_above_the_controller(tmp_path, nice):
    from executor_cuda import scenario_run
    from mccl_runtime.scenario import load_scenario

    with pytest.raises(MCCLError, match=r"nice value must be in \[0, 19\]"):
        scenario_run.run_gloo_loop(load_scenario(_scenario(tmp_path)), scenario_run.GlooLoopConfig(world=4, rank_nice=nice))
