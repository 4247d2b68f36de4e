"""The ``mccl`` command line.

Each subcommand group lives in its own module exposing ``register(subparsers)``; the
modules are cheap to import (heavy imports happen inside the handlers).  Groups that
belong to upper layers (``mccl loop``, ``mccl controller``) are registered from those
packages' ``cli`` modules, imported here lazily by name: this is the one place where
the core dispatches upwards.  Every :class:`mccl_opt.MCCLError` (and a failed file
write, ``OSError``) is printed as ``error: <message>`` with exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

from .. import progress
from ..errors import MCCLError

__all__ = ["main", "build_parser"]

#: Modules that contribute subcommands, in help order.  Missing ones are skipped.
COMMAND_MODULES = (
    "mccl_opt.cli.demo",
    "mccl_opt.cli.warmup",
    "mccl_opt.cli.topo",
    "mccl_opt.cli.solve",
    "mccl_opt.cli.check",
    "mccl_opt.cli.export",
    "mccl_opt.cli.eval",
    "mccl_opt.cli.bench",
    "mccl_opt.cli.train",
    "mccl_runtime.cli",
    "mccl_opt.cli.loop_exec",
)


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = argparse.ArgumentParser(
        prog="mccl", description="Synthesize, check and evaluate GPU collective schedules.")
    parser.add_argument("--version", action="version", version=f"mccl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
                continue
            raise
        module.register(sub)
    state_defaults(parser)
    return parser


def state_defaults(parser: argparse.ArgumentParser) -> None:
    """Append ``(default X)`` to the help of every option, in every subcommand, whose
    default is a value and whose help does not already state it."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                state_defaults(child)
            continue
        default = action.default
        if (action.help and action.help is not argparse.SUPPRESS and action.option_strings
                and default not in (None, False, True, [], argparse.SUPPRESS)
                and "default" not in action.help.lower()):
            action.help = f"{action.help} (default {default})"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        try:
            return int(args.handler(args) or 0)
        finally:
            progress.stop()             # clear a progress line before an error message
    except MCCLError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:                     # a write the early path checks could not foresee
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
