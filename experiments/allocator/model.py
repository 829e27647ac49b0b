"""Chapter 1's allocator model: the operation lists the chapter's experiments run, and
:func:`simulate`, which runs one on the allocator engine with no GPU.

The rules themselves (rounding, pools, segment sizes, splits, settings) live in the doctor's
package, written once (:mod:`experiments.doctor.model.rules`); the one implementation that
applies them is :class:`experiments.doctor.model.engine.Engine` (streams, pools, cap, OOM path,
expandable segments). This module re-exports the rules the chapter uses. New segments in
:func:`simulate` get increasing synthetic addresses, so which of two equal free blocks is
reused first may differ from a GPU run; sizes and totals do not.

Sizes are in bytes throughout.
"""
from __future__ import annotations

import re
from typing import Any, Iterable, Mapping, Sequence

from ..core.units import GiB, KiB, MiB, format_bytes  # noqa: F401  (format_bytes: the chapter's API)
from ..doctor.model.engine import Engine, EngineOutOfMemory
from ..doctor.model.rules import (  # noqa: F401  (the chapter's API: the rules it teaches)
    DEFAULT, H200_TOTAL_MEMORY, LARGE_BUFFER, MIN_BLOCK_SIZE, MIN_LARGE_ALLOC, ROUND_LARGE, ROUNDUP_INTERVALS, SMALL_BUFFER,
    SMALL_SIZE, STATE_ALLOCATED, STATE_FREE, AllocatorConfig, expandable_segment_size, get_allocation_size,
    get_pool, parse_roundup_divisions, round_size, should_split,
)

# ----------------------------------------------------------------------------- operations

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|bytes?|KiB|MiB|GiB)?\s*(?:\+\s*(\d+)\s*(?:B|bytes?)?)?\s*$", re.I)
_UNITS = {"b": 1, "byte": 1, "bytes": 1, "kib": KiB, "mib": MiB, "gib": GiB}


def parse_size(size: int | float | str) -> int:
    """A size in bytes from an int, or a string such as '16 MiB', '1.5MiB', '512 KiB',
    '1 MiB + 1', '1000 B'. Fractions of a byte are rounded to the nearest byte.

    Raises:
        ValueError: an unreadable string, or a size below 1 byte.
    """
    if isinstance(size, bool):
        raise ValueError(f"a size must be a number of bytes or a string like '16 MiB', got {size!r}")
    if isinstance(size, (int, float)):
        nbytes = int(round(size))
    elif isinstance(size, str):
        m = _SIZE_RE.match(size)
        if not m:
            raise ValueError(f"cannot read size {size!r}; write e.g. '16 MiB', '512 KiB', '1 MiB + 1' or 1000")
        unit = _UNITS[(m.group(2) or "B").lower()]
        nbytes = int(round(float(m.group(1)) * unit)) + int(m.group(3) or 0)
    else:
        raise ValueError(f"a size must be a number of bytes or a string like '16 MiB', got {size!r}")
    if nbytes < 1:
        raise ValueError(f"a size must be at least 1 byte, got {size!r}")
    return nbytes


