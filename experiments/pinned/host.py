"""What every chapter 3 experiment does around its GPU work: empty the pinned host cache
before and after (a known state, and no GiBs left cached in the reader's process), say
what this torch lacks, and warm the GPU up. The schema helpers of the chapter's data."""
from __future__ import annotations

import gc
from typing import Any

from ..core.lazy_torch import torch
from . import model as sup
from ..core.measure import gpu_sleep




_NUMBER = {"type": "number"}


def _numbers(min_items: int = 1) -> dict[str, Any]:
    return {"type": "array", "items": _NUMBER, "minItems": min_items}




def _release_pinned() -> str | None:
    """Drop garbage, wait for the GPU, and empty the pinned host cache where torch can.

    Experiments call this before measuring (a known, empty cache) and after (so a run
    does not leave GiBs of pinned memory cached in the reader's process). Returns the
    call used, or None when this torch has none.
    """
    gc.collect()
    torch.cuda.synchronize()
    found = sup.find_empty_host_cache()
    if found.call is None:
        return None
    found.call()
    return found.name


def _require_host_tools(what: str, *, stats: bool = True) -> None:
    """Raise a RuntimeError that says what this torch lacks for ``what``."""
    found = sup.find_empty_host_cache()
    if found.call is None:
        raise RuntimeError(f"{what} needs to empty the pinned host cache, but {found.note}")
    if stats and sup.host_stats() is None:
        raise RuntimeError(f"{what} reads torch.cuda.host_memory_stats(), which torch {torch.__version__} "
                           "does not have; it is in the releases from about 2.7 on")


def _warm_gpu() -> None:
    """Create the CUDA context and calibrate gpu_sleep before anything is timed."""
    torch.zeros(1, device="cuda")
    gpu_sleep(0.5)
    torch.cuda.synchronize()
