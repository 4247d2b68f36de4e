"""Plain-text tables and JSON output: how every ``mccl`` command, benchmark and report
prints results (README "Command line": results print as a short table, ``--json`` as JSON)."""

from __future__ import annotations

import json
import sys
from typing import Any, Sequence

__all__ = ["print_table", "print_json"]


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, file=None) -> None:
    """Print rows under headers with aligned columns (floats to 4 significant digits)."""
    file = file or sys.stdout

    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)

    cells = [[fmt(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h)
              for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths)), file=file)
    print("  ".join("-" * w for w in widths), file=file)
    for r in cells:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)), file=file)


def print_json(obj: Any) -> None:
    """Print ``obj`` as indented JSON (numpy scalars as floats)."""
    print(json.dumps(obj, indent=1, default=float))
