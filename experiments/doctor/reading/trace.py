"""Reading a memory snapshot's trace for the allocator doctor, without running any code.

A snapshot is what ``torch.cuda.memory._snapshot()`` returns (or what
``torch.cuda.memory._dump_snapshot(path)`` pickles): ``segments`` (the state at the end),
``device_traces`` (per device, the events since ``_record_memory_history`` was turned on)
and ``allocator_settings``. The doctor also reads its own compact JSON form
(:func:`compact_snapshot`) and a recorded run of ``alloc.doctor_snapshots``.

Files are opened by the one restricted, bounded loader (:mod:`experiments.doctor.reading.loader`):
a pickle that names a class or function is refused before anything in it runs, and every
size is checked before the memory is spent. :func:`read` then checks the fields the doctor
uses (types, ranges, and that the final blocks tile their segments) and keeps one device's
trace as columns (:class:`Events`), about 30 bytes an event.

Trace format: RULES.md §E.2 and ``torch/cuda/_memory_viz.py`` (``trace``,
``segsum``): each entry has action (alloc, free_requested, free_completed, segment_alloc,
segment_free, segment_map, segment_unmap, snapshot, oom), addr (device_free for oom), size
(the unrounded request for alloc/free_*; bytes for segment_*) and stream.
"""
from __future__ import annotations

import base64
import dataclasses
import zlib
from array import array
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from ..errors import ImpossibleTraceError, SnapshotError
from ...core.units import MiB
from ..model.rules import ROUNDUP_INTERVALS, AllocatorConfig
from .loader import DEFAULT_LIMITS, Limits, load, trace_rows
from .rows import (ACTIONS, ADDR_LIMIT, ALLOC, ANNOTATE_CODE, FREE_DONE, FREE_REQ, IGNORED_CODE, SIZE_LIMIT, SNAPSHOT,
                   UNKNOWN, Rows)

FORMAT = "memlab-snapshot-1"                      # the doctor's compact JSON form (compact_snapshot)


class Events(Sequence):
    """A trace's events as columns: ``codes`` (array of ALLOC ... OOM, UNKNOWN), ``addrs``
    (device_free for OOM), ``sizes`` and ``streams`` (arrays of int64). ``events[i]`` is the
    tuple (code, addr, size, stream); iterating yields those tuples."""

    __slots__ = ("codes", "addrs", "sizes", "streams")

    def __init__(self, codes: Any = None, addrs: Any = None, sizes: Any = None, streams: Any = None) -> None:
        self.codes = codes if codes is not None else array("B")
        self.addrs = addrs if addrs is not None else array("q")
        self.sizes = sizes if sizes is not None else array("q")
        self.streams = streams if streams is not None else array("q")

    @classmethod
    def of(cls, events: Sequence[tuple[int, int, int, int]]) -> "Events":
        """From (code, addr, size, stream) tuples (tests, synthetic traces)."""
        if isinstance(events, Events):
            return events
        out = cls()
        for c, a, s, st in events:
            out.append(c, a, s, st)
        return out

    def append(self, code: int, addr: int, size: int, stream: int) -> None:
        self.codes.append(code)
        self.addrs.append(addr)
        self.sizes.append(size)
        self.streams.append(stream)

    def __len__(self) -> int:
        return len(self.codes)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        return (self.codes[i], self.addrs[i], self.sizes[i], self.streams[i])

    def __iter__(self) -> Iterator[tuple[int, int, int, int]]:
        return zip(self.codes, self.addrs, self.sizes, self.streams)

    def __reversed__(self) -> Iterator[tuple[int, int, int, int]]:
        return zip(reversed(self.codes), reversed(self.addrs), reversed(self.sizes), reversed(self.streams))

    def __eq__(self, other: Any) -> bool:
        return list(self) == list(other) if isinstance(other, (Events, list, tuple)) else NotImplemented

    __hash__ = None  # type: ignore[assignment]


