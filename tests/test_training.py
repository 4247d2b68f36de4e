"""End-to-end training model (docs/training.md): workload format, placement, contention,
iteration times against hand-computed values and the fluid simulator, joint re-synthesis,
``mccl train``."""

from __future__ import annotations

import json

import numpy as np
import pytest

from instances import fail2, hpn
from mccl_opt.cli import main
from mccl_opt.errors import MCCLError, WorkloadError
from mccl_opt.schedule import Schedule, TreeChunk
from mccl_opt.sim import simulate
from mccl_opt.topology import Link, Node, Topology
from mccl_opt.training.builtin import builtin_workload
from mccl_opt.training.comms import LoadCache
from mccl_opt.training.contention import Flow, alone_seconds, run_streams
from mccl_opt.training.figure import ROW_FIELDS
from mccl_opt.training.iteration import fabric_state, iteration_time
from mccl_opt.training.joint import joint_resynthesis
from mccl_opt.training.placement import place_groups
from mccl_opt.training.workload import load_workload

MB = 2 ** 20


def _workload(ops, groups=(("tp", 4), ("dp", "rest")), repeat=1, **extra):
    return load_workload({"format": "mccl-workload/1", "name": "t", **extra,
                          "groups": [{"name": n, "size": s} for n, s in groups],
                          "phases": [{"name": "p", "repeat": repeat, "ops": ops}]})


def _ag(group, nbytes, overlap=False, kind="allgather"):
    return {"kind": kind, "bytes": nbytes, "group": group, "overlap": overlap}


# ---------------------------------------------------------------- placement
def test_megatron_placement_puts_tp_in_a_host_and_dp_on_a_rail():
    topo = hpn(1, 4, 8)
    groups = place_groups(builtin_workload("llama3-405b", 32), topo.gpus)
    assert groups["tp"] == [tuple(f"s0h{h}g{g}" for g in range(8)) for h in range(4)]
    assert groups["dp"][3] == tuple(f"s0h{h}g3" for h in range(4))
    assert sorted(g for inst in groups["dp"] for g in inst) == sorted(topo.gpus)


# ---------------------------------------------------------------- iteration model
def test_one_allgather_and_compute_add_up_to_the_ring_time_by_hand():
    """TP AllGather in a host: the ring moves 7 shards over each 2880 Gbps NVSwitch link."""
    w = _workload([{"kind": "compute", "seconds": 0.01}, _ag("tp", 8 * MB)], groups=(("tp", 8), ("dp", "rest")),
                  repeat=3)
    t = iteration_time(w, fabric_state(hpn(1, 2, 8), w), LoadCache(), "nccl")
    ring = 8 * 8 * MB * 7 / 2880e9
    assert t.seconds == pytest.approx(3 * (0.01 + ring), rel=1e-9)
    assert t.compute_s == pytest.approx(0.03) and t.collective_s == pytest.approx(3 * ring)


def test_overlapped_collective_hides_under_longer_compute():
    w = _workload([{"kind": "compute", "seconds": 1.0}, _ag("dp", 8 * MB, overlap=True)])
    t = iteration_time(w, fabric_state(hpn(1, 2, 4), w), LoadCache(), "nccl")
    assert t.seconds == pytest.approx(1.0)
    assert 0 < t.collective_s < 1.0


@pytest.mark.parametrize("method,rate_key", [("nccl", "baseline_rate_gbps"), ("mccl", "reopt_rate_gbps")])
def test_single_world_communicator_reproduces_mccl_eval(method, rate_key):
    """One world AllGather: 8 b / rate, the rate ``mccl eval``'s Figure 9 row reports."""
    from mccl_opt.evaluate import run_failure_experiment

    healthy = hpn(1, 2, 4)
    topo = fail2(healthy)
    row = run_failure_experiment(healthy, "allgather", {"fail2": topo}, message_bytes=16 * MB)[0]
    w = _workload([_ag("world", 16 * MB)])
    t = iteration_time(w, fabric_state(topo, w), LoadCache(), method)
    assert t.seconds == pytest.approx(8 * 16 * MB / (row[rate_key] * 1e9), rel=1e-6)


