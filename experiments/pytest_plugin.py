"""A pytest plugin that fails tests whose code synchronizes host and GPU.

Enable it in your ``conftest.py`` (the top-level one)::

    pytest_plugins = ["experiments.pytest_plugin"]

Then either check one region with the ``sync_detector`` fixture (warm-up and set-up
outside the block may sync as they like)::

    def test_train_step_is_sync_free(sync_detector):
        model, batch = build()                  # may sync: not checked
        train_step(model, batch)                # first call may build constants once
        with sync_detector():                   # fails the test if this block syncs
            train_step(model, batch)

or check a whole test body with the ``no_syncs`` marker, which takes the options of
:class:`experiments.sync_detector.SyncDetector`::

    @pytest.mark.no_syncs(max_syncs=0, pageable_threshold_bytes=65536)
    def test_metrics_helper(): ...

Without a CUDA GPU, tests that use either are skipped with the reason (there is no
host-device sync on a machine without one). Fixtures run before the marked test body
starts, so their set-up is not checked.

Explicit waits are caught by wrapping ``torch.cuda.synchronize`` and friends while the
check runs, so code under test must look them up then: ``torch.cuda.synchronize()`` is
seen, but a name bound at import time (``from torch.cuda import synchronize``) or a
bound method saved earlier (``wait = event.synchronize``) calls the original, and
neither the wrapper nor ``set_sync_debug_mode`` reports it.
"""
from __future__ import annotations

from typing import Any, Callable

import pytest

from .core.device import has_cuda
from .syncs.detector import SyncDetector, SyncError, no_gpu_message

MARKER_HELP = ("no_syncs(**options): fail the test if its body synchronizes host and GPU "
               "(options of experiments.sync_detector.SyncDetector; needs a CUDA GPU, else skipped)")


def pytest_configure(config: Any) -> None:
    config.addinivalue_line("markers", MARKER_HELP)


def pytest_collection_modifyitems(config: Any, items: list) -> None:
    if has_cuda():
        return
    skip = pytest.mark.skip(reason=f"no_syncs: {no_gpu_message()}")
    for item in items:
        if item.get_closest_marker("no_syncs") is not None:
            item.add_marker(skip)


@pytest.fixture
def sync_detector() -> Callable[..., SyncDetector]:
    """A factory of :class:`SyncDetector` blocks: ``with sync_detector(): ...``.

    ``sync_detector(mode="error", **options)``; 'error' fails the test on exit from a
    block that synced, with a report naming each line; 'report' only records (read
    ``.events``, ``.count`` or ``.report()``). Skips the test without a CUDA GPU.
    """
    if not has_cuda():
        pytest.skip(no_gpu_message())

    def make(mode: str = "error", **options: Any) -> SyncDetector:
        return SyncDetector(mode, **options)

    return make


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: Any):
    marker = item.get_closest_marker("no_syncs")
    if marker is None or not has_cuda():
        yield
        return
    options = dict(marker.kwargs)
    options.pop("mode", None)
    detector = SyncDetector("report", **options)
    with detector:
        outcome = yield
    if outcome.excinfo is None and detector.count > detector.max_syncs:
        error = SyncError(detector.report())
        force = getattr(outcome, "force_exception", None)  # pluggy >= 1.1
        if force is None:
            raise error
        force(error)
