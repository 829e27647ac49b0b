"""Figures and explorers as a reader meets them (issue 19), in Debian's chromium at 1280 and 390 px.

- Every figure's smallest text, as displayed, is at least 9 CSS px: font_pt * dpi / 72 *
  (displayed width / natural width), with each variant's smallest font and DPI read from
  the data attributes the build writes (``experiments.core.explorer.figure_html``); on a
  phone the browser must have chosen the narrow variant.
- No text of any figure covers another (the build measures every variant of every figure
  as drawn: ``experiments.core.plotting.text_collisions``).
- Every explorer: every control offers a choice, and every combination a reader can reach
  with the controls shows its recorded figure (the whole reachable graph is walked).
- Alt text names each figure's titles and parameters.
- Page weight: a cold first load of every page is at most 3 MB, the largest HTML at most
  1 MB, and an explorer's hidden views are not fetched until shown.
- An enlarged figure fits the screen; the theme's icons all render after the trimming.
"""
from __future__ import annotations

import html
import json
import re

import pytest

from experiments.core import store
from experiments.core.registry import get

from .booktools import PAGES, panel_count
from .test_browser import DESKTOP, visit  # noqa: F401  (fixtures)

pytestmark = pytest.mark.slow

PHONE = {"width": 390, "height": 844}
WIDTHS = {"1280": (DESKTOP, False), "390": (PHONE, True)}
MIN_TEXT_PX = 9.0
FIGURE_PAGES = [p for p in PAGES if p not in ("claims", "instructors")]

# For every figure image on the page: the variant the browser shows and the displayed size of
# its smallest text. Images are scrolled to and awaited first (they load lazily).
MEASURE_JS = """async () => {
    document.querySelectorAll('details').forEach(d => d.open = true);
    document.querySelectorAll('.toggle-hidden').forEach(e => e.classList.remove('toggle-hidden'));
    const imgs = [...document.querySelectorAll('article .cell_output img')].filter(i => i.offsetParent !== null);
    const out = [];
    for (const i of imgs) {
        i.scrollIntoView();
        if (!(i.complete && i.naturalWidth)) {
            await new Promise(res => { i.addEventListener('load', res, {once: true});
                                       i.addEventListener('error', res, {once: true}); setTimeout(res, 5000); });
        }
        let variant = i;
        const pic = i.closest('picture');
        if (pic) for (const s of pic.querySelectorAll('source'))
            if (s.srcset && new URL(s.srcset, location.href).href === i.currentSrc) variant = s;
        const shown = i.getBoundingClientRect().width;
        const pt = parseFloat(variant.dataset.fontPt), dpi = parseFloat(variant.dataset.dpi);
        out.push({src: i.currentSrc.split('/').pop(), variant: variant.tagName, pt: pt, dpi: dpi,
                  natural: i.naturalWidth, shown: shown, sources: pic ? pic.querySelectorAll('source').length : 0,
                  px: pt * dpi / 72 * shown / i.naturalWidth});
    }
    return out;
}"""

# Every view of every explorer, shown or not: the size its smallest text would show at in the
# explorer's column (an image is drawn at its natural width, at most the column's).
HIDDEN_VIEWS_JS = """(phone) => [...document.querySelectorAll('.memlab-view')].map(v => {
    const box = v.closest('.memlab-explorer-views').getBoundingClientRect().width;
    const variant = phone ? v.querySelector('source') : v.querySelector('img');
    const natural = parseFloat(variant.getAttribute('width'));
    const pt = parseFloat(variant.dataset.fontPt), dpi = parseFloat(variant.dataset.dpi);
    return {point: v.dataset.point, px: pt * dpi / 72 * Math.min(natural, box) / natural, box: box};
})"""


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("page", FIGURE_PAGES)
def test_figure_text_is_at_least_9px_as_displayed(page_readings, page, width):
    got = page_readings(page, "light", width)
    figures = got["figures"]
    assert figures, f"{page}: no figure found"
    not_measured = [f["src"] for f in figures if not f["pt"] == f["pt"] or not f["natural"]]
    assert not not_measured, f"{page} at {width} px: figures without font data or not loaded: {not_measured}"
    if width == "390":
        wide = [f["src"] for f in figures if f["sources"] and f["variant"] != "SOURCE"]
        assert not wide, f"{page}: the phone shows the default figure, not the narrow one: {wide}"
    small = [(round(f["px"], 1), f["pt"], f["dpi"], f["natural"], round(f["shown"]), f["src"])
             for f in figures if f["px"] < MIN_TEXT_PX]
    print(f"{page} at {width} px: {len(figures)} figures shown, smallest text "
          f"{min(f['px'] for f in figures):.1f} px")
    assert not small, f"{page} at {width} px: text under {MIN_TEXT_PX} px (px, pt, dpi, natural, shown): {small}"
    views = got["views"]
    small = [(round(x["px"], 1), x["point"]) for x in views if not x["px"] >= MIN_TEXT_PX]
    assert not small, f"{page} at {width} px: explorer views whose text would show under {MIN_TEXT_PX} px: {small}"
    assert not got["problems"], "\n".join(got["problems"])


