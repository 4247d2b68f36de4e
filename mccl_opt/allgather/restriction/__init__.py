"""The balanced restriction (docs/allgather_history.md "General method"): ForestColl on the best
sub-fabric whose switches are balanced, for fabrics whose own switches are not
(:mod:`.balanced`)."""
