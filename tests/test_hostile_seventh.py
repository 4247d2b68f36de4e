"""Issue 27, seventh pass: the sharded start-up, the simulated loop's real-rank options,
the executor's timeouts and the abort agreement with a peer that never answers
(docs/runtime.md, "Hostile-input audit, seventh pass").  Each test failed on the code
before its fix."""

from __future__ import annotations

import math
import multiprocessing
import socket
from types import SimpleNamespace

import pytest

from tests.test_hostile_third import _cli

BAD_SECONDS = [math.nan, math.inf, -1.0, 0.0, 1e300]


@pytest.mark.parametrize("option", [("--no-abort",), ("--pieces", "4"), ("--block-kib", "8"), ("--collective-ms", "5"),
                                    ("--max-real-s", "30")])
def test_simulated_loop_refuses_real_rank_options(capsys, option):
    """``mccl loop --no-abort`` or ``--pieces 4`` without ``--executor gloo`` ran the
    simulation and exited 0: the option was silently ignored."""
    rc, err = _cli(capsys, "loop", "--duration-ms", "30", *option)
    assert rc == 2 and option[0] in err and "--executor gloo" in err, err


@pytest.mark.parametrize("per_min", [math.nan, math.inf, 1e300, 2.5, True, "3", 10 ** 30])
def test_registration_budget_range_checked(per_min):
    """NaN and infinity ended in a ValueError/OverflowError traceback, ``True`` and
    ``"3"`` were taken as 1 and 3, 2.5 became 2, 1e300 and 10**30 an unbounded budget."""
    from mccl_opt.errors import MCCLError
    from mccl_runtime.quota import RegistrationBudget

    with pytest.raises(MCCLError, match="registration budget"):
        RegistrationBudget(per_min)


def test_export_does_not_generate_a_large_fabric_of_other_gpus(capsys, tmp_path, monkeypatch):
    """An 8-GPU schedule whose ``topology`` field names a generated shape of other GPUs
    (``hpn-960x64x8``: 54 s and 1.2 GB to export 8 GPUs) is checked on its own paths,
    with the usual warning, without generating that fabric."""
    import importlib
    import json

    from instances import hpn
    from mccl_opt import solve_allgather
    from mccl_opt.cli import main

    sched = solve_allgather(hpn(1, 2, 4)).to_dict()
    sched["topology"] = "hpn-960x64x8"
    path = tmp_path / "s.json"
    path.write_text(json.dumps(sched))
    built: list[tuple] = []
    module = importlib.import_module("instances.hpn")     # the package's ``hpn`` is the function
    real = module.hpn
    monkeypatch.setattr(module, "hpn", lambda *a, **k: built.append(a) or real(*a, **k))
    assert main(["export", "msccl", str(path), "-o", str(tmp_path / "s.xml")]) == 0
    assert built == [] and "was not rebuilt" in capsys.readouterr().err
    sched["topology"] = "hpn-1x2x4"             # a shape of its GPUs is still rebuilt and checked on
    path.write_text(json.dumps(sched))
    assert main(["export", "msccl", str(path), "-o", str(tmp_path / "t.xml")]) == 0
    assert "was not rebuilt" not in capsys.readouterr().err       # (a library instance: loaded, not generated)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def one_rank():
    """A gloo process group of one rank in this process."""
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    yield dist
    dist.destroy_process_group()


@pytest.mark.parametrize("option,value", [(o, v) for o in ("oob_timeout", "stage_timeout") for v in BAD_SECONDS]
                         + [("timeout_s", math.inf), ("timeout_s", 1e300)])   # NaN, -1, 0 were refused already
def test_communicator_range_checks_its_timeouts(one_rank, option, value):
    """NaN and infinity ended in a ValueError/OverflowError traceback from ``timedelta``,
    -1 in gloo's ``enforce fail`` RuntimeError, 1e300 in an OverflowError; NaN and 0 as
    ``stage_timeout`` were taken (every swap round timing out)."""
    from executor_cuda.communicator import Communicator
    from mccl_opt.errors import InputError

    with pytest.raises(InputError, match=option):
        Communicator(**{option: value}, abort=option == "oob_timeout")


