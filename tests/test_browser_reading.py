"""Reading the built book in a real browser, at 1280 and 390 px (issue #19): solutions open
where readers tap, the phone's drawers close when a link is chosen, text outputs are wrapped
once, and identifiers in tables never break mid-word.

Uses the browser and page fixtures of tests/test_browser.py (Debian's chromium, only
127.0.0.1 reachable). CUDA_MEMLAB_TEST_SITE=DIR tests an already built site.
"""
from __future__ import annotations

import re

import pytest

from .booktools import PAGES
from .test_browser import PHONE, WIDTHS, settle, visit  # noqa: F401  (fixtures)

pytestmark = pytest.mark.slow


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
    settle(v.page, 150)


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


# Per character of an element's text: [the character, the top of its box (px) or null].
CHAR_TOPS = """el => {
    const out = [], r = document.createRange(), w = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
    let n;
    while ((n = w.nextNode())) {
        for (let i = 0; i < n.length; i++) {
            r.setStart(n, i); r.setEnd(n, i + 1);
            const b = r.getClientRects();
            out.push([n.data[i], b.length && b[0].width > 0 ? Math.round(b[0].top) : null]);
        }
    }
    return out;
}"""


def _open_folds(v) -> None:
    v.page.evaluate("() => document.querySelectorAll('details').forEach(d => d.open = true)")
    v.page.evaluate("() => document.querySelectorAll('.toggle-hidden').forEach(e => e.classList.remove('toggle-hidden'))")
    v.page.wait_for_timeout(100)


def _breaks(chars) -> list[int]:
    """Indices i where the browser started a new line after character i (not at a '\\n')."""
    out, last = [], None
    for i, (c, top) in enumerate(chars):
        if c == "\n" or top is None:
            continue
        if last is not None and top > chars[last][1] + 2 and "\n" not in "".join(ch for ch, _ in chars[last:i]):
            out.append(last)
        last = i
    return out


@pytest.mark.parametrize("width", list(WIDTHS))
@pytest.mark.parametrize("page", PAGES)
def test_identifiers_in_tables_never_break_mid_word(page_readings, page, width):
    broken = []
    for chars in page_readings(page, "light", width)["table_code"]:  # each visible code in a table, folds open
        text = "".join(c for c, _ in chars)
        for i in _breaks(chars):
            a, b = chars[i][0], chars[i + 1][0] if i + 1 < len(chars) else " "
            if a.isalnum() and b.isalnum():
                broken.append(f"{text[:i + 1]}|{text[i + 1:]}")
    assert not broken, f"{page} at {width} px: identifiers broken mid-word in tables:\n" + "\n".join(broken[:20])


# Text outputs that are paragraphs (issue #19 found each wrapped twice): (page, the start of
# the paragraph, whether it is prose that ends a sentence). Each must be one line in the
# page, wrapped by the browser alone.
PARAGRAPHS = [
    ("ch1_caching_allocator", "CUDA out of memory.", True),
    ("ch1_caching_allocator", "'expandable_segments': set", False),
    ("ch1_caching_allocator", "'max_split_size_mb:64': set", False),
    ("ch3_pinned_memory", "Capturing a copy from pageable memory raised:", True),
    ("ch3_pinned_memory", "  [yes] empty the pinned host cache", False),
    ("ch4_hidden_syncs", "Time per step:", True),
    ("ch4_hidden_syncs", "Before the sync the GPU has", True),
    ("ch4_hidden_syncs", "The sync detector needs a CUDA GPU", True),
]


@pytest.mark.parametrize("width", list(WIDTHS))
def test_text_outputs_are_wrapped_once(page_readings, width):
    """Each paragraph is one line of the output, and the browser wraps it inside the column:
    wrapped once. Text that Python had wrapped at 88 columns came out ragged, the browser
    wrapping each of its lines again."""
    problems = []
    for page in sorted({p for p, *_ in PARAGRAPHS}):
        got = page_readings(page, "light", width)
        for _, start, sentence in [x for x in PARAGRAPHS if x[0] == page]:
            pre = got["paragraphs"][start]  # the first output holding it, folds open
            if pre is None:
                problems.append(f"{page}: no output starts a line with {start!r}")
                continue
            text = pre["text"]
            lines = text.split("\n")
            k = next((i for i, line in enumerate(lines) if line.startswith(start)), None)
            if k is None:
                problems.append(f"{page}: {start!r} does not start a line of its output")
                continue
            nxt = lines[k + 1] if k + 1 < len(lines) else ""
            if sentence and not re.search(r"[.:;!?)]$", lines[k].rstrip()):
                problems.append(f"{page}: the paragraph {start!r} stops mid-sentence: ...{lines[k][-40:]!r}")
            elif re.match(r"^[a-z(]", nxt) or (nxt.startswith(" ") and not nxt.startswith("  [")):
                problems.append(f"{page}: the paragraph {start!r} goes on in a second line: {nxt[:50]!r}")
            over = pre["over"]
            if over > 1:
                problems.append(f"{page}: the output of {start!r} is {over} px wider than its box")
            rows = len({top for c, top in pre["chars"] if top is not None})
            if rows < len([line for line in lines if line.strip()]):
                problems.append(f"{page}: {start!r}: fewer rows than lines")
        problems += [f"{page}: {p}" for p in got["problems"]]
    assert not problems, f"at {width} px:\n" + "\n".join(problems)
