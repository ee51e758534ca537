"""`enginegate` command line: one subcommand per module in gateway/commands."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

COMMANDS = ("serve", "detect", "plan", "doctor", "bench", "engines", "tune", "models", "keys", "usage")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="enginegate", description="One OpenAI-compatible endpoint; the right engine for this hardware.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"gateway.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"gateway.commands.{name}":
                continue
            raise
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    return int(args.func(args) or 0)
