"""The page "Check your own snapshot" as readers with other habits meet it (issue 26), in Debian's
chromium: ranges wherever the doctor has one, the page's own words, a true download size, one
unit per figure, readable at 390 and 1280 px in both colour schemes, what it does without
the network once loaded, the first answer before the grid (which fills in after and can be
stopped), and what the doctor's answer rests on (the GPU's memory, which the reader can give;
its notes; what-ifs that stop part-way).

One tab (``doctor_run``) loads the page, has a file dropped while the network is off, then one
online (Python loads) and one offline again; the tests read what it showed, and switch its
width and colour scheme in place (pydata-sphinx-theme follows the system's scheme as it
changes), so that Pyodide loads once per worker. The doctor's own answers are checked against
the command line in test_doctor_page.py.
"""
from __future__ import annotations

import gzip
import json
import os
import re
import time
from pathlib import Path

import pytest

from experiments.core.units import format_bytes

from .test_browser_readers import CONTRAST_JS
from .test_doctor_page import LONG_TRACE, SCREENSHOTS, Tab, _set_what_ifs, _unless_overloaded, cli

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
CASES = ROOT / "benchmarks" / "data" / "doctor_cases"
# record_stream hand-overs whose what-ifs the snapshot cannot settle: ranges in every table
RANGED = CASES / "kv_two_streams.pickle.gz"
OTHER = CASES / "handoff.pickle.gz"
# a data loader under a cap whose max_split_size_mb:128 what-if peaks at 2.09 GiB, the others at
# 0.63 GiB: the figure's axis counts GiB in steps under 1 GiB (it was in MiB beside a legend in GiB)
MIXED_UNITS = CASES / "loader_capped.pickle.gz"
TICKED = ["expandable_segments:True", "max_split_size_mb:128"]
COMBOS = [("light", 1280), ("dark", 1280), ("light", 390), ("dark", 390)]
FIRST_ANSWER_S = 5.0   # the first answer on the 451k-event trace, Python loaded (issue 26: 17-26 s)

# Every change of the page's state, with the time since the call: [ms, state, grid rows so far,
# first result shown, settings table shown], in window.__memlabLog.
LOG_JS = """() => { const r = document.getElementById('memlab-doctor'), t0 = performance.now();
    window.__memlabLog = [];
    if (window.__memlabObserver) window.__memlabObserver.disconnect();
    window.__memlabObserver = new MutationObserver(() => window.__memlabLog.push([Math.round(performance.now() - t0),
        r.dataset.state || '', +(r.dataset.gridRows || 0), !!r.dataset.firstResultSeconds,
        !!document.querySelector('.memlab-doctor-results:not([hidden]) .memlab-doctor-table')]));
    window.__memlabObserver.observe(r, {attributes: true}); }"""


def _wait(tab, timeout_s: float = 300) -> dict:
    tab.page.wait_for_selector("#memlab-doctor[data-state=done], .memlab-doctor-error:not([hidden])",
                               timeout=timeout_s * 1000)
    err = tab.page.locator(".memlab-doctor-error")
    return {**tab.page.locator("#memlab-doctor").evaluate("e => ({...e.dataset})"),
            "error": err.inner_text() if err.is_visible() else None}


def _drop(tab, path: Path) -> dict:
    tab.page.locator("#memlab-doctor").evaluate("e => { delete e.dataset.state; delete e.dataset.firstResultSeconds }")
    tab.page.set_input_files("#memlab-doctor-file", str(path))
    return _wait(tab)


FIGURE_TEXT_JS = """() => ({
    ticks: [...document.querySelectorAll('.memlab-doctor-figure svg text.memlab-doctor-tick')].map(t => t.textContent),
    legend: [...document.querySelectorAll('.memlab-doctor-figure li')].map(l => l.textContent)})"""


