"""The caching allocator of one device with streams, private pools, a cap and expandable segments.

This is the engine of the allocator doctor (:mod:`experiments.doctor`), the one model of the
allocator that the replay, the what-ifs and chapter 1 call. It mirrors the class
``DeviceCachingAllocator`` of ``c10/cuda/CUDACachingAllocator.cpp`` (torch 2.11): each rule
is one method named after the C++ function it follows (``malloc``, ``get_free_block``,
``alloc_block``, ``alloc_found_block``, ``free_block``, ``try_merge_blocks``,
``insert_events`` / ``synchronize_and_free_events``, ``garbage_collect_cached_blocks``,
``release_available_cached_blocks``, ``release_cached_blocks`` / ``release_blocks`` /
``release_block``, and for expandable segments ``find_expandable_block``,
``try_allocate_expandable_block``, ``map_block``, ``unmap_block``), written down in the rules
file RULES.md (sections §A-§D cited below). The size rules (``round_size``,
``get_allocation_size``, ``get_pool``, ``should_split``, the expandable page and range) are
pure functions of :mod:`experiments.doctor.model.rules`; the engine calls them and has no copy.

* a block belongs to the stream it was allocated on; free blocks are kept per (pool, stream)
  in lists sorted by (size, address), so best fit is one ``bisect`` (§A.6, §B.1);
* a free is two steps, ``free_requested`` (allocated bytes drop; with ``record_stream``
  uses the block waits on events, ``insert_events``) and ``free_completed`` (the events are
  done: ``free_block`` returns it to its pool, merged), §A.8, §B;
* private pools (``torch.cuda.MemPool``, CUDA-graph pools) have their own segments and are
  used only by the requests routed to them; they give memory back only once freeable (no
  graph or MemPool holds them), §D;
* a memory cap (``set_per_process_memory_fraction``) makes ``alloc_block`` fail, after which
  the out-of-memory path runs (§A.5, §A.9, §A.10);
* with expandable segments each (pool, stream) maps pages into a virtual range (§C).

Segment addresses are the driver's choice: give the engine the addresses a trace recorded
(``addresses`` or ``address_hook``) to reproduce a run block for block; otherwise a top-down
first-fit address space stands in for the driver, and :attr:`Engine.address_ties` counts the
decisions that then depended on an address the driver did not give. Sizes are in bytes.

Its state is its own: the replay reaches it through a few public seams only
(:meth:`Engine.seed_segment`, a segment that existed before a recording began;
:meth:`Engine.malloc_releases`, whether malloc's slow path would release cached memory for a
request; :meth:`Engine.can_serve`, whether a pool's cached blocks could serve one;
:meth:`Engine.release_cached_events`, what an ``empty_cache`` would release), so that each
rule of the allocator is written once, here.
"""
from __future__ import annotations

import gc
from bisect import bisect_left, insort
from collections import deque
from typing import Any, Callable, Iterable

from ...core.units import format_bytes
from .rules import (DEFAULT, DEFAULT_POOL, H200_TOTAL_MEMORY, MIN_BLOCK_SIZE, SMALL_BUFFER, SMALL_SIZE,
                    AllocatorConfig, expandable_range_size, expandable_segment_size, get_allocation_size,
                    round_size, should_split)

_NO_LIMIT = 1 << 62
_ADDR = (1 << 64) - 1                 # a free list's key holds the block's address in its low bits
# Best fit's order between equal-size free blocks, by torch release (RULES.md §G; read from the
# releases' libc10_cuda.so: BlockComparatorSize, BlockComparatorRegistrationCounter,
# BlockComparatorSizeCounterAddress). 2.14 orders as 2.13.
RULES = ("2.11", "2.12", "2.13")


class EngineOutOfMemory(RuntimeError):
    """The request could not be served: every step of the OOM path failed (§A.10)."""

    def __init__(self, nbytes: int, rounded: int, alloc: int, allocated: int, reserved: int):
        self.figures = {"request_bytes": nbytes, "rounded_bytes": rounded, "alloc_size_bytes": alloc,
                        "allocated_bytes": allocated, "reserved_bytes": reserved}
        super().__init__(f"out of memory: tried to allocate {format_bytes(alloc)} with {format_bytes(allocated)} "
                         f"allocated and {format_bytes(reserved)} reserved")


class Block:
    """A contiguous range of one segment; ``allocated`` or free, ``mapped`` unless expandable."""

    __slots__ = ("addr", "size", "requested", "seg", "prev", "next", "allocated", "mapped", "gc_base", "pending",
                 "tie")

    def __init__(self, addr: int, size: int, seg: "Segment", prev: "Block | None" = None,
                 next: "Block | None" = None, mapped: bool = True, tie: int = 0):
        self.addr, self.size, self.seg = addr, size, seg
        self.tie = tie            # torch 2.12: the counter this Block object took when made
        self.prev, self.next = prev, next
        self.requested = 0
        self.allocated = False
        self.mapped = mapped
        self.gc_base = 0
        self.pending = False      # freed, its record_stream events not done yet


class Segment:
    """One cudaMalloc result, or one expandable virtual range, of one (pool, stream).
    ``synthetic``: its address is the engine's choice, not the driver's. ``fl``: the free list
    of its (pool, small/large, stream), which a free returns its blocks to."""

    __slots__ = ("addr", "size", "stream", "pool_id", "small", "expandable", "head", "synthetic", "counter", "fl")

    def __init__(self, addr: int, size: int, stream: int, pool_id: tuple[int, int], small: bool, expandable: bool,
                 counter: int = 0, fl: "_FreeList | None" = None):
        self.addr, self.size, self.stream, self.pool_id = addr, size, stream, pool_id
        self.small, self.expandable = small, expandable
        self.head: Block | None = None
        self.synthetic = False
        self.counter = counter    # torch 2.13+: the counter the segment took when cudaMalloc'd
        self.fl = fl


