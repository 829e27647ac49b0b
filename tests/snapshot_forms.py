"""Recorded compact snapshots written back in the form torch writes them.

The book stores snapshots compactly (``trace.read`` reads both forms); tests of the loader, the CLI
and the browser page need the dict ``torch.cuda.memory._snapshot()`` returns, as a reader's
``pickle.dump`` of it would hold. Field names follow torch 2.11's ``_snapshot()`` (segments with
their blocks, one trace per device, ``allocator_settings``, ``external_annotations``).
"""
from __future__ import annotations

from experiments.doctor.reading.trace import read

ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
           "segment_unmap", "snapshot", "oom")
"""torch's trace action names, in the order of the doctor's event codes (``trace.ALLOC`` is 0)."""


def torch_form(compact: dict) -> dict:
    """``compact`` (a recorded snapshot) as ``torch.cuda.memory._snapshot()`` returns it.

    Every event, segment and block gets the same three stack frames (``train.py`` lines 10-12), so
    the loader's frame handling is exercised. Raises ``SnapshotError`` if ``compact`` is malformed.
    """
    frames = [{"filename": "train.py", "line": 10 + k, "name": f"step{k}"} for k in range(3)]
    entries = []
    for code, addr, size, stream in read(compact).events:
        e = {"action": ACTIONS[code], "size": size, "stream": stream, "time_us": 0, "frames": frames}
        e["device_free" if ACTIONS[code] == "oom" else "addr"] = addr
        entries.append(e)
    segs = [{"device": 0, "address": s["address"], "total_size": s["total_size"], "stream": s["stream"],
             "segment_type": s["segment_type"], "segment_pool_id": tuple(s["segment_pool_id"]),
             "is_expandable": s["is_expandable"], "frames": frames,
             "blocks": [{"address": a, "size": n, "requested_size": r, "state": st, "frames": frames}
                        for a, n, r, st in s["blocks"]]} for s in compact["segments"]]
    return {"segments": segs, "device_traces": [entries], "allocator_settings": compact["allocator_settings"],
            "external_annotations": []}
