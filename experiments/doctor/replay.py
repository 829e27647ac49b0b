"""Replaying a snapshot's trace through the engine, exactly, checked event by event.

:func:`replay` drives :class:`experiments.doctor.engine.Engine` with the requests of a
trace (alloc, free_requested, free_completed) under the settings the program ran with,
handing it the segment addresses the driver chose. After every request it checks that the
engine made exactly the segment allocations and releases the trace shows, at that event,
with the same addresses and sizes, that the block sits where the GPU put it, and that the
reserved bytes agree. Where it cannot follow, it stops and says which event and why.

Things a trace does not say, and how they are recovered:

* ``empty_cache`` leaves no event of its own: a run of segment_free / segment_unmap events
  that the allocator's malloc path did not make is one ``empty_cache`` (of the pools whose
  segments it released), placed before the next request.
* Which private pool (MemPool, CUDA graph) a request was routed to: a segment alive at the
  end carries its ``segment_pool_id``; a request landing in a known segment belongs to its
  pool; a new segment that the default pool would not have needed (it had a cached block
  that fits) belongs to a private pool, which the doctor names (-1, n) when the snapshot no
  longer lists it.
* Blocks allocated before recording began: their segments and blocks are rebuilt from the
  frees of unknown blocks, the releases of unknown segments and the final state.

The request list a replay recovers (:attr:`Run.requests`) is what
:func:`experiments.doctor.whatif.what_if` runs again under other settings or a cap.
"""
from __future__ import annotations

import dataclasses
import gc
import re
from array import array
from bisect import bisect_right, insort
from typing import Any, Sequence

from .engine import DEFAULT_POOL, Engine, EngineOutOfMemory
from .loader import ImpossibleTraceError
from .requestlog import R_ALLOC, R_EMPTY, R_FREE_DONE, R_FREE_REQ, R_RETRY, Requests  # noqa: F401  (whatif's names)
from .rules import SMALL_SIZE
from .trace import (ALLOC, FREE_DONE, FREE_REQ, OOM, SEG_ALLOC, SEG_FREE, SEG_MAP, SEG_UNMAP, SNAPSHOT, Trace,
                    starting_state)

_SEG_NAMES = {SEG_ALLOC: "segment_alloc", SEG_FREE: "segment_free", SEG_MAP: "segment_map",
              SEG_UNMAP: "segment_unmap"}
_CODES = {v: k for k, v in _SEG_NAMES.items()}
_SEG_EVENTS = re.compile(bytes([ord("["), SEG_ALLOC, SEG_FREE, ord("]")]))


@dataclasses.dataclass
class Run:
    """The outcome of one replay or what-if.

    Attributes:
        settings: the settings string it ran under.
        matches_trace: every checked event agreed (replay only; None for a what-if).
        first_mismatch: None, or a dict with event_index, action, reason, expected, got.
        events_replayed: trace events (replay) or requests (what-if) processed.
        allocated, reserved: bytes after each request (arrays of equal length; empty when
            run with ``series=False``: the peaks are kept either way).
        final_* / peak_*: bytes; peak_index: the request (index into the replay's requests)
            after which reserved bytes peaked.
        oom_events: requests that did not fit; oom_requests: their (index, bytes).
        peak_segments: the layout at peak reserved (filled by :func:`layout_at`).
        requests: the request list (replay only) that what-ifs reuse (:class:`Requests`).
        initial: the blocks rebuilt for a late-started recording, (key, requested, stream, pool).
        marks: (trace index, allocated, reserved) at each 'snapshot' entry (replay only).
        peak_event: the trace event after which reserved bytes peaked (replay only).
        segment_log: (action, address, size) of every segment the GPU allocated or freed and of
            every expandable range it reserved, in order (replay only; a what-if takes the
            GPU's addresses while its own calls to the driver are the same).
        live_keys: {block address: key} of the blocks allocated when a replay stopped early
            (``stop_at``); a key below the number of trace events is the allocation's event.
    """

    settings: str
    matches_trace: bool | None = None
    first_mismatch: dict[str, Any] | None = None
    events_replayed: int = 0
    allocated: array = dataclasses.field(default_factory=lambda: array("q"))
    reserved: array = dataclasses.field(default_factory=lambda: array("q"))
    final_reserved_bytes: int = 0
    final_allocated_bytes: int = 0
    peak_reserved_bytes: int = 0
    peak_allocated_bytes: int = 0
    peak_index: int = 0
    oom_events: int = 0
    oom_requests: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    final_segments: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    requests: Requests = dataclasses.field(default_factory=lambda: Requests())
    initial: list[tuple[int, int, int, tuple[int, int]]] = dataclasses.field(default_factory=list)
    marks: list[tuple[int, int, int]] = dataclasses.field(default_factory=list)
    peak_event: int = 0
    segment_log: list[tuple[str, int, int]] = dataclasses.field(default_factory=list)
    live_keys: dict[int, int] = dataclasses.field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """The JSON fields of the doctor's report for this run."""
        out = {"settings": self.settings}
        if self.matches_trace is not None:
            out["matches_trace"] = self.matches_trace
            out["first_mismatch"] = self.first_mismatch
        out.update(final_reserved_bytes=self.final_reserved_bytes, final_allocated_bytes=self.final_allocated_bytes,
                   peak_reserved_bytes=self.peak_reserved_bytes, peak_allocated_bytes=self.peak_allocated_bytes,
                   oom_events=self.oom_events)
        return out


