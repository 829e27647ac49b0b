"""Where a test run's time went: ``python -m tests.times FILE [N]`` reads the lines that
``CUDA_MEMLAB_TEST_TIMES=FILE pytest ...`` wrote (tests/conftest.py) and prints the N costliest
test phases by CPU seconds (with their wall seconds), then each module's sums.

CPU seconds include the children that ended during the phase (kernels, subprocesses), and
only those the kernel hands back to the test process: a child still alive when the phase ends (a
module's browser) lands on a later phase, and the grader's sandboxed kernels (bubblewrap, a pid
namespace of their own) are never counted: test_grading.py's graded class shows 2 s here, while
its processes used about 100 s of CPU (summed from /proc while it ran, at load 10).
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip())
        return 2
    n = int(argv[1]) if len(argv) > 1 else 30
    rows = [json.loads(line) for line in open(argv[0], encoding="utf-8") if line.strip()]
    for r in rows:
        r["total_cpu"] = r["cpu"] + r["children_cpu"]
    print(f"{'cpu s':>8} {'wall s':>8}  phase     test")
    for r in sorted(rows, key=lambda r: -r["total_cpu"])[:n]:
        print(f"{r['total_cpu']:8.1f} {r['wall']:8.1f}  {r['phase']:<9} {r['test']}")
    modules = defaultdict(lambda: [0.0, 0.0, 0])
    for r in rows:
        m = modules[r["test"].split("::", 1)[0]]
        m[0] += r["total_cpu"]
        m[1] += r["wall"]
        m[2] += r["phase"] == "call"
    print(f"\n{'cpu s':>8} {'wall s':>8} {'tests':>6}  module")
    for name, (c, w, k) in sorted(modules.items(), key=lambda kv: -kv[1][0]):
        print(f"{c:8.1f} {w:8.1f} {k:6d}  {name}")
    cpu, wall = sum(m[0] for m in modules.values()), sum(m[1] for m in modules.values())
    print(f"{cpu:8.1f} {wall:8.1f} {sum(m[2] for m in modules.values()):6d}  all (wall summed over workers)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
