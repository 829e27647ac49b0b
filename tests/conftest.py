"""Shared test set-up: GPU tests skip without CUDA; plots render off-screen."""
from __future__ import annotations

import os

os.environ.setdefault("MPLBACKEND", "Agg")

import pytest  # noqa: E402

from experiments.device import has_cuda  # noqa: E402


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
