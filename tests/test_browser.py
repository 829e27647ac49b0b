"""The built book as a reader meets it, in a real browser (Debian's chromium, driven by Playwright).

The site is served on 127.0.0.1 and every other address is blocked, so a page that needs a
CDN fails here the way it fails offline. Screenshots of every page at 1280 and 390 px go to
_build/screenshots/. `make test` installs chromium when it is missing; set
CUDA_MEMLAB_TEST_SITE=DIR to test an already built site instead of building one.
Figures, explorers, alt text, page weight and figure zoom: test_browser_figures.py.
"""
from __future__ import annotations

import re
import urllib.parse

import pytest

from .booktools import PAGES, ROOT

pytestmark = pytest.mark.slow

SCREENSHOTS = ROOT / "_build" / "screenshots"
DESKTOP = {"width": 1280, "height": 900}


# After "load": the web fonts in use are ready and two frames have been drawn, so the scripts
# that run on load (the theme's, memlab.js fitting the outputs) have laid the page out.
SETTLED = """() => document.fonts.ready.then(() => new Promise(done =>
    requestAnimationFrame(() => requestAnimationFrame(() => done(true)))))"""


# Resolves once the CSS transitions and animations that a click started have ended (two frames
# first, so that those the click started are running), or after `ms` milliseconds in any case.
ANIMATIONS_ENDED = """ms => new Promise(done => requestAnimationFrame(() => requestAnimationFrame(() => {
    const t0 = performance.now();
    const poll = () => document.getAnimations().some(a => a.playState === 'running') && performance.now() - t0 < ms
        ? requestAnimationFrame(poll) : done(true);
    poll();
})))"""


def settle(page, ms: int) -> None:
    """Wait until what the last click or tap set moving has stopped, at most ``ms`` ms."""
    page.evaluate(ANIMATIONS_ENDED, ms)


class Tab:
    """A context and its page, kept for the next :class:`Visit` at the same viewport, touch and
    colour scheme (:class:`Tabs`). A new context starts a renderer process: a page loaded in a
    new context took 1.9-2.1 s of CPU on the CI machine, the same page loaded again in a kept tab
    0.8-0.9 s. Routing every request (only 127.0.0.1 reachable) turns the HTTP cache off, so a
    page loaded in a kept tab fetches everything a first visit fetches (34 responses, the same
    bytes, measured on measuring.html after intro.html).

    Between visits the tab is left on about:blank with its origin's storage and the cookies
    cleared; a tab that cannot be cleaned is closed, not kept."""

    @staticmethod
    def key_of(viewport: dict, touch: bool, scheme: str) -> tuple:
        """What a kept tab must match to serve a visit."""
        return viewport["width"], viewport["height"], touch, scheme

    def __init__(self, browser, viewport: dict, touch: bool, scheme: str):
        self.key = Tab.key_of(viewport, touch, scheme)
        self.context = browser.new_context(viewport=viewport, has_touch=touch, is_mobile=touch,
                                           device_scale_factor=1, color_scheme=scheme)
        self.visit: "Visit | None" = None   # the visit the page's events are told to
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()
        self.page.on("requestfailed", lambda r: self.visit and self.visit._failed(r))
        self.page.on("response", lambda r: self.visit and self.visit._response(r))
        self.page.on("requestfinished", lambda r: self.visit and self.visit._finished(r))
        self.page.on("console", lambda m: self.visit and m.type == "error" and self.visit.problems.append(
            f"console: {m.text}"))
        self.page.on("pageerror", lambda e: self.visit and self.visit.problems.append(f"page error: {e}"))

    def _route(self, r) -> None:
        v = self.visit
        url = r.request.url
        if url.startswith("data:") or (v is not None and urllib.parse.urlsplit(url).netloc == v.host):
            r.continue_()
        else:
            if v is not None:
                v.problems.append(f"request to another host: {url}")
            r.abort("internetdisconnected")

    def clean(self) -> bool:
        """Leave the page on about:blank with the site's storage and the cookies cleared; False if
        that failed (the tab is then not to be used again)."""
        try:
            self.page.evaluate("() => { try { localStorage.clear(); sessionStorage.clear(); } catch (e) {} }")
            self.page.goto("about:blank")
            self.context.clear_cookies()
            return True
        except Exception:  # a crashed or closed page: a new tab is made next time
            return False

    def close(self) -> None:
        self.context.close()


