"""`mccl export mps`: every exported model re-imports into HiGHS and solves to the
manifest optimum (issue 8)."""

from __future__ import annotations

import highspy
import pytest

from formulations.export import read_mps
from instances.library import CATALOG, load_manifest
from mccl_opt.cli import build_parser, main

SMALL = [i.name for i in CATALOG if load_manifest()["instances"][i.name]["gpus"] <= 16]


def _highs_optimum(path) -> float:
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    assert h.readModel(str(path)) == highspy.HighsStatus.kOk
    h.run()
    assert h.getModelStatus() == highspy.HighsModelStatus.kOptimal
    return h.getInfo().objective_function_value


@pytest.mark.parametrize("model", ["compact", "master"])
@pytest.mark.parametrize("name", SMALL)
def test_exported_mps_and_lp_solve_to_manifest_optimum(tmp_path, name, model):
    want = load_manifest()["instances"][name]["models"][model]["optimum"]
    out = tmp_path / f"{name}.mps"
    assert main(["export", "mps", "--model", model, name, "-o", str(out), "--lp"]) == 0
    assert _highs_optimum(out) == pytest.approx(want, rel=1e-6)
    assert _highs_optimum(out.with_suffix(".lp")) == pytest.approx(want, rel=1e-6)


def test_pair_commodities_and_topology_files(tmp_path, capsys):
    name = "hpn-1x2x4-fail2"
    topo_file = tmp_path / "t.json"
    next(i for i in CATALOG if i.name == name).load().save(topo_file)
    out = tmp_path / "pair.mps"
    assert main(["export", "mps", str(topo_file), "-o", str(out), "--commodities", "pair",
                 "--json"]) == 0
    assert '"known_optimum"' in capsys.readouterr().out
    lp = read_mps(out)
    want = load_manifest()["instances"][name]["models"]["compact"]["optimum"]
    assert lp.sense == "max" and lp.num_cols > 8 * 7 * 30   # one commodity per ordered pair
    assert _highs_optimum(out) == pytest.approx(want, rel=1e-6)


def test_export_group_holds_both_formats():
    parser = build_parser()
    args = parser.parse_args(["export", "mps", "ring-8", "-o", "x.mps"])
    assert args.model == "compact" and args.export_command == "mps"
    args = parser.parse_args(["export", "msccl", "s.json", "-o", "a.xml"])
    assert args.export_command == "msccl"


def test_bad_inputs_exit_2(tmp_path, capsys):
    assert main(["export", "mps", "no-such-instance", "-o", str(tmp_path / "x.mps")]) == 2
    assert "neither a topology file nor a library instance" in capsys.readouterr().err
    assert main(["export", "mps", "--model", "switch-removal", "ring-8",
                 "-o", str(tmp_path / "x.mps")]) == 2
    assert "'switch-removal' cannot be exported" in capsys.readouterr().err
