"""ForestColl Phase 3 (paper §4.3): ``k`` spanning out-trees per root on the logical graph.

:mod:`.trees` (tree classes and the greedy packer), :mod:`.repair` and :mod:`.augment`
(unit trees grown concurrently with local augmenting repair, the packer at scale),
:mod:`.growth_order` (the order trees grow in), :mod:`.scaled` (many trees per root as
scaled copies of a small packing plus a residual one) and :mod:`.exact_packing` (Lovász's
constructive proof of Edmonds' branching theorem, the exact fallback).
"""
