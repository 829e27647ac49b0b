"""The doctor's restricted pickle reader gives what ``pickle.loads`` gives, on snapshots shaped
like torch's (shared frame dicts and strings, a new 'N/A' per entry, frames lists shared now
and then, annotations, an OOM entry), for pickle protocols 2 to 5 and gzip'd; and it reads
most entries on its fast path. ``pickle.loads`` is the oracle here: the test builds the data
itself, so loading it is safe."""
from __future__ import annotations

import gzip
import json
import pickle
import random
from pathlib import Path

import pytest

from experiments.doctor.errors import SnapshotError
from experiments.doctor.reading.loader import Limits, load
from experiments.doctor.reading.trace import read
from experiments.doctor.reading.unpickler import Reader

ROOT = Path(__file__).resolve().parent.parent
RECORDED = json.loads((ROOT / "experiments" / "recorded" / "alloc.doctor_snapshots" / "nvidia-h200.json").read_text())
RUNS = {(p["params"]["workload"], r["settings"]): r for p in RECORDED["points"] for r in p["data"]["runs"]}


def torch_like(compact: dict, seed: int = 0, frames: bool = True) -> dict:
    """A recorded compact snapshot written back as torch's ``_snapshot()`` dict, with torch's
    object sharing: one dict per source line of a frame (shared), interned file names, a new
    'N/A' string per entry, an empty frames list for frees, a frames list reused now and then."""
    rng = random.Random(seed)
    files = [f"/home/me/project/{name}.py" for name in ("train", "model", "data", "optim")]
    frame_pool = [{"name": f"f{k}", "filename": files[k % 4], "line": 10 + k} for k in range(60)]
    names = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
             "segment_unmap", "snapshot", "oom")
    trace = read(compact)
    entries, last = [], None
    for k, (code, addr, size, stream) in enumerate(trace.events):
        e = {"action": names[code], "addr": addr, "size": size, "stream": stream,
             "time_us": 1_700_000_000_000_000 + 7 * k, "compile_context": "".join(["N", "/", "A"]),
             "user_metadata": ""}
        if code == 8:
            e["device_free"] = e.pop("addr")
        if frames:
            if code in (1, 2):
                e["frames"] = []
            elif last is not None and rng.random() < 0.1:
                e["frames"] = last                          # the same list object again
            else:
                last = e["frames"] = [frame_pool[rng.randrange(60)] for _ in range(rng.randint(1, 9))]
        entries.append(e)
        if k % 97 == 5:
            entries.append({"action": "annotate", "addr": 0, "size": 0, "stream": 0, "time_us": 1})
    segs = [{"device": 0, "address": s["address"], "total_size": s["total_size"], "stream": s["stream"],
             "segment_type": s["segment_type"], "segment_pool_id": tuple(s["segment_pool_id"]),
             "is_expandable": s["is_expandable"], "frames": frame_pool[:3] if frames else [],
             "blocks": [{"address": a, "size": n, "requested_size": r, "state": st,
                         "frames": frame_pool[3:5] if frames and st != "inactive" else []}
                        for a, n, r, st in s["blocks"]]} for s in compact["segments"]]
    return {"segments": segs, "device_traces": [entries], "allocator_settings": compact["allocator_settings"],
            "external_annotations": [{"stage": "START", "name": "step", "device": 0, "time_us": 1}]}


def _rows_as_dicts(rows) -> list[tuple]:
    return [(rows.action(i), rows.addrs[i], rows.sizes[i], rows.streams[i], tuple(rows.frames(i)))
            for i in range(len(rows))]


def _want(snap: dict) -> list[tuple]:
    out = []
    for e in snap["device_traces"][0]:
        a = e["action"]
        fr = tuple((f["filename"], f["line"], f["name"]) for f in e.get("frames", []))
        out.append((a, e["device_free"] if a == "oom" else e["addr"], e["size"], e["stream"], fr))
    return out


@pytest.mark.parametrize("key", [("training", ""), ("cap", ""), ("pools", "expandable_segments:True"),
                                 ("streams", "")], ids=lambda k: f"{k[0]}[{k[1] or 'default'}]")
@pytest.mark.parametrize("proto", [2, 3, 4, 5])
def test_reader_equals_pickle_loads(key, proto):
    snap = torch_like(RUNS[key]["snapshot"], seed=proto)
    blob = pickle.dumps(snap, protocol=proto)
    ref = pickle.loads(blob)
    r = Reader(blob, budget_bytes=1 << 30)
    got = r.load()
    rows = got["device_traces"][0]
    # annotations are kept as rows too (code 'annotate'); compare every field of every entry
    assert _rows_as_dicts(rows) == _want(ref)
    assert got["segments"] == ref["segments"]
    assert {k: v for k, v in got.items() if k != "device_traces"} == {k: v for k, v in ref.items()
                                                                       if k != "device_traces"}
    if len(rows) > 2000:    # a long trace is read mostly in C (a short one may be all new layouts)
        assert r.fast_rows >= 0.8 * len(rows), f"only {r.fast_rows} of {len(rows)} rows on the fast path"


