"""The one loader of memory snapshots: restricted (no code runs) and bounded (limits checked
before the memory is spent). Every path that opens a snapshot comes through :func:`load`: the
``doctor`` command, :func:`experiments.doctor.doctor`, chapter 1's ``al.load_snapshot``.

Accepted inputs: a ``torch.cuda.memory._dump_snapshot`` pickle (protocols 0 to 5; torch writes
4, Python 3.14's default is 5), the same gzip'd, a JSON file in torch's dict form, the
doctor's compact JSON form (:func:`experiments.doctor.reading.trace.compact_snapshot`, whose trace is
zlib-compressed text), a recorded run of ``alloc.doctor_snapshots``, or an already loaded
dict (``torch.cuda.memory._snapshot()``).

Errors: :class:`~experiments.doctor.errors.InputError` (a subclass of ValueError) for anything wrong with what the user
gave: a missing or unreadable file, a pickle that names code, a limit exceeded, a wrong field
type or an impossible value, each in one line naming the field and, for trace entries, the
entry. Any other exception out of the doctor is a bug in it (the command line says so).
"""
from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import os
import zlib
from array import array
from pathlib import Path
from typing import Any, Mapping, Sequence

from ...core.units import format_bytes
from ..errors import PickleRefused, SnapshotError, SnapshotNotFoundError
from .rows import ACTION_CODE, ADDR_LIMIT, OOM_CODE, SIZE_LIMIT, UNKNOWN_CODE, Rows
from .unpickler import Reader

GZIP_MAGIC = b"\x1f\x8b"


@dataclasses.dataclass(frozen=True)
class Limits:
    """What the loader accepts, checked before the memory is spent.

    Attributes:
        max_file_bytes: the largest input file (as stored, compressed or not).
        max_bytes: the largest snapshot once decompressed (a gzip'd pickle, or the text of a
            compact trace); decompression stops there.
        max_json_bytes: the largest JSON input in torch's dict form (read whole: about ten
            times its size in memory).
        budget_bytes: memory the objects outside the trace tables (segments, blocks, settings,
            stack frames) may take while a pickle is read.
        max_events: trace entries, all devices together.
        max_segments, max_blocks: segments, and blocks of all segments together.
        max_depth: nesting of containers in a pickle or JSON file.
        trace_z_ratio: the most a compact trace's text may expand over its compressed size.
    """

    max_file_bytes: int = 4 << 30
    max_bytes: int = 512 << 20
    max_json_bytes: int = 128 << 20
    budget_bytes: int = 512 << 20
    max_events: int = 50_000_000
    max_segments: int = 1_000_000
    max_blocks: int = 20_000_000
    max_depth: int = 1000
    trace_z_ratio: int = 64


DEFAULT_LIMITS = Limits()


def _name_of(source: Any) -> str:
    return str(source) if isinstance(source, (str, Path)) else "the snapshot"


def read_bytes(path: str | Path, limits: Limits = DEFAULT_LIMITS) -> bytes | bytearray:
    """The file's bytes, gunzipped if it is gzip'd, within ``limits``.

    Raises:
        InputError: missing (SnapshotNotFoundError, also a FileNotFoundError) or unreadable, larger than ``max_file_bytes``, or decompressing to
            more than ``max_bytes`` (the decompression stops there: a zlib bomb costs nothing).
    """
    try:
        size = os.stat(path).st_size
        if size > limits.max_file_bytes:
            raise SnapshotError(f"{path} is {format_bytes(size)}; the doctor reads files up to "
                                f"{format_bytes(limits.max_file_bytes)}")
        with open(path, "rb") as f:
            raw = f.read(size + 1)       # a file that grew since: caught just below
        if len(raw) > limits.max_file_bytes:
            raise SnapshotError(f"{path} is over {format_bytes(limits.max_file_bytes)}, the most the doctor reads")
    except OSError as e:
        cls = SnapshotNotFoundError if isinstance(e, FileNotFoundError) else SnapshotError
        raise cls(f"cannot read {path}: {e.strerror or e}") from None
    if raw[:2] == GZIP_MAGIC:
        raw = gunzip(raw, limits.max_bytes, str(path))
    return raw


