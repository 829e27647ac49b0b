import time

import numpy as np
import pytest
import torch

from experiments.core import measure
from experiments.core.measure import MemoryStats


def test_summarize_matches_numpy():
    xs = [5.0, 1.0, 3.0, 2.0, 4.0, 10.0]
    s = measure.summarize(xs, "ms")
    assert s.median == pytest.approx(np.median(xs))
    assert s.p10 == pytest.approx(np.percentile(xs, 10))
    assert s.p90 == pytest.approx(np.percentile(xs, 90))
    assert (s.min, s.max, s.n, s.unit) == (1.0, 10.0, 6, "ms")
    assert "ms" in str(s) and "n=6" in str(s)


def test_summarize_single_and_empty():
    s = measure.summarize([2.5])
    assert s.median == s.p10 == s.p90 == 2.5
    with pytest.raises(ValueError, match="at least one"):
        measure.summarize([])


def test_fit_cycles_per_ms_recovers_a_line():
    rate, offset = 1.98e6, 0.004
    cycles = [1e6, 2e6, 5e6, 2e7]
    ms = [c / rate + offset for c in cycles]
    r, o = measure.fit_cycles_per_ms(cycles, ms)
    assert r == pytest.approx(rate, rel=1e-9)
    assert o == pytest.approx(offset, abs=1e-12)


def test_fit_cycles_per_ms_rejects_degenerate_input():
    with pytest.raises(ValueError, match="two distinct"):
        measure.fit_cycles_per_ms([1e6, 1e6], [1.0, 1.1])
    with pytest.raises(ValueError, match="did not grow"):
        measure.fit_cycles_per_ms([1e6, 2e6], [2.0, 1.0])


def test_memory_stats_from_torch_dict_and_deltas():
    raw = {"allocated_bytes.all.current": 100, "allocated_bytes.all.peak": 300, "active_bytes.all.current": 150,
           "active_bytes.all.peak": 500, "reserved_bytes.all.current": 2 * 2**20, "reserved_bytes.all.peak": 4 * 2**20,
           "num_alloc_retries": 2}
    m = MemoryStats.from_memory_stats(raw)
    assert (m.allocated, m.active_peak, m.num_alloc_retries, m.num_ooms) == (100, 500, 2, 0)
    base = MemoryStats(50, 50, 50, 50, 2**20, 2**20, 1, 0)
    d = m.minus(base)
    assert (d.allocated, d.allocated_peak, d.active_peak, d.reserved_peak, d.num_alloc_retries) == (
        50, 250, 450, 3 * 2**20, 1)
    assert d.mib()["reserved_peak"] == 3.0 and d.mib()["num_alloc_retries"] == 1


def test_time_host_measures_blocking_calls():
    s = measure.time_host(lambda: time.sleep(0.004), warmup=0, repeats=3)
    assert 4.0 <= s.median < 50.0 and s.n == 3
    with pytest.raises(ValueError, match="repeats"):
        measure.time_host(lambda: None, repeats=0)


def test_host_timer():
    with measure.host_timer() as t:
        time.sleep(0.003)
    assert t["ms"] >= 3.0


def test_ms_to_cycles_rejects_negative():
    with pytest.raises(ValueError, match="ms must be >= 0"):
        measure.ms_to_cycles(-1)


@pytest.mark.gpu
def test_calibrated_sleep_takes_the_time_asked_for():
    rate = measure.calibrate_sleep()
    assert 1e5 < rate < 1e8
    s = measure.time_gpu(lambda: measure.gpu_sleep(10.0), warmup=1, repeats=5)
    assert s.median == pytest.approx(10.0, rel=0.1), s


@pytest.mark.gpu
def test_track_memory_reports_relative_peaks():
    with measure.track_memory() as mem:
        x = torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda")
        del x
    d = mem.delta
    assert d.allocated == 0
    assert d.allocated_peak == 64 * 2**20
    assert d.active_peak == 64 * 2**20


class _FakeAllocator:
    """Stands in for the CUDA side of memory_left_as_found on a machine without a GPU:
    ``allocated`` bytes, of which ``workspaces`` are cuBLAS workspaces PyTorch caches."""

    def __init__(self, monkeypatch, allocated=0):
        self.allocated, self.workspaces, self.cleared = allocated, 0, 0
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
        monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: self.allocated)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
        monkeypatch.setattr(torch._C, "_cuda_clearCublasWorkspaces", self.clear, raising=False)

    def clear(self):
        self.cleared += 1
        self.allocated -= self.workspaces
        self.workspaces = 0


def test_memory_left_as_found_frees_the_workspaces_an_experiment_made(monkeypatch):
    cuda = _FakeAllocator(monkeypatch, allocated=1000)
    with measure.memory_left_as_found():
        cuda.allocated += 64 << 20  # a first matmul on two handles: PyTorch caches two workspaces
        cuda.workspaces += 64 << 20
    assert cuda.allocated == 1000 and cuda.cleared == 1


def test_memory_left_as_found_touches_nothing_when_memory_is_back(monkeypatch):
    cuda = _FakeAllocator(monkeypatch, allocated=1000)
    with measure.memory_left_as_found():
        cuda.allocated += 4096
        cuda.allocated -= 4096
    assert cuda.cleared == 0, "the reader's own workspaces stay when the experiment left nothing"


def test_memory_left_as_found_does_not_hide_a_kept_tensor(monkeypatch):
    """A tensor the experiment keeps is not a workspace: it stays visible to the GPU test."""
    cuda = _FakeAllocator(monkeypatch, allocated=0)
    with pytest.raises(RuntimeError, match="boom"):
        with measure.memory_left_as_found():
            cuda.allocated += 512
            raise RuntimeError("boom")
    assert cuda.allocated == 512 and cuda.cleared == 1


def test_memory_left_as_found_is_a_no_op_without_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: pytest.fail("read without a GPU"))
    with measure.memory_left_as_found():
        pass


def test_memory_left_as_found_keeps_the_experiments_own_error(monkeypatch):
    """A clean-up that fails after the experiment failed (a CUDA error left behind) does
    not hide the experiment's error."""
    cuda = _FakeAllocator(monkeypatch, allocated=0)

    def broken_sync(device=None):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(torch.cuda, "synchronize", broken_sync)
    with pytest.raises(ValueError, match="the experiment's own"):
        with measure.memory_left_as_found():
            cuda.allocated += 512
            raise ValueError("the experiment's own error")
    with pytest.raises(RuntimeError, match="illegal memory access"):
        with measure.memory_left_as_found():
            cuda.allocated += 512