def _figures_in(page_html: str) -> list[str]:
    return re.findall(r'<picture class="memlab-figure">.*?</picture>', page_html, re.S)


@pytest.mark.parametrize("page", FIGURE_PAGES)
def test_every_figure_has_both_variants_and_no_text_covered(site, page):
    text = (site["dir"] / "book" / f"{page}.html").read_text()
    figures = _figures_in(text)
    assert figures, f"{page}: no figure drawn by figure_html"
    loose = [m for m in re.findall(r"<img [^>]*>", text) if "memlab" not in m and "logo" not in m
             and "data-font-pt" not in m]
    assert not loose, f"{page}: images that are not book figures with measured fonts: {loose[:3]}"
    problems = []
    for fig in figures:
        assert "<source " in fig, f"{page}: a figure without a narrow variant: {fig[:300]}"
        for tag in re.findall(r"<(?:source|img) [^>]*>", fig):
            hit = json.loads(html.unescape(re.search(r'data-collisions="([^"]*)"', tag).group(1)))
            pt = float(re.search(r'data-font-pt="([^"]*)"', tag).group(1))
            alt = re.search(r'alt="([^"]*)"', fig)
            what = html.unescape(alt.group(1))[:90] if alt else "?"
            if hit:
                problems.append(f"{what}: {hit}")
            if pt < 8:
                problems.append(f"{what}: {pt} pt text")
    assert not problems, f"{page}: {len(problems)} figure variants with covered text:\n" + "\n".join(problems[:20])


@pytest.mark.parametrize("page", FIGURE_PAGES)
def test_every_figure_has_alt_text_naming_what_it_shows(site, page):
    text = (site["dir"] / "book" / f"{page}.html").read_text()
    images = [m for m in re.findall(r"<img [^>]*>", text) if "logo" not in m]
    assert images, f"{page}: no figure"
    bad = []
    for tag in images:
        alt = html.unescape((re.search(r'alt="([^"]*)"', tag) or re.search("()", "")).group(1))
        if not alt.startswith("Figure") or len(alt) < 30 or re.search(r"\.png|_images|data:", alt):
            bad.append(alt or "(empty)")
    # explorer views: the alt text names each control's value
    for point, body in re.findall(r'<figure class="memlab-view" data-point="([^"]*)"[^>]*>(.*?)</figure>', text, re.S):
        alt = html.unescape(re.search(r'<img [^>]*alt="([^"]*)"', body).group(1))
        for name in json.loads(html.unescape(point)):
            if f"{name} = " not in alt:
                bad.append(f"{alt} (no {name})")
    assert not bad, f"{page}: {len(bad)} figures whose alt text does not say what they show: {bad[:5]}"


