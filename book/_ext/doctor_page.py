"""The page "Check your own snapshot": the allocator doctor, run in the reader's browser.

This Sphinx extension ships what that one page needs into the built site and adds its script
and styles to that page only (every other page's weight stays as it was):

- ``_static/pyodide-<version>/``: Pyodide, the CPython build for WebAssembly, copied unchanged
  from the npm registry's ``pyodide`` package (pinned in ``package.json`` / ``package-lock.json``;
  ``make book`` runs ``npm ci``): ``pyodide.mjs``, ``pyodide.asm.mjs``, ``pyodide.asm.wasm``,
  ``python_stdlib.zip``, and a lock file that lists no package (the page loads none, so
  Pyodide never asks its CDN for one);
- ``_static/doctor/doctor-py-<hash>.zip``: the doctor's Python files (:func:`doctor_zip`: the
  package ``experiments.doctor`` and the modules it imports that run without torch, numpy or
  matplotlib) and ``doctor_worker.py``, the page's Python half;
- ``_static/doctor/pyodide-snapshot-<hash>.bin``: Pyodide's memory after starting Python and
  importing the doctor (:func:`memory_snapshot`), which the worker restores in well under a
  second where a plain start takes several on a 2-core machine; without it (or if it fails)
  the worker starts Python the plain way;
- on the page: ``doctor-page.js`` (the controls, the progress, the figure as SVG),
  ``doctor.css``, and ``window.memlabDoctor``, the paths and the file size limit. The worker
  (``doctor-worker.mjs``) fetches Pyodide and the zip only when the reader picks a file.
"""
from __future__ import annotations

import ast
import gzip
import hashlib
import io
import json
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
HERE = Path(__file__).resolve().parent
NODE_PYODIDE = ROOT / "node_modules" / "pyodide"
PAGE = "book/snapshot_check"                 # the page's docname
PYODIDE_FILES = ("pyodide.mjs", "pyodide.asm.mjs", "pyodide.asm.wasm", "python_stdlib.zip")
LIMIT_MB = 256                               # the largest file the page takes (the page says so)
ENTRY_MODULES = ("experiments.doctor", "experiments.doctor.cli")
NOT_SHIPPED = ("experiments.doctor.answers.figure",)   # the notebook's matplotlib figure: the page draws its own
# Imports that do not exist in the page's Python: a module that needs one at import time
# stays out of the zip (e.g. the notebook figure's plotting module).
UNAVAILABLE = ("torch", "numpy", "matplotlib", "IPython", "ipywidgets", "jsonschema", "tqdm", "PIL")
# The package's own stand-in for torch (imported on first use): a module that takes torch from it
# needs torch as much as one that imports torch itself.
STANDS_FOR_UNAVAILABLE = ("experiments.core.lazy_torch",)


class ShipError(RuntimeError):
    """What the page needs cannot be shipped (the message says what to run)."""


def pyodide_version() -> str:
    """The Pyodide version that package.json pins (exactly, as ``"pyodide": "X.Y.Z"``)."""
    pin = json.loads((ROOT / "package.json").read_text())["dependencies"]["pyodide"]
    if not pin[:1].isdigit():
        raise ShipError(f"package.json must pin pyodide to one exact version, got {pin!r}")
    return pin


def pyodide_dir() -> Path:
    """``node_modules/pyodide`` after ``npm ci``, checked against the pin.

    Raises:
        ShipError: missing, incomplete, or another version than package.json pins.
    """
    want = pyodide_version()
    meta = NODE_PYODIDE / "package.json"
    if not meta.exists():
        raise ShipError(f"{NODE_PYODIDE} is missing: run `make book` (it runs `npm ci`, which fetches "
                        f"pyodide {want} from the npm registry)")
    got = json.loads(meta.read_text())["version"]
    if got != want:
        raise ShipError(f"node_modules has pyodide {got}, package.json pins {want}: run `npm ci`")
    missing = [f for f in PYODIDE_FILES + ("pyodide-lock.json",) if not (NODE_PYODIDE / f).exists()]
    if missing:
        raise ShipError(f"the pyodide package lacks {missing}: run `npm ci`")
    return NODE_PYODIDE


def empty_lock(lock: dict) -> dict:
    """Pyodide's lock file with its platform ``info`` and no package: the page loads none."""
    return {"info": lock["info"], "packages": {}}


# ----------------------------------------------------------------------------- the doctor's files

def _module_path(name: str) -> Path | None:
    base = ROOT.joinpath(*name.split("."))
    if (base / "__init__.py").exists():
        return base / "__init__.py"
    if base.with_suffix(".py").exists():
        return base.with_suffix(".py")
    return None


