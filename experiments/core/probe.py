"""What this machine offers the book: GPU, versions, and the torch features the chapters use.

Instructors run it on lab machines, or in a Colab cell after the set-up cell, before a
session: ``python -m experiments probe`` (``--json`` for a machine-readable report).
The feature names follow the torch sources and release notes each chapter cites.
"""
from __future__ import annotations

import json
from typing import Any

from .lazy_torch import torch
from . import device

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
    """The report: torch and CUDA build versions, GPU provenance (None without one), free
    and total GPU memory (bytes), the calibrated _sleep cycles per ms, and each feature."""
    report: dict = {"torch": torch.__version__, "cuda_build": torch.version.cuda, "gpu": None}
    report["features"] = {name: bool(check()) for name, check in FEATURES.items()}
    if device.has_cuda():
        report["gpu"] = device.collect_provenance().to_dict()
        free, total = torch.cuda.mem_get_info()
        report["free_bytes"], report["total_bytes"] = int(free), int(total)
        try:
            from .measure import calibrate_sleep

            report["sleep_cycles_per_ms"] = calibrate_sleep()
        except Exception as e:  # a probe reports, it does not stop
            report["sleep_cycles_per_ms"] = f"failed: {e}"
    return report


def report_text(report: dict[str, Any]) -> str:
    """The report as the lines ``python -m experiments probe`` prints."""
    gpu = report["gpu"]
    lines = [f"torch {report['torch']} (CUDA build {report['cuda_build']})",
             f"GPU: {device.Provenance.from_dict(gpu).summary() if gpu else 'none visible: recorded mode only'}"]
    if gpu:
        lines.append(f"free {report['free_bytes'] / 2**30:.1f} of {report['total_bytes'] / 2**30:.1f} GiB; "
                     f"_sleep: {report['sleep_cycles_per_ms']} cycles/ms")
    lines += [f"  [{'x' if ok else ' '}] {name}" for name, ok in report["features"].items()]
    return "\n".join(lines)


def report_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=1)