@dataclasses.dataclass
class Trace:
    """One device's trace, normalised.

    Attributes:
        events: :class:`Events` (code, addr, size, stream), code one of ALLOC ... OOM; for
            OOM the addr is device_free.
        segments: the final state: dicts with address, total_size, stream, pool ('small' or
            'large'), pool_id (tuple), is_expandable and blocks [(address, size, requested, state)].
        settings: the ``PYTORCH_CUDA_ALLOC_CONF`` string the program ran with ('' for defaults).
        config: those settings as an AllocatorConfig.
        total_memory: the device's memory in bytes if the snapshot says (None otherwise).
        cap_bytes: the memory cap if the snapshot says (None otherwise).
        skipped: how many entries of ignored kinds (annotations) were dropped.
        unknown: {event index: action} of entries of kinds the doctor does not know (their
            code is UNKNOWN; the replay stops at the first).
        stacks: per event, an index into ``stack_table`` (-1: no stack recorded), or None
            when the snapshot has no stacks; ``stack_table`` holds each stack as a tuple of
            (filename, line, name), innermost frame first.
        block_stacks: {block address: stack} for the blocks of the final state that carry one.
        pool_ids: per event, an index into ``pool_table`` of the entry's ``pool_id`` (torch
            2.12+ writes one on every entry; -1 where one is missing), or None for older layouts.
        fwd_stacks: per event, the stack of ``forward_frames`` (the forward pass's stack of an
            allocation made in the backward pass, torch 2.12+), an index into ``stack_table``,
            or None when no entry has one.
        layout: the release whose snapshot layout this is, as far as it shows: '2.11' (no
            ``pool_id``: 2.11 or before), '2.12' (``pool_id`` on the entries: 2.12 or 2.13),
            '2.14' (also ``annotate`` entries or the host allocator's keys).
    """

    events: Events
    segments: list[dict[str, Any]]
    settings: str
    config: AllocatorConfig
    total_memory: int | None = None
    cap_bytes: int | None = None
    skipped: int = 0
    unknown: dict[int, str] = dataclasses.field(default_factory=dict)
    stacks: Any = None
    stack_table: list[tuple] = dataclasses.field(default_factory=list)
    block_stacks: dict[int, tuple] = dataclasses.field(default_factory=dict)
    pool_ids: Any = None
    pool_table: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    fwd_stacks: Any = None
    layout: str = "2.11"
    skipped_actions: tuple[str, ...] | None = None

    def pool_of(self, event: int) -> tuple[int, int] | None:
        """The ``pool_id`` trace event ``event`` carries (torch 2.12+), or None."""
        if self.pool_ids is None:
            return None
        p = self.pool_ids[event]
        return self.pool_table[p] if p >= 0 else None

    def forward_frames(self, event: int) -> list[tuple[str, int, str]]:
        """The forward pass's stack recorded with a backward allocation ([] if none)."""
        if self.fwd_stacks is None or not 0 <= event < len(self.fwd_stacks):
            return []
        s = self.fwd_stacks[event]
        return list(self.stack_table[s]) if s >= 0 else []

    def __post_init__(self) -> None:
        if not isinstance(self.events, Events):
            self.events = Events.of(self.events)

    def frames(self, event: int) -> list[tuple[str, int, str]]:
        """The stack recorded with trace event ``event``: (filename, line, name), innermost first."""
        if self.stacks is None or not 0 <= event < len(self.stacks):
            return []
        s = self.stacks[event]
        return list(self.stack_table[s]) if s >= 0 else []


def _setting(settings: Mapping[str, Any], name: str, kinds: tuple[type, ...], default: Any) -> Any:
    v = settings.get(name, default)
    if v is None:
        return default
    if type(v) not in kinds:
        raise SnapshotError(f"allocator_settings: '{name}' must be {' or '.join(k.__name__ for k in kinds)}, "
                            f"got {type(v).__name__} {str(v)[:40]!r}")
    return v


