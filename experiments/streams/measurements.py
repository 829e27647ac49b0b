"""Chapter 2 (Cross-stream memory): the race, ``record_stream``, and the event handoff.

A buffer allocated on one CUDA stream and read on another is invisible, on the second
stream, to PyTorch's caching allocator: it hands the block out again to the next request
on the allocation stream as soon as Python drops the tensor. The experiments here run a
layer-by-layer producer/consumer pipeline (:mod:`experiments.streams.workloads`) under
four strategies and measure correctness, the allocator's counters and GPU time.

Source post: "Cross-stream memory management: wait_event instead of record_stream"
(Wei Feng, PyTorch DevLog, 2026-09-29), :data:`POST_URL`. API: ``Tensor.record_stream``,
https://docs.pytorch.org/docs/stable/generated/torch.Tensor.record_stream.html; CUDA
streams, https://docs.pytorch.org/docs/stable/notes/cuda.html#cuda-streams; allocator
source, ``c10/cuda/CUDACachingAllocator.cpp``.
"""
from __future__ import annotations

import math
import statistics
from typing import Any, Mapping, Sequence

from ..core.claims import claim
from ..core.units import mib_figure
from ..core.device import check_fits
from ..core.registry import Param, experiment
from ..core.runner import run_fresh
from ..core.units import MiB
from .workloads import (
    STRATEGIES, block_ids, buffer_numel, max_live_buffers, overlap_ms, run_pipeline, warm_up,
)


POST_URL = "https://docs.pytorch.org/devlogs/eager/2026-09-29-cross-stream-memory-without-record-stream/"

#: (GPU work per layer on the consumer, host delay per layer), both in ms. Run-ahead per
#: layer is their difference: how much further behind the GPU falls with each layer.
RUNAHEAD_POINTS: tuple[tuple[float, float], ...] = (
    (0.0, 0.0), (0.25, 0.0), (1.0, 0.0), (4.0, 0.0), (10.0, 0.0), (10.0, 2.0), (10.0, 5.0), (10.0, 20.0),
)
#: Room for small scratch allocations above whole buffers when bounding the event handoff.
SLACK_BYTES = 1 * MiB


def _size_check(strategy_or_all: str, layers: int, buffer_mib: int, in_flight: int) -> None:
    live = layers if strategy_or_all == "all" else max_live_buffers(strategy_or_all, layers, in_flight)
    check_fits("layers × buffer_mib", live * buffer_numel(buffer_mib) * 4)


def _num(minimum: float | None = None) -> dict[str, Any]:
    return {"type": "number"} if minimum is None else {"type": "number", "minimum": minimum}


def _int(minimum: int = 0) -> dict[str, Any]:
    return {"type": "integer", "minimum": minimum}