class Tabs:
    """The tabs a test module's (or the page readings') visits reuse, at most one per viewport,
    touch and colour scheme at a time free; one in use is never handed out twice."""

    def __init__(self, browser):
        self.browser = browser
        self.free: dict[tuple, Tab] = {}

    def take(self, viewport: dict, touch: bool, scheme: str) -> Tab:
        return self.free.pop(Tab.key_of(viewport, touch, scheme), None) or Tab(self.browser, viewport, touch, scheme)

    def give_back(self, tab: Tab) -> None:
        if tab.clean() and tab.key not in self.free:
            self.free[tab.key] = tab
        else:
            tab.close()

    def close(self) -> None:
        for tab in self.free.values():
            tab.close()
        self.free.clear()


class Visit:
    """One page load: failed requests, bad responses and console errors, only 127.0.0.1 reachable.
    In a tab of ``tabs`` when given (kept for the next visit), else in a context of its own."""

    def __init__(self, browser, origin: str, path: str, viewport: dict, touch: bool = False, scheme: str = "light",
                 sizes: bool = False, bodies: bool = False, tabs: "Tabs | None" = None):
        self.tabs = tabs
        self.tab = tabs.take(viewport, touch, scheme) if tabs is not None else Tab(browser, viewport, touch, scheme)
        self.context, self.page = self.tab.context, self.tab.page
        self.problems: list[str] = []
        self.sizes: dict[str, int] = {}  # with sizes=True: body bytes of each response (url: bytes)
        self.bodies: dict[str, int] = {}  # with bodies=True: the bytes of each response's body as read
        self.want_sizes, self.want_bodies = sizes, bodies
        self.host = urllib.parse.urlsplit(origin).netloc
        self.tab.visit = self
        self.page.goto(f"{origin}/{path}", wait_until="load")
        self.page.evaluate(SETTLED)

    def _response(self, response) -> None:
        if response.status >= 400:
            self.problems.append(f"HTTP {response.status}: {response.url}")
        if self.want_bodies:
            try:
                self.bodies[response.url] = len(response.body())
            except Exception:  # a body that never came: counted as 0, the request is still seen
                self.bodies.setdefault(response.url, 0)

    def _finished(self, request) -> None:
        if self.want_sizes:
            self.sizes[request.url] = request.sizes()["responseBodySize"]

    def _failed(self, request) -> None:
        # A lazy image whose fetch the browser itself dropped (net::ERR_ABORTED: it was scrolled
        # past, as a full-page screenshot does) did not fail to load: on a loaded machine this
        # was the only "problem" of whole runs. A missing image is an HTTP 404, seen below.
        if request.resource_type == "image" and request.failure == "net::ERR_ABORTED":
            return
        self.problems.append(f"failed: {request.url} ({request.failure})")

    def close(self):
        self.tab.visit = None
        if self.tabs is not None:
            self.tabs.give_back(self.tab)
        else:
            self.tab.close()


@pytest.fixture
def visit(browser, site, tabs):
    opened = []

    def open_page(path, viewport=DESKTOP, touch=False, scheme="light", sizes=False):
        v = Visit(browser, site["origin"], path, viewport, touch, scheme, sizes, tabs=tabs)
        opened.append(v)
        return v

    yield open_page
    for v in opened:
        v.close()


PHONE = {"width": 390, "height": 844}
WIDTHS = {"1280": (DESKTOP, False), "390": (PHONE, True)}


# At 390 px: elements of the article reaching past the screen, outside the boxes that scroll.
WIDE_ELEMENTS = """() => [...document.querySelectorAll('article *')]
    .filter(e => e.getBoundingClientRect().right > 391 && getComputedStyle(e).position !== 'fixed')
    .filter(e => !e.closest('.memlab-scroll, .table-wrapper, .highlight, pre, .cell_output .output'))
    .slice(0, 5).map(e => e.tagName + '.' + e.className + ': ' + (e.textContent || '').slice(0, 60))"""
# Outputs, tables and explorers that scroll sideways inside the column.
OVERFLOWING_OUTPUTS = """() => [...document.querySelectorAll(
        'article .cell_output pre, article .cell_output table, article table, article .memlab-explorer')]
    .filter(e => e.offsetParent !== null)
    .map(e => [e.closest('.table-wrapper, .output, .memlab-explorer') || e, e])
    .filter(([box, e]) => box.scrollWidth > box.clientWidth + 1 || e.scrollWidth > e.clientWidth + 1)
    .map(([box, e]) => e.tagName + ' ' + e.scrollWidth + '>' + box.clientWidth + ': ' +
         (e.textContent || '').trim().slice(0, 70))"""


@pytest.mark.parametrize("page", PAGES)
def test_page_loads_offline_clean_and_is_screenshotted(page_readings, page):
    problems = page_readings(page, "light", "1280")["problems"] + page_readings(page, "light", "390")["problems"]
    assert (SCREENSHOTS / f"{page}-1280.png").exists() and (SCREENSHOTS / f"{page}-390.png").exists()
    assert not problems, "\n".join(problems)


