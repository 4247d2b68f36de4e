"""AllToAll under a time limit when the LP backend stops a master solve before it has
any solution (HiGHS reports no ``x`` at a limit until it has a feasible basis): the
round ends, the previous round's schedule is returned with status ``time_limit``, not
a "numerical trouble" SolveError (issue #27, "time limits")."""

from __future__ import annotations

import numpy as np

from instances import fail2, hpn
from mccl_opt.alltoall import solve_alltoall
from mccl_opt.alltoall import master as master_module
from mccl_opt.backends import SolveStatus
from mccl_opt.backends.solution import LPSolution
from mccl_opt.validate import validate


def test_a_master_cut_short_without_a_solution_ends_in_the_last_rounds_schedule(monkeypatch):
    topo = fail2(hpn(1, 4, 8))               # needs many rounds (tests/test_alltoall.py)
    real = master_module.RestrictedMaster.solve
    calls = {"n": 0, "limited": 0}

    def solve(self, where, *, method="auto", time_limit=None):
        calls["n"] += 1
        if time_limit is not None and calls["n"] >= 3:          # the third round hits the limit
            calls["limited"] += 1
            empty = LPSolution(SolveStatus.TIME_LIMIT, None, None, None, None, 0, time_limit)
            backend = self.backend
            monkeypatch.setattr(backend, "solve", lambda *a, **k: empty)
            try:
                return real(self, where, method=method, time_limit=time_limit)
            finally:
                monkeypatch.undo()
                monkeypatch.setattr(master_module.RestrictedMaster, "solve", solve)
        return real(self, where, method=method, time_limit=time_limit)

    monkeypatch.setattr(master_module.RestrictedMaster, "solve", solve)
    sched = solve_alltoall(topo, time_limit=60.0)
    assert calls["limited"] == 1
    assert sched.stats["status"] == "time_limit"
    rep = validate(topo, sched)                             # every block delivered, capacities respected
    assert np.isfinite(sched.rate_gbps) and 0 < sched.rate_gbps <= sched.lp_rate_gbps * (1 + 1e-9)
    assert rep is not None
