"""Reading a memory trace by stream: which blocks each CUDA stream holds, which frees the
allocator deferred, and how both move over time (chapter 2's FSDP section).

Pure Python over the entries of ``torch.cuda.memory._snapshot()["device_traces"][0]`` (dicts
with ``action``, ``addr``, ``size``, ``stream``, ``time_us``): no torch, so the analysis is
tested on the CPU. The meaning of the entries follows ``c10/cuda/CUDACachingAllocator.cpp``:
``free`` records ``free_requested``; a block another stream used (``record_stream``) gets
events (``insert_events``) and its ``free_completed`` comes only when a later allocation finds
them done (``process_events``); any other block's ``free_completed`` follows at once.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

BINS = 100                   # time bins of a run's per-stream timeline


def _empty_usage() -> dict[str, Any]:
    return {"allocs": 0, "alloc_bytes": 0, "deferred_frees": 0, "max_blocks": 0, "max_bytes": 0,
            "max_parked_blocks": 0, "max_parked_bytes": 0}


class _Binned:
    """A stream's bytes (and parked bytes) as the most in each time bin, relative to a base;
    the state is constant between events, so bins without an event hold the state carried in."""

    def __init__(self, bins: int) -> None:
        self.bytes = [0] * bins
        self.parked = [0] * bins
        self.last = -1              # last bin filled
        self.base = (0, 0)

    def fill_to(self, b: int, value: tuple[int, int]) -> None:
        for k in range(self.last + 1, b + 1):
            self.bytes[k] = max(self.bytes[k], value[0] - self.base[0])
            self.parked[k] = max(self.parked[k], value[1] - self.base[1])
        self.last = max(self.last, b)

    def at(self, b: int, before: tuple[int, int], after: tuple[int, int]) -> None:
        """An event in bin ``b`` changed the state from ``before`` to ``after``."""
        self.fill_to(b, before)
        self.bytes[b] = max(self.bytes[b], after[0] - self.base[0])
        self.parked[b] = max(self.parked[b], after[1] - self.base[1])


def stream_usage(entries: Sequence[Mapping[str, Any]], names: Mapping[int, str], *, start: int = 0,
                 end: int | None = None, t0_us: float | None = None, t1_us: float | None = None,
                 bins: int = BINS) -> dict[str, Any]:
    """What each stream's blocks did in ``entries[start:end]`` of a memory trace.

    ``entries`` are ``torch.cuda.memory._snapshot()["device_traces"][0]`` dicts (``action``,
    ``addr``, ``size``, ``stream``, ``time_us``); the whole trace is walked so that blocks
    allocated before ``start`` are known. A block is *in flight* from its ``alloc`` to its
    ``free_completed``; it is *parked* between ``free_requested`` and a later
    ``free_completed`` (a free the allocator deferred because ``record_stream`` recorded
    another stream's use, ``CUDACachingAllocator.cpp``, ``free`` and ``process_events``); a free
    whose ``free_completed`` is the very next entry was not deferred.

    Args:
        names: stream handle (``cudaStream_t`` as an int, 0 for the default stream) -> name;
            other streams are named ``stream <handle>``.
        t0_us, t1_us: the time window (``time_us``, host time of the allocator call) of the
            timeline; default the times of the first and last entries in the range.
        bins: time bins of the timeline.

    Returns:
        ``{"streams": {name: {"allocs", "alloc_bytes", "deferred_frees", "max_blocks",
        "max_bytes", "max_parked_blocks", "max_parked_bytes"}}, "timeline": {"bin_ms": width
        of a bin, "streams": {name: {"mib": [...], "parked_mib": [...]}}}, "max_parked_bytes",
        "deferred_frees"}``. Counts and maxima are over the range and include blocks allocated
        before it; a timeline bin holds the most MiB in flight (and parked) on the stream in
        that bin (bin ``b`` starts ``b * bin_ms`` after t0), above what the stream held at
        ``start``, to 0.1 MiB. Only streams that allocated in the range are listed.

    Raises:
        ValueError: a range outside the trace, or bins < 1.
    """
    end = len(entries) if end is None else end
    if not 0 <= start <= end <= len(entries):
        raise ValueError(f"start and end must satisfy 0 <= start <= end <= {len(entries)}, got {start}, {end}")
    if bins < 1:
        raise ValueError(f"bins must be >= 1, got {bins}")
    window = [e for e in entries[start:end] if "time_us" in e]
    t0 = float(t0_us if t0_us is not None else (window[0]["time_us"] if window else 0.0))
    t1 = float(t1_us if t1_us is not None else (window[-1]["time_us"] if window else t0))
    width = max(t1 - t0, 1.0) / bins

    live: dict[int, tuple[str, int]] = {}      # addr -> (stream name, size) of blocks in flight
    parked: set[int] = set()
    cur: dict[str, list[int]] = {}              # stream -> [blocks, bytes, parked blocks, parked bytes]
    usage: dict[str, dict[str, Any]] = {}
    series: dict[str, _Binned] = {}
    parked_now, parked_max = 0, 0
    in_range_streams = {names.get(int(e.get("stream", 0)), f"stream {int(e.get('stream', 0))}")
                        for e in entries[start:end] if e.get("action") == "alloc"}

    def state(s: str) -> list[int]:
        return cur.setdefault(s, [0, 0, 0, 0])

    for i, e in enumerate(entries):
        if i == start:   # the state every listed stream starts the range with
            for s in in_range_streams:
                st = state(s)
                usage[s] = _empty_usage()
                series[s] = _Binned(bins)
                series[s].base = (st[1], st[3])
        action = e.get("action")
        if action not in ("alloc", "free_requested", "free_completed"):
            continue
        addr, size = int(e.get("addr", 0)), int(e.get("size", 0))
        owner = live[addr][0] if addr in live else names.get(int(e.get("stream", 0)), f"stream {int(e.get('stream', 0))}")
        before = tuple(state(owner)[1::2])
        if action == "alloc":
            s = names.get(int(e.get("stream", 0)), f"stream {int(e.get('stream', 0))}")
            live[addr] = (s, size)
            st = state(s)
            st[0] += 1
            st[1] += size
            if start <= i < end:
                usage[s]["allocs"] += 1
                usage[s]["alloc_bytes"] += size
        elif addr not in live:
            continue
        elif action == "free_requested":
            s, size = live[addr]
            nxt = entries[i + 1] if i + 1 < len(entries) else None
            if nxt is not None and nxt.get("action") == "free_completed" and int(nxt.get("addr", 0)) == addr:
                continue   # freed at once: nothing changes until that entry
            parked.add(addr)
            st = state(s)
            st[2] += 1
            st[3] += size
            parked_now += size
            if start <= i < end:
                parked_max = max(parked_max, parked_now)
                if s in usage:
                    usage[s]["deferred_frees"] += 1
        else:   # free_completed
            s, size = live.pop(addr)
            st = state(s)
            st[0] -= 1
            st[1] -= size
            if addr in parked:
                parked.discard(addr)
                st[2] -= 1
                st[3] -= size
                parked_now -= size
        if start <= i < end and s in usage:
            st, u = cur[s], usage[s]
            u["max_blocks"] = max(u["max_blocks"], st[0])
            u["max_bytes"] = max(u["max_bytes"], st[1])
            u["max_parked_blocks"] = max(u["max_parked_blocks"], st[2])
            u["max_parked_bytes"] = max(u["max_parked_bytes"], st[3])
            t = e.get("time_us")
            if t is not None and t0 <= float(t) <= t1:
                series[s].at(min(int((float(t) - t0) / width), bins - 1), before, (st[1], st[3]))
    for s, ser in series.items():   # the state at the end holds to the last bin
        st = state(s)
        ser.fill_to(bins - 1, (st[1], st[3]))
    return {
        "streams": usage,
        "timeline": {"bin_ms": width / 1e3,
                     "streams": {s: {"mib": [round(v / 2**20, 1) for v in ser.bytes],
                                     "parked_mib": [round(v / 2**20, 1) for v in ser.parked]}
                                 for s, ser in series.items()}},
        "max_parked_bytes": parked_max,
        "deferred_frees": sum(u["deferred_frees"] for u in usage.values()),
    }
