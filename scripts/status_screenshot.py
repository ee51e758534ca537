"""Screenshot the console's status tab of a running gateway with Debian's chromium (no `playwright install`).

    python scripts/status_screenshot.py [--url http://127.0.0.1:8000] [--out status.png]
"""

from __future__ import annotations

import argparse
import sys

from playwright.sync_api import sync_playwright

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--out", default="status.png")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--wait-ms", type=int, default=4500, help="let the page poll twice so rates show")
    args = parser.parse_args()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=args.chromium, args=ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1200, "height": 800})
        page.goto(args.url.rstrip("/") + "/#/status")
        page.wait_for_selector("#models tr")
        page.wait_for_timeout(args.wait_ms)
        page.screenshot(path=args.out, full_page=True)
        browser.close()
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
