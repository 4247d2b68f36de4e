"""ForestColl (paper §4.3): the optimal AllGather forest of a fabric with balanced switches.

:mod:`.pipeline` runs Phase 1, the optimal rate (:mod:`.throughput`, on the compiled
max-flow of :mod:`.maxflow`), and switch balancing; :mod:`.pack_steps` Phase 2, switch
removal by edge splitting (:mod:`.removal`), and Phase 3, packing ``k`` spanning out-trees
per root on the logical GPU graph (:mod:`.packing`) by the packers that :mod:`.pack_plan`
orders; then the logical trees mapped back onto switch paths
(:mod:`.mapping`).  :mod:`.step_aware` and :mod:`.capped` are the step-aware switch
removal of App. C.
"""