@pytest.fixture(scope="module")
def doctor_run(browser, site):
    """The page after three drops: offline (before Python ever loaded), online (Python loads; a
    data loader whose what-ifs peak at 0.63 and 2.09 GiB, its figure read at 1280 and 390 px),
    offline again (Python loaded in the tab; record_stream hand-overs with ranges). Yields (tab, {what it showed})."""
    tab = Tab(browser, site["origin"])
    seen = {}
    try:
        _set_what_ifs(tab.page, TICKED, [])
        tab.context.set_offline(True)
        seen["offline_first"] = _drop(tab, OTHER)
        tab.context.set_offline(False)
        tab.page.locator("#memlab-doctor").evaluate("e => { delete e.dataset.state }")
        tab.page.evaluate(LOG_JS)
        tab.page.set_input_files("#memlab-doctor-file", str(MIXED_UNITS))
        t0 = time.perf_counter()
        status = ""
        while time.perf_counter() - t0 < 10 and "MB" not in status:
            status = tab.page.evaluate("() => document.querySelector('.memlab-doctor-status-text').textContent")
            tab.page.wait_for_timeout(50)
        seen["status"] = status
        seen["online"] = _wait(tab)
        seen["log"] = tab.page.evaluate("() => window.__memlabLog")
        seen["online_json"] = tab.page.locator(".memlab-doctor-results").get_attribute("data-json")
        seen["sections"] = tab.page.evaluate("""() => [...document.querySelectorAll('.memlab-doctor-results > section')]
            .map(s => s.className + ':' + (s.dataset.key || ''))""")
        seen["figure"] = {}
        for width in (1280, 390):
            _show(tab, "light", width)
            seen["figure"][width] = tab.page.evaluate(FIGURE_TEXT_JS)
        _show(tab, "light", 1280)
        tab.context.set_offline(True)
        seen["offline_loaded"] = _drop(tab, RANGED)
        tab.context.set_offline(False)
        seen["json"] = json.loads(tab.page.locator(".memlab-doctor-results").get_attribute("data-json") or "null")
        yield tab, seen
    finally:
        tab.close()


# The element's box [x, y, width, height] in each of 30 consecutive frames.
BOXES_JS = """sel => new Promise(done => {
    const out = [];
    const sample = () => {
        const r = document.querySelector(sel).getBoundingClientRect();
        out.push([r.x, r.y, r.width, r.height].map(Math.round));
        out.length < 30 ? requestAnimationFrame(sample) : done(out);
    };
    requestAnimationFrame(sample);
})"""


def _still(page, selector: str) -> list[str]:
    """A problem if ``selector``'s box moves or resizes again and again over 30 frames (a page
    that jitters); one change is a late redraw after the resize, not a problem. Screenshots
    are then taken of the page's area, which does not wait for the element to be still (an
    element screenshot timed out once waiting for it at 390 px on a loaded machine; not
    reproduced in 5 runs, 3 of them beside 4 spinning processes)."""
    boxes = page.evaluate(BOXES_JS, selector)
    changes = sum(a != b for a, b in zip(boxes, boxes[1:]))
    return [] if changes <= 1 else [f"{selector} does not stay still: its box changed {changes} times in 30 frames: {boxes[:4]}"]


def _show(tab, scheme: str, width: int) -> None:
    tab.page.emulate_media(color_scheme=scheme)
    tab.page.set_viewport_size({"width": width, "height": 900})
    tab.page.wait_for_timeout(400)   # the page redraws its figures 150 ms after a resize


def test_without_the_network_the_page_says_what_it_needs_and_once_loaded_works_offline(doctor_run):
    """Issue 26: with the network lost after the page loaded, a 1.8 MB file got "the tab may
    have run out of memory"."""
    tab, seen = doctor_run
    first = seen["offline_first"]["error"] or ""
    assert "run out of memory" not in first and "network" in first and "online" in first, first
    assert seen["online"]["error"] is None, seen["online"]["error"]
    assert seen["offline_loaded"]["error"] is None, f"offline, with Python loaded: {seen['offline_loaded']['error']}"
    assert seen["json"]["trace_events"] > 0
    assert not tab.outside, tab.outside