def gunzip(raw: bytes, max_bytes: int, name: str = "the input") -> bytearray:
    """Decompress gzip ``raw`` (all members), refusing output above ``max_bytes`` (checked as
    it grows, so a zlib bomb costs at most about ``max_bytes``). The output is one bytearray,
    sized from the gzip trailer when that is plausible: no second copy of it is ever made.

    Raises:
        SnapshotError: damaged or truncated data, or more than ``max_bytes`` once decompressed.
    """
    # the gzip trailer says the last member's size (mod 2**32): a naive bomb stops here at once
    isize = int.from_bytes(raw[-4:], "little") if len(raw) >= 18 else 0
    if isize > max_bytes:
        raise SnapshotError(f"{name} says it decompresses to {format_bytes(isize)}, over the limit of "
                            f"{format_bytes(max_bytes)}; if it is a real snapshot, raise it (--max-bytes)")
    out = bytearray(min(isize, 256 * len(raw)))   # a lying trailer costs little
    total = 0
    data = raw
    try:
        while data:
            d = zlib.decompressobj(wbits=31)
            tail = data
            while not d.eof:
                chunk = d.decompress(tail, min(1 << 20, max_bytes - total + 1))
                tail = d.unconsumed_tail
                n = len(chunk)
                if total + n > max_bytes:
                    raise SnapshotError(f"{name} decompresses to more than {format_bytes(max_bytes)}; if it is a "
                                        "real snapshot, raise the limit (--max-bytes)")
                if total + n <= len(out):
                    out[total:total + n] = chunk
                else:
                    del out[total:]
                    out += chunk
                total += n
                if not chunk and not tail:
                    break
            if not d.eof:
                raise SnapshotError(f"{name} is a truncated gzip file")
            data = d.unused_data
            if data[:2] != GZIP_MAGIC:
                break
    except zlib.error as e:
        raise SnapshotError(f"{name} is not a valid gzip file ({e})") from None
    del out[total:]
    return out


def load(source: str | Path | bytes | Mapping[str, Any], limits: Limits = DEFAULT_LIMITS, *,
         need_trace: bool = True) -> Any:
    """A snapshot dict from a path, bytes, or a dict (see the module docstring).

    The traces of a pickle come back as :class:`experiments.doctor.reading.rows.Rows` tables
    (they read like lists of dicts); a dict given as such is returned with its traces as they
    are. A recorded run of ``alloc.doctor_snapshots`` is unwrapped to its snapshot, with the
    run's settings as ``recorded_settings``.

    ``need_trace=False`` also accepts a snapshot without a trace (a dict with 'segments') or
    the list of segments of ``torch.cuda.memory_snapshot()`` (chapter 1 reads layouts).

    Raises:
        SnapshotError: not readable within ``limits``, code in a pickle, or not a snapshot.
    """
    name = _name_of(source)
    if isinstance(source, Mapping):
        data: Any = source
    else:
        if isinstance(source, (str, Path)):
            raw = read_bytes(source, limits)
        elif isinstance(source, (bytes, bytearray, memoryview)):
            raw = bytes(source)
            name = "the bytes given"
            if len(raw) > limits.max_file_bytes:
                raise SnapshotError(f"{name} are over {limits.max_file_bytes} bytes")
            if raw[:2] == GZIP_MAGIC:
                raw = gunzip(raw, limits.max_bytes, name)
        else:
            raise SnapshotError(f"a snapshot is a path, bytes or a dict, got {type(source).__name__}")
        data = _parse(raw, name, limits)
    if isinstance(data, Mapping) and "snapshot" in data and isinstance(data["snapshot"], Mapping):
        run = data
        data = dict(data["snapshot"])
        settings = run.get("settings")
        if settings is not None and not isinstance(settings, str):
            raise SnapshotError(f"{name}: the run's 'settings' must be a string, got {type(settings).__name__}")
        data.setdefault("recorded_settings", settings)
    if not need_trace and (isinstance(data, list) or isinstance(data, Mapping) and "segments" in data):
        return data if isinstance(data, list) else dict(data)
    if not isinstance(data, Mapping) or not ("segments" in data and ("device_traces" in data or "trace_z" in data)):
        raise SnapshotError(f"{name} is not a memory snapshot: expected a dict with 'segments' and "
                            "'device_traces' (torch.cuda.memory._snapshot() with _record_memory_history on)")
    return dict(data)


