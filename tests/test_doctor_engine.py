"""The doctor's engine against the rules of CUDACachingAllocator.cpp (torch 2.11), case by case.

Each test builds its requests or its trace by hand from the rules (experiments/doctor/RULES.md
§A-§D and the C++ functions named in each), never from the engine's own output. The tests that
guard a defect of an earlier engine say what it did (they failed there).
"""
from __future__ import annotations

import pytest

from experiments.doctor.model import engine as engine_module
from experiments.doctor.model import rules
from experiments.doctor.model.engine import Engine, EngineOutOfMemory
from experiments.doctor.replaying.replay import replay
from experiments.doctor.model.rules import AllocatorConfig
from experiments.doctor.reading.trace import read
from experiments.doctor.answers.whatif import WhatIf, what_if

MiB = 2**20
EXPANDABLE = AllocatorConfig(expandable_segments=True)


def _snapshot(events, segments=(), settings="", cap=None, **parsed):
    """A snapshot dict in torch's form: trace entries (action, addr, size, stream) and the final
    segments (address, total_size, stream, pool id, blocks (address, size, state))."""
    segs = [{"address": a, "total_size": t, "stream": st, "segment_type": "large", "segment_pool_id": pid,
             "is_expandable": False, "blocks": [{"address": ba, "size": bs, "requested_size": bs, "state": bst}
                                                for ba, bs, bst in blocks]}
            for a, t, st, pid, blocks in segments]
    return {"segments": segs, "device_traces": [[{"action": a, "addr": addr, "size": size, "stream": st}
                                                  for a, addr, size, st in events]],
            # torch's allocator_settings hold the parsed values beside the string (RULES.md §E.2)
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": settings, **parsed}, "memory_cap_bytes": cap,
            "device_total_bytes": 150_109_880_320}


# ----------------------------------------------------------------------------- a pending block is no room

def test_a_block_waiting_on_record_stream_events_is_no_room_for_an_expandable_segment():
    """find_expandable_block counts only blocks that are free with no outstanding event
    (``event_count == 0``): a 20 MiB block freed after record_stream, whose events are not done,
    ends exactly where the mapped memory ends; the next 13 MiB request on its stream maps a new
    page after it. (An earlier engine took the pending block as the room and crashed:
    IndexError in _FreeList.remove.)"""
    eng = Engine(EXPANDABLE)
    a = eng.malloc(20 * MiB, stream=7)           # one 20 MiB page, no free tail
    eng.free_requested(a)                        # record_stream: its events are still pending
    b = eng.malloc(13 * MiB, stream=7)
    assert b.addr == a.addr + 20 * MiB
    assert eng.events == [("segment_map", a.addr + 20 * MiB, 20 * MiB)]
    assert eng.reserved_bytes == 40 * MiB and eng.is_pending(a)
    eng.free_completed(a)                        # the events complete: the page is free again
    c = eng.malloc(20 * MiB, stream=7)
    assert c.addr == a.addr and eng.reserved_bytes == 40 * MiB


def test_a_record_stream_trace_replays_and_its_expandable_what_if_runs():
    """The pattern of chapter 2 with buffers that fill pages exactly: allocated on a side stream,
    freed while the consumer still uses them, completed after a sync."""
    base, s = 0x7F0000000000, 5
    ev = [("segment_alloc", base, 20 * MiB, s), ("alloc", base, 20 * MiB, s),
          ("free_requested", base, 20 * MiB, s),
          ("segment_alloc", base + 20 * MiB, 40 * MiB, s), ("alloc", base + 20 * MiB, 40 * MiB, s),
          ("free_requested", base + 20 * MiB, 40 * MiB, s),
          ("segment_alloc", base + 60 * MiB, 14 * MiB, s), ("alloc", base + 60 * MiB, 13 * MiB, s),
          ("free_requested", base + 60 * MiB, 13 * MiB, s), ("free_completed", base + 60 * MiB, 13 * MiB, s),
          ("free_completed", base, 20 * MiB, s), ("free_completed", base + 20 * MiB, 40 * MiB, s)]
    segs = [(base, 20 * MiB, s, (0, 0), [(base, 20 * MiB, "inactive")]),
            (base + 20 * MiB, 40 * MiB, s, (0, 0), [(base + 20 * MiB, 40 * MiB, "inactive")]),
            (base + 60 * MiB, 14 * MiB, s, (0, 0), [(base + 60 * MiB, 14 * MiB, "inactive")])]
    run = replay(read(_snapshot(ev, segs)))
    assert run.matches_trace, run.first_mismatch
    w, _ = what_if(run, WhatIf("expandable_segments:True", EXPANDABLE))
    # pages: 20 MiB, then 40 more (the first block pending), then 20 more for 13 MiB (both pending)
    assert w.peak_reserved_bytes == 80 * MiB and w.final_reserved_bytes == 80 * MiB
    assert not w.exact and w.uncertain == ["record_stream completion timing"]


