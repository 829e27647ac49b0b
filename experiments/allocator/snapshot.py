"""Reading what the caching allocator reports: memory snapshots and out-of-memory messages.

* :func:`parse_segments` turns ``torch.cuda.memory._snapshot()`` (or the segment list of
  ``torch.cuda.memory_snapshot()``) into the plain segment dicts that
  :func:`experiments.core.plotting.segment_map` draws and that recorded results store.
* :func:`layout_summary` and :func:`fragmentation_index` measure how usable the free
  memory in a layout is.
* :func:`parse_oom_message` reads the figures out of a ``torch.OutOfMemoryError`` message.

No GPU is needed: everything here works on dicts and strings. Snapshot format:
experiments/doctor/RULES.md §E.2 and https://docs.pytorch.org/docs/stable/torch_cuda_memory.html;
OOM text: ``c10/cuda/CUDACachingAllocator.cpp`` (the ``malloc`` error path).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..doctor.reading.loader import load

KiB, MiB, GiB, TiB = 1024, 1024**2, 1024**3, 1024**4

STATES = ("active_allocated", "active_pending_free", "inactive")


class PoolIdsMissingError(LookupError):
    """The snapshot has no ``segment_pool_id`` fields, so segments cannot be told apart by pool."""


def load_snapshot(source: str | Path | Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> Any:
    """A snapshot from a dict/list, or from a file written by ``torch.cuda.memory._dump_snapshot``
    (a pickle, gzip'd or not) or saved as JSON.

    Files go through the allocator doctor's one restricted, size-bounded loader
    (:func:`experiments.doctor.reading.loader.load`): a pickle that names code is refused before
    anything in it runs. A trace comes back as a table that reads like torch's list of dicts.

    Raises:
        ValueError: a file that is missing, not a snapshot, or over the loader's limits
            (:class:`experiments.doctor.errors.SnapshotError`).
    """
    if isinstance(source, (str, Path)):
        return load(source, need_trace=False)
    return source


def _pool_id(seg: Mapping[str, Any]) -> tuple[int, int] | None:
    pid = seg.get("segment_pool_id")
    if pid is None:
        return None
    return (int(pid[0]), int(pid[1]))


def parse_segments(
    snapshot: Mapping[str, Any] | Sequence[Mapping[str, Any]],
    *,
    pool_id: Sequence[int] | None = None,
    device: int | None = None,
) -> list[dict[str, Any]]:
    """Plain segment dicts from a snapshot, sorted by address.

    Args:
        snapshot: the dict of ``torch.cuda.memory._snapshot()`` (its 'segments' are
            used) or a list of segments (``torch.cuda.memory_snapshot()``).
        pool_id: keep only segments of this private pool (e.g. ``MemPool().id``, or
            (0, 0) for the default pools).
        device: keep only segments of this device.

    Returns:
        one dict per segment: address, total_size, pool ('small'/'large'),
        is_expandable, stream, pool_id (a list of two ints, or None), and blocks in address
        order, each with size, state and requested_size. Block sizes add up to total_size.

    Raises:
        ValueError: not a snapshot, or a segment whose blocks do not add up.
        PoolIdsMissingError: ``pool_id`` given but the snapshot has no pool ids (old torch).
    """
    if isinstance(snapshot, Mapping):
        if "segments" not in snapshot:
            raise ValueError("a snapshot dict must have a 'segments' list (from torch.cuda.memory._snapshot())")
        raw = snapshot["segments"]
    else:
        raw = snapshot
    if not isinstance(raw, Sequence):
        raise ValueError(f"snapshot segments must be a list, got {type(raw).__name__}")
    wanted = None if pool_id is None else (int(pool_id[0]), int(pool_id[1]))
    out = []
    for seg in raw:
        if not isinstance(seg, Mapping) or "total_size" not in seg or "blocks" not in seg:
            raise ValueError("each segment needs 'total_size' and 'blocks' (a torch.cuda.memory snapshot segment)")
        if device is not None and int(seg.get("device", 0)) != device:
            continue
        pid = _pool_id(seg)
        if wanted is not None:
            if pid is None:
                raise PoolIdsMissingError("this snapshot has no segment_pool_id; cannot select one pool")
            if pid != wanted:
                continue
        blocks = sorted(seg["blocks"], key=lambda b: b.get("address", 0))
        parsed = [{"size": int(b["size"]), "state": str(b["state"]),
                   "requested_size": int(b.get("requested_size", 0))} for b in blocks]
        total = int(seg["total_size"])
        if sum(b["size"] for b in parsed) != total:
            raise ValueError(f"segment at {seg.get('address')}: blocks add up to {sum(b['size'] for b in parsed)} "
                             f"bytes, not its total_size {total}")
        pool = seg.get("segment_type") or seg.get("pool")
        if pool not in ("small", "large"):
            pool = "small" if total <= 2 * MiB and not seg.get("is_expandable") else "large"
        out.append({
            "address": int(seg.get("address", 0)),
            "total_size": total,
            "pool": pool,
            "is_expandable": bool(seg.get("is_expandable", False)),
            "stream": int(seg.get("stream", 0)),
            "pool_id": list(pid) if pid is not None else None,
            "blocks": parsed,
        })
    out.sort(key=lambda s: s["address"])
    return out


def layout_summary(segments: Sequence[Mapping[str, Any]]) -> dict[str, int | float]:
    """Totals of a layout (all in bytes, except the counts and the index).

    Returns:
        reserved_bytes (sum of segment sizes), allocated_bytes (allocated blocks),
        pending_bytes (freed, waiting on an event), free_bytes (inactive blocks),
        largest_free_bytes, segments, free_blocks and fragmentation
        (:func:`fragmentation_index`).
    """
    sizes = {s: 0 for s in STATES}
    free_blocks = []
    for seg in segments:
        for b in seg["blocks"]:
            sizes[b["state"]] = sizes.get(b["state"], 0) + b["size"]
            if b["state"] == "inactive":
                free_blocks.append(b["size"])
    return {
        "reserved_bytes": sum(s["total_size"] for s in segments),
        "allocated_bytes": sizes["active_allocated"],
        "pending_bytes": sizes["active_pending_free"],
        "free_bytes": sizes["inactive"],
        "largest_free_bytes": max(free_blocks, default=0),
        "segments": len(segments),
        "free_blocks": len(free_blocks),
        "fragmentation": fragmentation_index(segments),
    }


def fragmentation_index(segments: Sequence[Mapping[str, Any]]) -> float:
    """1 − (largest free block / total free bytes): 0 when the free memory is one block.

    0.5 for two equal free blocks, towards 1 when free memory is scattered in many small
    blocks. 0 when nothing is free. (Suggested by the post's E4.4 experiment.)
    """
    free = [b["size"] for s in segments for b in s["blocks"] if b["state"] == "inactive"]
    total = sum(free)
    return 0.0 if total == 0 else 1.0 - max(free) / total


# ----------------------------------------------------------------------------- OOM messages

_UNIT = {"bytes": 1, "byte": 1, "b": 1, "kib": KiB, "mib": MiB, "gib": GiB, "tib": TiB}
_SIZE = r"(\d+(?:\.\d+)?)\s*(bytes|byte|KiB|MiB|GiB|TiB)"


def _bytes(number: str, unit: str) -> int:
    return int(round(float(number) * _UNIT[unit.lower()]))


def parse_oom_message(text: str) -> dict[str, Any]:
    """The figures in a CUDA out-of-memory message, in bytes.

    Reads the message of torch 2.1 and newer ("Tried to allocate X. GPU 0 has a total
    capacity of ... Of the allocated memory ... is reserved by PyTorch but unallocated.")
    and the older form ("(GPU 0; X total capacity; ... reserved in total by PyTorch)").
    Sizes in the message have two decimals, so values are exact only to about 0.005 of
    their unit.

    Returns:
        dict with tried_to_allocate_bytes (what the allocator tried to obtain: the segment
        size, not the tensor size), device, total_capacity_bytes, free_bytes (free on
        the device per the driver), process_in_use_bytes (this process, None if absent),
        other_processes_in_use_bytes (the other processes the driver lists, None if none
        or if this process is not told apart from them), allowed_bytes
        (the per-process cap, None without one), allocated_by_pytorch_bytes,
        private_pools_bytes (None if absent), reserved_unallocated_bytes,
        reserved_bytes (allocated + reserved-but-unallocated) and format ('new' or 'old').

    Raises:
        ValueError: the text is not a CUDA out-of-memory message.
    """
    if not isinstance(text, str) or "out of memory" not in text.lower():
        raise ValueError("not a CUDA out-of-memory message (no 'out of memory' in it)")
    flat = " ".join(text.split())
    tried = re.search(r"Tried to allocate " + _SIZE, flat)
    if tried is None:
        raise ValueError("the message has no 'Tried to allocate ...' figure")
    out: dict[str, Any] = {"tried_to_allocate_bytes": _bytes(*tried.groups()), "process_in_use_bytes": None,
                           "other_processes_in_use_bytes": None, "allowed_bytes": None, "private_pools_bytes": None}
    new = re.search(r"GPU (\d+) has a total capacity of " + _SIZE + r" of which " + _SIZE + r" is free", flat)
    if new:
        out["format"] = "new"
        out["device"] = int(new.group(1))
        out["total_capacity_bytes"] = _bytes(new.group(2), new.group(3))
        out["free_bytes"] = _bytes(new.group(4), new.group(5))
        # The driver lists every process on the GPU: "this process has" is ours, "Process N
        # has" another one (or ours, seen from inside a container, when it is the only line).
        own = re.search(r"this process has " + _SIZE + r" memory in use", flat)
        others = [_bytes(*m) for m in re.findall(r"Process \d+ has " + _SIZE + r" memory in use", flat)]
        if own:
            out["process_in_use_bytes"] = _bytes(*own.groups())
            out["other_processes_in_use_bytes"] = sum(others) if others else None
        elif len(others) == 1:
            out["process_in_use_bytes"] = others[0]
        allowed = re.search(_SIZE + r" allowed;", flat)
        if allowed:
            out["allowed_bytes"] = _bytes(*allowed.groups())
        alloc = re.search(r"Of the allocated memory " + _SIZE + r" is allocated by PyTorch", flat)
        unalloc = re.search(r"and " + _SIZE + r" is reserved by PyTorch but unallocated", flat)
        if alloc is None or unalloc is None:
            raise ValueError("the message lacks the 'allocated by PyTorch' / 'reserved by PyTorch but "
                             "unallocated' figures")
        out["allocated_by_pytorch_bytes"] = _bytes(*alloc.groups())
        out["reserved_unallocated_bytes"] = _bytes(*unalloc.groups())
        private = re.search(r"with " + _SIZE + r" allocated in private pools", flat)
        if private:
            out["private_pools_bytes"] = _bytes(*private.groups())
        out["reserved_bytes"] = out["allocated_by_pytorch_bytes"] + out["reserved_unallocated_bytes"]
        return out
    old = re.search(r"\(GPU (\d+); " + _SIZE + r" total capacity; " + _SIZE + r" already allocated; "
                    + _SIZE + r" free;(?: " + _SIZE + r" allowed;)? " + _SIZE + r" reserved in total by PyTorch", flat)
    if old:
        g = old.groups()
        out["format"] = "old"
        out["device"] = int(g[0])
        out["total_capacity_bytes"] = _bytes(g[1], g[2])
        out["allocated_by_pytorch_bytes"] = _bytes(g[3], g[4])
        out["free_bytes"] = _bytes(g[5], g[6])
        if g[7] is not None:
            out["allowed_bytes"] = _bytes(g[7], g[8])
        out["reserved_bytes"] = _bytes(g[9], g[10])
        out["reserved_unallocated_bytes"] = out["reserved_bytes"] - out["allocated_by_pytorch_bytes"]
        return out
    raise ValueError("could not find the device figures ('GPU N has a total capacity of ...') in the message")


OOM_FIELDS = (
    ("tried_to_allocate_bytes", "tried to allocate (the segment it asked CUDA for)"),
    ("total_capacity_bytes", "total capacity of the GPU"),
    ("free_bytes", "free on the GPU (driver's view)"),
    ("process_in_use_bytes", "in use by this process, including non-PyTorch memory"),
    ("other_processes_in_use_bytes", "in use by other processes on the GPU"),
    ("allowed_bytes", "allowed for this process (memory cap)"),
    ("allocated_by_pytorch_bytes", "allocated by PyTorch (live tensors)"),
    ("private_pools_bytes", "of which free in private pools (CUDA graphs)"),
    ("reserved_unallocated_bytes", "reserved by PyTorch but unallocated (cached)"),
)


def oom_rows(figures: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(meaning, 'X MiB') rows of the figures :func:`parse_oom_message` found, in message order."""
    rows = []
    for key, meaning in OOM_FIELDS:
        value = figures.get(key)
        if value is not None:
            rows.append((meaning, format_figure(value)))
    return rows


def format_figure(nbytes: float) -> str:
    """'2.34 GiB', '423.00 MiB', '512 bytes': two decimals, like PyTorch's messages."""
    if nbytes >= GiB:
        return f"{nbytes / GiB:.2f} GiB"
    if nbytes >= MiB:
        return f"{nbytes / MiB:.2f} MiB"
    if nbytes >= KiB:
        return f"{nbytes / KiB:.2f} KiB"
    return f"{int(nbytes)} bytes"
