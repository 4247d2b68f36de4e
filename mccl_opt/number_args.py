"""Number options, read strictly: argparse ``type=`` functions for every command's
integer and float options (``mccl`` and ``mccl controller``/``loop``).

Python's ``int()`` and ``float()`` read more than a user types on purpose: other scripts'
digits (``--max-chunks ١٠`` was 10), ``1_000``, ``+5``, surrounding spaces, ``nan`` and
``inf``.  An option is read only when written in ASCII digits (:func:`ascii_number`), and
:func:`number_arg` checks its range, so every refusal is one argparse error naming the
option and what it expects (docs/runtime.md, "Hostile-input audit, fifth pass").
"""

from __future__ import annotations

import argparse
import math
import re
from typing import Callable

__all__ = ["ascii_number", "number_arg", "int_arg", "float_arg"]

#: the text of a number option: ASCII digits, an optional leading '-', for a float a decimal
#: point and an exponent; no '+', '_', spaces, 'nan'/'inf' or other scripts' digits (which
#: Python's int() and float() take: ``--max-chunks ١٠`` was read as 10, ``1_000`` as 1000)
_INT_TEXT = re.compile(r"-?[0-9]{1,40}", re.ASCII)
_FLOAT_TEXT = re.compile(r"-?(?:[0-9]{1,40}(?:\.[0-9]{0,40})?|\.[0-9]{1,40})(?:[eE][-+]?[0-9]{1,5})?", re.ASCII)


def ascii_number(cast: type, text: str) -> float:
    """``cast(text)`` for ``cast`` ``int`` or ``float``, the text written in ASCII digits
    (:data:`_INT_TEXT`, :data:`_FLOAT_TEXT`); NaN otherwise."""
    if not (_INT_TEXT if cast is int else _FLOAT_TEXT).fullmatch(text):
        return math.nan
    return cast(text)


def number_arg(cast: type, low: float, *, low_open: bool = False, high: float = math.inf,
               expected: str) -> Callable[[str], float]:
    """An argparse ``type=`` that accepts ``cast(text)`` (:func:`ascii_number`) in ``[low,
    high]`` (``(low, high]`` with ``low_open``), finite, and otherwise says ``expected ...
    (in ASCII digits), got TEXT``."""
    def parse(text: str):
        value = ascii_number(cast, text)
        try:
            finite = math.isfinite(value)
        except OverflowError:                       # an int beyond float range is out of any range
            finite = False
        if not (finite and (value > low if low_open else value >= low) and value <= high):
            raise argparse.ArgumentTypeError(f"expected {expected} (in ASCII digits), got {text[:40]!r}")
        return value
    return parse


def int_arg(text: str) -> int:
    """An argparse ``type=`` for an integer whose range the command checks after parsing
    (with a message of its own): only its spelling is checked here (:func:`ascii_number`)."""
    value = ascii_number(int, text)
    if not isinstance(value, int):
        raise argparse.ArgumentTypeError(f"expected an integer in ASCII digits, got {text[:40]!r}")
    return value


def float_arg(text: str) -> float:
    """:func:`int_arg` for a number (finite: ``nan`` and ``inf`` are refused too)."""
    value = ascii_number(float, text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number in ASCII digits, got {text[:40]!r}")
    return value