def _list(item: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": item}


def _obj(props: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": "object", "required": list(props), "properties": dict(props)}


# ================================================================== experiments

_STRATEGY_SUMMARY = _obj({
    "trials": _int(1), "corrupted_trials": _int(), "corrupted_layers_max": _int(), "distinct_blocks": _int(1),
    "peak_allocated_bytes": _int(), "peak_active_bytes": _int(), "peak_reserved_bytes": _int(),
    "span_ms": _num(0), "overlap_ms": _num(0), "wall_ms": _num(0), "host_loop_ms": _num(0),
    "read_mean": _list(_num()),
})


@experiment(
    "streams.strategies",
    chapter=2,
    title="The race and three fixes: four handoff strategies side by side",
    params=[
        Param("layers", 4, min=2, max=32, unit="layers", help="buffers produced and consumed per trial"),
        Param("buffer_mib", 64, min=1, max=1024, unit="MiB", help="size of each layer's buffer"),
        Param("producer_ms", 0.5, min=0.0, max=20.0, unit="ms", help="GPU work on the producer before each fill"),
        Param("consumer_ms", 2.0, min=0.0, max=20.0, unit="ms", help="GPU work on the consumer before each read"),
        Param("in_flight", 1, min=0, max=8, unit="buffers", help="consumed buffers the event handoff keeps"),
        Param("trials", 10, min=1, max=50, unit="trials", help="repetitions of each strategy"),
    ],
    grid={"layers": [4, 8], "consumer_ms": [0.0, 0.5, 2.0]},
    data_schema=_obj({
        "strategies": _list({"type": "string", "enum": list(STRATEGIES)}),
        "buffer_bytes": _int(1), "layers": _int(1), "in_flight": _int(), "serial_ms": _num(0),
        "results": {"type": "object", "required": list(STRATEGIES),
                    "properties": {s: _STRATEGY_SUMMARY for s in STRATEGIES}},
    }),
)
def strategies(layers: int = 4, buffer_mib: int = 64, producer_ms: float = 0.5, consumer_ms: float = 2.0,
               in_flight: int = 1, trials: int = 10) -> dict[str, Any]:
    """Run every strategy ``trials`` times (interleaved) and summarise each.

    Per strategy (``results[strategy]``): corrupted trials (any layer read a wrong value)
    out of ``trials``; the most corrupted layers in one trial; the most distinct buffer
    addresses in one trial; peak allocated, active and reserved bytes above the start of a
    trial (largest over trials; read after the pipeline, before the correctness check);
    median GPU span, producer/consumer overlap, host enqueue time and wall time in ms;
    and the value each layer's consumer read (``read_mean``; of a corrupted trial if there
    was one). ``serial_ms`` is ``layers × (producer_ms + consumer_ms)``: the span with no
    overlap at all. About ``4 × trials × layers × consumer_ms`` of GPU time.

    Raises:
        ValueError: a parameter out of range, or layers × buffer_mib beyond the GPU.
    """
    _size_check("all", layers, buffer_mib, in_flight)
    warm_up()
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in STRATEGIES}
    for _ in range(trials):
        for s in STRATEGIES:  # interleaved, so slow drift hits every strategy alike
            runs[s].append(run_pipeline(s, layers=layers, buffer_mib=buffer_mib,
                                        producer_ms=producer_ms, consumer_ms=consumer_ms,
                                        in_flight=in_flight, instrument=True))
    return {
        "strategies": list(STRATEGIES),
        "buffer_bytes": buffer_numel(buffer_mib) * 4,
        "layers": layers,
        "in_flight": in_flight,
        "serial_ms": layers * (producer_ms + consumer_ms),
        "results": {s: _summarise(rs) for s, rs in runs.items()},
    }


def _summarise(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    shown = next((r for r in runs if r["corrupted_layers"]), runs[-1])
    return {
        "trials": len(runs),
        "corrupted_trials": sum(1 for r in runs if r["corrupted_layers"]),
        "corrupted_layers_max": max(r["corrupted_layers"] for r in runs),
        "distinct_blocks": max(len(set(r["ptrs"])) for r in runs),
        "peak_allocated_bytes": max(r["memory"].allocated_peak for r in runs),
        "peak_active_bytes": max(r["memory"].active_peak for r in runs),
        "peak_reserved_bytes": max(r["memory"].reserved_peak for r in runs),
        "span_ms": statistics.median(r["span_ms"] for r in runs),
        "overlap_ms": statistics.median(overlap_ms(r["producer"], r["consumer"]) for r in runs),
        "wall_ms": statistics.median(r["wall_ms"] for r in runs),
        "host_loop_ms": statistics.median(r["host_loop_ms"] for r in runs),
        "read_mean": shown["read_mean"],
    }


_PIPELINE_GRID = (
    [{"strategy": s, "consumer_ms": c, "host_delay_ms": h}
     for s in STRATEGIES for c in (0.0, 1.0, 10.0) for h in (0.0, 5.0, 20.0)]
    + [{"strategy": "event", "in_flight": n} for n in (0, 2, 4)]
)


@experiment(
    "streams.pipeline",
    chapter=2,
    title="One pipeline run: strategy, run-ahead and memory",
    params=[
        Param("strategy", "record_stream", choices=tuple(STRATEGIES), help="how the host releases each buffer"),
        Param("layers", 32, min=1, max=64, unit="layers"),
        Param("buffer_mib", 64, min=1, max=1024, unit="MiB"),
        Param("consumer_ms", 10.0, min=0.0, max=50.0, unit="ms", help="GPU work per layer (consumer)"),
        Param("host_delay_ms", 0.0, min=0.0, max=50.0, unit="ms", help="host work per layer"),
        Param("in_flight", 1, min=0, max=8, unit="buffers", help="consumed buffers the event handoff keeps"),
        Param("producer_ms", 0.0, min=0.0, max=20.0, unit="ms", help="GPU work per layer (producer)"),
    ],
    grid=_PIPELINE_GRID,
    data_schema=_obj({
        "strategy": {"type": "string", "enum": list(STRATEGIES)}, "layers": _int(1), "buffer_bytes": _int(1),
        "in_flight": _int(), "distinct_blocks": _int(1), "corrupted_layers": _int(),
        "read_mean": _list(_num()), "peak_allocated_bytes": _int(), "peak_active_bytes": _int(),
        "peak_reserved_bytes": _int(), "num_alloc_retries": _int(), "span_ms": _num(0), "wall_ms": _num(0),
        "host_loop_ms": _num(0), "worst_alloc_ms": _num(0),
    }),
)
def pipeline(strategy: str = "record_stream", layers: int = 32, buffer_mib: int = 64, consumer_ms: float = 10.0,
             host_delay_ms: float = 0.0, in_flight: int = 1, producer_ms: float = 0.0) -> dict[str, Any]:
    """One run of the pipeline with one strategy.

    Returns the distinct buffer addresses, corrupted layers and the value each layer
    read; peak allocated, active and reserved bytes above the start (read before the
    correctness check) and allocator retries; the GPU span, host enqueue time and wall
    time, and the slowest single ``torch.empty`` on the host, all in ms. GPU time is
    about ``layers × max(consumer_ms, host_delay_ms)``.

    Raises:
        ValueError: a parameter out of range, or more live buffers than the GPU holds.
    """
    _size_check(strategy, layers, buffer_mib, in_flight)
    warm_up()
    r = run_pipeline(strategy, layers=layers, buffer_mib=buffer_mib, producer_ms=producer_ms,
                     consumer_ms=consumer_ms, host_delay_ms=host_delay_ms, in_flight=in_flight)
    m = r["memory"]
    return {
        "strategy": strategy, "layers": layers, "buffer_bytes": buffer_numel(buffer_mib) * 4,
        "in_flight": in_flight, "distinct_blocks": len(set(r["ptrs"])),
        "corrupted_layers": r["corrupted_layers"], "read_mean": r["read_mean"],
        "peak_allocated_bytes": m.allocated_peak, "peak_active_bytes": m.active_peak,
        "peak_reserved_bytes": m.reserved_peak, "num_alloc_retries": m.num_alloc_retries,
        "span_ms": r["span_ms"], "wall_ms": r["wall_ms"], "host_loop_ms": r["host_loop_ms"],
        "worst_alloc_ms": max(r["alloc_host_ms"]),
    }


_SERIES = _obj({k: _list(_num()) for k in (
    "peak_active_bytes", "peak_allocated_bytes", "peak_reserved_bytes", "distinct_blocks", "corrupted_layers",
    "span_ms", "host_loop_ms")})


@experiment(
    "streams.runahead",
    chapter=2,
    title="Peak memory follows CPU run-ahead: record_stream against the event handoff",
    params=[
        Param("layers", 32, min=4, max=64, unit="layers"),
        Param("buffer_mib", 64, min=1, max=512, unit="MiB"),
        Param("in_flight", 1, min=0, max=4, unit="buffers", help="consumed buffers the event handoff keeps"),
        Param("repeats", 3, min=1, max=10, unit="runs", help="runs per point; medians are reported"),
    ],
    grid=None,
    data_schema=_obj({
        "layers": _int(1), "buffer_bytes": _int(1), "in_flight": _int(), "repeats": _int(1),
        "points": _list(_obj({"consumer_ms": _num(0), "host_delay_ms": _num(0), "runahead_ms": _num()})),
        "record_stream": _SERIES, "event": _SERIES,
    }),
)
def runahead(layers: int = 32, buffer_mib: int = 64, in_flight: int = 1, repeats: int = 3) -> dict[str, Any]:
    """Sweep GPU work per layer and host delay per layer (:data:`RUNAHEAD_POINTS`) for
    ``record_stream`` and the event handoff.

    For each strategy, lists aligned with ``points`` hold the medians over ``repeats``
    runs of peak active, allocated and reserved bytes above the start, distinct buffers,
    GPU span and host enqueue time (ms); ``corrupted_layers`` holds the maximum. About
    ``2 × repeats × layers × Σ max(consumer_ms, host_delay_ms)`` of time (≈ 11 s at
    the defaults).

    Raises:
        ValueError: a parameter out of range, or layers × buffer_mib beyond the GPU.
    """
    _size_check("record_stream", layers, buffer_mib, in_flight)
    warm_up()
    keys = ("peak_active_bytes", "peak_allocated_bytes", "peak_reserved_bytes", "distinct_blocks",
            "corrupted_layers", "span_ms", "host_loop_ms")
    raw: dict[str, list[list[dict[str, float]]]] = {s: [[] for _ in RUNAHEAD_POINTS]
                                                    for s in ("record_stream", "event")}
    for _ in range(repeats):
        for k, (c, h) in enumerate(RUNAHEAD_POINTS):
            for s in raw:
                r = run_pipeline(s, layers=layers, buffer_mib=buffer_mib, consumer_ms=c,
                                 host_delay_ms=h, in_flight=in_flight)
                m = r["memory"]
                raw[s][k].append({"peak_active_bytes": m.active_peak, "peak_allocated_bytes": m.allocated_peak,
                                  "peak_reserved_bytes": m.reserved_peak, "distinct_blocks": len(set(r["ptrs"])),
                                  "corrupted_layers": r["corrupted_layers"], "span_ms": r["span_ms"],
                                  "host_loop_ms": r["host_loop_ms"]})
    out: dict[str, Any] = {
        "layers": layers, "buffer_bytes": buffer_numel(buffer_mib) * 4, "in_flight": in_flight,
        "repeats": repeats,
        "points": [{"consumer_ms": c, "host_delay_ms": h, "runahead_ms": c - h} for c, h in RUNAHEAD_POINTS],
    }
    for s, per_point in raw.items():
        out[s] = {key: [(max if key == "corrupted_layers" else statistics.median)(run[key] for run in runs)
                        for runs in per_point] for key in keys}
    return out


_CAP_STRATEGY = _obj({
    "num_alloc_retries": _int(), "num_ooms": _int(), "alloc_host_ms": _list(_num(0)), "worst_alloc_ms": _num(0),
    "peak_reserved_bytes": _int(), "peak_active_bytes": _int(), "wall_ms": _num(0), "span_ms": _num(0),
    "corrupted_layers": _int(), "oom": {"type": "boolean"}, "message": {"type": "string"},
})


def validate_cap(layers: int, buffer_mib: int, cap_mib: int, in_flight: int) -> None:
    """Reject caps that cannot show the effect (no GPU needed).

    The event handoff must fit with room to spare, (in_flight + 1) × buffer + 64 MiB ≤ cap,
    and ``record_stream`` must be able to outgrow the cap, layers × buffer ≥ 1.5 × cap.

    Raises:
        ValueError: naming cap_mib (or layers) and the allowed range.
    """
    need = (in_flight + 1) * buffer_mib + 64
    if cap_mib < need:
        raise ValueError(f"cap_mib must be at least (in_flight + 1) × buffer_mib + 64 = {need} MiB so that the "
                         f"event handoff fits, got {cap_mib}")
    if layers * buffer_mib < 1.5 * cap_mib:
        raise ValueError(f"layers × buffer_mib must be at least 1.5 × cap_mib = {1.5 * cap_mib:g} MiB so that "
                         f"record_stream can outgrow the cap; got {layers} × {buffer_mib} = {layers * buffer_mib} MiB")


@experiment(
    "streams.memory_cap",
    chapter=2,
    title="Under a memory cap: record_stream's hidden stall",
    params=[
        Param("layers", 48, min=8, max=128, unit="layers"),
        Param("buffer_mib", 64, min=8, max=256, unit="MiB"),
        Param("cap_mib", 1024, min=256, max=16384, unit="MiB", help="per-process memory cap in a fresh process"),
        Param("consumer_ms", 2.5, min=0.5, max=20.0, unit="ms", help="GPU work per layer (consumer)"),
        Param("in_flight", 1, min=0, max=4, unit="buffers"),
    ],
    grid=None,
    data_schema=_obj({
        "cap_mib": _int(1), "layers": _int(1), "buffer_bytes": _int(1),
        "strategies": {"type": "object", "required": ["record_stream", "event"],
                       "properties": {"record_stream": _CAP_STRATEGY, "event": _CAP_STRATEGY}},
    }),
)
def memory_cap(layers: int = 48, buffer_mib: int = 64, cap_mib: int = 1024, consumer_ms: float = 2.5,
               in_flight: int = 1) -> dict[str, Any]:
    """``record_stream`` and the event handoff in a fresh process capped at ``cap_mib``.

    Per strategy: allocator retries (``num_alloc_retries``: the "free everything and try
    again" path, which first waits for every outstanding event) and OOMs, the host time of
    each buffer allocation (ms) and the worst one, peak reserved and active bytes, wall
    and GPU time (ms), corrupted layers. A few seconds, most of it starting the process.

    Raises:
        ValueError: a parameter out of range, a cap the GPU cannot give, or a cap that
            cannot show the effect (:func:`validate_cap`).
        FreshProcessError: the fresh process failed (its message and stderr included).
    """
    validate_cap(layers, buffer_mib, cap_mib, in_flight)
    check_fits("cap_mib", cap_mib * MiB)
    res = run_fresh("experiments.streams.measurements:_cap_worker",
                    {"layers": layers, "buffer_mib": buffer_mib, "consumer_ms": consumer_ms,
                     "in_flight": in_flight},
                    memory_cap_mib=cap_mib, timeout_s=240)
    value = res.unwrap()
    return {"cap_mib": cap_mib, "layers": layers, "buffer_bytes": buffer_numel(buffer_mib) * 4,
            "strategies": value}


def _cap_worker(layers: int, buffer_mib: int, consumer_ms: float, in_flight: int) -> dict[str, Any]:
    """Runs in the capped fresh process; an OOM comes back as data, not as a crash."""
    import torch

    oom_error = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
    warm_up()
    out = {}
    for s in ("record_stream", "event"):
        try:
            r = run_pipeline(s, layers=layers, buffer_mib=buffer_mib, consumer_ms=consumer_ms, in_flight=in_flight)
        except oom_error as e:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            out[s] = {"num_alloc_retries": 0, "num_ooms": 1, "alloc_host_ms": [], "worst_alloc_ms": 0.0,
                      "peak_reserved_bytes": 0, "peak_active_bytes": 0, "wall_ms": 0.0, "span_ms": 0.0,
                      "corrupted_layers": 0, "oom": True, "message": str(e)[:600]}
            continue
        m = r["memory"]
        out[s] = {"num_alloc_retries": m.num_alloc_retries, "num_ooms": m.num_ooms,
                  "alloc_host_ms": r["alloc_host_ms"], "worst_alloc_ms": max(r["alloc_host_ms"]),
                  "peak_reserved_bytes": m.reserved_peak, "peak_active_bytes": m.active_peak,
                  "wall_ms": r["wall_ms"], "span_ms": r["span_ms"], "corrupted_layers": r["corrupted_layers"],
                  "oom": False, "message": ""}
    return out


_INTERVALS = _list({"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2})


@experiment(
    "streams.timeline",
    chapter=2,
    title="Stream timeline: producer, consumer and host, from CUDA events",
    params=[
        Param("strategy", "unprotected", choices=tuple(STRATEGIES)),
        Param("layers", 4, min=2, max=8, unit="layers"),
        Param("buffer_mib", 64, min=1, max=512, unit="MiB"),
        Param("producer_ms", 0.5, min=0.0, max=5.0, unit="ms"),
        Param("consumer_ms", 2.0, min=0.0, max=10.0, unit="ms"),
        Param("in_flight", 1, min=0, max=4, unit="buffers"),
    ],
    grid={"strategy": list(STRATEGIES)},
    data_schema=_obj({
        "strategy": {"type": "string"}, "layers": _int(1), "span_ms": _num(0), "producer": _INTERVALS,
        "consumer": _INTERVALS, "host": _INTERVALS, "del_ms": _list(_num()), "block": _list(_int()),
        "read_mean": _list(_num()), "corrupted_layers": _int(), "distinct_blocks": _int(1),
    }),
)
def timeline(strategy: str = "unprotected", layers: int = 4, buffer_mib: int = 64, producer_ms: float = 0.5,
             consumer_ms: float = 2.0, in_flight: int = 1) -> dict[str, Any]:
    """One instrumented run: per layer, the producer's interval (its work and the fill),
    the consumer's (from the end of its wait to the end of its read), and the host's
    (enqueueing the layer, including any wait), in ms after a reference event recorded on
    the idle GPU; ``del_ms`` is when the host dropped its reference, ``block`` numbers the
    buffer addresses in order of first use (equal numbers: the same memory).

    Host times are ``perf_counter`` readings from the moment the reference event was
    enqueued, so they line up with the GPU's within the launch latency (a few µs).

    Raises:
        ValueError: a parameter out of range.
    """
    _size_check(strategy, layers, buffer_mib, in_flight)
    warm_up()
    r = run_pipeline(strategy, layers=layers, buffer_mib=buffer_mib, producer_ms=producer_ms,
                     consumer_ms=consumer_ms, in_flight=in_flight, instrument=True)
    return {
        "strategy": strategy, "layers": layers, "span_ms": r["span_ms"],
        "producer": [list(iv) for iv in r["producer"]], "consumer": [list(iv) for iv in r["consumer"]],
        "host": [list(iv) for iv in r["host"]], "del_ms": r["del_ms"], "block": block_ids(r["ptrs"]),
        "read_mean": r["read_mean"], "corrupted_layers": r["corrupted_layers"], "distinct_blocks": len(set(r["ptrs"])),
    }


# ================================================================== claims

@claim("streams.race", chapter=2, experiment="streams.strategies", source=POST_URL,
       statement="Without lifetime management, a buffer handed from the producer to the consumer stream is "
                 "overwritten by a later layer while it is read: at least one of N trials is corrupted.")
def _claim_race(d: Mapping[str, Any]) -> tuple[bool, dict[str, Any]]:
    r = d["results"]["unprotected"]
    return r["corrupted_trials"] >= 1, {"corrupted trials": r["corrupted_trials"], "trials": r["trials"],
                                        "most corrupted layers in a trial": r["corrupted_layers_max"]}


@claim("streams.fixes_correct", chapter=2, experiment="streams.strategies", source=POST_URL,
       statement="Stalling the host, record_stream and the event handoff each corrupt none of N trials.")
def _claim_fixes(d: Mapping[str, Any]) -> tuple[bool, dict[str, Any]]:
    fixes = ("stall", "record_stream", "event")
    bad = {s: d["results"][s]["corrupted_trials"] for s in fixes}
    return all(v == 0 for v in bad.values()), {**{f"{s}: corrupted trials": v for s, v in bad.items()},
                                               "trials each": d["results"]["stall"]["trials"]}


def _extreme_points(d: Mapping[str, Any]) -> tuple[int, int]:
    ra = [pt["runahead_ms"] for pt in d["points"]]
    return ra.index(min(ra)), ra.index(max(ra))




def _point_text(pt: Mapping[str, Any]) -> str:
    return f"{pt['consumer_ms']:g} ms GPU / {pt['host_delay_ms']:g} ms host"


@claim("streams.record_stream_runahead", chapter=2, experiment="streams.runahead", source=POST_URL,
       statement="With record_stream (32 layers), peak active bytes at the largest CPU run-ahead are at least "
                 "8× those at the smallest.")
def _claim_runahead(d: Mapping[str, Any]) -> tuple[bool, dict[str, Any]]:
    lo, hi = _extreme_points(d)
    act = d["record_stream"]["peak_active_bytes"]
    ratio = act[hi] / act[lo] if act[lo] > 0 else math.inf
    return ratio >= 8, {"peak active MiB, largest run-ahead": mib_figure(act[hi]),
                        "peak active MiB, smallest run-ahead": mib_figure(act[lo]), "ratio": ratio,
                        "largest run-ahead": _point_text(d["points"][hi]),
                        "smallest run-ahead": _point_text(d["points"][lo])}


@claim("streams.event_bounded", chapter=2, experiment="streams.runahead", source=POST_URL,
       statement="With the event handoff, peak active bytes stay at or below (buffers in flight + 1) × buffer "
                 "(within 1 MiB of scratch) at every run-ahead.")
def _claim_event_bounded(d: Mapping[str, Any]) -> tuple[bool, dict[str, Any]]:
    bound = (d["in_flight"] + 1) * d["buffer_bytes"]
    peaks = d["event"]["peak_active_bytes"]
    return max(peaks) <= bound + SLACK_BYTES, {"highest peak active MiB": mib_figure(max(peaks)),
                                               "bound MiB": mib_figure(bound), "buffers in flight": d["in_flight"]}


@claim("streams.allocated_misses_parked", chapter=2, experiment="streams.runahead", source=POST_URL,
       statement="For record_stream at the largest run-ahead, max_memory_allocated is below half of the "
                 "peak active bytes: blocks parked on events count as active, not allocated.")
def _claim_allocated(d: Mapping[str, Any]) -> tuple[bool, dict[str, Any]]:
    _, hi = _extreme_points(d)
    alloc, act = d["record_stream"]["peak_allocated_bytes"][hi], d["record_stream"]["peak_active_bytes"][hi]
    return alloc < 0.5 * act, {"peak allocated MiB": mib_figure(alloc), "peak active MiB": mib_figure(act),
                               "at": _point_text(d["points"][hi])}
