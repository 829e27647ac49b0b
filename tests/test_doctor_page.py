"""The page "Check your own snapshot": the allocator doctor run in the reader's browser.

CPU tests check the page's Python half (book/_ext/doctor_worker.py) and the zip the page ships
against the command line, without a browser. The browser tests (slow: they need the built
book) drop snapshots on the built page in Debian's chromium with every address but the test
server blocked, and compare what the page offers for download with
``python -m experiments doctor ... --json`` on the same file and settings, byte for byte.
The command line's arguments are written out here, not taken from the page's code.
"""
from __future__ import annotations

import io
import json
import pickle
import subprocess
import sys
import time
import urllib.parse
import zipfile
from pathlib import Path

import pytest

from tests.snapshot_forms import torch_form

ROOT = Path(__file__).resolve().parent.parent
EXT = ROOT / "book" / "_ext"
RECORDED = ROOT / "experiments" / "recorded" / "alloc.doctor_snapshots" / "nvidia-h200.json"
PAGE = "book/snapshot_check.html"
SCREENSHOTS = ROOT / "_build" / "screenshots"


def _ext(name: str):
    if str(EXT) not in sys.path:
        sys.path.insert(0, str(EXT))
    return __import__(name)


def _recorded() -> dict[str, dict]:
    """{workload: the snapshot recorded under the defaults} of the book's recordings."""
    doc = json.loads(RECORDED.read_text())
    return {p["params"]["workload"]: next(r for r in p["data"]["runs"] if r["settings"] == "")["snapshot"]
            for p in doc["points"]}


SNAPSHOTS = _recorded()
# Five the issue names (streams, pools, caps, expandable, training) and the two others.
WORKLOADS = ["streams", "pools", "cap", "expandable_range", "training", "mixed", "late_start"]
# The settings the browser test ticks and types, in the page's order, as the command line takes them.
WHAT_IFS = ["expandable_segments:True", "max_split_size_mb:128", "",
            "roundup_power2_divisions:[256:2,>:4]", "expandable_segments:True,garbage_collection_threshold:0.6"]
CAP_GIB = 1.5


def _cli_args(name: str, what_if=WHAT_IFS, cap_bytes: int | None = None, suggest: bool = True) -> list[str]:
    """The command line's arguments for the page's settings (the page asks for --suggest by default)."""
    args = ["doctor", name]
    for s in what_if:
        args += ["--what-if", s]
    if cap_bytes is not None:
        args += ["--cap", str(cap_bytes)]
    return args + (["--suggest"] if suggest else []) + ["--json"]


def cli(folder: Path, args: list[str]) -> subprocess.CompletedProcess:
    """``python -m experiments ARGS`` run in ``folder`` (the file named as the page names it)."""
    return subprocess.run([sys.executable, "-m", "experiments", *args], cwd=folder, capture_output=True, text=True,
                          timeout=300)


class _Os:
    """Unpickles to os.system("touch ..."): the attack a restricted loader must refuse."""

    def __init__(self, target: str):
        self.target = target

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.target}",))