@pytest.mark.parametrize("value", BAD_SECONDS)
def test_stale_abort_range_checks_its_timeout(one_rank, value):
    from executor_cuda.abort import StaleAbort
    from mccl_opt.errors import InputError

    with pytest.raises(InputError, match="timeout_s"):
        StaleAbort([0], timeout_s=value)


def _agreeing_rank(rank: int, port: int, out, done) -> None:
    """Rank 0 enters the abort agreement; rank 1 never does (it stopped) and stays alive
    until the test has rank 0's outcome (``done``)."""
    from datetime import timedelta

    import torch.distributed as dist

    from executor_cuda.abort import StaleAbort

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=30))
    aborter = StaleAbort([0, 1], timeout_s=1.5)
    if rank == 1:
        done.wait(30.0)
        return
    comm = SimpleNamespace(rank=0, peers=[0, 1], switch_after=lambda seq, coll: None)
    try:
        aborter._agree(comm, 7, SimpleNamespace(collective="allgather", version=1))
        out.put(("returned", ""))
    except BaseException as exc:          # reported, whatever it is
        out.put((type(exc).__name__, str(exc)))


def test_abort_agreement_names_the_rank_when_a_peer_never_answers():
    """A peer that never joined the agreement ended it in gloo's bare RuntimeError
    (no collective, no rank named)."""
    pytest.importorskip("torch.distributed")
    ctx = multiprocessing.get_context("spawn")
    out, done, port = ctx.Queue(), ctx.Event(), _free_port()
    procs = [ctx.Process(target=_agreeing_rank, args=(r, port, out, done)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        kind, message = out.get(timeout=60)
    finally:
        done.set()
        for p in procs:
            p.join(20)
            if p.is_alive():
                p.kill()
    assert kind == "CollectiveTimeoutError", (kind, message)
    assert "allgather #7" in message and "rank 0" in message and "restart" in message


def test_time_limit_warning_does_not_contradict_a_met_bound(capsys, tmp_path):
    """``solve alltoall --time-limit 1e-9`` whose first schedule meets the certified bound
    warned "not proven optimal (bound 100 Gbps, certified gap 0.00%)"."""
    import json

    rc, err = _cli(capsys, "solve", "alltoall", "hpn-1x2x4", "--time-limit", "1e-9", "-o", str(tmp_path / "a.json"))
    assert rc == 0
    info = json.loads((tmp_path / "a.json").read_text())["report"]
    assert info["termination"] == "time_limit" and info["bound_gbps"] == 100.0
    assert "not proven optimal" not in err and "meets its certified bound (100 Gbps): it is optimal" in err


def test_a_registration_above_the_budget_is_not_told_to_retry():
    """An AllReduce (two slots) under a budget of one a minute was answered "retry in
    60.0 s", which never succeeds."""
    from mccl_opt.errors import MCCLError
    from mccl_runtime.service import ControllerService
    from tests.test_runtime_manager import TOPO, PruningSynth

    svc = ControllerService(TOPO, "tcp://127.0.0.1:0", synthesize=PruningSynth(), max_registrations_per_min=1)
    with pytest.raises(MCCLError) as exc:
        svc.register("world", "ar", "allreduce", now=0.0, budget=svc.budget)
    assert "never succeeds" in str(exc.value) and "retry in" not in str(exc.value)
    assert svc.register("world", "ag", "allgather", now=0.0, budget=svc.budget) == ["ag"]   # one slot: taken


@pytest.mark.parametrize("peers", [["tcp://127.0.0.1:1"] * 65, []])
def test_sharded_client_bounds_the_shards_a_controller_lists(peers):
    """A controller listing 65 shards (at most 64 are launched) had the client open 65
    sockets, whatever the count (100,000 would be as many); an empty list was taken as
    an unsharded controller."""
    from mccl_runtime.client import ShardedClient
    from mccl_runtime.protocol import ProtocolError
    from tests.test_runtime_service import Server

    with Server() as svc:
        svc.shard, svc.shard_endpoints = (0, 2), peers
        with pytest.raises(ProtocolError) as exc:
            ShardedClient(svc.endpoint, timeout_s=5.0)
        assert exc.value.reason == "bad_reply" and "1 to 64 endpoints" in str(exc.value)