def test_collectives_that_never_overlap_add_up():
    topo = fail2(hpn(1, 2, 4))
    cache = LoadCache()
    parts = [iteration_time(_workload([op]), fabric_state(topo, _workload([op])), cache, "mccl").seconds
             for op in (_ag("dp", 4 * MB), _ag("world", 4 * MB, kind="alltoall"))]
    both = _workload([_ag("dp", 4 * MB), _ag("world", 4 * MB, kind="alltoall")])
    assert iteration_time(both, fabric_state(topo, both), cache, "mccl").seconds == pytest.approx(sum(parts))


# ---------------------------------------------------------------- contention
def _two_pairs():
    def cable(u, v, c):
        return [Link(u, v, c, 0.0), Link(v, u, c, 0.0)]
    nodes = [Node(x, "gpu") for x in ("a0", "a1", "b0", "b1")] + [Node("s1", "switch"), Node("s2", "switch")]
    links = (cable("a0", "s1", 400) + cable("b0", "s1", 400) + cable("s1", "s2", 100)
             + cable("s2", "a1", 400) + cable("s2", "b1", 400))
    return Topology("two-pairs", nodes, links)


def _flow(topo, path, nbytes):
    idx = np.array([topo.link_index(u, v) for u, v in zip(path, path[1:])])
    return Flow(((idx, np.full(idx.size, 8.0 * nbytes)),))


@pytest.mark.parametrize("sizes", [(1.0, 1.0), (1.0, 0.5), (0.25, 1.0)])
def test_two_communicators_on_one_link_split_it_as_the_fluid_simulator(sizes):
    topo = _two_pairs()
    cap = topo.arrays.capacity * 1e9
    paths = (("a0", "s1", "s2", "a1"), ("b0", "s1", "s2", "b1"))
    flows = [_flow(topo, p, s * MB) for p, s in zip(paths, sizes)]
    together = run_streams([[[flows[0]]], [[flows[1]]]], cap)
    alone = [alone_seconds(f, cap) for f in flows]
    assert together > max(alone)
    sched = Schedule("allgather", topo.name, topo.gpus, 1.0, 1.0, 1,
                     tuple(TreeChunk(p[0], s, (p,)) for p, s in zip(paths, sizes)), (), 1, {})
    fluid = simulate(topo, sched, MB, fluid=True).completion_s
    assert together == pytest.approx(fluid, rel=1e-9)
    assert together == pytest.approx(8 * sum(sizes) * MB / 100e9, rel=1e-9)


def test_concurrent_groups_are_slower_than_alone_and_faster_than_in_sequence():
    topo = fail2(hpn(1, 2, 4))
    cache = LoadCache()
    ops = [_ag("world", 8 * MB, kind="alltoall"), _ag("dp", 8 * MB, overlap=True)]
    w = _workload(ops)
    seq = _workload([dict(op, overlap=False) for op in ops])
    both = iteration_time(w, fabric_state(topo, w), cache, "mccl")
    in_order = iteration_time(seq, fabric_state(topo, seq), cache, "mccl")
    assert both.seconds < in_order.seconds * (1 - 1e-6)
    assert both.seconds > in_order.seconds / 2


# ---------------------------------------------------------------- methods
@pytest.mark.parametrize("model", ["llama3-405b", "deepseek-v3"])
def test_healthy_mccl_no_slower_than_nccl(model):
    w = builtin_workload(model, 64)
    state = fabric_state(hpn(1, 8, 8), w)
    cache = LoadCache()
    nccl = iteration_time(w, state, cache, "nccl").seconds
    mccl = iteration_time(w, state, cache, "mccl").seconds
    assert mccl <= nccl * (1 + 1e-9)
    assert mccl >= nccl * 0.98


def test_identical_communicators_are_synthesized_once():
    w = builtin_workload("llama3-405b", 128)
    cache = LoadCache()
    iteration_time(w, fabric_state(hpn(1, 16, 8), w), cache, "mccl")
    assert cache.syntheses == 2          # one TP host, one DP rail, out of 16 + 8 communicators