def normalize_ops(ops: Iterable[Sequence[Any]]) -> list[list[Any]]:
    """Check a sequence of allocator operations and return it in canonical JSON form.

    Each operation is a tuple or list:

    * ``("alloc", name, size)``: a ``torch.empty(size, dtype=torch.uint8)`` tensor called
      ``name``; ``size`` in bytes or a string such as '16 MiB';
    * ``("free", name)``: drop that tensor;
    * ``("empty_cache",)``: ``torch.cuda.empty_cache()``;
    * ``("snapshot", label)``: record the segment layout under ``label``.

    Returns:
        a list of lists with sizes as ints: ``[["alloc", "x", 16777216], ["free", "x"]]``.

    Raises:
        ValueError: an unknown operation, a bad size, allocating a live name again, or
            freeing a name that is not live (each message names the operation's index).
    """
    if isinstance(ops, Mapping) and ("device_traces" in ops or "trace_z" in ops):
        raise ValueError("this is a memory snapshot, not a list of operations: replay it with "
                         "al.doctor(snapshot) (experiments.doctor)")
    out: list[list[Any]] = []
    live: set[str] = set()
    labels: set[str] = set()
    for i, op in enumerate(ops):
        if isinstance(op, (str, bytes)) or not isinstance(op, Sequence) or not op:
            raise ValueError(f"operation {i}: expected a tuple like ('alloc', 'x', '16 MiB'), got {op!r}")
        kind = op[0]
        if kind == "alloc":
            if len(op) != 3 or not isinstance(op[1], str) or not op[1]:
                raise ValueError(f"operation {i}: alloc takes a name and a size, e.g. ('alloc', 'x', '16 MiB'); got {op!r}")
            if op[1] in live:
                raise ValueError(f"operation {i}: {op[1]!r} is already allocated; free it first or use a new name")
            try:
                size = parse_size(op[2])
            except ValueError as e:
                raise ValueError(f"operation {i}: {e}") from None
            live.add(op[1])
            out.append(["alloc", op[1], size])
        elif kind == "free":
            if len(op) != 2 or op[1] not in live:
                raise ValueError(f"operation {i}: free needs the name of a live tensor, one of {sorted(live)}; got {op!r}")
            live.discard(op[1])
            out.append(["free", op[1]])
        elif kind == "empty_cache":
            if len(op) != 1:
                raise ValueError(f"operation {i}: empty_cache takes no arguments, got {op!r}")
            out.append(["empty_cache"])
        elif kind == "snapshot":
            if len(op) != 2 or not isinstance(op[1], str) or op[1] in labels:
                raise ValueError(f"operation {i}: snapshot takes one new label, got {op!r}")
            labels.add(op[1])
            out.append(["snapshot", op[1]])
        else:
            raise ValueError(f"operation {i}: unknown operation {kind!r}; use 'alloc', 'free', 'empty_cache' or 'snapshot'")
    return out


def op_label(op: Sequence[Any]) -> str:
    """A short text for one normalised operation, e.g. 'alloc x (16 MiB)'."""
    if op[0] == "alloc":
        return f"alloc {op[1]} ({format_bytes(op[2])})"
    if op[0] == "free":
        return f"free {op[1]}"
    return op[0] if len(op) == 1 else f"{op[0]} {op[1]}"




# ----------------------------------------------------------------------------- reading layouts

def compact_layout(segments: Sequence[Mapping[str, Any]]) -> list[str]:
    """Segments in the post's short notation, e.g. ['large:32M[16f 16A]', 'small:2M[0.5A 1.5f]'].

    Sizes are in MiB (up to 4 significant digits), A = allocated, f = free, P = freed but
    waiting on an event. Useful to compare layouts regardless of addresses.
    """
    def mib(n: int) -> str:
        return f"{n / MiB:.4g}"

    marks = {STATE_ALLOCATED: "A", STATE_FREE: "f", "active_pending_free": "P"}
    return [f"{s['pool']}:{mib(s['total_size'])}M[" + " ".join(f"{mib(b['size'])}{marks.get(b['state'], '?')}"
                                                                for b in s["blocks"]) + "]" for s in segments]


# ----------------------------------------------------------------------------- operation lists on the engine

def _layout(engine: Engine) -> list[dict[str, Any]]:
    """The engine's segments in the chapter's snapshot format (no stream or pool id; a free
    block's requested_size is 0)."""
    return [{"address": s["address"], "total_size": s["total_size"], "pool": s["pool"],
             "is_expandable": s["is_expandable"],
             "blocks": [{"size": b["size"], "state": b["state"],
                         "requested_size": b["requested_size"] if b["state"] == STATE_ALLOCATED else 0}
                        for b in s["blocks"]]} for s in engine.segments()]