# ----------------------------------------------------------------------------- the cap's OOM path

def test_the_out_of_memory_retry_waits_for_record_stream_events_first():
    """release_cached_blocks calls synchronize_and_free_events before releasing (RULES.md §A.9,
    §B.1): a 60 MiB block waiting on events under a 100 MiB cap is freed, its segment released,
    and the second 60 MiB request fits after one retry. (Before: out of memory.)"""
    eng = Engine(cap_bytes=100 * MiB)
    a = eng.malloc(60 * MiB)
    eng.free_requested(a)
    b = eng.malloc(60 * MiB)
    assert [e[0] for e in eng.events] == ["segment_free", "segment_alloc"]
    assert eng.num_alloc_retries == 1 and eng.num_sync_all_streams == 1 and not eng.is_pending(a)
    assert eng.reserved_bytes == 60 * MiB and b.size == 60 * MiB


def test_garbage_collection_releases_the_blocks_at_least_as_old_as_the_average():
    """garbage_collect_cached_blocks (RULES.md §A.9): cap 120 MiB, threshold 0.5. Segments of
    30 MiB (cached again after its 3rd get_free_block call) and 32 MiB (after the 2nd); the 4th
    call (40 MiB) finds nothing, reserved 62 > 60: ages 1 and 2, average 1.5, so only the
    32 MiB one goes (reclaimed 32 >= target 2), then a 40 MiB segment: 70 MiB reserved. The
    cap alone would have let it be made without releasing anything (62 + 40 <= 120)."""
    eng = Engine(AllocatorConfig(garbage_collection_threshold=0.5), cap_bytes=120 * MiB)
    a = eng.malloc(30 * MiB)
    b = eng.malloc(32 * MiB)
    for blk in (a, b):
        eng.free_requested(blk)
        eng.free_completed(blk)
    a = eng.malloc(30 * MiB)
    eng.free_requested(a)
    eng.free_completed(a)
    s32 = b.seg.addr
    eng.malloc(40 * MiB)
    assert eng.events[0] == ("segment_free", s32, 32 * MiB) and eng.events[1][0] == "segment_alloc"
    assert len(eng.events) == 2 and eng.reserved_bytes == 70 * MiB


def test_a_trace_whose_segments_the_garbage_collector_released_replays_exactly():
    """The same sequence as a trace: the release before the new segment is the collector's, not
    an empty_cache (an earlier replay saw that the cap would not have refused the
    segment, inferred an empty_cache, which releases the 30 MiB segment too, and stopped)."""
    s1, s2, s3 = 0x7F0000000000, 0x7F0002000000, 0x7F0008000000
    ev = [("segment_alloc", s1, 30 * MiB, 0), ("alloc", s1, 30 * MiB, 0),
          ("segment_alloc", s2, 32 * MiB, 0), ("alloc", s2, 32 * MiB, 0),
          ("free_requested", s1, 30 * MiB, 0), ("free_completed", s1, 30 * MiB, 0),
          ("free_requested", s2, 32 * MiB, 0), ("free_completed", s2, 32 * MiB, 0),
          ("alloc", s1, 30 * MiB, 0), ("free_requested", s1, 30 * MiB, 0), ("free_completed", s1, 30 * MiB, 0),
          ("segment_free", s2, 32 * MiB, 0), ("segment_alloc", s3, 40 * MiB, 0), ("alloc", s3, 40 * MiB, 0)]
    segs = [(s1, 30 * MiB, 0, (0, 0), [(s1, 30 * MiB, "inactive")]),
            (s3, 40 * MiB, 0, (0, 0), [(s3, 40 * MiB, "active_allocated")])]
    run = replay(read(_snapshot(ev, segs, "garbage_collection_threshold:0.5", cap=120 * MiB,
                                garbage_collection_threshold=0.5)))
    assert run.matches_trace, run.first_mismatch
    assert run.final_reserved_bytes == 70 * MiB


# ----------------------------------------------------------------------------- private pools