def test_joint_resynthesis_strictly_better_on_a_shared_degraded_nic():
    """The world AllToAll can route around GPU 0's slow NIC, its data-parallel pair
    cannot; synthesized jointly, the AllToAll leaves the NIC to the pair."""
    healthy = hpn(1, 2, 4)
    w = _workload([{"kind": "compute", "seconds": 1e-4}, _ag("world", 32 * MB, kind="alltoall"),
                   _ag("dp", 32 * MB, overlap=True)])
    state = fabric_state(fail2(healthy), w)
    res = joint_resynthesis(w, state, healthy, LoadCache())
    assert any(k.startswith("split dp=") for k in res.candidates)
    assert any(k.startswith("proportional-") for k in res.candidates)
    assert res.seconds <= res.independent_s == res.candidates["independent"]
    assert res.seconds < res.independent_s * 0.99 and res.best != "independent"
    assert res.seconds == min(res.candidates.values())


def test_joint_is_independent_when_nothing_is_shared():
    healthy = hpn(1, 2, 4)
    w = _workload([_ag("dp", MB)])
    res = joint_resynthesis(w, fabric_state(fail2(healthy), w), healthy, LoadCache())
    assert res.best == "independent" and list(res.candidates) == ["independent"]


def test_host_relays_let_a_rail_group_route_around_a_slow_nic():
    """With members only, GPU 0's data-parallel pair is stuck on its 50 Gbps NIC (NCCL's
    ring is optimal there); host-mates relaying give MCCL the other rails."""
    w = _workload([_ag("dp", 16 * MB)])
    topo = fail2(hpn(1, 2, 4))
    cache = LoadCache()
    times = {relay: {m: iteration_time(w, fabric_state(topo, w, relay), cache, m).seconds
                     for m in ("nccl", "mccl")} for relay in ("members", "host")}
    assert times["members"]["mccl"] == pytest.approx(times["members"]["nccl"])
    assert times["host"]["nccl"] == pytest.approx(times["members"]["nccl"])
    assert times["host"]["mccl"] < times["members"]["mccl"] / 2


