"""What-ifs: the requests of an exact replay, run again under other allocator settings or a cap.

:func:`what_if` takes the request list that :func:`experiments.doctor.replay.replay` recovered
from a trace (alloc, free_requested, free_completed, inferred empty_cache, failed requests)
and runs it on a fresh :class:`experiments.doctor.engine.Engine` under another
:class:`experiments.doctor.rules.AllocatorConfig` and cap. While the what-if makes the same
driver calls as the recorded run it takes the GPU's segment addresses; from the first
difference on, addresses of its own. A request that does not fit is counted and skipped
(its frees too).
"""
from __future__ import annotations

from typing import Any, Sequence

from .engine import Engine, EngineOutOfMemory
from .loader import InputError
from .replay import R_ALLOC, R_EMPTY, R_FREE_DONE, R_FREE_REQ, Run, _finish, _no_gc
from .rules import AllocatorConfig


def what_if(base: Run, config: AllocatorConfig, settings: str, *, cap_bytes: int | None = None,
            total_memory: int = 150_109_880_320, stop_at: int | None = None,
            series: bool = True) -> tuple[Run, Engine]:
    """Run the requests of a replay under ``config`` (and ``cap_bytes``) on a fresh engine.

    Returns:
        (the Run, the engine after the last request processed; ``stop_at`` stops after that
        many requests, e.g. to read the layout at the peak).
    """
    with _no_gc():
        return _run_requests(base, config, settings, cap_bytes, total_memory, stop_at, series)


class _DriverSync:
    """Follows a recorded run's driver calls while a what-if makes the same ones (see what_if)."""

    def __init__(self, log: Sequence[tuple[str, int, int]], eng: Engine):
        self.log, self.eng, self.pos, self.on, self.seen = log, eng, 0, bool(log), 0

    def follow(self) -> None:
        """Check the releases of the operation just done against the log."""
        evs = self.eng.events
        for a, addr, size in evs[self.seen:]:
            if a == "segment_free":
                if self.pos < len(self.log) and self.log[self.pos] == (a, addr, size):
                    self.pos += 1
                else:
                    self.on = False
                    break
        self.seen = 0

    def address(self, size: int) -> int | None:
        if not self.on:
            return None
        self.follow()
        self.seen = len(self.eng.events)
        want = "range" if self.eng.config.expandable_segments else "segment_alloc"
        if self.on and self.pos < len(self.log):
            a, addr, s = self.log[self.pos]
            if a == want and s == size and self.eng.is_free_range(addr, size):
                self.pos += 1
                return addr
        self.on = False
        return None


def _run_requests(base: Run, config: AllocatorConfig, settings: str, cap_bytes: int | None, total_memory: int,
                  stop_at: int | None, series: bool = True) -> tuple[Run, Engine]:
    eng = Engine(config, cap_bytes=cap_bytes, total_memory=total_memory)
    # The driver picks segment addresses from the history of cudaMalloc and cudaFree calls.
    # While the what-if makes the same calls as the GPU's run, in the same order, it takes
    # the GPU's addresses (ties between equal free blocks go by address); from the first
    # difference on, addresses of its own.
    sync = _DriverSync(base.segment_log, eng)
    address = sync.address
    eng.address_hook = address
    run = Run(settings)
    blocks: dict[int, Any] = {}
    for key, req, stream, pool in base.initial:
        try:
            blocks[key] = eng.malloc(max(req, 1), stream, pool)
        except EngineOutOfMemory:
            run.oom_requests.append((-1, req))
    malloc, free_req, free_done, empty = eng.malloc, eng.free_requested, eng.free_completed, eng.empty_cache
    alloc_a, res_a = run.allocated, run.reserved
    reqs = base.requests
    pools, empties = reqs.pools, reqs.empties
    sizes, streams = reqs.events.sizes, reqs.events.streams
    peak_a, peak_r, peak_k = 0, -1, 0
    get, pop = blocks.get, blocks.pop
    data = reqs.data if stop_at is None else reqs.data[:max(stop_at, 0)]
    k = -1
    for k, x in enumerate(data):
        kind = x & 7
        if kind == R_FREE_REQ:
            b = get(x >> 16)
            if b is not None:
                free_req(b)
            if series:
                alloc_a.append(eng.allocated_bytes)
                res_a.append(eng.reserved_bytes)
            continue                     # a free raises no peak
        if kind == R_FREE_DONE:
            b = pop(x >> 16, None)
            if b is not None:
                free_done(b)
        elif kind == R_ALLOC:
            i = x >> 16
            try:
                blocks[i] = malloc(sizes[i], streams[i], pools[(x >> 3) & 8191])
            except EngineOutOfMemory:
                run.oom_requests.append((k, sizes[i]))
        elif kind == R_EMPTY:
            empty(empties[x >> 16])
        else:  # a request that failed on the GPU: try it, and drop it at once if it fits
            i = x >> 16
            try:
                b = malloc(sizes[i], streams[i], pools[(x >> 3) & 8191])
                free_req(b)
                free_done(b)
            except EngineOutOfMemory:
                run.oom_requests.append((k, sizes[i]))
        if sync.on and eng.events:
            sync.follow()
        # the values after each request: peaks always, the series when asked
        a, r = eng.allocated_bytes, eng.reserved_bytes
        if a > peak_a:
            peak_a = a
        if r > peak_r:
            peak_r, peak_k = r, k
        if series:
            alloc_a.append(a)
            res_a.append(r)
    run.events_replayed = k + 1
    run.peak_allocated_bytes, run.peak_reserved_bytes, run.peak_index = peak_a, max(peak_r, 0), max(peak_k, 0)
    _finish(run, eng)
    return run, eng


def _config(settings: str) -> AllocatorConfig:
    """The settings of a what-if. Raises InputError naming the settings and what is wrong."""
    if not isinstance(settings, str):
        raise InputError(f"what-if settings must be a string like 'expandable_segments:True', got {settings!r:.60}")
    try:
        return AllocatorConfig.from_settings(settings or None)
    except ValueError as e:
        raise InputError(f"what-if settings {settings!r}: {e}") from None


__all__ = ["what_if"]
