"""How long the grader takes for one notebook: each chapter's student notebook, blank and
in recorded mode, graded once (a fresh kernel each, as in a real run). Prints seconds.

    python benchmarks/grading.py [--timeout 600]
"""
from __future__ import annotations

import argparse
import importlib.util
import tempfile
import time
from pathlib import Path

from experiments.core import grading

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=600.0, help="time limit per notebook, s")
    args = parser.parse_args()
    spec = importlib.util.spec_from_file_location("student_edition", ROOT / "scripts" / "student_edition.py")
    student_edition = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(student_edition)
    with tempfile.TemporaryDirectory() as tmp:
        for path in student_edition.write_notebooks(Path(tmp)):
            if not path.stem.startswith("ch"):
                continue
            t0 = time.perf_counter()
            rows = grading.grade_notebook(path, timeout_s=args.timeout, name=path.name)
            took = time.perf_counter() - t0
            print(f"{path.name:28s} {took:6.1f} s  ({rows[-1].feedback})")


if __name__ == "__main__":
    main()
