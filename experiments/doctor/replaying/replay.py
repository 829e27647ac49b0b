"""Replaying a snapshot's trace through the engine, exactly, checked event by event.

:func:`replay` drives :class:`experiments.doctor.model.engine.Engine` with the requests of a
trace (alloc, free_requested, free_completed) under the settings the program ran with,
handing it the segment addresses the driver chose. After every request it checks that the
engine made exactly the segment allocations and releases the trace shows, at that event,
with the same addresses and sizes, that the block sits where the GPU put it, and that the
reserved bytes agree. Where it cannot follow, it stops and says which event and why.

Things a trace does not say, and how they are recovered:

* ``empty_cache`` leaves no event of its own: a run of segment_free / segment_unmap events
  that the allocator's malloc path did not make (the garbage collector's releases and the
  out-of-memory path's are malloc's: the engine predicts them) is one ``empty_cache``:
  ``torch.cuda.empty_cache()``, or a deleted MemPool's release of its own pool; a private
  pool is freeable (nothing holds it) from its first release on.
* Which pool (default, MemPool, CUDA graph) a request was routed to: see
  :mod:`experiments.doctor.replaying.attribution` (choices, backtracking, alternatives).
* Blocks that CUDA-graph trees put back where a pool checkpoint held them
  (``setSegmentStateToCheckpoint``), not where best fit would: a private pool's request for
  a block's exact size at the start of a free block of that pool.
* Blocks allocated before recording began: their segments and blocks are rebuilt from the
  frees of unknown blocks, the releases of unknown segments and the final state
  (:mod:`experiments.doctor.replaying.start`).

The request list a replay recovers (``Run.requests``) is what
:func:`experiments.doctor.answers.whatif.what_if` runs again under other settings or a cap.
"""
from __future__ import annotations

import re
from bisect import bisect_right, insort
from typing import Any, Generator, Sequence

from ..errors import ImpossibleTraceError
from ..model.engine import Engine, EngineOutOfMemory, no_cyclic_gc
from ..model.rules import DEFAULT_POOL, H200_TOTAL_MEMORY, SMALL_SIZE, get_allocation_size
from ..reading.rows import ALLOC, FREE_DONE, FREE_REQ, OOM, SEG_ALLOC, SEG_FREE, SEG_MAP, SEG_UNMAP, SNAPSHOT
from ..steps import STEP_MASK, run_steps
from .attribution import PoolAttribution, alternatives, search
from .requests import KEY_SHIFT, R_ALLOC, R_FREE_DONE, R_FREE_REQ, R_FREEABLE, R_RESTORE, R_RETRY, Requests
from .run import Run
from .start import extension, starting_state

_SEG_NAMES = {SEG_ALLOC: "segment_alloc", SEG_FREE: "segment_free", SEG_MAP: "segment_map",
              SEG_UNMAP: "segment_unmap"}
_CODES = {v: k for k, v in _SEG_NAMES.items()}
_SEG_EVENTS = re.compile(bytes([ord("["), SEG_ALLOC, SEG_FREE, ord("]")]))


class _Mismatch(Exception):
    def __init__(self, index: int, action: str, reason: str, expected: Any = None, got: Any = None):
        self.info = {"event_index": index, "action": action, "reason": reason, "expected": expected, "got": got}
        super().__init__(reason)


def _fmt_events(evs: Sequence[tuple[Any, int, int]]) -> list[list[Any]]:
    return [[_SEG_NAMES.get(a, a), addr, size] for a, addr, size in evs]




def _peaks(run: Run, peak_a: int, peak_r: int, peak_k: int) -> None:
    run.peak_allocated_bytes = peak_a
    run.peak_reserved_bytes = max(peak_r, 0)
    run.peak_index = max(peak_k, 0)


