"""`mccl export mps`: every exported model re-imports into HiGHS and solves to the
manifest optimum (docs/benchmarks.md); the switch-removal LP carries its separated cut rows."""

from __future__ import annotations

import itertools

import highspy
import numpy as np
import pytest

from formulations.export import read_mps, write_mps
from formulations.switch_removal import SwitchRemovalModel, build_switch_removal_lp
from instances.library import CATALOG, load_manifest
from mccl_opt.allgather.forestcoll.step_aware import solve_cut_lp, switch_removal_lp
from mccl_opt.cli import build_parser, main
from mccl_opt.errors import MCCLError, SolveError
from mccl_opt.models import build_model

SMALL = [i.name for i in CATALOG if load_manifest()["instances"][i.name]["gpus"] <= 16]


def _highs(threads: int = 1) -> highspy.Highs:
    """A silent HiGHS with the backend's thread count (HiGHS refuses to run when one
    process asks its shared scheduler for different thread counts)."""
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", threads)
    return h


def _highs_optimum(path) -> float:
    h = _highs()
    assert h.readModel(str(path)) == highspy.HighsStatus.kOk
    h.run()
    assert h.getModelStatus() == highspy.HighsModelStatus.kOptimal
    return h.getInfo().objective_function_value


CASES = [(name, model) for name in SMALL for model in ("compact", "master", "switch-removal")
         if model in load_manifest()["instances"][name]["models"]]


def test_switch_removal_is_in_the_manifest_of_small_switched_fabrics():
    with_model = {name for name, model in CASES if model == "switch-removal"}
    switched = {i.name for i in CATALOG if i.name in SMALL and i.load().switches}
    assert with_model == switched and "hpn-2x2x4-fail1" in with_model
    assert "ring-8" not in with_model and "mesh-6" not in with_model


@pytest.mark.parametrize("name,model", CASES)
def test_exported_mps_and_lp_solve_to_manifest_optimum(tmp_path, name, model):
    """The AllToAll models re-solve to the manifest's optimum (a function of ``z*``);
    switch-removal, whose model is the pipeline's (its stored optimum records the model
    built then), to the optimum its cutting-plane loop reached now."""
    if model == "switch-removal":
        want = build_model(next(i for i in CATALOG if i.name == name).load(), model)[1].optimum
    else:
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
    assert "neither a topology file nor an instance name" in capsys.readouterr().err
    assert main(["export", "mps", "--model", "switch-removal", "ring-8",
                 "-o", str(tmp_path / "x.mps")]) == 2
    assert "no switch joining two GPUs" in capsys.readouterr().err


def test_switch_removal_lp_is_the_pipeline_model_and_not_a_rate():
    topo = next(i for i in CATALOG if i.name == "hpn-1x2x4-fail3").load()
    lp, info = build_model(topo, "switch-removal")
    direct, opt = switch_removal_lp(topo)
    assert (info.objective, info.sense) == ("utility", "max")
    assert info.optimum == pytest.approx(opt, rel=1e-9) and lp.num_cols == direct.num_cols
    with pytest.raises(MCCLError, match="use ModelInfo.optimum"):
        info.optimum_from_rate(1.0)
    with pytest.raises(SolveError, match="raise max_depth"):
        switch_removal_lp(topo, max_depth=1)        # GPUs two switches apart need depth >= 2


def _two_group_model() -> SwitchRemovalModel:
    """One star switch over 6 GPUs (10 units per arc, k = 1) whose utility pays 20x more
    per unit inside the groups {0,1,2} and {3,4,5}: the degree cuts allow all units to stay
    inside a group, so the group cuts must be separated."""
    n, p = 6, [(u, t) for u in range(6) for t in range(6) if u != t]
    pairs = sorted(p)
    target = np.array([5.0 if (u < 3) == (t < 3) else 100.0 for u, t in pairs])
    return SwitchRemovalModel(
        num_gpus=n, arc_units=np.full(2 * n, 10.0),
        triple_in=np.array([u for u, _ in p]), triple_out=np.array([n + t for _, t in p]),
        triple_u=np.array([u for u, _ in p]), triple_t=np.array([t for _, t in p]),
        direct_tail=np.zeros(0, np.int64), direct_head=np.zeros(0, np.int64),
        direct_units=np.zeros(0), k_keep=1.0, target=target)


def test_final_lp_with_separated_cuts_reproduces_the_optimum(tmp_path):
    model = _two_group_model()
    loop = solve_cut_lp(model, "highs", 60, {}, None)
    assert loop.status == "optimal" and len(loop.cuts) > 2 * model.num_gpus   # cuts were added
    path = write_mps(build_switch_removal_lp(model, loop.cuts), tmp_path / "sr.mps")
    h = _highs()
    assert h.readModel(str(path)) == highspy.HighsStatus.kOk
    h.run()
    assert h.getInfo().objective_function_value == pytest.approx(loop.objective, rel=1e-7)
    # brute force over every GPU set: the exported LP's optimum violates no rooted cut
    cap = model.logical(np.array(h.getSolution().col_value)[: model.num_triples])
    for bits in itertools.product([False, True], repeat=model.num_gpus):
        inside = np.array(bits)
        if inside.any():
            assert cap[~inside][:, inside].sum() >= (~inside).sum() * model.k_keep - 1e-6
    # without the separated rows the relaxation keeps the units inside the groups
    h.clearModel()
    write_mps(build_switch_removal_lp(model, loop.cuts[: 2 * model.num_gpus]), path)
    h.readModel(str(path))
    h.run()
    assert h.getInfo().objective_function_value > loop.objective * (1 + 1e-6)
