"""Readers with other habits (issue 26), in Debian's chromium at 390 and 1280 px, in the light and
the dark colour scheme (pydata-sphinx-theme follows the system's).

- Contrast: every text in the outputs (tables, explorers, captions, checks, notes) is at least
  4.5:1 against what is drawn behind it (3:1 for large text), WCAG 2.x AA, in both schemes.
- Tables: each output table fits its column (made compact or stacked on a phone) or says that
  it scrolls, and no word in a table breaks across lines.
- Keyboard: every control shows a focus ring of at least 3:1 against the page; Escape closes an
  enlarged figure.
- Answers: an explorer view that is an exercise's answer shows no figure until the exercise's
  solution or answer is opened; search result snippets quote no solution; a notebook page's
  ".ipynb" download is the notebook Colab opens.
- A favicon on every page; no Font Awesome webfont fetched but a subset of the glyphs the CSS
  draws.

Each page is loaded once per scheme and width for the measurements that need no interaction
(the ``page_readings`` fixture: tests/page_readings.py). The doctor page's own items are in
test_browser_doctor_page.py.
"""
from __future__ import annotations

import json
import re
import urllib.parse

import pytest

from .booktools import PAGES, ROOT
from .test_browser_figures import MEASURE_JS
from .test_browser import WIDTHS, settle, visit  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow

SCHEMES = ("light", "dark")
AA, AA_LARGE, NON_TEXT = 4.5, 3.0, 3.0

# WCAG 2.x colour helpers, shared by the measurements below (defined once per page).
COLOR_JS = """
window.__memlabColor = window.__memlabColor || (() => {
    const parse = (s) => {
        const m = String(s).match(/rgba?\\(([^)]+)\\)/);
        if (!m) return [0, 0, 0, 0];
        const p = m[1].split(/[ ,\\/]+/).filter(Boolean).map(parseFloat);
        return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
    };
    const over = (top, below) => {
        const a = top[3] + below[3] * (1 - top[3]);
        if (!a) return [0, 0, 0, 0];
        return [0, 1, 2].map(i => (top[i] * top[3] + below[i] * below[3] * (1 - top[3])) / a).concat([a]);
    };
    const lum = (c) => {
        const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
        return 0.2126 * f(c[0]) + 0.7152 * f(c[1]) + 0.0722 * f(c[2]);
    };
    const ratio = (a, b) => { const x = lum(a), y = lum(b); return (Math.max(x, y) + 0.05) / (Math.min(x, y) + 0.05); };
    // what is drawn behind an element: its own and its ancestors' background colours, composited
    const behind = (el) => {
        const layers = [];
        for (let e = el; e && e.nodeType === 1; e = e.parentElement) {
            const bg = parse(getComputedStyle(e).backgroundColor);
            if (bg[3] > 0) layers.push(bg);
            if (bg[3] >= 1) break;
        }
        let c = [255, 255, 255, 1];
        for (let i = layers.length - 1; i >= 0; i--) c = over(layers[i], c);
        return c;
    };
    const opacity = (el) => {
        let o = 1;
        for (let e = el; e && e.nodeType === 1; e = e.parentElement) o *= parseFloat(getComputedStyle(e).opacity);
        return o;
    };
    return {parse, over, ratio, behind, opacity};
})();
"""

# Every visible text under the selectors, with its contrast against what is behind it.
CONTRAST_JS = COLOR_JS + """
(scopes) => {
    const {parse, over, ratio, behind, opacity} = window.__memlabColor;
    const out = [], seen = new Set();
    for (const root of document.querySelectorAll(scopes)) {
        const w = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
        let n;
        while ((n = w.nextNode())) {
            const el = n.parentElement;
            if (!n.data.trim() || !el || seen.has(el)) continue;
            seen.add(el);
            // SVG text, hidden text, and disabled controls (WCAG 1.4.3 exempts them)
            if (el.closest('svg, script, style, [hidden], .visually-hidden, .sr-only, :disabled')) continue;
            const r = document.createRange(); r.selectNodeContents(n);
            const box = r.getBoundingClientRect();
            const cs = getComputedStyle(el);
            if (!box.width || !box.height || cs.visibility !== 'visible') continue;
            const bg = behind(el);
            const fg0 = parse(cs.color);
            const fg = over([fg0[0], fg0[1], fg0[2], fg0[3] * opacity(el)], bg);
            const px = parseFloat(cs.fontSize), bold = parseInt(cs.fontWeight) >= 700;
            out.push({text: n.data.trim().slice(0, 40), ratio: Math.round(ratio(fg, bg) * 100) / 100,
                      need: (px >= 24 || (bold && px >= 18.66)) ? 3 : 4.5,
                      where: el.tagName.toLowerCase() + '.' + String(el.className || '').slice(0, 40),
                      fg: cs.color, bg: 'rgb(' + bg.slice(0, 3).map(Math.round).join(',') + ')'});
        }
    }
    return out;
}"""

