"""Chapter 3, staging buffers pinned once: CUDA graphs read the captured pinned buffer on
every replay, and a ring of pinned buffers feeds a loader (double buffering, guarded by
events). Post: https://docs.pytorch.org/devlogs/eager/2026-08-09-pinned-memory-allocator/"""
from __future__ import annotations

import statistics
import time
from typing import Any, Mapping

from ..core.lazy_torch import torch
from . import model as sup
from ..core.claims import claim
from ..core.device import check_fits, require_cuda, torch_version
from ..core.measure import gpu_sleep, host_spin, time_gpu
from ..core.units import MiB
from .model import POST_URL
from ..core.registry import Param, experiment


from .host import _NUMBER, _release_pinned, _warm_gpu


# ================================================================ 8. CUDA graphs

STAGING_VALUES = (10.0, 11.0, 12.0, 13.0)


@experiment(
    "pinned.graph_replay",
    chapter=3,
    title="A CUDA graph reads the pinned address it captured",
    params=[Param("size_mib", 1, choices=(1, 16), unit="MiB", help="size of the pinned staging buffer")],
    grid={"size_mib": [1, 16]},
    data_schema={
        "type": "object",
        "required": ["n_elements", "after_capture_equal", "in_place", "rebound", "staging", "pageable_capture_error"],
        "properties": {"n_elements": {"type": "integer"}, "after_capture_equal": {"type": "integer"},
                       "in_place": {"type": "object"}, "rebound": {"type": "object"},
                       "staging": {"type": "array", "minItems": 1},
                       "pageable_capture_error": {"type": ["string", "null"]}},
    },
)
def graph_replay(size_mib: int = 1) -> dict[str, Any]:
    """Capture ``dev.copy_(stage, non_blocking=True)`` from a pinned ``stage`` holding 1.0, plus a
    captured readback of ``[dev.min(), dev.max()]`` into a pinned 2-element tensor; then:

    1. replay: the device receives 1.0 (``after_capture_equal``: elements equal to 1.0);
    2. ``stage.fill_(3.0)`` in place, replay (``in_place``: ``value``, ``device_equal``);
    3. ``stage = torch.full(..., 7.0, pin_memory=True)`` (a new buffer under the old name,
       the old one kept alive), replay (``rebound``: ``new_value``, ``device_equal_new``,
       ``device_equal_old`` = elements equal to 3.0);
    4. the graph-safe staging pattern: for each value in ``STAGING_VALUES``, copy it into
       the captured buffer, replay, wait on an event, read the pinned readback
       (``staging``: ``value``, ``min``, ``max``);
    5. try to capture a copy from *pageable* memory (``pageable_capture_error``: the first
       line of the error, or None if capture accepted it).

    Raises:
        ValueError: the buffers do not fit in host or device memory.
    """
    n = size_mib * MiB // 4
    sup.check_host_fits("size_mib", 4 * size_mib * MiB)
    require_cuda("pinned.graph_replay")
    check_fits("size_mib", 2 * size_mib * MiB)
    _warm_gpu()
    stage = torch.full((n,), 1.0, pin_memory=True)
    dev = torch.zeros(n, device="cuda")
    readback = torch.zeros(2, pin_memory=True)

    def step() -> None:
        dev.copy_(stage, non_blocking=True)
        readback.copy_(torch.stack([dev.amin(), dev.amax()]), non_blocking=True)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the capture stream, as the CUDA-graph notes advise
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    torch.cuda.synchronize()

    def replay_count(value: float) -> int:
        dev.zero_()
        graph.replay()
        torch.cuda.synchronize()
        return int((dev == value).sum().item())

    after_capture = replay_count(1.0)
    stage.fill_(3.0)
    in_place = {"value": 3.0, "device_equal": replay_count(3.0)}
    captured = stage  # the graph reads this block; it must stay alive
    stage = torch.full((n,), 7.0, pin_memory=True)
    equal_old = replay_count(3.0)
    rebound = {"new_value": 7.0, "device_equal_new": int((dev == 7.0).sum().item()), "device_equal_old": equal_old}
    staging = []
    done = torch.cuda.Event()
    for value in STAGING_VALUES:
        captured.copy_(torch.full((n,), value))  # host memcpy into the captured pinned buffer
        graph.replay()
        done.record()
        done.synchronize()  # the replay has read the buffer and written the readback
        lo, hi = readback.tolist()
        staging.append({"value": value, "min": lo, "max": hi})
    error = _try_pageable_capture(dev)
    del graph, stage, captured, readback, dev
    _release_pinned()
    return {"n_elements": n, "after_capture_equal": after_capture, "in_place": in_place, "rebound": rebound,
            "staging": staging, "pageable_capture_error": error,
            "host_private_pools": torch_version() >= (2, 11)}


