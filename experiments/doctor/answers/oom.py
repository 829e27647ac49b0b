"""The out-of-memory explanation: which request failed, what was reserved but unusable, which
live blocks pinned it (with the stacks the snapshot recorded), and which settings would have
served the request.

The state is the exact replay stopped just after the trace's first ``oom`` entry, that is after
the allocator's out-of-memory path released what it could (RULES.md §A.10): whatever is still
reserved then is held by segments that live blocks pin, or is in pieces too small or in the
wrong pool or stream for the request. The settings come from the grid of
:mod:`experiments.doctor.answers.suggest` (or the what-ifs given): a setting fits the request
when its what-if served the request the GPU refused.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..model.rules import get_allocation_size, get_pool, round_size
from ..reading.rows import OOM, SEG_FREE, SEG_UNMAP
from ..replaying.replay import replay
from ..replaying.requests import R_RETRY, as_requests
from ..replaying.run import Run

TOP_SEGMENTS = 5
TOP_BLOCKS = 4
MAX_FRAMES = 8


def first_oom(trace: Any) -> int | None:
    """The trace index of the first 'oom' entry of ``trace`` (a
    :class:`~experiments.doctor.reading.trace.Trace`, as everywhere in this module), or None."""
    try:
        return trace.events.codes.index(OOM)
    except ValueError:
        return None


def infer_cap(trace: Any, total_memory: int) -> int | None:
    """A memory cap for a snapshot that records none but ran out of memory: the bytes the
    allocator held after its out-of-memory path plus what the driver said was free then (the
    'oom' entry's device_free). Exact when the device itself was full and other processes held
    the same memory throughout; None when the trace has no OOM or cannot be followed to it."""
    j = first_oom(trace)
    if j is None:
        return None
    run = replay(trace, total_memory=total_memory, stop_at=j, series=False)
    if run.first_mismatch is not None and run.first_mismatch["event_index"] < j:
        return None
    # segment events right before the 'oom' entry are the out-of-memory path's releases: the
    # replay stopped before them, so they are taken off here
    ev = trace.events
    reserved = run.final_reserved_bytes
    k = j - 1
    while k >= 0 and ev.codes[k] in (SEG_FREE, SEG_UNMAP):
        reserved -= ev.sizes[k]
        k -= 1
    return reserved + ev.addrs[j]


def _frames_of(trace: Any, key: int | None, addr: int) -> list[list[Any]]:
    if key is not None and key < len(trace.events):
        frames = trace.frames(key)
    else:
        frames = list(trace.block_stacks.get(addr, ()))
    return [[f, line, name] for f, line, name in frames[:MAX_FRAMES]]


def _forward_of(trace: Trace, key: int | None) -> list[list[Any]]:
    # torch 2.12+: a block allocated in the backward pass carries the forward pass's stack
    if key is None:
        return []
    return [[f, line, name] for f, line, name in trace.forward_frames(key)[:MAX_FRAMES]]


def your_frame(frames: Sequence[Sequence[Any]]) -> Sequence[Any] | None:
    """The innermost frame outside torch and Python's own files (the line in your program)."""
    for f in frames:
        name = str(f[0])
        if "/torch/" not in name and not name.startswith("<frozen") and "/site-packages/" not in name:
            return f
    return frames[0] if frames else None


def explain(trace: Any, base: Run, *, cap_bytes: int | None, total_memory: int,
            grid: Mapping[str, Run] | None = None) -> dict[str, Any] | None:
    """The explanation of the trace's first OOM (None when it has none). Fields (bytes):
    event_index, request_bytes, rounded_bytes, segment_bytes (what cudaMalloc was asked for),
    pool, stream, device_free_bytes, cap_bytes, allocated_bytes, reserved_bytes,
    reserved_unallocated_bytes, largest_free_bytes, pinned (segments with free bytes that
    live blocks pin, most free first: address, segment_bytes, pool, free_bytes, live_blocks
    [address, size, requested_size, frames [[file, line, name], ...]]), followed (whether the
    exact replay reached the OOM), fits_under and fails_under (settings of ``grid`` whose exact
    what-if served / refused the request), uncertain_under (those whose what-if is not exact)."""
    j = first_oom(trace)
    if j is None:
        return None
    ev = trace.events
    size, stream, device_free = ev.sizes[j], ev.streams[j], ev.addrs[j]
    rounded = round_size(size, trace.config)
    out: dict[str, Any] = {"event_index": j, "request_bytes": size, "rounded_bytes": rounded,
                           "segment_bytes": get_allocation_size(rounded, trace.config), "pool": get_pool(rounded),
                           "stream": stream, "device_free_bytes": device_free, "cap_bytes": cap_bytes}
    at = replay(trace, cap_bytes=cap_bytes, total_memory=total_memory, stop_at=j + 1, series=False)
    followed = at.first_mismatch is None or at.first_mismatch["event_index"] > j
    out["followed"] = followed
    if not followed:      # the model's state there would not be the GPU's: say only what the trace says
        out.update(allocated_bytes=None, reserved_bytes=None, reserved_unallocated_bytes=None,
                   largest_free_bytes=None, pinned=[], fits_under=[], fails_under=[], uncertain_under=[])
        return out
    segs = at.final_segments
    free = [b["size"] for s in segs for b in s["blocks"] if b["state"] == "inactive"]
    allocated = sum(b["size"] for s in segs for b in s["blocks"] if b["state"] != "inactive")
    reserved = sum(s["total_size"] for s in segs)
    out.update(allocated_bytes=allocated, reserved_bytes=reserved, reserved_unallocated_bytes=reserved - allocated,
               largest_free_bytes=max(free, default=0))
    pinned = []
    for s in segs:
        live = [b for b in s["blocks"] if b["state"] != "inactive"]
        nfree = sum(b["size"] for b in s["blocks"] if b["state"] == "inactive")
        if live and nfree:
            live.sort(key=lambda b: -b["size"])
            pinned.append({"address": s["address"], "segment_bytes": s["total_size"], "pool": s["pool"],
                           "stream": s["stream"], "free_bytes": nfree, "live_block_count": len(live),
                           "live_blocks": [{"address": b["address"], "size": b["size"],
                                            "requested_size": b["requested_size"],
                                            "frames": _frames_of(trace, at.live_keys.get(b["address"]), b["address"]),
                                            "forward_frames": _forward_of(trace, at.live_keys.get(b["address"]))}
                                           for b in live[:TOP_BLOCKS]]})
    pinned.sort(key=lambda p: -p["free_bytes"])
    out["pinned"] = pinned[:TOP_SEGMENTS]
    out["fits_under"], out["fails_under"], out["uncertain_under"] = [], [], []
    k_oom = _retry_index(trace, base, j)
    if grid and k_oom is not None:
        for settings, run in grid.items():
            # a what-if that is not exact may or may not serve it; what happens after the request
            # (how long a request that failed on the GPU would have lived) does not matter here
            if run.exact is False and any(not u.startswith("lifetime of requests") for u in run.uncertain):
                out["uncertain_under"].append(settings)
                continue
            failed = any(k == k_oom for k, _ in run.oom_requests)
            (out["fails_under"] if failed else out["fits_under"]).append(settings)
    return out


def _retry_index(trace: Any, base: Run, j: int) -> int | None:
    """The index in the replay's requests of the request that failed at trace event ``j``: the
    replay keeps one R_RETRY request per 'oom' entry, in order."""
    nth = trace.events.codes[:j].count(OOM)
    retries = as_requests(base.requests).indices(R_RETRY)
    return retries[nth] if nth < len(retries) else None


__all__ = ["explain", "first_oom", "infer_cap", "your_frame"]
