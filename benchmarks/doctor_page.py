"""The page "Check your own snapshot": bytes shipped, page weights, and speed in chromium.

Prints, for a built book (``make book`` writes _build/html):

- the bytes of Pyodide and of the doctor's files the site ships, per file, as stored and gzip'd
  (what a host that compresses sends);
- every page's weight at its first load (all the files a load fetches, gzip'd), and with
  ``--compare OTHER_HTML`` the same for another build (the one before this page) and the change;
- the time from a drop to the first result on the book's recorded training snapshot (8,170
  events, as torch's pickle with frames, protocol 5) with the page's own settings
  (expandable_segments:True and --suggest's grid): the first time, then with Pyodide in the
  browser's cache (median of ``--repeats``); target 5 s cached on the 2-core machine;
- the time per what-if on a large snapshot: ``--large PATH`` (a reader's pickle), by default the
  lab's real 450k-event eager loop (benchmarks/data/doctor_cases/eager_long.pickle.gz); target 12 s;
- on that snapshot with the page's own settings (one what-if and the grid), Python loaded in the
  tab: when the replay shows, when the what-if shows (target 5 s on a machine not shared), the
  grid's first settings as they fill in, and how soon Stop ends it. ``--first-answer`` measures
  only that, ``--repeats`` times, alternating with the ``--compare`` site if given, and prints
  each run and the medians (with the load average at each run's start).

Usage: python benchmarks/doctor_page.py [--site DIR] [--compare DIR] [--large PATH] [--repeats N] [--first-answer]
"""
from __future__ import annotations

import argparse
import functools
import gzip
import http.server
import json
import os
import pickle
import statistics
import sys
import tempfile
import threading
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.booktools import PAGES  # noqa: E402
from tests.snapshot_forms import torch_form  # noqa: E402
from tests.test_doctor_page import SNAPSHOTS, Tab, _set_what_ifs, long_snapshot  # noqa: E402

SMALL = ROOT / "benchmarks" / "data" / "doctor_cases" / "handoff.pickle.gz"


def serve(root: Path) -> tuple[str, http.server.ThreadingHTTPServer]:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{srv.server_address[1]}", srv


