"""Settings every test shares.

An AllGather warm start runs as a stage with a CPU-time budget (docs/allgather_history.md "Time
limits, warm budgets and the typed report", "Warm caps in CPU seconds"): past one allowance
per solve, max(5 ms, 0.25 x the cold CPU time it carries), it is declined for a cold solve.  On a loaded machine that makes
the warm path a test sees depend on the load, not on the code, so in-process tests run with
a generous floor;
the tests of the budget itself are marked ``warm_budget`` and see the real one.
"""

from __future__ import annotations

import pytest

#: the warm-stage floor (s) in-process tests run with
TEST_WARM_FLOOR_S = 60.0


@pytest.fixture(autouse=True)
def _warm_budget_off_the_clock(request: pytest.FixtureRequest,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    if request.node.get_closest_marker("warm_budget") is None:
        from mccl_opt.allgather.warm import route

        monkeypatch.setattr(route, "WARM_FLOOR_S", TEST_WARM_FLOOR_S)


@pytest.fixture
def proportional_spread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Phase 2's spread split as it was before sibling pairs went last
    (:mod:`mccl_opt.allgather.forestcoll.removal.siblings`): the logical graphs on which
    the fallbacks some tests exercise (few-trees, wide margins, a rejected rounding) are
    still needed; on these fabrics the split now packs at once."""
    from mccl_opt.allgather.forestcoll.removal import spread

    monkeypatch.setattr(spread, "spread_stages", lambda proportional, siblings: [proportional, None])