class _Mismatch(Exception):
    def __init__(self, index: int, action: str, reason: str, expected: Any = None, got: Any = None):
        self.info = {"event_index": index, "action": action, "reason": reason, "expected": expected, "got": got}
        super().__init__(reason)


def _fmt_events(evs: Sequence[tuple[Any, int, int]]) -> list[list[Any]]:
    return [[_SEG_NAMES.get(a, a), addr, size] for a, addr, size in evs]


class _Replayer:
    def __init__(self, trace: Trace, cap_bytes: int | None, total_memory: int):
        self.trace = trace
        self.engine = Engine(trace.config, cap_bytes=cap_bytes, total_memory=total_memory)
        self.bases: list[int] = []           # sorted segment / range bases seen by the trace
        self.seg_end: dict[int, int] = {}
        self.seg_pool: dict[int, tuple[int, int]] = {}
        self.final_pool = {s["address"]: s["pool_id"] for s in trace.segments}
        self.live: dict[int, Any] = {}       # addr -> engine block (allocated)
        self.pending: dict[int, Any] = {}    # addr -> engine block (freed, not completed)
        self.keys: dict[int, int] = {}       # addr -> request key
        self.next_key = len(trace.events)        # keys of blocks from before the recording
        self.requests = Requests(trace.events)
        self.series = True
        self.only_default = True     # no private pool seen yet: every request is the default pool's
        self.trace_reserved = 0
        self.private_context: tuple[int, int] | None = None
        self.inferred = 0
        self.peak_reserved, self.peak_event = -1, 0
        self.segment_log: list[tuple[str, int, int]] = []   # the driver's view: cudaMalloc / cudaFree / new range
        self.stop_at: int | None = None
        self.expandable = trace.config.expandable_segments
        self.range_size = self.engine.range_size(False) if self.expandable else 0

    # -- segment bookkeeping of the trace
    def _containing(self, addr: int) -> int | None:
        i = bisect_right(self.bases, addr) - 1
        if i >= 0:
            base = self.bases[i]
            if addr < self.seg_end[base]:
                return base
        return None

    def _add_base(self, base: int, size: int, pool: tuple[int, int]) -> None:
        insort(self.bases, base)
        self.seg_end[base] = base + size
        self.seg_pool[base] = pool
        if pool != DEFAULT_POOL:
            self.only_default = False

    def _drop_base(self, base: int) -> None:
        self.bases.remove(base)
        del self.seg_end[base]
        del self.seg_pool[base]

    def _seed(self) -> list[tuple[int, int, int, tuple[int, int]]]:
        """Blocks and segments from before the recording (see trace.starting_state)."""
        state = starting_state(self.trace, self.engine)
        for base, size, pool in state.bases:
            self._add_base(base, size, pool)
        self.trace_reserved += state.reserved
        seeded = []
        for addr, blk, stream, pool in state.blocks:
            self.live[addr] = blk
            self.keys[addr] = self.next_key
            seeded.append((self.next_key, blk.requested, stream, pool))
            self.next_key += 1
        if state.unsupported:
            raise _Mismatch(0, "alloc", state.unsupported)
        return seeded

    def run(self) -> Run:
        trace, eng = self.trace, self.engine
        run = Run(trace.settings)
        ev = trace.events
        n = len(ev)
        # which segment_alloc / range survives to the end: its pool id is in the final state
        survives = bytearray(n)
        alive: set[int] = set()
        codes, addrs = ev.codes, ev.addrs
        for m in reversed(list(_SEG_EVENTS.finditer(codes.tobytes()))):   # the few segment events, found in C
            i = m.start()
            addr = addrs[i]
            if codes[i] == SEG_FREE:
                alive.add(addr)
            else:
                survives[i] = addr not in alive
                alive.discard(addr)
        buf: list[int] = []                  # indices of segment events since the last request
        reqs = self.requests
        put_req = reqs.data.append
        pidx_get = reqs._pool_index.get
        series = self.series
        peak_a, peak_r, peak_k = 0, -1, 0     # the peaks after a request, and which request
        alloc_a, res_a = run.allocated, run.reserved
        put_a, put_r = alloc_a.append, res_a.append
        live, pending, keys = self.live, self.pending, self.keys
        bases, seg_end, seg_pool = self.bases, self.seg_end, self.seg_pool
        malloc, free_req, free_done = eng.malloc, eng.free_requested, eng.free_completed
        i = 0
        try:
            run.initial = self._seed()
            only_default = self.only_default
            stop = n if self.stop_at is None else min(n, self.stop_at)
            for i, code, addr, size, stream in zip(range(stop), ev.codes, ev.addrs, ev.sizes, ev.streams):
                if code == FREE_REQ:
                    if buf:
                        self._flush_empty(i, buf)
                    blk = live.pop(addr, None)
                    if blk is None:
                        if self._containing(addr) is None:
                            raise ImpossibleTraceError(f"trace entry {i} (free_requested): frees a block at "
                                                       f"{addr:#x} that no segment holds (an impossible trace)")
                        raise _Mismatch(i, "free_requested", f"free of an unknown block at {addr:#x}")
                    free_req(blk)
                    pending[addr] = blk
                    put_req(R_FREE_REQ | keys[addr] << 16)
                    if series:
                        put_a(eng.allocated_bytes)
                        put_r(eng.reserved_bytes)
                    continue                 # a free raises no peak
                elif code == FREE_DONE:
                    if buf:
                        self._flush_empty(i, buf)
                    blk = pending.pop(addr, None)
                    if blk is None:
                        if self._containing(addr) is None:
                            raise ImpossibleTraceError(f"trace entry {i} (free_completed): completes a free at "
                                                       f"{addr:#x} that no segment holds (an impossible trace)")
                        raise _Mismatch(i, "free_completed", f"completion of a free that was never requested "
                                        f"at {addr:#x}")
                    free_done(blk)
                    put_req(R_FREE_DONE | keys.pop(addr) << 16)
                    if series:
                        put_a(eng.allocated_bytes)
                        put_r(eng.reserved_bytes)
                    continue
                elif code == ALLOC:
                    if buf:
                        self._alloc(i, buf, survives)
                        only_default = self.only_default
                    else:
                        # fast path: no segment event, so the block is in a segment the trace knows
                        if only_default:
                            pool = DEFAULT_POOL
                        else:
                            k = bisect_right(bases, addr) - 1
                            pool = seg_pool[bases[k]] if k >= 0 and addr < seg_end[bases[k]] else DEFAULT_POOL
                        if eng.address_hook is not None:
                            eng.address_hook = None
                        try:
                            blk = malloc(size, stream, pool)
                        except EngineOutOfMemory:
                            raise _Mismatch(i, "alloc", "the model ran out of memory where the GPU did not "
                                            "(a memory cap the snapshot does not record? pass --cap)") from None
                        if eng.events:
                            raise _Mismatch(i, "alloc", "the segment events differ", [], _fmt_events(eng.events))
                        if blk.addr != addr:
                            raise _Mismatch(i, "alloc", "the block is not where the GPU put it", addr, blk.addr)
                        live[addr] = blk
                        keys[addr] = i
                        if only_default:
                            put_req(R_ALLOC | i << 16)          # pool index 0: the default pool
                        else:
                            pidx = pidx_get(pool)
                            if pidx is None:
                                pidx = reqs.pool_index(pool)
                            put_req(R_ALLOC | pidx << 3 | i << 16)
                            self.private_context = pool if pool != DEFAULT_POOL else None
                elif code <= SEG_UNMAP:
                    buf.append(i)
                    self.trace_reserved += size if code == SEG_ALLOC or code == SEG_MAP else -size
                    continue
                elif code == SNAPSHOT:
                    # _snapshot() runs between requests: releases before it were an empty_cache
                    if buf:
                        self._flush_empty(i, buf)
                    run.marks.append((i, eng.allocated_bytes, eng.reserved_bytes))
                    continue
                elif code == OOM:
                    self._oom(i, buf, size, stream)
                else:
                    raise _Mismatch(i, trace.unknown.get(i, "?"), "a trace entry of a kind the doctor does not "
                                    f"know ({trace.unknown.get(i)!r}); it cannot follow the allocator past it")
                # the values after each request: peaks always, the series when asked
                a, r = eng.allocated_bytes, eng.reserved_bytes
                if a > peak_a:
                    peak_a = a
                if r > peak_r:
                    peak_r, peak_k = r, len(reqs.data) - 1
                if series:
                    put_a(a)
                    put_r(r)
            if stop < n:           # stopped early on purpose: the state after event stop - 1
                run.events_replayed = stop
                run.requests = reqs
                self._peaks(run, peak_a, peak_r, peak_k)
                _finish(run, eng)
                return run
            i = n
            self._flush_empty(n, buf)
            peak_a = max(peak_a, eng.allocated_bytes)
            if eng.reserved_bytes > peak_r:
                peak_r, peak_k = eng.reserved_bytes, len(reqs.data) - 1
            if series:
                alloc_a.append(eng.allocated_bytes)
                res_a.append(eng.reserved_bytes)
            self._check_final(n)
            run.matches_trace = True
        except _Mismatch as m:
            run.matches_trace = False
            run.first_mismatch = m.info
        run.events_replayed = i
        run.requests = reqs
        run.peak_event = self.peak_event
        self._peaks(run, peak_a, peak_r, peak_k)
        run.segment_log = self.segment_log
        _finish(run, eng)
        return run

    @staticmethod
    def _peaks(run: Run, peak_a: int, peak_r: int, peak_k: int) -> None:
        run.peak_allocated_bytes = peak_a
        run.peak_reserved_bytes = max(peak_r, 0)
        run.peak_index = max(peak_k, 0)

    def _check_reserved(self, i: int, action: str) -> None:
        # reserved bytes change only with segment events, so they are checked where those are
        if self.engine.reserved_bytes != self.trace_reserved:
            raise _Mismatch(i, action, "reserved bytes differ after this event", self.trace_reserved,
                            self.engine.reserved_bytes)
        if self.trace_reserved > self.peak_reserved:
            self.peak_reserved, self.peak_event = self.trace_reserved, i

    def _segment_pools(self, idx: Sequence[int]) -> set[tuple[int, int]]:
        pools = set()
        for j in idx:
            _, addr, _, _ = self.trace.events[j]
            base = self._containing(addr)
            if base is not None:
                pools.add(self.seg_pool[base])
        return pools

    def _compare(self, i: int, action: str, expected_idx: Sequence[int], got: list, ordered: bool,
                 pool: tuple[int, int] = DEFAULT_POOL, small: bool = False) -> None:
        ev = self.trace.events
        expected = [(ev[j][0], ev[j][1], ev[j][2]) for j in expected_idx]
        got_c = [(_CODES[a], addr, size) for a, addr, size in got]
        if (expected != got_c) if ordered else (sorted(expected) != sorted(got_c)):
            raise _Mismatch(i, action, "the segment events differ",
                            _fmt_events([(_SEG_NAMES[c], a, s) for c, a, s in expected]), _fmt_events(got))
        # keep the trace's segment table in step, in event order
        for c, addr, size in expected:
            if c == SEG_FREE:
                self._drop_base(addr)
                self.segment_log.append(("segment_free", addr, size))
            elif c == SEG_ALLOC:
                self._add_base(addr, size, pool)
                self.segment_log.append(("segment_alloc", addr, size))
            elif c == SEG_MAP and self._containing(addr) is None:
                self._add_base(addr, self.engine.range_size(small), pool)
                self.segment_log.append(("range", addr, self.engine.range_size(small)))

    def _flush_empty(self, i: int, buf: list[int], check: bool = True) -> None:
        if not buf:
            return
        ev = self.trace.events
        if any(ev[j][0] in (SEG_ALLOC, SEG_MAP) for j in buf):
            raise _Mismatch(buf[0], _SEG_NAMES[ev[buf[0]][0]], "a segment was created without an allocation "
                            "that needed it")
        pools = self._segment_pools(buf)
        self.engine.empty_cache(pools)
        self.requests.add_empty(tuple(sorted(pools)))
        self._compare(buf[0], "empty_cache (inferred)", buf, self.engine.events, ordered=False)
        self._drop_ranges()
        buf.clear()
        if check:  # not when the request that follows still has segment events to come
            self._check_reserved(i, "empty_cache (inferred)")

    def _drop_ranges(self) -> None:
        if self.expandable:
            live = {s.addr for s in self.engine._segments.values()}
            for base in [b for b in self.bases if b not in live]:
                self._drop_base(base)

    def _alloc(self, i: int, buf: list[int], survives: list[bool]) -> None:
        eng, ev = self.engine, self.trace.events
        _, addr, size, stream = ev[i]
        creates = [j for j in buf if ev[j][0] in (SEG_ALLOC, SEG_MAP)]
        # which pool: the segment the block landed in, or for a new segment the final state / the default
        small = eng.round(size) <= SMALL_SIZE
        pool = DEFAULT_POOL
        region = None
        for j in creates:
            c, a, s, _ = ev[j]
            if c == SEG_ALLOC and a <= addr < a + s:
                region = (j, a, a + s)
            elif c == SEG_MAP and self._containing(a) is None:
                region = (j, a, a + eng.range_size(small))
        if region is not None:
            j, lo, hi = region
            known = None
            if ev[j][0] == SEG_ALLOC:
                if survives[j] and lo in self.final_pool:
                    known = self.final_pool[lo]
            else:
                known = next((s["pool_id"] for s in self.trace.segments
                              if s["is_expandable"] and lo <= s["address"] < hi), None)
            ctx = self.private_context
            if known is not None:
                pool = known
            elif self._could_serve(DEFAULT_POOL, size, stream, small, ev[j][0]):
                # the default pool would not have needed a new segment: a private pool did, and
                # not the last one either if that one could have served it
                if ctx is None or self._could_serve(ctx, size, stream, small, ev[j][0]):
                    self.inferred += 1
                    ctx = (-1, self.inferred)
                pool = ctx
            elif ctx is not None and not self._could_serve(ctx, size, stream, small, ev[j][0]):
                pool = ctx
        else:
            base = self._containing(addr)
            if base is not None:
                pool = self.seg_pool[base]
        self.private_context = pool if pool != DEFAULT_POOL else (None if region is None else self.private_context)
        # an empty_cache before this request, unless the malloc path itself releases
        frees = [j for j in buf if ev[j][0] in (SEG_FREE, SEG_UNMAP)]
        if frees and not eng.would_fail_alloc_block(size, stream, pool):
            first_create = min(creates) if creates else None
            pre = [j for j in buf if j in frees and (first_create is None or j < first_create)]
            rest = [j for j in buf if j not in pre]
            buf[:] = pre
            self._flush_empty(i, buf, check=False)
            buf[:] = rest
        expected = [ev[j] for j in buf]

        def address(_size: int) -> int | None:
            # the engine is about to emit its next segment event: take the GPU's address for it
            k = len(eng.events)
            if k < len(expected) and expected[k][0] in (SEG_ALLOC, SEG_MAP):
                return expected[k][1]
            return None

        eng.address_hook = address
        try:
            blk = eng.malloc(size, stream, pool)
        except EngineOutOfMemory:
            raise _Mismatch(i, "alloc", "the model ran out of memory where the GPU did not "
                            "(a memory cap the snapshot does not record? pass --cap)") from None
        self._compare(i, "alloc", buf, eng.events, ordered=True, pool=pool,
                      small=eng.round(size) <= SMALL_SIZE)
        self._drop_ranges()
        buf.clear()
        self._check_reserved(i, "alloc")
        if blk.addr != addr:
            raise _Mismatch(i, "alloc", "the block is not where the GPU put it", addr, blk.addr)
        self.live[addr] = blk
        self.keys[addr] = i
        self.requests.add(R_ALLOC, i, pool)

    def _could_serve(self, pool: tuple[int, int], size: int, stream: int, small: bool, code: int) -> bool:
        if self.engine.has_free_block(size, stream, pool):
            return True
        return code == SEG_MAP and bool(self.engine._ranges.get((pool, small, stream)))

    def _oom(self, i: int, buf: list[int], size: int, stream: int) -> None:
        eng = self.engine
        eng.address_hook = None
        try:
            eng.malloc(size, stream, self.private_context or DEFAULT_POOL)
        except EngineOutOfMemory:
            self._compare(i, "oom", buf, eng.events, ordered=True)
            self._drop_ranges()
            buf.clear()
            self._check_reserved(i, "oom")
            self.requests.add(R_RETRY, i, self.private_context or DEFAULT_POOL)
            return
        raise _Mismatch(i, "oom", "the GPU ran out of memory here but the model did not "
                        "(the cap is unknown: pass --cap BYTES)")

    def _check_final(self, n: int) -> None:
        got = [(s["address"], s["total_size"], [(b["address"], b["size"], b["state"]) for b in s["blocks"]])
               for s in self.engine.segments()]
        want = [(s["address"], s["total_size"],
                 [(a, size, "inactive" if st == "inactive" else "active_allocated") for a, size, _, st in s["blocks"]])
                for s in sorted(self.trace.segments, key=lambda s: s["address"])]
        pending = set(self.pending)
        got = [(a, t, [(ba, bs, "active_allocated" if ba in pending else st) for ba, bs, st in bl])
               for a, t, bl in got]
        if got != want:
            for g, w in zip(got + [None] * len(want), want + [None] * len(got)):
                if g != w:
                    raise _Mismatch(n, "end", "the final layout differs from the snapshot's segments", w, g)