def test_the_download_size_the_page_states_is_what_the_site_stores(doctor_run, site):
    """Issue 26: the page said "about 13 MB", which is 20 MB where the host does not compress
    .wasm (it is the gzip'd size)."""
    tab, seen = doctor_run
    files = [f for d in (*site["dir"].glob("_static/pyodide-*"), site["dir"] / "_static" / "doctor") for f in d.iterdir()]
    stored = sum(f.stat().st_size for f in files)
    packed = sum(min(f.stat().st_size, len(gzip.compress(f.read_bytes(), 6))) for f in files)
    m = re.search(r"about (\d+) MB", seen["status"])
    assert m, f"the progress does not say what it downloads: {seen['status']!r}"
    print(f"the page says {m.group(0)}; the site stores {stored / 1e6:.1f} MB ({packed / 1e6:.1f} MB gzip'd)")
    assert abs(int(m.group(1)) - stored / 1e6) <= 1, (m.group(0), stored)
    got = tab.page.evaluate("() => window.memlabDoctor.downloadBytes")
    assert abs(got - stored) <= 200, (got, stored)   # the lock file (about 120 bytes) aside


def _ranged(x: dict, name: str):
    key = "oom_events_range" if name == "oom_events" else name.replace("_bytes", "_range_bytes")
    rng = x.get(key)
    return rng if x.get("exact") is False and rng and rng[0] != rng[1] else None


def _sizes(text: str) -> list[int]:
    """The sizes written in a cell, in bytes (format_bytes's forms: '1.02 GiB', '512 KiB', '3 B')."""
    scale = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
    return [float(v) * scale[u] for v, u in re.findall(r"([\d.]+) (GiB|MiB|KiB|B)\b", text.replace(",", ""))]


def test_every_table_shows_the_range_where_the_doctor_has_one(doctor_run):
    """Issue 26: the suggestion table showed one figure where the doctor has a range (21 cells on
    two real snapshots), disagreeing with the report below it and the command line."""
    tab, seen = doctor_run
    _show(tab, "light", 1280)
    doc = seen["json"]
    cells = tab.page.evaluate("""() => [...document.querySelectorAll('.memlab-doctor-results table')].map(t =>
        [...t.querySelectorAll('tbody tr')].map(r => [...r.children].map(c => c.textContent.trim())))""")
    settings, suggestion = cells[1], cells[0]   # the suggestion comes first on the page
    expected, problems = 0, []
    for row, x in zip(settings[1:], doc["what_if"]):
        for col, name in ((1, "peak_reserved_bytes"), (3, "final_reserved_bytes")):
            rng = _ranged(x, name)
            if rng:
                expected += 1
                got = _sizes(row[col])
                if " to " not in row[col] or len(got) != 2 or any(abs(a - b) > 0.0011 * max(b, 1) for a, b in zip(got, rng)):
                    problems.append(f"{x['settings']} {name}: {row[col]!r}, the doctor says {format_bytes(rng[0])} "
                                    f"to {format_bytes(rng[1])}")
    for row, x in zip(suggestion, doc["suggestion"]["rows"][:10]):
        for col, name in ((1, "peak_reserved_bytes"), (2, "final_reserved_bytes"), (3, "oom_events")):
            rng = _ranged(x, name)
            if rng:
                expected += 1
                if " to " not in row[col]:
                    problems.append(f"suggestion {x['settings'] or 'defaults'} {name}: {row[col]!r}, the doctor says {rng}")
        if x.get("exact") is False and x["saved_range_bytes"][0] != x["saved_range_bytes"][1]:
            expected += 1
            if " to " not in row[4]:
                problems.append(f"suggestion {x['settings'] or 'defaults'} peak vs yours: {row[4]!r}, the doctor says "
                                f"{x['saved_range_bytes']}")
    legend = tab.page.evaluate("() => [...document.querySelectorAll('.memlab-doctor-figure li')].map(l => l.textContent)")
    for text, x in zip(legend[1:], doc["what_if"]):
        if _ranged(x, "peak_reserved_bytes"):
            expected += 1
            if " to " not in text:
                problems.append(f"legend: {text!r} shows one peak where the doctor has a range")
    note = tab.page.locator(".memlab-doctor-uncertain")
    print(f"{expected} figures with a range on {RANGED.name}")
    assert expected >= 15, expected
    assert not problems, f"{len(problems)} of {expected} ranges shown as one figure:\n" + "\n".join(problems)
    assert note.count() >= 1 and "not exact" in note.first.inner_text()