def _parse(raw: bytes, name: str, limits: Limits) -> Any:
    head = raw[:64].lstrip()
    if head[:1] in (b"{", b"["):
        if len(raw) > limits.max_json_bytes:
            raise SnapshotError(f"{name} is a JSON file of {format_bytes(len(raw))}; the doctor reads JSON up to "
                                f"{format_bytes(limits.max_json_bytes)} (give it the pickle instead)")
        try:
            return json.loads(raw, parse_constant=_no_constant)
        except RecursionError:
            raise SnapshotError(f"{name} nests deeper than JSON can be read") from None
        except (ValueError, UnicodeDecodeError) as e:
            raise SnapshotError(f"{name} is not valid JSON ({str(e)[:120]})") from None
    if not raw:
        raise SnapshotError(f"{name} is empty")
    try:
        return Reader(raw, budget_bytes=limits.budget_bytes, max_rows=limits.max_events,
                      max_depth=limits.max_depth).load()
    except PickleRefused as e:
        raise SnapshotError(f"{name}: {e}") from None
    except (IndexError, UnicodeDecodeError, OverflowError, ValueError) as e:
        # the opcodes read past the end of a truncated file, or held a malformed argument
        raise SnapshotError(f"{name} is not a complete memory snapshot pickle ({type(e).__name__}: "
                            f"{str(e)[:100] or 'truncated'})") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a snapshot holds")


# ----------------------------------------------------------------------------- traces

def _check_int(value: Any, what: str, limit: int) -> int:
    if type(value) is not int or not 0 <= value < limit:
        text = repr(value)
        raise SnapshotError(f"{what} must be a whole number in [0, {limit:#x}), got "
                            f"{text if len(text) < 60 else text[:57] + '...'}")
    return value