# Output tables: does each fit its box (or say that it scrolls), and does a word break across lines?
TABLES_JS = """() => {
    const out = [];
    const r = document.createRange();
    for (const t of document.querySelectorAll('article .cell_output table, article table.table')) {
        if (!t.offsetParent) continue;
        const box = t.closest('.output, .pst-scrollable-table-container, .table-wrapper, .cell_output') || t.parentElement;
        const width = Math.max(t.getBoundingClientRect().width, t.scrollWidth);
        const fits = width <= box.clientWidth + 1 && box.scrollWidth <= box.clientWidth + 1;
        const cue = !!(t.previousElementSibling && t.previousElementSibling.classList.contains('memlab-scroll-cue'));
        const broken = [];
        for (const cell of t.querySelectorAll('td, th')) {
            const w = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
            const chars = [];
            let n;
            while ((n = w.nextNode())) for (let i = 0; i < n.length; i++) {
                r.setStart(n, i); r.setEnd(n, i + 1);
                const b = r.getClientRects();
                chars.push([n.data[i], b.length && b[0].width > 0 ? Math.round(b[0].top) : null]);
            }
            let last = null;
            for (let i = 0; i < chars.length; i++) {
                if (chars[i][1] === null) continue;
                if (last !== null && chars[i][1] > chars[last][1] + 2 && /[A-Za-z0-9]/.test(chars[last][0]) && /[A-Za-z0-9]/.test(chars[i][0])
                    && i === last + 1) {
                    const text = chars.map(c => c[0]).join('');
                    broken.push(text.slice(0, last + 1) + '|' + text.slice(last + 1));
                }
                last = i;
            }
        }
        out.push({head: (t.querySelector('th') || {textContent: ''}).textContent.trim().slice(0, 30),
                  visible: Math.round(100 * Math.min(1, box.clientWidth / width)), fits, cue, broken,
                  mode: t.classList.contains('memlab-stacked') ? 'stacked' : t.classList.contains('memlab-compact') ? 'compact' : ''});
    }
    return out;
}"""

# Each visible control focused as the keyboard focuses it: does a ring appear, with 3:1 against the page?
FOCUS_JS = COLOR_JS + """
() => {
    const {parse, ratio, behind, opacity} = window.__memlabColor;
    const sel = 'a[href], button, input, select, textarea, summary, [tabindex]:not([tabindex="-1"])';
    const rings = (e) => {
        const cs = getComputedStyle(e);
        const out = [];
        if (cs.outlineStyle !== 'none' && parseFloat(cs.outlineWidth) >= 2) out.push([parse(cs.outlineColor), 'outline ' + cs.outlineWidth]);
        for (const m of cs.boxShadow.matchAll(/(rgba?\\([^)]*\\))\\s+(-?[\\d.]+)px\\s+(-?[\\d.]+)px\\s+([\\d.]+)px\\s+([\\d.]+)px(\\s+inset)?/g)) {
            if (parseFloat(m[5]) >= 2) out.push([parse(m[1]), 'shadow ' + m[5] + 'px' + (m[6] ? ' inset' : '')]);
        }
        return out;
    };
    const out = [];
    for (const e of document.querySelectorAll(sel)) {
        if (e.disabled || e.closest('dialog:not([open]), [hidden], .toggle-hidden')) continue;
        const rect = e.getBoundingClientRect();
        if (!rect.width || !rect.height || getComputedStyle(e).visibility !== 'visible' || opacity(e) < 0.1) continue;
        if (e.closest('details:not([open])') && e.tagName !== 'SUMMARY') continue;
        e.blur();
        const before = rings(e).map(r => r[1] + String(r[0]));
        e.focus();
        if (document.activeElement !== e) continue;
        const bg = behind(e.parentElement || e);
        const shown = rings(e).filter(r => !before.includes(r[1] + String(r[0])))
                              .map(r => ({how: r[1], ratio: ratio(r[0][3] < 1 ? [0, 1, 2].map(i => r[0][i] * r[0][3] + bg[i] * (1 - r[0][3])) : r[0], bg)}));
        const best = shown.reduce((a, b) => (a && a.ratio >= b.ratio ? a : b), null);
        out.push({what: e.tagName + '.' + String(e.className || '').slice(0, 40) + ' ' +
                        (e.getAttribute('aria-label') || e.textContent || '').trim().slice(0, 30),
                  ring: best ? best.how : null, ratio: best ? Math.round(best.ratio * 100) / 100 : 0});
        e.blur();
    }
    return out;
}"""