def test_the_figure_uses_one_unit_on_its_axis_and_in_its_legend(doctor_run):
    """Issue 26: the timeline's axis was in MiB beside a legend in GiB (a run above 1 GiB)."""
    tab, seen = doctor_run
    shown = dict(seen["figure"])
    for scheme, width in COMBOS:   # and the record_stream hand-overs, below 1 GiB
        _show(tab, scheme, width)
        shown[(scheme, width)] = tab.page.evaluate(FIGURE_TEXT_JS)
    for key, fig in shown.items():
        units = {u for t in fig["ticks"] for u in re.findall(r"\b(GiB|MiB|KiB)\b", t)}
        legend_units = {u for t in fig["legend"] for u in re.findall(r"\b(GiB|MiB|KiB)\b", t.split(" peak ", 1)[-1])}
        assert len(units) == 1 and legend_units == units, (key, fig)
    assert {u for t in seen["figure"][1280]["ticks"] for u in re.findall(r"GiB", t)}, "the loader's what-if peaks above 1 GiB"


# Per character of the settings written as code: broken across lines between two letters or digits?
BROKEN_JS = """() => {
    const out = [], r = document.createRange();
    for (const code of document.querySelectorAll('.memlab-doctor code')) {
        if (!code.offsetParent) continue;
        const w = document.createTreeWalker(code, NodeFilter.SHOW_TEXT);
        const chars = [];
        let n;
        while ((n = w.nextNode())) for (let i = 0; i < n.length; i++) {
            r.setStart(n, i); r.setEnd(n, i + 1);
            const b = r.getClientRects();
            chars.push([n.data[i], b.length && b[0].width > 0 ? Math.round(b[0].top) : null]);
        }
        for (let i = 1; i < chars.length; i++) {
            if (chars[i][1] !== null && chars[i - 1][1] !== null && chars[i][1] > chars[i - 1][1] + 2 &&
                /[A-Za-z0-9]/.test(chars[i - 1][0]) && /[A-Za-z0-9]/.test(chars[i][0])) {
                const t = chars.map(c => c[0]).join('');
                out.push(t.slice(0, i) + '|' + t.slice(i));
            }
        }
    }
    return out;
}"""

SVG_LABELS_JS = """() => [...document.querySelectorAll('.memlab-doctor-svg text.memlab-doctor-blocklabel')].map(t => {
    const rect = t.previousElementSibling;
    return [getComputedStyle(t).fill, rect ? rect.getAttribute('fill') : null, t.textContent];
})"""