def config_from_snapshot(settings: Mapping[str, Any] | None) -> tuple[str, AllocatorConfig]:
    """(settings string, AllocatorConfig) from a snapshot's ``allocator_settings`` dict.

    The dict (torch 2.1+) holds the parsed values: max_split_size (-1 = unlimited),
    garbage_collection_threshold, expandable_segments, roundup_power2_divisions keyed by
    the MiB boundary of each interval ('1', '2', ... '32768'), and the raw
    PYTORCH_CUDA_ALLOC_CONF string; options the dict lacks (large_segment_size_mb,
    max_non_split_rounding_mb) are read from that string.

    Raises:
        SnapshotError: a field of the wrong type, or values the allocator would not accept
            (the message names the field).
    """
    if settings is None or (isinstance(settings, Mapping) and not settings):
        return "", AllocatorConfig()
    if not isinstance(settings, Mapping):
        raise SnapshotError(f"'allocator_settings' must be a dict, got {type(settings).__name__}")
    text = _setting(settings, "PYTORCH_CUDA_ALLOC_CONF", (str,), "")
    try:
        kw: dict[str, Any] = {}
        mss = _setting(settings, "max_split_size", (int,), -1)
        if 0 < mss < (1 << 62):
            kw["max_split_size"] = mss
        gc = _setting(settings, "garbage_collection_threshold", (int, float), 0)
        if gc:
            kw["garbage_collection_threshold"] = float(gc)
        kw["expandable_segments"] = _setting(settings, "expandable_segments", (bool,), False)
        rd = _setting(settings, "roundup_power2_divisions", (dict,), {})
        if rd:
            table = [0] * ROUNDUP_INTERVALS
            for k, v in list(rd.items())[:64]:
                if type(k) is not str or not k.isdigit() or len(k) > 8 or type(v) is not int:
                    raise SnapshotError(f"allocator_settings: 'roundup_power2_divisions' maps MiB sizes to "
                                        f"division counts, got {str(k)[:20]!r}: {str(v)[:20]!r}")
                idx = min(max(int(k).bit_length() - 1, 0), ROUNDUP_INTERVALS - 1)
                table[idx] = v
            kw["roundup_divisions"] = tuple(table)
        if text:
            # what the dict lacks, from the string torch parsed (names it does not know are
            # newer options or another build's: torch accepted them; named in a warning)
            extra = AllocatorConfig.from_settings(text, lenient=True)
            names = {p.partition(":")[0].strip() for p in text.split(",")}
            if "large_segment_size_mb" in names:
                kw["large_segment_size"] = extra.large_segment_size
            if "max_non_split_rounding_mb" in names:
                kw["max_non_split_rounding"] = extra.max_non_split_rounding
            kw["throw_on_cudamalloc_oom"] = extra.throw_on_cudamalloc_oom
            kw["memory_fraction"] = extra.memory_fraction
        return text, AllocatorConfig(**kw)
    except SnapshotError:
        raise
    except (TypeError, ValueError) as e:
        raise SnapshotError(f"the snapshot's allocator_settings are not valid: {e}") from None


def _int_field(obj: Mapping[str, Any], name: str, where: str, limit: int, default: Any = ...) -> int:
    v = obj.get(name, default)
    if v is ...:
        raise SnapshotError(f"{where}: '{name}' is missing")
    if type(v) is not int or not 0 <= v < limit:
        text = repr(v)
        raise SnapshotError(f"{where}: '{name}' must be a whole number in [0, {limit:#x}), got "
                            f"{text if len(text) < 50 else text[:47] + '...'}")
    return v


