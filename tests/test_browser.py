"""The built book as a reader meets it, in a real browser (Debian's chromium, driven by Playwright).

The site is served on 127.0.0.1 and every other address is blocked, so a page that needs a
CDN fails here the way it fails offline. Screenshots of every page at 1280 and 390 px go to
_build/screenshots/. `make test` installs chromium when it is missing; set
CUDA_MEMLAB_TEST_SITE=DIR to test an already built site instead of building one.
"""
from __future__ import annotations

import json
import re
import urllib.parse
from pathlib import Path

import pytest

from experiments.core import store
from experiments.core.registry import get

from .booktools import PAGES, ROOT, panel_count

pytestmark = pytest.mark.slow

SCREENSHOTS = ROOT / "_build" / "screenshots"
DESKTOP = {"width": 1280, "height": 900}
# The footer of every figure is 9 pt at the figures' 110 dpi: 13.75 px in the PNG.
# Shown at a scale s it is 13.75 * s px tall; 9 px needs s >= 0.655.
FOOTER_PX = 9 * 110 / 72
MIN_TEXT_PX = 9.0


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    import os

    chromium = Path(os.environ.get("CUDA_MEMLAB_CHROMIUM", "/usr/bin/chromium"))
    assert chromium.exists(), f"no browser at {chromium}: `make test` installs Debian's chromium (apt-get install -y chromium)"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(chromium), args=["--no-sandbox"])
        yield b
        b.close()


class Visit:
    """One page load: failed requests, bad responses and console errors, only 127.0.0.1 reachable."""

    def __init__(self, browser, origin: str, path: str, viewport: dict, touch: bool = False):
        self.context = browser.new_context(viewport=viewport, has_touch=touch, is_mobile=touch,
                                           device_scale_factor=1)
        self.problems: list[str] = []
        host = urllib.parse.urlsplit(origin).netloc

        def route(r):
            if urllib.parse.urlsplit(r.request.url).netloc == host or r.request.url.startswith("data:"):
                r.continue_()
            else:
                self.problems.append(f"request to another host: {r.request.url}")
                r.abort("internetdisconnected")

        self.context.route("**/*", route)
        self.page = self.context.new_page()
        self.page.on("requestfailed", lambda r: self.problems.append(f"failed: {r.url} ({r.failure})"))
        self.page.on("response", lambda r: r.status >= 400 and self.problems.append(f"HTTP {r.status}: {r.url}"))
        self.page.on("console", lambda m: m.type == "error" and self.problems.append(f"console: {m.text}"))
        self.page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))
        self.page.goto(f"{origin}/{path}", wait_until="load")
        self.page.wait_for_timeout(300)

    def close(self):
        self.context.close()


@pytest.fixture
def visit(browser, site):
    opened = []

    def open_page(path, viewport=DESKTOP, touch=False):
        v = Visit(browser, site["origin"], path, viewport, touch)
        opened.append(v)
        return v

    yield open_page
    for v in opened:
        v.close()


@pytest.mark.parametrize("page", PAGES)
def test_page_loads_offline_clean_and_is_screenshotted(visit, page):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    problems = []
    for name, viewport, touch in [("1280", DESKTOP, False), ("390", {"width": 390, "height": 844}, True)]:
        v = visit(f"book/{page}.html", viewport, touch)
        v.page.screenshot(path=str(SCREENSHOTS / f"{page}-{name}.png"), full_page=True)
        problems += v.problems
    assert not problems, "\n".join(problems)


def _explorer_state(page, explorer):
    """(the parameters the controls say, the parameters of the figure shown, its image source)."""
    return explorer.evaluate("""e => {
        const chosen = {};
        for (const c of e.querySelectorAll('[data-param]')) {
            if (c.type === 'radio' && !c.checked) continue;
            const values = JSON.parse(c.dataset.values || 'null');
            chosen[c.dataset.param] = c.type === 'range' ? values[+c.value] : JSON.parse(c.value);
        }
        const shown = [...e.querySelectorAll('[data-point]')].filter(v => !v.hidden && v.offsetParent !== null);
        return [chosen, shown.map(v => JSON.parse(v.dataset.point)),
                shown.map(v => (v.querySelector('img') || {}).src || v.innerHTML),
                shown.map(v => { const i = v.querySelector('img');
                                 return i ? i.naturalWidth * i.getBoundingClientRect().height : 1; })];
    }""")


