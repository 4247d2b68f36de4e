"""Hostile input, fifth pass (issue 27): cases that still failed after the fourth pass,
each failing on the code of 2026-12-06 before its fix (docs/runtime.md, "Hostile-input
audit, fifth pass").  Every case ends in one typed error (an error reply, exit status 2
with one ``error:`` line saying what to fix), never in a traceback, a hang, a silent
acceptance or a lost write."""

from __future__ import annotations

import json
import os
import tracemalloc
from pathlib import Path

import pytest

from mccl_opt.errors import MCCLError
from mccl_opt.files import parse_cost, read_json
from tests.test_hostile_third import _cli

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ memory of a parse
@pytest.mark.parametrize("text", [
    "[" + ",".join(f'{{"k{i}":0}}' for i in range(20000)) + "]",      # unique keys: 1.13 times the old estimate
    "[" + "1.5," * 20000 + "0]",                                        # floats: 1.02 times
    '["' + "a" * 200000 + '\U0001f600"]',                               # one astral character: 4 bytes a character
    '["\U0001f600",' + "1e1," * 20000 + "0]",
    "[" + "[[]]," * 20000 + "0]",
    "[" + '{"a":{}},' * 20000 + "0]",
])
def test_the_parse_cost_bounds_the_peak_of_a_parse(tmp_path, text):
    """The fourth pass's estimate was below what some shapes take at their peak (objects
    with unique keys 1.13 times it, floats 1.02 times, a text made 4 bytes a character by
    one emoji 2.3 times), so a file accepted under a limit could take more: measured here
    as :func:`read_json` runs (the bytes, the text and the objects together), the peak is
    at most 0.8 times the estimate."""
    f = tmp_path / "x.json"
    f.write_bytes(text.encode())
    cost = parse_cost(text.encode())
    tracemalloc.start()
    try:
        read_json(f, MCCLError, "test", cost)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert 0.1 * cost < peak <= 0.8 * cost, (peak, cost)