def _imports(name: str, path: Path) -> tuple[set[str], set[str], set[str]]:
    """(package modules imported at import time, those imported inside functions, outside
    top-level packages imported at import time) of one module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    top_nodes = set()
    for node in tree.body:
        # import time: the module body, including its if/try blocks, but not function bodies
        stack = [node]
        while stack:
            n = stack.pop()
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            top_nodes.add(id(n))
            stack.extend(ast.iter_child_nodes(n))
    top, lazy, outside = set(), set(), set()
    for node in ast.walk(tree):
        found, ext = set(), set()
        if isinstance(node, ast.Import):
            for a in node.names:
                (found if a.name.split(".")[0] == "experiments" else ext).add(a.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                target = ".".join(parts[: len(parts) - (node.level - 1)] + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "experiments":
                ext.add(target)
            else:
                found.add(target)
                found |= {f"{target}.{a.name}" for a in node.names if _module_path(f"{target}.{a.name}")}
        if id(node) in top_nodes:
            top |= found
            outside |= {e.split(".")[0] for e in ext if e}
        else:
            lazy |= found
    return {m for m in top if _module_path(m)}, {m for m in lazy if _module_path(m)}, outside


def _parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def doctor_modules(entries: tuple[str, ...] = ENTRY_MODULES) -> list[str]:
    """The package's modules the doctor can import in the page's Python, found from the source.

    Starting from ``entries``, every module they import (at import time or inside a function)
    is followed; a module that needs one of :data:`UNAVAILABLE` at import time, directly or
    through another module (or takes it from :data:`STANDS_FOR_UNAVAILABLE`), is left out with
    what it leads to (it could not run there), and so
    is a module that only such a module leads to, and :data:`NOT_SHIPPED`. Parent packages'
    ``__init__`` are included.

    Raises:
        ShipError: an entry module is missing or cannot be imported without torch/numpy/matplotlib.
    """
    info: dict[str, tuple[set[str], set[str], set[str]]] = {}

    def scan(name: str) -> tuple[set[str], set[str], set[str]]:
        if name not in info:
            path = _module_path(name)
            if path is None:
                raise ShipError(f"module {name} not found under {ROOT}")
            info[name] = _imports(name, path)
        return info[name]

    viable: dict[str, bool] = {}

    def ok(name: str, seen: frozenset = frozenset()) -> bool:
        if name in viable:
            return viable[name]
        if name in seen:
            return True  # a cycle: decided by its other imports
        top, _, outside = scan(name)
        good = name not in STANDS_FOR_UNAVAILABLE and not (outside & set(UNAVAILABLE)) and all(
            ok(m, seen | {name}) for m in top | set(_parents(name)))
        viable[name] = good
        return good

    for e in entries:
        if not ok(e):
            raise ShipError(f"{e} cannot be imported without one of {UNAVAILABLE}: the page cannot run it")
    keep, todo = set(), list(entries)
    while todo:
        name = todo.pop()
        if name in keep or name in NOT_SHIPPED or not ok(name):
            continue
        keep.add(name)
        top, lazy, _ = scan(name)
        todo += sorted(top | lazy | set(_parents(name)))
    return sorted(keep)


def doctor_zip() -> bytes:
    """The zip the page's worker unpacks: :func:`doctor_modules`' sources under their package
    paths, and ``doctor_worker.py`` at the top. The same sources give the same bytes."""
    files = {str(_module_path(m).relative_to(ROOT)): _module_path(m) for m in doctor_modules()}
    files["doctor_worker.py"] = HERE / "doctor_worker.py"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        for arc in sorted(files):
            info = zipfile.ZipInfo(arc, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            z.writestr(info, files[arc].read_bytes(), compress_type=zipfile.ZIP_DEFLATED)
    return buf.getvalue()


# ----------------------------------------------------------------------------- Sphinx

def memory_snapshot(zip_data: bytes) -> Path:
    """Pyodide's memory snapshot with the doctor imported (``doctor_snapshot.mjs``, run by Node),
    kept in ``node_modules/.cache/`` under a key of the Pyodide version, the zip and the script.

    Raises:
        ShipError: no Node.js, or the script failed.
    """
    script = HERE / "doctor_snapshot.mjs"
    key = hashlib.sha256(pyodide_version().encode() + zip_data + script.read_bytes()).hexdigest()[:12]
    out = ROOT / "node_modules" / ".cache" / "memlab-doctor" / f"pyodide-snapshot-{key}.bin"
    if out.exists():
        return out
    node = shutil.which("node")
    if node is None:
        raise ShipError("Node.js is needed to prepare Pyodide's start (it comes with npm; Debian: apt-get install npm)")
    out.parent.mkdir(parents=True, exist_ok=True)
    for old in out.parent.glob("pyodide-snapshot-*.bin"):
        old.unlink()
    zpath = out.with_suffix(".zip")
    zpath.write_bytes(zip_data)
    try:
        r = subprocess.run([node, str(script), str(pyodide_dir()), str(zpath), str(out)],
                           capture_output=True, text=True, timeout=600)
    finally:
        zpath.unlink()
    if r.returncode != 0 or not out.exists():
        raise ShipError(f"{script.name} failed: {(r.stderr or r.stdout)[-2000:]}")
    # gzip'd here, not left to the web server: hosts compress text, not .bin (31 MB -> 7 MB). The
    # worker looks at the first bytes, so a host that decompresses it on the way does no harm.
    raw = out.read_bytes()
    tmp = out.with_suffix(".tmp")
    tmp.write_bytes(gzip.compress(raw, compresslevel=6, mtime=0))
    tmp.replace(out)
    return out


def _builder_inited(app):
    if app.builder.format != "html":
        return
    try:
        pyodide_dir()
        data = doctor_zip()
        snapshot = memory_snapshot(data)
    except ShipError as e:
        from sphinx.errors import ExtensionError

        raise ExtensionError(f"the page {PAGE}: {e}") from None
    app.memlab_doctor_zip = (f"doctor-py-{hashlib.sha256(data).hexdigest()[:12]}.zip", data)
    app.memlab_doctor_snapshot = snapshot
    # What the command line offers (--suggest appeared after the page): the controls follow it.
    import doctor_worker

    app.memlab_doctor_options = doctor_worker.options()


# Other extensions' files that every page loads and this one does not use (it has no toggles,
# no sphinx-design tabs, no notebook cells, no live code, no exercises): left out here, so the
# page's first load stays under 1 MB with the theme's 975 kB.
UNUSED_HERE = re.compile(r"(^|/)(togglebutton\.(js|css)|design-tabs\.js|sphinx-design\.min\.css|mystnb\.[0-9a-f]+\.css"
                         r"|sphinx-thebe\.(js|css)|exercise\.css)$")


def _asset_name(asset) -> str:
    return str(getattr(asset, "filename", asset) or "").split("?")[0]


def download_bytes(app) -> int:
    """Bytes the page's worker fetches at the first file, as the site stores them: what a host
    that compresses nothing sends, the most any host sends, and the figure the page states."""
    files = [pyodide_dir() / f for f in PYODIDE_FILES] + [app.memlab_doctor_snapshot]
    return sum(f.stat().st_size for f in files) + len(app.memlab_doctor_zip[1])


def _page_context(app, pagename, templatename, context, doctree):
    if pagename != PAGE or not hasattr(app, "memlab_doctor_zip"):
        return
    # In place: these lists are the builder's own, which it restores after this page.
    for key in ("script_files", "css_files"):
        files = context.get(key)
        if isinstance(files, list):
            files[:] = [a for a in files if not UNUSED_HERE.search(_asset_name(a))]
    config = {"pyodide": f"pyodide-{pyodide_version()}/", "zip": f"doctor/{app.memlab_doctor_zip[0]}",
              "snapshot": f"doctor/{app.memlab_doctor_snapshot.name}",
              "worker": "doctor-worker.mjs", "limitBytes": LIMIT_MB * 1000 * 1000, "pyodideVersion": pyodide_version(),
              "options": app.memlab_doctor_options, "downloadBytes": download_bytes(app)}
    # Called in html-page-context, add_js_file/add_css_file add to this page only.
    app.add_js_file(None, body="window.memlabDoctor = " + json.dumps(config) + ";")
    app.add_js_file("doctor-page.js", defer="defer")
    app.add_css_file("doctor.css")


def _build_finished(app, exception):
    if exception is not None or not hasattr(app, "memlab_doctor_zip"):
        return
    static = Path(app.outdir) / "_static"
    src = pyodide_dir()
    dest = static / f"pyodide-{pyodide_version()}"
    dest.mkdir(parents=True, exist_ok=True)
    for name in PYODIDE_FILES:
        shutil.copyfile(src / name, dest / name)
    lock = empty_lock(json.loads((src / "pyodide-lock.json").read_text()))
    (dest / "pyodide-lock.json").write_text(json.dumps(lock))
    zdir = static / "doctor"
    shutil.rmtree(zdir, ignore_errors=True)
    zdir.mkdir(parents=True)
    name, data = app.memlab_doctor_zip
    (zdir / name).write_bytes(data)
    shutil.copyfile(app.memlab_doctor_snapshot, zdir / app.memlab_doctor_snapshot.name)


def _outdated(app, env, added, changed, removed):
    # The page names the zip by its hash, which changes with the doctor's sources, not with the
    # page's own: an incremental build writes the page again every time (it executes nothing).
    return [PAGE] if PAGE in env.found_docs else []


def setup(app):
    app.connect("builder-inited", _builder_inited)
    app.connect("env-get-outdated", _outdated)
    app.connect("html-page-context", _page_context)
    app.connect("build-finished", _build_finished)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