def _segments(snap: Mapping[str, Any], device: int, limits: Limits) -> tuple[list[dict[str, Any]], dict[int, tuple]]:
    """The final state, checked: types, ranges, blocks that tile their segment, no overlaps."""
    raw = snap.get("segments")
    if isinstance(raw, (str, bytes, Mapping)) or not isinstance(raw, Sequence):
        raise SnapshotError(f"'segments' must be a list, got {type(raw).__name__}")
    if len(raw) > limits.max_segments:
        raise SnapshotError(f"{len(raw):,} segments is over the limit of {limits.max_segments:,}")
    for k, s in enumerate(raw):
        if not isinstance(s, Mapping):
            raise SnapshotError(f"segments[{k}] must be a dict, got {type(s).__name__}")
        bl = s.get("blocks")
        if isinstance(bl, (str, bytes, Mapping)) or not isinstance(bl, Sequence):
            raise SnapshotError(f"segments[{k}]: 'blocks' must be a list, got {type(bl).__name__}")
    # lengths first: shared references can make a small file describe billions of blocks
    nblocks = sum(len(s["blocks"]) for s in raw)
    if nblocks > limits.max_blocks:
        raise SnapshotError(f"the segments hold {nblocks:,} blocks, over the limit of {limits.max_blocks:,}")
    out, stacks = [], {}
    for k, s in enumerate(raw):
        where = f"segments[{k}]"
        dev = s.get("device", device)
        if type(dev) is not int:
            raise SnapshotError(f"{where}: 'device' must be a whole number, got {type(dev).__name__}")
        if dev != device:
            continue
        addr = _int_field(s, "address", where, ADDR_LIMIT)
        total = _int_field(s, "total_size", where, SIZE_LIMIT)
        stream = _int_field(s, "stream", where, ADDR_LIMIT, 0)
        pool = s.get("segment_type", "large")
        if pool not in ("small", "large"):
            raise SnapshotError(f"{where}: 'segment_type' must be 'small' or 'large', got {str(pool)[:20]!r}")
        pid = s.get("segment_pool_id") or (0, 0)
        if not isinstance(pid, (list, tuple)) or len(pid) != 2 or any(type(x) is not int for x in pid):
            raise SnapshotError(f"{where}: 'segment_pool_id' must be a pair of whole numbers, got {str(pid)[:40]}")
        expandable = s.get("is_expandable", False)
        if type(expandable) is not bool:
            raise SnapshotError(f"{where}: 'is_expandable' must be True or False, got {str(expandable)[:20]}")
        blocks = []
        for j, b in enumerate(s["blocks"]):
            bw = f"{where}.blocks[{j}]"
            if isinstance(b, Mapping):
                ba = _int_field(b, "address", bw, ADDR_LIMIT)
                bs = _int_field(b, "size", bw, SIZE_LIMIT)
                req = _int_field(b, "requested_size", bw, SIZE_LIMIT, 0)
                st = b.get("state")
                fr = b.get("frames")
                if fr:
                    stacks[ba] = _stack_of(fr)
            elif isinstance(b, (list, tuple)) and len(b) == 4:
                ba, bs, req, st = b
                for name, v, lim in (("address", ba, ADDR_LIMIT), ("size", bs, SIZE_LIMIT), ("requested_size", req, SIZE_LIMIT)):
                    _int_field({name: v}, name, bw, lim)
            else:
                raise SnapshotError(f"{bw} must be a dict or [address, size, requested_size, state]")
            if st not in ("active_allocated", "active_pending_free", "inactive"):
                raise SnapshotError(f"{bw}: 'state' must be active_allocated, active_pending_free or inactive, "
                                    f"got {str(st)[:30]!r}")
            blocks.append((ba, bs, req, st))
        blocks.sort()
        pos = addr
        for j, (ba, bs, _, _) in enumerate(blocks):
            if ba != pos:
                what = "overlaps the block before it" if ba < pos else "leaves a gap before it"
                raise SnapshotError(f"{where}: the block at {ba:#x} {what} (blocks must tile their segment; an "
                                    "impossible layout)")
            pos = ba + bs
        if blocks and pos != addr + total:
            raise SnapshotError(f"{where}: its blocks add up to {pos - addr:,} bytes, not its total_size {total:,}")
        out.append({"address": addr, "total_size": total, "stream": stream, "pool": pool,
                    "pool_id": (pid[0], pid[1]), "is_expandable": expandable, "blocks": blocks})
    out.sort(key=lambda s: s["address"])
    for a, b in zip(out, out[1:]):
        if a["address"] + a["total_size"] > b["address"]:
            raise SnapshotError(f"the segments at {a['address']:#x} and {b['address']:#x} overlap (an impossible layout)")
    return out, stacks


def _stack_of(frames: Any) -> tuple:
    if isinstance(frames, tuple):            # a stack the loader already interned
        return frames
    if not isinstance(frames, list):
        return ()
    return tuple((str(f.get("filename", "?"))[:500], f.get("line") if type(f.get("line")) is int else 0,
                  str(f.get("name", "?"))[:200]) for f in frames[:200] if isinstance(f, Mapping))