class _Replayer:
    """One replay of a trace under its recorded settings, with the pool choices of ``forced``
    (:func:`replay` runs it, backtracking through its :class:`PoolAttribution`)."""

    def __init__(self, trace: Any, cap_bytes: int | None, total_memory: int,
                 forced: dict[int, tuple[int, int]] | None = None, *, stop_at: int | None = None,
                 series: bool = True, rule: str = "2.11", extended: dict[int, int] | None = None):
        self.trace = trace
        self.extended = extended or {}       # blocks from before the recording the trace shows longer
        self.start = None
        self.engine = Engine(trace.config, cap_bytes=cap_bytes, total_memory=total_memory, rule=rule)
        self.bases: list[int] = []           # sorted segment / range bases seen by the trace
        self.seg_end: dict[int, int] = {}
        self.seg_pool: dict[int, tuple[int, int]] = {}
        self.final_pool = {s["address"]: s["pool_id"] for s in trace.segments}
        self.live: dict[int, Any] = {}       # addr -> engine block (allocated)
        self.pending: dict[int, Any] = {}    # addr -> engine block (freed, not completed)
        self.keys: dict[int, int] = {}       # addr -> request key
        self.next_key = 0
        self.requests = Requests(trace.events)
        # which pool each request that made a new segment went to, where the trace leaves it open
        self.attribution = PoolAttribution(self.engine, self.requests, forced)
        self.trace_reserved = 0
        self.restores = 0                    # blocks placed by a pool checkpoint (CUDA-graph trees)
        self.peak_reserved, self.peak_event = -1, 0
        self.segment_log: list[tuple[str, int, int]] = []   # the driver's view: cudaMalloc / cudaFree / new range
        self.stop_at = stop_at
        self.n_initial = 0
        self.series = series                 # keep the bytes after every request (the peaks are kept either way)
        self.expandable = trace.config.expandable_segments
        self.result: Run | None = None
        self.gc_caps: list[float] = []      # caps below which each collection followed says the cap is

    # -- segment bookkeeping of the trace
    def _containing(self, addr: int) -> int | None:
        i = bisect_right(self.bases, addr) - 1
        if i >= 0:
            base = self.bases[i]
            if addr < self.seg_end[base]:
                return base
        return None

    def _add_base(self, base: int, size: int, pool: tuple[int, int]) -> None:
        if pool == DEFAULT_POOL:
            pool = DEFAULT_POOL             # the one object: the fast path tests it by identity
        insort(self.bases, base)
        self.seg_end[base] = base + size
        self.seg_pool[base] = pool
        self.attribution.saw(pool)

    def _drop_base(self, base: int) -> None:
        self.bases.remove(base)
        del self.seg_end[base]
        del self.seg_pool[base]

    def _seed(self) -> list[tuple[int, int, int, tuple[int, int]]]:
        """Blocks and segments from before the recording (:func:`starting_state`)."""
        state = starting_state(self.trace, self.engine, self.extended)
        self.start = state
        for base, size, pool in state.bases:
            self._add_base(base, size, pool)
        self.trace_reserved += state.reserved
        seeded = []
        for addr, blk, stream, pool in state.blocks:
            self.live[addr] = blk
            self.keys[addr] = self.next_key
            seeded.append((self.next_key, blk.requested, stream, pool))
            self.next_key += 1
        self.n_initial = len(seeded)
        self.requests.first = self.n_initial
        if state.unsupported:
            raise _Mismatch(0, "alloc", state.unsupported)
        return seeded

    def run(self) -> Run:
        """Replay the trace (up to ``stop_at``); the Run is also kept as ``result``."""
        self.result = run_steps(self._run())
        return self.result

    def _run(self) -> Generator[None, None, Run]:
        # a generator run in steps (experiments.doctor.steps): it returns the Run
        trace, eng = self.trace, self.engine
        private = self.attribution.private
        run = Run(trace.settings)
        ev = trace.events
        n = len(ev)
        # which segment_alloc / range survives to the end: its pool id is in the final state
        survives = bytearray(n)
        alive: set[int] = set()
        codes, addrs, sizes, streams = ev.codes, ev.addrs, ev.sizes, ev.streams
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
        # the request log and the series grow as short lists packed at each step (Requests.tail,
        # Run.pack): a list's append, called as a method, costs a fraction of an array's
        tail = reqs.tail
        series = self.series
        peak_a, peak_r, peak_k = 0, -1, 0     # the peaks after a request, and which request
        alloc_a: list[int] = []
        res_a: list[int] = []
        live, pending, keys = self.live, self.pending, self.keys
        bases, seg_end, seg_pool = self.bases, self.seg_end, self.seg_pool
        malloc, free_req, free_done = eng.malloc, eng.free_requested, eng.free_completed
        i = 0
        no_requests = trace.skipped_actions is not None and "free_requested" in trace.skipped_actions
        try:
            run.initial = self._seed()
            run.start_reserved, run.start_allocated = eng.reserved_bytes, eng.allocated_bytes
            only_default = not private
            stop = n if self.stop_at is None else min(n, self.stop_at)
            # sizes and streams are read where a request needs them: an int made from an array
            # costs as much as the rest of a free's step in the browser's Python
            for i, code, addr in zip(range(stop), codes, addrs):
                if not i & STEP_MASK:
                    reqs.pack()
                    run.pack(alloc_a, res_a)
                    yield
                if code == FREE_REQ:
                    if buf:
                        self._flush_empty(i, buf)
                    blk = live.pop(addr, None)
                    if blk is None:
                        self._unknown_block(i, "free_requested", addr)
                    free_req(blk)
                    pending[addr] = blk
                    tail.append(R_FREE_REQ | keys[addr] << KEY_SHIFT)
                    if series:
                        alloc_a.append(eng.allocated_bytes)
                        res_a.append(eng.reserved_bytes)
                    continue                 # a free raises no peak
                elif code == FREE_DONE:
                    if buf:
                        self._flush_empty(i, buf)
                    blk = pending.pop(addr, None)
                    if blk is None and no_requests and addr in live:
                        # skip_actions=["free_requested"]: the free is recorded once, completed
                        blk = live.pop(addr)
                        free_req(blk)
                        tail.append(R_FREE_REQ | keys[addr] << KEY_SHIFT)
                        if series:
                            alloc_a.append(eng.allocated_bytes)
                            res_a.append(eng.reserved_bytes)
                    if blk is None:
                        self._unknown_block(i, "free_completed", addr)
                    free_done(blk)
                    tail.append(R_FREE_DONE | keys.pop(addr) << KEY_SHIFT)
                    if series:
                        alloc_a.append(eng.allocated_bytes)
                        res_a.append(eng.reserved_bytes)
                    continue
                elif code == ALLOC:
                    if buf:
                        self._alloc(i, buf, survives)
                        only_default = not private
                    else:
                        # fast path: no segment event, so the block is in a segment the trace knows;
                        # until the trace shows a private pool, every such segment is the default pool's
                        size, stream = sizes[i], streams[i]
                        if only_default:
                            pool = DEFAULT_POOL
                        else:
                            k = bisect_right(bases, addr) - 1
                            pool = seg_pool[bases[k]] if k >= 0 and addr < seg_end[bases[k]] else DEFAULT_POOL
                        if eng.address_hook is not None:
                            eng.address_hook = None
                        if pool is not DEFAULT_POOL and eng.checkpointed_block(addr, size, stream, pool) is not None:
                            self._restore(i, addr, size, stream, pool)   # a graph tree's checkpoint
                        else:
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
                            key = self.next_key
                            keys[addr] = key
                            self.next_key = key + 1
                            if pool is DEFAULT_POOL:
                                tail.append(key << KEY_SHIFT)  # R_ALLOC in pool 0, the default
                            else:
                                reqs.add_alloc(R_ALLOC, key, pool)
                elif code <= SEG_UNMAP:
                    buf.append(i)
                    size = sizes[i]
                    self.trace_reserved += size if code == SEG_ALLOC or code == SEG_MAP else -size
                    continue
                elif code == SNAPSHOT:
                    # _snapshot() runs between requests: releases before it were an empty_cache
                    if buf:
                        self._flush_empty(i, buf)
                    run.marks.append((i, eng.allocated_bytes, eng.reserved_bytes))
                    if series:
                        run.mark_points.append(len(run.allocated) + len(alloc_a))
                    continue
                elif code == OOM:
                    self._oom(i, buf, sizes[i], streams[i])
                    only_default = not private
                else:
                    raise _Mismatch(i, trace.unknown.get(i, "?"), "a trace entry of a kind the doctor does not "
                                    f"know ({trace.unknown.get(i)!r}); it cannot follow the allocator past it")
                # the values after each request: peaks always, the series when asked
                a, r = eng.allocated_bytes, eng.reserved_bytes
                if a > peak_a:
                    peak_a = a
                if r > peak_r:
                    peak_r, peak_k = r, len(reqs) - 1
                if series:
                    alloc_a.append(a)
                    res_a.append(r)
            if stop < n:           # stopped early on purpose: the state after event stop - 1
                run.events_replayed = stop
                run.requests = reqs.pack()
                run.pack(alloc_a, res_a)
                _peaks(run, peak_a, peak_r, peak_k)
                run.finish(eng)
                return run
            i = n
            self._flush_empty(n, buf)
            peak_a = max(peak_a, eng.allocated_bytes)
            if eng.reserved_bytes > peak_r:
                peak_r, peak_k = eng.reserved_bytes, len(reqs) - 1
            if series:
                alloc_a.append(eng.allocated_bytes)
                res_a.append(eng.reserved_bytes)
            self._check_final(n)
            run.matches_trace = True
        except _Mismatch as m:
            run.matches_trace = False
            run.first_mismatch = m.info
        run.events_replayed = i
        run.requests = reqs.pack()
        run.pack(alloc_a, res_a)
        run.peak_event = self.peak_event
        run.segment_log = self.segment_log
        _peaks(run, peak_a, peak_r, peak_k)
        run.finish(eng)
        return run

    def _unknown_block(self, i: int, action: str, addr: int) -> None:
        if self._containing(addr) is None:
            raise ImpossibleTraceError(f"trace entry {i} ({action}): {'frees' if action == 'free_requested' else 'completes a free of'} "
                                       f"a block at {addr:#x} that no segment holds (an impossible trace)")
        if action == "free_requested":
            raise _Mismatch(i, action, f"free of an unknown block at {addr:#x}")
        raise _Mismatch(i, action, f"completion of a free that was never requested at {addr:#x}")

    def live_keys(self) -> dict[int, int]:
        """{block address: trace event of its allocation} of the blocks allocated now (those from
        before the recording have no event and are left out)."""
        first = self.n_initial
        allocs = [m.start() for m in re.finditer(bytes([ALLOC]), self.trace.events.codes.tobytes())]
        return {addr: allocs[k - first] for addr, k in self.keys.items() if addr in self.live and k >= first}

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

    def _compare(self, i: int, action: str, expected_idx: Sequence[int], got: list,
                 pool: tuple[int, int] = DEFAULT_POOL, small: bool = False) -> None:
        # Releases are compared as sets (C++ walks hash maps of streams and pools for them);
        # new segments and maps in order, after every release (a refused cudaMalloc makes none).
        ev = self.trace.events
        expected = [(ev[j][0], ev[j][1], ev[j][2]) for j in expected_idx]
        got_c = [(_CODES[a], addr, size) for a, addr, size in got]

        def key(evs: list) -> tuple:
            gone = sorted(e for e in evs if e[0] in (SEG_FREE, SEG_UNMAP))
            made = [e for e in evs if e[0] in (SEG_ALLOC, SEG_MAP)]
            first_made = next((k for k, e in enumerate(evs) if e[0] in (SEG_ALLOC, SEG_MAP)), len(evs))
            late = [e for e in evs[first_made:] if e[0] in (SEG_FREE, SEG_UNMAP)]
            return gone, made, late
        if key(expected) != key(got_c):
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

    def _mark_freeable(self, idx: Sequence[int]) -> None:
        # A private pool gives memory back only once freeable (no graph or MemPool holds it):
        # the first release of one of its segments shows it is, from then on (ids are not reused).
        eng = self.engine
        new = sorted(p for p in self._segment_pools(idx) if p != DEFAULT_POOL and p not in eng.freeable)
        if new:
            eng.freeable.update(new)
            self.requests.add_extra((R_FREEABLE, tuple(new)))

    def _flush_empty(self, i: int, buf: list[int], check: bool = True) -> None:
        if not buf:
            return
        ev = self.trace.events
        if any(ev[j][0] in (SEG_ALLOC, SEG_MAP) for j in buf):
            raise _Mismatch(buf[0], _SEG_NAMES[ev[buf[0]][0]], "a segment was created without an allocation "
                            "that needed it")
        eng = self.engine
        pools = self._segment_pools(buf)
        self._mark_freeable(buf)
        # torch.cuda.empty_cache() (the default pools and every freeable private pool), or a
        # deleted MemPool's release of its own pool
        pool_id = DEFAULT_POOL
        if DEFAULT_POOL not in pools and len(pools) == 1:
            expected = sorted((ev[j][0], ev[j][1], ev[j][2]) for j in buf)
            if sorted((_CODES[a], addr, size) for a, addr, size in eng.release_cached_events(DEFAULT_POOL)) != expected:
                pool_id = next(iter(pools))
        eng.empty_cache(pool_id)
        self.requests.add_empty(pool_id)
        self._compare(buf[0], "empty_cache (inferred)", buf, eng.events)
        self._drop_ranges()
        buf.clear()
        if check:  # not when the request that follows still has segment events to come
            self._check_reserved(i, "empty_cache (inferred)")

    def _drop_ranges(self) -> None:
        if self.expandable:
            live = self.engine.segment_bases()
            for base in [b for b in self.bases if b not in live]:
                self._drop_base(base)

    def _pool_guess(self, i: int, addr: int, stream: int, creates: list[int]) -> tuple[int, int]:
        # the pool a request most likely went to before its segment events are placed: the
        # segment it landed in, else its stream's last pool
        base = self._containing(addr)
        if base is not None and not creates:
            return self.seg_pool[base]
        return self.attribution.stream_pool(stream, i)

    def _alloc(self, i: int, buf: list[int], survives: list[bool]) -> None:
        eng, ev = self.engine, self.trace.events
        _, addr, size, stream = ev[i]
        creates = [j for j in buf if ev[j][0] in (SEG_ALLOC, SEG_MAP)]
        frees = [j for j in buf if ev[j][0] in (SEG_FREE, SEG_UNMAP)]
        small = eng.round(size) <= SMALL_SIZE
        # an empty_cache before this request, unless the malloc path itself releases
        if (frees and creates and eng.cap_bytes is None and eng.config.garbage_collection_threshold
                and all(j < min(creates) for j in frees)
                and self._follow_gc(frees, get_allocation_size(eng.round(size), eng.config))):
            # garbage_collection_threshold under a cap the snapshot does not record: the
            # collector's releases (right before the new segment) are taken as the trace shows
            buf[:] = [j for j in buf if j not in frees]
        elif frees and not eng.malloc_releases(size, stream, self._pool_guess(i, addr, stream, creates)):
            first_create = min(creates) if creates else None
            pre = [j for j in buf if j in frees and (first_create is None or j < first_create)]
            rest = [j for j in buf if j not in pre]
            buf[:] = pre
            self._flush_empty(i, buf, check=False)
            buf[:] = rest
        else:
            self._mark_freeable(frees)
        # which pool: the segment the block landed in, or for a new segment the final state / a choice
        pool = DEFAULT_POOL
        region = None
        for j in creates:
            c, a, s, _ = ev[j]
            if c == SEG_ALLOC and a <= addr < a + s:
                region = (j, a, a + s)
            elif c == SEG_MAP and self._containing(a) is None:
                region = (j, a, a + eng.range_size(small))
        entry_pool = self.trace.pool_of(i)      # torch 2.12+ says which pool, on the entry itself
        if region is not None and entry_pool is not None:
            pool = entry_pool
        elif region is not None:
            j, lo, hi = region
            known = None
            if ev[j][0] == SEG_ALLOC:
                if survives[j] and lo in self.final_pool:
                    known = self.final_pool[lo]
            else:
                known = next((s["pool_id"] for s in self.trace.segments
                              if s["is_expandable"] and lo <= s["address"] < hi), None)
            if known is not None:
                pool = known
            else:
                pool = self.attribution.choose(i, size, stream, maps=ev[j][0] == SEG_MAP, region=(lo, hi))
        else:
            base = self._containing(addr)
            if base is not None:
                pool = self.seg_pool[base]
        expected = [ev[j] for j in buf]

        def address(_size: int) -> int | None:
            # the engine is about to emit its next segment event: take the GPU's address for it
            creates_so_far = sum(1 for e in eng.events if e[0] in ("segment_alloc", "segment_map"))
            made = [e for e in expected if e[0] in (SEG_ALLOC, SEG_MAP)]
            if creates_so_far < len(made):
                return made[creates_so_far][1]
            return None

        eng.address_hook = address
        try:
            blk = eng.malloc(size, stream, pool)
        except EngineOutOfMemory:
            raise _Mismatch(i, "alloc", "the model ran out of memory where the GPU did not "
                            "(a memory cap the snapshot does not record? pass --cap)") from None
        self._compare(i, "alloc", buf, eng.events, pool=pool, small=small)
        self._drop_ranges()
        buf.clear()
        self._check_reserved(i, "alloc")
        if blk.addr != addr:
            raise _Mismatch(i, "alloc", "the block is not where the GPU put it", addr, blk.addr)
        self.live[addr] = blk
        self.keys[addr] = self.next_key
        self.requests.add_alloc(R_ALLOC, self.next_key, pool)
        self.next_key += 1

    def _follow_gc(self, frees: list[int], alloc: int) -> bool:
        """Release the whole cached segments the trace released before a new segment (the
        garbage collector's, or the out-of-memory path's once the cap refused the segment, under
        a cap the snapshot does not record); False if one is not a whole free segment of the
        default large pool (then it was something else). Either bounds the cap from above: a
        collection runs when reserved > threshold x cap, a refusal when reserved + the new
        segment > cap."""
        eng, ev = self.engine, self.trace.events
        blocks = []
        for j in frees:
            c, a, s, _ = ev[j]
            b = eng.cached_segment(a)
            if c != SEG_FREE or b is None or b.size != s or b.seg.small or b.seg.pool_id != DEFAULT_POOL:
                return False
            blocks.append(b)
        self.gc_caps.append(max(eng.reserved_bytes / eng.config.garbage_collection_threshold,
                                eng.reserved_bytes + alloc))
        for b in blocks:
            eng.release_cached_segment(b)
            self.segment_log.append(("segment_free", b.seg.addr, b.size))
            self._drop_base(b.seg.addr)
        return True

    def _restore(self, i: int, addr: int, size: int, stream: int, pool: tuple[int, int]) -> None:
        # a block put where a private pool's checkpoint held it, not where best fit would
        blk = self.engine.alloc_checkpointed_block(addr, size, stream, pool)
        self.live[addr] = blk
        self.keys[addr] = self.next_key
        self.requests.add_alloc(R_RESTORE, self.next_key, pool)
        self.next_key += 1
        self.restores += 1

    def _oom(self, i: int, buf: list[int], size: int, stream: int) -> None:
        eng = self.engine
        eng.address_hook = None
        pool = self.trace.pool_of(i) or self.attribution.stream_pool(stream, i)
        self._mark_freeable([j for j in buf if self.trace.events[j][0] in (SEG_FREE, SEG_UNMAP)])
        try:
            eng.malloc(size, stream, pool)
        except EngineOutOfMemory:
            self._compare(i, "oom", buf, eng.events)
            self._drop_ranges()
            buf.clear()
            self._check_reserved(i, "oom")
            self.requests.add_extra((R_RETRY, size, stream, pool))
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