def _open_everything(v) -> None:
    """Every fold and solution opened as a reader opens them (a click), so that what they hide
    is measured too."""
    v.page.evaluate("""() => {
        document.querySelectorAll('article details:not([open]) > summary').forEach(s => s.click());
        document.querySelectorAll('article .solution .toggle-button[aria-expanded=false]').forEach(b => b.click());
    }""")
    settle(v.page, 700)


# The glyphs the page's CSS draws with Font Awesome's font (in pseudo-elements).
GLYPHS_JS = """() => { const out = new Set();
    for (const e of document.querySelectorAll('*')) for (const p of ['::before', '::after']) {
        const cs = getComputedStyle(e, p);
        if (/Awesome/.test(cs.fontFamily) && cs.content && cs.content !== 'none' && cs.display !== 'none')
            for (const ch of cs.content.replace(/^"|"$/g, '')) if (ch.codePointAt(0) >= 0xe000) out.add(ch.codePointAt(0));
    } return [...out]; }"""


COMBOS = [(s, w) for s in SCHEMES for w in WIDTHS]


@pytest.mark.parametrize("scheme,width", COMBOS)
def test_every_output_text_passes_wcag_aa_in_both_schemes(page_readings, scheme, width):
    """Issue 26: in the dark scheme the sticky first column of every output table was dark on
    black (1.26:1) and explorer captions 1.71:1."""
    problems, measured = [], 0
    for page in PAGES:
        texts = page_readings(page, scheme, width)["contrast"]
        measured += len(texts)
        low = {}
        for t in texts:
            if t["ratio"] < t["need"]:
                low.setdefault((t["where"], t["fg"], t["bg"], t["ratio"]), []).append(t["text"])
        problems += [f"{page}: {n} {len(texts_)}x {texts_[:2]}" for n, texts_ in low.items()]
    print(f"{scheme} {width} px: {measured} texts measured")
    assert measured > 1000, measured
    assert not problems, f"{len(problems)} kinds of text under AA ({scheme}, {width} px):\n" + "\n".join(problems[:25])


@pytest.mark.parametrize("scheme,width", COMBOS)
def test_output_tables_fit_or_say_they_scroll_and_no_word_breaks(page_readings, scheme, width):
    """Issue 26: at 390 px, 25 output tables and the instructors' table showed 51-95 % of
    their width, cut mid-word, with no cue that they scroll."""
    problems, count, modes = [], 0, {}
    for page in PAGES:
        for t in page_readings(page, scheme, width)["tables"]:
            count += 1
            modes[t["mode"] or "as is"] = modes.get(t["mode"] or "as is", 0) + 1
            if not t["fits"] and not t["cue"]:
                problems.append(f"{page}: '{t['head']}' shows {t['visible']} % of its width, with no cue that it scrolls")
            if t["broken"]:
                problems.append(f"{page}: '{t['head']}' breaks words: {t['broken'][:3]}")
    print(f"{scheme} {width} px: {count} tables: {modes}")
    assert count >= 25
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("scheme,width", COMBOS)
def test_every_control_shows_a_focus_ring(page_readings, scheme, width):
    """Issue 26: the header buttons (launch, download, full screen, the menus), the solutions'
    toggles and the skip link showed no ring, or one of 1:1 against the page."""
    problems, count = [], 0
    for page in PAGES:
        for f in page_readings(page, scheme, width)["focus"]:
            count += 1
            if f["ring"] is None or f["ratio"] < NON_TEXT:
                problems.append(f"{page}: {f['what']}: " + ("no ring" if f["ring"] is None else
                                                          f"{f['ring']} at {f['ratio']}:1"))
    print(f"{scheme} {width} px: {count} controls focused")
    assert count > 100
    uniq = sorted(set(p.split(": ", 1)[1] for p in problems))
    assert not problems, f"{len(problems)} controls without a visible ring, {len(uniq)} kinds:\n" + "\n".join(uniq[:20])


