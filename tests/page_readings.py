"""Every page of the built book loaded once per colour scheme and width, for all the browser tests
that only read what a page shows: one load gives each of them what it asserts on.

Before, seven tests in four modules loaded the same pages again, 100 loads where these 32 do
(8 pages x light/dark x 1280/390 px): the first-load weight and the theme's icons
(test_browser_figures.py), the
screenshot and the widths (test_browser.py), the readers' contrast, tables, focus rings and
fonts (test_browser_readers.py), the figures' text size (test_browser_figures.py), and
identifiers and text outputs (test_browser_reading.py). One load serves them all because the
steps run in an order where none changes what a later one reads:

1. (light) at network idle: what the first load fetched, before anything scrolls a lazy image in;
2. what needs the page as it loaded: widths, tables, fonts, favicon, icon glyphs, the theme's icons;
3. (light) the full-page screenshot;
4. every fold and solution opened by a click, as readers open them; contrast; focus rings;
5. (light) every figure scrolled to and measured; identifiers in tables; text outputs.

The measurements themselves (the JavaScript) stay in the test modules that assert on them.
Run as a process of its own (``python -m tests.page_readings SITE_DIR OUT.json``), so that
Playwright's event loop never lives in a test worker beside tests that run notebooks; the
``page_readings`` fixture (tests/conftest.py) runs it once per run, for every xdist worker.
"""
from __future__ import annotations

import functools
import http.server
import json
import os
import re
import sys
import threading
import traceback
from pathlib import Path

SCHEMES = ("light", "dark")


def _relative(url: str, origin: str) -> str:
    return url[len(origin) + 1:] if url.startswith(origin + "/") else url


def read_page(browser, origin: str, page: str, scheme: str, width: str, tabs=None) -> dict:
    """What the tests read on ``book/{page}.html`` in ``scheme`` at ``width`` ("1280" or "390"):
    a dict of plain data (URLs relative to the site's root). ``tabs``: the kept tabs to load it
    in (tests.test_browser.Tabs), else a context of its own."""
    from .test_browser import OVERFLOWING_OUTPUTS, SCREENSHOTS, WIDE_ELEMENTS, WIDTHS, Visit
    from .test_browser_figures import FIGURE_PAGES, HIDDEN_VIEWS_JS, ICON_PAGES, ICONS_JS, MEASURE_JS
    from .test_browser_reading import CHAR_TOPS, PARAGRAPHS, _open_folds
    from .test_browser_readers import CONTRAST_JS, FOCUS_JS, GLYPHS_JS, TABLES_JS, _open_everything

    viewport, touch = WIDTHS[width]
    light = scheme == "light"
    v = Visit(browser, origin, f"book/{page}.html", viewport, touch, scheme, sizes=True, bodies=light, tabs=tabs)
    got: dict = {}
    tagged = 0

    def stage(name: str) -> None:
        """Problems seen since the last stage say in which they came (the load's say nothing)."""
        nonlocal tagged
        v.problems[tagged:] = [p if name == "load" else f"{p} (while {name})" for p in v.problems[tagged:]]
        tagged = len(v.problems)

    try:
        stage("load")
        if light:
            v.page.wait_for_load_state("networkidle")
            hidden = v.page.evaluate("""() => [...document.querySelectorAll('.memlab-view[hidden] [data-src], '
                                          + '.memlab-view[hidden] [data-srcset]')]
                .map(e => new URL(e.dataset.src || e.dataset.srcset, location.href).href)""")
            got["first_load"] = {"bodies": {_relative(u, origin): b for u, b in v.bodies.items()},
                                 "hidden": [_relative(u, origin) for u in hidden]}
            got["scroll_width"] = v.page.evaluate("() => document.documentElement.scrollWidth")
            got["wide"] = v.page.evaluate(WIDE_ELEMENTS)
            got["over"] = v.page.evaluate(OVERFLOWING_OUTPUTS)
            stage("waiting for the network to go idle")
        got["fonts"] = {u: b for u, b in v.sizes.items() if re.search(r"\.(woff2?|ttf|otf)(\?|$)", u)}
        got["favicon"] = v.page.evaluate("() => [...document.querySelectorAll('link[rel~=icon]')].map(l => l.href)")
        got["tables"] = v.page.evaluate(TABLES_JS)
        got["glyphs"] = v.page.evaluate(GLYPHS_JS)
        if light and width == "1280" and page in ICON_PAGES:
            got["icons"] = v.page.evaluate(ICONS_JS)
        stage("reading the page as it loaded")
        if light:
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            v.page.screenshot(path=str(SCREENSHOTS / f"{page}-{width}.png"), full_page=True)
            stage("taking the screenshot")
        _open_everything(v)
        got["contrast"] = v.page.evaluate(CONTRAST_JS, "article .cell_output, article table, article caption, "
                                          "article figcaption, article .memlab-explorer")
        v.page.keyboard.press("Tab")  # the keyboard is in use: focus() shows :focus-visible
        got["focus"] = v.page.evaluate(FOCUS_JS)
        stage("opening the folds and solutions, and focusing each control")
        if light:
            if page in FIGURE_PAGES:
                got["figures"] = v.page.evaluate(MEASURE_JS)
                got["views"] = v.page.evaluate(HIDDEN_VIEWS_JS, width == "390")
            _open_folds(v)
            got["table_code"] = [c.evaluate(CHAR_TOPS) for c in v.page.locator("article table code").all()
                                 if c.evaluate("c => c.offsetParent !== null")]
            got["paragraphs"] = {start: _paragraph(v, start, CHAR_TOPS) for p, start, _ in PARAGRAPHS if p == page}
            stage("measuring the figures, identifiers and text outputs")
        got["problems"] = list(v.problems)
    finally:
        v.close()
    return got


