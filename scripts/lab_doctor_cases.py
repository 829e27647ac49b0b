"""Lab batch: run every doctor case under every setting on this GPU, several fresh processes at
once, and write what came back (compact snapshots, the GPU's counters, raw pickles of the
default runs) under OUT. For development of the doctor; the book's recordings come from
``python -m experiments record``.

Usage: python3 scripts/lab_doctor_cases.py OUT [--jobs N] [--case NAME ...]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from experiments.doctor.lab.cases import CASES, FRAMES  # noqa: E402
from experiments.core.runner import run_fresh  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--jobs", type=int, default=6)
    ap.add_argument("--case", action="append")
    args = ap.parse_args()
    out = Path(args.out)
    (out / "json").mkdir(parents=True, exist_ok=True)
    (out / "pickles").mkdir(parents=True, exist_ok=True)
    cases = args.case or list(CASES)
    jobs = [(c, s) for c in cases for s in CASES[c][1]]
    # longest first, so the pool ends together
    jobs.sort(key=lambda j: (j[0] not in ("compiled_graphs", "eager_long"), j[0]))

    def one(job):
        case, setting = job
        t0 = time.time()
        pickle_path = str(out / "pickles" / f"{case}.pickle.gz") if setting == "" else None
        r = run_fresh("experiments.doctor.lab.cases:case_worker",
                      {"case": case, "frames": case in FRAMES, "pickle_path": pickle_path},
                      alloc_conf_settings=setting or None, timeout_s=420)
        dt = time.time() - t0
        print(f"{case:18s} {setting or '(defaults)':55s} ok={r.ok} {dt:6.1f}s "
              f"{'' if r.ok else r.error_kind + ': ' + r.message[:300]}", flush=True)
        return case, setting, r, dt

    t0 = time.time()
    results: dict[str, list] = {c: [] for c in cases}
    with ThreadPoolExecutor(args.jobs) as ex:
        for case, setting, r, dt in ex.map(one, jobs):
            entry = {"settings": setting, "elapsed_s": round(dt, 1)}
            if r.ok:
                entry.update(r.value)
            else:
                entry.update({"error_kind": r.error_kind, "message": r.message, "stderr_tail": r.stderr_tail})
            results[case].append(entry)
    for case, runs in results.items():
        (out / "json" / f"{case}.json").write_text(json.dumps({"case": case, "cap_bytes": CASES[case][0],
                                                                "runs": runs}))
        for run in runs:
            f = run.get("final", {})
            print(f"  {case:18s} {run['settings'] or '(defaults)':55s} events={run.get('snapshot', {}).get('trace_events')}"
                  f" peak_reserved={f.get('reserved_bytes.all.peak')} final_reserved={f.get('reserved_bytes.all.current')}"
                  f" ooms={f.get('num_ooms')}")
    print(f"all cases in {time.time() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