def rows_from_dicts(entries: Sequence[Any], limits: Limits = DEFAULT_LIMITS) -> Rows:
    """A trace given as torch's list of dicts (a loaded snapshot, a JSON file), checked entry
    by entry, as a :class:`Rows` table.

    Raises:
        SnapshotError: an entry that is not a dict with a string 'action', or a field of the
            wrong type or out of range (the message names the entry and the field).
    """
    if isinstance(entries, Rows):
        return entries
    if isinstance(entries, (str, bytes)) or not isinstance(entries, Sequence):
        raise SnapshotError(f"a device trace must be a list of entries, got {type(entries).__name__}")
    if len(entries) > limits.max_events:
        raise SnapshotError(f"a device trace of {len(entries):,} entries is over the limit of {limits.max_events:,} "
                            "(--max-events N)")
    rows = Rows()
    stacks: dict[tuple, int] = {}
    for i, e in enumerate(entries):
        if type(e) is not dict or type(e.get("action")) is not str:
            if isinstance(e, Mapping) and isinstance(e.get("action"), str):
                e = dict(e)
            elif isinstance(e, Mapping):
                a = e.get("action")
                raise SnapshotError(f"trace entry {i}: 'action' must be a string, got "
                                    f"{'nothing' if a is None else type(a).__name__ + ' ' + repr(a)[:30]}")
            else:
                raise SnapshotError(f"trace entry {i}: must be a dict with a string 'action', got "
                                    f"{type(e).__name__}")
        action = e["action"]
        code = ACTION_CODE.get(action, UNKNOWN_CODE)
        names = ("device_free" if code == OOM_CODE else "addr", "size", "stream")
        vals = []
        for name in names:
            if name not in e:
                if code < UNKNOWN_CODE and code != ACTION_CODE["snapshot"]:
                    raise SnapshotError(f"trace entry {i} ({action[:40]}): '{name}' is missing")
                vals.append(0)
                continue
            v = e[name]
            vals.append(_check_int(v, f"trace entry {i} ({action[:40]}): '{name}'",
                                   SIZE_LIMIT if name == "size" else ADDR_LIMIT))
        rows.codes.append(code)
        rows.addrs.append(vals[0])
        rows.sizes.append(vals[1])
        rows.streams.append(vals[2])
        if code == UNKNOWN_CODE:
            rows.unknown[i] = action[:100]
        frames = e.get("frames")
        sid = -1
        if isinstance(frames, list) and frames:
            key = tuple((str(f.get("filename", "?"))[:500], f.get("line") if type(f.get("line")) is int else 0,
                         str(f.get("name", "?"))[:200]) for f in frames[:200] if isinstance(f, Mapping))
            sid = stacks.get(key)
            if sid is None:
                sid = stacks[key] = len(rows.stack_table)
                rows.stack_table.append(key)
        rows.add_stacks((sid,))
        pool = e.get("pool_id")
        if pool is None:
            rows.add_pools((-1,))
        else:
            if isinstance(pool, (str, bytes)) or not isinstance(pool, Sequence) or len(pool) != 2:
                raise SnapshotError(f"trace entry {i} ({action[:40]}): 'pool_id' must be two whole numbers, "
                                    f"got {str(pool)[:40]!r}")
            a, b = (_check_int(x, f"trace entry {i} ({action[:40]}): 'pool_id'", ADDR_LIMIT) for x in pool)
            rows.add_pools((rows.pool_of((a, b)),))
        fwd = e.get("forward_frames")
        fid = -1
        if isinstance(fwd, list) and fwd:
            key = tuple((str(f.get("filename", "?"))[:500], f.get("line") if type(f.get("line")) is int else 0,
                         str(f.get("name", "?"))[:200]) for f in fwd[:200] if isinstance(f, Mapping))
            fid = stacks.get(key)
            if fid is None:
                fid = stacks[key] = len(rows.stack_table)
                rows.stack_table.append(key)
        rows.add_fwd((fid,))
    return rows


def rows_from_trace_z(packed: Any, declared: Any, limits: Limits = DEFAULT_LIMITS) -> Rows:
    """The compact form's trace: base64 of zlib of lines 'action addr size stream'.

    ``declared`` is the snapshot's ``trace_events``; the text may not expand past about 100
    bytes an entry nor ``trace_z_ratio`` times its compressed size (a zlib bomb stops there).

    Raises:
        SnapshotError: damaged data, a limit exceeded, or a malformed line (named by index).
    """
    if not isinstance(packed, str):
        raise SnapshotError(f"'trace_z' must be a string (base64), got {type(packed).__name__}")
    if declared is not None and (type(declared) is not int or not 0 <= declared <= limits.max_events):
        raise SnapshotError(f"'trace_events' must be a whole number in [0, {limits.max_events:,}], got {declared!r:.40}")
    try:
        comp = base64.b64decode(packed, validate=True)
    except (binascii.Error, ValueError) as e:
        raise SnapshotError(f"'trace_z' is not valid base64 ({e})") from None
    cap = min(limits.max_bytes, limits.trace_z_ratio * len(comp) + 4096)
    if declared is not None:
        cap = min(cap, 100 * declared + 4096)
    d = zlib.decompressobj()
    rows = Rows()
    carry = b""
    line_no = 0
    total = 0
    try:
        tail = comp
        while True:
            chunk = d.decompress(tail, 1 << 20)
            tail = d.unconsumed_tail
            total += len(chunk)
            if total > cap:
                raise SnapshotError(f"'trace_z' expands to more than {cap:,} bytes for "
                                    f"{declared if declared is not None else 'its'} entries (a damaged or hostile file)")
            done = d.eof or (not tail and not chunk)
            buf = carry + chunk
            if done:
                lines, carry = buf.split(b"\n") if buf else [], b""
            else:
                *lines, carry = buf.split(b"\n")
            line_no = _add_lines(rows, lines, line_no, limits)
            if done:
                break
    except zlib.error as e:
        raise SnapshotError(f"'trace_z' is damaged ({e})") from None
    if not d.eof:
        raise SnapshotError("'trace_z' is truncated")
    if declared is not None and len(rows) != declared:
        raise SnapshotError(f"'trace_z' holds {len(rows):,} entries but 'trace_events' says {declared:,}")
    return rows


