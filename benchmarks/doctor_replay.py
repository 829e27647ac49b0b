"""Speed of the allocator doctor's replay (issue 11): events per second on synthetic traces.

Prints, for a trace of one million events with about 300 and with about 8,000 live blocks,
the replay rate (median of 3 runs; per CPU second of this process, which other jobs on a
shared machine disturb less than the wall clock, and per wall second), and the time of ``doctor --json`` with three what-ifs on
a one-million-event snapshot pickle with stack frames. Targets on the 2-core CI machine:
>= 500k events/s (300 live), >= 200k events/s (8,000 live), doctor under 60 s.

Usage: python benchmarks/doctor_replay.py [--events N] [--skip-cli]
"""
from __future__ import annotations

import argparse
import pickle
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from experiments.doctor.engine import Engine  # noqa: E402
from experiments.doctor.rules import AllocatorConfig  # noqa: E402
from experiments.doctor.replay import replay  # noqa: E402
from experiments.doctor.trace import Trace  # noqa: E402

CODES = {"segment_alloc": 3, "segment_free": 4, "segment_map": 5, "segment_unmap": 6}


def synthetic_trace(n_events: int, live: int, seed: int = 0) -> Trace:
    """A trace the engine itself produced: random sizes (log-uniform 1 B - 64 MiB), about
    ``live`` blocks alive, two streams, an empty_cache now and then."""
    rng = random.Random(seed)
    eng = Engine(AllocatorConfig())
    events: list[tuple[int, int, int, int]] = []
    alive: list = []
    sizes = [int(2 ** rng.uniform(0, 26)) + 1 for _ in range(4096)]
    while len(events) < n_events:
        if len(alive) > live or (alive and rng.random() < 0.5 * len(alive) / live):
            k = rng.randrange(len(alive))
            alive[k], alive[-1] = alive[-1], alive[k]
            blk, stream = alive.pop()
            addr, req = blk.addr, blk.requested   # a merge in free_completed moves blk.addr
            eng.free_requested(blk)
            events.append((1, addr, req, stream))
            eng.free_completed(blk)
            events.append((2, addr, req, stream))
        elif rng.random() < 0.0005:
            eng.empty_cache()
            events.extend((CODES[a], addr, size, 0) for a, addr, size in eng.events)
        else:
            stream = 0 if rng.random() < 0.8 else 7
            blk = eng.malloc(sizes[rng.randrange(4096)], stream)
            events.extend((CODES[a], addr, size, stream) for a, addr, size in eng.events)
            events.append((0, blk.addr, blk.requested, stream))
            alive.append((blk, stream))
    segs = []
    for s in eng.segments():
        segs.append({"address": s["address"], "total_size": s["total_size"], "stream": s["stream"],
                     "pool": s["pool"], "pool_id": (0, 0), "is_expandable": False,
                     "blocks": [(b["address"], b["size"], b["requested_size"], b["state"]) for b in s["blocks"]]})
    return Trace(events, segs, "", AllocatorConfig())


def bench(n: int, live: int) -> tuple[float, bool]:
    trace = synthetic_trace(n, live)
    rates, walls, ok = [], [], True
    for _ in range(3):
        t0, c0 = time.perf_counter(), time.process_time()
        run = replay(trace)
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        ok = ok and bool(run.matches_trace)
        rates.append(len(trace.events) / dc)
        walls.append(len(trace.events) / dt)
    return statistics.median(rates), statistics.median(walls), ok


def torch_form(trace: Trace) -> dict:
    names = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
             "segment_unmap", "snapshot", "oom")
    files = [f"/home/me/project/model_{k}.py" for k in range(8)]
    # every entry its own frames (as torch records them), names and files shared as in a real run
    entries = [{"action": names[c], "addr": a, "size": s, "stream": st, "time_us": 1_700_000_000_000_000 + i,
                "compile_context": "N/A", "user_metadata": "",
                "frames": [{"filename": files[(i + k) % 8], "line": 10 + (i * 7 + k) % 500, "name": "forward"}
                           for k in range(4)]}
               for i, (c, a, s, st) in enumerate(trace.events)]
    frames = entries[0]["frames"] if entries else []
    segs = [{"device": 0, "address": s["address"], "total_size": s["total_size"], "stream": s["stream"],
             "segment_type": s["pool"], "segment_pool_id": (0, 0), "is_expandable": False, "frames": frames,
             "blocks": [{"address": a, "size": n, "requested_size": r, "state": st, "frames": frames}
                        for a, n, r, st in s["blocks"]]} for s in trace.segments]
    return {"segments": segs, "device_traces": [entries],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--skip-cli", action="store_true")
    a = ap.parse_args()
    for live, target in ((300, 500_000), (8000, 200_000)):
        rate, wall, ok = bench(a.events, live)
        print(f"replay, {a.events:,} events, ~{live:,} live blocks: {rate:,.0f} events per CPU second, "
              f"{wall:,.0f} per wall second (median of 3; target {target:,}; exact: {ok})")
    if a.skip_cli:
        return
    trace = synthetic_trace(a.events, 300, seed=1)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "snapshot.pickle")
        path.write_bytes(pickle.dumps(torch_form(trace)))
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "experiments", "doctor", str(path), "--json",
                              "--what-if", "expandable_segments:True", "--what-if", "max_split_size_mb:64",
                              "--what-if", "roundup_power2_divisions:4"], capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parent.parent)
        dt = time.perf_counter() - t0
        print(f"doctor --json, 3 what-ifs, {a.events:,}-event pickle with frames "
              f"({path.stat().st_size / 2**20:.0f} MiB): {dt:.1f} s (target < 60 s; exit {out.returncode})")
        if out.returncode:
            print(out.stderr.strip()[-500:])


if __name__ == "__main__":
    main()
