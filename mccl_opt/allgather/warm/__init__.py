"""ForestColl-warm (paper §4.3): what a schedule keeps for its successor, and how a warm
start uses it.

:mod:`.previous` (the warm state and the previous schedule read against a new fabric),
:mod:`.certify` (a guessed optimum certified by the trees that reach it),
:mod:`.reroute` (the previous physical trees rerouted), :mod:`.forest` (physical trees
in arrays) and :mod:`.transfer` (a forest carried onto a fabric whose GPUs changed).
"""
