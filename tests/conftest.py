"""Shared test set-up: GPU tests skip without CUDA; plots render off-screen; the book is built
(and its notebooks executed) once per run; with pytest-xdist (`make test` runs ``-n 2``), a
module's costly shared set-up stays in one worker and the costliest work starts first
(tests/scheduling.py)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import matplotlib
import pytest

# pytest rewrites the asserts of every test module as it imports it (about 6 s of CPU for
# ours, in each xdist worker) and keeps the result only where Python may write bytecode. Where
# PYTHONDONTWRITEBYTECODE is set, as on the lab's machines, it rewrote them at every run: the
# test modules imported after this one are kept in tests/__pycache__ (which git ignores).
sys.dont_write_bytecode = False

from experiments.core.device import has_cuda

# Off-screen plots in this process only: notebook kernels started by the tests must keep
# their inline backend, so the backend is not set through the environment.
matplotlib.use("Agg")


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """``-n N`` without ``--dist`` shares the tests out as `make test` does (``--dist loadgroup``,
    which tests/scheduling.py implements), not by xdist's plain ``load``."""
    if getattr(config.option, "numprocesses", None) and config.option.dist == "no":
        config.option.dist = "loadgroup"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup``: a module with a costly module-scoped fixture runs whole in one
    worker, everything else test by test, in the order the workers sorted (tests/scheduling.py)."""
    if config.option.dist != "loadgroup":
        return None
    from tests.scheduling import make_scheduler

    config.option.loadscopereorder = False  # keep the order below
    return make_scheduler(config, log)


# Fixtures that execute notebooks (the `slow` marker's definition) but live in modules that are
# not marked slow as a whole: a test that uses one is slow, so that the developer loop
# (-m "not slow") does not wait for a graded class. test_grading.py's `submissions` grades a
# class of notebooks in sandboxes, some of them until their time limit (157 s of wall time in a
# worker of the loop on the shared machine at load 10-25, for about 1 s of CPU in the worker).
NOTEBOOK_FIXTURES = frozenset({"submissions"})


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if NOTEBOOK_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    # In xdist's workers: the costliest work first (longest first, as a scheduler would), so that
    # no worker is left with a long test at the end while the other idles. A stable sort, the
    # same in every worker; a module that runs whole stays together. A run without xdist keeps
    # the files' order.
    if hasattr(config, "workerinput"):
        from tests.scheduling import module_of, order_key

        slow_modules = {module_of(i.nodeid) for i in items if "slow" in i.keywords}
        items.sort(key=lambda i: order_key(i.nodeid, "slow" in i.keywords, module_of(i.nodeid) in slow_modules))
    if has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the lab GPU: pytest -m gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# Python's cyclic garbage collector took 23 s of the developer loop's 160 s of CPU in its two
# workers (gc.callbacks, summed), most of it walking what collection had built and kept for the
# whole run (test modules, their parameters, torch, matplotlib): 13 s with that set aside
# (gc.freeze: never walked again, never freed, which it would not have been anyway) and the
# young generation collected every 10,000 new objects instead of every 700.
GC_THRESHOLDS = (10_000, 50, 100)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def _timed(phase):
    """A hook wrapper that appends the phase's wall and CPU seconds (this process's, and those of
    its children that ended meanwhile: notebook kernels, subprocesses; not sandboxed ones) to the file
    named by CUDA_MEMLAB_TEST_TIMES, one JSON line per test and phase (``python -m tests.times
    FILE`` sums them). On a shared, loaded machine the CPU seconds say what a test costs, the
    wall seconds mostly how busy the machine was."""
    @pytest.hookimpl(hookwrapper=True)
    def hook(item, *args):
        out = os.environ.get("CUDA_MEMLAB_TEST_TIMES")
        if not out:
            yield
            return
        import json
        import resource
        import time

        def cpu():
            me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
            return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime

        t0, (s0, c0) = time.perf_counter(), cpu()
        yield
        t1, (s1, c1) = time.perf_counter(), cpu()
        line = json.dumps({"test": item.nodeid, "phase": phase, "wall": round(t1 - t0, 3),
                           "cpu": round(s1 - s0, 3), "children_cpu": round(c1 - c0, 3),
                           "worker": os.environ.get("PYTEST_XDIST_WORKER", "main")})
        with open(out, "a", encoding="utf-8") as f:
            f.write(line + "\n")
    return hook


pytest_runtest_setup = _timed("setup")
pytest_runtest_call = _timed("call")
pytest_runtest_teardown = _timed("teardown")


@pytest.fixture
def recorded_mode(monkeypatch):
    """Force recorded mode, whatever GPU the test machine has."""
    monkeypatch.setenv("CUDA_MEMLAB_MODE", "recorded")
    return "recorded"


@pytest.fixture
def live_mode(monkeypatch):
    """Force live mode (GPU tests only)."""
    monkeypatch.setenv("CUDA_MEMLAB_MODE", "live")
    return "live"


@pytest.fixture(scope="session")
def built_book(tmp_path_factory) -> Path:
    """The book built in recorded mode with warnings as errors: its ``_build`` folder, with
    ``html/`` (the pages) and ``jupyter_execute/book/*.ipynb`` (the executed notebooks).

    The build is the one execution of each notebook (it fails on a cell error), made as
    ``make book`` makes it (static explorers). ``make test`` builds the book before pytest and
    names its folder in ``CUDA_MEMLAB_BOOK_BUILD``; without that, the first test that needs the
    book builds it into a temporary folder (once per run, whatever the xdist workers).
    """
    given = os.environ.get("CUDA_MEMLAB_BOOK_BUILD")
    if given:
        build = Path(given) / "_build"
        assert (build / "html" / "index.html").exists(), f"CUDA_MEMLAB_BOOK_BUILD={given} holds no built book"
        return build
    from filelock import FileLock

    from tests.bookbuild import build_book

    # One build per run, also with xdist: the workers' temporary folders share a parent, and the
    # first worker to get here builds while the others wait for it.
    shared = tmp_path_factory.getbasetemp().parent if os.environ.get("PYTEST_XDIST_WORKER") else None
    out = (shared or tmp_path_factory.getbasetemp()) / "book"
    with FileLock(str(out) + ".lock"):
        if not (out / "_build" / "html" / "index.html").exists():
            build_book(out, jobs=os.cpu_count() or 1)
    return out / "_build"


@pytest.fixture(scope="session")
def site(built_book):
    """The built pages served on 127.0.0.1: {'dir': the html folder, 'origin': 'http://127.0.0.1:PORT'}.

    CUDA_MEMLAB_TEST_SITE=DIR serves an already built html folder instead (e.g. an old build,
    to see which browser tests fail on it).
    """
    import functools
    import http.server
    import threading

    given = os.environ.get("CUDA_MEMLAB_TEST_SITE")
    root = Path(given) if given else built_book / "html"

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield {"dir": root, "origin": f"http://127.0.0.1:{server.server_address[1]}"}
    server.shutdown()


@pytest.fixture(scope="session")
def page_readings(site, tmp_path_factory):
    """Every page read once per colour scheme and width for the browser tests that only read
    (tests/page_readings.py), in a process of its own, once per run whatever the xdist workers:
    a function ``(page, scheme, width) -> dict``; a reading that failed raises its error in the
    tests that ask for it."""
    import json
    import subprocess
    import sys

    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp().parent if os.environ.get("PYTEST_XDIST_WORKER") else None
    out = (shared or tmp_path_factory.getbasetemp()) / "page_readings.json"
    with FileLock(str(out) + ".lock"):
        if not out.exists():
            done = subprocess.run([sys.executable, "-m", "tests.page_readings", str(site["dir"]), str(out)],
                                  cwd=Path(__file__).resolve().parent.parent, capture_output=True, text=True)
            assert done.returncode == 0 and out.exists(), f"tests.page_readings failed:\n{done.stderr[-3000:]}"
    data = json.loads(out.read_text())

    def reading(page: str, scheme: str, width: str) -> dict:
        got = data[f"{page} {scheme} {width}"]
        if "error" in got:
            raise RuntimeError(f"reading {page} ({scheme}, {width} px) failed:\n{got['error']}")
        return got

    return reading


@pytest.fixture(scope="module")
def browser():
    """Debian's chromium driven by Playwright, one per test module (a session-wide one would keep
    Playwright's loop alive while other modules run notebooks). CUDA_MEMLAB_CHROMIUM names another."""
    from playwright.sync_api import sync_playwright

    exe = Path(os.environ.get("CUDA_MEMLAB_CHROMIUM", "/usr/bin/chromium"))
    assert exe.exists(), f"no browser at {exe}: `make test` installs Debian's chromium (apt-get install -y chromium)"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(exe), args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture(scope="module")
def tabs(browser):
    """The module's kept tabs (tests/test_browser.py: Tabs): its visits at one viewport, touch
    and colour scheme reuse one context and page instead of starting a renderer each."""
    from tests.test_browser import Tabs

    kept = Tabs(browser)
    yield kept
    kept.close()
