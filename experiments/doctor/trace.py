"""Reading a memory snapshot's trace for the allocator doctor, without running any code.

A snapshot is what ``torch.cuda.memory._snapshot()`` returns (or what
``torch.cuda.memory._dump_snapshot(path)`` pickles): ``segments`` (the state at the end),
``device_traces`` (per device, the events since ``_record_memory_history`` was turned on)
and ``allocator_settings``. The doctor also reads its own compact JSON form
(:func:`compact_snapshot`) and a recorded run of
``alloc.doctor_snapshots``.

:func:`load` opens a file with a restricted unpickler that accepts only the plain types a
snapshot is made of (dict, list, tuple, str, bytes, int, float, bool, None): any pickle that
names a class or function is refused before anything in it runs.

Trace format: RULES.md §E.2 and ``torch/cuda/_memory_viz.py`` (``trace``,
``segsum``): each entry has action (alloc, free_requested, free_completed, segment_alloc,
segment_free, segment_map, segment_unmap, snapshot, oom), addr (device_free for oom), size
(the unrounded request for alloc/free_*; bytes for segment_*) and stream.
"""
from __future__ import annotations

import base64
import dataclasses
import io
import json
import pickle
import zlib
from pathlib import Path
from typing import Any, Mapping, Sequence

from .engine import DEFAULT_POOL, Block, Engine, Segment
from .rules import (LARGE_BUFFER, SMALL_BUFFER, SMALL_SIZE, MiB, ROUNDUP_INTERVALS, AllocatorConfig, round_size)

# Event codes: small ints keep the replay loop fast.
ALLOC, FREE_REQ, FREE_DONE, SEG_ALLOC, SEG_FREE, SEG_MAP, SEG_UNMAP, SNAPSHOT, OOM, UNKNOWN = range(10)
ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
           "segment_unmap", "snapshot", "oom")
_CODE = {a: i for i, a in enumerate(ACTIONS)}
IGNORED_ACTIONS = ("annotate", "user_defined")   # markers that do not touch memory
FORMAT = "memlab-snapshot-1"                      # the doctor's compact JSON form (compact_snapshot)


class SnapshotError(ValueError):
    """The input is not a memory snapshot the doctor can read (the message says why)."""


