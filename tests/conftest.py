"""Shared test set-up: GPU tests skip without CUDA; plots render off-screen."""
from __future__ import annotations

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
