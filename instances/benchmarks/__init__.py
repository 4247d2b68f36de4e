"""Benchmark cases over the instance families, installed with the package so that
``mccl bench`` runs from a wheel (docs/benchmarks.md): :mod:`.registry` (cases:
synthesizer or LP model × backend × HPN shape × failure, one run timed by phase with
the quality beside the times), :mod:`.repeat` (a warm-up run per case, then repeated
rounds alternating cold and warm runs; median, min and max), :mod:`.report` (tables,
``mccl-bench/2`` JSON, PNG) and :mod:`.lp_suite` (the exported LP models on each
backend, ``mccl bench --suite lp``).  The pytest-benchmark drivers that sweep them live
in the repository's ``bench/`` folder.
"""

from __future__ import annotations
