"""docs/reference/cli.md from the argument parser (gateway/cli.py and gateway/commands/)."""

from __future__ import annotations

import argparse
import os

from gateway.cli import build_parser
from gateway.docgen.markdown import cell, table

WIDTH = "100"  # argparse wraps usage lines to $COLUMNS: fixed, so the page is the same everywhere


def _subparsers(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            found += [(name, helps.get(name, ""), sub) for name, sub in action.choices.items()]
    return found


def _option_rows(parser: argparse.ArgumentParser) -> list[list[str]]:
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) or action.help == argparse.SUPPRESS:
            continue
        name = ", ".join(f"`{o}`" for o in action.option_strings) or f"`{action.metavar or action.dest}`"
        takes = action.nargs != 0
        value = ""
        if takes:
            metavar = action.metavar or (action.dest.upper() if action.option_strings else "")
            value = ("one of " + ", ".join(f"`{c}`" for c in action.choices) if action.choices
                     else f"`{metavar}`" if metavar else "")
        default = action.default
        shown = "" if not takes or default in (None, argparse.SUPPRESS) else f"`{default}`"
        rows.append([name, value, shown, cell(action.help or "")])
    return rows


def _command(prog: str, summary: str, parser: argparse.ArgumentParser, depth: int) -> list[str]:
    lines = [f"{'#' * depth} `{prog}`", ""]
    text = parser.description or summary
    if text:
        lines += [cell(text), ""]
    lines += ["```", parser.format_usage().strip(), "```", ""]
    rows = _option_rows(parser)
    if rows:
        lines += [table(["option", "value", "default", "what"], rows), ""]
    for name, help_text, sub in _subparsers(parser):
        lines += _command(f"{prog} {name}", help_text, sub, depth + 1)
    return lines


def render() -> str:
    # Defaults that read the environment ($ENGINEGATE_URL, keys) are documented as the code's own, never as
    # this shell's values; argparse wraps usage to $COLUMNS.
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update({k: v for k, v in saved.items() if k in ("PATH", "HOME")}, COLUMNS=WIDTH)
    try:
        parser = build_parser()
        lines = ["# Command-line reference", "",
                 "Every `enginegate` subcommand and flag, generated from the argument parser",
                 "(`gateway/cli.py`, one module per subcommand in `gateway/commands/`). `enginegate COMMAND --help`",
                 "prints the same.", ""]
        for name, help_text, sub in _subparsers(parser):
            lines += _command(f"enginegate {name}", help_text, sub, 2)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return "\n".join(lines)
