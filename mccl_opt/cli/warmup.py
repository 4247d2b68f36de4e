"""``mccl warmup``: compile (first run after installation) or load the synthesizers'
numba kernels, and say how long it took and where the cache is (the compile cost is
explained in :mod:`mccl_runtime.warmup`)."""

from __future__ import annotations

import argparse
import sys

from ..tables import print_json, print_table
from ._inputs import backend_arg


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("warmup", help="compile the synthesizers' kernels once (after installing)")
    p.add_argument("--backend", type=backend_arg, default="highs", help="LP backend the warm-up solves use (default highs)")
    p.add_argument("--json", action="store_true", help="print the timings as JSON")
    p.set_defaults(handler=_warmup)


def _warmup(args: argparse.Namespace) -> int:
    from mccl_runtime.warmup import COLLECTIVES, cache_location, load_kernels

    where = cache_location()
    print(f"compiling or loading the synthesizers' kernels (the first run after installation "
          f"compiles them: about a minute; cache: {where})", file=sys.stderr, flush=True)
    spent = load_kernels(args.backend, COLLECTIVES)
    info = {"backend": args.backend, **{f"{c}_s": spent[c] for c in COLLECTIVES},
            "total_s": sum(spent.values()), "cache": where}
    if args.json:
        print_json(info)
    else:
        print_table(list(info), [list(info.values())])
    return 0