def _increasing_addresses(engine: Engine) -> None:
    """New segments and ranges get increasing addresses from 2^32 (segment order = creation order)."""
    nxt = [1 << 32]

    def hook(size: int) -> int:
        addr, nxt[0] = nxt[0], nxt[0] + -(-size // ROUND_LARGE) * ROUND_LARGE
        return addr
    engine.address_hook = hook


def simulate(
    ops: Iterable[Sequence[Any]],
    config: AllocatorConfig | Mapping[str, Any] | str | None = None,
    *,
    cap_bytes: int | None = None,
    total_memory: int = H200_TOTAL_MEMORY,
) -> dict[str, Any]:
    """Run a sequence of operations (see :func:`experiments.allocator.model.normalize_ops`)
    through the engine (one device, one stream, the default pool).

    ``total_memory`` (bytes) sets an expandable segment's virtual range (default: the lab H200).
    Returns the same structure as the GPU worker
    (:func:`experiments.allocator.gpu.run_ops`): ``labels``, ``allocated_bytes`` and
    ``reserved_bytes`` after each alloc/free/empty_cache (lists of equal length),
    ``snapshots`` (label -> segments), ``oom`` (None, or the figures of the failed
    request with its ``step``; the sequence stops there and a snapshot 'oom' is added),
    ``num_alloc_retries`` and ``num_ooms``.

    Raises:
        ValueError: a malformed sequence or setting.
    """
    if cap_bytes is not None and (isinstance(cap_bytes, bool) or cap_bytes < 1):
        raise ValueError(f"cap_bytes must be a positive number of bytes or None, got {cap_bytes!r}")
    cfg = config if isinstance(config, AllocatorConfig) else AllocatorConfig.from_settings(config)
    # reserved bytes are whole, so comparing them with floor(cap) is the same as with cap
    engine = Engine(cfg, cap_bytes=None if cap_bytes is None else int(cap_bytes), total_memory=total_memory)
    _increasing_addresses(engine)
    live: dict[str, Any] = {}
    out: dict[str, Any] = {"labels": [], "allocated_bytes": [], "reserved_bytes": [], "snapshots": {}, "oom": None}
    for op in normalize_ops(ops):
        if op[0] == "snapshot":
            out["snapshots"][op[1]] = _layout(engine)
            continue
        label = op_label(op)
        if op[0] == "alloc":
            try:
                live[op[1]] = engine.malloc(op[2])
            except EngineOutOfMemory as e:
                f = e.figures
                out["oom"] = {"step": len(out["labels"]), **f,
                              "reserved_unallocated_bytes": f["reserved_bytes"] - f["allocated_bytes"],
                              "cap_bytes": cap_bytes or 0}
                label += " → OOM"
        elif op[0] == "free":
            block = live.pop(op[1])
            engine.free_requested(block)
            engine.free_completed(block)
        else:
            engine.empty_cache()
        out["labels"].append(label)
        out["allocated_bytes"].append(engine.allocated_bytes)
        out["reserved_bytes"].append(engine.reserved_bytes)
        if out["oom"] is not None:
            out["snapshots"]["oom"] = _layout(engine)
            break
    out["num_alloc_retries"] = engine.num_alloc_retries
    out["num_ooms"] = engine.num_ooms
    return out


def request_anatomy(nbytes: int, config: AllocatorConfig = DEFAULT) -> dict[str, Any]:
    """What one tensor of ``nbytes`` gets from an empty allocator.

    Returns:
        dict with request_bytes, rounded_bytes, pool, block_bytes (may exceed the rounded
        size when a large-pool remainder of at most 1 MiB is not split off),
        segment_bytes (segment or mapped pages), remainder_bytes (free tail in that
        segment) and split (whether the tail became a separate free block).
    """
    engine = Engine(config)
    block = engine.malloc(nbytes)
    seg = engine.segments()[0]
    rounded = round_size(nbytes, config)
    return {
        "request_bytes": nbytes, "rounded_bytes": rounded, "pool": get_pool(rounded),
        "block_bytes": block.size, "segment_bytes": seg["total_size"],
        "remainder_bytes": seg["total_size"] - block.size, "split": len(seg["blocks"]) > 1,
    }
