"""Measurement helpers: GPU timing with CUDA events, host-blocked time, memory statistics,
and a calibrated GPU delay.

Timings follow the usual discipline (warm-up, repeats, median with spread); see the
CUDA semantics notes, https://docs.pytorch.org/docs/stable/notes/cuda.html#asynchronous-execution.
``torch.cuda._sleep(cycles)`` spins a kernel for a number of clock cycles; clocks
differ between GPUs, so :func:`calibrate_sleep` converts milliseconds to cycles on the
current device and experiments ask for GPU work in ms.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import statistics
import time
from typing import Any, Callable, Iterator, Sequence

from .lazy_torch import torch
from .device import require_cuda


@dataclasses.dataclass(frozen=True)
class Stats:
    """Median and spread of repeated measurements (all in ``unit``)."""

    median: float
    p10: float
    p90: float
    min: float
    max: float
    n: int
    unit: str = "ms"

    def __str__(self) -> str:
        return f"{self.median:.3g} {self.unit} (p10 {self.p10:.3g}, p90 {self.p90:.3g}, n={self.n})"

    def to_dict(self) -> dict[str, Any]:
        """The form recorded results keep: ``{"median", "p10", "p90", "n"}`` (see :data:`STATS_SCHEMA`)."""
        return {"median": self.median, "p10": self.p10, "p90": self.p90, "n": self.n}


# The JSON schema of :meth:`Stats.to_dict`, for experiments' data schemas.
STATS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["median", "p10", "p90", "n"],
    "properties": {"median": {"type": "number"}, "p10": {"type": "number"}, "p90": {"type": "number"},
                   "n": {"type": "integer", "minimum": 1}},
}


def stats_dict(samples: Sequence[float]) -> dict[str, Any]:
    """``summarize(samples).to_dict()``: median, p10, p90 and n of ``samples`` (ms).

    Raises:
        ValueError: on an empty sample.
    """
    return summarize(samples).to_dict()


def host_spin(ms: float) -> None:
    """Keep the host busy for ``ms`` milliseconds (a stand-in for Python work: dispatch,
    decoding a batch). A busy-wait, because ``time.sleep`` overshoots by tens of µs and varies."""
    if ms <= 0:
        return
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


def _quantile(sorted_xs: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of sorted data (numpy's default method)."""
    if len(sorted_xs) == 1:
        return float(sorted_xs[0])
    pos = q * (len(sorted_xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return float(sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo))


def summarize(samples: Sequence[float], unit: str = "ms") -> Stats:
    """Median, 10th/90th percentiles, min and max of ``samples``.

    Raises:
        ValueError: on an empty sample.
    """
    xs = sorted(float(x) for x in samples)
    if not xs:
        raise ValueError("samples must hold at least one measurement")
    return Stats(statistics.median(xs), _quantile(xs, 0.1), _quantile(xs, 0.9), xs[0], xs[-1], len(xs), unit)


def _check_counts(warmup: int, repeats: int) -> None:
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")


def time_gpu(fn: Callable[[], Any], *, warmup: int = 3, repeats: int = 10) -> Stats:
    """GPU time of ``fn`` on the current stream, in ms, from CUDA events around each call.

    ``fn`` is called ``warmup`` times untimed, then ``repeats`` times timed; the device
    is synchronized before the first timed call and after the last.

    Raises:
        ValueError: warmup < 0 or repeats < 1. NoGPUError: no GPU.
    """
    _check_counts(warmup, repeats)
    require_cuda("GPU timing")
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    pairs = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        pairs.append((start, end))
    torch.cuda.synchronize()
    return summarize([s.elapsed_time(e) for s, e in pairs], "ms")


def time_host(fn: Callable[[], Any], *, warmup: int = 1, repeats: int = 5,
              setup: Callable[[], Any] | None = None) -> Stats:
    """How long the host is blocked inside ``fn``, in ms (``time.perf_counter``).

    ``setup`` runs before each call, untimed (for example, queue GPU work so that a
    syncing call has something to wait for). The device is synchronized after each
    call so calls do not overlap.
    """
    _check_counts(warmup, repeats)
    samples = []
    for i in range(warmup + repeats):
        if setup is not None:
            setup()
        t0 = time.perf_counter()
        fn()
        dt = (time.perf_counter() - t0) * 1e3
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        if i >= warmup:
            samples.append(dt)
    return summarize(samples, "ms")


@contextlib.contextmanager
def host_timer() -> Iterator[dict[str, float]]:
    """Context manager; on exit ``t['ms']`` holds the host time spent inside, in ms."""
    out: dict[str, float] = {}
    t0 = time.perf_counter()
    try:
        yield out
    finally:
        out["ms"] = (time.perf_counter() - t0) * 1e3


# ---------------------------------------------------------------- memory statistics

_STAT_KEYS = {
    "allocated": "allocated_bytes.all.current",
    "allocated_peak": "allocated_bytes.all.peak",
    "active": "active_bytes.all.current",
    "active_peak": "active_bytes.all.peak",
    "reserved": "reserved_bytes.all.current",
    "reserved_peak": "reserved_bytes.all.peak",
    "num_alloc_retries": "num_alloc_retries",
    "num_ooms": "num_ooms",
}


@dataclasses.dataclass(frozen=True)
class MemoryStats:
    """Caching-allocator counters in bytes (counts for the last two).

    ``active`` includes blocks freed by Python but held back by ``record_stream``
    events; ``allocated`` drops at free time, so ``allocated_peak`` misses them
    (experiments/doctor/RULES.md §A.12, and ``c10/cuda/CUDACachingAllocator.cpp``, ``free``).
    """

    allocated: int
    allocated_peak: int
    active: int
    active_peak: int
    reserved: int
    reserved_peak: int
    num_alloc_retries: int
    num_ooms: int

    @classmethod
    def from_memory_stats(cls, stats: dict[str, Any]) -> "MemoryStats":
        """Build from a ``torch.cuda.memory_stats()`` dict (missing keys read as 0)."""
        return cls(**{name: int(stats.get(key, 0)) for name, key in _STAT_KEYS.items()})

    def minus(self, base: "MemoryStats") -> "MemoryStats":
        """Each counter relative to ``base`` (peaks relative to base's current values)."""
        return MemoryStats(
            allocated=self.allocated - base.allocated,
            allocated_peak=self.allocated_peak - base.allocated,
            active=self.active - base.active,
            active_peak=self.active_peak - base.active,
            reserved=self.reserved - base.reserved,
            reserved_peak=self.reserved_peak - base.reserved,
            num_alloc_retries=self.num_alloc_retries - base.num_alloc_retries,
            num_ooms=self.num_ooms - base.num_ooms,
        )

    def mib(self) -> dict[str, float]:
        """Byte counters in MiB (counts unchanged)."""
        d = dataclasses.asdict(self)
        return {k: (v / 2**20 if not k.startswith("num_") else v) for k, v in d.items()}


def memory_stats(device: int | None = None) -> MemoryStats:
    """The caching allocator's counters now."""
    require_cuda("reading memory statistics")
    return MemoryStats.from_memory_stats(torch.cuda.memory_stats(device))


class MemoryWindow:
    """Counters over a region, relative to its start; see :func:`track_memory`."""

    def __init__(self) -> None:
        self.base: MemoryStats | None = None
        self.end: MemoryStats | None = None

    @property
    def delta(self) -> MemoryStats:
        if self.base is None or self.end is None:
            raise RuntimeError("the memory window has not closed yet")
        return self.end.minus(self.base)

    def read(self) -> MemoryStats:
        """Counters so far, relative to the start (usable inside the window)."""
        assert self.base is not None
        return memory_stats().minus(self.base)


@contextlib.contextmanager
def track_memory(*, synchronize: bool = True) -> Iterator[MemoryWindow]:
    """Reset peak counters, then report counters relative to the start of the block.

    Peaks in the result are the highest value reached inside the block minus the
    value at its start: a variant measured this way is not polluted by the previous one.
    """
    require_cuda("tracking memory")
    if synchronize:
        torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    window = MemoryWindow()
    window.base = memory_stats()
    try:
        yield window
    finally:
        if synchronize:
            torch.cuda.synchronize()
        window.end = memory_stats()


def reset_allocator() -> None:
    """Synchronize, return cached blocks to the driver and reset peaks (between variants)."""
    require_cuda("resetting the allocator")
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


def release_library_workspaces() -> None:
    """Free the cuBLAS/cuBLASLt workspaces that PyTorch caches per (handle, stream).

    PyTorch allocates a matmul workspace (32 MiB on Hopper) through the caching allocator
    the first time a handle is used on a stream, and keeps it in a process-wide map
    (``cublas_handle_stream_to_workspace`` in ``aten/src/ATen/cuda/CublasHandlePool.cpp``):
    it counts as *allocated* although no tensor owns it. Autograd's device thread has a
    handle of its own, and every new stream gets a new workspace. They are recreated on
    the next matmul. PyTorch's own leak check frees them the same way before it compares
    ``memory_allocated()`` (``CudaMemoryLeakCheck`` in ``torch/testing/_internal/common_utils.py``).
    A no-op on a torch without the (private) call.
    """
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        torch.cuda.synchronize()
        clear()


@contextlib.contextmanager
def memory_left_as_found() -> Iterator[None]:
    """Around a live experiment: leave ``torch.cuda.memory_allocated()`` no higher than it was.

    Without a GPU (or before CUDA started, where the counter reads 0) nothing is read.
    After the block, if allocated bytes are above the start, garbage is collected (tensors
    in reference cycles: an exception's frames, a closure) and then the matmul workspaces
    the block made PyTorch cache are freed (:func:`release_library_workspaces`). What is
    still above the start after that is a tensor the experiment kept: a bug that
    ``tests/test_memory_left_gpu.py`` reports. Reserved memory is left to the caller
    (``torch.cuda.empty_cache()``).
    """
    if not torch.cuda.is_available():
        yield
        return
    before = torch.cuda.memory_allocated()
    failed = False
    try:
        yield
    except BaseException:
        failed = True
        raise
    finally:
        try:
            if torch.cuda.is_initialized() and torch.cuda.memory_allocated() > before:
                gc.collect()
                if torch.cuda.memory_allocated() > before:
                    release_library_workspaces()
        except Exception:
            if not failed:
                raise
            # The experiment's own error is the one to see, not a failed clean-up after it.


# ---------------------------------------------------------------- calibrated GPU delay

_CYCLES_PER_MS: dict[int, float] = {}


def fit_cycles_per_ms(cycles: Sequence[float], ms: Sequence[float]) -> tuple[float, float]:
    """Least-squares line ms = cycles / rate + offset; returns (rate in cycles/ms, offset in ms).

    Raises:
        ValueError: fewer than two distinct cycle counts, or a non-positive slope.
    """
    if len(cycles) != len(ms) or len(set(cycles)) < 2:
        raise ValueError("need at least two distinct cycle counts with one time each")
    n = len(cycles)
    mx, my = sum(cycles) / n, sum(ms) / n
    sxx = sum((x - mx) ** 2 for x in cycles)
    sxy = sum((x - mx) * (y - my) for x, y in zip(cycles, ms))
    slope = sxy / sxx
    if slope <= 0:
        raise ValueError("GPU time did not grow with the cycle count")
    return 1.0 / slope, my - slope * mx


def calibrate_sleep(*, target_ms: float = 20.0, repeats: int = 5, device: int | None = None) -> float:
    """Cycles per millisecond of ``torch.cuda._sleep`` on the current GPU (cached per device).

    Times a short and a long sleep with CUDA events (median of ``repeats``) and takes
    the slope, so launch overhead cancels. The lab H200 gives about 1.97e6 cycles/ms.
    """
    require_cuda("calibrating torch.cuda._sleep")
    dev = torch.cuda.current_device() if device is None else device
    if dev in _CYCLES_PER_MS:
        return _CYCLES_PER_MS[dev]
    with torch.cuda.device(dev):
        probe = 1_000_000
        rough = time_gpu(lambda: torch.cuda._sleep(probe), warmup=2, repeats=3).median
        rate = probe / max(rough, 1e-3)
        lo, hi = int(rate * target_ms * 0.1), int(rate * target_ms)
        t_lo = time_gpu(lambda: torch.cuda._sleep(lo), warmup=1, repeats=repeats).median
        t_hi = time_gpu(lambda: torch.cuda._sleep(hi), warmup=1, repeats=repeats).median
        rate, _ = fit_cycles_per_ms([lo, hi], [t_lo, t_hi])
    _CYCLES_PER_MS[dev] = rate
    return rate


def ms_to_cycles(ms: float) -> int:
    """Cycles of ``torch.cuda._sleep`` that keep the current GPU busy for ``ms`` milliseconds."""
    if ms < 0:
        raise ValueError(f"ms must be >= 0, got {ms}")
    return int(round(ms * calibrate_sleep()))


def gpu_sleep(ms: float) -> None:
    """Queue about ``ms`` milliseconds of busy GPU work on the current stream; returns at once."""
    cycles = ms_to_cycles(ms)
    if cycles > 0:
        torch.cuda._sleep(cycles)
