"""Solver benchmarking suite (docs/benchmarks.md): names in exported models map back to
the fabric's links, instance tiers carry certified optima, and ``--suite lp`` compares
every backend's objective with them."""

from __future__ import annotations

import argparse
import json

import highspy
import numpy as np
import pytest

from formulations.export import write_lp, write_mps
from formulations.names import TOKEN_MAX, FabricLabels, tokens
from formulations.tree_master import build_tree_master_lp
from instances import library, tiers
from instances.benchmarks import lp_suite
from mccl_opt.backends import backend_class
from mccl_opt.errors import MCCLError, SolverLicenseError
from mccl_opt.models import build_model
from mccl_opt.topology import Link, Node, Topology


def read_sections(path) -> tuple[dict[str, str], dict[tuple[str, str], float], dict[str, float]]:
    """A plain free-MPS parser: row types, (column, row) -> coefficient, row -> RHS."""
    kinds, coef, rhs, section = {}, {}, {}, None
    for line in open(path):
        if not line.strip():
            continue
        if not line[0].isspace():
            section = line.split()[0]
            continue
        tok = line.split()
        if section == "ROWS":
            kinds[tok[1]] = tok[0]
        elif section == "COLUMNS" and "'MARKER'" not in tok:
            for k in range(1, len(tok), 2):
                coef[(tok[0], tok[k])] = float(tok[k + 1])
        elif section == "RHS":
            for k in range(1, len(tok), 2):
                rhs[tok[k]] = float(tok[k + 1])
    return kinds, coef, rhs


def awkward_topology() -> Topology:
    """Node ids that collide once sanitised ("gpu_0", "gpu-0", "gpu 0"), hold the name
    separator, blanks, non-ASCII text, or run past the token length."""
    gpus = ["gpu_0", "gpu-0", "gpu 0", "GPU/ä", "g" * 70 + "1", "g" * 70 + "2"]
    sw = "sw_0"
    nodes = [Node(g, "gpu") for g in gpus] + [Node(sw, "switch")]
    links = []
    for i, g in enumerate(gpus):
        links += [Link(g, sw, 100.0 + i, 0.5), Link(sw, g, 200.0 + i, 0.5)]
    links.append(Link(gpus[0], gpus[1], 25.0, 1.0))
    return Topology("awkward", nodes, links)


def check_capacity_rows(topo: Topology, path, model: str) -> None:
    """Every ``cap_`` row of the file maps back to one link with its capacity."""
    kinds, coef, rhs = read_sections(path)
    ar = topo.arrays
    labels = FabricLabels.of([n.id for n in topo.nodes], ar.tail, ar.head, ar.gpu_nodes)
    cap_rows = [r for r in kinds if r.startswith("cap_")]
    assert len(cap_rows) == topo.num_links and all(kinds[r] == "L" for r in cap_rows)
    seen = set()
    for row in cap_rows:
        _, tail, head = row.split("_")
        link = topo.link(labels.node_of[tail], labels.node_of[head])
        seen.add((link.src, link.dst))
        if model == "compact":                 # sum of flows <= capacity
            assert rhs[row] == link.capacity_gbps
        else:                                   # sum of paths - capacity * t <= 0
            assert rhs.get(row, 0.0) == 0.0 and coef[("t", row)] == -link.capacity_gbps
    assert seen == {(lk.src, lk.dst) for lk in topo.links}


def highs_objective(path) -> float:
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 1)
    assert h.readModel(str(path)) == highspy.HighsStatus.kOk
    h.run()
    assert h.getModelStatus() == highspy.HighsModelStatus.kOptimal
    return h.getInfo().objective_function_value


@pytest.mark.parametrize("model", ["compact", "master"])
def test_capacity_rows_of_a_library_instance_map_back_to_links(tmp_path, model):
    topo = library.instance("hpn-1x2x4-fail2").load()
    lp, _ = build_model(topo, model)
    path = write_mps(lp, tmp_path / "m.mps")
    check_capacity_rows(topo, path, model)
    kinds, coef, _ = read_sections(path)
    cols = {c for c, _ in coef}
    if model == "compact":
        assert "z" in cols and "f_s0h0g0_s0h0g0_s0tor0" in cols and "n_s0h0g0_s0h0nvs" in kinds
    else:
        assert "t" in cols and "p_s0h0g0_s0h1g0_0" in cols and "d_s0h0g0_s0h1g0" in kinds
    want = library.load_manifest()["instances"]["hpn-1x2x4-fail2"]["models"][model]["optimum"]
    assert highs_objective(path) == pytest.approx(want, rel=1e-9)


def test_tokens_are_unique_safe_and_deterministic():
    ids = ["a_b", "a-b", "a b", "x" * 100, "", "a.b"]
    got = tokens(ids)
    assert got == ["a.b", "a.b~1", "a.b~2", "x" * TOKEN_MAX, ".", "a.b~3"]
    assert tokens(ids) == got and len(set(got)) == len(got)
    assert not any("_" in t or " " in t for t in got)


