"""Chapter 0 (How this book measures): the GPU clock behind ``torch.cuda._sleep``, and
why host timers lie about asynchronous GPU work.

Every later chapter asks for "N ms of GPU work"; this module shows how that becomes a
cycle count on the reader's GPU, and what the three ways of timing a queued kernel
report. Background: CUDA semantics, asynchronous execution,
https://docs.pytorch.org/docs/stable/notes/cuda.html#asynchronous-execution
"""
from __future__ import annotations

import time
from typing import Any

from .core.lazy_torch import torch
from .core.measure import STATS_SCHEMA, fit_cycles_per_ms, gpu_sleep, stats_dict, time_gpu
from .core.plotting import bars, figure_function, new_figure, stamp
from .core.registry import Param, Result, experiment



@experiment(
    "core.sleep_clock",
    chapter=0,
    title="Calibrating torch.cuda._sleep: cycles to milliseconds",
    params=[Param("repeats", 10, min=3, max=50, unit="runs", help="timed runs per cycle count")],
    grid={"repeats": [5, 10, 20]},
    data_schema={
        "type": "object",
        "required": ["cycles", "median_ms", "p10_ms", "p90_ms", "cycles_per_ms", "offset_ms"],
        "properties": {
            "cycles": {"type": "array", "items": {"type": "integer"}, "minItems": 2},
            "median_ms": {"type": "array", "items": {"type": "number"}},
            "p10_ms": {"type": "array", "items": {"type": "number"}},
            "p90_ms": {"type": "array", "items": {"type": "number"}},
            "cycles_per_ms": {"type": "number", "exclusiveMinimum": 0},
            "offset_ms": {"type": "number"},
        },
    },
)
def sleep_clock(repeats: int = 10) -> dict[str, Any]:
    """Time ``torch.cuda._sleep(c)`` for cycle counts spanning about 0.5-40 ms.

    Returns lists (one entry per cycle count) of the median, 10th and 90th percentile
    GPU time in ms from CUDA events, and the fitted rate (cycles per ms) and launch
    offset (ms) of the line ms = cycles / rate + offset.
    """
    probe = 2_000_000
    rough = time_gpu(lambda: torch.cuda._sleep(probe), warmup=2, repeats=3).median
    rate = probe / max(rough, 1e-3)
    cycles = [int(rate * ms) for ms in (0.5, 1, 2, 5, 10, 20, 40)]
    med, p10, p90 = [], [], []
    for c in cycles:
        s = time_gpu(lambda c=c: torch.cuda._sleep(c), warmup=1, repeats=repeats)
        med.append(s.median)
        p10.append(s.p10)
        p90.append(s.p90)
    fitted, offset = fit_cycles_per_ms(cycles, med)
    return {"cycles": cycles, "median_ms": med, "p10_ms": p10, "p90_ms": p90,
            "cycles_per_ms": fitted, "offset_ms": offset}


@experiment(
    "core.three_clocks",
    chapter=0,
    title="Three ways to time queued GPU work",
    params=[Param("work_ms", 20.0, choices=(5.0, 20.0, 50.0), unit="ms", help="GPU work queued per run"),
            Param("repeats", 10, min=3, max=50, unit="runs")],
    grid={"work_ms": [5.0, 20.0, 50.0]},
    data_schema={
        "type": "object",
        "required": ["host_no_sync_ms", "host_with_sync_ms", "cuda_events_ms"],
        "properties": {k: STATS_SCHEMA for k in ("host_no_sync_ms", "host_with_sync_ms", "cuda_events_ms")},
    },
)
def three_clocks(work_ms: float = 20.0, repeats: int = 10) -> dict[str, Any]:
    """Time the same ``work_ms`` of GPU work three ways (each a summary in ms):

    ``host_no_sync_ms``: ``perf_counter`` around the launch only (what a naive timer sees);
    ``host_with_sync_ms``: around launch + ``torch.cuda.synchronize()``;
    ``cuda_events_ms``: CUDA events recorded around the launch on the stream.
    """
    gpu_sleep(work_ms)  # warm-up, and the calibration happens outside the timed region
    torch.cuda.synchronize()
    no_sync, with_sync, events = [], [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        gpu_sleep(work_ms)
        no_sync.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.synchronize()

        t0 = time.perf_counter()
        gpu_sleep(work_ms)
        torch.cuda.synchronize()
        with_sync.append((time.perf_counter() - t0) * 1e3)

        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        gpu_sleep(work_ms)
        end.record()
        end.synchronize()
        events.append(start.elapsed_time(end))

    return {"host_no_sync_ms": stats_dict(no_sync), "host_with_sync_ms": stats_dict(with_sync), "cuda_events_ms": stats_dict(events)}


@figure_function
def plot_sleep_clock(result: Result) -> Any:
    """Measured GPU time against cycle count, with the fitted line (ms against Mcycles)."""
    d = result.data
    fig, ax = new_figure(width=6.5, height=3.2)
    mc = [c / 1e6 for c in d["cycles"]]
    err = [[m - lo for m, lo in zip(d["median_ms"], d["p10_ms"])],
           [hi - m for m, hi in zip(d["median_ms"], d["p90_ms"])]]
    ax.errorbar(mc, d["median_ms"], yerr=err, fmt="o", capsize=3, label="median (p10-p90) of CUDA-event timings")
    xs = [0, max(mc)]
    ax.plot(xs, [x * 1e6 / d["cycles_per_ms"] + d["offset_ms"] for x in xs], "--",
            label=f"fit: {d['cycles_per_ms'] / 1e6:.3g} Mcycles per ms")
    ax.set_xlabel("torch.cuda._sleep argument (millions of cycles)")
    ax.set_ylabel("GPU time (ms)")
    ax.legend(loc="upper left")
    return stamp(fig, result)


@figure_function
def plot_three_clocks(result: Result) -> Any:
    """Bars of the three timings (median with p10-p90), in ms."""
    d = result.data
    keys = [("host_no_sync_ms", "host timer,\nno sync"), ("host_with_sync_ms", "host timer\n+ synchronize"),
            ("cuda_events_ms", "CUDA events")]
    fig = bars([label for _, label in keys], [d[k]["median"] for k, _ in keys],
               errors=[(d[k]["p10"], d[k]["p90"]) for k, _ in keys], ylabel="measured time (ms)",
               title=f"{result.params['work_ms']:g} ms of GPU work, timed three ways", annotate_fmt="{:.2f}")
    return stamp(fig, result)