RULE_NOTES = {"2.11": "torch 2.11 and before: checked on the lab H200 (torch 2.11)",
              "2.12": "read from the source, not yet checked on a GPU",
              "2.13": "read from the source, not yet checked on a GPU"}


def candidate_rules(trace: Any) -> tuple[str, ...]:
    """The best-fit orders to try on ``trace``, the likeliest first: what its layout shows (no
    ``pool_id``: torch 2.11 or before; ``pool_id``: 2.12 or 2.13, which write the same
    layout; 2.14's keys: 2.13's order), then the others (RULES.md §G)."""
    if trace.layout == "2.11":
        return ("2.11", "2.13", "2.12")
    if trace.layout == "2.14":
        return ("2.13", "2.12", "2.11")
    return ("2.13", "2.12", "2.11")


def replay(trace: Any, *, cap_bytes: int | None = None, total_memory: int | None = None,
           stop_at: int | None = None, series: bool = True, rule: str | None = None) -> Run:
    """Replay ``trace`` under the settings it was recorded with; check it event by event.

    Where the trace leaves a new segment's pool open, the replay chooses and, when the trace
    later contradicts a choice, goes back and replays again
    (:func:`experiments.doctor.replaying.attribution.search`). Torch 2.12+ traces name each request's
    pool (``pool_id`` on every entry): then nothing is chosen.

    Best fit breaks ties between equal-size free blocks by release (:data:`experiments.doctor.model.engine.RULES`): the
    replay takes the order the trace's layout points to and, when the trace contradicts it
    after a tie was decided, tries the others (:func:`candidate_rules`); ``Run.rule`` is the
    one that matched (or got furthest), ``Run.rules_tried`` all those run.

    Args:
        cap_bytes: the memory cap the program ran under (default: the snapshot's own
            ``memory_cap_bytes`` if it has one, else none).
        total_memory: device memory in bytes (expandable range size; default the snapshot's,
            else the lab H200's).
        stop_at: stop before this trace event (the run's ``final_segments`` is then the
            layout at that point, e.g. ``peak_event + 1`` for the layout at peak reserved;
            ``live_keys`` then maps each allocated block to its allocation's trace event).
        series: keep allocated and reserved bytes after every request (for the figure; the
            peaks are kept either way).
        rule: replay under this order only ('2.11', '2.12' or '2.13').

    Returns:
        a :class:`Run` whose ``matches_trace`` says whether every segment event, block address
        and reserved-bytes value agreed, and ``first_mismatch`` where not (of the replay that
        got furthest); with ``alternatives`` and ``open_keys`` where pools were left open.
    """
    rules = (rule,) if rule is not None else candidate_rules(trace)
    best = None
    tried = []
    for r in rules:
        run = _replay_rule(trace, cap_bytes, total_memory, stop_at, series, r)
        tried.append(r)
        if best is None or run.matches_trace or (run.events_replayed or 0) > (best.events_replayed or 0):
            best = run
        # another order matters only where this one decided a tie between equal-size blocks
        if run.matches_trace or not run.rule_ties:
            break
    best.rules_tried = tuple(tried)
    _explain_skipped(trace, best)
    return best


