"""`python -m gateway.docgen [--check] [--root DIR]`: regenerate docs/reference/ (or only check it)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gateway.docgen import COMMAND, stale, write


def main() -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 when a page is out of date; write nothing")
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="the repository root (default: here)")
    args = parser.parse_args()
    if args.check:
        out_of_date = stale(args.root)
        for path in out_of_date:
            print(f"out of date: {path}", file=sys.stderr)
        if out_of_date:
            print(f"run `{COMMAND}` and commit the result", file=sys.stderr)
        return 1 if out_of_date else 0
    for path in write(args.root):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