def bad_files(folder: Path) -> dict[str, Path]:
    """Files the doctor must refuse with one line each (written into ``folder``)."""
    folder.mkdir(parents=True, exist_ok=True)
    blob = pickle.dumps(torch_form(SNAPSHOTS["streams"]), protocol=5)
    files = {"truncated.pickle": blob[: len(blob) // 3],
             "attack.pickle": pickle.dumps({"segments": [], "device_traces": [[]],
                                            "x": _Os(str(folder / "pwned"))}),
             "not_a_snapshot.json": b'{"hello": [1, 2, 3]}',
             "broken.json": b'{"segments": [',
             "empty.pickle": b"",
             "photo.png": bytes(range(256)) * 8}
    out = {}
    for name, data in files.items():
        (folder / name).write_bytes(data)
        out[name] = folder / name
    return out


# ----------------------------------------------------------------------------- without a browser

def test_the_page_python_gives_the_clis_json_byte_for_byte(tmp_path):
    worker = _ext("doctor_worker")
    for workload in ("training", "cap", "streams"):
        name = f"{workload}.json"
        (tmp_path / name).write_text(json.dumps(SNAPSHOTS[workload]))
        for cap, suggest in ((None, False), (int(CAP_GIB * 2**30), False), (None, True)):
            res = cli(tmp_path, _cli_args(name, cap_bytes=cap, suggest=suggest))
            assert res.returncode == 0, res.stderr
            import os

            old = os.getcwd()
            os.chdir(tmp_path)
            try:
                page = worker.run(name, WHAT_IFS, cap_bytes=cap, suggest=suggest)
            finally:
                os.chdir(old)
            assert page["ok"], page
            assert page["json_text"] == res.stdout, f"{workload}, cap {cap}: the page's JSON differs from the CLI's"
            assert page["argv"] == _cli_args(name, cap_bytes=cap, suggest=suggest)
            assert (page["json"]["suggestion"] is not None) == suggest
            assert (page["oom_text"] is not None) == (page["json"]["oom"] is not None)
            runs = page["figure"]["runs"]
            assert [r["peak_reserved_bytes"] for r in runs] == \
                [page["json"]["replay"]["peak_reserved_bytes"]] + [w["peak_reserved_bytes"] for w in page["json"]["what_if"]]
            for r in runs:   # the figure's envelope keeps each run's peak
                assert max(r["reserved"]) == r["peak_reserved_bytes"] and len(r["x"]) <= worker.POINTS


def test_bad_input_gets_the_clis_one_line_error(tmp_path):
    import os

    worker = _ext("doctor_worker")
    files = bad_files(tmp_path)
    cases = [(name, []) for name in files] + [("streams.json", ["max_split_sise_mb:64"]), ("streams.json", ["expandable_segments:maybe"])]
    (tmp_path / "streams.json").write_text(json.dumps(SNAPSHOTS["streams"]))
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        for name, what_if in cases:
            res = cli(tmp_path, _cli_args(name, what_if, suggest=False))
            page = worker.run(name, what_if)
            assert res.returncode == 2 and not page["ok"], (name, what_if, res.stdout, page)
            assert page["error"] == res.stderr.strip(), (name, what_if)
            assert "\n" not in page["error"] and page["error"].startswith("error: ")
        # a cap argparse refuses: the command line's usage line
        res = cli(tmp_path, ["doctor", "streams.json", "--cap", "-5", "--json"])
        page = worker.run("streams.json", [], cap_bytes=-5)
        assert page["error"] == res.stderr.strip() and res.returncode == 2
    finally:
        os.chdir(old)
    assert not (tmp_path / "pwned").exists(), "the attack pickle ran code"


def test_a_snapshot_too_big_for_the_tab_is_sent_to_the_cli_and_a_bug_is_not_blamed_on_the_file(tmp_path, monkeypatch):
    """Pyodide raises MemoryError when its 4 GB are used up (seen in Pyodide 314.0.7); an
    exception the doctor does not raise for bad input is a bug of ours, shown as such."""
    import os

    from experiments.doctor.answers import report as doctor_report

    worker = _ext("doctor_worker")
    (tmp_path / "s.json").write_text(json.dumps(SNAPSHOTS["streams"]))
    monkeypatch.chdir(tmp_path)

    def too_big(*a, **kw):
        raise MemoryError()

    monkeypatch.setattr(doctor_report, "doctor", too_big)
    res = worker.run("s.json", [])
    assert not res["ok"] and "python -m experiments doctor" in res["error"] and "\n" not in res["error"]

    def broken(*a, **kw):
        raise AttributeError("'NoneType' object has no attribute 'size'")

    monkeypatch.setattr(doctor_report, "doctor", broken)
    answer = json.loads(worker.run_json("s.json", json.dumps({"what_if": []})))
    assert not answer["ok"] and "error" not in answer, answer
    assert "a bug" in answer["bug"].splitlines()[0] and "Traceback" in answer["bug"] and "AttributeError" in answer["bug"]
    assert os.getcwd() == str(tmp_path)


def _unzip_and_run(tmp_path: Path, snapshot_name: str, what_if: list[str]) -> dict:
    page = _ext("doctor_page")
    site = tmp_path / "zip"
    zipfile.ZipFile(io.BytesIO(page.doctor_zip())).extractall(site)
    code = f"""
import importlib.abc, json, os, sys
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {page.UNAVAILABLE!r}:
            raise ImportError("not in the browser: " + name)
sys.meta_path.insert(0, Refuse())
sys.path.insert(0, {str(site)!r})
import doctor_worker
os.chdir({str(tmp_path)!r})
res = doctor_worker.run({snapshot_name!r}, {what_if!r})
details = doctor_worker.details(res.pop("report"))
mods = sorted(n for n, m in sys.modules.items() if n.split(".")[0] == "experiments")
outside = [m.__file__ for n, m in sys.modules.items() if n.split(".")[0] == "experiments"
           and not m.__file__.startswith({str(site)!r})]
print(json.dumps({{"json_text": res["json_text"], "mods": mods, "outside": outside, "text": details["text"]}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def test_the_shipped_zip_runs_the_doctor_without_torch_numpy_or_matplotlib_and_holds_nothing_else(tmp_path):
    page = _ext("doctor_page")
    name = "training.json"
    (tmp_path / name).write_text(json.dumps(SNAPSHOTS["training"]))
    got = _unzip_and_run(tmp_path, name, WHAT_IFS)
    assert not got["outside"], f"modules imported from outside the zip: {got['outside']}"
    assert got["json_text"] == cli(tmp_path, _cli_args(name, suggest=False)).stdout
    assert "the same requests under each setting" in got["text"]
    names = zipfile.ZipFile(io.BytesIO(page.doctor_zip())).namelist()
    shipped = sorted(n[:-len(".py")].replace("/", ".").removesuffix(".__init__") for n in names if n.startswith("experiments/"))
    assert shipped == got["mods"], "the zip must hold exactly the modules a run imports"
    assert set(names) - {f"{m.replace('.', '/')}.py" for m in shipped} - {f"{m.replace('.', '/')}/__init__.py" for m in shipped} \
        == {"doctor_worker.py"}
    assert page.doctor_zip() == page.doctor_zip(), "the same sources must give the same zip (and file name)"
    assert not [n for n in names if n.startswith("experiments/doctor/lab/")], "the doctor's GPU lab is never shipped"
    assert "experiments/doctor/model/engine.py" in names and "experiments/doctor/answers/progress.py" in names


def test_the_module_finder_leaves_out_what_needs_torch(tmp_path, monkeypatch):
    page = _ext("doctor_page")
    pkg = tmp_path / "experiments"
    (pkg / "doctor").mkdir(parents=True)
    (pkg / "core").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "core" / "__init__.py").write_text("")
    (pkg / "core" / "units.py").write_text("MiB = 2**20\n")
    (pkg / "core" / "device.py").write_text("import torch\n")
    (pkg / "core" / "plotting.py").write_text("from .units import MiB\nimport matplotlib.pyplot as plt\n")
    (pkg / "doctor" / "__init__.py").write_text("from ..core.units import MiB\n")
    (pkg / "doctor" / "cli.py").write_text("def f():\n    from ..core.plotting import plt\n")
    (pkg / "doctor" / "bad.py").write_text("from ..core import device\n")
    # the package's torch on first use: its own source imports torch only inside a function
    (pkg / "core" / "lazy_torch.py").write_text("def load():\n    import torch\n")
    (pkg / "core" / "measure.py").write_text("from .lazy_torch import torch\n")
    (pkg / "doctor" / "timing.py").write_text("from ..core.units import MiB\n\ndef f():\n    from ..core import measure\n")
    (pkg / "doctor" / "bad_too.py").write_text("from ..core.measure import torch\n")
    monkeypatch.setattr(page, "ROOT", tmp_path)
    assert page.doctor_modules(("experiments.doctor", "experiments.doctor.cli", "experiments.doctor.timing")) == \
        ["experiments", "experiments.core", "experiments.core.units", "experiments.doctor", "experiments.doctor.cli",
         "experiments.doctor.timing"]
    for bad in ("experiments.doctor.bad", "experiments.doctor.bad_too"):
        with pytest.raises(page.ShipError, match="cannot be imported without"):
            page.doctor_modules((bad,))


def test_pins_and_what_the_page_states_agree():
    page = _ext("doctor_page")
    version = page.pyodide_version()
    lock = json.loads((ROOT / "package-lock.json").read_text())
    assert lock["packages"]["node_modules/pyodide"]["version"] == version == "314.0.7"
    assert lock["packages"][""]["dependencies"]["pyodide"] == version
    text = " ".join((ROOT / "book" / "snapshot_check.md").read_text().split())
    assert f"[Pyodide](https://pyodide.org/) {version}," in text, "the page names the Pyodide version it ships"
    assert page.LIMIT_MB >= 200 and f"up to {page.LIMIT_MB} MB" in text
    toc = (ROOT / "_toc.yml").read_text()
    assert "book/snapshot_check" in toc


def test_pyodide_ships_only_its_runtime_and_a_lock_without_packages():
    page = _ext("doctor_page")
    lock = json.loads((page.pyodide_dir() / "pyodide-lock.json").read_text())
    empty = page.empty_lock(lock)
    assert empty["packages"] == {} and empty["info"]["python"].startswith("3.14")
    assert set(page.PYODIDE_FILES) == {"pyodide.mjs", "pyodide.asm.mjs", "pyodide.asm.wasm", "python_stdlib.zip"}


# ----------------------------------------------------------------------------- in the browser

class Tab:
    """The doctor page in a fresh browser context: only the test server reachable; every request,
    its method and its body size recorded."""

    def __init__(self, browser, origin: str, viewport=None, context=None):
        self.own = context is None
        self.context = context or browser.new_context(viewport=viewport or {"width": 1280, "height": 900},
                                                       device_scale_factor=1, accept_downloads=True)
        self.origin = origin
        self.requests: list[tuple[str, str]] = []
        self.outside: list[str] = []
        self.bytes: dict[str, int] = {}
        self.problems: list[str] = []
        host = urllib.parse.urlsplit(origin).netloc
        if self.own:
            def route(r):
                if urllib.parse.urlsplit(r.request.url).netloc == host:
                    r.continue_()
                else:
                    r.abort("internetdisconnected")
            self.context.route("**/*", route)
        self.context.on("request", lambda r: self._saw(r, host))
        self.context.on("requestfinished", lambda r: self.bytes.__setitem__(r.url, r.sizes()["responseBodySize"]))
        self.page = self.context.new_page()
        self.page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))
        self.page.on("console", lambda m: m.type == "error" and self.problems.append(f"console: {m.text}"))
        self.page.goto(f"{origin}/{PAGE}", wait_until="load")

    def _saw(self, r, host):
        self.requests.append((r.method, r.url))
        if urllib.parse.urlsplit(r.url).netloc != host and not r.url.startswith(("data:", "blob:")):
            self.outside.append(r.url)

    def drop(self, path: Path, timeout_s: float = 180, until: str = "done") -> dict:
        """Pick ``path`` with the page's file input; wait for the first result (``until="result"``)
        or for the details too, or an error. Returns the page's dataset (timings, state) and error text."""
        root = self.page.locator("#memlab-doctor")
        root.evaluate("e => { delete e.dataset.state; delete e.dataset.firstResultSeconds }")
        self.page.set_input_files("#memlab-doctor-file", str(path))
        done = "[data-state=done]" if until == "done" else "[data-first-result-seconds]"
        self.page.wait_for_selector(f"#memlab-doctor{done}, .memlab-doctor-error:not([hidden])",
                                    timeout=timeout_s * 1000)
        err = self.page.locator(".memlab-doctor-error")
        return {**root.evaluate("e => ({...e.dataset})"), "error": err.inner_text() if err.is_visible() else None}

    def downloaded_json(self) -> str:
        with self.page.expect_download() as d:
            self.page.locator(".memlab-doctor-download").click()
        return Path(d.value.path()).read_text()

    def close(self):
        if self.own:
            self.context.close()


def _set_what_ifs(page, ticked: list[str], other: list[str], cap_gib: float | None = None, suggest: bool = True):
    for box in page.locator(".memlab-doctor-check input[type=checkbox]").all():
        if box.get_attribute("id") == "memlab-doctor-suggest":
            box.set_checked(suggest)
            continue
        box.set_checked(box.get_attribute("value") in ticked)
    page.fill("#memlab-doctor-other", "\n".join(other))
    page.fill("#memlab-doctor-cap", "" if cap_gib is None else str(cap_gib))


@pytest.fixture(scope="module")
def doctor_tab(browser, site):
    tab = Tab(browser, site["origin"])
    # ticked presets in the page's order, then the typed lines: WHAT_IFS
    _set_what_ifs(tab.page, WHAT_IFS[:3], WHAT_IFS[3:])
    yield tab
    tab.close()


def transfer_bytes(site_dir: Path, origin: str, urls) -> tuple[int, int]:
    """(bytes as stored, bytes gzip'd as a web host sends text) of the site's files at ``urls``."""
    import gzip

    raw = packed = 0
    for u in set(urls):
        path = site_dir / urllib.parse.unquote(urllib.parse.urlsplit(u).path).lstrip("/")
        data = path.read_bytes()
        raw += len(data)
        packed += min(len(data), len(gzip.compress(data, 6)))
    return raw, packed


def test_the_worker_hands_over_the_replay_the_what_ifs_and_each_grid_setting_before_the_whole_answer(tmp_path):
    """What the page shows while the doctor runs (doctor_worker.run's ``partial``): the recorded
    run, then the what-ifs (the command line's answer without --suggest, byte for byte), then
    each setting of the grid as it finishes; each agrees with the whole answer that follows."""
    worker = _ext("doctor_worker")
    name = "loader_capped.pickle.gz"
    (tmp_path / name).write_bytes((ROOT / "benchmarks" / "data" / "doctor_cases" / name).read_bytes())
    got = []
    res = worker.run(str(tmp_path / name), WHAT_IFS[:2], suggest=True,
                     partial=lambda kind, text: got.append((kind, json.loads(text))))
    assert res["ok"], res
    kinds = [k for k, _ in got]
    assert kinds[:3] == ["replay", "early", "details"] and set(kinds[3:]) == {"grid"}, kinds
    replay, early = got[0][1], got[1][1]
    assert replay["pending"] == WHAT_IFS[:2] and replay["json"]["replay"] == res["json"]["replay"]
    assert replay["figure"]["runs"] == res["figure"]["runs"][:1]
    plain = cli(tmp_path, _cli_args(name, WHAT_IFS[:2], suggest=False))
    assert plain.returncode == 0 and early["json_text"] == plain.stdout
    assert early["grid"] == "suggest" and early["figure"] == res["figure"]
    rows = {r["settings"]: r for r in res["json"]["suggestion"]["rows"]}
    grid = [g for k, g in got if k == "grid"]
    assert [g["index"] for g in grid] == list(range(len(rows))) and {g["settings"] for g in grid} == set(rows)
    for g in grid:
        if g["settings"] != res["json"]["settings"]:   # the recorded setting's row is the exact replay's
            assert {k: v for k, v in g["row"].items() if k in rows[g["settings"]]} == rows[g["settings"]], g


@pytest.mark.slow
def test_before_a_drop_the_page_is_light_and_loads_no_python(browser, site):
    tab = Tab(browser, site["origin"])
    try:
        tab.page.wait_for_timeout(1500)
        raw, sent = transfer_bytes(site["dir"], site["origin"], tab.bytes)
        own = transfer_bytes(site["dir"], site["origin"], [u for u in tab.bytes if "doctor" in u.rsplit("/", 1)[-1]])
        print(f"doctor page before a drop: {sent / 1e3:.0f} kB sent gzip'd ({raw / 1e3:.0f} kB stored) in "
              f"{len(tab.bytes)} requests; the page's own script and styles {own[0] / 1e3:.1f} kB")
        assert sent <= 1_000_000, f"{sent} bytes before a drop"
        assert own[0] <= 60_000, f"the page's own files weigh {own[0]} bytes"
        assert not [u for _, u in tab.requests if "pyodide" in u or "/doctor/" in u or "doctor-worker" in u]
        assert not tab.outside and not tab.problems, tab.outside + tab.problems
        config = tab.page.evaluate("() => window.memlabDoctor")
        assert config["limitBytes"] >= 200e6
    finally:
        tab.close()


@pytest.mark.slow
@pytest.mark.parametrize("protocol", [5])
def test_dropped_snapshots_give_the_clis_json(doctor_tab, tmp_path, protocol):
    folder = tmp_path / "snaps"
    folder.mkdir()
    checked = 0
    for workload in WORKLOADS:
        name = f"{workload}.json"
        (folder / name).write_text(json.dumps(SNAPSHOTS[workload]))
        got = doctor_tab.drop(folder / name)
        assert got["error"] is None, f"{workload}: {got['error']}"
        want = cli(folder, _cli_args(name))
        assert want.returncode == 0, want.stderr
        assert doctor_tab.downloaded_json() == want.stdout, f"{workload}: the page's JSON differs from the CLI's"
        checked += 1
    # torch's own form, a pickle of the protocol Python 3.14 writes by default, with frames
    pick = folder / "training_torch.pickle"
    pick.write_bytes(pickle.dumps(torch_form(SNAPSHOTS["training"]), protocol=protocol))
    assert pick.read_bytes()[1] == protocol
    got = doctor_tab.drop(pick)
    assert got["error"] is None, got["error"]
    assert doctor_tab.downloaded_json() == cli(folder, _cli_args(pick.name)).stdout
    # gzip'd, as the command line also reads it
    gz = folder / "training_torch.pickle.gz"
    import gzip

    gz.write_bytes(gzip.compress(pick.read_bytes()))
    got = doctor_tab.drop(gz)
    assert got["error"] is None, got["error"]
    assert doctor_tab.downloaded_json() == cli(folder, _cli_args(gz.name)).stdout
    # and a cap for the what-ifs
    _set_what_ifs(doctor_tab.page, WHAT_IFS[:3], WHAT_IFS[3:], cap_gib=CAP_GIB)
    try:
        got = doctor_tab.drop(folder / "cap.json")
        assert got["error"] is None, got["error"]
        assert doctor_tab.downloaded_json() == cli(folder, _cli_args("cap.json", cap_bytes=int(CAP_GIB * 2**30))).stdout
    finally:
        _set_what_ifs(doctor_tab.page, WHAT_IFS[:3], WHAT_IFS[3:])
    assert checked >= 5
    assert not doctor_tab.outside, f"requests to other sites: {doctor_tab.outside}"
    assert {m for m, _ in doctor_tab.requests} == {"GET"}, "the page sent something"
    assert not doctor_tab.problems, doctor_tab.problems


@pytest.mark.slow
def test_bad_files_show_the_clis_one_line_error(doctor_tab, tmp_path):
    files = bad_files(tmp_path / "bad")
    for name, path in files.items():
        got = doctor_tab.drop(path)
        want = cli(path.parent, _cli_args(name))
        assert want.returncode == 2, (name, want.stdout)
        assert got["error"] == want.stderr.strip(), name
        assert "\n" not in got["error"]
        assert not doctor_tab.page.locator(".memlab-doctor-results").is_visible(), f"{name}: a result is still shown"
    assert not (tmp_path / "bad" / "pwned").exists()
    assert not doctor_tab.outside and not doctor_tab.problems, doctor_tab.outside + doctor_tab.problems


@pytest.mark.slow
def test_a_file_over_the_limit_is_sent_to_the_cli_without_loading_python(browser, site, tmp_path):
    tab = Tab(browser, site["origin"])
    try:
        path = tmp_path / "big.pickle"
        path.write_bytes(b"\x80\x05" + bytes(4096))
        # the real limit is 256 MB; the page reads it from its config, lowered here for the test
        tab.page.evaluate("() => { window.memlabDoctor.limitBytes = 4000 }")
        tab.page.set_input_files("#memlab-doctor-file", str(path))
        err = tab.page.locator(".memlab-doctor-error")
        err.wait_for(state="visible", timeout=5000)
        text = err.inner_text()
        assert text.startswith("error: big.pickle is ") and "python -m experiments doctor big.pickle" in text
        tab.page.wait_for_timeout(500)
        assert not [u for _, u in tab.requests if "pyodide" in u], "Python was loaded for a file it cannot take"
    finally:
        tab.close()


def _unless_overloaded(measured: str) -> None:
    """Timing targets hold for the 2-core machine running the tests alone (as CI does); with more
    than 1.5 runnable jobs a core (other builds on a shared machine) they are measured, not held."""
    import os

    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if load > 1.5 * cores:
        pytest.skip(f"the machine is shared (load {load:.1f} on {cores} cores): {measured}, target not held")


@pytest.mark.slow
def test_time_to_first_result_with_pyodide_cached(browser, site, tmp_path):
    """On a ~8k-event snapshot (training, torch's pickle form) with the page's own settings
    (expandable_segments:True and the suggestion's grid): at most 5 s from the drop to the
    first result once the browser has Pyodide in its cache (the 2-core CI machine's chromium)."""
    pick = tmp_path / "training.pickle"
    pick.write_bytes(pickle.dumps(torch_form(SNAPSHOTS["training"]), protocol=5))
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    host = urllib.parse.urlsplit(site["origin"]).netloc
    context.route("**/*", lambda r: r.continue_() if urllib.parse.urlsplit(r.request.url).netloc == host
                  else r.abort("internetdisconnected"))
    try:
        cold = Tab(browser, site["origin"], context=context)
        first = cold.drop(pick)
        assert first["error"] is None, first["error"]
        cold.page.close()
        times = []
        for _ in range(2):
            warm = Tab(browser, site["origin"], context=context)
            t0 = time.perf_counter()
            got = warm.drop(pick)
            assert got["error"] is None, got["error"]
            times.append((float(got["firstResultSeconds"]), time.perf_counter() - t0, got["pyodideMarks"]))
            warm.page.close()
        print(f"first result, cold: {first['firstResultSeconds']} s; cached: "
              + "; ".join(f"{a:.2f} s (wall {b:.2f} s; steps ms {m})" for a, b, m in times))
        _unless_overloaded(f"first result with Pyodide cached {min(t for t, _, _ in times):.2f} s")
        assert min(t for t, _, _ in times) <= 5.0, times
    finally:
        context.close()


EXTRA = {"oom_explanation": "The request of 2 GiB at trace event 7 found 1.5 GiB free in 3 segments.",
         "suggest": [{"settings": "expandable_segments:True", "peak_reserved_bytes": 1 << 30, "oom_events": 0}]}


def _zip_with_extra_sections() -> bytes:
    """The shipped zip with Report.to_json adding sections it does not have yet (:data:`EXTRA`)."""
    page = _ext("doctor_page")
    src = zipfile.ZipFile(io.BytesIO(page.doctor_zip()))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name in src.namelist():
            data = src.read(name)
            if name == "experiments/doctor/answers/report.py":
                data += (f"\n\n_page_test_to_json = Report.to_json\n"
                         f"Report.to_json = lambda self: {{**{EXTRA!r}, **_page_test_to_json(self)}}\n").encode()
            z.writestr(name, data)
    return out.getvalue()


@pytest.mark.slow
def test_without_the_memory_snapshot_python_starts_the_plain_way_and_new_sections_are_shown(browser, site, tmp_path):
    """The snapshot is an optimisation (a private Pyodide API): if it cannot be had, the same
    answers. The doctor's --json may grow sections (suggestions, an OOM explanation): the page
    shows what it is given; here the zip is served with two added, which the memory snapshot
    would not know, hence the plain start."""
    context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    host = urllib.parse.urlsplit(site["origin"]).netloc
    patched = _zip_with_extra_sections()

    def route(r):
        parts = urllib.parse.urlsplit(r.request.url)
        if parts.netloc == host and "/_static/doctor/doctor-py-" in parts.path:
            r.fulfill(status=200, body=patched, content_type="application/zip")
        elif parts.netloc == host and "pyodide-snapshot-" not in parts.path:
            r.continue_()
        else:
            r.abort("internetdisconnected")

    context.route("**/*", route)
    try:
        tab = Tab(browser, site["origin"], context=context)
        name = "training.json"
        (tmp_path / name).write_text(json.dumps(SNAPSHOTS["training"]))
        got = tab.drop(tmp_path / name)
        assert got["error"] is None, got["error"]
        marks = json.loads(got["pyodideMarks"])
        assert marks["snapshot"] is False and marks.get("snapshotError"), marks
        page_json = json.loads(tab.downloaded_json())
        cli_json = json.loads(cli(tmp_path, _cli_args(name, WHAT_IFS[:1])).stdout)
        for key, value in EXTRA.items():
            assert page_json.pop(key) == cli_json.pop(key, value)
        assert page_json == cli_json
        shown = {s.get_attribute("data-key"): s.inner_text() for s in tab.page.locator(".memlab-doctor-extra").all()}
        assert "found 1.5 GiB free in 3 segments" in shown["oom_explanation"]
        assert "expandable_segments:True" in shown["suggest"] and "1 GiB" in shown["suggest"]
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        tab.page.locator(".memlab-doctor-results").screenshot(path=str(SCREENSHOTS / "snapshot_check-sections.png"))
        print(f"plain start: {marks['python'] / 1000:.1f} s to Python, first result {got['firstResultSeconds']} s")
    finally:
        context.close()


LONG_TRACE = ROOT / "benchmarks" / "data" / "doctor_cases" / "eager_long.pickle.gz"


def long_snapshot(folder: Path) -> Path:
    """The lab's real 450k-event trace: the eager training loop of alloc.doctor_cases, recorded
    on the H200 (gzip'd pickle, kept in the repository where recording writes it)."""
    assert LONG_TRACE.exists(), f"{LONG_TRACE} is missing: `python -m experiments record --experiment alloc.doctor_cases` writes it"
    return LONG_TRACE


WHAT_IF_LIMIT_S = 12.0   # per what-if on the 450k-event snapshot, chromium on the 2-core machine (about 4 s when it is not shared)


@pytest.mark.slow
def test_time_per_what_if_on_a_450k_event_snapshot(browser, site, tmp_path):
    path = long_snapshot(tmp_path)
    tab = Tab(browser, site["origin"])
    try:
        _set_what_ifs(tab.page, ["expandable_segments:True", "max_split_size_mb:128"], [], suggest=False)
        tab.page.set_input_files("#memlab-doctor-file", str(path))
        # While Python works, the page answers at once and says how far the run is.
        stages, slowest, t0 = set(), 0.0, time.perf_counter()
        while not tab.page.locator("#memlab-doctor[data-first-result-seconds], .memlab-doctor-error:not([hidden])").count():
            t = time.perf_counter()
            stages.add(tab.page.evaluate("() => document.querySelector('.memlab-doctor-status-text').textContent"
                                         ".replace(/ \u2026.*/, '')"))
            slowest = max(slowest, time.perf_counter() - t)
            assert time.perf_counter() - t0 < 300, "no result after 300 s"
            tab.page.wait_for_timeout(100)
        got = {**tab.page.locator("#memlab-doctor").evaluate("e => ({...e.dataset})"), "error": None}
        assert not tab.page.locator(".memlab-doctor-error").is_visible(), tab.page.locator(".memlab-doctor-error").inner_text()
        assert {"reading the snapshot", "replaying the recorded run", "what-if 1 of 2: expandable_segments:True",
                "what-if 2 of 2: max_split_size_mb:128"} <= stages, stages
        secs = json.loads(got["seconds"])
        print(f"{path.name} ({path.stat().st_size / 1e6:.0f} MB): first result {got['firstResultSeconds']} s, "
              f"replay {secs['replay']:.1f} s, what-ifs {', '.join(f'{t:.1f} s' for t in secs['what_if'])}")
        assert json.loads(tab.page.locator(".memlab-doctor-results").get_attribute("data-json"))["trace_events"] >= 450_000
        assert len(secs["what_if"]) == 2
        assert not tab.outside and not tab.problems, tab.outside + tab.problems
        _unless_overloaded(f"what-ifs {secs['what_if']} s, the page answered within {slowest:.2f} s")
        assert slowest < 0.5, f"the page took {slowest:.2f} s to answer while the doctor ran"
        assert max(secs["what_if"]) <= WHAT_IF_LIMIT_S, secs
        assert not tab.outside and not tab.problems, tab.outside + tab.problems
    finally:
        tab.close()



@pytest.mark.slow
@pytest.mark.parametrize("width", [1280, 390])
def test_a_result_fits_the_screen_and_is_screenshotted(browser, site, tmp_path, width):
    tab = Tab(browser, site["origin"], viewport={"width": width, "height": 900})
    try:
        _set_what_ifs(tab.page, WHAT_IFS[:2], [])
        pick = tmp_path / "training.pickle"
        pick.write_bytes(pickle.dumps(torch_form(SNAPSHOTS["training"]), protocol=5))
        got = tab.drop(pick)
        assert got["error"] is None, got["error"]
        tab.page.evaluate("() => { document.activeElement && document.activeElement.blur(); window.scrollTo(0, 0) }")
        tab.page.wait_for_timeout(300)
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        tab.page.screenshot(path=str(SCREENSHOTS / f"snapshot_check-{width}.png"), full_page=True)
        wide = tab.page.evaluate(f"""() => [...document.querySelectorAll('article *')]
            .filter(e => e.getBoundingClientRect().right > {width} + 1 && getComputedStyle(e).position !== 'fixed')
            .filter(e => !e.closest('.memlab-scroll, .highlight, pre'))
            .slice(0, 5).map(e => e.tagName + '.' + e.className)""")
        assert tab.page.evaluate("() => document.documentElement.scrollWidth") <= width and not wide, wide
        svgs = tab.page.locator(".memlab-doctor-results svg")
        assert svgs.count() == 2, "the timeline and the segment map are drawn"
        for i in range(2):
            box = svgs.nth(i).bounding_box()
            assert box["width"] > 0.8 * min(width, 688) - 40 and box["height"] > 60, box
        lines = tab.page.locator(".memlab-doctor-results svg polyline.memlab-doctor-reserved").count()
        assert lines == 3, "one reserved line per setting: the recorded run and two what-ifs"
        assert not tab.problems, tab.problems
    finally:
        tab.close()


@pytest.mark.slow
def test_the_download_sizes_the_page_states_are_what_the_site_ships(site):
    import gzip
    import re

    files = [f for d in (*site["dir"].glob("_static/pyodide-*"), site["dir"] / "_static" / "doctor") for f in d.iterdir()]
    stored = sum(f.stat().st_size for f in files)
    sent = sum(min(f.stat().st_size, len(gzip.compress(f.read_bytes(), 6))) for f in files)
    text = " ".join((ROOT / "book" / "snapshot_check.md").read_text().split())
    m = re.search(r"about (\d+) MB over the network the first time \((\d+) MB where the host compresses", text)
    assert m, "the page states what it downloads"
    print(f"shipped for the page: {stored / 1e6:.1f} MB stored, {sent / 1e6:.1f} MB gzip'd, in {len(files)} files")
    assert abs(int(m.group(1)) - stored / 1e6) <= 1 and abs(int(m.group(2)) - sent / 1e6) <= 1, (m.groups(), stored, sent)