@pytest.mark.parametrize("scheme,width", [("light", "1280"), ("dark", "390")])
def test_a_favicon_and_only_the_icon_glyphs_used(page_readings, site, scheme, width):
    """Issue 26: no favicon (a 404 on every page) and Font Awesome's webfonts (275 kB) fetched
    on every page."""
    from fontTools.ttLib import TTFont

    problems = []
    for page in PAGES:
        got = page_readings(page, scheme, width)
        if not got["favicon"]:
            problems.append(f"{page}: no <link rel=icon>")
        for href in got["favicon"]:
            path = site["dir"] / urllib.parse.unquote(urllib.parse.urlsplit(href).path).lstrip("/")
            if not path.is_file() or path.stat().st_size == 0:
                problems.append(f"{page}: the favicon {href} is not in the site")
        heavy = {u.rsplit("/", 1)[-1]: b for u, b in got["fonts"].items() if b > 10_000}
        if heavy:
            problems.append(f"{page}: webfonts of {sum(heavy.values()) / 1e3:.0f} kB: {heavy}")
        for url in got["fonts"]:
            path = site["dir"] / urllib.parse.unquote(urllib.parse.urlsplit(url).path).lstrip("/")
            cmap = TTFont(str(path)).getBestCmap()
            missing = [hex(c) for c in got["glyphs"] if c not in cmap]
            if missing:
                problems.append(f"{page}: glyphs the CSS draws but the font lacks: {missing}")
        if got["glyphs"] and not got["fonts"]:
            problems.append(f"{page}: the CSS draws {len(got['glyphs'])} glyphs but no font came")
        print(f"{page}: fonts {sum(got['fonts'].values()) / 1e3:.1f} kB for {len(got['glyphs'])} glyphs")
        problems += [f"{page}: {p}" for p in got["problems"]]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("scheme,width", [("light", "1280"), ("dark", "1280")])
def test_escape_closes_an_enlarged_figure(visit, scheme, width):
    """Issue 26: the zoom's label says to press Escape, and sphinx_highlight.js took the key.
    (At 390 px no figure opens larger: the narrow variants already fill the screen.)"""
    viewport, touch = WIDTHS[width]
    v = visit("book/ch4_hidden_syncs.html", viewport, touch, scheme)
    v.page.evaluate(MEASURE_JS)  # every figure scrolled to and loaded
    imgs = [i for i in v.page.locator("article .cell_output img.memlab-zoomable").all() if i.is_visible()][:2]
    assert imgs, "no figure can be enlarged on this page"
    for img in imgs:
        img.focus()
        v.page.keyboard.press("Enter")
        assert v.page.evaluate("() => !!document.querySelector('dialog.memlab-zoom[open]')"), "Enter did not enlarge it"
        v.page.keyboard.press("Escape")
        v.page.wait_for_timeout(100)
        assert v.page.evaluate("() => !document.querySelector('dialog.memlab-zoom[open]')"), \
            "Escape did not close the enlarged figure"
    assert not v.problems, "\n".join(v.problems)


# ----------------------------------------------------------------------------- answers

def _answer_specs() -> dict[str, list[tuple[str, list[dict]]]]:
    """{page: [(exercise label, explorer points that answer it)]} from book/src's cell metadata."""
    import jupytext

    out = {}
    for src in sorted((ROOT / "book" / "src").glob("*.py")):
        for c in jupytext.read(src).cells:
            meta = c.metadata.get("memlab", {})
            if meta.get("reveals") and meta.get("points"):
                out.setdefault(src.stem, []).append((meta["reveals"], meta["points"]))
    return out


# Every view of an explorer, its controls set to the view's point as a reader leaves them (the
# form's own change; every view is reachable with the controls: test_browser_figures.py), with
# what it then shows: a figure (loaded or loading) or a note.
REACH_JS = """async (explorer) => {
    const form = explorer.querySelector('form');
    const groups = {};
    for (const el of explorer.querySelectorAll('[data-param]')) (groups[el.dataset.param] ||= []).push(el);
    const setTo = (name, value) => {
        const els = groups[name];
        if (!els) return;
        const want = JSON.stringify(value);
        if (els[0].type === 'range') {
            const i = JSON.parse(els[0].dataset.values).findIndex(v => JSON.stringify(v) === want);
            els[0].value = String(i);
        } else if (els[0].tagName === 'SELECT') {
            els[0].selectedIndex = [...els[0].options].findIndex(o => JSON.stringify(JSON.parse(o.value)) === want);
        } else {
            els.forEach(r => { r.checked = JSON.stringify(JSON.parse(r.value)) === want; });
        }
    };
    const out = [];
    for (const view of explorer.querySelectorAll('.memlab-view')) {
        const point = JSON.parse(view.dataset.point);
        for (const [k, v] of Object.entries(point)) setTo(k, v);
        form.dispatchEvent(new Event('change'));
        const shown = [...explorer.querySelectorAll('.memlab-view')].filter(v => !v.hidden)[0];
        if (!shown) { out.push({point: view.dataset.point, shown: null}); continue; }
        const imgs = [...shown.querySelectorAll('img')];
        out.push({point: view.dataset.point, shown: shown.dataset.point, answer: shown.dataset.answerTo || null,
                  drawn: imgs.some(i => i.getAttribute('src') && i.offsetParent !== null),
                  note: !!shown.querySelector('.memlab-answer-note')});
    }
    return out;
}"""