def test_empty_cache_releases_a_private_pool_only_once_nothing_holds_it():
    """release_cached_blocks (RULES.md §A.9, §D): torch.cuda.empty_cache() gives back the
    default pools and the freeable private pools; a live MemPool's whole free segment stays; a
    deleted MemPool's release (its own id) takes only that pool. (Before: every pool given.)"""
    eng = Engine()
    pool = (0, 3)
    d = eng.malloc(30 * MiB)
    p = eng.malloc(30 * MiB, pool_id=pool)
    for blk in (d, p):
        eng.free_requested(blk)
        eng.free_completed(blk)
    eng.empty_cache()
    assert [e[1] for e in eng.events] == [d.seg.addr] and eng.reserved_bytes == 30 * MiB
    eng.empty_cache(pool)                         # not freeable yet: nothing
    assert eng.events == [] and eng.reserved_bytes == 30 * MiB
    eng.freeable.add(pool)                        # del MemPool: releasePool, then emptyCache(id)
    eng.empty_cache(pool)
    assert [e[1] for e in eng.events] == [p.seg.addr] and eng.reserved_bytes == 0


def test_a_block_restored_from_a_pool_checkpoint_sits_where_the_checkpoint_held_it():
    """CUDA-graph trees restore a private pool (setSegmentStateToCheckpoint): blocks are
    allocated from the head of the checkpointed segment, split to the checkpoint's sizes,
    whatever best fit would choose (here a 12 MiB free block elsewhere). (Before: "the block is
    not where the GPU put it".)"""
    st, pool = 9, [0, 1]
    a, b = 0x7F0000000000, 0x7F0004000000
    ev = [("segment_alloc", a, 20 * MiB, st), ("alloc", a, 20 * MiB, st),
          ("segment_alloc", b, 12 * MiB, st), ("alloc", b, 12 * MiB, st),
          ("free_requested", a, 20 * MiB, st), ("free_completed", a, 20 * MiB, st),
          ("free_requested", b, 12 * MiB, st), ("free_completed", b, 12 * MiB, st),
          ("alloc", a, 4 * MiB, st), ("alloc", a + 4 * MiB, 4 * MiB, st)]
    segs = [(a, 20 * MiB, st, pool, [(a, 4 * MiB, "active_allocated"), (a + 4 * MiB, 4 * MiB, "active_allocated"),
                                     (a + 8 * MiB, 12 * MiB, "inactive")]),
            (b, 12 * MiB, st, pool, [(b, 12 * MiB, "inactive")])]
    run = replay(read(_snapshot(ev, segs)))
    assert run.matches_trace, run.first_mismatch
    assert run.restores == 2


# ----------------------------------------------------------------------------- each rule once

def test_the_engine_splits_by_the_rule_the_chapter_teaches(monkeypatch):
    """rules.should_split is the one split rule: the chapter re-exports it and the engine calls
    it for every block it hands out (an earlier engine had a copy of its own)."""
    from experiments.allocator import model

    assert model.should_split is rules.should_split is engine_module.should_split
    seen = []

    def spy(block_size, rounded, pool, config=rules.DEFAULT):
        seen.append((block_size, rounded, pool))
        return rules.should_split(block_size, rounded, pool, config)

    monkeypatch.setattr(engine_module, "should_split", spy)
    eng = Engine()
    eng.malloc(3 * MiB)
    eng.malloc(1000)
    assert seen == [(20 * MiB, 3 * MiB, "large"), (2 * MiB, 1024, "small")]


@pytest.mark.parametrize("name", ["round_size", "get_pool", "get_allocation_size", "should_split",
                                  "expandable_segment_size", "expandable_range_size"])
def test_each_size_rule_is_a_function_named_after_its_cpp_function_citing_it(name):
    fn = getattr(rules, name)
    doc = fn.__doc__ or ""
    assert "RULES.md §" in doc and "C++" in doc, name


@pytest.mark.parametrize("name", ["malloc", "get_free_block", "alloc_block", "alloc_found_block", "free_block",
                                  "try_merge_blocks", "synchronize_and_free_events",
                                  "garbage_collect_cached_blocks", "release_available_cached_blocks",
                                  "release_cached_blocks", "release_blocks", "release_block",
                                  "try_allocate_expandable_block", "find_expandable_block", "map_block",
                                  "unmap_block", "alloc_checkpointed_block"])
def test_each_engine_rule_is_a_method_named_after_its_cpp_function_citing_it(name):
    doc = getattr(Engine, name).__doc__ or ""
    assert "C++" in doc, name


def test_an_oom_under_a_cap_leaves_the_releases_it_made():
    eng = Engine(cap_bytes=50 * MiB)
    a = eng.malloc(30 * MiB)
    with pytest.raises(EngineOutOfMemory):
        eng.malloc(30 * MiB)
    assert eng.num_ooms == 1 and eng.reserved_bytes == 30 * MiB and a.allocated