# Walks the graph of combinations the controls reach, from the first one shown: for each
# reached combination, every option of every control, set as a reader sets it (the control's
# own input and change events). Returns the combinations reached and what went wrong.
WALK_JS = """async (explorer) => {
    const form = explorer.querySelector('form');
    const groups = {};
    for (const el of explorer.querySelectorAll('[data-param]')) (groups[el.dataset.param] ||= []).push(el);
    const ctrls = Object.entries(groups).map(([name, els]) => {
        const first = els[0];
        const kind = first.type === 'range' ? 'range' : first.tagName === 'SELECT' ? 'select' : 'radio';
        const n = kind === 'range' ? +first.max + 1 : kind === 'select' ? first.options.length : els.length;
        return {name, els, kind, n};
    });
    const index = c => c.kind === 'range' ? +c.els[0].value : c.kind === 'select' ? c.els[0].selectedIndex
                                                        : c.els.findIndex(r => r.checked);
    const value = c => c.kind === 'range' ? JSON.parse(c.els[0].dataset.values)[+c.els[0].value]
                                          : JSON.parse(c.kind === 'select' ? c.els[0].value : c.els[index(c)].value);
    const setIndex = (c, i, events) => {
        const el = c.kind === 'radio' ? c.els[i] : c.els[0];
        if (c.kind === 'range') el.value = String(i); else if (c.kind === 'select') el.selectedIndex = i;
        else el.checked = true;
        if (events) for (const t of ['input', 'change']) el.dispatchEvent(new Event(t, {bubbles: true}));
    };
    const snapshot = () => {
        const chosen = {};
        for (const c of ctrls) chosen[c.name] = value(c);
        const shown = [...explorer.querySelectorAll('.memlab-view')].filter(v => !v.hidden);
        return {key: JSON.stringify(ctrls.map(index)), idx: ctrls.map(index), chosen,
                shown: shown.map(v => JSON.parse(v.dataset.point)),
                loaded: shown.every(v => [...v.querySelectorAll('img')].every(i => i.getAttribute('src') &&
                                                                            !i.dataset.src)),
                missing: !explorer.querySelector('.memlab-explorer-missing').hidden,
                status: (explorer.querySelector('.memlab-explorer-status') || {}).textContent || ''};
    };
    const restore = idx => {  // no control event: the form's own change shows that point as it is
        ctrls.forEach((c, k) => setIndex(c, idx[k], false));
        form.dispatchEvent(new Event('change'));
    };
    const problems = [], seen = new Map();
    const start = snapshot();
    const queue = [start];
    seen.set(start.key, start);
    const check = (s, how) => {
        if (s.missing) problems.push(`${how}: 'not recorded'`);
        if (s.shown.length !== 1) problems.push(`${how}: ${s.shown.length} figures shown`);
        else if (ctrls.some(c => JSON.stringify(s.shown[0][c.name]) !== JSON.stringify(s.chosen[c.name])))
            problems.push(`${how}: controls say ${JSON.stringify(s.chosen)}, figure is ${JSON.stringify(s.shown[0])}`);
        if (!s.loaded) problems.push(`${how}: the figure's image is not loading`);
    };
    check(start, 'at first');
    let actions = 0;
    while (queue.length) {
        const s = queue.shift();
        for (const [k, c] of ctrls.entries()) {
            for (let i = 0; i < c.n; i++) {
                if (i === s.idx[k]) continue;
                restore(s.idx);
                setIndex(c, i, true);
                actions += 1;
                const t = snapshot();
                const how = `from ${JSON.stringify(s.chosen)}, ${c.name} -> option ${i}`;
                check(t, how);
                if (t.idx[k] !== i) problems.push(`${how}: the control did not keep the reader's choice`);
                const movedOthers = t.idx.some((x, m) => m !== k && x !== s.idx[m]);
                if (movedOthers && !t.status.includes(c.name)) problems.push(`${how}: others moved without a word`);
                if (!seen.has(t.key)) { seen.set(t.key, t); queue.push(t); }
            }
        }
    }
    restore(start.idx);
    return {controls: ctrls.map(c => [c.name, c.n]), reached: [...seen.values()].map(s => s.shown[0] || null),
            actions, problems, views: explorer.querySelectorAll('.memlab-view').length};
}"""


def _open_solutions(v) -> None:
    """Every solution opened with a click, as a reader opens it: explorer views that answer an
    exercise show their figures only after that (issue 26; test_browser_readers.py checks before)."""
    v.page.evaluate("() => document.querySelectorAll('.solution .toggle-button[aria-expanded=false]')"
                    ".forEach(b => b.click())")
    v.page.wait_for_timeout(100)


