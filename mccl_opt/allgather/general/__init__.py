"""The general AllGather method: the forwarding-only optimum on any fabric by column
generation over spanning trees (docs/allgather_history.md "General method").

:mod:`.method` (the entry point), :mod:`.restriction_seed` (starting trees and a certified
stop from the best balanced restriction), :mod:`.tree_colgen` (the column-generation loop),
:mod:`.live_master` (tree columns and the live restricted master), :mod:`.switch_paths`
and :mod:`.arborescence` (pricing: cheapest switch paths, then a minimum-cost spanning
arborescence per root) and :mod:`.tree_rounding` (tree weights rounded to ``K`` chunks).
"""
