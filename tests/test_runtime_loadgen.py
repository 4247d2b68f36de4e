"""The load generator (mccl_runtime.loadgen): emulated executor processes send a fabric's
telemetry at the flush rate, a failure they inject reaches the controller, and the host-side
reduction sends fewer samples that the controller folds to the same M."""

from __future__ import annotations

import time

import numpy as np

from instances import hpn
from mccl_runtime.loadgen import FabricEmulator, Failure, run_emulators
from mccl_runtime.telemetry import MeasurementStore
from tests.test_runtime_service import Server

TOPO = hpn(1, 2, 2)


def test_emulator_processes_inject_a_failure_the_controller_acts_on():
    fail = Failure(0.3, (TOPO.link_index("s0h0g0", "s0tor0"), TOPO.link_index("s0tor0", "s0h0g0")), 50.0)
    with Server() as svc:
        svc.register("world", "ag", "allgather", now=0.0)
        sent, accepted = run_emulators(TOPO, [svc.endpoint], procs=2, duration_s=1.5, failures=[fail],
                                       noise=0.0)
        deadline = time.monotonic() + 10.0
        while svc.manager.get("world", "ag").version < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert svc.manager.get("world", "ag").version == 2
    # every link once per flush, about 1.5 s / 50 ms flushes, every sample accepted
    assert accepted == sent and sent % TOPO.num_links == 0 and 10 <= sent // TOPO.num_links <= 31
    assert svc.store.measured()[list(fail.links)].tolist() == [50.0, 50.0]


def test_reduced_pair_telemetry_folds_to_the_same_m():
    topo = hpn(1, 4, 8)
    cap = np.array(topo.arrays.capacity, dtype=float)
    cap[[3, 7]] = 100.0
    t = time.time()
    plain, reduced = (FabricEmulator(topo, "pair", group=16, reduce=r, noise=0.0) for r in (False, True))
    stores = []
    for emu in (plain, reduced):
        store = MeasurementStore(topo, alpha=1.0)
        batch = emu.flush(cap, t)
        assert store.ingest_columns(batch, t).accepted == len(batch)
        stores.append((store.measured(), len(batch)))
    assert np.array_equal(stores[0][0], stores[1][0]) and stores[1][1] < stores[0][1]
