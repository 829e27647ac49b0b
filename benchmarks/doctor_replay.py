"""Speed and memory of the allocator doctor on a real recorded trace.

The trace: the eager training loop of ``experiments.doctor.lab.cases`` (about 450,000
events), its raw ``torch.cuda.memory._snapshot()`` pickle gzip'd, as ``python -m experiments
record --experiment alloc.doctor_cases`` writes it on the lab GPU
(``benchmarks/data/doctor_cases/eager_long.pickle.gz``: ``doctor_cases.pickle_dir()``);
``--trace PATH`` takes another (a pickle, gzip'd or not). Prints, against the targets for the
2-core CI machine:

* start-up: ``python -m experiments doctor --help``, whole process (target <= 0.3 s);
* ``doctor --json`` end to end, whole process: wall and CPU seconds (target <= 2.0 s) and
  peak memory (VmHWM) against the uncompressed pickle's size (target <= 3x);
* in one process: reading the trace, the exact replay in events per second (target >= 500k
  per CPU second), three what-ifs against the replay's time (target <= 3x), --suggest
  (target <= 10 s);
* with ``--synthetic``, the replay rate on synthetic traces of 300 and 8,000 live blocks.

Wall times on a shared machine are noisy: each figure is the median of ``--repeat`` runs, with
the CPU seconds beside it (other processes disturb them less). Compare two versions of the
code with ``farm-bench --vs``.

* with ``--layouts``, the same trace in torch 2.12's layout (read time against 2.11's, target
  <= 1.5x; ``doctor --json`` against ``pickle.load``, target <= 6x) and a 1M-entry 2.12 trace.

Usage: python benchmarks/doctor_replay.py [--trace PATH] [--repeat N] [--synthetic] [--layouts]
"""
from __future__ import annotations

import argparse
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from experiments.doctor.answers.suggest import run_many, suggest  # noqa: E402
from experiments.doctor.answers.whatif import WhatIf  # noqa: E402
from experiments.doctor.model.engine import Engine  # noqa: E402
from experiments.doctor.model.rules import H200_TOTAL_MEMORY, AllocatorConfig  # noqa: E402
from experiments.doctor.reading.loader import read_bytes  # noqa: E402
from experiments.doctor.reading.trace import Trace, read  # noqa: E402
from experiments.doctor.replaying.replay import replay  # noqa: E402

WHAT_IFS = ("expandable_segments:True", "max_split_size_mb:64", "roundup_power2_divisions:4")
# Where the lab GPU's recording is written (experiments/doctor/lab/cases.py pickle_dir;
# not imported from there: that module registers an experiment and imports the registry).
LONG_TRACE = ROOT / "benchmarks" / "data" / "doctor_cases" / "eager_long.pickle.gz"

_HWM = """
import atexit, runpy, sys
OUT = sys.argv[1]
def _hwm():
    with open(OUT, "w") as f:
        f.write(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1])
atexit.register(_hwm)
sys.argv = ["experiments"] + sys.argv[2:]
runpy.run_module("experiments", run_name="__main__", alter_sys=True)
"""