def _explain_skipped(trace: Any, run: Run) -> None:
    # A trace recorded with _record_memory_history(skip_actions=[...]) lacks entries the replay
    # needs: say so in the one line of the mismatch.
    mm = run.first_mismatch
    if not mm:
        return
    codes = trace.events.codes
    missing = [name for name, code in (("alloc", ALLOC), ("free_completed", FREE_DONE), ("segment_alloc", SEG_ALLOC),
                                       ("segment_free", SEG_FREE)) if code not in codes]
    if not missing:
        return
    if "segment_alloc" in missing and SEG_MAP in codes:
        missing.remove("segment_alloc")            # expandable segments map, they do not allocate
    if "segment_free" in missing and "segment_events differ" not in mm["reason"].replace(" ", "_").replace("_", " "):
        missing.remove("segment_free")
    if "alloc" in missing and FREE_REQ not in codes and FREE_DONE not in codes:
        missing.remove("alloc")
    if missing:
        mm["reason"] = (f"the trace has no {' or '.join(missing)} entries (recorded with "
                        f"_record_memory_history(skip_actions={missing!r})?): the replay needs them to follow "
                        f"the allocator; record again without skipping them ({mm['reason']})")


def _replay_rule(trace: Any, cap_bytes: int | None, total_memory: int | None, stop_at: int | None,
                 series: bool, rule: str) -> Run:
    cap = cap_bytes if cap_bytes is not None else trace.cap_bytes
    total = total_memory or trace.total_memory or H200_TOTAL_MEMORY

    extended: dict[int, int] = {}

    def once(forced: dict[int, tuple[int, int]]) -> _Replayer:
        r = _Replayer(trace, cap, total, forced, stop_at=stop_at, series=series, rule=rule, extended=extended)
        with no_cyclic_gc():
            r.run()
        return r

    best, last = search(once)
    # A recording that began late: where the GPU put a block at most 1 MiB into a free gap of
    # the start state, the live block before the gap was longer than its request (an unsplit
    # remainder, RULES.md §A.7); replay again with it so, as long as that gets further.
    while (not best.matches_trace and last.start is not None and best.first_mismatch
           and best.first_mismatch["reason"] == "the block is not where the GPU put it"):
        fix = extension(last.start, best.first_mismatch["expected"], extended)
        if fix is None:
            break
        extended[fix[0]] = fix[1]
        run2, last2 = search(once)
        if not (run2.matches_trace or run2.events_replayed > best.events_replayed):
            del extended[fix[0]]             # the alternatives below replay without it
            break
        best, last = run2, last2
    best.initial_extended = len(extended)
    best.allocated_upper_bound = bool(trace.skipped_actions and "free_requested" in trace.skipped_actions)
    best.rule = rule
    best.rule_ties = last.engine.rule_ties
    if last.gc_caps:
        best.gc_cap_range = (best.peak_reserved_bytes, int(min(last.gc_caps)))
    best.oom_events = trace.events.codes.count(OOM)
    best.restores = last.restores
    if stop_at is not None and best is last.result:
        best.live_keys = last.live_keys()
    att = last.attribution
    if best is last.result and best.matches_trace and stop_at is None:
        best.pool_choices = len(att.decisions)
        # Other attributions are looked for only where the trace shows private pools at all:
        # otherwise every new segment could be a pool of its own, used once, and none is.
        if att.private:
            best.alternatives = alternatives(once, att.decisions)
            # the requests whose pool is open: those placed in a segment a choice attributed
            best.open_keys = att.open_keys(trace, len(best.initial))
    return best


__all__ = ["RULE_NOTES", "Run", "candidate_rules", "replay"]