def sizes(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    return len(data), min(len(data), len(gzip.compress(data, 6)))


def shipped(site: Path) -> None:
    static = site / "_static"
    total = [0, 0]
    for folder in sorted([*static.glob("pyodide-*"), static / "doctor"]):
        for f in sorted(folder.iterdir()):
            raw, packed = sizes(f)
            total[0] += raw
            total[1] += packed
            print(f"  {raw / 1e6:8.3f} MB stored  {packed / 1e6:7.3f} MB gzip'd  {f.relative_to(site)}")
    print(f"  {total[0] / 1e6:8.3f} MB stored  {total[1] / 1e6:7.3f} MB gzip'd  in all (fetched at the first drop only)")


def weights(browser, site: Path, pages: list[str]) -> dict[str, tuple[int, int]]:
    origin, srv = serve(site)
    out = {}
    try:
        for page in pages:
            ctx = browser.new_context(viewport={"width": 1280, "height": 900})
            urls: list[str] = []
            ctx.on("requestfinished", lambda r: urls.append(r.url))
            p = ctx.new_page()
            p.goto(f"{origin}/book/{page}.html", wait_until="load")
            p.wait_for_timeout(1500)
            raw = packed = 0
            for u in set(urls):
                f = site / urllib.parse.unquote(urllib.parse.urlsplit(u).path).lstrip("/")
                r, g = sizes(f)
                raw, packed = raw + r, packed + g
            out[page] = (raw, packed)
            ctx.close()
    finally:
        srv.shutdown()
    return out


def speed(browser, site: Path, large: Path | None, repeats: int) -> None:
    origin, srv = serve(site)
    tmp = Path(tempfile.mkdtemp())
    try:
        pick = tmp / "training.pickle"
        pick.write_bytes(pickle.dumps(torch_form(SNAPSHOTS["training"]), protocol=5))
        ctx = browser.new_context(viewport={"width": 1280, "height": 900})
        first = Tab(browser, origin, context=ctx).drop(pick)
        cached = []
        for _ in range(repeats):
            tab = Tab(browser, origin, context=ctx)
            got = tab.drop(pick)
            cached.append((float(got["firstResultSeconds"]), json.loads(got["pyodideMarks"])))
            tab.page.close()
        ctx.close()
        print(f"training snapshot (8,170 events, {pick.stat().st_size / 1e6:.1f} MB pickle, the page's settings: one "
              f"what-if and the suggestion's grid): load average {os.getloadavg()[0]:.1f}; first result "
              f"{first['firstResultSeconds']} s the first time; with Pyodide cached median "
              f"{statistics.median(t for t, _ in cached):.2f} s (runs: {', '.join(f'{t:.2f}' for t, _ in cached)} s; "
              f"Python ready after {statistics.median(m['python'] for _, m in cached) / 1000:.2f} s, from its memory "
              f"snapshot: {all(m['snapshot'] for _, m in cached)}); target 5 s")
        if large is None:
            large = long_snapshot(tmp)
        tab = Tab(browser, origin)
        _set_what_ifs(tab.page, ["expandable_segments:True", "max_split_size_mb:128"], [], suggest=False)
        got = tab.drop(large, timeout_s=900, until="result")
        if got["error"]:
            print(f"{large.name}: {got['error']}")
        else:
            secs = json.loads(got["seconds"])
            events = json.loads(tab.page.locator(".memlab-doctor-results").get_attribute("data-json"))["trace_events"]
            print(f"{large.name} ({events:,} events, {large.stat().st_size / 1e6:.0f} MB): first result "
                  f"{got['firstResultSeconds']} s; replay {secs['replay']:.1f} s; per what-if "
                  f"{', '.join(f'{t:.1f} s' for t in secs['what_if'])} (target 12 s)")
        tab.close()
        first_answer(browser, origin, large)
    finally:
        srv.shutdown()


def first_answer(browser, origin: str, large: Path) -> tuple[float, float] | None:
    """Print the first answer's timings; returns (replay shown, what-if shown) in seconds."""
    tab = Tab(browser, origin)
    try:
        _set_what_ifs(tab.page, ["expandable_segments:True"], [])
        tab.drop(SMALL)   # Python loaded in the tab
        got = tab.drop(large, timeout_s=900, until="result")
        if got["error"]:
            print(f"{large.name}: {got['error']}")
            return
        tab.page.wait_for_function("() => +(document.getElementById('memlab-doctor').dataset.gridRows || 0) >= 2",
                                   timeout=300_000)
        grid_s = float(tab.page.evaluate("() => performance.now()")) / 1000
        tab.page.locator(".memlab-doctor-stop-grid").click()
        tab.page.wait_for_selector("#memlab-doctor[data-state=stopped]", timeout=10_000)
        stop_s = float(tab.page.evaluate("() => performance.now()")) / 1000 - grid_s
        secs = json.loads(got["seconds"])
        print(f"{large.name}, one what-if and the grid, Python loaded: load average {os.getloadavg()[0]:.1f}; the replay "
              f"shown {got.get('replaySeconds')} s after the drop, the what-if {got['firstResultSeconds']} s (target 5 s "
              f"unshared; replay {secs['replay']:.1f} s, what-if {secs['what_if'][0]:.1f} s); 2 grid settings in, "
              f"Stop took {stop_s:.2f} s")
        return float(got["replaySeconds"]), float(got["firstResultSeconds"])
    finally:
        tab.close()


def first_answers(browser, sites: dict[str, Path], large: Path, repeats: int) -> None:
    """:func:`first_answer` ``repeats`` times per site, the sites in turn (a burst of load falls on
    each), then the medians."""
    got: dict[str, list[tuple[float, float, float]]] = {name: [] for name in sites}
    for _ in range(repeats):
        for name, site in sites.items():
            origin, srv = serve(site)
            load = os.getloadavg()[0]
            try:
                print(f"{name}: ", end="")
                t = first_answer(browser, origin, large)
            finally:
                srv.shutdown()
            if t is not None:
                got[name].append((*t, load))
    for name, runs in got.items():
        if runs:
            print(f"{name} ({sites[name]}): the replay shown {statistics.median(r[0] for r in runs):.2f} s, the what-if "
                  f"{statistics.median(r[1] for r in runs):.2f} s after the drop (medians of {len(runs)}; runs "
                  f"{', '.join(f'{r[0]:.2f}/{r[1]:.2f}' for r in runs)} s; load average at their start "
                  f"{', '.join(f'{r[2]:.1f}' for r in runs)})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--site", type=Path, default=ROOT / "_build" / "html")
    ap.add_argument("--compare", type=Path, help="another built html folder (before this page)")
    ap.add_argument("--large", type=Path, help="a large snapshot pickle (default: the lab's real 450k-event trace)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--first-answer", action="store_true",
                    help="only the first answer on the large snapshot, --repeats times (and on --compare's site)")
    a = ap.parse_args()
    from playwright.sync_api import sync_playwright

    if a.first_answer:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=os.environ.get("CUDA_MEMLAB_CHROMIUM", "/usr/bin/chromium"),
                                        args=["--no-sandbox"])
            sites = {"site": a.site, **({"compare": a.compare} if a.compare else {})}
            first_answers(browser, sites, a.large or long_snapshot(Path(tempfile.mkdtemp())), a.repeats)
            browser.close()
        return

    print(f"files of the page 'Check your own snapshot' in {a.site}:")
    shipped(a.site)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=os.environ.get("CUDA_MEMLAB_CHROMIUM", "/usr/bin/chromium"),
                                    args=["--no-sandbox"])
        pages = [pg for pg in PAGES + ["snapshot_check"] if (a.site / "book" / f"{pg}.html").exists()]
        now = weights(browser, a.site, pages)
        before = weights(browser, a.compare, [pg for pg in PAGES if (a.compare / "book" / f"{pg}.html").exists()]) \
            if a.compare else {}
        print("page weight at first load (every file fetched, gzip'd; stored in brackets):")
        for page in pages:
            raw, packed = now[page]
            line = f"  {page:24s} {packed / 1e3:7.1f} kB ({raw / 1e3:7.1f} kB)"
            if page in before:
                b = before[page][1]
                line += f"   before {b / 1e3:7.1f} kB: {100 * (packed - b) / b:+.2f} %"
            print(line)
        if not a.skip_speed:
            speed(browser, a.site, a.large, a.repeats)
        browser.close()


if __name__ == "__main__":
    main()