def _matches(point: dict, specs: list[dict]) -> bool:
    return any(all(point.get(k) == v for k, v in s.items()) for s in specs)


@pytest.mark.parametrize("scheme,width", [("light", "1280"), ("dark", "390")])
def test_no_explorer_shows_an_exercise_answer_before_its_solution_is_opened(visit, scheme, width):
    """Issue 26: exercise 1.1's answer was one slider move away in the explorer above it (and the
    text asked for that move); exercise 2.3's was the first view of the explorer above it."""
    specs = _answer_specs()
    assert {"ch1_caching_allocator", "ch2_cross_stream"} <= set(specs)
    viewport, touch = WIDTHS[width]
    for page, marked in specs.items():
        v = visit(f"book/{page}.html", viewport, touch, scheme)
        for label, points in marked:
            explorers = [e for e in v.page.locator(".memlab-explorer").all()
                         if any(_matches(json.loads(p), points) for p in
                                e.evaluate("e => [...e.querySelectorAll('.memlab-view')].map(v => v.dataset.point)"))]
            assert explorers, f"{page}: no explorer holds the answer points {points} of {label}"
            for ex in explorers:
                before = ex.evaluate(REACH_JS)
                assert all(s["shown"] == s["point"] for s in before), [s for s in before if s["shown"] != s["point"]][:3]
                answers = [s for s in before if _matches(json.loads(s["point"]), points)]
                assert answers, f"{page}: the answer views of {label} cannot be reached"
                shown = [s["point"] for s in answers if s["drawn"] or not s["note"]]
                assert not shown, f"{page}: {label}'s answer is shown before its solution is opened: {shown}"
                assert all(s["drawn"] for s in before if not _matches(json.loads(s["point"]), points)), \
                    f"{page}: views that are no answer are not drawn"
            # the reader opens the solution: the answer views show their figures
            sol = v.page.locator(f".solution:has(a[href='#{label}'])").first
            title = sol.locator(":scope > .admonition-title")
            title.scroll_into_view_if_needed()
            title.click()
            v.page.wait_for_timeout(200)
            for ex in explorers:
                after = ex.evaluate(REACH_JS)
                hidden = [s["point"] for s in after if _matches(json.loads(s["point"]), points) and not s["drawn"]]
                assert not hidden, f"{page}: {label}'s solution is open and these views still show no figure: {hidden}"
        assert not v.problems, "\n".join(v.problems)


def _solution_text(page: str) -> str:
    """The words of the page's solutions (from book/src), lower case, one space apart."""
    text = (ROOT / "book" / "src" / f"{page}.py").read_text()
    words = []
    for fence, block in re.findall(r"^# (`{3,}|:{3,})\{solution\}.*?\n(.*?)^# \1", text, re.M | re.S):
        body = " ".join(line[2:] for line in block.splitlines() if line.startswith("# ") and not line.startswith("# :"))
        words += re.findall(r"[a-z0-9]+", body.lower())
    return " " + " ".join(words) + " "