def _paragraph(v, start: str, char_tops: str) -> dict | None:
    """The first text output holding ``start``: its text, how far it is wider than its box (px),
    and its characters with their tops; None when no output holds it."""
    pre = v.page.locator("article .cell_output pre").filter(has_text=start.strip())
    if not pre.count():
        return None
    pre = pre.first
    return {"text": pre.inner_text(), "over": pre.evaluate("p => p.scrollWidth - p.clientWidth"),
            "chars": pre.evaluate(char_tops)}


def read_all(site_dir: Path, pages=None) -> dict[str, dict]:
    """Every page in every scheme and width: {"PAGE SCHEME WIDTH": read_page(...)}, or for a
    reading that raised {"error": its traceback}. The site is served on 127.0.0.1 by this
    process; every other address is blocked (tests.test_browser.Visit)."""
    from playwright.sync_api import sync_playwright

    from .booktools import PAGES
    from .test_browser import WIDTHS, Tabs

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site_dir)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    origin = f"http://127.0.0.1:{server.server_address[1]}"
    out = {}
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=os.environ.get("CUDA_MEMLAB_CHROMIUM", "/usr/bin/chromium"), args=["--no-sandbox"])
            tabs = Tabs(browser)   # one kept tab per scheme and width: 4 contexts for the 32 loads
            try:
                for page in pages or PAGES:
                    for scheme in SCHEMES:
                        for width in WIDTHS:
                            try:
                                out[f"{page} {scheme} {width}"] = read_page(browser, origin, page, scheme, width, tabs)
                            except Exception:  # that page's tests fail with it; the others are read
                                out[f"{page} {scheme} {width}"] = {"error": traceback.format_exc(limit=8)}
            finally:
                tabs.close()
                browser.close()
    finally:
        server.shutdown()
    return out


def main(argv: list[str]) -> int:
    site_dir, out = Path(argv[0]), Path(argv[1])
    data = read_all(site_dir)
    tmp = out.with_suffix(".part")
    tmp.write_text(json.dumps(data))
    tmp.replace(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
