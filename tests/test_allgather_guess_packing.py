"""Whether ForestColl-warm certifies a guess by packing (:func:`mccl_opt.allgather.warm.
certify._packing_pays`): the packing is cold's Phases 2-3, so it runs only where the cold
solve is predicted within the floor, by ``k·n²`` or, if higher, by the previous schedule's
measured cold CPU time (``k·n²`` misses Phase 2 at small ``k``)."""

from __future__ import annotations

import dataclasses

import mccl_opt as mo
from instances import hpn
from mccl_opt.allgather.warm.certify import _packing_pays
from mccl_opt.allgather.warm.reroute import REROUTE_FLOOR_S, predicted_cold_seconds


def test_a_costly_previous_cold_solve_skips_the_certifying_packing():
    topo = hpn(1, 2, 4)
    prev = mo.solve_allgather(topo, max_chunks=None)
    n = topo.num_gpus
    assert predicted_cold_seconds(1, n) <= REROUTE_FLOOR_S
    cheap = dataclasses.replace(prev, report=dataclasses.replace(
        prev.report, cold_cpu_seconds=REROUTE_FLOOR_S / 2))
    costly = dataclasses.replace(prev, report=dataclasses.replace(
        prev.report, cold_cpu_seconds=4 * REROUTE_FLOOR_S))
    assert _packing_pays(1, n, None) and _packing_pays(1, n, cheap)
    assert not _packing_pays(1, n, costly)
    assert _packing_pays(1, 2 * n, costly)             # of other GPUs: k·n² alone
    big_k = int(2 * REROUTE_FLOOR_S / predicted_cold_seconds(1, n))
    assert not _packing_pays(big_k, n, None)
