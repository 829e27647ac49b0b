"""Shared test set-up: GPU tests skip without CUDA; plots render off-screen; the book is built
(and its notebooks executed) once per run."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import matplotlib
import pytest

from experiments.core.device import has_cuda

# Off-screen plots in this process only: notebook kernels started by the tests must keep
# their inline backend, so the backend is not set through the environment.
matplotlib.use("Agg")


def pytest_collection_modifyitems(config, items):
    if has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the lab GPU: pytest -m gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


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

    The build is the one execution of each notebook (it fails on a cell error). ``make test``
    builds the book before pytest and names its folder in ``CUDA_MEMLAB_BOOK_BUILD``; without
    that, the first test that needs the book builds it into a temporary folder.
    """
    given = os.environ.get("CUDA_MEMLAB_BOOK_BUILD")
    if given:
        build = Path(given) / "_build"
        assert (build / "html" / "index.html").exists(), f"CUDA_MEMLAB_BOOK_BUILD={given} holds no built book"
        return build
    root = Path(__file__).resolve().parent.parent
    out = tmp_path_factory.mktemp("book")
    jb = Path(sys.executable).parent / "jupyter-book"
    r = subprocess.run([str(jb), "build", str(root), "--path-output", str(out), "--warningiserror", "--keep-going"],
                       capture_output=True, text=True, env={**os.environ, "CUDA_MEMLAB_MODE": "recorded"})
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-5000:]
    return out / "_build"