class _FreeList:
    """Free blocks of one (pool id, small/large, stream), sorted by (size, order key): C++'s
    ``BlockPool::blocks`` restricted to one stream (its comparator orders by stream first). The
    order key is the address up to torch 2.11; the block's counter (2.12) or its segment's
    counter (2.13+) above the address otherwise. A block's place is one int (``key``, see
    _key_address): ints compare, bisect and sort in fewer steps than (size, order) tuples, on
    the hot path of every replay and what-if."""

    __slots__ = ("keys", "blocks", "unmapped", "key")

    def __init__(self, key: Callable[[Block], int]) -> None:
        self.keys: list[int] = []
        self.blocks: dict[int, Block] = {}
        self.unmapped: dict[int, Block] = {}   # expandable: unmapped blocks by address
        self.key = key

    def add(self, b: Block) -> None:
        insort(self.keys, self.key(b))
        self.blocks[b.addr] = b

    def remove(self, b: Block) -> None:
        keys = self.keys
        k = self.key(b)
        i = bisect_left(keys, k)
        if i == len(keys) or keys[i] != k:
            raise AssertionError(f"block at {b.addr:#x} ({b.size} B) is not in its free list")
        del keys[i]
        del self.blocks[b.addr]


# A free block's key, by torch release: its size above its order key, which takes the low 64
# bits (the address, up to 2.11) or 128 (a counter above the address); the engine's ``_shift``.
def _key_address(b: Block) -> int:
    return b.size << 64 | b.addr


def _key_block(b: Block) -> int:
    return (b.size << 64 | b.tie) << 64 | b.addr


def _key_segment(b: Block) -> int:
    return (b.size << 64 | b.seg.counter) << 64 | b.addr


def _expandable_size(b: Block) -> int:
    # get_free_block's measure of an expandable block: its size and the unmapped block after it
    n = b.next
    return b.size + (n.size if n is not None and not n.mapped else 0)