def _finish(run: Run, eng: Engine) -> None:
    run.final_allocated_bytes = eng.allocated_bytes
    run.final_reserved_bytes = eng.reserved_bytes
    if len(run.reserved):
        peak = max(run.reserved)
        run.peak_reserved_bytes = peak
        run.peak_allocated_bytes = max(run.allocated)
    run.oom_events = len(run.oom_requests) + getattr(run, "_trace_ooms", 0)
    run.final_segments = eng.segments()


class _no_gc:
    """The blocks' prev/next links are reference cycles: with thousands of live blocks the
    cyclic collector would rescan them over and over during a replay, for nothing to free."""

    def __enter__(self) -> None:
        self.was = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc: Any) -> None:
        if self.was:
            gc.enable()


def replay(trace: Trace, *, cap_bytes: int | None = None, total_memory: int | None = None,
           stop_at: int | None = None, series: bool = True) -> Run:
    """Replay ``trace`` under the settings it was recorded with; check it event by event.

    Args:
        cap_bytes: the memory cap the program ran under (default: the snapshot's own
            ``memory_cap_bytes`` if it has one, else none).
        total_memory: device memory in bytes (expandable range size; default the snapshot's,
            else the lab H200's).
        stop_at: stop before this trace event (the run's ``final_segments`` is then the
            layout at that point, e.g. ``peak_event + 1`` for the layout at peak reserved).
        series: keep allocated and reserved bytes after every request (for the figure; the
            peaks are kept either way).

    Returns:
        a :class:`Run` whose ``matches_trace`` says whether every segment event, block address
        and reserved-bytes value agreed, and ``first_mismatch`` where not.
    """
    cap = cap_bytes if cap_bytes is not None else trace.cap_bytes
    total = total_memory or trace.total_memory or 150_109_880_320
    r = _Replayer(trace, cap, total)
    r.stop_at = stop_at
    r.series = series
    with _no_gc():
        run = r.run()
    run.oom_events = trace.events.codes.count(OOM)
    if stop_at is not None:
        run.live_keys = r.keys
    return run


__all__ = ["Requests", "Run", "replay"]