@pytest.mark.parametrize("model", ["compact", "master"])
def test_colliding_ids_get_unique_names_that_map_back(tmp_path, model):
    topo = awkward_topology()
    lp, _ = build_model(topo, model)
    assert len(set(lp.col_names)) == lp.num_cols and len(set(lp.row_names)) == lp.num_rows
    assert max(map(len, lp.col_names + lp.row_names)) <= 255
    path = write_mps(lp, tmp_path / "a.mps")
    check_capacity_rows(topo, path, model)
    # the names are kept (not replaced by x0/r0) in LP files too, and HiGHS reads both
    lp_text = write_lp(lp, tmp_path / "a.lp").read_text()
    assert "cap_gpu.0_sw.0" in lp_text and "cap_gpu.0~1_sw.0" in lp_text
    assert highs_objective(path) == pytest.approx(highs_objective(tmp_path / "a.lp"), rel=1e-9)


@pytest.mark.parametrize("name", ["hpn-1x2x4", "hpn-1x2x4-fail3"])
def test_switch_removal_names_name_arcs_and_gpus(tmp_path, name):
    topo = library.instance(name).load()
    lp, _ = build_model(topo, "switch-removal")
    kinds, coef, _ = read_sections(write_mps(lp, tmp_path / "sr.mps"))
    assert len(set(lp.col_names)) == lp.num_cols and len(set(lp.row_names)) == lp.num_rows
    ar = topo.arrays
    node_of = FabricLabels.of([n.id for n in topo.nodes], ar.tail, ar.head, ar.gpu_nodes).node_of
    arcs = [tuple(node_of[x] for x in r.split("_")[1:]) for r in kinds if r.startswith("arc_")]
    assert arcs and all(topo.is_gpu(a) != topo.is_gpu(b) for a, b in arcs)   # GPU <-> star
    if name == "hpn-1x2x4":          # no switch was split: every arc is a physical link
        assert all(topo.has_link(a, b) for a, b in arcs)
    else:                           # the backup GPU's id ("s0h0g0-bk") is sanitised
        assert ("s0h0g0-bk", "s0h0nvs") in arcs
    flows = [c for c in lp.col_names if c.startswith("f_")]
    assert len(flows) == sum(1 for c in lp.col_names if not c.startswith("s_"))
    for col in flows:       # f_<u>_<w>_<t> sits in the rows of arcs u -> w and w -> t
        _, u, w, t = col.split("_")
        assert {f"arc_{u}_{w}", f"arc_{w}_{t}"} <= {r for c, r in coef if c == col}
        assert topo.is_gpu(node_of[u]) and topo.is_gpu(node_of[t]) and not topo.is_gpu(node_of[w])


def test_tree_master_names():
    topo = awkward_topology()
    ar = topo.arrays
    labels = FabricLabels.of([n.id for n in topo.nodes], ar.tail, ar.head, ar.gpu_nodes)
    lp = build_tree_master_lp(6, ar.capacity, np.array([0, 0, 3]), np.array([0, 2, 4, 6]),
                              np.array([0, 1, 0, 3, 6, 7]), labels=labels)
    assert lp.col_names == ["x", "t_gpu.0_0", "t_gpu.0_1", "t_GPU.._0"]
    assert lp.row_names[:2] == ["r_gpu.0", "r_gpu.0~1"] and lp.row_names[6] == "cap_gpu.0_sw.0"