def _try_pageable_capture(dev: torch.Tensor) -> str | None:
    """Capture a copy from pageable memory; return the error's first line, or None if accepted."""
    pageable = torch.ones(dev.numel())
    graph = torch.cuda.CUDAGraph()
    error = None
    try:
        with torch.cuda.graph(graph):
            dev.mul_(1.0)  # something valid, so the capture is not empty
            dev.copy_(pageable, non_blocking=True)
    except Exception as e:  # the expected RuntimeError names pinned memory
        error = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
    torch.cuda.synchronize()
    return error


@claim("pinned.graph_reads_captured_address", chapter=3, experiment="pinned.graph_replay", source=POST_URL,
       statement="A graph replay reflects in-place edits of the captured pinned buffer.")
def _claim_graph(d: Mapping[str, Any]) -> tuple[bool, dict[str, Any]]:
    n = d["n_elements"]
    holds = (d["in_place"]["device_equal"] == n and d["rebound"]["device_equal_old"] == n
             and d["rebound"]["device_equal_new"] == 0)
    return holds, {"elements": n,
                   "after the in-place fill_: elements with the filled value": d["in_place"]["device_equal"],
                   "after rebinding: elements with the captured buffer's value": d["rebound"]["device_equal_old"],
                   "after rebinding: elements with the new tensor's value": d["rebound"]["device_equal_new"]}


# ================================================================ 9. double buffering

def compute_schedule(pattern: str, compute_ms: float, batches: int) -> list[float]:
    """GPU ms per batch: 'steady' (``compute_ms`` each) or 'bursty' (every 4th batch takes
    4 x ``compute_ms``, the others none; the same mean).

    Raises:
        ValueError: an unknown pattern or a negative time or count.
    """
    if compute_ms < 0 or batches < 0:
        raise ValueError(f"compute_ms and batches must be >= 0, got {compute_ms}, {batches}")
    if pattern == "steady":
        return [compute_ms] * batches
    if pattern == "bursty":
        return [4 * compute_ms if k % 4 == 0 else 0.0 for k in range(batches)]
    raise ValueError(f"pattern must be 'steady' or 'bursty', got {pattern!r}")


