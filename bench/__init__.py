"""Benchmarks: pytest-benchmark drivers and scripts over the case registry
(:mod:`instances.benchmarks.registry`) and the GPU check."""