@pytest.mark.parametrize("page", [p for p in PAGES if panel_count(p)])
def test_every_explorer_control_shows_that_recorded_point(visit, page):
    v = visit(f"book/{page}.html")
    explorers = v.page.locator(".memlab-explorer")
    assert explorers.count() == panel_count(page), "every ex.panel on the page must be an explorer without a kernel"
    for i in range(explorers.count()):
        ex = explorers.nth(i)
        exp = get(ex.get_attribute("data-experiment"))
        recorded = store.load(exp.id, data_schema=exp.data_schema)
        ex.scroll_into_view_if_needed()
        chosen, shown, srcs, drawn = _explorer_state(v.page, ex)
        assert len(shown) == 1, f"{exp.id}: one recorded point shown at first, not {len(shown)}"
        assert drawn[0] > 0, f"{exp.id}: the first figure is not drawn"
        names = sorted({c.get_attribute("data-param") for c in ex.locator("[data-param]").all()})
        assert names, f"{exp.id}: no labelled control"
        for name in names:
            controls = ex.locator(f"[data-param='{name}']")
            first = controls.first
            assert first.evaluate("c => !!(c.labels && c.labels.length) || !!c.getAttribute('aria-label')"), \
                f"{exp.id}.{name}: control without a label"
            kind = first.evaluate("c => c.tagName === 'SELECT' ? 'select' : c.type")
            if kind == "range":
                options = list(range(int(first.get_attribute("max")) + 1))
            elif kind == "select":
                options = first.locator("option").evaluate_all("os => os.map(o => o.value)")
            else:
                options = list(range(controls.count()))
            seen, hits = set(), 0
            for opt in options:
                if kind == "range":
                    first.focus()
                    v.page.keyboard.press("Home")
                    for _ in range(opt):
                        v.page.keyboard.press("ArrowRight")
                elif kind == "select":
                    first.select_option(opt)
                else:
                    controls.nth(opt).check()
                chosen, shown, srcs, drawn = _explorer_state(v.page, ex)
                want = exp.complete({**exp_fixed(ex), **chosen})
                # JSON in the page turns 5.0 into 5: compare values, not their text.
                point = next((p for p in recorded.points if p.params == want), None)
                if point is None:
                    assert not shown, f"{exp.id}: a figure is shown for unrecorded {chosen}"
                    assert ex.locator(".memlab-explorer-missing").is_visible(), f"{exp.id}: {chosen} says nothing"
                    continue
                assert len(shown) == 1, f"{exp.id}: {chosen} is recorded but {len(shown)} figures show"
                assert {k: shown[0][k] for k in chosen} == chosen, f"{exp.id}: controls say {chosen}, figure is {shown[0]}"
                assert drawn[0] > 0, f"{exp.id}: the figure for {chosen} is not drawn"
                seen.add(srcs[0])
                hits += 1
            assert hits < 2 or len(seen) == hits, f"{exp.id}.{name}: {hits} recorded points, {len(seen)} figures"
    assert not v.problems, "\n".join(v.problems)


MENUS = {"primary": "#pst-primary-sidebar-modal", "secondary": "#pst-secondary-sidebar-modal"}


