"""The toy producer/consumer pipeline behind chapter 2, and the harness that runs a reader's
handoff code.

One *layer* of the pipeline, as in FSDP2's forward with a single GPU standing in for the
collective (post: https://docs.pytorch.org/devlogs/eager/2026-09-29-cross-stream-memory-without-record-stream/):

1. the **producer** stream (the "all-gather" stream) optionally works for ``producer_ms``,
   then allocates the layer's buffer and fills it with the layer's value ``k = i + 1``;
2. the **consumer** (compute) stream waits for that fill with an event, works for
   ``consumer_ms`` (a calibrated ``torch.cuda._sleep``, so the race is set by time, not
   by clock speed) and then reads the buffer: a row sum over a ``(rows, 1024)`` view,
   written into a preallocated output row, so the read itself allocates nothing;
3. the host drops its reference as soon as that work is enqueued, protected (or not)
   by one of four strategies (:data:`STRATEGIES`).

Row sums are exact in fp32 (at most 1024 × 64 = 65536), and a later layer always
writes a larger value, so a read is correct exactly when every row sum equals
``1024 * k``.

Why the strategies differ is the allocator's stream rule: a freed block goes back to
the pool of the stream it was allocated on and is handed out again at once to the next
request on that stream (``c10/cuda/CUDACachingAllocator.cpp``, ``get_free_block``,
``free``, ``insert_events``, ``process_events``).

Everything here needs a CUDA GPU; importing the module does not.
"""
from __future__ import annotations

import collections
import time
from typing import Any, Callable, Sequence

from ..core.lazy_torch import torch
from ..core.units import MiB
from ..core.measure import calibrate_sleep, gpu_sleep, host_spin, reset_allocator, track_memory

ROW = 1024  # elements per row of the view the consumer reduces
FLOAT_BYTES = 4

STRATEGIES: dict[str, str] = {
    "unprotected": "drop the reference right after enqueueing the consumer's read",
    "stall": "the host waits for the consumer's event (Event.synchronize), then drops the reference",
    "record_stream": "buf.record_stream(consumer), then drop the reference",
    "event": "keep (buffer, event) pairs; the producer stream waits on the oldest event, then drop it",
}
STRATEGY_LABELS: dict[str, str] = {
    "unprotected": "unprotected",
    "stall": "stall\n(host waits)",
    "record_stream": "record_stream",
    "event": "event\nhandoff",
}


def buffer_numel(buffer_mib: float) -> int:
    """fp32 elements in a buffer of ``buffer_mib`` MiB (a whole number of 1024-element rows).

    Raises:
        ValueError: ``buffer_mib`` below 1 MiB (the read needs at least 256 rows).
    """
    if buffer_mib < 1:
        raise ValueError(f"buffer_mib must be >= 1 MiB, got {buffer_mib}")
    numel = int(buffer_mib * MiB) // FLOAT_BYTES
    return numel - numel % ROW