def whole_process(args: list[str], repeat: int) -> tuple[float, float, float]:
    """(median wall s, median CPU s, peak memory MiB) of ``python -m experiments ARGS``, each
    run in a fresh process; the memory is the process's own high-water mark (VmHWM)."""
    walls, cpus, hwm = [], [], 0.0
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "hwm")
        for _ in range(repeat):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            p = subprocess.run([sys.executable, "-c", _HWM, str(out), *args], cwd=ROOT, capture_output=True,
                               text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
            walls.append(time.perf_counter() - t0)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
            if p.returncode:
                raise SystemExit(f"python -m experiments {' '.join(args)} failed: {p.stderr.strip()[-400:]}")
            if out.exists():
                hwm = max(hwm, int(out.read_text()) / 1024)
    return statistics.median(walls), statistics.median(cpus), hwm


def timed(fn, repeat: int):
    """(result, median wall s, median CPU s) of ``fn()`` run ``repeat`` times."""
    walls, cpus, res = [], [], None
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        res = fn()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    return res, statistics.median(walls), statistics.median(cpus)


def verdict(ok: bool) -> str:
    return "meets it" if ok else "MISSES it"


def real_trace(path: Path, repeat: int) -> None:
    raw = read_bytes(path)
    size = len(raw)
    del raw
    print(f"trace: {path} ({path.stat().st_size / 2**20:.1f} MiB on disk, {size / 2**20:.1f} MiB as a pickle); "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    wall, cpu, _ = whole_process(["doctor", "--help"], repeat)
    print(f"start-up, `doctor --help` whole process: {wall:.2f} s wall, {cpu:.2f} s CPU "
          f"(target <= 0.3 s: {verdict(wall <= 0.3)}; on CPU time {verdict(cpu <= 0.3)})")
    wall, cpu, hwm = whole_process(["doctor", str(path), "--json"], repeat)
    print(f"`doctor --json` end to end: {wall:.2f} s wall, {cpu:.2f} s CPU (target <= 2.0 s: {verdict(wall <= 2.0)}; "
          f"on CPU time {verdict(cpu <= 2.0)}); "
          f"peak memory {hwm:.0f} MiB = {hwm * 2**20 / size:.1f}x the pickle (target <= 3x: "
          f"{verdict(hwm * 2**20 <= 3 * size)})")
    wall3, cpu3, hwm3 = whole_process(["doctor", str(path), "--json", *sum((["--what-if", w] for w in WHAT_IFS), [])],
                                      max(1, repeat // 2))
    print(f"`doctor --json` with three --what-if: {wall3:.2f} s wall, {cpu3:.2f} s CPU, peak memory {hwm3:.0f} MiB")
    trace, w_read, c_read = timed(lambda: read(str(path)), repeat)
    n = len(trace.events)
    print(f"read (restricted loader, {n:,} events): {w_read:.2f} s wall, {c_read:.2f} s CPU")
    run, w_rep, c_rep = timed(lambda: replay(trace, series=False), repeat)
    print(f"replay: {n / w_rep:,.0f} events per wall second, {n / c_rep:,.0f} per CPU second "
          f"(target >= 500,000: {verdict(n / c_rep >= 500_000)}; matches the trace: {run.matches_trace})")
    total = trace.total_memory or H200_TOTAL_MEMORY
    parsed = [WhatIf.parse(s) for s in WHAT_IFS]
    _, w_wi, c_wi = timed(lambda: run_many(run, parsed, cap_bytes=trace.cap_bytes, total_memory=total, workers=1),
                          max(1, repeat // 2))
    _, w_wp, _ = timed(lambda: run_many(run, parsed, cap_bytes=trace.cap_bytes, total_memory=total),
                       max(1, repeat // 2))
    print(f"three what-ifs: {c_wi:.2f} s CPU in one process = {c_wi / c_rep:.1f}x the replay (target <= 3x: "
          f"{verdict(c_wi <= 3 * c_rep)}); {w_wp:.2f} s wall spread over the cores")
    _, w_sug, c_sug = timed(lambda: suggest(run, trace.settings, cap_bytes=trace.cap_bytes, total_memory=total), 1)
    print(f"--suggest: {w_sug:.1f} s wall ({c_sug:.1f} s CPU in this process; the grid runs in forked workers) "
          f"(target <= 10 s: {verdict(w_sug <= 10)})")
    if os.getloadavg()[0] > (os.cpu_count() or 1):
        print("note: the machine was busier than its cores (load average above): wall times are inflated; "
              "the CPU-time verdicts are the fairer ones")


# ----------------------------------------------------------------------------- newer layouts

def layouts(path: Path, repeat: int) -> None:
    """The same trace as torch 2.11 and 2.12+ write it (pool_id on every entry, forward_frames on
    every third allocation; as_layout of tests/doctor_torch_versions.py): reading time against the 2.11
    layout's (target <= 1.5x) and against pickle.loads; ``doctor --json`` end to end on the 2.12
    layout against pickle.load (target <= 6x); a 1M-entry 2.12 trace within the default budget."""
    import gzip
    import pickle

    from tests.doctor_torch_versions import as_layout
    from tests.test_doctor_newer import _million

    with gzip.open(path) as f:
        raw = pickle.load(f)   # our own recording (benchmarks/data): safe to unpickle here
    b11 = pickle.dumps(raw, protocol=4)
    b12 = pickle.dumps(as_layout(raw, "2.12", forward_every=3), protocol=4)
    del raw
    _, _, c11 = timed(lambda: read(b11), repeat)
    _, _, c12 = timed(lambda: read(b12), repeat)
    _, _, p12 = timed(lambda: pickle.loads(b12), repeat)
    print(f"read, 2.11 layout: {c11:.2f} s CPU; 2.12 layout (pool_id, forward_frames on 1 alloc in 3): {c12:.2f} s "
          f"CPU = {c12 / c11:.2f}x (target <= 1.5x: {verdict(c12 <= 1.5 * c11)}); pickle.loads of it {p12:.2f} s")
    with tempfile.NamedTemporaryFile(suffix=".pickle") as f:
        f.write(b12)
        f.flush()
        wall, cpu, _ = whole_process(["doctor", f.name, "--json"], repeat)
    print(f"`doctor --json` end to end on the 2.12 layout: {wall:.2f} s wall, {cpu:.2f} s CPU = {cpu / p12:.1f}x "
          f"pickle.load (target <= 6x: {verdict(cpu <= 6 * p12)}; <= 2 s: {verdict(cpu <= 2.0)})")
    big = _million()
    t, _, c1m = timed(lambda: read(big), 1)
    _, _, p1m = timed(lambda: pickle.loads(big), 1)
    print(f"1M-entry 2.12 trace ({len(big) / 2**20:.0f} MiB): read in {c1m:.2f} s CPU within the default budget "
          f"({len(t.events):,} events; pickle.loads {p1m:.2f} s)")


# ----------------------------------------------------------------------------- synthetic traces

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


def synthetic(n: int, repeat: int) -> None:
    for live, target in ((300, 500_000), (8000, 200_000)):
        trace = synthetic_trace(n, live)
        run, wall, cpu = timed(lambda: replay(trace, series=False), repeat)
        print(f"synthetic replay, {n:,} events, ~{live:,} live blocks: {n / cpu:,.0f} events per CPU second, "
              f"{n / wall:,.0f} per wall second (target {target:,}: {verdict(n / cpu >= target)}; "
              f"exact: {run.matches_trace})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, help=f"a snapshot pickle (default {LONG_TRACE.relative_to(ROOT)})")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each measurement (median; default 3)")
    ap.add_argument("--synthetic", action="store_true", help="also the synthetic traces")
    ap.add_argument("--layouts", action="store_true", help="also the trace in torch 2.12's layout, and a 1M-entry one")
    ap.add_argument("--events", type=int, default=1_000_000, help="events of each synthetic trace")
    a = ap.parse_args()
    path = a.trace or LONG_TRACE
    if not path.exists():
        raise SystemExit(f"no trace at {path}: record it on a GPU with `python -m experiments record --experiment "
                         "alloc.doctor_cases`, or give --trace PATH")
    real_trace(path, a.repeat)
    if a.layouts:
        layouts(path, a.repeat)
    if a.synthetic:
        synthetic(a.events, a.repeat)


if __name__ == "__main__":
    main()
