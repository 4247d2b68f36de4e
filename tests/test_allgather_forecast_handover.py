"""Where the forecast (:mod:`mccl_opt.allgather.forestcoll.packing.forecast`) stops the
spread split's repair packing at ``max_chunks=None``, the few-trees packing it chose runs
next, on the exact split, before the rest of the rooted test, the guarded split and the
rail-first retry (docs/allgather.md, *The forecast's choice taken at once*); if it fails,
those steps follow as before.  Either way the schedule is valid at the cut bound."""

from __future__ import annotations

import pytest

import mccl_opt as mo
from instances.aggregation import superpod
from mccl_opt.allgather.forestcoll import pack_steps
from mccl_opt.allgather.forestcoll.packing.few_trees import FEW_TREES_CHEAP_ENTRIES
from mccl_opt.allgather.forestcoll.packing.forecast import Forecast, forecast
from mccl_opt.allgather.forestcoll.removal.splitting import LogicalGraph
from tests.oracle_allgather import check_schedule, cut_bound


def _always_stop(n: int, k: int) -> tuple[Forecast, int]:
    """The forecast made at an eighth of ``k·n²`` visits, and always stopping (the
    few-trees estimate is one visit)."""
    fc, cap = forecast(n, k)
    return Forecast(fc.decide_at // 8, 1), cap


def _spy(monkeypatch, steps: list[str], few_fails: bool) -> None:
    """Log the packer's steps in ``steps``: the repair packings (``repair``,
    ``rail-first``), the few-trees packing (``few``, failing once with ``few_fails``)
    and the rooted test (``rooted test``; SuperPOD 2x2x8 is below ``TEST_FIRST_ENTRIES``: none
    before the first packing)."""
    real_repair, real_few, real_admits = (pack_steps._pack_repair, pack_steps._few_trees,
                                          LogicalGraph.admits)

    def repair(*a, **kw):
        steps.append("rail-first" if kw.get("rail_first") else "repair")
        return real_repair(*a, **kw)

    def few(split, rank_of, k, stats, lg, kind):
        steps.append("few")
        if few_fails and steps.count("few") == 1:
            return lg, kind, None
        return real_few(split, rank_of, k, stats, lg, kind)

    def admits(self, k, stride=1, passed=None, order=None):
        steps.append("rooted test")
        return real_admits(self, k, stride, passed, order)

    monkeypatch.setattr(pack_steps, "forecast", _always_stop)
    monkeypatch.setattr(pack_steps, "_pack_repair", repair)
    monkeypatch.setattr(pack_steps, "_few_trees", few)
    monkeypatch.setattr(LogicalGraph, "admits", admits)


def test_a_forecast_stop_hands_the_packing_to_the_few_trees_packing_at_once(monkeypatch):
    """SuperPOD 2x2x8 at ``None`` with the forecast forced to stop: the exact split's
    few-trees packing follows the stopped repair packing directly (no rooted test of the
    spread split, no rail-first retry), and its schedule is valid at the cut bound."""
    order: list[str] = []
    _spy(monkeypatch, order, few_fails=False)
    topo = superpod(2, 2, 8)
    s = mo.solve_allgather(topo, max_chunks=None)
    assert s.stats["k"] * topo.num_gpus ** 2 > FEW_TREES_CHEAP_ENTRIES
    assert s.stats.get("repair_forecast_stop") == 1
    assert order == ["repair", "few"]
    assert s.stats["split"] == "exact" and s.stats["packing"] == "exact"
    check_schedule(topo, s, None)
    assert s.rate_gbps == pytest.approx(cut_bound(topo), rel=1e-9)


def test_a_failed_few_trees_packing_after_a_stop_leaves_the_steps_as_before(monkeypatch):
    """Where that few-trees packing fails, the rest of the rooted test and the rail-first
    retry run as they did after a stop, the few-trees packing is not repeated (the exact
    split alone again), and a later packer still reaches the cut bound."""
    order: list[str] = []
    _spy(monkeypatch, order, few_fails=True)
    topo = superpod(2, 2, 8)
    s = mo.solve_allgather(topo, max_chunks=None)
    assert order[:4] == ["repair", "few", "rooted test", "rail-first"]
    assert order.count("few") == 1
    check_schedule(topo, s, None)
    assert s.rate_gbps == pytest.approx(cut_bound(topo), rel=1e-9)
