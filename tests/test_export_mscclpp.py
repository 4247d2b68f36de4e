"""MSCCL++ execution-plan export: every plan runs in an independent interpreter
(tests/mscclpp_sim.py) to the right output without deadlock, race or leftover signal, and
moves exactly the schedule's traffic per GPU pair; broken plans are caught."""

from __future__ import annotations

import copy
import json
from collections import defaultdict

import pytest

from instances import hpn
from mccl_opt.allgather import solve_allgather
from mccl_opt.alltoall import solve_alltoall
from mccl_opt.baselines import rail_allgather, rail_alltoall
from mccl_opt.cli import main
from mccl_opt.errors import ScheduleError
from mccl_opt.lowering.mscclpp import to_mscclpp_plan
from mccl_opt.lowering.program import direct_schedule
from tests.mscclpp_sim import PlanError, run_plan

T4, T8 = hpn(1, 2, 2), hpn(1, 2, 4)
SCHEDULES = {
    "a2a-rail8": lambda: rail_alltoall(T8),                 # cross-rail blocks relay through a GPU
    "a2a-rail8-split": lambda: rail_alltoall(T8, split=True),
    "ag-rail8": lambda: rail_allgather(T8),
    "ag-rail8-split": lambda: rail_allgather(T8, split=True),
    "a2a-direct4": lambda: direct_schedule("alltoall", T4.gpus),
    "ag-direct4": lambda: direct_schedule("allgather", T4.gpus),
}


def expected_moves(sched, chunks: int) -> dict:
    """Chunks per (source rank, destination rank) hop the schedule implies."""
    rank = {g: r for r, g in enumerate(sched.gpus)}
    out: dict = defaultdict(int)
    for c in sched.chunks:
        if sched.collective == "alltoall":
            hops = [rank[v] for v in c.path if v in rank]
            pairs = list(zip(hops, hops[1:]))
        else:
            pairs = [(rank[e[0]], rank[e[-1]]) for e in c.edges]
        for p in pairs:
            out[p] += round(c.share * chunks)
    return dict(out)


def chunks_per_block(plan: dict) -> int:
    return plan["gpus"][0]["output_chunks"] // len(plan["gpus"])


@pytest.mark.parametrize("name", sorted(SCHEDULES))
@pytest.mark.parametrize("channels", [{"channel_type": "port"}, {"channel_type": "memory"},
                                      {"channel_type": "port", "gpus_per_node": 4}])
def test_plan_runs_to_the_collective_and_moves_the_schedules_traffic(name, channels):
    sched = SCHEDULES[name]()
    plan = json.loads(json.dumps(to_mscclpp_plan(sched, **channels)))      # what a file holds
    res = run_plan(plan)
    assert res["moved"] == expected_moves(sched, chunks_per_block(plan))
    assert res["signal"] == res["wait"]
    node = channels.get("gpus_per_node", len(plan["gpus"]) + 1)
    for g in plan["gpus"]:
        for ch in g["channels"]:
            for peer in ch["connected_to"]:
                same = g["id"] // node == peer // node
                assert ch["channel_type"] == ("memory" if same and "gpus_per_node" in channels
                                              else channels["channel_type"])


@pytest.mark.parametrize("solve", [solve_alltoall, solve_allgather])
def test_solver_schedules_export(solve):
    sched = solve(T8)
    plan = to_mscclpp_plan(sched)
    assert run_plan(plan)["moved"] == expected_moves(sched, chunks_per_block(plan))
    assert plan["collective"] == sched.collective and len(plan["gpus"]) == sched.num_gpus
    g = plan["gpus"][0]
    c = chunks_per_block(plan)
    assert g["input_chunks"] == (c if sched.collective == "allgather" else 8 * c)


def _ops(plan, name):
    return [(g, t, i) for g, gpu in enumerate(plan["gpus"]) for t, tb in enumerate(gpu["threadblocks"])
            for i, op in enumerate(tb["ops"]) if op["name"] == name]