def max_live_buffers(strategy: str, layers: int, in_flight: int) -> int:
    """How many buffers a strategy may hold at once, at worst (for sizing with ``check_fits``).

    ``record_stream`` can park every layer's block; the event handoff holds ``in_flight``
    consumed buffers plus the one being filled; the other two hold one.

    Raises:
        ValueError: an unknown strategy.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {list(STRATEGIES)}, got {strategy!r}")
    if strategy == "record_stream":
        return layers
    if strategy == "event":
        return min(layers, in_flight + 1)
    return 1


# ------------------------------------------------------------------ pure helpers (no GPU)

def union_intervals(intervals: Sequence[Sequence[float]]) -> list[tuple[float, float]]:
    """Merge overlapping ``(start, end)`` intervals; returns them sorted and disjoint."""
    out: list[list[float]] = []
    for s, e in sorted((float(a), float(b)) for a, b in intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def overlap_ms(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]]) -> float:
    """Time (ms) during which both interval sets are busy: |union(a) ∩ union(b)|.

    Used to say how much producer work ran concurrently with consumer work.
    """
    ua, ub = union_intervals(a), union_intervals(b)
    i = j = 0
    total = 0.0
    while i < len(ua) and j < len(ub):
        lo, hi = max(ua[i][0], ub[j][0]), min(ua[i][1], ub[j][1])
        if hi > lo:
            total += hi - lo
        if ua[i][1] < ub[j][1]:
            i += 1
        else:
            j += 1
    return total


def block_ids(ptrs: Sequence[int]) -> list[int]:
    """Number each distinct address in order of first use: [a, b, a] -> [0, 1, 0]."""
    seen: dict[int, int] = {}
    return [seen.setdefault(p, len(seen)) for p in ptrs]




def _timed_event(stream: torch.cuda.Stream) -> torch.cuda.Event:
    ev = torch.cuda.Event(enable_timing=True)
    ev.record(stream)
    return ev


def _read_check(outs: torch.Tensor) -> dict[str, Any]:
    """Per-layer value the consumer read (row sum / 1024): min, max, mean, and the bad layers."""
    vals = outs / ROW
    vmin, vmax, vmean = vals.amin(dim=1).tolist(), vals.amax(dim=1).tolist(), vals.mean(dim=1).tolist()
    bad = [i for i in range(outs.shape[0]) if vmin[i] != i + 1 or vmax[i] != i + 1]
    return {"read_min": vmin, "read_max": vmax, "read_mean": vmean, "corrupted_layers": len(bad),
            "first_corrupted_layer": (bad[0] + 1) if bad else None}


# ------------------------------------------------------------------ the pipeline

def run_pipeline(
    strategy: str,
    *,
    layers: int,
    buffer_mib: float,
    producer_ms: float = 0.0,
    consumer_ms: float = 0.0,
    host_delay_ms: float = 0.0,
    in_flight: int = 1,
    instrument: bool = False,
) -> dict[str, Any]:
    """Run the pipeline once on fresh streams, from an emptied cache; return what happened.

    Args:
        strategy: one of :data:`STRATEGIES`.
        layers: number of layers (buffers produced and consumed).
        buffer_mib: size of each layer's buffer in MiB.
        producer_ms: GPU work on the producer before each fill (the collective's duration).
        consumer_ms: GPU work on the consumer before each read (the layer's compute).
        host_delay_ms: host busy time after each layer (how slowly the CPU issues layers).
        in_flight: for 'event', consumed buffers kept referenced (0 = the producer waits
            for the consumer of the buffer it is about to replace: no overlap).
        instrument: record CUDA events around every producer and consumer step.

    Returns:
        dict with ``ptrs`` (data_ptr per layer), ``alloc_host_ms`` (host time of each
        ``torch.empty``), ``memory`` (:class:`~experiments.core.measure.MemoryStats` relative to
        the start, read after the pipeline and before the check), ``span_ms`` (GPU time
        from the first producer step to the last read, CUDA events), ``host_loop_ms``
        (host time to enqueue all layers), ``wall_ms`` (host time until the GPU finished),
        the read check (:func:`_read_check`), and with ``instrument`` the per-layer
        intervals ``producer``, ``consumer``, ``host`` (ms from the start) and ``del_ms``.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {list(STRATEGIES)}, got {strategy!r}")
    numel = buffer_numel(buffer_mib)
    rows = numel // ROW
    calibrate_sleep()  # cached; calibrating inside the loop would synchronize mid-pipeline
    producer, consumer = torch.cuda.Stream(), torch.cuda.Stream()
    reset_allocator()
    outs = torch.zeros(layers, rows, device="cuda")
    keep: collections.deque = collections.deque()
    ptrs: list[int] = []
    alloc_ms: list[float] = []
    del_ms: list[float] = []
    host_iv: list[tuple[float, float]] = []
    gpu_marks: list[tuple[Any, Any, Any, Any]] = []
    with track_memory() as mem:
        ref = _timed_event(producer)
        t0 = time.perf_counter()
        for i in range(layers):
            h_start = (time.perf_counter() - t0) * 1e3
            with torch.cuda.stream(producer):
                p0 = _timed_event(producer) if instrument else None
                gpu_sleep(producer_ms)
                a0 = time.perf_counter()
                buf = torch.empty(numel, device="cuda")  # belongs to the producer stream
                alloc_ms.append((time.perf_counter() - a0) * 1e3)
                buf.fill_(float(i + 1))
                ptrs.append(buf.data_ptr())
                ready = _timed_event(producer) if instrument else producer.record_event()
            consumer.wait_event(ready)
            with torch.cuda.stream(consumer):
                c0 = _timed_event(consumer) if instrument else None
                gpu_sleep(consumer_ms)
                torch.sum(buf.view(rows, ROW), dim=1, out=outs[i])
                done = _timed_event(consumer) if instrument else consumer.record_event()
            if strategy == "unprotected":
                del buf
            elif strategy == "stall":
                done.synchronize()
                del buf
            elif strategy == "record_stream":
                buf.record_stream(consumer)
                del buf
            else:
                keep.append((buf, done))
                del buf
                while len(keep) > in_flight:
                    old, old_done = keep.popleft()
                    producer.wait_event(old_done)  # the wait goes in before the release
                    del old
            del_ms.append((time.perf_counter() - t0) * 1e3)
            host_spin(host_delay_ms)
            host_iv.append((h_start, (time.perf_counter() - t0) * 1e3))
            if instrument:
                gpu_marks.append((p0, ready, c0, done))
        host_loop_ms = (time.perf_counter() - t0) * 1e3
        while keep:
            old, old_done = keep.popleft()
            producer.wait_event(old_done)
            del old
        end = _timed_event(consumer)
        torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - t0) * 1e3
    out: dict[str, Any] = {
        "ptrs": ptrs, "alloc_host_ms": alloc_ms, "memory": mem.delta, "span_ms": ref.elapsed_time(end),
        "host_loop_ms": host_loop_ms, "wall_ms": wall_ms, **_read_check(outs),
    }
    if instrument:
        out["producer"] = [(ref.elapsed_time(p0), ref.elapsed_time(p1)) for p0, p1, _, _ in gpu_marks]
        out["consumer"] = [(ref.elapsed_time(c0), ref.elapsed_time(c1)) for _, _, c0, c1 in gpu_marks]
        out["host"] = host_iv
        out["del_ms"] = del_ms
    del outs
    reset_allocator()  # also frees blocks that record_stream left parked
    return out


def warm_up() -> None:
    """Calibrate the GPU delay and run every strategy once, small, so kernels and event
    pools exist before anything is measured."""
    calibrate_sleep()
    for s in STRATEGIES:
        run_pipeline(s, layers=2, buffer_mib=1, consumer_ms=0.05, instrument=True)
    reset_allocator()


# ------------------------------------------------------------------ the reader's handoff

HandoffFn = Callable[[Callable[[int], "torch.Tensor"], Callable[["torch.Tensor", int], "torch.cuda.Event"], int,
                      "torch.cuda.Stream", "torch.cuda.Stream"], Any]


class RecordStreamForbidden(RuntimeError):
    """Raised when code under test calls ``Tensor.record_stream`` in the handoff exercise."""


def _forbidden_record_stream(self: torch.Tensor, stream: Any) -> None:
    raise RecordStreamForbidden("record_stream is not allowed in this exercise")


def run_handoff(
    handoff: HandoffFn,
    *,
    layers: int,
    buffer_mib: float,
    producer_ms: float,
    consumer_ms: float,
    forbid_record_stream: bool = True,
) -> dict[str, Any]:
    """Run a handoff loop written against the exercise's interface, once.

    ``handoff(all_gather, forward, layers, producer, consumer)`` must, for every layer,
    call ``buf = all_gather(layer)`` (allocates and fills on ``producer``) and
    ``done = forward(buf, layer)`` (the consumer's read; ``done`` is an event recorded on
    ``consumer`` after it), and release each buffer safely.

    Returns:
        as :func:`run_pipeline` (without instrumentation), plus ``error`` (None, or the
        text of an exception the handoff raised), ``error_kind`` (None, 'record_stream'
        or 'exception') and ``consumed`` (layers for which ``forward`` was called).
    """
    numel = buffer_numel(buffer_mib)
    rows = numel // ROW
    calibrate_sleep()
    producer, consumer = torch.cuda.Stream(), torch.cuda.Stream()
    reset_allocator()
    outs = torch.zeros(layers, rows, device="cuda")
    ptrs: list[int] = []
    ready: dict[int, Any] = {}
    consumed: set[int] = set()

    def all_gather(layer: int) -> torch.Tensor:
        if not 0 <= layer < layers:
            raise IndexError(f"layer must be in [0, {layers - 1}], got {layer}")
        with torch.cuda.stream(producer):
            gpu_sleep(producer_ms)
            buf = torch.empty(numel, device="cuda")
            buf.fill_(float(layer + 1))
            ptrs.append(buf.data_ptr())
            ready[layer] = producer.record_event()
        return buf

    def forward(buf: torch.Tensor, layer: int) -> torch.cuda.Event:
        if layer not in ready:
            raise RuntimeError(f"forward({layer}) was called before all_gather({layer})")
        consumer.wait_event(ready[layer])
        with torch.cuda.stream(consumer):
            gpu_sleep(consumer_ms)
            torch.sum(buf.view(rows, ROW), dim=1, out=outs[layer])
            consumed.add(layer)
            return consumer.record_event()

    saved = torch.Tensor.__dict__.get("record_stream")
    error, kind = None, None
    if forbid_record_stream:
        torch.Tensor.record_stream = _forbidden_record_stream  # type: ignore[method-assign]
    try:
        with track_memory() as mem:
            ref = _timed_event(producer)
            t0 = time.perf_counter()
            try:
                handoff(all_gather, forward, layers, producer, consumer)
            except RecordStreamForbidden as e:
                error, kind = str(e), "record_stream"
            except Exception as e:  # the reader's code: report, do not crash the page
                error, kind = f"{type(e).__name__}: {e}", "exception"
            host_loop_ms = (time.perf_counter() - t0) * 1e3
            end = _timed_event(consumer)
            torch.cuda.synchronize()
            wall_ms = (time.perf_counter() - t0) * 1e3
    finally:
        if forbid_record_stream:
            if saved is None:
                del torch.Tensor.record_stream
            else:
                torch.Tensor.record_stream = saved  # type: ignore[method-assign]
    out = {"ptrs": ptrs, "memory": mem.delta, "span_ms": ref.elapsed_time(end), "host_loop_ms": host_loop_ms,
           "wall_ms": wall_ms, "error": error, "error_kind": kind, "consumed": sorted(consumed), **_read_check(outs)}
    del outs
    reset_allocator()
    return out


def reference_handoff(all_gather: Callable, forward: Callable, layers: int,
                      producer: torch.cuda.Stream, consumer: torch.cuda.Stream) -> None:
    """The post's recommended loop: keep the last consumed buffer one layer longer; before
    dropping it, make the producer (allocation) stream wait on its consumer's event."""
    kept = None  # (buffer, event) of the previous layer
    for layer in range(layers):
        buf = all_gather(layer)  # a second block: the previous one is still referenced
        done = forward(buf, layer)
        if kept is not None:
            producer.wait_event(kept[1])  # first the wait on the allocation stream ...
        kept = (buf, done)  # ... then the previous pair, and its buffer, is dropped
        del buf
    if kept is not None:
        producer.wait_event(kept[1])
