"""Build the book for the tests the way `make book` / `make book-student` do.

The build's one slow part is executing the notebooks, which Jupyter Book does one at a time.
:func:`execute_notebooks` runs them beforehand, several at a time, into the execution cache
the build then reads (``execute_notebooks: cache`` in _config.yml), read and run exactly as
myst-nb reads and runs them; :func:`finish_build` then fails a build that executed any notebook
a second time and writes the executed notebooks beside the pages. `make test` does the three
steps::

    python -m tests.bookbuild execute _build/test --jobs 2
    jupyter-book build . --path-output _build/test --warningiserror --keep-going
    python -m tests.bookbuild finish _build/test
"""
from __future__ import annotations

import argparse
import concurrent.futures
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# What the notebooks run under while the book is built: recorded results, static explorers.
BOOK_ENV = {"CUDA_MEMLAB_MODE": "recorded", "CUDA_MEMLAB_STATIC": "1"}


def _jupyter_book_config() -> dict:
    """The Sphinx configuration Jupyter Book derives from _config.yml."""
    from jupyter_book.config import get_final_config

    config, _ = get_final_config(user_yaml=ROOT / "_config.yml", cli_config={"latex_individualpages": False},
                                 sourcedir=ROOT)
    return config


def notebook_pages() -> list[tuple[Path, object]]:
    """[(page source, notebook as myst-nb reads it)] of the pages in _toc.yml that are notebooks
    (book/*.md written by scripts/sync_notebooks.py), in the table of contents' order."""
    import yaml
    from myst_nb.core.config import NbParserConfig
    from myst_nb.core.read import create_nb_reader
    from myst_parser.config.main import MdParserConfig

    config = _jupyter_book_config()
    md_config = MdParserConfig(enable_extensions=set(config.get("myst_enable_extensions", ())))
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]] + [c["file"] for part in toc.get("parts", []) for c in part["chapters"]]
    out = []
    for f in files:
        path = (ROOT / f).with_suffix(".md")
        if not path.exists():
            continue
        text = path.read_text(encoding="utf-8")
        reader = create_nb_reader(str(path), md_config, NbParserConfig(), text)
        if reader is not None:
            out.append((path, reader.read(text)))
    return out


def _cache(out: Path):
    """The execution cache the build into ``out`` reads (myst-nb's default place beside the html)."""
    from jupyter_cache import get_cache

    return get_cache(str(out / "_build" / ".jupyter_cache"))


def _execute_one(path: Path, nb, timeout: int):
    """(path, executed notebook or None, seconds, error text) of one notebook run as myst-nb runs it."""
    from jupyter_cache.executors.utils import single_nb_execution

    result = single_nb_execution(nb, cwd=str(path.parent), timeout=timeout, allow_errors=False,
                                 meta_override=True)
    return path, (None if result.err else nb), result.time, result.exc_string


# Seconds each notebook took to execute (`make test` on the 2-core machine, 2026-12-03): they start
# longest first, so that the two longest run beside each other and the short ones fill in after.
# Code size does not tell: chapter 2, with less code than chapters 1 and 4, draws the most figures;
# ordered by code size it started third, once chapter 1 had ended, and ended last.
# A notebook not listed starts first: it may be the longest.
EXECUTE_SECONDS = {"ch2_cross_stream": 111, "ch4_hidden_syncs": 96, "ch1_caching_allocator": 48,
                   "ch3_pinned_memory": 35, "measuring": 6, "intro": 5, "claims": 4}


def start_order(pages: list) -> list:
    """``pages`` ([(page source, notebook)]) in the order they start: by :data:`EXECUTE_SECONDS`,
    the longest first, those not listed before them by their code's size."""
    def key(page):
        path, nb = page
        code = sum(len(c.source) for c in nb.cells if c.cell_type == "code")
        seconds = EXECUTE_SECONDS.get(path.stem)
        return (0, -code) if seconds is None else (1, -seconds)
    return sorted(pages, key=key)


def execute_notebooks(out: Path, jobs: int = 2) -> dict[str, float]:
    """Execute the book's notebooks ``jobs`` at a time into the execution cache of a build that
    goes into ``out``; returns {page: seconds} of those that ran cleanly.

    A notebook that fails is not cached: the build then executes it itself and reports the error
    as it always did. The longest notebooks start first (:func:`start_order`).

    Args:
        out: the ``--path-output`` folder of the build that will read the cache.
        jobs: notebooks run at once (each in its own kernel); 1 runs them one after another.
    """
    from jupyter_cache.base import CacheBundleIn

    os.environ.update(BOOK_ENV)  # the kernels inherit it
    timeout = int(_jupyter_book_config().get("nb_execution_timeout", 900))
    pages = start_order(notebook_pages())
    cache = _cache(out)
    times = {}
    with concurrent.futures.ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(_execute_one, path, nb, timeout) for path, nb in pages]
        for future in concurrent.futures.as_completed(futures):
            path, nb, seconds, error = future.result()
            name = path.relative_to(ROOT).as_posix()
            if nb is None:
                print(f"{name}: failed in {seconds:.0f} s; the book build runs it again and reports it", flush=True)
                continue
            cache.cache_notebook_bundle(CacheBundleIn(nb, str(path), data={"execution_seconds": seconds}),
                                        check_validity=False, overwrite=True)
            times[name] = seconds
            print(f"{name}: executed in {seconds:.0f} s", flush=True)
    return times


