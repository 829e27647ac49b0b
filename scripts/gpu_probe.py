"""Report what this machine offers the book: GPU, versions, and the torch features each
chapter uses. Instructors run it on lab machines before a session:

    python scripts/gpu_probe.py            # human-readable
    python scripts/gpu_probe.py --json     # machine-readable
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from experiments import device  # noqa: E402

FEATURES = {
    "torch.cuda._sleep (calibrated GPU work)": lambda: hasattr(torch.cuda, "_sleep"),
    "torch.cuda.memory._snapshot (segment maps)": lambda: hasattr(torch.cuda.memory, "_snapshot"),
    "torch.cuda.memory._record_memory_history": lambda: hasattr(torch.cuda.memory, "_record_memory_history"),
    "torch.cuda.MemPool / use_mem_pool": lambda: hasattr(torch.cuda, "MemPool") and hasattr(torch.cuda, "use_mem_pool"),
    "torch.cuda.graph_pool_handle (shared graph pools)": lambda: hasattr(torch.cuda, "graph_pool_handle"),
    "torch.cuda.host_memory_stats (pinned allocator)": lambda: hasattr(torch.cuda, "host_memory_stats"),
    "torch._C._host_emptyCache (2.5-2.11; later torch has the public call below)": lambda: hasattr(torch._C, "_host_emptyCache"),
    "torch.accelerator.empty_host_cache (2.12+)": lambda: hasattr(getattr(torch, "accelerator", None), "empty_host_cache"),
    "torch.cuda.set_sync_debug_mode": lambda: hasattr(torch.cuda, "set_sync_debug_mode"),
    "torch.OutOfMemoryError": lambda: hasattr(torch, "OutOfMemoryError"),
}


def probe() -> dict:
    report: dict = {"torch": torch.__version__, "cuda_build": torch.version.cuda, "gpu": None}
    report["features"] = {name: bool(check()) for name, check in FEATURES.items()}
    if device.has_cuda():
        report["gpu"] = device.collect_provenance().to_dict()
        free, total = torch.cuda.mem_get_info()
        report["free_bytes"], report["total_bytes"] = int(free), int(total)
        try:
            from experiments.core.measure import calibrate_sleep

            report["sleep_cycles_per_ms"] = calibrate_sleep()
        except Exception as e:  # a probe reports, it does not stop
            report["sleep_cycles_per_ms"] = f"failed: {e}"
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    report = probe()
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    gpu = report["gpu"]
    print(f"torch {report['torch']} (CUDA build {report['cuda_build']})")
    print(f"GPU: {device.Provenance.from_dict(gpu).summary() if gpu else 'none visible: recorded mode only'}")
    if gpu:
        print(f"free {report['free_bytes'] / 2**30:.1f} of {report['total_bytes'] / 2**30:.1f} GiB; "
              f"_sleep: {report['sleep_cycles_per_ms']} cycles/ms")
    for name, ok in report["features"].items():
        print(f"  [{'x' if ok else ' '}] {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