class _PlainUnpickler(pickle.Unpickler):
    """Unpickles only built-in containers and scalars; every global is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise SnapshotError(f"refusing to load {module}.{name} from the pickle: a memory snapshot holds only "
                            "dicts, lists, strings and numbers (is this file really from _dump_snapshot?)")


def load(source: str | Path | bytes | Mapping[str, Any]) -> dict[str, Any]:
    """A snapshot dict from a path (a ``_dump_snapshot`` pickle or a JSON file), bytes, or a dict.

    Raises:
        SnapshotError: the file is missing, truncated, not a pickle or JSON, holds anything but
            plain data, or is not a snapshot.
    """
    if isinstance(source, Mapping):
        data: Any = source
    else:
        if isinstance(source, (str, Path)):
            try:
                raw = Path(source).read_bytes()
            except OSError as e:
                raise SnapshotError(f"cannot read {source}: {e.strerror or e}") from None
            name = str(source)
        elif isinstance(source, bytes):
            raw, name = source, "the bytes given"
        else:
            raise SnapshotError(f"a snapshot is a path, bytes or a dict, got {type(source).__name__}")
        if raw[:1] in (b"{", b"["):
            try:
                data = json.loads(raw)
            except ValueError as e:
                raise SnapshotError(f"{name} is not valid JSON ({e})") from None
        else:
            try:
                data = _PlainUnpickler(io.BytesIO(raw)).load()
            except SnapshotError:
                raise
            except (EOFError, pickle.UnpicklingError, ValueError, TypeError, IndexError, KeyError,
                    OverflowError, MemoryError) as e:
                raise SnapshotError(f"{name} is not a complete memory snapshot pickle "
                                    f"({type(e).__name__}: {e or 'truncated'})") from None
    if isinstance(data, Mapping) and "snapshot" in data and isinstance(data["snapshot"], Mapping):
        run = data
        data = dict(data["snapshot"])
        data.setdefault("recorded_settings", run.get("settings"))
    if not isinstance(data, Mapping) or not ("segments" in data and ("device_traces" in data or "trace_z" in data)):
        raise SnapshotError("not a memory snapshot: expected a dict with 'segments' and 'device_traces' "
                            "(torch.cuda.memory._snapshot() with _record_memory_history on)")
    return dict(data)


@dataclasses.dataclass
class Trace:
    """One device's trace, normalised.

    Attributes:
        events: tuples (code, addr, size, stream), code one of ALLOC ... OOM; for OOM the
            addr is device_free.
        segments: the final state: dicts with address, total_size, stream, pool ('small' or
            'large'), pool_id (tuple), is_expandable and blocks [(address, size, requested, state)].
        settings: the ``PYTORCH_CUDA_ALLOC_CONF`` string the program ran with ('' for defaults).
        config: those settings as an AllocatorConfig.
        total_memory: the device's memory in bytes if the snapshot says (None otherwise).
        cap_bytes: the memory cap if the snapshot says (None otherwise).
        skipped: how many entries of ignored kinds (annotations) were dropped.
        unknown: {event index: action} of entries of kinds the doctor does not know (their
            code is UNKNOWN; the replay stops at the first).
    """

    events: list[tuple[int, int, int, int]]
    segments: list[dict[str, Any]]
    settings: str
    config: AllocatorConfig
    total_memory: int | None = None
    cap_bytes: int | None = None
    skipped: int = 0
    unknown: dict[int, str] = dataclasses.field(default_factory=dict)


def config_from_snapshot(settings: Mapping[str, Any] | None) -> tuple[str, AllocatorConfig]:
    """(settings string, AllocatorConfig) from a snapshot's ``allocator_settings`` dict.

    The dict (torch 2.1+) holds the parsed values: max_split_size (-1 = unlimited),
    garbage_collection_threshold, expandable_segments, roundup_power2_divisions keyed by
    the MiB boundary of each interval ('1', '2', ... '32768'), and the raw
    PYTORCH_CUDA_ALLOC_CONF string; options the dict lacks (large_segment_size_mb,
    max_non_split_rounding_mb) are read from that string.

    Raises:
        SnapshotError: values the allocator would not accept.
    """
    if not settings:
        return "", AllocatorConfig()
    text = str(settings.get("PYTORCH_CUDA_ALLOC_CONF") or "")
    try:
        kw: dict[str, Any] = {}
        mss = settings.get("max_split_size", -1)
        if isinstance(mss, int) and 0 < mss < (1 << 62):
            kw["max_split_size"] = int(mss)
        gc = float(settings.get("garbage_collection_threshold", 0) or 0)
        if gc:
            kw["garbage_collection_threshold"] = gc
        kw["expandable_segments"] = bool(settings.get("expandable_segments", False))
        rd = settings.get("roundup_power2_divisions")
        if isinstance(rd, Mapping) and rd:
            table = [0] * ROUNDUP_INTERVALS
            for k, v in rd.items():
                idx = min(int(k).bit_length() - 1, ROUNDUP_INTERVALS - 1)
                table[idx] = int(v)
            kw["roundup_divisions"] = tuple(table)
        if text:
            from ..core.alloc_conf import parse

            extra = parse(text)
            if "large_segment_size_mb" in extra:
                kw["large_segment_size"] = int(extra["large_segment_size_mb"]) * MiB
            if "max_non_split_rounding_mb" in extra:
                kw["max_non_split_rounding"] = int(extra["max_non_split_rounding_mb"]) * MiB
        return text, AllocatorConfig(**kw)
    except (TypeError, ValueError) as e:
        raise SnapshotError(f"the snapshot's allocator_settings are not valid: {e}") from None


def _trace_rows(snap: Mapping[str, Any], device: int) -> list[Sequence[Any]]:
    if "trace_z" in snap:
        try:
            text = zlib.decompress(base64.b64decode(snap["trace_z"])).decode()
        except (ValueError, zlib.error) as e:
            raise SnapshotError(f"the compact trace is damaged ({e})") from None
        return [line.split(" ") for line in text.split("\n")] if text else []
    traces = snap.get("device_traces")
    if not isinstance(traces, Sequence) or isinstance(traces, (str, bytes)):
        raise SnapshotError("device_traces must be a list (one trace per device)")
    if device >= len(traces):
        if device == 0:
            return []
        raise SnapshotError(f"device must be below {len(traces)} (the devices in the trace), got {device}")
    out = []
    for e in traces[device]:
        if not isinstance(e, Mapping) or "action" not in e:
            raise SnapshotError("each trace entry must be a dict with an 'action'")
        a = e["action"]
        out.append((a, e.get("device_free", 0) if a == "oom" else e.get("addr", 0), e.get("size", 0),
                    e.get("stream", 0)))
    return out


def read(source: str | Path | bytes | Mapping[str, Any], device: int = 0) -> Trace:
    """Load a snapshot (see :func:`load`) and normalise one device's trace.

    Raises:
        SnapshotError: not a snapshot, or entries with non-numeric fields.
    """
    if isinstance(device, bool) or not isinstance(device, int) or device < 0:
        raise SnapshotError(f"device must be a device index >= 0, got {device!r}")
    snap = load(source)
    events, skipped, unknown = [], 0, {}
    for i, row in enumerate(_trace_rows(snap, device)):
        code = _CODE.get(row[0])
        if code is None:
            if row[0] in IGNORED_ACTIONS:
                skipped += 1
                continue
            # kept: the replay stops here and says so (a newer torch may trace more kinds)
            unknown[len(events)] = str(row[0])
            code = UNKNOWN
        try:
            events.append((code, int(row[1]), int(row[2]), int(row[3])))
        except (TypeError, ValueError):
            raise SnapshotError(f"trace entry {i}: addr, size and stream must be integers, got {row[1:]!r}") from None
    segments = []
    raw_segments = snap.get("segments")
    if not isinstance(raw_segments, Sequence):
        raise SnapshotError("'segments' must be a list")
    for s in raw_segments:
        if not isinstance(s, Mapping) or "address" not in s or "blocks" not in s:
            raise SnapshotError("each segment needs 'address', 'total_size' and 'blocks'")
        if int(s.get("device", device)) != device:
            continue
        blocks = []
        for b in s["blocks"]:
            if isinstance(b, Mapping):
                blocks.append((int(b["address"]), int(b["size"]), int(b.get("requested_size", 0)), str(b["state"])))
            else:
                blocks.append((int(b[0]), int(b[1]), int(b[2]), str(b[3])))
        pid = s.get("segment_pool_id") or (0, 0)
        segments.append({"address": int(s["address"]), "total_size": int(s["total_size"]),
                         "stream": int(s.get("stream", 0)), "pool": s.get("segment_type", "large"),
                         "pool_id": (int(pid[0]), int(pid[1])), "is_expandable": bool(s.get("is_expandable")),
                         "blocks": sorted(blocks)})
    text, config = config_from_snapshot(snap.get("allocator_settings"))
    if not text and snap.get("recorded_settings"):
        text = str(snap["recorded_settings"])
    total = snap.get("device_total_bytes")
    cap = snap.get("memory_cap_bytes")
    return Trace(events, segments, text, config, int(total) if total else None, int(cap) if cap else None, skipped,
                 unknown)


def compact_snapshot(snap: Mapping[str, Any], device: int = 0) -> dict[str, Any]:
    """The doctor's compact JSON form of a ``torch.cuda.memory._snapshot()`` dict.

    Returns:
        dict with format ('memlab-snapshot-1'); trace_z: the trace of ``device`` as text,
        one line 'action addr size stream' per entry (for 'oom' the addr slot holds
        device_free), zlib-compressed and base64-encoded so that a recorded file stays small
        and one JSON string; trace_events (the number of entries); segments (per segment:
        address, total_size, stream, segment_type, segment_pool_id, is_expandable, blocks as
        [address, size, requested_size, state]) and allocator_settings. Frames, times and
        annotations are dropped: the doctor does not need them.
    """
    traces = snap.get("device_traces") or [[]]
    trace = traces[device] if device < len(traces) else []
    lines = []
    for e in trace:
        addr = e.get("device_free", 0) if e["action"] == "oom" else e.get("addr", 0)
        lines.append(f"{e['action']} {int(addr)} {int(e.get('size', 0))} {int(e.get('stream', 0))}")
    packed = base64.b64encode(zlib.compress("\n".join(lines).encode(), 9)).decode()
    segs = []
    for s in snap.get("segments", []):
        if int(s.get("device", 0)) != device:
            continue
        segs.append({
            "address": int(s["address"]), "total_size": int(s["total_size"]), "stream": int(s.get("stream", 0)),
            "segment_type": s.get("segment_type", "large"),
            "segment_pool_id": [int(x) for x in s.get("segment_pool_id", (0, 0))],
            "is_expandable": bool(s.get("is_expandable", False)),
            "blocks": [[int(b["address"]), int(b["size"]), int(b.get("requested_size", 0)), str(b["state"])]
                       for b in s["blocks"]],
        })
    settings = snap.get("allocator_settings", {})
    return {"format": FORMAT, "trace_events": len(lines), "trace_z": packed, "segments": segs,
            "allocator_settings": {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in settings.items()}}


@dataclasses.dataclass
class StartState:
    """What :func:`starting_state` rebuilt: blocks as (address, engine block, stream, pool id),
    segment or range bases as (base, size, pool id), their reserved bytes, and a reason when
    the start could not be rebuilt (None if it could)."""

    blocks: list[tuple[int, Any, int, tuple[int, int]]] = dataclasses.field(default_factory=list)
    bases: list[tuple[int, int, tuple[int, int]]] = dataclasses.field(default_factory=list)
    reserved: int = 0
    unsupported: str | None = None



def seed_segment(engine: Engine, addr: int, size: int, stream: int, pool_id: tuple[int, int], small: bool,
                 blocks: list[tuple[int, int, int]], *, expandable: bool = False,
                 mapped: list[tuple[int, int]] | None = None) -> dict[int, Any]:
    """Create a segment that existed before a trace began (for late-started recordings).

    Args:
        blocks: live blocks as (address, size, requested_size) inside the segment; the
            gaps become free blocks (merged, in the free lists).
        mapped: for an expandable range, the mapped runs as (address, size); the rest of
            the range stays unmapped.

    Returns:
        {address: block} of the live blocks.
    """
    seg = Segment(addr, size, stream, pool_id, small, expandable)
    engine._segments[addr] = seg
    if expandable:
        engine._ranges.setdefault((pool_id, small, stream), []).append(seg)
    fl = engine._list(pool_id, small, stream)
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
        engine.reserved_bytes += rs
    if pos < addr + size:
        pieces.append((pos, addr + size - pos, "unmapped", 0))
    out, prev = {}, None
    for pa, ps, kind, req in pieces:
        b = Block(pa, ps, seg, prev, None, mapped=kind != "unmapped")
        if prev is None:
            seg.head = b
        else:
            prev.next = b
        prev = b
        if kind == "live":
            b.allocated, b.requested = True, req
            engine.allocated_bytes += ps
            engine.active_bytes += ps
            out[pa] = b
        elif kind == "free":
            engine._insert_free(fl, b)
        else:
            fl.unmapped[pa] = b
    return out



def starting_state(trace: Trace, engine: Any) -> StartState:
    """The segments and blocks that existed before a late-started recording, put into ``engine``.

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
    for code, addr, size, stream in ev:
        if code == SEG_ALLOC:
            live_segs.add(addr)
        elif code == SEG_FREE:
            if addr not in live_segs:
                init_segs.setdefault(addr, (size, stream))
            live_segs.discard(addr)
        elif code == ALLOC:
            live_blocks.add(addr)
        elif code == FREE_REQ:
            if addr not in live_blocks:
                init_blocks.setdefault(addr, (size, stream))
                live_blocks.add(addr)
        elif code == FREE_DONE:
            live_blocks.discard(addr)
    final_blocks = {}
    for s in trace.segments:
        if not s["is_expandable"] and s["address"] not in live_segs and s["address"] not in init_segs:
            init_segs[s["address"]] = (s["total_size"], s["stream"])
        for a, size, req, st in s["blocks"]:
            if st != "inactive" and a not in live_blocks and a not in init_blocks:
                final_blocks[a] = (size, req)
    if not init_segs and not init_blocks and not final_blocks:
        return state
    if trace.config.expandable_segments:
        _seed_ranges(trace, engine, state, init_blocks, final_blocks)
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
                if 0 < end - (a + n) <= SMALL_SIZE:
                    blocks[k] = (a, end - a, req)
        made = seed_segment(engine, base, size, stream, pool, small, blocks)
        state.bases.append((base, size, pool))
        state.reserved += size
        state.blocks += [(a, blk, stream, pool) for a, blk in sorted(made.items())]
    return state