class _AddressSpace:
    """First fit over [2^48, 2^60), top down (as the driver mostly hands out addresses, RULES.md
    §I.3) or bottom up: where a run without the driver's addresses puts segments."""

    def __init__(self, top_down: bool = True) -> None:
        # above every user-space address a driver hands out, so it never meets a recorded one
        self.free = [(1 << 48, 1 << 60)]  # (start, end), sorted by start; room for thousands of ranges
        self.top_down = top_down
        self.taken: set[int] = set()      # what it handed out: only those come back to it

    def take(self, size: int) -> int:
        size = -(-size // SMALL_BUFFER) * SMALL_BUFFER
        order = range(len(self.free) - 1, -1, -1) if self.top_down else range(len(self.free))
        for i in order:
            start, end = self.free[i]
            if end - start >= size:
                if end - start == size:
                    del self.free[i]
                elif self.top_down:
                    self.free[i] = (start, end - size)
                else:
                    self.free[i] = (start + size, end)
                addr = end - size if self.top_down else start
                self.taken.add(addr)
                return addr
        raise RuntimeError("the modelled address space is exhausted")

    def give(self, addr: int, size: int) -> None:
        if addr not in self.taken:
            return                      # a driver's address: never ours to hand out
        self.taken.discard(addr)
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
    """The caching allocator of one device (C++ ``DeviceCachingAllocator``).

    Args:
        config: allocator settings (:class:`experiments.doctor.model.rules.AllocatorConfig`).
        cap_bytes: memory cap in bytes (``fraction × total memory``), or None.
        total_memory: the device's memory in bytes; sets the expandable range size
            (default: the lab H200's 150,109,880,320 B).
        addresses: segment base addresses to use in order (a trace's segment_alloc
            addresses, or for expandable segments the bases of new ranges); when they run
            out the engine picks its own.
        address_order: 'down' (top-down first fit, the default) or 'up' for the addresses
            the engine picks itself.
        rule: the torch release whose best-fit order between equal-size free blocks to follow
            (:data:`RULES`): '2.11' (and before) by address; '2.12' by the counter each new
            Block object takes (a split's allocated front is the new object, a merge keeps the
            freed block's); '2.13' (and 2.14) by the counter each segment takes when made, then
            by address. The 2.12 and 2.13 orders are read from those releases' code, not yet
            checked on a GPU.

    Attributes:
        allocated_bytes, reserved_bytes, active_bytes: the ``memory_stats`` counters.
        num_alloc_retries, num_ooms, num_sync_all_streams: counters of the OOM path.
        events: the segment events of the last operation, as (action, addr, size) with action
            in segment_alloc, segment_free, segment_map, segment_unmap.
        freeable: private pool ids that no graph or MemPool holds any more (C++
            ``graph_pools_freeable``): ``release_cached_blocks`` gives their memory back.
        address_ties: best-fit decisions between equal-size blocks of different segments
            where one segment's address was the engine's choice (the driver's could have
            ordered them the other way).
    """

    def __init__(self, config: AllocatorConfig = DEFAULT, *, cap_bytes: int | None = None,
                 total_memory: int = H200_TOTAL_MEMORY, addresses: Iterable[int] = (), address_order: str = "down",
                 rule: str = "2.11"):
        if cap_bytes is not None and (isinstance(cap_bytes, bool) or not isinstance(cap_bytes, int) or cap_bytes < 0):
            raise ValueError(f"cap_bytes must be a whole number of bytes >= 0 or None, got {cap_bytes!r}")
        if isinstance(total_memory, bool) or not isinstance(total_memory, int) or total_memory <= 0:
            raise ValueError(f"total_memory must be a positive number of bytes, got {total_memory!r}")
        if address_order not in ("down", "up"):
            raise ValueError(f"address_order must be 'down' or 'up', got {address_order!r}")
        if rule not in RULES:
            raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
        self.rule = rule
        self._per_block = rule == "2.12"
        self._counter = 0          # registration_counter_global: the counters handed out so far
        self._key: Callable[[Block], int] = (_key_address if rule == "2.11" else
                                              _key_block if rule == "2.12" else _key_segment)
        self._shift = 64 if rule == "2.11" else 128     # where a free block's key holds its size
        self.config = config
        self.cap_bytes = cap_bytes
        self.total_memory = total_memory
        self.allocated_bytes = 0
        self.reserved_bytes = 0
        self.active_bytes = 0
        self.num_alloc_retries = 0
        self.num_ooms = 0
        self.num_sync_all_streams = 0
        self.num_oom_rejections = 0
        self.address_ties = 0
        self.rule_ties = 0         # best-fit or release choices between equal-size free blocks
        self.events: list[tuple[str, int, int]] = []
        self.freeable: set[tuple[int, int]] = set()
        self._free: dict[tuple[tuple[int, int], bool, int], _FreeList] = {}
        self._segments: dict[int, Segment] = {}         # by base address
        self._ranges: dict[tuple[tuple[int, int], bool, int], list[Segment]] = {}
        self.pending_count = 0                          # blocks freed, waiting on record_stream events
        self._addresses = deque(addresses)
        self._space = _AddressSpace(address_order == "down")
        self._gc_calls = 0                              # get_free_block calls on the default large pool
        self._round: dict[int, int] = {}
        # get_free_block counts its calls (the age of cached blocks) only for the GC (§A.9)
        self._gc_counting = cap_bytes is not None and config.garbage_collection_threshold > 0
        self._split_limit = config.max_split_size if config.max_split_size is not None else _NO_LIMIT
        self._plain = config.max_split_size is None and not config.expandable_segments
        self._expandable = config.expandable_segments
        self._synthetic = False          # the address just handed out is the engine's choice
        self._synthetic_made = False     # one was, some time: best-fit ties may depend on it
        # Called with the size of each new segment or range for its base; None lets the engine choose.
        self.address_hook: Callable[[int], int | None] | None = None

    # ------------------------------------------------------------------ public operations

    def round(self, nbytes: int) -> int:
        """:func:`~experiments.doctor.model.rules.round_size` under this engine's settings (cached:
        traces repeat sizes)."""
        r = self._round.get(nbytes)
        if r is None:
            r = self._round[nbytes] = round_size(nbytes, self.config)
        return r

    def malloc(self, nbytes: int, stream: int = 0, pool_id: tuple[int, int] = DEFAULT_POOL) -> Block:
        """Serve ``nbytes`` on ``stream`` from pool ``pool_id``; return the block.

        C++ ``DeviceCachingAllocator::malloc`` (RULES.md §A.5): round, pick the pool, best fit
        (``get_free_block``); else garbage collection, a new segment (``alloc_block``), the
        release of oversize cached blocks and of every cached block with a retry; then the
        split (``should_split``, ``alloc_found_block``). ``process_events`` is the caller's:
        a trace says when each record_stream free completed (``free_completed``).

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
        if self._gc_counting and not small and pool_id == DEFAULT_POOL:
            self._gc_calls += 1
        i = self._free_index(fl, size)              # get_free_block
        if i < 0:
            block = self._malloc_slow(nbytes, size, small, stream, pool_id, fl)
        else:
            keys = fl.keys                           # fl.remove(block), by the index found
            block = fl.blocks.pop(keys[i] & _ADDR)
            del keys[i]
        return self.alloc_found_block(block, size, nbytes, fl, "small" if small else "large")

    def malloc_releases(self, nbytes: int, stream: int = 0, pool_id: tuple[int, int] = DEFAULT_POOL) -> bool:
        """Whether :meth:`malloc` of ``nbytes`` would release cached memory before it is served
        (the garbage collector before a new segment, or the out-of-memory path after the cap
        refused one) rather than take a cached block or a new segment; no change.

        The replay asks this to tell malloc's own releases from an ``empty_cache`` that the
        trace does not record (RULES.md §A.5, §A.9): a request a cached block serves releases
        nothing; without a cap nothing is refused; with ``garbage_collection_threshold``, a
        large request of the default pool releases what the collector would (counted as
        malloc counts its ``get_free_block`` call first); else the cap refuses a new segment
        of ``get_allocation_size`` bytes when reserved bytes plus that exceed it.
        """
        size = self.round(nbytes)
        small = size <= SMALL_SIZE
        fl = self._free.get((pool_id, small, stream))
        if fl is not None and self.get_free_block(fl, size) is not None:
            return False
        if self.cap_bytes is None:
            return False
        if self._gc_counting and pool_id == DEFAULT_POOL and not small:
            self._gc_calls += 1             # malloc counts its get_free_block call before collecting
            try:
                if self.garbage_collect_plan():
                    return True
            finally:
                self._gc_calls -= 1
        return self._cap_refuses(get_allocation_size(size, self.config))

    def can_serve(self, nbytes: int, stream: int, pool_id: tuple[int, int], *, maps: bool = False) -> bool:
        """Whether pool ``pool_id``'s cached blocks on ``stream`` could serve ``nbytes`` (best fit,
        :meth:`get_free_block`), or, for a request that mapped pages (``maps``: its trace shows
        a ``segment_map``), whether the pool has an expandable range on that stream to map them
        in; no change. A request routed to a pool that could have served it would have been."""
        size = self.round(nbytes)
        small = size <= SMALL_SIZE
        fl = self._free.get((pool_id, small, stream))
        if fl is not None and self.get_free_block(fl, size) is not None:
            return True
        return maps and bool(self._ranges.get((pool_id, small, stream)))

    def seed_segment(self, addr: int, size: int, stream: int, pool_id: tuple[int, int], small: bool,
                     blocks: list[tuple[int, int, int]], *, expandable: bool = False,
                     mapped: list[tuple[int, int]] | None = None) -> dict[int, Block]:
        """Put in place a segment that existed before a trace began (a late-started recording),
        with its live blocks; counted in reserved, allocated and active bytes.

        Args:
            blocks: live blocks as (address, size, requested_size) inside the segment; the
                gaps become free blocks (cached, in the free lists).
            mapped: for an expandable range, the mapped runs as (address, size); the rest of
                the range stays unmapped.

        Returns:
            {address: block} of the live blocks.
        """
        # its age among segments (and, torch 2.12, its blocks' among blocks) from before the
        # recording is not known: they are numbered in the order they are seeded
        self._counter += 1
        fl = self._list(pool_id, small, stream)
        seg = Segment(addr, size, stream, pool_id, small, expandable, self._counter, fl)
        self._segments[addr] = seg
        if expandable:
            self._ranges.setdefault((pool_id, small, stream), []).append(seg)
        pieces: list[tuple[int, int, str, int]] = []
        runs = sorted(mapped or [(addr, size)])
        live = sorted(blocks)
        pos = addr
        for ra, rs in runs:
            if ra > pos:
                pieces.append((pos, ra - pos, "unmapped", 0))
            p = ra
            for ba, bs, req in live:
                if ra <= ba < ra + rs:
                    if ba > p:
                        pieces.append((p, ba - p, "free", 0))
                    pieces.append((ba, bs, "live", req))
                    p = ba + bs
            if p < ra + rs:
                pieces.append((p, ra + rs - p, "free", 0))
            pos = ra + rs
            self.reserved_bytes += rs
        if pos < addr + size:
            pieces.append((pos, addr + size - pos, "unmapped", 0))
        out, prev = {}, None
        for pa, ps, kind, req in pieces:
            b = Block(pa, ps, seg, prev, None, mapped=kind != "unmapped", tie=seg.counter)
            if self._per_block:
                self._counter += 1
                b.tie = self._counter
            if prev is None:
                seg.head = b
            else:
                prev.next = b
            prev = b
            if kind == "live":
                b.allocated, b.requested = True, req
                self.allocated_bytes += ps
                self.active_bytes += ps
                out[pa] = b
            elif kind == "free":
                self._insert_free(fl, b)
            else:
                fl.unmapped[pa] = b
        return out

    def free_requested(self, block: Block) -> None:
        """The tensor died (C++ ``free``, RULES.md §A.8): its bytes leave ``allocated`` now. The
        block stays active and out of its pool until :meth:`free_completed`: at once when it
        was used on no other stream, else when its ``record_stream`` events complete
        (``insert_events``)."""
        if not block.allocated:
            raise ValueError(f"block at {block.addr:#x} is not allocated")
        block.allocated = False
        block.pending = True
        self.pending_count += 1
        self.allocated_bytes -= block.size

    @staticmethod
    def is_pending(block: Block) -> bool:
        """Whether ``block`` was freed and still waits for :meth:`free_completed`."""
        return block.pending

    def pending_blocks(self) -> list[Block]:
        """The blocks freed and still waiting for :meth:`free_completed`, by address."""
        out = []
        for seg in sorted(self._segments.values(), key=lambda s: s.addr):
            b = seg.head
            while b is not None:
                if b.pending:
                    out.append(b)
                b = b.next
        return out


    def empty_cache(self, pool_id: tuple[int, int] = DEFAULT_POOL) -> None:
        """``torch.cuda.empty_cache()`` (C++ ``emptyCache``), or with a private ``pool_id`` the
        release a deleted MemPool makes of its own pool: :meth:`release_cached_blocks`."""
        self.events = []
        self.release_cached_blocks(pool_id)

    def segment_bases(self) -> set[int]:
        """The base address of every segment and expandable range the engine holds now."""
        return set(self._segments)

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

    def is_free_range(self, addr: int, size: int) -> bool:
        """Whether [addr, addr + size) overlaps none of this engine's segments or ranges."""
        return all(addr + size <= s.addr or s.addr + s.size <= addr for s in self._segments.values())

    def range_size(self, small: bool) -> int:
        """Virtual range of one expandable segment (:func:`~experiments.doctor.model.rules.expandable_range_size`)."""
        return expandable_range_size(small, self.total_memory, self.config)

    # ------------------------------------------------------------------ malloc's steps

    def get_free_block(self, fl: _FreeList, size: int) -> Block | None:
        """The cached block best fitting ``size`` in one (pool, stream), or None (no change).

        C++ ``get_free_block`` (RULES.md §A.6, §C.2): the smallest free block of the stream that
        is large enough, ties to the lowest address; with expandable segments, a larger one
        whose "expandable size" (its size plus the unmapped block after it) is smaller is
        preferred; expandable blocks are skipped while the setting is off (§A.13). Oversize
        rules with ``max_split_size``: a request below it never takes a block at or above it;
        a request at or above it takes a block only under ``request + max_non_split_rounding``
        (a fixed 20 MiB before torch 2.6, §A.6). Only the first candidate is looked at.
        """
        i = self._free_index(fl, size)
        return None if i < 0 else fl.blocks[fl.keys[i] & _ADDR]

    def _free_index(self, fl: _FreeList, size: int) -> int:
        # get_free_block, as the block's index in fl.keys (-1 if none): malloc removes the block
        # by that index without searching for it again (the hot path of every replay)
        keys = fl.keys
        n = len(keys)
        shift = self._shift
        i = bisect_left(keys, size << shift)
        if i == n:
            return -1
        b = fl.blocks[keys[i] & _ADDR]
        if self._plain and not b.seg.expandable:
            if i + 1 < n and keys[i + 1] >> shift == b.size:
                self.rule_ties += 1
                if self._synthetic_made:
                    self._tie(fl, i, b)
            return i
        if b.seg.expandable:
            if not self._expandable:
                while i < n and fl.blocks[keys[i] & _ADDR].seg.expandable:
                    i += 1
                if i == n:
                    return -1
                b = fl.blocks[keys[i] & _ADDR]
            else:
                size_b = _expandable_size(b)
                while i + 1 < n and b.seg.expandable:
                    nb = fl.blocks[keys[i + 1] & _ADDR]
                    size_nb = _expandable_size(nb)
                    if size_nb >= size_b:
                        break
                    i += 1
                    b, size_b = nb, size_nb
        limit = self.config.max_split_size
        if limit is not None:
            if size < limit and b.size >= limit:
                return -1
            if size >= limit and b.size >= size + self.config.max_non_split_rounding:
                return -1
        if i + 1 < n and keys[i + 1] >> shift == b.size:
            self.rule_ties += 1
            if self._synthetic_made:
                self._tie(fl, i, b)
        return i

    def _tie(self, fl: _FreeList, i: int, b: Block) -> Block:
        # Equal sizes go by address: count the choice if the driver might have ordered the
        # segments the other way (one of them has an address of the engine's).
        keys, shift = fl.keys, self._shift
        j = i + 1
        while j < len(keys) and keys[j] >> shift == b.size:
            nb = fl.blocks[keys[j] & _ADDR]
            if nb.seg is not b.seg and (nb.seg.synthetic or b.seg.synthetic):
                self.address_ties += 1
                break
            j += 1
        return b

    def _malloc_slow(self, nbytes: int, size: int, small: bool, stream: int, pool_id: tuple[int, int],
                     fl: _FreeList) -> Block:
        # malloc when no cached block fits: §A.5 step 4 (try_mempool_fallback serves only
        # MemPools made with use_on_oom, which the doctor does not model).
        alloc = get_allocation_size(size, self.config)
        if self._gc_counting:
            self.garbage_collect_cached_blocks()
        block = self.alloc_block(size, alloc, small, stream, pool_id)
        if block is None and self.config.throw_on_cudamalloc_oom and self.cap_bytes is not None:
            # torch 2.12+: the cap refused the segment: an out-of-memory error at once, no
            # release of cached blocks, no retry (the 2.12 wheel's malloc; not yet on a GPU)
            self.num_ooms += 1
            self.num_oom_rejections += 1
            raise EngineOutOfMemory(nbytes, size, alloc, self.allocated_bytes, self.reserved_bytes)
        if block is None and self.release_available_cached_blocks(fl, size):
            block = self.alloc_block(size, alloc, small, stream, pool_id)
        if block is None and pool_id == DEFAULT_POOL:
            # the last step runs only while no capture is underway: a request routed to a
            # private pool (a CUDA-graph capture, or torch.cuda.use_mem_pool, which pushes its
            # pool on the same list) skips it (C++ malloc: captures_underway.empty(); RULES.md §D.2)
            self.release_cached_blocks(DEFAULT_POOL)
            self.num_alloc_retries += 1
            block = self.alloc_block(size, alloc, small, stream, pool_id)
        if block is None:
            self.num_ooms += 1
            raise EngineOutOfMemory(nbytes, size, alloc, self.allocated_bytes, self.reserved_bytes)
        return block

    def alloc_found_block(self, block: Block, size: int, nbytes: int, fl: _FreeList, pool: str) -> Block:
        """Hand ``block`` out for a request of ``nbytes`` (rounded ``size``), splitting off the
        remainder when :func:`~experiments.doctor.model.rules.should_split` says so (``pool``: 'small'
        or 'large', the half of the pool the block is in): the allocation takes the low end, the
        remainder stays free in the same pool (C++ ``alloc_found_block``, RULES.md §A.7)."""
        remaining = block.size - size
        # (no rule splits off less than 512 B: an exact fit skips the call)
        if remaining >= MIN_BLOCK_SIZE and should_split(block.size, size, pool, self.config):
            rest = Block(block.addr + size, remaining, block.seg, block, block.next, True, block.tie)
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            rest.gc_base = self._gc_calls
            if self._per_block:
                # C++ makes the allocated front the new Block object (a new counter); the free
                # remainder is the old object (our objects are the other way round)
                self._counter += 1
                block.tie = self._counter
            insort(fl.keys, self._key(rest))         # fl.add(rest), inlined
            fl.blocks[rest.addr] = rest
        block.allocated = True
        block.requested = nbytes
        self.allocated_bytes += block.size
        self.active_bytes += block.size
        return block

    def checkpointed_block(self, addr: int, nbytes: int, stream: int, pool_id: tuple[int, int]) -> Block | None:
        """The free block at ``addr`` of a private pool, if a pool checkpoint could put a block of
        ``nbytes`` there and best fit would not (no change)."""
        size = self.round(nbytes)
        if pool_id == DEFAULT_POOL or size != nbytes:
            return None
        fl, b = self._block_at(addr, size, stream, pool_id)
        if b is None or (b.seg.small == (size <= SMALL_SIZE) and self.get_free_block(fl, size) is b):
            return None
        return b

    def _block_at(self, addr: int, size: int, stream: int, pool_id: tuple[int, int]) -> tuple[Any, Block | None]:
        # a checkpoint restores blocks in the pool half of their segment: a whole 2 MiB block of
        # a small-pool segment is "large" by size
        for small in (size <= SMALL_SIZE, size > SMALL_SIZE):
            fl = self._free.get((pool_id, small, stream))
            b = fl.blocks.get(addr) if fl is not None else None
            if b is not None and b.size >= size:
                return fl, b
        return None, None

    def alloc_checkpointed_block(self, addr: int, nbytes: int, stream: int, pool_id: tuple[int, int]) -> Block:
        """Allocate the block a private pool's checkpoint holds at ``addr`` (CUDA-graph trees of
        ``torch.compile(mode="reduce-overhead")`` restore a pool before recording a new graph):
        the free block there is taken whatever best fit says and split when larger (C++
        ``setSegmentStateToCheckpoint``, which calls ``alloc_found_block`` with ``split = block
        size > checkpointed size``; RULES.md §D.2, §A.14).

        Raises:
            ValueError: no free block of that pool and stream starts at ``addr`` with room.
        """
        if self.events:
            self.events = []
        size = self.round(nbytes)
        fl, b = self._block_at(addr, size, stream, pool_id)
        if b is None:
            raise ValueError(f"no free block of pool {pool_id} on stream {stream} at {addr:#x} for {size} bytes")
        fl.remove(b)
        if b.size > size:
            rest = Block(b.addr + size, b.size - size, b.seg, b, b.next, tie=b.tie)
            if b.next is not None:
                b.next.prev = rest
            b.next = rest
            b.size = size
            rest.gc_base = self._gc_calls
            if self._per_block:
                self._counter += 1
                b.tie = self._counter
            fl.add(rest)
        b.allocated = True
        b.requested = nbytes
        self.allocated_bytes += b.size
        self.active_bytes += b.size
        return b

    def alloc_block(self, size: int, alloc: int, small: bool, stream: int, pool_id: tuple[int, int]) -> Block | None:
        """A new segment of ``alloc`` bytes (``cudaMalloc``), or with expandable segments pages
        mapped for ``size`` (``try_allocate_expandable_block``); None when the cap refuses it.

        C++ ``alloc_block`` (RULES.md §A.5, §A.11): the cap check compares reserved bytes plus
        ``get_allocation_size`` with the cap, also for expandable segments (whose mapping
        ignores that size, §C.2). The block is returned out of the free lists."""
        if self._cap_refuses(alloc):
            return None
        if self._expandable:
            return self.try_allocate_expandable_block(size, small, stream, pool_id)
        addr = self._next_address(alloc)
        self._counter += 1
        seg = Segment(addr, alloc, stream, pool_id, small, False, self._counter, self._list(pool_id, small, stream))
        seg.synthetic = self._synthetic
        seg.head = Block(addr, alloc, seg, tie=self._counter)
        self._segments[addr] = seg
        self.reserved_bytes += alloc
        self.events.append(("segment_alloc", addr, alloc))
        return seg.head

    # ------------------------------------------------------------------ free

    def free_block(self, block: Block) -> None:
        """Return a freed block whose events are done to its pool, merged with its free
        neighbours (C++ ``free_block``, RULES.md §A.8); its age for the garbage collector starts
        now (``insert_into_blocks``). :meth:`free_completed` is this, for a trace's
        free_completed entry (after ``process_events`` or a sync)."""
        if self.events:
            self.events = []
        if not block.pending:
            raise ValueError(f"block at {block.addr:#x} was not freed, or its free completed already")
        block.pending = False
        self.pending_count -= 1
        self.active_bytes -= block.size
        self.try_merge_blocks(block.seg.fl, block)

    free_completed = free_block

    def try_merge_blocks(self, fl: _FreeList, block: Block) -> None:
        """Absorb the free neighbours of ``block`` (same segment, both mapped or both not, not
        waiting on events: those are out of the free list) and cache the result (C++
        ``try_merge_blocks`` on prev and next, then ``insert_into_blocks``)."""
        prev, nxt = block.prev, block.next
        keys, blocks = fl.keys, fl.blocks          # fl.remove / fl.add inlined (the hot path)
        key = self._key
        if prev is not None and not prev.allocated and prev.mapped and prev.addr in blocks:
            del keys[bisect_left(keys, key(prev))]
            del blocks[prev.addr]
            block.addr, block.size = prev.addr, block.size + prev.size
            block.prev = prev.prev
            if prev.prev is not None:
                prev.prev.next = block
            else:
                block.seg.head = block
        if nxt is not None and not nxt.allocated and nxt.mapped and nxt.addr in blocks:
            del keys[bisect_left(keys, key(nxt))]
            del blocks[nxt.addr]
            block.size += nxt.size
            block.next = nxt.next
            if nxt.next is not None:
                nxt.next.prev = block
        block.gc_base = self._gc_calls
        insort(keys, key(block))
        blocks[block.addr] = block

    def synchronize_and_free_events(self, pool_id: tuple[int, int] | None = None) -> None:
        """Wait for every outstanding ``record_stream`` event (of one private pool's blocks, when
        given) and free those blocks (C++ ``synchronize_and_free_events``, RULES.md §B.1): in
        ``empty_cache`` and before the out-of-memory retry."""
        self.num_sync_all_streams += 1
        if self.pending_count:
            for block in self.pending_blocks():
                if pool_id is None or block.seg.pool_id == pool_id:
                    self.free_block(block)

    # ------------------------------------------------------------------ giving memory back

    def garbage_collect_plan(self) -> list[Block]:
        """The cached blocks :meth:`garbage_collect_cached_blocks` would release now, in order
        (no change; the replay uses it to tell the collector's releases from an empty_cache)."""
        cap = self.cap_bytes
        if cap is None or not self.config.garbage_collection_threshold:
            return []
        threshold = int(self.config.garbage_collection_threshold * cap)
        if self.reserved_bytes <= threshold:
            return []
        target = self.reserved_bytes - threshold
        # C++ iterates large_blocks.blocks, ordered by (stream, size, the release's order key)
        key = self._key
        cands = sorted((b for (pid, small, _), fl in self._free.items() if pid == DEFAULT_POOL and not small
                        for b in fl.blocks.values() if b.prev is None and b.next is None),
                       key=lambda b: (b.seg.stream, key(b)))
        calls = self._gc_calls
        total_age = sum(calls - b.gc_base for b in cands)
        count = len(cands)
        out: list[Block] = []
        reclaimed, freed = 0, True
        while reclaimed < target and freed and count > 0:
            avg = total_age / count
            freed = False
            for b in cands:
                age = calls - b.gc_base
                if not b.seg.expandable and age >= avg:
                    freed = True
                    reclaimed += b.size
                    total_age -= age
                    count -= 1
                    out.append(b)
            cands = [b for b in cands if b not in out]
        return out

    def garbage_collect_cached_blocks(self) -> None:
        """With a cap and ``garbage_collection_threshold``, before a new segment: while reserved
        bytes are above threshold × cap, release whole cached blocks of the default large pool
        whose age (``get_free_block`` calls on that pool since the block was cached) is at
        least the average, round after round (C++ ``garbage_collect_cached_blocks``, RULES.md
        §A.9, §A.14). Counting calls against a base stored at insertion is the form of recent
        releases; older ones incremented every cached block's count on each call (the same
        ages)."""
        for b in self.garbage_collect_plan():
            self.release_block(b.seg.fl, b)

    def release_available_plan(self, fl: _FreeList, size: int) -> tuple[list[Block], bool]:
        """(blocks :meth:`release_available_cached_blocks` would release, whether it succeeds);
        no change."""
        limit = self.config.max_split_size
        if limit is None:
            return [], False
        key = max(size, limit)
        keys, shift = fl.keys, self._shift
        i = bisect_left(keys, key << shift)
        if (i + 1 < len(keys) and keys[i] >> shift == keys[i + 1] >> shift
                or i >= 2 and keys[i - 1] >> shift == keys[i - 2] >> shift):
            self.rule_ties += 1                 # which of equal blocks goes depends on the order
        if i < len(keys) and not fl.blocks[keys[i] & _ADDR].seg.expandable:
            b = fl.blocks[keys[i] & _ADDR]
            # C++ releases it even when split (a cudaFree of part of a segment would fail)
            return ([b], True) if b.prev is None and b.next is None else ([], False)
        out, released = [], 0
        for j in range(i - 1, -1, -1):
            b = fl.blocks[keys[j] & _ADDR]
            if released >= key or b.size < limit:
                break
            if not b.seg.expandable and b.prev is None and b.next is None:
                released += b.size
                out.append(b)
        return out, released >= key

    def release_available_cached_blocks(self, fl: _FreeList, size: int) -> bool:
        """With ``max_split_size_mb``, after a refused segment: release the smallest whole cached
        block of the stream at least max(request, max_split_size), else the largest oversize
        ones until that much is released (C++ ``release_available_cached_blocks``, RULES.md
        §A.9); True when enough was released. Blocks released stay released."""
        out, ok = self.release_available_plan(fl, size)
        for b in out:
            self.release_block(fl, b)
        return ok

    def release_cached_plan(self, pool_id: tuple[int, int] = DEFAULT_POOL) -> list[Block]:
        """The free blocks :meth:`release_cached_blocks` would give back (whole segments, and
        expandable blocks holding at least one whole page); no change, pending frees ignored."""
        out = []
        for fl in self._lists_to_release(pool_id):
            for b in fl.blocks.values():
                if b.seg.expandable:
                    begin, end = self._whole_pages(b)
                    if end > begin:
                        out.append(b)
                elif b.prev is None and b.next is None:
                    out.append(b)
        return out

    def release_cached_events(self, pool_id: tuple[int, int] = DEFAULT_POOL) -> list[tuple[str, int, int]]:
        """The segment events (as :attr:`events` holds them: ``segment_free`` of a whole segment,
        ``segment_unmap`` of the whole pages of an expandable block) that
        :meth:`release_cached_blocks` would make now, in no particular order; no change, pending
        frees ignored. The replay asks it to tell an ``empty_cache`` from a MemPool's release."""
        out = []
        for b in self.release_cached_plan(pool_id):
            if b.seg.expandable:
                begin, end = self._whole_pages(b)
                out.append(("segment_unmap", begin, end - begin))
            else:
                out.append(("segment_free", b.seg.addr, b.seg.size))
        return out

    def release_cached_blocks(self, pool_id: tuple[int, int] = DEFAULT_POOL) -> None:
        """Give cached memory back (C++ ``release_cached_blocks``, RULES.md §A.9, §D): for the
        default id (``empty_cache()``, the out-of-memory retry) wait for every pending event,
        release the default pools (large, then small), then every freeable private pool; for
        a private id (a deleted MemPool) only that pool, once freeable, after its own events
        (RULES.md §A.14)."""
        if pool_id == DEFAULT_POOL:
            self.synchronize_and_free_events()
        elif pool_id in self.freeable:
            self.synchronize_and_free_events(pool_id)
        for fl in self._lists_to_release(pool_id):
            self.release_blocks(fl)

    def _lists_to_release(self, pool_id: tuple[int, int]) -> list[_FreeList]:
        if pool_id == DEFAULT_POOL:
            order = [(DEFAULT_POOL, False), (DEFAULT_POOL, True)] + \
                    [(p, small) for p in sorted(self.freeable) for small in (True, False)]
        elif pool_id in self.freeable:
            order = [(pool_id, True), (pool_id, False)]
        else:
            return []
        by = {}
        for (pid, small, stream), fl in self._free.items():
            by.setdefault((pid, small), []).append((stream, fl))
        return [fl for k in order for _, fl in sorted(by.get(k, ()), key=lambda x: x[0])]

    def release_blocks(self, fl: _FreeList) -> None:
        """Release every whole free segment of one (pool, stream) and unmap the whole pages of
        its free expandable blocks (C++ ``release_blocks``)."""
        key = self._key
        for b in sorted(fl.blocks.values(), key=key):
            if fl.blocks.get(b.addr) is not b:
                continue
            if b.seg.expandable:
                self.unmap_block(fl, b)
            elif b.prev is None and b.next is None:
                self.release_block(fl, b)

    def cached_segment(self, addr: int) -> Block | None:
        """The free block that is the whole segment at ``addr`` (cached, releasable), or None."""
        seg = self._segments.get(addr)
        if seg is None or seg.expandable:
            return None
        b = seg.head
        if b is None or b.next is not None or b.allocated or b.pending:
            return None
        fl = self._free.get((seg.pool_id, seg.small, seg.stream))
        return b if fl is not None and fl.blocks.get(b.addr) is b else None

    def release_cached_segment(self, b: Block) -> None:
        """``cudaFree`` of a whole cached segment the trace says was released (:meth:`cached_segment`)."""
        self.release_block(b.seg.fl, b)

    def release_block(self, fl: _FreeList, b: Block) -> None:
        """``cudaFree`` of a whole cached segment (C++ ``release_block``)."""
        fl.remove(b)
        seg = b.seg
        del self._segments[seg.addr]
        self._space.give(seg.addr, seg.size)
        self.reserved_bytes -= b.size
        self.events.append(("segment_free", seg.addr, seg.size))

    # ------------------------------------------------------------------ expandable segments

    def page(self, small: bool) -> int:
        """:func:`~experiments.doctor.model.rules.expandable_segment_size` of the small or large pool."""
        return expandable_segment_size("small" if small else "large", self.config)

    def try_allocate_expandable_block(self, size: int, small: bool, stream: int,
                                      pool_id: tuple[int, int]) -> Block | None:
        """Map pages for ``size`` bytes at the lowest room of the (pool, stream)'s ranges and
        return the free block that holds them, out of the free list (C++
        ``try_allocate_expandable_block``, RULES.md §C.2); None if no range can hold it."""
        fl = self._list(pool_id, small, stream)
        c = self.find_expandable_block(fl, size, small, stream, pool_id)
        if c is None:
            return None
        if not c.mapped:
            c = self.map_block(fl, c, min(c.size, size))
        while c.size < size:
            nxt = c.next
            c = self.map_block(fl, nxt, min(size - c.size, nxt.size))
        fl.remove(c)
        return c

    def find_expandable_block(self, fl: _FreeList, size: int, small: bool, stream: int,
                              pool_id: tuple[int, int]) -> Block | None:
        """The lowest block from which free and unmapped blocks add up to ``size``: each
        unmapped block by address, or the free block just before it; else a new range (C++
        ``find_expandable_block``). A block still waiting on ``record_stream`` events is not
        free here (``event_count > 0``): the room starts after it (RULES.md §A.14)."""
        blocks = fl.blocks
        for addr in sorted(fl.unmapped):
            u = fl.unmapped[addr]
            p = u.prev
            start = p if (p is not None and p.mapped and blocks.get(p.addr) is p) else u
            room, b = 0, start
            while room < size and b is not None and (not b.mapped or blocks.get(b.addr) is b):
                room += b.size
                b = b.next
            if room >= size:
                return start
        rsize = self.range_size(small)
        if size > rsize:
            return None
        addr = self._next_address(rsize)
        self._counter += 1
        seg = Segment(addr, rsize, stream, pool_id, small, True, self._counter, fl)
        seg.synthetic = self._synthetic
        seg.head = Block(addr, rsize, seg, mapped=False, tie=self._counter)
        self._segments[addr] = seg
        self._ranges.setdefault((pool_id, small, stream), []).append(seg)
        fl.unmapped[addr] = seg.head
        return seg.head

    def map_block(self, fl: _FreeList, block: Block, nbytes: int) -> Block:
        """Map the pages covering the first ``nbytes`` of the unmapped ``block``; the mapped
        part merges with a free neighbour and is cached (C++ ``map_block``)."""
        page = self.page(block.seg.small)
        mapped = min(-(-nbytes // page) * page, block.size)
        del fl.unmapped[block.addr]
        block.mapped = True
        if mapped < block.size:
            rest = Block(block.addr + mapped, block.size - mapped, block.seg, block, block.next, mapped=False,
                         tie=block.tie)
            if self._per_block:        # C++ map_block: the unmapped remainder is a new Block
                self._counter += 1
                rest.tie = self._counter
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = mapped
            fl.unmapped[rest.addr] = rest
        self.reserved_bytes += mapped
        self.events.append(("segment_map", block.addr, mapped))
        self.try_merge_blocks(fl, block)
        return block

    def unmap_block(self, fl: _FreeList, block: Block) -> None:
        """Unmap the whole pages inside the free expandable ``block``; the partial pages at
        either end stay mapped and free; a range with nothing mapped left is released (C++
        ``unmap_block``, ``release_expandable_segment``, RULES.md §C.3)."""
        begin, end = self._whole_pages(block)
        if end <= begin:
            return
        fl.remove(block)
        if begin > block.addr:
            before = Block(block.addr, begin - block.addr, block.seg, block.prev, block, tie=block.tie)
            if self._per_block:        # C++ unmap_block: the partial pages' free blocks are new Blocks
                self._counter += 1
                before.tie = self._counter
            if block.prev is not None:
                block.prev.next = before
            else:
                block.seg.head = before
            block.prev = before
            before.gc_base = self._gc_calls
            fl.add(before)
        if end < block.addr + block.size:
            after = Block(end, block.addr + block.size - end, block.seg, block, block.next, tie=block.tie)
            if self._per_block:
                self._counter += 1
                after.tie = self._counter
            if block.next is not None:
                block.next.prev = after
            block.next = after
            after.gc_base = self._gc_calls
            fl.add(after)
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

    # ------------------------------------------------------------------ internals

    def _list(self, pool_id: tuple[int, int], small: bool, stream: int) -> _FreeList:
        key = (pool_id, small, stream)
        fl = self._free.get(key)
        if fl is None:
            fl = self._free[key] = _FreeList(self._key)
        return fl

    def _whole_pages(self, block: Block) -> tuple[int, int]:
        # [begin, end) of the whole pages inside an expandable block (empty when end <= begin):
        # what unmapping it releases; the partial pages at either end stay mapped (RULES.md §C.3)
        page = self.page(block.seg.small)
        base = block.seg.addr
        return (base + -(-(block.addr - base) // page) * page,
                base + ((block.addr + block.size - base) // page) * page)

    def _cap_refuses(self, alloc: int) -> bool:
        # alloc_block's check against the cap (set_per_process_memory_fraction), RULES.md §A.11
        return self.cap_bytes is not None and self.reserved_bytes + alloc > self.cap_bytes

    def _insert_free(self, fl: _FreeList, b: Block) -> None:
        b.gc_base = self._gc_calls
        fl.add(b)


    def _next_address(self, size: int) -> int:
        self._synthetic = False
        if self.address_hook is not None:
            addr = self.address_hook(size)
            if addr is not None:
                return addr
        if self._addresses:
            return self._addresses.popleft()
        self._synthetic = True
        # only an order by address (torch <= 2.11) lets a made-up address decide a tie
        self._synthetic_made = self.rule == "2.11"
        addr = self._space.take(size)
        while self.address_hook is not None and not self.is_free_range(addr, size):
            addr = self._space.take(size)   # taken by a segment at a recorded address: skip it
        return addr

    @staticmethod
    def _seg_dict(seg: Segment, blocks: list[Block]) -> dict[str, Any]:
        return {
            "address": blocks[0].addr, "total_size": sum(b.size for b in blocks), "stream": seg.stream,
            "pool_id": list(seg.pool_id), "pool": "small" if seg.small else "large", "is_expandable": seg.expandable,
            "blocks": [{"address": b.addr, "size": b.size,
                        "state": "active_allocated" if b.allocated else "inactive",
                        "requested_size": b.requested} for b in blocks],
        }


class no_cyclic_gc:
    """``with no_cyclic_gc():`` the cyclic garbage collector paused. The engine's blocks link to
    their neighbours (``prev``/``next``): with thousands of live blocks the collector would rescan
    those reference cycles over and over during a replay or a what-if, for nothing to free."""

    def __enter__(self) -> None:
        self.was = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc: Any) -> None:
        if self.was:
            gc.enable()


__all__ = ["Block", "Engine", "EngineOutOfMemory", "Segment", "no_cyclic_gc"]
