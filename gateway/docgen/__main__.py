"""`python -m gateway.docgen [--check] [--root DIR]`: regenerate every generated page (or only check them).

docs/reference/ comes from the code. In a checkout, the pages built from the test fixtures come too:
the planning table of docs/planning.md and the recipes' blocks in docs/getting-started/.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gateway.docgen import COMMAND, stale, write


def _fixture_pages(check: bool) -> list[str]:
    """Out-of-date (check) or rewritten pages made from tests/ fixtures; nothing outside a checkout."""
    try:
        from tests.unit.planning import planning_table, recipes
    except ModuleNotFoundError:
        print("note: tests/ is not importable here; docs/planning.md and docs/getting-started/ left as they are")
        return []
    if check:
        out = ["docs/planning.md"] if planning_table.page_table() != planning_table.table() else []
        return out + [f"docs/getting-started/{r.page}.md" for r in recipes.RECIPES
                      if recipes.page_block(r) != recipes.block(r)]
    return (["docs/planning.md"] if planning_table.write() else []) + recipes.write()


def main() -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 when a page is out of date; write nothing")
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="the repository root (default: here)")
    args = parser.parse_args()
    if args.check:
        out_of_date = stale(args.root) + _fixture_pages(check=True)
        for path in out_of_date:
            print(f"out of date: {path}", file=sys.stderr)
        if out_of_date:
            print(f"run `{COMMAND}` and commit the result", file=sys.stderr)
        return 1 if out_of_date else 0
    for path in write(args.root) + _fixture_pages(check=False):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