def _drop(plan, where):
    g, t, i = where
    del plan["gpus"][g]["threadblocks"][t]["ops"][i]


@pytest.mark.parametrize("mutation, match", [
    ("drop-last-signal", "deadlock|never signalled|never waited"),
    ("drop-wait", "without a signal|before anything wrote|never waited|deadlock"),
    ("drop-nop", "without a nop"),
    ("wrong-index", "expected|written twice|before anything wrote"),
    ("drop-handshake", "never waited|deadlock"),
    ("unpaired-channel", "no partner"),
])
def test_interpreter_catches_broken_plans(mutation, match):
    plan = copy.deepcopy(to_mscclpp_plan(rail_allgather(T8)))
    if mutation == "drop-last-signal":
        _drop(plan, _ops(plan, "signal")[-1])
    elif mutation == "drop-wait":
        senders = [w for w in _ops(plan, "wait") if w[1] > 0]
        _drop(plan, senders[-1])                     # a relay's wait before it forwards
    elif mutation == "drop-nop":
        g, t, i = next(w for w in _ops(plan, "put"))
        ops = plan["gpus"][g]["threadblocks"][t]["ops"]
        del ops[i - 1]                               # the nop between the handshake and the put
    elif mutation == "wrong-index":
        g, t, i = _ops(plan, "put")[0]
        plan["gpus"][g]["threadblocks"][t]["ops"][i]["dst_buff"][0]["index"] += 1
    elif mutation == "drop-handshake":
        _drop(plan, _ops(plan, "signal")[0])
    elif mutation == "unpaired-channel":
        plan["gpus"][0]["channels"][0]["connected_to"].append(plan["gpus"][0]["channels"][0]["connected_to"][0])
    with pytest.raises(PlanError, match=match):
        run_plan(plan)


def test_plan_has_the_executors_fields():
    plan = to_mscclpp_plan(rail_alltoall(T8), min_bytes=1024, max_bytes=2**30, threads_per_block=512)
    assert {"name", "collective", "protocol", "inplace", "reuse_resources", "gpus", "num_threads_per_block",
            "use_double_scratch_buffer", "buffer_alignment", "min_message_size", "max_message_size"} <= set(plan)
    assert (plan["min_message_size"], plan["max_message_size"], plan["num_threads_per_block"]) == (1024, 2**30, 512)
    for g in plan["gpus"]:
        assert {"id", "input_chunks", "output_chunks", "scratch_chunks", "threadblocks", "channels",
                "remote_buffers", "semaphores"} <= set(g)
        for tb in g["threadblocks"]:
            assert {"id", "ops", "channels", "remote_buffer_refs"} <= set(tb)
    assert any(g["scratch_chunks"] for g in plan["gpus"])        # relays stage in scratch


def test_bad_arguments_are_typed_errors():
    with pytest.raises(ScheduleError, match="channel_type"):
        to_mscclpp_plan(rail_alltoall(T8), channel_type="nvls")
    with pytest.raises(ScheduleError, match="threads_per_block"):
        to_mscclpp_plan(rail_alltoall(T8), threads_per_block=100)


def test_cli_export_mscclpp(tmp_path, capsys):
    sched = tmp_path / "a2a.json"
    rail_alltoall(T8).save(sched)
    out = tmp_path / "plan.json"
    assert main(["export", "mscclpp", str(sched), "-o", str(out), "--gpus-per-node", "4", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    plan = json.loads(out.read_text())
    run_plan(plan)
    assert info["collective"] == "alltoall" and info["ngpus"] == 8 and info["puts"] == len(_ops(plan, "put"))
    with pytest.raises(SystemExit):
        main(["export", "mscclpp", str(sched), "-o", str(out), "--channel-type", "nvls"])
    assert main(["export", "mscclpp", str(sched), "-o", str(out), "--min-bytes", "2G", "--max-bytes", "1G"]) == 2
