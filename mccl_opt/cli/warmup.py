"""``mccl warmup``: compile (first run after installation) or load every numba kernel
a solve can use, one progress line per group of paths, then how long each group took
and where the cache is (the groups and the compile cost are explained in
:mod:`mccl_runtime.warmup`)."""

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
    from mccl_runtime.warmup import COLLECTIVES, GROUPS, cache_location, load_kernels

    where = cache_location()
    print(f"compiling or loading the numba kernels of every solve path (the first run after "
          f"installation compiles them: 20-40 s; cache: {where})", file=sys.stderr, flush=True)

    def announce(group) -> None:
        print(f"  [{GROUPS.index(group) + 1}/{len(GROUPS)}] {group.label}", file=sys.stderr, flush=True)

    spent = load_kernels(args.backend, COLLECTIVES, on_group=announce)
    total = sum(spent.values())
    if args.json:
        print_json({"backend": args.backend, **{f"{key}_s": s for key, s in spent.items()},
                    "total_s": total, "cache": where})
    else:
        print_table(["group", "seconds"], [[key, s] for key, s in spent.items()] + [["total", total]])
        print(f"backend {args.backend}; cache: {where}")
    return 0
