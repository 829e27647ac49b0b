"""Reading the built book in a real browser, at 1280 and 390 px (issue #19): solutions open
where readers tap, the phone's drawers close when a link is chosen, text outputs are wrapped
once, and identifiers in tables never break mid-word.

Uses the browser and page fixtures of tests/test_browser.py (Debian's chromium, only
127.0.0.1 reachable). CUDA_MEMLAB_TEST_SITE=DIR tests an already built site.
"""
from __future__ import annotations

import pytest

from .booktools import PAGES
from .test_browser import DESKTOP, browser, visit  # noqa: F401  (fixtures)

pytestmark = pytest.mark.slow

PHONE = {"width": 390, "height": 844}
WIDTHS = {"1280": (DESKTOP, False), "390": (PHONE, True)}


# A solution is open when something besides its title is drawn.
IS_OPEN = ("s => [...s.children].some(c => !c.classList.contains('admonition-title')"
           " && c.offsetParent !== null && c.getBoundingClientRect().height > 0)")


def _solution_pages(site) -> list[str]:
    return [p for p in PAGES if 'class="solution' in (site["dir"] / "book" / f"{p}.html").read_text()]


def _tap_or_click(v, touch: bool, x: float, y: float) -> None:
    if touch:
        v.page.touchscreen.tap(x, y)
    else:
        v.page.mouse.click(x, y)
    v.page.wait_for_timeout(150)


@pytest.mark.parametrize("width", list(WIDTHS))
def test_every_solution_opens_on_a_tap_at_its_title_centre(visit, site, width):
    viewport, touch = WIDTHS[width]
    problems, count = [], 0
    for page in _solution_pages(site):
        v = visit(f"book/{page}.html", viewport, touch)
        solutions = v.page.locator(".solution.dropdown")
        for i in range(solutions.count()):
            sol = solutions.nth(i)
            title = sol.locator(":scope > .admonition-title")
            name = f"{page}: {title.inner_text().strip()[:60]}"
            title.scroll_into_view_if_needed()
            v.page.wait_for_timeout(50)
            box = title.bounding_box()
            y0 = v.page.evaluate("() => window.scrollY")
            assert not sol.evaluate(IS_OPEN), f"{name}: open before the tap"
            _tap_or_click(v, touch, box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
            count += 1
            opened = sol.evaluate(IS_OPEN)
            moved = abs(v.page.evaluate("() => window.scrollY") - y0)
            if not opened:
                problems.append(f"{name}: a tap at the title's centre did not open it")
            if moved > 5:
                problems.append(f"{name}: the tap scrolled the page by {moved:.0f} px")
            if opened:
                back = sol.locator(".memlab-solution-back a[href^='#']")
                if not back.count() or not back.first.is_visible():
                    problems.append(f"{name}: no visible link back to the exercise inside the open solution")
                else:
                    target = back.first.get_attribute("href")[1:]
                    if not v.page.evaluate("id => !!document.getElementById(id)", target):
                        problems.append(f"{name}: its link back points to a missing #{target}")
        problems += [f"{page}: {p}" for p in v.problems]
    assert count >= 20, f"only {count} solutions found"
    assert not problems, f"{count} solutions at {width} px, {len(problems)} problems:\n" + "\n".join(problems)


@pytest.mark.parametrize("page", [p for p in PAGES if p not in ("claims",)])
def test_contents_drawer_closes_when_a_section_is_chosen(visit, page):
    v = visit(f"book/{page}.html", PHONE, touch=True)
    if not v.page.locator("#pst-page-toc-nav a").count():
        pytest.skip(f"{page} has no on-page contents")
    button = next(b for b in v.page.locator("button.secondary-toggle").all() if b.is_visible())
    box = button.bounding_box()
    v.page.touchscreen.tap(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    v.page.wait_for_timeout(400)
    dialog = "#pst-secondary-sidebar-modal"
    assert v.page.evaluate(f"() => document.querySelector('{dialog}').open"), "the Contents drawer did not open"
    links = [a for a in v.page.locator(f"{dialog} a[href^='#']").all() if a.is_visible()]
    assert links, "the Contents drawer has no section link"
    link = links[len(links) // 2]
    target = link.get_attribute("href")[1:]
    box = link.bounding_box()
    v.page.touchscreen.tap(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    v.page.wait_for_timeout(600)
    assert not v.page.evaluate(f"() => document.querySelector('{dialog}').open"), \
        f"the Contents drawer stays open over the page after choosing #{target}"
    top = v.page.evaluate("id => document.getElementById(id).getBoundingClientRect().top", target)
    assert -5 <= top < PHONE["height"] / 2, f"the page did not go to #{target} (its top is at {top:.0f} px)"
    assert v.page.evaluate("() => location.hash") == f"#{target}"
    assert not v.problems, "\n".join(v.problems)


def test_navigation_drawer_closes_when_a_page_is_chosen(visit):
    v = visit("book/ch2_cross_stream.html", PHONE, touch=True)
    button = next(b for b in v.page.locator("button.primary-toggle").all() if b.is_visible())
    box = button.bounding_box()
    v.page.touchscreen.tap(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    v.page.wait_for_timeout(400)
    dialog = "#pst-primary-sidebar-modal"
    assert v.page.evaluate(f"() => document.querySelector('{dialog}').open")
    link = next(a for a in v.page.locator(f"{dialog} a[href*='ch3_pinned_memory']").all() if a.is_visible())
    box = link.bounding_box()
    with v.page.expect_navigation():
        v.page.touchscreen.tap(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    v.page.wait_for_timeout(300)
    assert v.page.url.split("#")[0].endswith("ch3_pinned_memory.html")
    assert not v.page.evaluate(f"() => !!document.querySelector('{dialog}')?.open")
    assert not v.problems, "\n".join(v.problems)