@pytest.mark.parametrize("scheme,width", COMBOS)
def test_the_result_is_readable_in_both_schemes_at_390_and_1280(doctor_run, scheme, width):
    """Issue 26: at 390 px the report was 28 % visible and setting names broke mid-word; the
    texts of the page and its figures pass WCAG AA in both schemes."""
    tab, _ = doctor_run
    _show(tab, scheme, width)
    page = tab.page
    wide = page.evaluate(f"""() => [...document.querySelectorAll('article *')]
        .filter(e => e.getBoundingClientRect().right > {width} + 1 && getComputedStyle(e).position !== 'fixed')
        .filter(e => !e.closest('.memlab-scroll, .highlight, pre'))
        .slice(0, 5).map(e => e.tagName + '.' + e.className)""")
    assert page.evaluate("() => document.documentElement.scrollWidth") <= width and not wide, wide
    report = page.evaluate("""() => { const p = document.querySelector('.memlab-doctor-report');
        const cue = p.previousElementSibling && p.previousElementSibling.classList.contains('memlab-scroll-cue');
        return {visible: Math.round(100 * p.clientWidth / p.scrollWidth), cue}; }""")
    if width <= 500:
        assert report["visible"] == 100, f"the report shows {report['visible']} % of its width at {width} px"
    else:
        assert report["visible"] == 100 or report["cue"], f"the report shows {report['visible']} % and no cue"
    broken = page.evaluate(BROKEN_JS)
    assert not broken, f"settings broken mid-word at {width} px: {broken[:5]}"
    texts = page.evaluate(CONTRAST_JS, "#memlab-doctor, article figcaption")
    low = sorted({(t["where"], t["fg"], t["bg"], t["ratio"], t["text"]) for t in texts if t["ratio"] < t["need"]})
    assert len(texts) > 100 and not low, f"{len(low)} texts under AA ({scheme}, {width} px): {low[:8]}"
    from .test_browser_readers import COLOR_JS  # noqa: F401  (the same colour helpers)

    ratios = page.evaluate(COLOR_JS + """
        (labels) => labels.map(([fg, bg, text]) => [text, window.__memlabColor.ratio(
            window.__memlabColor.parse(fg), window.__memlabColor.parse(
                bg.startsWith('#') ? 'rgb(' + [1, 3, 5].map(i => parseInt(bg.slice(i, i + 2), 16)).join(',') + ')' : bg))])""",
        page.evaluate(SVG_LABELS_JS))
    low = [(t, round(r, 2)) for t, r in ratios if r < 4.5]
    assert not low, f"labels on the segment map under AA: {low[:5]}"


def test_messages_use_the_pages_words(doctor_run, tmp_path):
    """Issue 26: messages spoke command line (--cap, --max-bytes), which the page has no place to give."""
    tab, _ = doctor_run
    _show(tab, "light", 1280)
    page = tab.page
    problems = []
    for typed in ("-5", "-0.5"):
        page.fill("#memlab-doctor-cap", typed)
        page.locator(".memlab-doctor-run").click()
        err = page.locator(".memlab-doctor-error")
        err.wait_for(state="visible", timeout=60000)
        text = err.inner_text()
        if "--" in text or "memory cap" not in text:
            problems.append(f"cap {typed!r}: {text}")
        page.locator("#memlab-doctor").evaluate("e => { delete e.dataset.state }")
    page.fill("#memlab-doctor-cap", "")
    # a gzip'd snapshot whose trailer says 1 GiB: over the reader's limit of 512 MiB
    bomb = tmp_path / "claims_a_gib.pickle.gz"
    data = bytearray(RANGED.read_bytes())
    data[-4:] = (1 << 30).to_bytes(4, "little")
    bomb.write_bytes(bytes(data))
    want = cli(tmp_path, ["doctor", bomb.name, "--json"])
    assert want.returncode == 2 and "--max-bytes" in want.stderr, want.stderr
    got = _drop(tab, bomb)
    if not got["error"] or "--max-bytes N" not in got["error"] or "cannot raise" not in got["error"]:
        problems.append(f"over the limit: {got['error']}")
    labels = page.evaluate("() => [...document.querySelectorAll('.memlab-doctor-settings label')].map(l => l.textContent)")
    problems += [f"control: {t}" for t in labels if re.search(r"--[a-z]", t)]
    assert _drop(tab, RANGED)["error"] is None   # the result again, for any test after this one
    assert not problems, "\n".join(problems)


def test_the_grid_fills_in_after_the_first_answer_and_the_whole_answer_takes_its_place(doctor_run, tmp_path):
    """Issue 26: the first result waited for the whole grid. With the suggestion asked for, the
    replay and the what-ifs show first, the grid's settings fill in while it runs, and the whole
    answer (the command line's --suggest JSON byte for byte) replaces the grid's table."""
    tab, seen = doctor_run
    log = seen["log"]
    first = next((k for k, e in enumerate(log) if e[3]), None)
    done = next((k for k, e in enumerate(log) if e[1] == "done"), None)
    assert first is not None and done is not None, log
    at_first = log[first]
    assert at_first[1] == "grid" and at_first[2] == 0 and at_first[4], \
        f"the first result came with the whole grid, not before it: {at_first} (log {log})"
    rows = [e[2] for e in log[first:done + 1]]
    assert rows == sorted(rows) and rows[-1] >= 8 and len(set(rows)) >= 8, f"the grid did not fill in: {rows}"
    name = MIXED_UNITS.name
    (tmp_path / name).write_bytes(MIXED_UNITS.read_bytes())
    want = cli(tmp_path, ["doctor", name, *sum((["--what-if", w] for w in TICKED), []), "--suggest", "--json"])
    assert want.returncode == 0, want.stderr
    assert seen["online_json"] == want.stdout, "the page's final answer is not the command line's"
    assert rows[-1] == len(json.loads(want.stdout)["suggestion"]["rows"])
    assert not [s for s in seen["sections"] if "gridrun" in s], seen["sections"]
    assert "memlab-doctor-suggestion:suggestion" in seen["sections"], seen["sections"]