def finish_build(out: Path) -> None:
    """After a build into ``out`` that read the cache :func:`execute_notebooks` filled: fail if it
    executed a notebook again, and write the executed notebooks where the build writes them
    (``_build/jupyter_execute/book/*.ipynb``).

    myst-nb writes that copy from the notebook it read, which holds the outputs when it executed
    it but not when it took them from the cache (it merges them into another copy), so after a
    build from the cache the copies had no outputs. Each is written as myst-nb writes the one it
    executed: the read notebook with the cached outputs, execution counts and kernel metadata.

    Raises:
        AssertionError: naming the notebooks run twice (myst-nb read them differently, so they
            missed the cache), or a notebook not in the cache.
    """
    import nbformat

    cache = _cache(out)
    seen: dict[str, int] = {}
    for r in cache.list_cache_records():
        seen[Path(r.uri).name] = seen.get(Path(r.uri).name, 0) + 1
    twice = sorted(name for name, n in seen.items() if n > 1)
    assert not twice, (f"the book build executed {twice} again: myst-nb read them differently from "
                       f"tests/bookbuild.py's execute_notebooks, whose reading must follow myst-nb's")
    for path, nb in notebook_pages():
        _, executed = cache.merge_match_into_notebook(nb)
        target = out / "_build" / "jupyter_execute" / path.relative_to(ROOT).with_suffix(".ipynb")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(nbformat.writes(executed).encode("utf-8"))


def build_book(out: Path, *, student: bool = False, cache: Path | None = None, jobs: int = 1) -> Path:
    """Build the full (or student) book with ``--path-output out``; returns ``out``.

    Args:
        out: the folder the build goes into (its ``_build/html`` holds the pages).
        student: the student edition (scripts/student_edition.py's config).
        cache: an execution cache to reuse (the full book's), so that the student edition
            does not execute the notebooks again.
        jobs: for the full book without ``cache``, notebooks executed at once beforehand
            (:func:`execute_notebooks`); 1 leaves the execution to Jupyter Book.

    Raises:
        AssertionError: the build failed (its log's tail is the message).
    """
    import yaml

    env = {**os.environ, **BOOK_ENV}
    py = sys.executable
    subprocess.run([py, str(ROOT / "scripts" / "sync_notebooks.py")], check=True, cwd=ROOT, capture_output=True)
    jb = [str(Path(py).parent / "jupyter-book"), "build", str(ROOT), "--path-output", str(out),
          "--warningiserror", "--keep-going"]
    if student:
        import importlib.util

        spec = importlib.util.spec_from_file_location("student_edition", ROOT / "scripts" / "student_edition.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        config = mod.student_config()
        if cache is not None:
            config["execute"]["cache"] = str(cache)
        out.mkdir(parents=True, exist_ok=True)
        cfg = out / "student_config.yml"
        cfg.write_text(yaml.safe_dump(config, sort_keys=False))
        jb += ["--config", str(cfg)]
    elif jobs > 1:
        subprocess.run([py, "-m", "tests.bookbuild", "execute", str(out), "--jobs", str(jobs)],
                       check=True, cwd=ROOT, env=env)
    r = subprocess.run(jb, capture_output=True, text=True, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    if not student and jobs > 1:
        finish_build(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bookbuild", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("execute", help="execute the notebooks into the cache of a build into OUT")
    ex.add_argument("out", type=Path)
    ex.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="notebooks at once (default: the cores)")
    ch = sub.add_parser("finish", help="fail if the build into OUT executed a notebook a second time; "
                                       "write the executed notebooks beside its pages")
    ch.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    out = args.out if args.out.is_absolute() else Path.cwd() / args.out
    if args.command == "execute":
        t0 = time.perf_counter()
        times = execute_notebooks(out, args.jobs)
        print(f"{len(times)} notebooks executed, {args.jobs} at a time, in {time.perf_counter() - t0:.0f} s "
              f"({sum(times.values()):.0f} s one after another)")
    else:
        finish_build(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
