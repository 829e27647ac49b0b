"""The caching allocator of one device with streams, private pools, a cap and expandable segments.

This is the engine of the allocator doctor (:mod:`experiments.doctor`). It follows
``c10/cuda/CUDACachingAllocator.cpp`` (torch 2.11) as written down in RULES.md:

* a block belongs to the stream it was allocated on; free blocks are kept per (pool, stream)
  in lists sorted by (size, address), so best fit is one ``bisect`` (§A.6, §B.1);
* a free is two steps, ``free_requested`` (allocated bytes drop) and ``free_completed`` (the
  block goes back to its pool and merges), because ``record_stream`` keeps a freed block out
  of the pool until its events complete (§A.8, §B);
* private pools (``torch.cuda.MemPool``, CUDA-graph pools) have their own segments, are used
  only by the requests routed to them, and give memory back only when released (§D);
* a memory cap (``set_per_process_memory_fraction``) makes ``alloc_block`` fail, after which
  the OOM path runs: ``garbage_collection_threshold`` (with a cap), release of oversize
  cached blocks (``max_split_size_mb``), release of every cached segment and a retry, then
  out of memory (§A.5, §A.9, §A.10);
* with expandable segments each (pool, stream) maps pages into a virtual range of
  ``ceil(1.125 × device memory / page)`` pages, and a new range opens when a request does not
  fit in the existing ones (§C; ``ExpandableSegment`` in the torch source).

Sizes, rounding and the settings parser come from :mod:`experiments.doctor.rules`.
Segment addresses are the driver's choice: give the engine the addresses a trace recorded
(``addresses``) to reproduce a run block for block; otherwise a top-down first-fit address
space stands in for the driver. Sizes are in bytes.
"""
from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from typing import Any, Callable, Iterable

from ..core.units import format_bytes
from .rules import (DEFAULT, LARGE_BUFFER, SMALL_BUFFER, SMALL_SIZE, AllocatorConfig,
                    allocation_size, round_size, should_split)

H200_TOTAL_MEMORY = 150_109_880_320   # totalGlobalMem of the lab H200 (RULES.md §I)
DEFAULT_POOL = (0, 0)


class EngineOutOfMemory(RuntimeError):
    """The request could not be served: every step of the OOM path failed (§A.10)."""

    def __init__(self, nbytes: int, rounded: int, alloc: int, allocated: int, reserved: int):
        self.figures = {"request_bytes": nbytes, "rounded_bytes": rounded, "alloc_size_bytes": alloc,
                        "allocated_bytes": allocated, "reserved_bytes": reserved}
        super().__init__(f"out of memory: tried to allocate {format_bytes(alloc)} with {format_bytes(allocated)} "
                         f"allocated and {format_bytes(reserved)} reserved")


class Block:
    """A contiguous range of one segment; ``allocated`` or free, ``mapped`` unless expandable."""

    __slots__ = ("addr", "size", "requested", "seg", "prev", "next", "allocated", "mapped", "gc_base")

    def __init__(self, addr: int, size: int, seg: "Segment", prev: "Block | None" = None,
                 next: "Block | None" = None, mapped: bool = True):
        self.addr, self.size, self.seg = addr, size, seg
        self.prev, self.next = prev, next
        self.requested = 0
        self.allocated = False
        self.mapped = mapped
        self.gc_base = 0


class Segment:
    """One cudaMalloc result, or one expandable virtual range, of one (pool, stream)."""

    __slots__ = ("addr", "size", "stream", "pool_id", "small", "expandable", "head")

    def __init__(self, addr: int, size: int, stream: int, pool_id: tuple[int, int], small: bool, expandable: bool):
        self.addr, self.size, self.stream, self.pool_id = addr, size, stream, pool_id
        self.small, self.expandable = small, expandable
        self.head: Block | None = None


class _FreeList:
    """Free blocks of one (pool id, small/large, stream), sorted by (size, address)."""

    __slots__ = ("keys", "blocks", "unmapped")

    def __init__(self) -> None:
        self.keys: list[tuple[int, int]] = []
        self.blocks: dict[int, Block] = {}
        self.unmapped: dict[int, Block] = {}   # expandable: unmapped blocks by address

    def add(self, b: Block) -> None:
        insort(self.keys, (b.size, b.addr))
        self.blocks[b.addr] = b

    def remove(self, b: Block) -> None:
        keys = self.keys
        i = bisect_left(keys, (b.size, b.addr))
        del keys[i]
        del self.blocks[b.addr]


