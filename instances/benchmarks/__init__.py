"""Benchmark cases over the instance families, installed with the package so that
``mccl bench`` runs from a wheel: :mod:`.registry` (cases: synthesizer or LP model ×
backend × HPN shape × failure, timed by phase with the quality beside the times) and
:mod:`.report` (table, ``mccl-bench/1`` JSON, PNG).  The pytest-benchmark drivers that
sweep them live in the repository's ``bench/`` folder (docs/benchmarks.md).
"""

from __future__ import annotations