@pytest.mark.parametrize("page", [p for p in PAGES if panel_count(p)])
def test_every_reachable_explorer_combination_shows_its_recorded_figure(visit, page):
    v = visit(f"book/{page}.html")
    _open_solutions(v)
    explorers = v.page.locator(".memlab-explorer")
    assert explorers.count() == panel_count(page), "every ex.panel on the page must be an explorer without a kernel"
    total = 0
    for i in range(explorers.count()):
        ex = explorers.nth(i)
        exp = get(ex.get_attribute("data-experiment"))
        walk = ex.evaluate(WALK_JS)
        one = [name for name, n in walk["controls"] if n < 2]
        assert not one, f"{exp.id}: controls without a choice: {one}"
        assert not walk["problems"], f"{exp.id}: " + "\n".join(walk["problems"][:10])
        # every recorded view can be reached, and what is reached was recorded
        recorded = store.load(exp.id, data_schema=exp.data_schema)
        fixed = json.loads(ex.get_attribute("data-fixed") or "{}")
        for point in walk["reached"]:  # JSON in the page turns 5.0 into 5: compare values, not text
            want = exp.complete({**fixed, **point})
            assert any(p.params == want for p in recorded.points), f"{exp.id}: {point} not recorded"
        assert len(walk["reached"]) == walk["views"], f"{exp.id}: {walk['views']} views, {len(walk['reached'])} reached"
        total += len(walk["reached"])
        print(f"{page}: {exp.id}: controls {walk['controls']}, {len(walk['reached'])} combinations reached "
              f"in {walk['actions']} changes")
    print(f"{page}: {total} explorer combinations walked")
    assert not v.problems, "\n".join(v.problems)


def _shown(explorer):
    return explorer.evaluate("""e => [...e.querySelectorAll('.memlab-view')].filter(v => !v.hidden).map(v => [
        JSON.parse(v.dataset.point), (v.querySelector('img') || {}).currentSrc || '',
        (v.querySelector('img') || {}).naturalWidth || 0])""")


@pytest.mark.parametrize("page", [p for p in PAGES if panel_count(p)])
def test_each_explorer_control_operated_for_real_shows_its_figure(visit, page):
    """The keyboard on sliders, select_option on menus, clicks on radio buttons: each option of
    each control shows the figure its controls name, loaded, and different options different figures."""
    v = visit(f"book/{page}.html")
    _open_solutions(v)
    explorers = v.page.locator(".memlab-explorer")
    for i in range(explorers.count()):
        ex = explorers.nth(i)
        exp_id = ex.get_attribute("data-experiment")
        ex.scroll_into_view_if_needed()
        for name in list(dict.fromkeys(c.get_attribute("data-param") for c in ex.locator("[data-param]").all())):
            controls = ex.locator(f"[data-param='{name}']")
            first = controls.first
            assert first.evaluate("c => !!(c.labels && c.labels.length) || !!c.closest('fieldset')"), \
                f"{exp_id}.{name}: control without a label"
            kind = first.evaluate("c => c.tagName === 'SELECT' ? 'select' : c.type")
            count = (int(first.get_attribute("max")) + 1 if kind == "range" else
                     first.locator("option").count() if kind == "select" else controls.count())
            srcs = set()
            for opt in range(count):
                if kind == "range":
                    first.focus()
                    v.page.keyboard.press("Home")
                    for _ in range(opt):
                        v.page.keyboard.press("ArrowRight")
                elif kind == "select":
                    first.select_option(index=opt)
                else:
                    controls.nth(opt).check()
                v.page.wait_for_function("e => [...e.querySelectorAll('.memlab-view')].filter(v => !v.hidden)"
                                         ".every(v => [...v.querySelectorAll('img')].every(i => i.complete && "
                                         "i.naturalWidth > 0))", arg=ex.element_handle(), timeout=10000)
                shown = _shown(ex)
                assert len(shown) == 1, f"{exp_id}.{name} option {opt}: {len(shown)} figures shown"
                srcs.add(shown[0][1])
            assert len(srcs) == count, f"{exp_id}.{name}: {count} options, {len(srcs)} different figures"
    assert not v.problems, "\n".join(v.problems)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("page", PAGES)