@pytest.fixture(scope="module")
def tiny_tier(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny")
    assert library.main(["build", "--tier", "tiny", "--out", str(out), "--max-gpus", "4"]) == 0
    return out


def test_built_tier_certifies_each_optimum_two_ways(tiny_tier):
    data = tiers.load_tier(tiny_tier)
    assert data["tier"] == "tiny" and data["complete"] and [r["name"] for r in data["instances"]] == [
        "hpn-1x2x2", "hpn-1x2x2-fail1", "hpn-1x2x2-fail2", "hpn-1x2x2-fail3"]
    for rec in data["instances"]:
        a2a = rec["alltoall"]
        assert a2a["certificate"] == "compact_lp" and a2a["compact_lp"]["status"] == "optimal"
        assert a2a["compact_lp"]["rate_gbps"] == pytest.approx(a2a["rate_gbps"], rel=1e-6)
        assert a2a["column_generation"]["gap"] <= 1e-7
        for model, info in rec["models"].items():
            lp = rec["models"][model]
            assert lp["cols"] > 0 and lp["nnz"] > 0
            assert highs_objective(tiny_tier / info["file"]) == pytest.approx(info["optimum"],
                                                                             rel=1e-7)
        assert rec["models"]["master"]["optimum"] == pytest.approx(1 / a2a["rate_gbps"])


def test_compact_lp_over_the_size_cap_is_not_attempted_and_cg_certifies(tmp_path):
    data = tiers.build_tier("tiny", tmp_path, max_gpus=4, compact_max_cols=10)
    a2a = data["instances"][0]["alltoall"]
    assert a2a["certificate"] == "cg_farley_bound" and not a2a["compact_lp"]["attempted"]
    assert "columns > 10" in a2a["compact_lp"]["reason"]
    cg = a2a["column_generation"]
    assert cg["bound_gbps"] >= cg["rate_gbps"] and cg["gap"] <= 1e-7


def test_suite_matches_easy_tier_certified_optima_on_highs(tmp_path):
    tiers.build_tier("easy", tmp_path, max_gpus=6)
    shipped = library.load_manifest()["instances"]
    rows = lp_suite.run_suite(tmp_path, ["highs"])
    assert len(rows) >= 4 and {r.model for r in rows} == {"compact", "master"}
    for r in rows:
        assert r.status == "optimal" and r.repeats == 1 and r.seconds >= 0
        assert r.optimum == shipped[r.instance]["models"][r.model]["optimum"]
        assert r.objective == pytest.approx(r.optimum, rel=1e-7) and r.rel_error < 1e-7


def _args(directory, **kw) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backends", default=None)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", default=None)
    parser.add_argument("--repeat", type=int, default=1)
    lp_suite.add_arguments(parser)
    argv = ["--dir", str(directory)]
    kw.setdefault("tier", "tiny")
    for k, v in kw.items():
        argv += [f"--{k}"] + ([] if v is True else [str(v)])
    return parser.parse_args(argv)


def test_missing_backend_and_licence_limit_are_skipped_rows(tiny_tier, monkeypatch, capsys):
    monkeypatch.setattr(backend_class("scip"), "is_available", classmethod(lambda cls: False))
    # gurobipy installed or not, the licence check below answers for it
    monkeypatch.setattr(backend_class("gurobi"), "is_available", classmethod(lambda cls: True))
    real = lp_suite._solve_once

    def licence_limited(backend, lp, time_limit):
        if backend == "gurobi":
            raise SolverLicenseError("Gurobi's size-limited licence cannot solve this model")
        return real(backend, lp, time_limit)

    monkeypatch.setattr(lp_suite, "_solve_once", licence_limited)
    out = tiny_tier / "rows.json"
    assert lp_suite.run(_args(tiny_tier, backends="highs,gurobi,scip", repeat=2,
                              out=out)) == 0
    table = capsys.readouterr().out.splitlines()
    assert max(map(len, table)) <= 100 and "skipped" in table[-1]
    assert "not installed: pip install" in table[-1] and "licence limit" in table[-2]
    rows = json.loads(out.read_text())["rows"]
    by = {b: [r for r in rows if r["backend"] == b] for b in ("highs", "gurobi", "scip")}
    assert all(r["status"] == "skipped" and r["reason"] == "not installed"
               and r["note"] == "pip install pyscipopt" for r in by["scip"])
    assert all(r["status"] == "skipped" and r["reason"] == "licence limit"
               and "size-limited" in r["note"] for r in by["gurobi"])
    assert all(r["status"] == "optimal" and r["repeats"] == 2 for r in by["highs"])
    assert lp_suite.run(_args(tiny_tier, backends="highs", json=True)) == 0
    assert {r["status"] for r in json.loads(capsys.readouterr().out)} == {"optimal"}
    assert lp_suite.run_suite(tiny_tier, ["highs"], max_gpus=3) == []
    assert lp_suite.run(_args(tiny_tier, backends="highs", models="master", json=True)) == 0
    assert {r["model"] for r in json.loads(capsys.readouterr().out)} == {"master"}


def test_bad_inputs_are_typed_errors(tmp_path, tiny_tier):
    with pytest.raises(MCCLError, match="build --tier TIER"):
        tiers.load_tier(tmp_path)
    data = json.loads((tiny_tier / tiers.TIER_MANIFEST).read_text())
    del data["instances"][1]["models"]["master"]["optimum"]
    (tmp_path / tiers.TIER_MANIFEST).write_text(json.dumps(data))
    with pytest.raises(MCCLError, match="instance entry 1 lacks"):
        tiers.load_tier(tmp_path)
    (tmp_path / tiers.TIER_MANIFEST).write_text("{not json")
    with pytest.raises(MCCLError, match="not a readable tier manifest"):
        tiers.load_tier(tmp_path)
    with pytest.raises(MCCLError, match="unknown backend"):
        lp_suite.run(_args(tiny_tier, backends="cplex"))
    with pytest.raises(MCCLError, match="unknown model.*switch"):
        lp_suite.run(_args(tiny_tier, models="switch"))
    with pytest.raises(MCCLError, match="holds the tiny tier, not medium"):
        lp_suite.run(_args(tiny_tier, tier="medium"))
    with pytest.raises(MCCLError, match="unknown tier"):
        tiers.tier_instances("huge")
    assert library.main(["check", "--tier", "tiny"]) == 2
