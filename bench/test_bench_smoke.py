"""pytest-benchmark drivers over the case registry (:mod:`instances.benchmarks`).

``make test`` runs them once each with ``--benchmark-disable`` (the CI smoke run, one
tiny fabric); ``MCCL_BENCH_SIZES=1x2x8,1x4x8 pytest bench/test_bench_smoke.py
--benchmark-enable`` times a real sweep (one untimed warm-up round, then 3 rounds).
Each benchmark times one case end to end; its phase times (build / solve / round /
validate) and quality (gap to the reference bound, the LP optimum vs the instance
library's manifest) go to ``extra_info``.  ``mccl bench`` is the command-line view of
the same cases (docs/benchmarks.md).
"""

from __future__ import annotations

import json
import os

import pytest

from instances.benchmarks.registry import PHASES, REFERENCE, cases, run_case
from instances.benchmarks.repeat import add_reference_ratios, measure
from instances.benchmarks.report import plot_png, print_report, to_doc
from instances.library import load_manifest

SIZES = tuple(os.environ.get("MCCL_BENCH_SIZES", "1x2x4").split(","))
CASES = cases("all", SIZES, ("fail2",))


@pytest.fixture(scope="module")
def manifest():
    from mccl_runtime.warmup import load_kernels

    load_kernels()                     # every path's kernels (cold and warm), outside the timings
    return load_manifest()["instances"]


def _known_optimum(manifest: dict, case) -> float | None:
    rec = manifest.get(case.topology().name)
    return None if rec is None else rec[case.suite]["rate_gbps"]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_case(benchmark, manifest, case):
    res = benchmark.pedantic(run_case, args=(case,), rounds=3, iterations=1, warmup_rounds=1)
    if res.status == "skipped":
        pytest.skip(res.reason)              # size-limited Gurobi, backend not installed
    assert res.status == "ok", res.reason
    benchmark.extra_info.update({p: getattr(res, p) for p in PHASES})
    benchmark.extra_info.update(gpus=res.gpus, lp_gbps=res.lp_gbps, rate_gbps=res.rate_gbps)
    assert all(getattr(res, p) >= 0 for p in PHASES) and res.solve_s > 0
    known = _known_optimum(manifest, case)
    if known is not None:
        assert res.lp_gbps == pytest.approx(known, rel=1e-6)
    if case.method != "compact_lp":             # a validated schedule within its bound
        assert 0 < res.rate_gbps <= res.lp_gbps * (1 + 1e-9)
        benchmark.extra_info["gap"] = 1 - res.rate_gbps / res.lp_gbps


def test_report_outputs(tmp_path, manifest, capsys):
    """One instance through every method: ratios to the reference, gaps, JSON and PNG."""
    todo = [c for c in CASES if c.shape == SIZES[0] and c.backend in ("highs", "maxflow")]
    results = add_reference_ratios(measure(todo, 1))
    for r in results:
        assert r.status == "ok" and r.bound_gbps > 0
        assert -1e-9 <= r.gap < 0.2
        if r.case.method == REFERENCE[r.case.suite]:
            assert r.vs_ref == 1.0
        if r.case.method == "compact_lp":            # the AllToAll bound itself
            assert abs(r.gap) <= 1e-9
    print_report(results, 1, {}, None)
    assert sum("  highs  " in line or "  maxflow  " in line
               for line in capsys.readouterr().out.splitlines()) == len(todo)
    doc = json.loads(json.dumps(to_doc(results, repeat=1, load={})))
    assert doc["format"] == "mccl-bench/2" and len(doc["results"]) == len(todo)
    assert {r["method"] for r in doc["results"]} == {
        "compact_lp", "cold_cg", "warm_cg", "forestcoll_cold", "forestcoll_warm"}
    png = plot_png(results, tmp_path / "b.png", repeat=1)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