def test_a_gzipped_pickle_and_its_replay(tmp_path):
    rec = RUNS[("training", "")]
    path = tmp_path / "snap.pickle.gz"
    path.write_bytes(gzip.compress(pickle.dumps(torch_like(rec["snapshot"]), protocol=4)))
    t = read(str(path))
    assert t.skipped > 0 and t.stacks is not None
    from experiments.doctor.replaying.replay import replay

    run = replay(t)
    assert run.matches_trace, run.first_mismatch
    assert run.final_reserved_bytes == rec["final"]["reserved_bytes.all.current"]
    # the stack of an allocation is the one recorded with it
    i = next(k for k, e in enumerate(t.events) if e[0] == 0)
    assert t.frames(i) and all(len(f) == 3 for f in t.frames(i))


def test_limits_are_checked_before_the_memory_is_spent(tmp_path):
    snap = torch_like(RUNS[("streams", "")]["snapshot"])
    blob = pickle.dumps(snap, protocol=4)
    with pytest.raises(SnapshotError, match="trace entries"):
        load(blob, Limits(max_events=10))
    with pytest.raises(SnapshotError, match="budget"):
        load(blob, Limits(budget_bytes=2000))
    path = tmp_path / "s.pickle"
    path.write_bytes(blob)
    with pytest.raises(SnapshotError, match="reads files up to"):
        load(str(path), Limits(max_file_bytes=1000))
    gz = tmp_path / "s.pickle.gz"
    gz.write_bytes(gzip.compress(blob))
    with pytest.raises(SnapshotError, match="decompresses to"):
        load(str(gz), Limits(max_bytes=1000))


def test_a_truncated_pickle_is_one_clear_error():
    blob = pickle.dumps(torch_like(RUNS[("streams", "")]["snapshot"]), protocol=4)
    for cut in (1, 10, len(blob) // 2, len(blob) - 1):
        with pytest.raises(SnapshotError, match="truncated|ends before|complete|byte"):
            load(blob[:cut])


@pytest.mark.parametrize("field,value", [("size", -512), ("addr", 1 << 63), ("stream", -1)])
def test_a_bad_value_deep_in_a_long_trace_names_its_entry(field, value):
    """Deep in a long trace the entries are read on the fast path: its range check names the
    same entry and field as the opcode-by-opcode path does."""
    snap = torch_like(RUNS[("training", "")]["snapshot"], frames=False)
    entries = snap["device_traces"][0]
    k = next(i for i in range(5000, len(entries)) if entries[i]["action"] == "alloc")
    entries[k][field] = value
    r = Reader(pickle.dumps(snap, protocol=4), budget_bytes=1 << 30)
    with pytest.raises(Exception) as info:
        r.load()
    assert f"trace entry {k} (alloc): '{field}'" in str(info.value), str(info.value)
    assert r.fast_rows > 1000


@pytest.mark.parametrize("seed", range(6))
def test_columns_of_one_integer_width_read_as_pickle_loads(seed):
    """A batch whose integers all have one opcode and width is converted without a lookup per
    value (the reader's strided path): every width pickle writes, values at the edges of each
    and of the columns' ranges, and a batch that mixes widths, read as ``pickle.loads`` reads
    them; a value out of range is still named by its entry."""
    rng = random.Random(seed)
    widths = [(0, 0xFF), (0x100, 0xFFFF), (0x10000, (1 << 31) - 1)] + [
        (1 << (8 * w - 9), (1 << (8 * w - 1)) - 1) for w in range(4, 9)]   # K, M, J, then LONG1 of 4 to 8 bytes
    entries = []
    for lo, hi in widths + [(0, (1 << 45) - 1)]:            # the last: every width in one batch
        for _ in range(1500):                               # more than one APPENDS batch of 1,000
            size = rng.choice([lo, hi, rng.randint(lo, hi)]) or 1
            entries.append({"action": "alloc", "addr": min(rng.randint(lo, hi), (1 << 62) - 1),
                            "size": min(size, (1 << 46) - 1), "stream": min(rng.choice([lo, hi]), (1 << 62) - 1)})
    snap = {"segments": [], "device_traces": [entries]}
    r = Reader(pickle.dumps(snap, protocol=4), budget_bytes=1 << 30)
    rows = r.load()["device_traces"][0]
    assert [(rows.addrs[i], rows.sizes[i], rows.streams[i]) for i in range(len(rows))] == [
        (e["addr"], e["size"], e["stream"]) for e in entries]
    assert r.fast_rows > 0.9 * len(entries)
    k = rng.randrange(2000, len(entries))
    entries[k]["size"] = 1 << 46                             # one past the sizes' range, in a uniform batch
    with pytest.raises(Exception) as info:
        Reader(pickle.dumps(snap, protocol=4), budget_bytes=1 << 30).load()
    assert f"trace entry {k} (alloc): 'size'" in str(info.value), str(info.value)