def _seed_ranges(trace: Trace, engine: Any, state: "StartState", init_blocks: dict[int, tuple[int, int]],
                 final_blocks: dict[int, tuple[int, int]]) -> None:
    """Expandable segments at the start: the final mapped runs, with the trace's maps taken
    away and its unmaps put back (walking it backwards), grouped into one range per
    (stream, pool); a range's base is taken as its lowest mapped address."""
    eng, ev = engine, trace.events
    groups: list[dict[str, Any]] = []

    def find(addr: int, stream: int) -> dict[str, Any] | None:
        return next((g for g in groups if g["stream"] == stream and abs(addr - g["base"]) < g["size"]), None)

    for s in sorted((s for s in trace.segments if s["is_expandable"]), key=lambda s: s["address"]):
        g = find(s["address"], s["stream"])
        if g is None:
            small = s["pool"] == "small"
            g = {"base": s["address"], "size": eng.range_size(small), "stream": s["stream"],
                 "pool": s["pool_id"], "small": small, "pages": set()}
            groups.append(g)
        g["pages"] |= set(range(s["address"], s["address"] + s["total_size"], SMALL_BUFFER))
    for code, addr, size, stream in reversed(ev):
        if code not in (SEG_MAP, SEG_UNMAP):
            continue
        g = find(addr, stream)
        if g is None:
            small = size % LARGE_BUFFER != 0
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
        made = seed_segment(eng, base, g["size"], g["stream"], g["pool"], g["small"], inside, expandable=True,
                            mapped=runs)
        state.bases.append((base, g["size"], g["pool"]))
        state.reserved += sum(n for _, n in runs)
        state.blocks += [(a, blk, g["stream"], g["pool"]) for a, blk in sorted(made.items())]


__all__ = ["ACTIONS", "FORMAT", "compact_snapshot", "SnapshotError", "StartState", "Trace", "config_from_snapshot", "load", "read", "seed_segment",
           "starting_state"]
