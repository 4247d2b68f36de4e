"""ForestColl (paper §4.3): the optimal AllGather forest of a fabric with balanced switches.

:mod:`.pipeline` runs the phases in order: Phase 1, the optimal rate (:mod:`.throughput`,
on the compiled max-flow of :mod:`.maxflow`); Phase 2, switch removal by edge splitting
(:mod:`.removal`); Phase 3, packing ``k`` spanning out-trees per root on the logical GPU
graph (:mod:`.packing`); then the logical trees mapped back onto switch paths
(:mod:`.mapping`).  :mod:`.step_aware` and :mod:`.capped` are the step-aware switch
removal of App. C.
"""
