"""The state before a late-started recording: the segments and blocks that existed when
``_record_memory_history`` was turned on, rebuilt from the trace and the final state and put
into the replay's engine (:meth:`experiments.doctor.model.engine.Engine.seed_segment`).

A trace that starts after the program allocated shows frees of blocks it never allocated,
releases of segments it never created, and blocks in the final state that no event made:
those are the starting state. Ordinary segments get their live blocks and free gaps;
expandable ranges are rebuilt from the final mapped runs, with the trace's maps taken away
and its unmaps put back (walking it backwards).

A block's size is its rounded request, unless the trace shows more: a large-pool block takes
the whole free block it was cut from when at most 1 MiB would be left (RULES.md §A.7), so it
may end up to 1 MiB after where its request says. A gap that short at a segment's end, or
before the next live block, is that remainder; one before a free gap shows only where the
GPU puts a later block at the gap's start plus that remainder (:func:`extension`, which the
replay follows by replaying again with the block longer).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any

from ..model.rules import DEFAULT_POOL, LARGE_BUFFER, SMALL_BUFFER, SMALL_SIZE, round_size
from ..reading.rows import ALLOC, FREE_DONE, FREE_REQ, SEG_ALLOC, SEG_FREE, SEG_MAP, SEG_UNMAP

_SEGMENT_EVENTS = re.compile(bytes([ord("["), SEG_ALLOC, SEG_FREE, ord("]")]))


@dataclasses.dataclass
class StartState:
    """What :func:`starting_state` rebuilt: blocks as (address, engine block, stream, pool id),
    segment or range bases as (base, size, pool id), their reserved bytes, and a reason when
    the start could not be rebuilt (None if it could)."""

    blocks: list[tuple[int, Any, int, tuple[int, int]]] = dataclasses.field(default_factory=list)
    bases: list[tuple[int, int, tuple[int, int]]] = dataclasses.field(default_factory=list)
    reserved: int = 0
    unsupported: str | None = None
    # the free gaps of the large pool right after a live block: (gap start, gap end, block address)
    gaps: list[tuple[int, int, int]] = dataclasses.field(default_factory=list)


def extension(state: StartState, gpu_addr: int, extended: dict[int, int]) -> tuple[int, int] | None:
    """Where the GPU put a block at ``gpu_addr`` and the model did not: if that address lies at
    most 1 MiB into a free gap of the start state that follows a live block from before the
    recording, that block was longer (the unsplit remainder of RULES.md §A.7: free blocks merge,
    so the bytes between the block and ``gpu_addr`` can belong to nothing else).

    Returns:
        (block address, its size in bytes) to seed instead, or None when the address says
        nothing about the start state (or that block was already extended).
    """
    for lo, hi, blk in state.gaps:
        if lo < gpu_addr < hi and gpu_addr - lo <= SMALL_SIZE and blk not in extended:
            return blk, gpu_addr - blk
    return None


def starting_state(trace: Any, engine: Any, extended: dict[int, int] | None = None) -> StartState:
    """The segments and blocks that existed before a late-started recording of ``trace`` (a
    :class:`~experiments.doctor.reading.trace.Trace`), put into ``engine`` (the replay's
    :class:`~experiments.doctor.model.engine.Engine`).

    Segments released in the trace that it never created, blocks freed that it never
    allocated, and those of the final state that the trace never made, rebuilt in place:
    ordinary segments with their live blocks and the gaps free; expandable ranges from the
    final mapped runs with the trace's maps taken away and its unmaps put back.
    """
    ev = trace.events
    state = StartState()
    final_pool = {s["address"]: s["pool_id"] for s in trace.segments}
    live_segs: set[int] = set()
    live_blocks: set[int] = set()
    init_segs: dict[int, tuple[int, int]] = {}
    init_blocks: dict[int, tuple[int, int]] = {}
    sizes, streams = ev.sizes, ev.streams
    codes = ev.codes.tobytes()
    for m in _SEGMENT_EVENTS.finditer(codes):            # the few segment events, found in C
        i = m.start()
        addr = ev.addrs[i]
        if codes[i] == SEG_ALLOC:
            live_segs.add(addr)
        else:
            if addr not in live_segs:
                init_segs.setdefault(addr, (sizes[i], streams[i]))
            live_segs.discard(addr)
    for s in trace.segments:
        if not s["is_expandable"] and s["address"] not in live_segs and s["address"] not in init_segs:
            init_segs[s["address"]] = (s["total_size"], s["stream"])
    if not init_segs and not trace.config.expandable_segments:
        # Only segments from before the recording are seeded, with the blocks in them: with
        # none, the pass over every block event (most of the trace, before every replay) is
        # not needed.
        return state
    # the block events: sizes and streams are read only for the few from before the recording
    add_block, drop_block = live_blocks.add, live_blocks.discard
    for code, addr, i in zip(codes, ev.addrs, range(len(ev))):
        if code == ALLOC:
            add_block(addr)
        elif code == FREE_REQ:
            if addr not in live_blocks:
                init_blocks.setdefault(addr, (sizes[i], streams[i]))
                add_block(addr)
        elif code == FREE_DONE:
            drop_block(addr)
    final_blocks = {}
    for s in trace.segments:
        for a, size, req, st in s["blocks"]:
            if st != "inactive" and a not in live_blocks and a not in init_blocks:
                final_blocks[a] = (size, req)
    if not init_segs and not init_blocks and not final_blocks:
        return state
    if trace.config.expandable_segments:
        _seed_ranges(trace, engine, state, init_blocks, final_blocks, extended)
        return state
    cfg = trace.config
    for base in sorted(init_segs):
        size, stream = init_segs[base]
        pool = final_pool.get(base, DEFAULT_POOL)
        blocks = []
        for a, (req, _) in init_blocks.items():
            if base <= a < base + size:
                blocks.append((a, round_size(max(req, 1), cfg), req))
        for a, (bsize, req) in final_blocks.items():
            if base <= a < base + size:
                blocks.append((a, bsize, req))
        small = size <= 2 * SMALL_SIZE and all(b[1] <= SMALL_SIZE for b in blocks)
        if not small:
            # A large-pool block is > 1 MiB, so a gap of at most 1 MiB after a live block is
            # the remainder that block's split did not cut off (§A.7): it belongs to the block.
            blocks.sort()
            for k, (a, n, req) in enumerate(blocks):
                end = blocks[k + 1][0] if k + 1 < len(blocks) else base + size
                if a in extended:
                    n = extended[a]
                elif 0 < end - (a + n) <= SMALL_SIZE:
                    n = end - a
                blocks[k] = (a, n, req)
                if end > a + n:
                    state.gaps.append((a + n, end, a))
        made = engine.seed_segment(base, size, stream, pool, small, blocks)
        state.bases.append((base, size, pool))
        state.reserved += size
        state.blocks += [(a, blk, stream, pool) for a, blk in sorted(made.items())]
    return state


def _seed_ranges(trace: Any, engine: Any, state: "StartState", init_blocks: dict[int, tuple[int, int]],
                 final_blocks: dict[int, tuple[int, int]], extended: dict[int, int]) -> None:
    """Expandable segments at the start: the final mapped runs, with the trace's maps taken
    away and its unmaps put back (walking it backwards), grouped into one range per
    (stream, pool); a range's base is taken as its lowest mapped address."""
    eng, ev = engine, trace.events
    groups: list[dict[str, Any]] = []

    def find(addr: int, stream: int, small: bool) -> dict[str, Any] | None:
        # the small and the large pool each reserve a range of their own (RULES.md §C.1), both
        # about 1.125 x the device's memory: two ranges of one stream may lie closer than that
        return next((g for g in groups if g["stream"] == stream and g["small"] == small
                     and abs(addr - g["base"]) < g["size"]), None)

    for s in sorted((s for s in trace.segments if s["is_expandable"]), key=lambda s: s["address"]):
        small = s["pool"] == "small"
        g = find(s["address"], s["stream"], small)
        if g is None:
            g = {"base": s["address"], "size": eng.range_size(small), "stream": s["stream"],
                 "pool": s["pool_id"], "small": small, "pages": set()}
            groups.append(g)
        g["pages"] |= set(range(s["address"], s["address"] + s["total_size"], SMALL_BUFFER))
    for code, addr, size, stream in reversed(ev):
        if code not in (SEG_MAP, SEG_UNMAP):
            continue
        small = size % LARGE_BUFFER != 0          # a large range maps whole 20 MiB pages
        g = find(addr, stream, small)
        if g is None:
            g = {"base": addr, "size": eng.range_size(small), "stream": stream, "pool": DEFAULT_POOL,
                 "small": small, "pages": set()}
            groups.append(g)
        span = set(range(addr, addr + size, SMALL_BUFFER))   # 2 MiB granules of the pages
        g["pages"] = g["pages"] - span if code == SEG_MAP else g["pages"] | span
    cfg = trace.config
    for g in groups:
        if not g["pages"]:
            continue           # the range was made during the recording
        pages = sorted(g["pages"])
        base = min(g["base"], pages[0])
        runs, start = [], pages[0]
        for a, b in zip(pages, pages[1:] + [None]):
            if b != a + SMALL_BUFFER:
                runs.append((start, a + SMALL_BUFFER - start))
                start = b
        inside = [(a, round_size(max(req, 1), cfg), req) for a, (req, _) in init_blocks.items()
                  if a in g["pages"] or (a // SMALL_BUFFER) * SMALL_BUFFER in g["pages"]]
        inside += [(a, n, req) for a, (n, req) in final_blocks.items()
                   if (a // SMALL_BUFFER) * SMALL_BUFFER in g["pages"]]
        inside = [(a, extended.get(a, n), req) for a, n, req in inside]
        made = eng.seed_segment(base, g["size"], g["stream"], g["pool"], g["small"], inside, expandable=True,
                                mapped=runs)
        state.bases.append((base, g["size"], g["pool"]))
        state.reserved += sum(n for _, n in runs)
        state.blocks += [(a, blk, g["stream"], g["pool"]) for a, blk in sorted(made.items())]


__all__ = ["StartState", "starting_state"]
