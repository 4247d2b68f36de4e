

def test_free_probes_inside_a_collective_only_measure_idle_links_held_low():
    from mccl_runtime.probes import Probe

    store = MeasurementStore(TOPO, alpha=1.0)
    nic = TOPO.link_index(*NIC)
    store.ingest(tm._cable(*NIC, 50.0, 1.0), now=1.0)            # held low since t = 1
    probe = Probe(0.01, 2**19, TOPO.arrays.capacity)
    true_cap = TOPO.arrays.capacity.copy()
    true_cap[nic] = 12.5
    busy = np.zeros(TOPO.num_links, dtype=bool)
    links, t, gbps = probe.during(1.05, store, true_cap, busy)
    assert set(links.tolist()) == {nic, TOPO.link_index(NIC[1], NIC[0])} and np.all(t > 1.05)
    assert np.all(gbps[links == nic] == 12.5)
    busy[nic] = True                                             # carrying the collective: left alone
    assert nic not in probe.during(1.05, store, true_cap, busy)[0]
    store.ingest_links(links, t, gbps)                           # just probed: not again within a period
    assert probe.during(1.055, store, true_cap, np.zeros(TOPO.num_links, dtype=bool))[0].size == 0