@pytest.mark.parametrize("scheme,width", [("dark", "1280"), ("light", "390")])
def test_search_snippets_quote_no_solution(visit, scheme, width):
    """Issue 26: search result snippets quoted solutions (sphinx's searchtools.js makes them
    from the whole page)."""
    viewport, touch = WIDTHS[width]
    # words that appear on their page in a solution only
    queries = {"roomy": "ch1_caching_allocator", "alternate": "ch3_pinned_memory"}
    for query, page in queries.items():
        v = visit(f"search.html?q={query}", viewport, touch, scheme)
        v.page.wait_for_function("() => document.querySelectorAll('#search-results li').length > 0 && "
                                 "[...document.querySelectorAll('#search-results li')].every(l => l.querySelector('p.context'))"
                                 " || /did not match/.test(document.body.innerText)", timeout=20000)
        results = v.page.evaluate("""() => [...document.querySelectorAll('#search-results li')].map(l => [
            l.querySelector('a').getAttribute('href'), (l.querySelector('p.context') || {}).textContent || ''])""")
        solutions = _solution_text(page)
        assert f" {query} " in solutions
        leaked = []
        for href, snippet in results:
            words = re.findall(r"[a-z0-9]+", snippet.lower())
            runs = {" ".join(words[i:i + 6]) for i in range(len(words) - 5)}
            leaked += [f"{href}: ...{r}..." for r in runs if f" {r} " in solutions]
        print(f"search {query!r}: {len(results)} results")
        assert not leaked, f"snippets for {query!r} quote solutions:\n" + "\n".join(leaked[:5])
        assert not v.problems, "\n".join(v.problems)


def test_the_notebook_download_is_the_notebook_colab_opens(site):
    """Issue 26: the page's ".ipynb" download was raw MyST with solutions open as text."""
    import nbformat

    checked = 0
    for page in PAGES:
        text = (site["dir"] / "book" / f"{page}.html").read_text()
        own = re.findall(r'href="([^"]*_sources/[^"]+)"', text)
        if not (ROOT / "book" / f"{page}.ipynb").exists():
            continue  # a page written in MyST (instructors): its source holds no solution
        ipynb = [h for h in own if h.endswith(".ipynb")]
        assert ipynb, f"{page}: a download without the notebook: {own}"
        assert not [h for h in own if h.endswith(".md")], f"{page}: the page's MyST source (solutions as text) is offered"
        path = (site["dir"] / "book" / ipynb[0]).resolve()
        colab = ROOT / "book" / f"{page}.ipynb"
        assert path.read_bytes() == colab.read_bytes(), f"{page}: the .ipynb download is not the Colab notebook"
        nb = nbformat.reads(path.read_text(), as_version=4)
        mds = " ".join(c.source for c in nb.cells if c.cell_type == "markdown")
        assert "{solution}" not in mds and "{exercise}" not in mds
        checked += 1
    assert checked >= 6, checked


def _luminance(rgb) -> float:
    def f(v):
        v /= 255
        return v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4
    return 0.2126 * f(rgb[0]) + 0.7152 * f(rgb[1]) + 0.0722 * f(rgb[2])


@pytest.mark.parametrize("width", list(WIDTHS))
def test_figures_are_readable_on_a_dark_page(visit, width, tmp_path):
    """Each figure, as the dark page draws it (the theme dims images), keeps a light background of
    its own and text of at least 4.5:1 on it: its darkest pixels (the text) against its
    commonest (the background)."""
    from PIL import Image

    viewport, touch = WIDTHS[width]
    measured, problems = 0, []
    for page in ("ch1_caching_allocator", "ch4_hidden_syncs"):
        v = visit(f"book/{page}.html", viewport, touch, "dark")
        v.page.evaluate(MEASURE_JS)
        # every image loaded first: a lazy one loading above the one shot moved it out of the
        # shot's clip (a dark strip of page measured as the figure, under load 10)
        v.page.evaluate("""() => Promise.all([...document.querySelectorAll('article img')].map(i => i.complete ? null :
            new Promise(r => { i.onload = i.onerror = r; i.loading = 'eager'; })))""")
        for k, img in enumerate([i for i in v.page.locator("article .cell_output img").all() if i.is_visible()][:6]):
            img.scroll_into_view_if_needed()
            v.page.wait_for_timeout(300)
            shot = tmp_path / f"{page}-{k}.png"
            # the viewport clipped to the image where it is now: an element screenshot scrolled
            # the page again and, under load, caught the page beside the figure
            v.page.screenshot(path=str(shot), clip=img.bounding_box())
            im = Image.open(shot).convert("RGB")
            colors = sorted(im.getcolors(im.width * im.height), reverse=True)
            background = colors[0][1]
            lums = sorted(_luminance(c) for n, c in colors for _ in range(min(n, 50)))
            text = lums[max(0, len(lums) // 200)]   # the darkest half percent: the text's strokes
            ratio = (_luminance(background) + 0.05) / (text + 0.05)
            measured += 1
            if _luminance(background) < 0.5 or ratio < AA:
                problems.append(f"{page} figure {k}: background {background}, text contrast {ratio:.1f}:1")
        assert not v.problems, "\n".join(v.problems)
    assert measured >= 6 and not problems, problems
