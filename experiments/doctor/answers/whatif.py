"""What-ifs: the requests of an exact replay, run again under other allocator settings or a cap.

A what-if's settings are parsed once, into a :class:`WhatIf` (the text as given and the
:class:`~experiments.doctor.model.rules.AllocatorConfig` it means), which is what every step
after that receives. :func:`what_if` takes the request list that
:func:`experiments.doctor.replaying.replay.replay` recovered from a trace (alloc,
free_requested, free_completed, inferred empty_cache, failed requests) and runs it on a fresh
:class:`experiments.doctor.model.engine.Engine` under those settings and a cap. While the
what-if makes the same driver calls as the recorded run it takes the GPU's segment addresses;
from the first difference on, addresses of its own. A request that does not fit is counted and
skipped (its frees too).
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Any, Generator, Sequence

from ..errors import InputError
from ..model.engine import Engine, EngineOutOfMemory, no_cyclic_gc
from ..model.rules import (H200_TOTAL_MEMORY, LARGE_BUFFER as LARGE_PAGE, SMALL_BUFFER, AllocatorConfig,
                           get_allocation_size)
from ..replaying.requests import (KEY_SHIFT, POOL_FIELD, POOL_MASK, POOL_SHIFT, R_ALLOC, R_EMPTY, R_FREE_DONE,
                                  R_FREE_REQ, R_FREEABLE, R_RESTORE, R_RETRY, Requests, as_requests)
from ..replaying.run import Run
from ..steps import STEP_MASK, run_steps


@dataclasses.dataclass(frozen=True)
class WhatIf:
    """One what-if's settings, parsed once.

    Attributes:
        settings: the text as given, in ``PYTORCH_CUDA_ALLOC_CONF`` syntax ('' = the defaults);
            the what-if's Run carries it as its ``settings``.
        config: what the text means to the allocator.
    """

    settings: str
    config: AllocatorConfig

    @classmethod
    def parse(cls, settings: str) -> "WhatIf":
        """The what-if of ``settings`` (:meth:`AllocatorConfig.from_settings`).

        Raises:
            InputError (a ValueError): not a string, or settings the allocator would not
                accept; the message names the settings and what is wrong.
        """
        if not isinstance(settings, str):
            raise InputError(f"what-if settings must be a string like 'expandable_segments:True', "
                             f"got {settings!r:.60}")
        try:
            return cls(settings, AllocatorConfig.from_settings(settings or None))
        except ValueError as e:
            raise InputError(f"what-if settings {settings!r}: {e}") from None


def what_if(base: Run, settings: WhatIf, *, cap_bytes: int | None = None,
            total_memory: int = H200_TOTAL_MEMORY, stop_at: int | None = None,
            series: bool = True) -> tuple[Run, Engine]:
    """Run the requests of a replay under other settings (and ``cap_bytes``) on a fresh engine.

    ``settings``: the what-if, parsed once (``WhatIf.parse("expandable_segments:True")``).

    The answer is exact (``run.exact``) when nothing the snapshot leaves open can change it.
    Five things can (``run.uncertain`` names them):

    * "record_stream completion timing": a block freed after ``record_stream`` returns to its
      pool when the GPU has passed its events, which a run under other settings may do at
      another point of the program (``process_events`` polls at each malloc); the recorded
      points are kept, and the answer may be off by the bytes such blocks held when a request
      came (their segment sizes: ``get_allocation_size`` each, the small pool's together);
    * "pool attribution": the trace agrees with more than one assignment of new segments to
      pools (``Run.alternatives`` of the replay): each is run too;
    * "driver address order": once the what-if's calls to the driver differ from the recorded
      run's, its new segments have addresses of its own, and a best-fit choice between equal
      blocks of different segments was decided by them (``Engine.address_ties``): the what-if
      is run again with the opposite address order;
    * "pool checkpoint restores": CUDA-graph trees put blocks where a checkpoint held them;
      a what-if places them by best fit, and is run again without them;
    * "lifetime of requests that failed in the recording": a request that ran out of memory
      on the GPU but fits here is freed at once (as a probe is); the program may have kept it:
      run again with such blocks kept to the end.

    ``run.bound_bytes`` is the most the peak or final reserved bytes may be off by (0 when
    exact): the largest difference between the answers of those runs, plus the timing bytes,
    and for pool attribution at least the bytes the open requests held at once (rounded up to
    20 MiB). ``run.peak_reserved_range_bytes`` and ``final_reserved_range_bytes`` are the answer
    ± that bound; ``oom_events_range`` spans the OOM counts of those runs. The bound is what the
    doctor can compute from one snapshot, not a proof: tests/test_doctor_cases.py checks it
    against the GPU's own runs under each setting.

    ``series``: keep allocated and reserved bytes after every request (for the figure; the
    peaks are kept either way; the runs that bound the answer never keep them).

    Returns:
        (the Run, the engine after the last request processed; ``stop_at`` stops after that
        many requests, e.g. to read the layout at the peak).
    """
    wi = settings
    with no_cyclic_gc():
        if not isinstance(base.requests, Requests):   # a list of request tuples, made by hand
            base = copy.copy(base)
            base.requests = as_requests(base.requests)
        run, eng = _run_requests(base, base.requests, wi, cap_bytes, total_memory, stop_at, series=series)
        if stop_at is None:
            _certainty(run, eng, base, wi, cap_bytes, total_memory)
    return run, eng


def _certainty(run: Run, eng: Engine, base: Run, wi: WhatIf, cap_bytes: int | None, total_memory: int) -> None:
    others: list[Run] = []
    uncertain = []
    timing = run.timing_bytes
    if timing:
        uncertain.append("record_stream completion timing")
    attribution = 0
    if base.alternatives:
        uncertain.append("pool attribution")
        others += [_run_requests(base, as_requests(reqs), wi, cap_bytes, total_memory, None)[0]
                   for reqs in base.alternatives]
        # requests of a pool the trace leaves open share, or do not share, cached blocks with
        # another pool's: at most the bytes they held at once, rounded up to a large page
        attribution = -(-run.open_bytes // LARGE_PAGE) * LARGE_PAGE
    if eng.address_ties:
        uncertain.append("driver address order")
        others.append(_run_requests(base, base.requests, wi, cap_bytes, total_memory, None, address_order="up")[0])
    if base.restores:
        uncertain.append("pool checkpoint restores")
        others.append(_run_requests(base, base.requests.without(R_RESTORE), wi, cap_bytes, total_memory, None)[0])
    if run.retries_fit:
        # it failed on the GPU, so the trace does not say how long the program would have kept it
        uncertain.append("lifetime of requests that failed in the recording")
        others.append(_run_requests(base, base.requests, wi, cap_bytes, total_memory, None, keep_retries=True)[0])
    before = 0
    if base.initial:
        # blocks from before the recording began: under other settings the program's history
        # up to then (what it freed, in what order) would have left another cache; at most the
        # cached bytes of then, and a page of each pool, may come out otherwise
        uncertain.append("allocations before the recording started")
        before = max(0, base.start_reserved - base.start_allocated) + LARGE_PAGE + SMALL_BUFFER
    runs = [run] + others
    dev = max(max(abs(o.peak_reserved_bytes - run.peak_reserved_bytes),
                  abs(o.final_reserved_bytes - run.final_reserved_bytes)) for o in runs)
    run.exact = not uncertain
    run.uncertain = uncertain
    run.bound_bytes = max(dev, attribution) + timing + before
    bound = run.bound_bytes
    run.peak_reserved_range_bytes = (max(0, run.peak_reserved_bytes - bound), run.peak_reserved_bytes + bound)
    run.final_reserved_range_bytes = (max(0, run.final_reserved_bytes - bound), run.final_reserved_bytes + bound)
    ooms = [o.oom_events for o in runs]
    run.oom_events_range = (min(ooms), max(ooms))
    if cap_bytes is not None:
        # reserved bytes never pass the cap (mapped pages may by less than a page)
        top = cap_bytes + (wi.config.large_segment_size if wi.config.expandable_segments else 0)
        run.peak_reserved_range_bytes = (min(run.peak_reserved_range_bytes[0], top), min(run.peak_reserved_range_bytes[1], top))
        run.final_reserved_range_bytes = (min(run.final_reserved_range_bytes[0], top), min(run.final_reserved_range_bytes[1], top))
    if base.oom_events and (run.retries_fit or run.new_ooms) and _reacts(base):
        # The program carried on after out-of-memory errors: here a request that failed on the
        # GPU fits, or one it served fails, so what the program did next (its own reaction:
        # drop a step, preempt a request, retry) is not in the trace. Reserved bytes stay under
        # the cap (or the device); the count of errors is open.
        run.exact = False
        run.uncertain = uncertain + ["what the program did after an out-of-memory error it caught"]
        top = cap_bytes if cap_bytes is not None else total_memory
        if wi.config.expandable_segments:
            top += wi.config.large_segment_size   # pages are mapped whole: the cap check counts the request
        run.peak_reserved_range_bytes = (min(run.peak_reserved_range_bytes[0], base.start_reserved), max(top, run.peak_reserved_bytes))
        run.final_reserved_range_bytes = (0, max(top, run.final_reserved_bytes))
        n_after = len(base.requests) - (min(k for k, _ in run.oom_requests) if run.oom_requests else 0)
        run.oom_events_range = (0, max(max(ooms), base.oom_events + n_after))
        run.bound_bytes = max(run.peak_reserved_range_bytes[1] - run.peak_reserved_bytes,
                              run.peak_reserved_bytes - run.peak_reserved_range_bytes[0])


def _reacts(base: Run) -> bool:
    """Whether the recorded program reacted to an out-of-memory error it caught, so that what it
    asked for next depended on the error: right after a failed request it freed blocks it had
    made since its last free (it dropped the work under way), or it freed and asked for the same
    size again (it made room and retried). A probe (a buffer asked for and given up, the program
    going on as before) does neither."""
    reqs = base.requests
    data, extras = reqs.data, reqs.extras
    sizes, _ = reqs.sizes_streams()
    for k, x in enumerate(data):
        if x & 7 != R_RETRY:
            continue
        last_free = next((j for j in range(k - 1, max(-1, k - 4096), -1) if data[j] & 7 == R_FREE_REQ), -1)
        recent = {data[j] >> KEY_SHIFT for j in range(last_free + 1, k) if data[j] & 7 == R_ALLOC}
        freed = False
        for y in data[k + 1:k + 4096]:
            kind = y & 7
            if kind == R_FREE_REQ:
                freed = True
                if y >> KEY_SHIFT in recent:
                    return True
            elif kind == R_ALLOC:
                if freed and sizes[y >> KEY_SHIFT] == extras[k][1]:
                    return True
                break
            elif kind == R_RETRY:
                break
    return False


class _DriverSync:
    """Follows a recorded run's driver calls while a what-if makes the same ones (see what_if)."""

    def __init__(self, log: Sequence[tuple[str, int, int]], eng: Engine):
        self.log, self.eng, self.pos, self.on, self.seen = log, eng, 0, bool(log), 0

    def follow(self) -> None:
        """Check the releases of the operation just done against the log (as a set: the
        allocator walks hash maps of streams and pools to release)."""
        frees = sorted(e for e in self.eng.events[self.seen:] if e[0] == "segment_free")
        self.seen = 0
        if not frees:
            return
        nxt = self.log[self.pos:self.pos + len(frees)]
        if sorted(nxt) == frees:
            self.pos += len(frees)
        else:
            self.on = False

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


def _run_requests(base: Run, requests: Requests, wi: WhatIf, cap_bytes: int | None, total_memory: int,
                  stop_at: int | None, address_order: str = "down", keep_retries: bool = False,
                  series: bool = False) -> tuple[Run, Engine]:
    return run_steps(_request_steps(base, requests, wi, cap_bytes, total_memory, stop_at, address_order,
                                    keep_retries, series))


def _request_steps(base: Run, requests: Requests, wi: WhatIf, cap_bytes: int | None, total_memory: int,
                   stop_at: int | None, address_order: str, keep_retries: bool,
                   series: bool) -> Generator[None, None, tuple[Run, Engine]]:
    # _run_requests as a generator run in steps (experiments.doctor.steps)
    # the what-if follows the best-fit order of the torch release the recording matched
    eng = Engine(wi.config, cap_bytes=cap_bytes, total_memory=total_memory, address_order=address_order,
                 rule=base.rule)
    # The driver picks segment addresses from the history of cudaMalloc and cudaFree calls.
    # While the what-if makes the same calls as the GPU's run, in the same order, it takes
    # the GPU's addresses (ties between equal free blocks go by address); from the first
    # difference on, addresses of its own.
    sync = _DriverSync(base.segment_log, eng)
    address = sync.address
    eng.address_hook = address
    run = Run(wi.settings, rule=base.rule, allocated_upper_bound=base.allocated_upper_bound)
    sizes, streams = requests.sizes_streams()
    # the engine's block of each key, in a list indexed by key (a key is allocated at most
    # once; a request log made by hand may free a key it never allocated: none)
    n_keys = max(len(sizes), max((key for key, *_ in base.initial), default=-1) + 1)
    blocks: list[Any] = [None] * n_keys
    for key, req, stream, pool in base.initial:
        try:
            blocks[key] = eng.malloc(max(req, 1), stream, pool)
        except EngineOutOfMemory:
            run.oom_requests.append((-1, req))
    malloc, free_req, free_done, empty = eng.malloc, eng.free_requested, eng.free_completed, eng.empty_cache
    alloc_a: list[int] = []           # the series, packed at each step (Run.pack)
    res_a: list[int] = []
    peak_a, peak_r, peak_k = 0, -1, 0
    timing = retries_fit = 0
    open_keys, open_live, open_peak = base.open_keys, 0, 0
    k = -1
    pools, extras = requests.pools, requests.extras
    default_pool = pools[0]
    data = requests.data if stop_at is None else requests.data[:max(stop_at, 0)]
    for k, x in enumerate(data):
        if not k & STEP_MASK:
            run.pack(alloc_a, res_a)
            yield
        kind = x & 7
        if eng.pending_count and (kind == R_ALLOC or kind == R_RESTORE or kind == R_RETRY):
            timing = max(timing, _pending_bound(eng))
        if kind == R_ALLOC or kind == R_RESTORE:
            key = x >> KEY_SHIFT
            try:
                blocks[key] = b = malloc(sizes[key], streams[key],
                                         pools[(x >> POOL_SHIFT) & POOL_MASK] if x & POOL_FIELD else default_pool)
                if open_keys and key in open_keys:
                    open_live += b.size
                    open_peak = max(open_peak, open_live)
            except EngineOutOfMemory:
                run.oom_requests.append((k, sizes[key]))
                run.new_ooms += 1
                if run.finished:        # the recording served it: a program that does not catch
                    run.finished = False            # out-of-memory errors stops here
                    run.stopped_at_request = k
        elif kind == R_FREE_REQ:
            key = x >> KEY_SHIFT
            b = blocks[key] if key < n_keys else None
            if b is not None:
                free_req(b)
                if open_keys and key in open_keys:
                    open_live -= b.size
        elif kind == R_FREE_DONE:
            key = x >> KEY_SHIFT
            b = None
            if key < n_keys:
                b = blocks[key]
                blocks[key] = None
            # a sync of this what-if's own out-of-memory path may have completed it already
            if b is not None and b.pending:
                free_done(b)
        elif kind == R_EMPTY:
            empty(pools[(x >> POOL_SHIFT) & POOL_MASK])
        elif kind == R_FREEABLE:
            eng.freeable.update(extras[k][1])
        elif kind == R_RETRY:  # a request that failed on the GPU: try it, and drop it at once if it fits
            r = extras[k]
            try:
                b = malloc(r[1], r[2], r[3])
                retries_fit += 1
                if not keep_retries:
                    free_req(b)
                    free_done(b)
            except EngineOutOfMemory:
                run.oom_requests.append((k, r[1]))
        if sync.on and eng.events:
            sync.follow()
        # the values after each request: peaks always, the series when asked
        a, b_r = eng.allocated_bytes, eng.reserved_bytes
        if a > peak_a:
            peak_a = a
        if b_r > peak_r:
            peak_r, peak_k = b_r, k
        if series:
            alloc_a.append(a)
            res_a.append(b_r)
    run.events_replayed = k + 1
    run.pack(alloc_a, res_a)
    run.peak_allocated_bytes, run.peak_reserved_bytes, run.peak_index = peak_a, max(peak_r, 0), max(peak_k, 0)
    run.timing_bytes, run.open_bytes, run.retries_fit = timing, open_peak, retries_fit
    run.finish(eng)
    return run, eng


def _pending_bound(eng: Engine) -> int:
    # The memory a request might need anew if the blocks waiting on record_stream events were
    # not back yet (or might not need if they were): a segment for each large block, and the
    # small pool's blocks packed into 2 MiB segments.
    large = small = 0
    for b in eng.pending_blocks():
        if b.seg.small:
            small += b.size
        else:
            large += get_allocation_size(b.size, eng.config)
    return large + -(-small // SMALL_BUFFER) * SMALL_BUFFER


__all__ = ["WhatIf", "what_if"]
