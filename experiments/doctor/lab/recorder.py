"""What every program of the doctor's lab uses on the GPU: phase marks with the GPU's own
counters (:class:`Recorder`), the allocation history, allocation, probes, and calibrated GPU
work. torch is imported inside the functions: the lab's modules import without a GPU.

Sources: ``torch/cuda/memory.py`` (``_record_memory_history``, ``_snapshot``, ``memory_stats``).
"""
from __future__ import annotations

from typing import Any

SLEEP_CYCLES_PER_MS = 2_000_000   # the lab H200 runs _sleep at about 1.98 GHz; only "long" matters


def gpu_stats() -> dict[str, int]:
    """The allocator's counters the lab records after each phase (``torch.cuda.memory_stats``
    keys, bytes and counts), with ``memory_reserved`` and ``memory_allocated``."""
    import torch

    s = torch.cuda.memory_stats()
    keys = ("allocated_bytes.all.current", "reserved_bytes.all.current", "active_bytes.all.current",
            "requested_bytes.all.current", "allocated_bytes.all.peak", "reserved_bytes.all.peak",
            "num_alloc_retries", "num_ooms", "segment.all.current", "num_device_alloc", "num_device_free")
    out = {k: int(s.get(k, 0)) for k in keys}
    out["memory_reserved"] = int(torch.cuda.memory_reserved())
    out["memory_allocated"] = int(torch.cuda.memory_allocated())
    return out


class Recorder:
    """Phase marks: the trace length and the GPU's counters after each phase (``phases``)."""

    def __init__(self) -> None:
        self.phases: list[dict[str, Any]] = []

    def mark(self, name: str) -> None:
        """Synchronize, then note the trace's length (it ends with this ``snapshot`` entry) and
        the counters as phase ``name``."""
        import torch

        torch.cuda.synchronize()
        n = len(torch.cuda.memory._snapshot()["device_traces"][0])  # ends with this 'snapshot' entry
        self.phases.append({"phase": name, "trace_index": n, **gpu_stats()})


def fresh_compile_caches() -> str:
    """Point Inductor's and Triton's caches at a new empty folder, for this process: a warm
    cache (another setting's process of the same recording) skips compile work that
    allocates, and the runs would differ. Returns the folder. Call before torch compiles."""
    import os
    import tempfile

    fresh = tempfile.mkdtemp(prefix="memlab-inductor-")
    os.environ.update(TORCHINDUCTOR_CACHE_DIR=fresh, TRITON_CACHE_DIR=os.path.join(fresh, "triton"),
                      TORCHINDUCTOR_FX_GRAPH_CACHE="0", TORCHINDUCTOR_AUTOGRAD_CACHE="0")
    return fresh


def start_history(max_entries: int, frames: bool = False) -> None:
    """Turn on the allocation history (``_record_memory_history``): every request with its
    Python stack (``frames``: the full context, as readers' snapshots usually have it)."""
    import torch

    try:
        torch.cuda.memory._record_memory_history(enabled="all", context="all" if frames else None,
                                                 stacks="python", max_entries=max_entries)
    except TypeError:  # older signature
        torch.cuda.memory._record_memory_history(True, trace_alloc_max_entries=max_entries)


def empty(nbytes: int, stream: Any = None) -> Any:
    """An uninitialised tensor of ``nbytes`` bytes on the GPU (on ``stream`` if given)."""
    import torch

    if stream is None:
        return torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    with torch.cuda.stream(stream):
        return torch.empty(nbytes, dtype=torch.uint8, device="cuda")


def probe(nbytes: int) -> bool:
    """Allocate ``nbytes`` and free it at once; False when it does not fit (the OOM is caught)."""
    import torch

    try:
        t = empty(nbytes)
    except torch.OutOfMemoryError:
        return False
    del t
    return True


def sleep_ms(ms: float) -> None:
    """GPU work of about ``ms`` milliseconds on the current stream (``torch.cuda._sleep``)."""
    import torch

    torch.cuda._sleep(int(ms * SLEEP_CYCLES_PER_MS))


def warm_streams(*streams: Any) -> None:
    """Load the sleep kernel and make each stream's first event before the program's first
    phase, so that a slow first launch cannot let the GPU catch up with the host later on."""
    import torch

    for st in streams:
        with torch.cuda.stream(st):
            sleep_ms(0.1)
            torch.cuda.Event().record(st)
    torch.cuda.synchronize()


__all__ = ["Recorder", "empty", "gpu_stats", "probe", "sleep_ms", "start_history", "warm_streams"]
