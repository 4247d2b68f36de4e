"""``mccl demo``: the main job on a built-in instance (what ``make demo`` runs)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the main job on a built-in instance (HPN 1x2x8, Fail2)")
    p.set_defaults(handler=_demo)


def _demo(args: argparse.Namespace) -> int:
    from . import topo

    return topo._hpn(argparse.Namespace(shape="1x2x8", fail="fail2", gpu=0, output=None, json=False))
