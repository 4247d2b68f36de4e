"""``mccl check``: GPU-count mismatches named plainly; a schedule that is valid but runs
slower (or faster) on this fabric is valid with the rate it runs at, exit 0 unless
``--strict``."""

from __future__ import annotations

import json

import pytest

from instances import fail2, hpn
from mccl_opt import Schedule, solve_alltoall, solve_allgather
from mccl_opt.cli import main

HEALTHY = hpn(1, 2, 4)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("check")
    out = {name: d / f"{name}.json" for name in ("healthy", "degraded", "bigger", "a2a", "ag")}
    HEALTHY.save(out["healthy"])
    fail2(HEALTHY).save(out["degraded"])
    hpn(1, 4, 4).save(out["bigger"])
    solve_alltoall(HEALTHY).save(out["a2a"])
    solve_allgather(HEALTHY).save(out["ag"])
    return out


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["check", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_gpu_count_mismatch_is_one_plain_line(capsys, files):
    rc, out, err = _run(capsys, str(files["bigger"]), str(files["a2a"]))
    assert rc == 2 and out == ""
    assert err.strip() == ("error: schedule has 8 GPUs, topology 'hpn-1x4x4' has 16; "
                           "was it synthesized for another topology? Its 8 GPUs are all GPUs of 'hpn-1x4x4': "
                           "for a communicator's schedule, pass --members schedule (or its ranks, GPU,GPU,...)")


@pytest.mark.parametrize("sched", ["a2a", "ag"])
def test_valid_but_slower_on_a_degraded_fabric(capsys, files, sched):
    stated = json.loads(files[sched].read_text())["rate_gbps"]
    rc, out, err = _run(capsys, str(files["degraded"]), str(files[sched]), "--json")
    info = json.loads(out)
    assert rc == 0 and info["valid"] is True and info["rate_as_stated"] is False
    assert info["schedule_rate_gbps"] == stated and info["rate_gbps"] < stated
    rc, out, _ = _run(capsys, str(files["degraded"]), str(files[sched]))
    assert rc == 0 and f"runs at {info['rate_gbps']:.4g} Gbps on this fabric (schedule says {stated:.4g}" in out
    rc, out, err = _run(capsys, str(files["degraded"]), str(files[sched]), "--strict")
    assert rc == 2 and "differs from rate_gbps" in err and err.startswith("error:")


def test_as_stated_on_its_own_fabric_and_strict_passes(capsys, files):
    for argv in ([], ["--strict"]):
        rc, out, _ = _run(capsys, str(files["healthy"]), str(files["a2a"]), "--json", *argv)
        info = json.loads(out)
        assert rc == 0 and info["rate_as_stated"] is True
    rc, out, _ = _run(capsys, str(files["healthy"]), str(files["a2a"]))
    assert rc == 0 and "runs at" not in out and out.startswith("OK:")


def test_structural_problems_stay_invalid_without_strict(capsys, files, tmp_path):
    d = Schedule.load(files["a2a"]).to_dict(compact=False)    # chunks spelled out
    d["chunks"] = d["chunks"][1:]                      # one block undelivered
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(d))
    rc, _, err = _run(capsys, str(files["degraded"]), str(bad))
    assert rc == 2 and "invalid" in err
    d = json.loads(files["a2a"].read_text())
    d["rate_gbps"] = d["lp_rate_gbps"] * 2             # the file contradicts itself
    bad.write_text(json.dumps(d))
    rc, _, err = _run(capsys, str(files["healthy"]), str(bad))
    assert rc == 2 and "at most 'lp_rate_gbps'" in err