def _add_lines(rows: Rows, lines: list[bytes], first: int, limits: Limits) -> int:
    if not lines:
        return first
    if first + len(lines) > limits.max_events:
        raise SnapshotError(f"more than {limits.max_events:,} trace entries")
    fields = b" ".join(lines).split(b" ")
    if len(fields) != 4 * len(lines):
        bad = next(k for k, ln in enumerate(lines) if len(ln.split(b" ")) != 4)
        raise SnapshotError(f"trace entry {first + bad}: a compact trace line is 'action addr size stream', "
                            f"got {lines[bad][:60]!r}")
    acts = fields[0::4]
    codes = [ACTION_CODE.get(a.decode("latin-1"), UNKNOWN_CODE) for a in acts]
    cols = []
    for k, (name, limit) in enumerate((("addr", ADDR_LIMIT), ("size", SIZE_LIMIT), ("stream", ADDR_LIMIT)), 1):
        raw = fields[k::4]
        try:
            vals = [int(x) for x in raw]
        except ValueError:
            j = next(j for j, x in enumerate(raw) if not x.isdigit())
            raise SnapshotError(f"trace entry {first + j} ({acts[j][:40].decode('latin-1')}): '{name}' must be a whole "
                                f"number, got {raw[j][:40].decode('latin-1')!r}") from None
        if vals and (min(vals) < 0 or max(vals) >= limit):
            j = next(j for j, v in enumerate(vals) if not 0 <= v < limit)
            fname = "device_free" if name == "addr" and codes[j] == OOM_CODE else name
            raise SnapshotError(f"trace entry {first + j} ({acts[j][:40].decode('latin-1')}): '{fname}' must be a "
                                f"whole number in [0, {limit:#x}), got {vals[j]}")
        cols.append(vals)
    rows.codes.extend(codes)
    rows.addrs.extend(cols[0])
    rows.sizes.extend(cols[1])
    rows.streams.extend(cols[2])
    if rows.stacks is not None:
        rows.stacks.extend(array("i", [-1]) * len(lines))
    for j, c in enumerate(codes):
        if c == UNKNOWN_CODE:
            rows.unknown[first + j] = acts[j][:100].decode("latin-1")
    return first + len(lines)


def trace_rows(snap: Mapping[str, Any], device: int, limits: Limits = DEFAULT_LIMITS) -> Rows:
    """One device's trace of a loaded snapshot as a :class:`Rows` table (empty if the
    snapshot has no trace for device 0).

    Raises:
        SnapshotError: see :func:`rows_from_dicts` and :func:`rows_from_trace_z`; a device
            index beyond the snapshot's devices.
    """
    if "trace_z" in snap:
        if device != 0:
            raise SnapshotError(f"the compact form holds one device's trace; device must be 0, got {device}")
        return rows_from_trace_z(snap["trace_z"], snap.get("trace_events"), limits)
    traces = snap.get("device_traces")
    if isinstance(traces, (str, bytes, Rows)) or not isinstance(traces, Sequence):
        raise SnapshotError(f"'device_traces' must be a list (one trace per device), got {type(traces).__name__}")
    if device >= len(traces):
        if device == 0:
            return Rows()
        raise SnapshotError(f"device must be below {len(traces)} (the devices in the trace), got {device}")
    return rows_from_dicts(traces[device], limits)


__all__ = ["DEFAULT_LIMITS", "ImpossibleTraceError", "InputError", "Limits", "SnapshotError", "SnapshotNotFoundError", "gunzip", "load", "read_bytes", "rows_from_dicts",
           "rows_from_trace_z", "trace_rows"]