MENUS = {"primary": "#pst-primary-sidebar-modal", "secondary": "#pst-secondary-sidebar-modal"}
IS_OPEN = "d => !!document.querySelector(d)?.open"


@pytest.mark.parametrize("width", [390, 900])
@pytest.mark.parametrize("page", PAGES)
def test_both_menus_open_by_a_real_tap(visit, page, width):
    """Each menu opened by a tap on its button, one after the other on one load (the first
    closed with Escape before the second is tapped)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    v = visit(f"book/{page}.html", {"width": width, "height": 844}, touch=True)
    for which, dialog in MENUS.items():
        if which == "secondary" and not v.page.locator("#pst-page-toc-nav a").count():
            continue  # a page without sections (the claims page) has no on-page contents
        buttons = [b for b in v.page.locator(f"button.{which}-toggle").all() if b.is_visible()]
        assert buttons, f"no visible {which} menu button at {width} px"
        box = buttons[0].bounding_box()
        v.page.touchscreen.tap(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        try:
            v.page.wait_for_function(IS_OPEN, arg=dialog, timeout=3000)
        except PlaywrightTimeout:  # the assertion below says what failed
            pass
        opened = v.page.evaluate(IS_OPEN, dialog)
        assert opened, f"a tap on the {which} menu button at {width} px opens nothing"
        links = v.page.locator(f"{dialog} a").all()
        assert any(a.is_visible() for a in links), f"the {which} menu opened empty at {width} px"
        v.page.keyboard.press("Escape")
        v.page.wait_for_function(f"d => !({IS_OPEN})(d)", arg=dialog, timeout=3000)
    assert not v.problems, "\n".join(v.problems)


@pytest.mark.parametrize("width", [390, 991, 1280])
def test_a_page_opens_on_the_book_not_on_an_empty_band_or_a_second_search_box(visit, width):
    """pydata-sphinx-theme 0.17's header bar showed a 64 px band above the book from 992 px,
    holding a second search box (and nothing at 960-991 px)."""
    v = visit("book/ch2_cross_stream.html", {"width": width, "height": 900})
    band = v.page.evaluate("() => document.querySelector('header.bd-header')?.getBoundingClientRect().height || 0")
    boxes = [b for b in v.page.locator("button.search-button-field").all() if b.is_visible()]
    assert band == 0 and len(boxes) <= 1, (band, len(boxes))


@pytest.mark.parametrize("page", PAGES)
def test_no_page_is_wider_than_a_phone(page_readings, page):
    got = page_readings(page, "light", "390")
    assert got["scroll_width"] <= 390, f"{page} is {got['scroll_width']} px wide on a 390 px screen: {got['wide']}"


@pytest.mark.parametrize("page", PAGES)
def test_outputs_and_tables_fit_the_column_at_1280(page_readings, page):
    over = page_readings(page, "light", "1280")["over"]
    assert not over, f"{page}: {len(over)} outputs scroll sideways at 1280 px:\n" + "\n".join(over)


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


def test_a_kept_tab_starts_each_visit_clean(browser, site, tabs):
    """A visit in a kept tab (Tabs) meets nothing the last visit left: not its storage, cookies,
    problems or document; a visit at another width, or while the tab is in use, gets a tab of its own."""
    first = Visit(browser, site["origin"], "book/intro.html", DESKTOP, tabs=tabs)
    first.page.evaluate("""() => { localStorage.setItem('memlab-left', '1'); sessionStorage.setItem('memlab-left', '1');
        document.cookie = 'memlab-left=1; path=/'; window.memlabLeft = 1; console.error('left behind') }""")
    assert any("left behind" in p for p in first.problems)
    other = Visit(browser, site["origin"], "book/intro.html", DESKTOP, tabs=tabs)
    phone = Visit(browser, site["origin"], "book/intro.html", PHONE, True, tabs=tabs)
    assert len({first.page, other.page, phone.page}) == 3, "a tab in use was handed out again"
    page = first.page
    for v in (first, other, phone):
        v.close()
    again = Visit(browser, site["origin"], "book/measuring.html", DESKTOP, tabs=tabs)
    try:
        assert again.page is page, "the kept tab was not used again"
        left = again.page.evaluate("""() => [localStorage.getItem('memlab-left'), sessionStorage.getItem('memlab-left'),
            document.cookie.includes('memlab-left'), 'memlabLeft' in window]""")
        assert left == [None, None, False, False], left
        assert not again.problems, again.problems
    finally:
        again.close()
