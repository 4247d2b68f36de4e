"""ForestColl Phase 2 (paper §4.3, Fig. 18): switches removed by splitting their edges.

:mod:`.splitting` (the split graph, switch balancing and Lovász/Bang-Jensen splitting
off), :mod:`.spread` (the fast spread proposal, in arrays), :mod:`.cut_guard` and
:mod:`.guarded_spread` (the proposal kept within the rooted cut condition),
:mod:`.transport` (a switch's units paired integrally), :mod:`.bundles` (the physical
paths under each logical link) and :mod:`.unit_rounding` (a balanced restriction's tree
units rounded so that every switch stays balanced).
"""
