"""Page weight of the built book: bytes a cold first load of each page fetches.

Serves a built site on 127.0.0.1, opens every page in a fresh browser context (empty cache)
at 1280x900 and 390x844, waits for the load event and for the network to go quiet, and
counts the bytes of every response. Prints per page and width: the first load (no
scrolling), the HTML, and the load after scrolling to the bottom (every figure that lazy
loading defers fetched; hidden explorer views still not), with the three heaviest files.
Targets: first load <= 3 MB on every page, the largest page's HTML <= 1 MB.

Usage: python benchmarks/page_weight.py [SITE_DIR]   (default: _build/html)
       Debian's chromium at /usr/bin/chromium (or CUDA_MEMLAB_CHROMIUM).
"""
from __future__ import annotations

import functools
import http.server
import os
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.booktools import PAGES  # noqa: E402

WIDTHS = {"1280": {"width": 1280, "height": 900}, "390": {"width": 390, "height": 844}}


def serve(root: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    """A quiet static server on a free port: (server, origin)."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def weigh(browser, url: str, viewport: dict, *, scroll: bool) -> dict[str, int]:
    """{url: bytes} of every response a cold load of ``url`` gets (scrolled to the end if asked)."""
    mobile = viewport["width"] < 600
    context = browser.new_context(viewport=viewport, has_touch=mobile, is_mobile=mobile, device_scale_factor=1)
    sizes: dict[str, int] = {}
    page = context.new_page()

    def got(response):
        try:
            sizes[response.url] = len(response.body())
        except Exception:  # a redirect or an aborted request has no body
            sizes.setdefault(response.url, 0)

    page.on("response", got)
    page.goto(url, wait_until="load")
    page.wait_for_load_state("networkidle")
    if scroll:
        height = page.evaluate("() => document.documentElement.scrollHeight")
        for y in range(0, height, viewport["height"] // 2):
            page.evaluate(f"() => window.scrollTo(0, {y})")
            page.wait_for_timeout(60)
        page.wait_for_load_state("networkidle")
    context.close()
    return sizes


def main(argv: list[str]) -> int:
    from playwright.sync_api import sync_playwright

    site = Path(argv[1]) if len(argv) > 1 else ROOT / "_build" / "html"
    if not (site / "index.html").exists():
        print(f"no built book at {site}: run `make book` first", file=sys.stderr)
        return 2
    server, origin = serve(site)
    chromium = os.environ.get("CUDA_MEMLAB_CHROMIUM", "/usr/bin/chromium")
    worst = 0
    print(f"{'page':<24}{'width':>6}{'first load':>13}{'HTML':>10}{'scrolled':>11}   heaviest files (first load)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        for page in PAGES:
            url = f"{origin}/book/{page}.html"
            for name, viewport in WIDTHS.items():
                first = weigh(browser, url, viewport, scroll=False)
                scrolled = weigh(browser, url, viewport, scroll=True)
                total = sum(first.values())
                worst = max(worst, total)
                heavy = sorted(first.items(), key=lambda kv: -kv[1])[:3]
                names = ", ".join(f"{u.rsplit('/', 1)[-1].split('?')[0][:28]} {b / 1e3:.0f} kB" for u, b in heavy)
                print(f"{page:<24}{name:>6}{total / 1e6:>10.2f} MB{first.get(url, 0) / 1e6:>7.2f} MB"
                      f"{sum(scrolled.values()) / 1e6:>8.2f} MB   {names}")
        browser.close()
    server.shutdown()
    html = {p: (site / "book" / f"{p}.html").stat().st_size for p in PAGES}
    big = max(html, key=html.get)
    print(f"heaviest first load: {worst / 1e6:.2f} MB (target <= 3 MB); largest HTML: {big}.html "
          f"{html[big] / 1e6:.2f} MB (target <= 1 MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