def test_first_load_is_light_and_hidden_views_wait(page_readings, page, width):
    first = page_readings(page, "light", width)["first_load"]
    sizes, url = first["bodies"], f"book/{page}.html"
    total = sum(sizes.values())
    print(f"{page} at {width} px: first load {total / 1e6:.2f} MB, HTML {sizes.get(url, 0) / 1e6:.2f} MB")
    assert total <= 3e6, f"{page} at {width} px: first load {total / 1e6:.2f} MB: " + ", ".join(
        f"{u.rsplit('/', 1)[-1][:30]} {b / 1e3:.0f} kB" for u, b in sorted(sizes.items(), key=lambda kv: -kv[1])[:5])
    assert sizes.get(url, 0) <= 1e6, f"{page}.html is {sizes.get(url, 0) / 1e6:.2f} MB"
    fetched = [u for u in first["hidden"] if u in sizes]
    assert not fetched, f"{page}: hidden explorer views fetched at load: {fetched[:3]}"


@pytest.mark.parametrize("width", WIDTHS)
def test_an_enlarged_figure_fits_the_screen(visit, width):
    viewport, touch = WIDTHS[width]
    opened = 0
    for page in ("ch2_cross_stream", "ch4_hidden_syncs"):
        v = visit(f"book/{page}.html", viewport, touch)
        v.page.evaluate(MEASURE_JS)  # every figure scrolled to and loaded
        for img in v.page.locator("article .cell_output img.memlab-zoomable").all():
            if not img.is_visible():
                continue
            img.scroll_into_view_if_needed()
            box = img.bounding_box()
            if touch:
                v.page.touchscreen.tap(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
            else:
                img.click()
            big = v.page.evaluate("""() => { const i = document.querySelector('dialog.memlab-zoom[open] img');
                return i ? [i.getBoundingClientRect().toJSON(), i.naturalWidth] : null }""")
            assert big, f"{page}: a zoomable figure did not open"
            r = big[0]
            assert r["width"] > 1.15 * box["width"], f"{page}: enlarged {r['width']:.0f} px from {box['width']:.0f} px"
            assert r["left"] >= 0 and r["top"] >= 0 and r["right"] <= viewport["width"] and \
                r["bottom"] <= viewport["height"], f"{page}: the enlarged figure leaves the screen: {r}"
            v.page.mouse.click(r["left"] + 5, r["top"] + 5)  # a click or tap on it closes it
            assert v.page.evaluate("() => !document.querySelector('dialog.memlab-zoom[open]')"), \
                f"{page}: the enlarged figure does not close on a click"
            opened += 1
            if opened >= 3:
                break
        assert not v.problems, "\n".join(v.problems)
    if width == "1280":
        assert opened, "no figure on the desktop can be enlarged"


# The icons the theme draws with Font Awesome's JavaScript (i.fa-* turned into svg), read once
# the page has loaded and the network gone idle (tests/page_readings.py).
ICON_PAGES = ("intro", "ch4_hidden_syncs")
ICONS_JS = """() => ({left: [...document.querySelectorAll('i[class*="fa-"], span[class*="fa-"]')].map(e => e.className),
    svgs: [...document.querySelectorAll('svg.svg-inline--fa')]
        .map(s => [s.getAttribute('data-icon'), !!s.querySelector('.missing')])})"""


@pytest.mark.parametrize("page", ICON_PAGES)
def test_every_theme_icon_renders_after_the_trimming(page_readings, page):
    got = page_readings(page, "light", "1280")
    left, svgs = got["icons"]["left"], got["icons"]["svgs"]
    assert svgs and not left, f"{page}: icons not drawn: {left}"
    missing = sorted({name for name, gone in svgs if gone})
    assert not missing, f"{page}: Font Awesome drew its 'missing icon' sign for {missing}"
    assert not got["problems"], "\n".join(got["problems"])
