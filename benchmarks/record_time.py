"""How long `python -m experiments record` takes on this GPU, experiment by experiment (the
budget: every chapter recorded in <= 180 s on the lab H200).

Runs ``record``'s set (every experiment except those on a budget of their own, as the command
does) in one process, one experiment at a time, into a scratch folder (the package's recordings
are left alone), and prints each experiment's seconds, each chapter's, and the total with the
process's start-up. Needs a CUDA GPU.

Usage: python benchmarks/record_time.py [--chapter N] [--out DIR]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

T0 = time.perf_counter()
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from experiments.core import chapters, registry  # noqa: E402
from experiments.core.device import NoGPUError, require_cuda  # noqa: E402
from experiments.core.tables import Table  # noqa: E402

GOAL_S = 180.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chapter", type=int, choices=chapters.NUMBERS, help="only this chapter")
    ap.add_argument("--out", help="folder for the recordings (default: a temporary one, removed after)")
    args = ap.parse_args(argv)
    try:
        require_cuda("timing the recordings")
    except NoGPUError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out or tmp)
        rows, per_chapter, failed = [], {}, []
        for ch in ([args.chapter] if args.chapter is not None else chapters.NUMBERS):
            for e in registry.all_experiments(ch):
                if e.own_budget:
                    continue
                t = time.perf_counter()
                _, failures = registry.record([e], root=out, progress=False)
                s = time.perf_counter() - t
                per_chapter[ch] = per_chapter.get(ch, 0.0) + s
                rows.append((str(ch), e.id, str(len(e.grid)), f"{s:.1f}", "FAILED" if failures else ""))
                failed += list(failures)
        print(Table(["ch", "experiment", "points", "seconds", ""], rows))
        print("chapters: " + ", ".join(f"{ch}: {s:.1f} s" for ch, s in per_chapter.items()))
    total = time.perf_counter() - T0
    print(f"total with start-up: {total:.1f} s (goal <= {GOAL_S:.0f} s for every chapter)")
    return 1 if failed or (args.chapter is None and total > GOAL_S) else 0


if __name__ == "__main__":
    sys.exit(main())
