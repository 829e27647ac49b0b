"""Traces written as torch 2.11, 2.12 and 2.13+ would write them: the layout and the allocator.

Two things changed after torch 2.11 that a snapshot shows (read from the releases' binaries:
experiments/doctor/RULES.md §G, the notes of issue 24):

* the layout: from 2.12 every trace entry carries ``pool_id``, a (int, int) tuple (PR #177717);
  2.14 adds ``annotate`` entries and the ``host_segments`` / ``host_traces`` keys;
* best fit's order between equal-size free blocks: by address up to 2.11
  (``BlockComparatorSize``); by a counter every new ``Block`` object takes in 2.12 (the
  allocated front of a split is the new object, the free remainder keeps its own, a merge keeps
  the freed block's; ``BlockComparatorRegistrationCounter``); by a counter each segment takes
  when cudaMalloc'd, then by address, in 2.13 and 2.14 (``BlockComparatorSizeCounterAddress``).

:class:`MiniAllocator` is a small, separate model of the large pool of one stream, written from
that reading and nothing else (it shares no code with the doctor): the doctor must replay what
it writes exactly, under the rule of the version that wrote it. The 2.12 and 2.13 rules are
read from the source, not yet checked on a GPU.
"""
from __future__ import annotations

import copy
from typing import Any

MiB = 1 << 20
VERSIONS = ("2.11", "2.12", "2.13")
_ENTRY = {"stream": 0, "time_us": 0, "compile_context": "N/A", "user_metadata": "", "frames": []}


class _Blk:
    def __init__(self, addr: int, size: int, seg: "_Seg", counter: int) -> None:
        self.addr, self.size, self.seg, self.counter = addr, size, seg, counter
        self.prev: _Blk | None = None
        self.next: _Blk | None = None
        self.free = True
        self.requested = 0


class _Seg:
    def __init__(self, addr: int, size: int, counter: int) -> None:
        self.addr, self.size, self.counter = addr, size, counter