def test_the_first_answer_on_a_451k_event_trace_comes_before_the_grid_which_can_be_stopped(browser, site):
    """Issue 26: on a 451k-event trace the first result waited for the whole grid (17-26 s, of
    which the grid 13-20 s; the replay and the what-ifs 3-4 s). Now the replay and the what-if
    show first (target 5 s from the drop, Python loaded in the tab), the grid fills in after,
    and Stop keeps what is shown; Python starts again at the next drop."""
    tab = Tab(browser, site["origin"])
    try:
        _set_what_ifs(tab.page, ["expandable_segments:True"], [])   # the page's defaults: one what-if, the grid
        assert _drop(tab, OTHER)["error"] is None                    # Python loaded in the tab
        tab.page.evaluate(LOG_JS)
        tab.page.locator("#memlab-doctor").evaluate("e => { delete e.dataset.state; delete e.dataset.firstResultSeconds }")
        t0 = time.perf_counter()
        tab.page.set_input_files("#memlab-doctor-file", str(LONG_TRACE))
        tab.page.wait_for_selector("#memlab-doctor[data-first-result-seconds], .memlab-doctor-error:not([hidden])",
                                   timeout=300_000)
        wall = time.perf_counter() - t0
        err = tab.page.locator(".memlab-doctor-error")
        assert not err.is_visible(), err.inner_text()
        first = tab.page.locator("#memlab-doctor").evaluate("e => ({...e.dataset})")
        at_first = {"state": first.get("state"), "grid rows": int(first.get("gridRows") or 0),
                    "stop shown": tab.page.locator(".memlab-doctor-stop-grid").is_visible()}
        events = json.loads(tab.page.locator(".memlab-doctor-results").get_attribute("data-json"))["trace_events"]
        print(f"{LONG_TRACE.name} ({events:,} events): the replay shown {first.get('replaySeconds')} s after the drop, "
              f"with the what-if {first['firstResultSeconds']} s "
              f"(wall {wall:.1f} s; replay and what-if {first.get('seconds')}); load average "
              f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; at that moment {at_first}")
        assert events >= 450_000
        assert float(first.get("replaySeconds") or "inf") < float(first["firstResultSeconds"]), \
            "the recorded run's replay did not show before the what-if"
        assert at_first["state"] == "grid" and at_first["stop shown"], \
            f"the first answer came after the grid ({first['firstResultSeconds']} s): {at_first}"
        tab.page.wait_for_function("() => +(document.getElementById('memlab-doctor').dataset.gridRows || 0) >= 2",
                                   timeout=120_000)
        t1 = time.perf_counter()
        tab.page.locator(".memlab-doctor-stop-grid").click()
        tab.page.wait_for_selector("#memlab-doctor[data-state=stopped]", timeout=5_000)
        stop_s = time.perf_counter() - t1
        kept = tab.page.evaluate("""() => ({
            rows: +document.getElementById('memlab-doctor').dataset.gridRows,
            shown: document.querySelectorAll('.memlab-doctor-gridrun tbody tr').length,
            status: document.querySelector('.memlab-doctor-gridrun .memlab-doctor-grid-status').textContent,
            busy: !document.querySelector('.memlab-doctor-status').hidden,
            tables: document.querySelectorAll('.memlab-doctor-results table').length})""")
        print(f"stopped {stop_s:.2f} s after the click with {kept['rows']} settings of the grid shown: {kept['status']}")
        assert not kept["busy"] and kept["rows"] >= 2 and kept["shown"] == kept["rows"] and kept["tables"] >= 2, kept
        assert "Stopped after" in kept["status"], kept
        assert tab.page.evaluate("() => window.__memlabLog.every(e => e[4] || !e[3])")
        again = _drop(tab, OTHER)
        assert again["error"] is None, again["error"]
        assert not tab.outside and not tab.problems, tab.outside + tab.problems
        # The first answer is the doctor's own work (read, replay, what-if) and little else: no
        # grid. Its time on a machine others share is measured; the target holds on one not shared.
        secs = json.loads(first["seconds"])
        doctor_s = secs["read"] + secs["replay"] + sum(secs["what_if"])
        page_s = float(first["firstResultSeconds"]) - doctor_s
        assert page_s <= 1.0 + 0.1 * doctor_s, f"{page_s:.1f} s of the first answer's {first['firstResultSeconds']} s " \
                                               f"are not the doctor's reading, replay and what-if ({secs})"
        _unless_overloaded(f"first answer {first['firstResultSeconds']} s")
        if os.getloadavg()[0] <= 1.0:
            assert float(first["firstResultSeconds"]) <= FIRST_ANSWER_S, first
    finally:
        tab.close()


KV_CAP = 40 * 2**20          # below the 54 MiB kv_two_streams holds at once: every what-if stops part-way
GPU_GIB = 80


def _readable(page, width: int) -> list[str]:
    """What keeps the doctor's result from being read at ``width``: wider than the screen, a
    setting broken mid-word, a text under WCAG AA."""
    wide = page.evaluate(f"""() => [...document.querySelectorAll('article *')]
        .filter(e => e.getBoundingClientRect().right > {width} + 1 && getComputedStyle(e).position !== 'fixed')
        .filter(e => !e.closest('.memlab-scroll, .highlight, pre'))
        .slice(0, 5).map(e => e.tagName + '.' + e.className)""")
    out = [f"wider than {width} px: {wide}"] if wide or page.evaluate("() => document.documentElement.scrollWidth") > width else []
    out += [f"broken mid-word: {b}" for b in page.evaluate(BROKEN_JS)[:5]]
    texts = page.evaluate(CONTRAST_JS, "#memlab-doctor")
    out += [f"under AA: {t['where']} {t['ratio']:.2f} {t['text']!r}" for t in texts if t["ratio"] < t["need"]][:5]
    return out


def test_the_gpu_memory_notes_and_what_ifs_that_stop_part_way_are_shown_and_the_reader_gives_the_gpu_memory(doctor_run, tmp_path):
    """Issue 24's fields on the page: where the GPU's memory comes from (and a field to give it,
    the command line's --total-memory), the doctor's warnings in the page's words, the best-fit
    order the replay followed, and what-ifs that run out of memory where the recording did not;
    none shown as raw JSON, all readable at 390 and 1280 px in both schemes."""
    tab, _ = doctor_run
    _show(tab, "light", 1280)
    page = tab.page
    name = RANGED.name
    (tmp_path / name).write_bytes(RANGED.read_bytes())
    problems = []
    page.fill("#memlab-doctor-total", "-1")
    page.locator(".memlab-doctor-run").click()
    err = page.locator(".memlab-doctor-error")
    err.wait_for(state="visible", timeout=60_000)
    if "GPU's memory" not in err.inner_text() or "--" in err.inner_text():
        problems.append(f"a GPU memory of -1 GiB: {err.inner_text()}")
    # the reader's GPU memory and a cap below the program's need
    _set_what_ifs(page, ["expandable_segments:True", ""], [], cap_gib=KV_CAP / 2**30, suggest=False)
    page.fill("#memlab-doctor-total", str(GPU_GIB))
    got = _drop(tab, RANGED)
    assert got["error"] is None, got["error"]
    page_json = page.locator(".memlab-doctor-results").get_attribute("data-json")
    want = cli(tmp_path, ["doctor", name, "--what-if", "expandable_segments:True", "--what-if", "", "--cap", str(KV_CAP),
                          "--total-memory", str(GPU_GIB * 2**30), "--json"])
    assert want.returncode == 0, want.stderr
    if page_json != want.stdout:
        problems.append("the page's answer with the GPU's memory given is not the command line's --total-memory one")
    doc = json.loads(want.stdout)
    shown = page.evaluate("""() => ({
        basis: (document.querySelector('.memlab-doctor-basis') || {}).textContent || '',
        warnings: [...document.querySelectorAll('.memlab-doctor-warnings li')].map(l => l.textContent),
        flags: [...document.querySelectorAll('.memlab-doctor-results table')][0] ?
            [...[...document.querySelectorAll('.memlab-doctor-results table')][0].querySelectorAll('tbody tr')]
            .map(r => (r.querySelector('.memlab-doctor-flag') || {}).textContent || '') : [],
        stopped: (document.querySelector('.memlab-doctor-stopped') || {}).textContent || '',
        extra: [...document.querySelectorAll('.memlab-doctor-extra')].map(s => s.dataset.key)})""")
    print(shown)
    if f"GPU memory {GPU_GIB} GiB (yours)" not in shown["basis"]:
        problems.append(f"the GPU's memory and its source: {shown['basis']!r}")
    rule = doc["allocator_rule"]
    if f"torch {rule['version']}" not in shown["basis"] or f"{rule['ties']} ties" not in shown["basis"]:
        problems.append(f"the best-fit order followed: {shown['basis']!r}, the doctor says {rule}")
    if len(shown["warnings"]) != len(doc["warnings"]) or not any("below what the recording reserved" in w for w in shown["warnings"]):
        problems.append(f"warnings: {shown['warnings']}, the doctor says {doc['warnings']}")
    for w, flag in zip(doc["what_if"], shown["flags"][1:]):
        if not w["finished"] and f"stops at request {w['stopped_at_request']:,}" not in flag:
            problems.append(f"{w['settings'] or 'defaults'} stops at request {w['stopped_at_request']}; its row says {flag!r}")
    if not all(not w["finished"] for w in doc["what_if"]) or shown["stopped"].count("runs out of memory at request") != 2:
        problems.append(f"what-ifs that stop part-way: {shown['stopped']!r}")
    if shown["extra"]:
        problems.append(f"fields shown raw: {shown['extra']}")
    for scheme, width in COMBOS:
        _show(tab, scheme, width)
        problems += [f"{scheme} {width}: {p}" for p in _readable(page, width)]
        problems += [f"{scheme} {width}: {p}" for p in _still(page, ".memlab-doctor-results")]
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        area = page.evaluate("""() => { const r = document.querySelector('.memlab-doctor-results').getBoundingClientRect();
            return {x: r.x + scrollX, y: r.y + scrollY, width: r.width, height: r.height} }""")
        page.screenshot(path=str(SCREENSHOTS / f"snapshot_check-stopped-{scheme}-{width}.png"), full_page=True, clip=area)
    # the GPU's memory not given: the doctor assumes the H200's, and the page asks for it in its words
    _show(tab, "light", 1280)
    page.fill("#memlab-doctor-total", "")
    _set_what_ifs(page, ["expandable_segments:True"], [], suggest=False)
    assert _drop(tab, RANGED)["error"] is None
    basis = page.locator(".memlab-doctor-basis").inner_text()
    notes = page.evaluate("() => [...document.querySelectorAll('.memlab-doctor-warnings li')].map(l => l.textContent)")
    if "assumed: the lab H200's" not in basis:
        problems.append(f"an assumed GPU memory: {basis!r}")
    if not notes or any(re.search(r"--[a-z]", n) for n in notes) or not any("GPU's memory above" in n for n in notes):
        problems.append(f"the note on an assumed GPU memory: {notes}")
    _set_what_ifs(page, TICKED, [])
    assert _drop(tab, RANGED)["error"] is None   # the result again, for any test after this one
    assert not problems, "\n".join(problems)