def _ring_run(buffers: int, guarded: bool, numel: int, host_ms: float, schedule: list[float],
              stall_ms: float) -> dict[str, Any]:
    """One pass of the ring pipeline; see :func:`double_buffer`."""
    n = len(schedule)
    copy_stream = torch.cuda.Stream()
    compute_stream = torch.cuda.current_stream()
    ring = [torch.empty(numel, pin_memory=True) for _ in range(buffers)]
    dev = [torch.empty(numel, device="cuda") for _ in range(buffers)]
    copied: list[Any] = [None] * buffers
    consumed: list[Any] = [None] * buffers
    wrong = torch.zeros(n, dtype=torch.int64, device="cuda")
    torch.cuda.synchronize()
    if stall_ms:
        gpu_sleep(stall_ms)  # the GPU starts behind, like a slow first step
    waited = 0.0
    t0 = time.perf_counter()
    for k, gpu_ms in enumerate(schedule):
        slot = k % buffers
        host_spin(host_ms)
        if guarded and copied[slot] is not None:
            tw = time.perf_counter()
            copied[slot].synchronize()  # the copy that last read this buffer has finished
            waited += time.perf_counter() - tw
        ring[slot].fill_(float(k + 1))
        with torch.cuda.stream(copy_stream):
            if consumed[slot] is not None:
                copy_stream.wait_event(consumed[slot])  # the device slot is free again
            dev[slot].copy_(ring[slot], non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(copy_stream)
            copied[slot] = ev
        compute_stream.wait_event(copied[slot])
        gpu_sleep(gpu_ms)
        wrong[k] = (dev[slot] != float(k + 1)).sum()
        done = torch.cuda.Event()
        done.record(compute_stream)
        consumed[slot] = done
    torch.cuda.synchronize()
    total_ms = (time.perf_counter() - t0) * 1e3
    counts = [int(x) for x in wrong.tolist()]
    del ring, dev
    return {"ms_per_batch": total_ms / n, "wrong_batches": sum(c > 0 for c in counts),
            "host_wait_ms": waited * 1e3, "total_ms": total_ms}


@experiment(
    "pinned.double_buffer",
    chapter=3,
    title="A ring of pinned staging buffers: throughput and correctness",
    params=[Param("buffers", 2, min=1, max=4, unit="buffers", help="pinned staging buffers in the ring"),
            Param("compute", "bursty", choices=("steady", "bursty"),
                  help="GPU time per batch: steady, or every 4th batch 4x as long"),
            Param("batch_mib", 8, choices=(2, 8, 32), unit="MiB", help="bytes per batch"),
            Param("host_ms", 2.0, choices=(1.0, 2.0, 4.0), unit="ms", help="host work per batch before the fill"),
            Param("compute_ms", 3.0, choices=(1.0, 3.0, 6.0), unit="ms", help="mean GPU work per batch"),
            Param("batches", 32, min=8, max=128, unit="batches")],
    grid={"buffers": [1, 2, 3, 4], "compute": ["steady", "bursty"]},
    data_schema={
        "type": "object",
        "required": ["with_events", "no_wait", "host_fill_ms", "copy_ms", "mean_compute_ms", "stall_ms"],
        "properties": {
            **{k: {"type": "object", "required": ["ms_per_batch", "wrong_batches", "stall_wrong_batches"],
                   "properties": {"ms_per_batch": _NUMBER, "wrong_batches": {"type": "integer", "minimum": 0},
                                  "stall_wrong_batches": {"type": "integer", "minimum": 0}}}
               for k in ("with_events", "no_wait")},
            "host_fill_ms": _NUMBER, "copy_ms": _NUMBER, "mean_compute_ms": _NUMBER, "stall_ms": _NUMBER,
        },
    },
)
def double_buffer(buffers: int = 2, compute: str = "bursty", batch_mib: int = 8, host_ms: float = 2.0,
                  compute_ms: float = 3.0, batches: int = 32) -> dict[str, Any]:
    """A loader with a ring of ``buffers`` pinned staging buffers feeding a compute stream.

    Per batch k: the host works ``host_ms``, (``with_events`` only) waits for the event of
    the copy that last read slot k % buffers, fills the slot with k+1; a copy stream waits
    until the compute stream is done with the matching device buffer and copies; the
    compute stream waits for the copy, runs the batch's GPU work and counts elements not
    equal to k+1 (a checksum). ``no_wait`` skips the host's wait: the unsafe version.

    Each variant runs twice: a short pass in which the GPU starts ``stall_ms`` behind (it
    exposes an unsafe ring), and a timed pass of ``batches`` batches.

    Returns:
        ``with_events`` and ``no_wait``: ``ms_per_batch`` (timed pass), ``wrong_batches``
        (timed pass) and ``stall_wrong_batches`` (stall pass) and ``host_wait_ms``;
        ``host_fill_ms`` (host time to fill one buffer), ``copy_ms`` (GPU time of one HtoD
        copy), ``mean_compute_ms`` and ``stall_ms``.

    Raises:
        ValueError: the buffers do not fit in host or device memory.
    """
    numel = batch_mib * MiB // 4
    sup.check_host_fits("batch_mib", (buffers + 1) * batch_mib * MiB)
    require_cuda("pinned.double_buffer")
    check_fits("batch_mib", (2 * buffers + 1) * batch_mib * MiB)
    _warm_gpu()
    probe = torch.empty(numel, pin_memory=True)
    fills = []
    for _ in range(3):
        t0 = time.perf_counter()
        probe.fill_(1.0)
        fills.append((time.perf_counter() - t0) * 1e3)
    fill_ms = statistics.median(fills)
    target = torch.empty(numel, device="cuda")
    copy_ms = time_gpu(lambda: target.copy_(probe, non_blocking=True), warmup=1, repeats=5).median
    del probe, target
    schedule = compute_schedule(compute, compute_ms, batches)
    # Long enough that an unguarded ring wraps around before the delayed copies run.
    stall_ms = 2 * buffers * (host_ms + fill_ms) + 20.0
    stall_schedule = compute_schedule(compute, compute_ms, 2 * buffers + 2)
    out: dict[str, Any] = {}
    for name, guarded in (("with_events", True), ("no_wait", False)):
        stalled = _ring_run(buffers, guarded, numel, host_ms, stall_schedule, stall_ms)
        timed = _ring_run(buffers, guarded, numel, host_ms, schedule, 0.0)
        out[name] = {**timed, "stall_wrong_batches": stalled["wrong_batches"]}
    _release_pinned()
    out.update({"host_fill_ms": fill_ms, "copy_ms": copy_ms, "mean_compute_ms": sum(schedule) / len(schedule),
                "stall_ms": stall_ms})
    return out