class MiniAllocator:
    """The default large pool of stream 0, without expandable segments, as torch ``version``
    orders its free blocks; segments at the given cudaMalloc addresses, in order.

    Args:
        version: '2.11', '2.12' or '2.13' (2.14 orders as 2.13).
        addresses: base addresses the driver hands out, one per new segment.
        max_split_mb: ``max_split_size_mb`` (None: no limit).
        cap: the memory cap in bytes (None: none).
        layout: the release whose snapshot layout to write (default: ``version``).
    """

    def __init__(self, version: str, addresses: list[int], *, max_split_mb: int | None = None,
                 cap: int | None = None, layout: str | None = None) -> None:
        if version not in VERSIONS:
            raise ValueError(f"version must be one of {VERSIONS}, got {version!r}")
        self.version, self.layout = version, layout or version
        self.addresses = list(addresses)
        self.max_split = max_split_mb * MiB if max_split_mb is not None else None
        self.cap = cap
        self.counter = 0
        self.free: list[_Blk] = []
        self.live: dict[int, _Blk] = {}
        self.segments: dict[int, _Blk] = {}      # base -> first block
        self.reserved = 0
        self.trace: list[dict[str, Any]] = []

    # -- the trace
    def _emit(self, action: str, addr: int, size: int) -> None:
        e = {"action": action, "addr": addr, "size": size, **copy.deepcopy(_ENTRY)}
        if action == "oom":
            e["device_free"] = e.pop("addr")
        if self.layout != "2.11":
            e["pool_id"] = (0, 0)
        self.trace.append(e)

    def _key(self, b: _Blk) -> tuple[int, ...]:
        if self.version == "2.11":
            return (b.size, b.addr)
        if self.version == "2.12":
            return (b.size, b.counter)
        return (b.size, b.seg.counter, b.addr)

    def _new_counter(self) -> int:
        self.counter += 1
        return self.counter

    # -- malloc
    def malloc(self, nbytes: int) -> int:
        """Allocate ``nbytes`` (> 1 MiB: the large pool); return the block's address, or -1 after
        an out-of-memory error (recorded as an ``oom`` entry)."""
        size = -(-nbytes // 512) * 512
        if size <= MiB:
            raise ValueError("the mini allocator models the large pool only (requests above 1 MiB)")
        b = self._best_fit(size)
        if b is None:
            alloc = 20 * MiB if size < 10 * MiB else -(-size // (2 * MiB)) * (2 * MiB)
            b = self._alloc_block(alloc)
            if b is None and self._release_available(size):
                b = self._alloc_block(alloc)
            if b is None:
                self._release_cached()
                b = self._alloc_block(alloc)
            if b is None:
                self._emit("oom", 0, size)
                return -1
        else:
            self.free.remove(b)
        remaining = b.size - size
        if remaining > MiB and (self.max_split is None or size < self.max_split):
            front = _Blk(b.addr, size, b.seg, self._new_counter() if self.version == "2.12" else b.counter)
            front.prev, front.next = b.prev, b
            if b.prev is not None:
                b.prev.next = front
            else:
                self.segments[b.seg.addr] = front
            b.prev = front
            b.addr += size
            b.size = remaining
            self.free.append(b)
            b = front
        b.free = False
        b.requested = nbytes
        self.live[b.addr] = b
        self._emit("alloc", b.addr, nbytes)
        return b.addr

    def _best_fit(self, size: int) -> _Blk | None:
        fits = sorted((b for b in self.free if b.size >= size), key=self._key)
        if not fits:
            return None
        b = fits[0]
        if self.max_split is not None:
            if size < self.max_split and b.size >= self.max_split:
                return None
            if size >= self.max_split and b.size >= size + 20 * MiB:
                return None
        return b

    def _alloc_block(self, alloc: int) -> _Blk | None:
        if self.cap is not None and self.reserved + alloc > self.cap:
            return None
        addr = self.addresses.pop(0)
        seg = _Seg(addr, alloc, self._new_counter())
        b = _Blk(addr, alloc, seg, seg.counter)
        self.segments[addr] = b
        self.reserved += alloc
        self._emit("segment_alloc", addr, alloc)
        return b

    def _whole(self, b: _Blk) -> bool:
        return b.prev is None and b.next is None

    def _release(self, b: _Blk) -> None:
        self.free.remove(b)
        del self.segments[b.seg.addr]
        self.reserved -= b.size
        self._emit("segment_free", b.seg.addr, b.size)

    def _release_available(self, size: int) -> bool:
        # release_available_cached_blocks: the first block of at least max(size, max_split) in
        # the pool's order, else the largest oversize ones, walking down the order
        if self.max_split is None:
            return False
        key = max(size, self.max_split)
        order = sorted(self.free, key=self._key)
        at = next((i for i, b in enumerate(order) if b.size >= key), None)
        if at is not None:
            self._release(order[at])
            return True
        released = 0
        for b in reversed(order):
            if released >= key or b.size < self.max_split:
                break
            self._release(b)
            released += b.size
        return released >= key

    def _release_cached(self) -> None:
        for b in sorted(self.free, key=self._key):
            if self._whole(b):
                self._release(b)

    # -- free and empty_cache
    def free_(self, addr: int) -> None:
        """Free the block at ``addr`` (no record_stream: requested and completed at once)."""
        b = self.live.pop(addr)
        self._emit("free_requested", addr, b.requested)
        self._emit("free_completed", addr, b.requested)
        b.free = True
        for nb in (b.prev, b.next):
            if nb is not None and nb.free:        # try_merge_blocks(dst=b, src=nb): b survives
                self.free.remove(nb)
                if nb is b.prev:
                    b.addr, b.prev = nb.addr, nb.prev
                    if nb.prev is not None:
                        nb.prev.next = b
                    else:
                        self.segments[b.seg.addr] = b
                else:
                    b.next = nb.next
                    if nb.next is not None:
                        nb.next.prev = b
                b.size += nb.size
        self.free.append(b)

    def empty_cache(self) -> None:
        self._release_cached()

    # -- the snapshot
    def snapshot(self, settings: str = "") -> dict[str, Any]:
        """The dict ``torch.cuda.memory._snapshot()`` returns, in this allocator's layout."""
        segs = []
        for base in sorted(self.segments):
            blocks, b = [], self.segments[base]
            while b is not None:
                blocks.append({"address": b.addr, "size": b.size, "requested_size": b.requested if not b.free else 0,
                               "state": "inactive" if b.free else "active_allocated", "frames": []})
                b = b.next
            total = sum(x["size"] for x in blocks)
            segs.append({"device": 0, "address": base, "total_size": total, "allocated_size": 0, "active_size": 0,
                         "requested_size": 0, "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
                         "is_expandable": False, "frames": [], "blocks": blocks})
        conf = {"PYTORCH_CUDA_ALLOC_CONF": settings,
                "max_split_size": self.max_split if self.max_split is not None else -1,
                "garbage_collection_threshold": 0.0, "expandable_segments": False,
                "pinned_num_register_threads": 1, "release_lock_on_cudamalloc": False,
                "pinned_use_cuda_host_register": False,
                "roundup_power2_divisions": {str(1 << i): 0 for i in range(16)}}
        snap: dict[str, Any] = {"segments": segs, "device_traces": [list(self.trace)], "allocator_settings": conf,
                                "external_annotations": []}
        if self.layout not in ("2.11", "2.12", "2.13"):      # 2.14: the host allocator's keys
            snap["host_segments"], snap["host_traces"] = [], []
        return snap


def addresses(n: int = 64, top: int = 0x7F00_0000_0000, step: int = 256 * MiB) -> list[int]:
    """Segment bases as the driver mostly hands them out: decreasing."""
    return [top - k * step for k in range(n)]


def ties(version: str, layout: str | None = None) -> tuple[MiniAllocator, dict[str, int]]:
    """A program whose layout tells the three orders apart.

    1. Two 12 MiB segments, A then B (B at the lower address), both freed: a 12 MiB request takes
       B under 2.11 (address) and A under 2.12 and 2.13 (older block, older segment).
    2. Two 20 MiB segments C then D; C is split and merged again so that its one free block is a
       Block object made after D's: a 20 MiB request takes D under 2.11 (lower address) and 2.12
       (older object) but C under 2.13 (older segment).

    Returns the allocator (its ``snapshot()`` is the trace) and {name: address} of the two
    requests that tell the rules apart ('first', 'second')."""
    m = MiniAllocator(version, addresses(), layout=layout)
    a = m.malloc(12 * MiB)
    b = m.malloc(12 * MiB)
    m.free_(a)
    m.free_(b)
    first = m.malloc(12 * MiB)
    m.malloc(12 * MiB)                     # the other one: kept
    c0 = m.malloc(4 * MiB)                 # segment C (20 MiB): c0 at its start, 16 MiB free after it
    d = m.malloc(20 * MiB)                 # does not fit C's 16 MiB: segment D
    c1 = m.malloc(2 * MiB)                 # from C's remainder: a new Block object in 2.12
    m.free_(c0)
    m.free_(c1)                            # merges c0 and the remainder into c1's object: all of C
    m.free_(d)
    second = m.malloc(20 * MiB)
    return m, {"first": first, "second": second}


def releases(version: str, layout: str | None = None) -> tuple[MiniAllocator, dict[str, int]]:
    """``release_available_cached_blocks`` under ``max_split_size_mb:40`` and a 200 MiB cap: two
    cached 64 MiB segments (E then F, F lower) and a 44 MiB one taken again; a 30 MiB request
    may not take a cached block of 40 MiB or more, and a new segment does not fit under the
    cap: the allocator releases the first block of at least 40 MiB in its order (F under 2.11,
    E under 2.12 and 2.13) and makes the new segment.
    Returns the allocator and {'released': the base of the segment that went}."""
    m = MiniAllocator(version, addresses(), max_split_mb=40, cap=200 * MiB, layout=layout)
    e = m.malloc(64 * MiB)
    f = m.malloc(64 * MiB)
    g = m.malloc(44 * MiB)                 # 172 MiB reserved
    m.free_(e)
    m.free_(f)
    m.free_(g)
    h = m.malloc(44 * MiB)                 # takes g's 44 MiB block again (whole: not split)
    k = m.malloc(30 * MiB)                 # no cached block under the oversize rule; 172 + 30 > 200
    gone = [x["addr"] for x in m.trace if x["action"] == "segment_free"]
    del h, k
    return m, {"released": gone[0] if gone else -1}


def as_layout(snap: dict[str, Any], layout: str, *, alloc_pool: Any = None,
              forward_every: int = 0) -> dict[str, Any]:
    """A torch 2.11 ``_snapshot()`` dict rewritten as a later release writes the same run.

    Args:
        snap: the 2.11 snapshot (not changed).
        layout: '2.12' or '2.13' (``pool_id`` on every trace entry), '2.14' (also ``annotate``
            entries after some allocations, ``host_segments`` and ``host_traces``).
        alloc_pool: for segments the final state no longer holds (its ``segment_pool_id``
            covers the others), a function of the first ``alloc`` entry made in the segment
            giving the segment's pool id (what the program knows of its own pools); without
            it such segments are the default pool's, (0, 0).
        forward_every: give every n-th ``alloc`` entry ``forward_frames`` (the forward pass's
            stack of a backward allocation); 0 for none.
    """
    if layout not in ("2.12", "2.13", "2.14"):
        raise ValueError(f"layout must be '2.12', '2.13' or '2.14', got {layout!r}")
    out = dict(snap)
    final = {s["address"]: tuple(s["segment_pool_id"]) for s in snap["segments"]}
    traces = []
    fwd = [{"name": "forward", "filename": "model.py", "line": 40 + k} for k in range(3)]
    for entries in snap["device_traces"]:
        known = dict(final)
        if alloc_pool is not None:
            for i, e in enumerate(entries):
                if e["action"] == "segment_alloc" and e["addr"] not in known:
                    lo, hi = e["addr"], e["addr"] + e["size"]
                    first = next((x for x in entries[i + 1:] if x["action"] == "alloc" and lo <= x["addr"] < hi), None)
                    known[lo] = tuple(alloc_pool(first)) if first is not None else (0, 0)
        bases: list[tuple[int, int, tuple[int, int]]] = []     # (base, end, pool) of live segments
        new, n_alloc = [], 0
        for e in entries:
            e = dict(e)
            act, addr = e["action"], e.get("addr", 0)
            if act in ("segment_alloc", "segment_map") and not any(lo <= addr < hi for lo, hi, _ in bases):
                bases.append((addr, addr + e["size"], known.get(addr, (0, 0))))
            pool = next((p for lo, hi, p in bases if lo <= addr < hi), (0, 0))
            if act == "segment_free":
                bases = [x for x in bases if x[0] != addr]
            e["pool_id"] = (pool[0], pool[1])          # a new tuple per entry, as torch makes them
            if act == "alloc":
                n_alloc += 1
                if forward_every and n_alloc % forward_every == 0:
                    e["forward_frames"] = list(fwd)     # a new list per entry, of shared frame dicts
            new.append(e)
            if layout == "2.14" and act == "alloc" and n_alloc % 50 == 0:
                new.append({"action": "annotate", "addr": addr, "size": 0, "stream": e["stream"], "time_us": 0,
                            "compile_context": "N/A", "user_metadata": "packed for backward", "frames": [],
                            "pool_id": pool})
        traces.append(new)
    out["device_traces"] = traces
    if layout == "2.14":
        out["host_segments"], out["host_traces"] = [], []
    return out