def read(source: str | Path | bytes | Mapping[str, Any], device: int = 0, limits: Limits = DEFAULT_LIMITS) -> Trace:
    """Load a snapshot (:func:`experiments.doctor.reading.loader.load`) and normalise one device's trace.

    Raises:
        SnapshotError: not a snapshot, a field of the wrong type or out of range, an
            impossible layout (named by field, segment or trace entry), or a limit exceeded.
    """
    if isinstance(device, bool) or not isinstance(device, int) or device < 0:
        raise SnapshotError(f"device must be a device index >= 0, got {device!r}")
    snap = load(source, limits)
    rows = trace_rows(snap, device, limits)
    events, stacks, unknown, skipped, pools, fwd = _events_of(rows)
    if 0 in events.sizes:
        for i, (c, s) in enumerate(zip(events.codes, events.sizes)):
            if s == 0 and c != SNAPSHOT and c != UNKNOWN:
                raise ImpossibleTraceError(f"trace entry {i} ({ACTIONS[c]}): 'size' is 0 (the allocator never "
                                           "records a zero-byte request or segment; an impossible trace)")
    segments, block_stacks = _segments(snap, device, limits)
    text, config = config_from_snapshot(snap.get("allocator_settings"))
    recorded = snap.get("recorded_settings")
    if not text and recorded:
        if not isinstance(recorded, str):
            raise SnapshotError(f"'recorded_settings' must be a string, got {type(recorded).__name__}")
        text = recorded
    total = snap.get("device_total_bytes")
    cap = snap.get("memory_cap_bytes")
    for name, v in (("device_total_bytes", total), ("memory_cap_bytes", cap)):
        if v is not None and (type(v) is not int or not 0 <= v < SIZE_LIMIT):
            raise SnapshotError(f"'{name}' must be a whole number of bytes in [0, {SIZE_LIMIT:#x}), got {str(v)[:40]!r}")
    layout = "2.11"
    if pools is not None:
        layout = "2.12"
    if (skipped and ANNOTATE_CODE in rows.codes) or "host_segments" in snap or "host_traces" in snap:
        layout = "2.14"
    codes = events.codes
    skipped_actions = tuple(name for name, gone, seen in (
        ("free_requested", FREE_REQ, FREE_DONE), ("free_completed", FREE_DONE, FREE_REQ), ("alloc", ALLOC, FREE_REQ))
        if gone not in codes and seen in codes) or None
    return Trace(events, segments, text, config, total or None, cap or None, skipped, unknown,
                 stacks, rows.stack_table, block_stacks, pools, rows.pool_table, fwd, layout, skipped_actions)


def _events_of(rows: Rows) -> tuple[Events, Any, dict[int, str], int, Any, Any]:
    """Rows -> Events, dropping annotations; the columns are shared when there are none."""
    codes = rows.codes
    if IGNORED_CODE not in codes and ANNOTATE_CODE not in codes:
        return (Events(codes, rows.addrs, rows.sizes, rows.streams), rows.stacks, dict(rows.unknown), 0,
                rows.pools, rows.fwd)
    keep = [i for i, c in enumerate(codes) if c < IGNORED_CODE]
    ev = Events(array("B", [codes[i] for i in keep]), array("q", [rows.addrs[i] for i in keep]),
                array("q", [rows.sizes[i] for i in keep]), array("q", [rows.streams[i] for i in keep]))
    new_index = {old: new for new, old in enumerate(keep)}
    unknown = {new_index[i]: a for i, a in rows.unknown.items() if i in new_index}
    stacks = array("i", [rows.stacks[i] for i in keep]) if rows.stacks is not None else None
    pools = array("i", [rows.pools[i] for i in keep]) if rows.pools is not None else None
    fwd = array("i", [rows.fwd[i] for i in keep]) if rows.fwd is not None else None
    return ev, stacks, unknown, len(codes) - len(keep), pools, fwd


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


__all__ = ["ACTIONS", "Events", "FORMAT", "Trace", "compact_snapshot", "config_from_snapshot", "read"]