@pytest.mark.parametrize("width", [390, 900])
@pytest.mark.parametrize("page", PAGES)
def test_both_menus_open_by_a_real_tap(visit, page, width):
    for which, dialog in MENUS.items():
        v = visit(f"book/{page}.html", {"width": width, "height": 844}, touch=True)
        if which == "secondary" and not v.page.locator("#pst-page-toc-nav a").count():
            continue  # a page without sections (the claims page) has no on-page contents
        buttons = [b for b in v.page.locator(f"button.{which}-toggle").all() if b.is_visible()]
        assert buttons, f"no visible {which} menu button at {width} px"
        box = buttons[0].bounding_box()
        v.page.touchscreen.tap(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        v.page.wait_for_timeout(400)
        opened = v.page.evaluate(f"() => !!document.querySelector('{dialog}')?.open")
        assert opened, f"a tap on the {which} menu button at {width} px opens nothing"
        links = v.page.locator(f"{dialog} a").all()
        assert any(a.is_visible() for a in links), f"the {which} menu opened empty at {width} px"


@pytest.mark.parametrize("page", PAGES)
def test_no_page_is_wider_than_a_phone(visit, page):
    v = visit(f"book/{page}.html", {"width": 390, "height": 844}, touch=True)
    width = v.page.evaluate("() => document.documentElement.scrollWidth")
    wide = v.page.evaluate("""() => [...document.querySelectorAll('article *')]
        .filter(e => e.getBoundingClientRect().right > 391 && getComputedStyle(e).position !== 'fixed')
        .filter(e => !e.closest('.memlab-scroll, .table-wrapper, .highlight, pre, .cell_output .output'))
        .slice(0, 5).map(e => e.tagName + '.' + e.className + ': ' + (e.textContent || '').slice(0, 60))""")
    assert width <= 390, f"{page} is {width} px wide on a 390 px screen: {wide}"


@pytest.mark.parametrize("page", PAGES)
def test_outputs_and_tables_fit_the_column_at_1280(visit, page):
    v = visit(f"book/{page}.html")
    over = v.page.evaluate("""() => [...document.querySelectorAll(
            'article .cell_output pre, article .cell_output table, article table, article .memlab-explorer')]
        .filter(e => e.offsetParent !== null)
        .map(e => [e.closest('.table-wrapper, .output, .memlab-explorer') || e, e])
        .filter(([box, e]) => box.scrollWidth > box.clientWidth + 1 || e.scrollWidth > e.clientWidth + 1)
        .map(([box, e]) => e.tagName + ' ' + e.scrollWidth + '>' + box.clientWidth + ': ' +
             (e.textContent || '').trim().slice(0, 70))""")
    assert not over, f"{page}: {len(over)} outputs scroll sideways at 1280 px:\n" + "\n".join(over)


@pytest.mark.parametrize("page", [p for p in PAGES if p not in ("claims", "instructors")])
def test_figure_text_is_at_least_9px_at_1280(visit, page):
    v = visit(f"book/{page}.html")
    v.page.evaluate("() => document.querySelectorAll('details').forEach(d => d.open = true)")
    v.page.evaluate("() => document.querySelectorAll('.toggle-hidden, .toggle-details__container').forEach(e => e.classList.remove('toggle-hidden'))")
    scales = v.page.evaluate("""() => [...document.querySelectorAll('article .cell_output img')]
        .filter(i => i.naturalWidth > 0 && i.offsetParent !== null)
        .map(i => [i.getBoundingClientRect().width / i.naturalWidth, i.naturalWidth, i.src.slice(-40)])""")
    assert scales, f"{page}: no figure found"
    small = [(round(s * FOOTER_PX, 1), w, src) for s, w, src in scales if s * FOOTER_PX < MIN_TEXT_PX]
    assert not small, f"{page}: figure footers below {MIN_TEXT_PX} px at 1280 px: {small}"


def test_wide_figures_enlarge_on_click(visit):
    v = visit("book/ch2_cross_stream.html", {"width": 390, "height": 844}, touch=True)
    img = next(i for i in v.page.locator("article .cell_output img").all() if i.is_visible())
    img.scroll_into_view_if_needed()
    box = img.bounding_box()
    v.page.touchscreen.tap(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    v.page.wait_for_timeout(300)
    big = v.page.evaluate("() => { const d = document.querySelector('dialog.memlab-zoom[open] img');"
                          " return d ? d.getBoundingClientRect().width : 0 }")
    assert big > box["width"], "tapping a figure on a phone does not show it larger"


def test_folds_say_what_they_hide(site):
    generic = []
    for page in PAGES:
        html = (site["dir"] / "book" / f"{page}.html").read_text()
        generic += [f"{page}: {m}" for m in re.findall(r"Show code cell (?:output|outputs|content|source)", html)]
    assert not generic, f"{len(generic)} generic folds:\n" + "\n".join(generic[:10])


def test_no_page_asks_a_cdn(site):
    asked = []
    for path in site["dir"].rglob("*.html"):
        asked += [f"{path.name}: {u}" for u in re.findall(r'<script[^>]+src="(https?://[^"]+)"', path.read_text())]
    assert not asked, "\n".join(asked)


def test_largest_page_weight_is_reasonable(site):
    """A page with its explorers' figures inline stays under 6 MB (the figures are palette PNGs)."""
    sizes = {p: (site["dir"] / "book" / f"{p}.html").stat().st_size for p in PAGES}
    biggest = max(sizes, key=sizes.get)
    print(f"largest page: {biggest}.html, {sizes[biggest] / 1e6:.2f} MB")
    assert sizes[biggest] < 6e6, sizes


def exp_fixed(explorer) -> dict:
    """The parameters a panel holds fixed (not shown as controls)."""
    return json.loads(explorer.get_attribute("data-fixed") or "{}")
