"""How long the grader takes for one notebook, in its sandbox and without one: each chapter's
handed-out notebook, answered with the book's solutions where the answer is a function (so
the function harnesses run too), graded in recorded mode, once sandboxed and once with
``unsafe=True`` (a fresh kernel each, as in a real run). Prints seconds per notebook and the
sandbox's overhead, and the one-time cost of finding the sandbox.

    python benchmarks/grading.py [--timeout 600] [--repeats 1]
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from experiments.grading.grader import Grader
from experiments.grading.sandbox import Limits

ROOT = Path(__file__).resolve().parent.parent
# The function answers of chapter 1, as its solutions write them.
FUNCTIONS = {
    "al.check_frag_index(None)": ('def frag_index(segments):\n'
                                  '    free = [b["size"] for s in segments for b in s["blocks"] if b["state"] == "inactive"]\n'
                                  '    return 0.0 if not free else 1 - max(free) / sum(free)\n\n'
                                  'al.check_frag_index(frag_index)'),
    "al.check_reserved_function(None)": ("import math\n\ndef mapped(k, s):\n    return 20 * math.ceil(k * s / 20)\n\n"
                                         "al.check_reserved_function(mapped)"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=600.0, help="time limit per notebook, s")
    parser.add_argument("--repeats", type=int, default=1, help="gradings of each notebook per way (median shown)")
    args = parser.parse_args()
    os.environ["CUDA_MEMLAB_MODE"] = "recorded"  # the checks' comparisons, as `grade` sets it
    spec = importlib.util.spec_from_file_location("student_edition", ROOT / "scripts" / "student_edition.py")
    student_edition = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(student_edition)
    with tempfile.TemporaryDirectory() as tmp:
        paths = [p for p in student_edition.write_notebooks(Path(tmp)) if re.match(r"ch\d", p.stem)]
        for p in paths:
            nb = nbformat.read(p, as_version=4)
            for cell in nb.cells:
                for old, new in FUNCTIONS.items():
                    if cell.cell_type == "code" and old in cell.source:
                        cell.source = cell.source.replace(old, new)
            nbformat.write(nb, p)
        graders = {}
        for way, unsafe in (("sandboxed", False), ("no sandbox", True)):
            g = Grader(limits=Limits(timeout_s=args.timeout), unsafe=unsafe, hide=[tmp])
            t0 = time.perf_counter()
            described = g.prepare()
            print(f"{way:10s}: {described}; finding it took {time.perf_counter() - t0:.1f} s")
            graders[way] = g
        sb = graders["sandboxed"].sandbox
        start = {}
        for way, argv in (("sandboxed", None), ("bare", [sys.executable, "-S", "-c", "pass"])):
            runs = []
            for _ in range(20):
                t0 = time.perf_counter()
                if argv is None:
                    sb.run(["-S", "-c", "pass"], b"", seconds=30, limits=Limits(), module=None)
                else:
                    subprocess.run(argv, check=True)
                runs.append(time.perf_counter() - t0)
            start[way] = statistics.median(runs) * 1e3
        print(f"starting a Python that does nothing: {start['bare']:.0f} ms bare, {start['sandboxed']:.0f} ms in the "
              f"sandbox (median of 20); a notebook starts one sandbox, and one more per function answer")
        print(f"{'notebook':28s} {'sandboxed':>10s} {'no sandbox':>11s} {'overhead':>9s}  result")
        for p in paths:
            took = {}
            for way, g in graders.items():
                runs = []
                for _ in range(args.repeats):
                    t0 = time.perf_counter()
                    rows = g.grade_notebook(p, name=p.name)
                    runs.append(time.perf_counter() - t0)
                took[way] = statistics.median(runs)
            print(f"{p.name:28s} {took['sandboxed']:9.1f}s {took['no sandbox']:10.1f}s "
                  f"{took['sandboxed'] - took['no sandbox']:+8.1f}s  {rows[-1].score:g}/{rows[-1].max_score:g} "
                  f"({rows[-1].feedback})")
        for g in graders.values():
            g.close()


if __name__ == "__main__":
    main()