class _AddressSpace:
    """Top-down first fit over [2^48, 2^60): where a run without the driver's addresses puts segments."""

    def __init__(self) -> None:
        # above every user-space address a driver hands out, so it never meets a recorded one
        self.free = [(1 << 48, 1 << 60)]  # (start, end), sorted by start; room for thousands of ranges

    def take(self, size: int) -> int:
        size = -(-size // SMALL_BUFFER) * SMALL_BUFFER
        for i in range(len(self.free) - 1, -1, -1):
            start, end = self.free[i]
            if end - start >= size:
                if end - start == size:
                    del self.free[i]
                else:
                    self.free[i] = (start, end - size)
                return end - size
        raise RuntimeError("the modelled address space is exhausted")

    def give(self, addr: int, size: int) -> None:
        size = -(-size // SMALL_BUFFER) * SMALL_BUFFER
        i = bisect_left(self.free, (addr, addr))
        self.free.insert(i, (addr, addr + size))
        if i + 1 < len(self.free) and self.free[i][1] == self.free[i + 1][0]:
            self.free[i] = (self.free[i][0], self.free[i + 1][1])
            del self.free[i + 1]
        if i > 0 and self.free[i - 1][1] == self.free[i][0]:
            self.free[i - 1] = (self.free[i - 1][0], self.free[i][1])
            del self.free[i]


class Engine:
    """The caching allocator of one device.

    Args:
        config: allocator settings (:class:`experiments.doctor.rules.AllocatorConfig`).
        cap_bytes: memory cap in bytes (``fraction × total memory``), or None.
        total_memory: the device's memory in bytes; sets the expandable range size
            (default: the lab H200's 150,109,880,320 B).
        addresses: segment base addresses to use in order (a trace's segment_alloc
            addresses, or for expandable segments the bases of new ranges); when they run
            out the engine picks its own.

    Attributes:
        allocated_bytes, reserved_bytes, active_bytes: the ``memory_stats`` counters.
        num_alloc_retries, num_ooms: counters of the OOM path.
        events: the segment events of the last operation, as (action, addr, size) with action
            in segment_alloc, segment_free, segment_map, segment_unmap.
    """

    def __init__(self, config: AllocatorConfig = DEFAULT, *, cap_bytes: int | None = None,
                 total_memory: int = H200_TOTAL_MEMORY, addresses: Iterable[int] = ()):
        if cap_bytes is not None and (isinstance(cap_bytes, bool) or not isinstance(cap_bytes, int) or cap_bytes < 0):
            raise ValueError(f"cap_bytes must be a whole number of bytes >= 0 or None, got {cap_bytes!r}")
        if isinstance(total_memory, bool) or not isinstance(total_memory, int) or total_memory <= 0:
            raise ValueError(f"total_memory must be a positive number of bytes, got {total_memory!r}")
        self.config = config
        self.cap_bytes = cap_bytes
        self.total_memory = total_memory
        self.allocated_bytes = 0
        self.reserved_bytes = 0
        self.active_bytes = 0
        self.num_alloc_retries = 0
        self.num_ooms = 0
        self.events: list[tuple[str, int, int]] = []
        self._free: dict[tuple[tuple[int, int], bool, int], _FreeList] = {}
        self._segments: dict[int, Segment] = {}         # by base address
        self._ranges: dict[tuple[tuple[int, int], bool, int], list[Segment]] = {}
        self._addresses = deque(addresses)
        self._space = _AddressSpace()
        self._gc_calls = 0                              # get_free_block calls on the default large pool
        self._round: dict[int, int] = {}
        self._large_page = config.large_segment_size
        # get_free_block counts its calls (the age of cached blocks) only for the GC (§A.9)
        self._gc_counting = cap_bytes is not None and config.garbage_collection_threshold > 0
        self._split_limit_none = config.max_split_size is None
        # Called with the size of each new segment or range for its base; None lets the engine choose.
        self.address_hook: Callable[[int], int | None] | None = None

    # ------------------------------------------------------------------ public operations

    def round(self, nbytes: int) -> int:
        """``round_size`` under this engine's settings (cached: traces repeat sizes)."""
        r = self._round.get(nbytes)
        if r is None:
            r = self._round[nbytes] = round_size(nbytes, self.config)
        return r

    def malloc(self, nbytes: int, stream: int = 0, pool_id: tuple[int, int] = DEFAULT_POOL) -> Block:
        """Serve ``nbytes`` on ``stream`` from pool ``pool_id``; return the block.

        Raises:
            EngineOutOfMemory: the request does not fit (the engine state then shows the
                releases the OOM path made, as on the GPU).
        """
        if self.events:
            self.events = []
        size = self._round.get(nbytes)
        if size is None:
            size = self.round(nbytes)
        small = size <= SMALL_SIZE
        fl = self._free.get((pool_id, small, stream))
        if fl is None:
            fl = self._list(pool_id, small, stream)
        if self._gc_counting and pool_id == DEFAULT_POOL and not small:
            self._gc_calls += 1
        i = self._peek_index(fl, size)
        if i >= 0:
            # fl.remove(block) by the index get_free_block found: the hot path of every replay
            keys = fl.keys
            block = fl.blocks.pop(keys[i][1])
            del keys[i]
        else:
            block = self._alloc_path(nbytes, size, small, stream, pool_id, fl)
        remaining = block.size - size
        if should_split(block.size, size, "small" if small else "large", self.config, block.seg.expandable):
            addr = block.addr + size
            rest = Block(addr, remaining, block.seg, block, block.next)
            rest.requested = block.requested       # the remainder keeps the old block's bookkeeping
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            rest.gc_base = self._gc_calls          # self._insert_free(fl, rest), inlined
            insort(fl.keys, (remaining, addr))
            fl.blocks[addr] = rest
        block.allocated = True
        block.requested = nbytes
        self.allocated_bytes += block.size
        self.active_bytes += block.size
        return block

    def would_fail_alloc_block(self, nbytes: int, stream: int = 0, pool_id: tuple[int, int] = DEFAULT_POOL) -> bool:
        """Whether ``malloc`` would find no cached block and then hit the cap (no state change)."""
        size = self.round(nbytes)
        small = size <= SMALL_SIZE
        fl = self._free.get((pool_id, small, stream))
        if fl is not None and self._peek(fl, size) is not None:
            return False
        if self.cap_bytes is None:
            return False
        return self.reserved_bytes + allocation_size(size, self.config) > self.cap_bytes

    def has_free_block(self, nbytes: int, stream: int = 0, pool_id: tuple[int, int] = DEFAULT_POOL) -> bool:
        """Whether a cached block of ``pool_id`` and ``stream`` would serve ``nbytes``."""
        size = self.round(nbytes)
        fl = self._free.get((pool_id, size <= SMALL_SIZE, stream))
        return fl is not None and self._peek(fl, size) is not None

    def free_requested(self, block: Block) -> None:
        """The tensor died: its bytes leave ``allocated`` now; the block stays active until
        :meth:`free_completed` (at once, or when its ``record_stream`` events complete)."""
        if not block.allocated:
            raise ValueError(f"block at {block.addr:#x} is not allocated")
        block.allocated = False
        self.allocated_bytes -= block.size

    def free_completed(self, block: Block) -> None:
        """Return a freed block to its pool, merging it with free neighbours (§A.8)."""
        if self.events:
            self.events = []
        self.active_bytes -= block.size
        seg = block.seg
        self._merge_insert(self._free[(seg.pool_id, seg.small, seg.stream)], block)

    def _merge_insert(self, fl: _FreeList, block: Block) -> None:
        """free_block / try_merge_blocks of CUDACachingAllocator.cpp (RULES.md §A.8)."""
        # Absorb free mapped neighbours of the same segment (blocks waiting on events are not
        # in the free list, so they stay apart), then cache the result (§A.8 try_merge_blocks).
        prev, nxt = block.prev, block.next
        keys, blocks = fl.keys, fl.blocks          # fl.remove / fl.add inlined (the hot path)
        if prev is not None and not prev.allocated and prev.mapped and prev.addr in blocks:
            del keys[bisect_left(keys, (prev.size, prev.addr))]
            del blocks[prev.addr]
            block.addr, block.size = prev.addr, block.size + prev.size
            block.prev = prev.prev
            if prev.prev is not None:
                prev.prev.next = block
            else:
                block.seg.head = block
        if nxt is not None and not nxt.allocated and nxt.mapped and nxt.addr in blocks:
            del keys[bisect_left(keys, (nxt.size, nxt.addr))]
            del blocks[nxt.addr]
            block.size += nxt.size
            block.next = nxt.next
            if nxt.next is not None:
                nxt.next.prev = block
        block.gc_base = self._gc_calls
        insort(keys, (block.size, block.addr))
        blocks[block.addr] = block

    def empty_cache(self, pools: Iterable[tuple[int, int]] | None = None) -> None:
        """Release every whole free segment (whole free pages with expandable segments) of the
        pools in ``pools`` (ids; all pools when None). ``torch.cuda.empty_cache()`` releases the
        default pools and every private pool no graph or MemPool holds any more; deleting a
        MemPool releases that pool's (RULES.md §A.9, §D)."""
        self.events = []
        self._release_cached(None if pools is None else set(pools))

    def pool_ids(self) -> set[tuple[int, int]]:
        """Every pool id that owns segments now."""
        return {s.pool_id for s in self._segments.values()}

    def segments(self) -> list[dict[str, Any]]:
        """The layout as a snapshot shows it: one dict per segment or mapped run, by address,
        with address, total_size, stream, pool_id, pool ('small'/'large'), is_expandable
        and blocks (address, size, state, requested_size)."""
        out = []
        for seg in sorted(self._segments.values(), key=lambda s: s.addr):
            run: list[Block] = []
            b = seg.head
            while b is not None:
                if b.mapped:
                    run.append(b)
                elif run:
                    out.append(self._seg_dict(seg, run))
                    run = []
                b = b.next
            if run:
                out.append(self._seg_dict(seg, run))
        return out

    # ------------------------------------------------------------------ internals

    def _list(self, pool_id: tuple[int, int], small: bool, stream: int) -> _FreeList:
        key = (pool_id, small, stream)
        fl = self._free.get(key)
        if fl is None:
            fl = self._free[key] = _FreeList()
        return fl

    def _insert_free(self, fl: _FreeList, b: Block) -> None:
        b.gc_base = self._gc_calls
        fl.add(b)

    def _peek(self, fl: _FreeList, size: int) -> Block | None:
        """get_free_block: the cached block that serves ``size`` (None if none)."""
        i = self._peek_index(fl, size)
        return None if i < 0 else fl.blocks[fl.keys[i][1]]

    def _peek_index(self, fl: _FreeList, size: int) -> int:
        """get_free_block, as the block's index in ``fl.keys`` (-1 if none): malloc removes it
        by that index without searching again."""
        keys = fl.keys
        i = bisect_left(keys, (size, 0))
        if i == len(keys):
            return -1
        b = fl.blocks[keys[i][1]]
        if self._split_limit_none and not b.seg.expandable:
            return i
        if b.seg.expandable:
            if not self.config.expandable_segments:
                # Expandable blocks are skipped when the setting is off (RULES.md §A.13).
                while i < len(keys) and fl.blocks[keys[i][1]].seg.expandable:
                    i += 1
                if i == len(keys):
                    return -1
                b = fl.blocks[keys[i][1]]
            else:
                # Prefer a block whose "expandable size" is smaller, keeping the growing end free.
                def exp_size(x: Block) -> int:
                    n = x.next
                    return x.size + (n.size if n is not None and not n.mapped else 0)
                while i + 1 < len(keys):
                    nb = fl.blocks[keys[i + 1][1]]
                    if not (b.seg.expandable and exp_size(nb) < exp_size(b)):
                        break
                    i += 1
                    b = nb
        limit = self.config.max_split_size
        if limit is not None:
            if size < limit and b.size >= limit:
                return -1
            if size >= limit and b.size >= size + self.config.max_non_split_rounding:
                return -1
        return i

    def _alloc_path(self, nbytes: int, size: int, small: bool, stream: int, pool_id: tuple[int, int],
                    fl: _FreeList) -> Block:
        """malloc after get_free_block found nothing: garbage_collect_cached_blocks, alloc_block,
        release_available_cached_blocks, release_cached_blocks, then out of memory (RULES.md §A.5,
        §A.9, §A.10)."""
        cfg = self.config
        alloc = allocation_size(size, cfg)
        if self.cap_bytes is not None and cfg.garbage_collection_threshold > 0:
            self._garbage_collect()
        block = self._alloc_block(size, alloc, small, stream, pool_id)
        if block is None and self._release_available(fl, size):
            block = self._alloc_block(size, alloc, small, stream, pool_id)
        if block is None:
            self._release_cached(None)
            self.num_alloc_retries += 1
            block = self._alloc_block(size, alloc, small, stream, pool_id)
        if block is None:
            self.num_ooms += 1
            raise EngineOutOfMemory(nbytes, size, alloc, self.allocated_bytes, self.reserved_bytes)
        return block

    def is_free_range(self, addr: int, size: int) -> bool:
        """Whether [addr, addr + size) overlaps none of this engine's segments or ranges."""
        return all(addr + size <= s.addr or s.addr + s.size <= addr for s in self._segments.values())

    def _next_address(self, size: int) -> int:
        if self.address_hook is not None:
            addr = self.address_hook(size)
            if addr is not None:
                return addr
        if self._addresses:
            return self._addresses.popleft()
        addr = self._space.take(size)
        while self.address_hook is not None and not self.is_free_range(addr, size):
            addr = self._space.take(size)   # taken by a segment at a recorded address: skip it
        return addr

    def _alloc_block(self, size: int, alloc: int, small: bool, stream: int, pool_id: tuple[int, int]) -> Block | None:
        """alloc_block: a new segment (cudaMalloc) unless the cap forbids it (RULES.md §A.5, §A.11)."""
        if self.cap_bytes is not None and self.reserved_bytes + alloc > self.cap_bytes:
            return None
        if self.config.expandable_segments:
            return self._alloc_expandable(size, small, stream, pool_id)
        addr = self._next_address(alloc)
        seg = Segment(addr, alloc, stream, pool_id, small, False)
        seg.head = Block(addr, alloc, seg)
        self._segments[addr] = seg
        self.reserved_bytes += alloc
        self.events.append(("segment_alloc", addr, alloc))
        return seg.head

    def _release_segment(self, fl: _FreeList, b: Block) -> None:
        fl.remove(b)
        seg = b.seg
        del self._segments[seg.addr]
        self._space.give(seg.addr, seg.size)
        self.reserved_bytes -= b.size
        self.events.append(("segment_free", seg.addr, seg.size))

    def _release_cached(self, pools: set[tuple[int, int]] | None) -> None:
        """release_cached_blocks: every whole free segment (RULES.md §A.9)."""
        for (pid, small, stream), fl in sorted(self._free.items(), key=lambda kv: (kv[0][1], kv[0][0], kv[0][2])):
            if pools is not None and pid not in pools:
                continue
            for key in list(fl.keys):
                b = fl.blocks.get(key[1])
                if b is None or b.size != key[0]:
                    continue
                if b.seg.expandable:
                    self._unmap(fl, b)
                elif b.prev is None and b.next is None:
                    self._release_segment(fl, b)

    def _release_available(self, fl: _FreeList, size: int) -> bool:
        """release_available_cached_blocks (max_split_size_mb set; RULES.md §A.9)."""
        limit = self.config.max_split_size
        if limit is None:
            return False
        key = max(size, limit)
        whole = [fl.blocks[a] for s, a in fl.keys if not fl.blocks[a].seg.expandable]
        fitting = [b for b in whole if b.size >= key]
        if fitting:
            b = fitting[0]
            if b.prev is not None or b.next is not None:
                return False
            self._release_segment(fl, b)
            return True
        released = 0
        for b in reversed(whole):
            if released >= key or b.size < limit:
                break
            if b.prev is None and b.next is None:
                released += b.size
                self._release_segment(fl, b)
        return released >= key

    def _garbage_collect(self) -> None:
        """garbage_collect_cached_blocks (garbage_collection_threshold under a cap; RULES.md §A.9)."""
        cap = self.cap_bytes or 0
        threshold = int(self.config.garbage_collection_threshold * cap)
        if self.reserved_bytes <= threshold:
            return
        target = self.reserved_bytes - threshold
        lists = [fl for (pid, small, _), fl in self._free.items() if pid == DEFAULT_POOL and not small]
        cands = [(fl, fl.blocks[a]) for fl in lists for _, a in fl.keys]
        cands = [(fl, b) for fl, b in cands if b.prev is None and b.next is None and not b.seg.expandable]
        total_age = sum(self._gc_calls - b.gc_base for _, b in cands)
        count = len(cands)
        reclaimed, freed = 0, True
        while reclaimed < target and freed and count > 0:
            avg = total_age / count
            freed = False
            for fl, b in list(cands):
                age = self._gc_calls - b.gc_base
                if age >= avg:
                    freed = True
                    reclaimed += b.size
                    total_age -= age
                    count -= 1
                    cands.remove((fl, b))
                    self._release_segment(fl, b)

    # ------------------------------------------------------------------ expandable segments

    def _page(self, small: bool) -> int:
        return SMALL_BUFFER if small else self._large_page

    def range_size(self, small: bool) -> int:
        """Virtual range of one expandable segment: page × ceil((total + total/8) / page)."""
        page = self._page(small)
        total = self.total_memory
        return page * (-(-(total + total // 8) // page))

    def _alloc_expandable(self, size: int, small: bool, stream: int, pool_id: tuple[int, int]) -> Block | None:
        key = (pool_id, small, stream)
        fl = self._list(pool_id, small, stream)
        start = self._find_expandable(fl, size)
        if start is None:
            rsize = self.range_size(small)
            if size > rsize:
                return None
            addr = self._next_address(rsize)
            seg = Segment(addr, rsize, stream, pool_id, small, True)
            seg.head = Block(addr, rsize, seg, mapped=False)
            self._segments[addr] = seg
            self._ranges.setdefault(key, []).append(seg)
            fl.unmapped[addr] = seg.head
            start = seg.head
        c = start
        if not c.mapped:
            c = self._map(fl, c, min(c.size, size))
        while c.size < size:
            nxt = c.next
            c = self._map(fl, nxt, min(size - c.size, nxt.size))
        fl.remove(c)
        return c

    def _find_expandable(self, fl: _FreeList, size: int) -> Block | None:
        for addr in sorted(fl.unmapped):
            u = fl.unmapped[addr]
            start = u.prev if (u.prev is not None and not u.prev.allocated and u.prev.mapped) else u
            room, b = 0, start
            while room < size and b is not None and not b.allocated:
                room += b.size
                b = b.next
            if room >= size:
                return start
        return None

    def _map(self, fl: _FreeList, block: Block, nbytes: int) -> Block:
        page = self._page(block.seg.small)
        mapped = min(-(-nbytes // page) * page, block.size)
        del fl.unmapped[block.addr]
        block.mapped = True
        if mapped < block.size:
            rest = Block(block.addr + mapped, block.size - mapped, block.seg, block, block.next, mapped=False)
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = mapped
            fl.unmapped[rest.addr] = rest
        self.reserved_bytes += mapped
        self.events.append(("segment_map", block.addr, mapped))
        self._merge_insert(fl, block)
        return block

    def _unmap(self, fl: _FreeList, block: Block) -> None:
        page = self._page(block.seg.small)
        base = block.seg.addr
        begin = base + -(-(block.addr - base) // page) * page
        end = base + ((block.addr + block.size - base) // page) * page
        if end <= begin:
            return
        fl.remove(block)
        if begin > block.addr:
            before = Block(block.addr, begin - block.addr, block.seg, block.prev, block)
            if block.prev is not None:
                block.prev.next = before
            else:
                block.seg.head = before
            block.prev = before
            self._insert_free(fl, before)
        if end < block.addr + block.size:
            after = Block(end, block.addr + block.size - end, block.seg, block, block.next)
            if block.next is not None:
                block.next.prev = after
            block.next = after
            self._insert_free(fl, after)
        block.addr, block.size, block.mapped = begin, end - begin, False
        self.reserved_bytes -= block.size
        self.events.append(("segment_unmap", begin, end - begin))
        for nb in (block.prev, block.next):
            if nb is not None and not nb.mapped:
                del fl.unmapped[nb.addr]
                if nb is block.prev:
                    block.addr, block.prev = nb.addr, nb.prev
                    if nb.prev is not None:
                        nb.prev.next = block
                    else:
                        block.seg.head = block
                else:
                    block.next = nb.next
                    if nb.next is not None:
                        nb.next.prev = block
                block.size += nb.size
        fl.unmapped[block.addr] = block
        seg = block.seg
        if seg.head is block and block.next is None:       # nothing mapped: the range goes too
            del fl.unmapped[block.addr]
            del self._segments[seg.addr]
            self._ranges[(seg.pool_id, seg.small, seg.stream)].remove(seg)
            self._space.give(seg.addr, seg.size)

    @staticmethod
    def _seg_dict(seg: Segment, blocks: list[Block]) -> dict[str, Any]:
        return {
            "address": blocks[0].addr, "total_size": sum(b.size for b in blocks), "stream": seg.stream,
            "pool_id": list(seg.pool_id), "pool": "small" if seg.small else "large", "is_expandable": seg.expandable,
            "blocks": [{"address": b.addr, "size": b.size,
                        "state": "active_allocated" if b.allocated else "inactive",
                        "requested_size": b.requested} for b in blocks],
        }


__all__ = ["Block", "Engine", "EngineOutOfMemory", "H200_TOTAL_MEMORY", "DEFAULT_POOL", "LARGE_BUFFER"]