# ---------------------------------------------------------------- CLI
def _file(tmp_path, data, name="w.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return str(path)


def test_cli_json_rows_are_consistent(tmp_path, capsys):
    w = _workload([{"kind": "compute", "seconds": 1e-3}, _ag("world", 4 * MB, kind="alltoall"),
                   _ag("dp", 4 * MB, overlap=True)])
    path = _file(tmp_path, w.to_dict())
    png = tmp_path / "f.png"
    assert main(["train", "--model", path, "--gpus", "16", "--fail", "fail2", "--joint", "--json",
                 "--png", str(png)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert png.stat().st_size > 0
    healthy, failed = out["rows"]
    assert (healthy["state"], failed["state"]) == ("healthy", "fail2")
    for r in out["rows"]:
        assert set(r) == set(ROW_FIELDS)
        assert r["speedup"] == pytest.approx(r["iteration_s_static"] / r["iteration_s_mccl"])
    assert healthy["iteration_s_static"] == healthy["iteration_s_healthy"]
    assert failed["iteration_s_static"] > failed["iteration_s_healthy"]
    assert failed["iteration_s_joint"] <= failed["iteration_s_mccl"]
    assert out["synthesis"]["syntheses"] >= 1 and out["synthesis"]["synthesis_s"] >= 0


def test_cli_writes_a_builtin_workload_that_loads_back(tmp_path, capsys):
    path = tmp_path / "ds.json"
    assert main(["train", "--model", "deepseek-v3", "--gpus", "64", "--fail", "none",
                 "--write-workload", str(path)]) == 0
    w = load_workload(str(path))
    assert w.to_dict() == builtin_workload("deepseek-v3", 64).to_dict()
    assert "deepseek-v3" in capsys.readouterr().out


BAD = [
    ("not json", "malformed JSON"),
    ({"format": "mccl-workload/1", "compute_share": 0.5, "collectives": []}, "mccl loop --workload"),
    ({"format": "mccl-workload/1", "groups": [], "phases": []}, "groups"),
    ({"format": "mccl-workload/1", "groups": [{"name": "tp", "size": 3}],
      "phases": [{"ops": [_ag("tp", 1)]}]}, "do not fit 16 GPUs"),
    ({"format": "mccl-workload/1", "groups": [{"name": "tp", "size": "rest"}],
      "phases": [{"ops": [_ag("ep", 1)]}]}, "must name a group"),
    ({"format": "mccl-workload/1", "groups": [{"name": "tp", "size": "rest"}],
      "phases": [{"ops": [{"kind": "compute", "flops": 1e9}]}]}, "gpu_tflops"),
    ({"format": "mccl-workload/1", "groups": [{"name": "tp", "size": "rest"}],
      "phases": [{"ops": [_ag("tp", -1)]}]}, "bytes must be a positive"),
    ({"format": "mccl-workload/1", "groups": [{"name": "tp", "size": "rest"}],
      "phases": [{"ops": [{"kind": "broadcast", "group": "tp", "bytes": 1}]}]}, "kind must be"),
]


@pytest.mark.parametrize("data,message", BAD)
def test_bad_workload_files_exit_2_with_a_clear_error(tmp_path, capsys, data, message):
    path = _file(tmp_path, data)
    assert main(["train", "--model", path, "--gpus", "16", "--fail", "none"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and message in err and "Traceback" not in err


def test_bad_model_and_gpu_counts_are_typed_errors():
    with pytest.raises(WorkloadError, match="multiple of 64"):
        builtin_workload("deepseek-v3", 32)
    with pytest.raises(WorkloadError, match="unknown built-in"):
        builtin_workload("gpt-5", 128)
    assert main(["train", "--model", "llama3-405b", "--gpus", "200"]) == 2
    assert main(["train", "--model", "nothing-here", "--gpus", "16"]) == 2
    assert issubclass(WorkloadError, MCCLError)


@pytest.mark.parametrize("relay", ["members", "host"])
def test_reduce_scatter_on_reversed_trees_takes_the_allgather_time(relay):
    """On a fabric whose cables have one capacity both ways, MCCL's ReduceScatter of a
    buffer b (its AllGather trees reversed) takes the time of its AllGather of b/n; the
    vendor ring is never faster."""
    topo = fail2(hpn(1, 2, 4))
    cache = LoadCache(reduce_scatter="mccl")
    n = 2                                                  # the dp pairs of tp=4 on 8 GPUs

    def seconds(op, method):
        w = _workload([op])
        return iteration_time(w, fabric_state(topo, w, relay), cache, method).seconds

    rs = seconds(_ag("dp", 16 * MB, kind="reducescatter"), "mccl")
    assert rs == pytest.approx(seconds(_ag("dp", 16 * MB / n), "mccl"), rel=1e-9)
    assert rs <= seconds(_ag("dp", 16 * MB, kind="reducescatter"), "nccl") * (1 + 1e-9)
    ring = LoadCache()                                     # default: the ring under both methods
    w = _workload([_ag("dp", 16 * MB, kind="reducescatter")])
    state = fabric_state(topo, w, relay)
    assert iteration_time(w, state, ring, "mccl").seconds == iteration_time(w, state, ring, "nccl").seconds


def test_reduce_scatter_on_a_one_way_degradation_is_the_reversed_fabric_allgather():
    """A NIC degraded in its sending direction only: MCCL's ReduceScatter of buffer b takes
    8 (b/n) / x, x the AllGather optimum on the fabric with every link reversed (the NIC
    degraded in its receiving direction), solved here on its own."""
    from instances import degrade
    from mccl_opt import solve_allgather

    healthy = hpn(1, 2, 4)
    gpu, tor = healthy.gpus[0], "s0tor0"
    topo = degrade(healthy, gpu, tor, 50.0, both_directions=False)
    reversed_fabric = degrade(healthy, tor, gpu, 50.0, both_directions=False)
    w = _workload([_ag("world", 8 * 16 * MB, kind="reducescatter")])
    t = iteration_time(w, fabric_state(topo, w), LoadCache(reduce_scatter="mccl"), "mccl").seconds
    x = solve_allgather(reversed_fabric).rate_gbps
    assert t == pytest.approx(8 * 16 * MB / (x * 1e9), rel=1e-6)
