"""Benchmarks: the case registry (:mod:`bench.registry`) and pytest-benchmark drivers."""
