"""CUDA Memory Lab: real CUDA experiments on how PyTorch uses GPU memory.

One module per chapter (:mod:`.allocator`, :mod:`.streams`, :mod:`.pinned`,
:mod:`.syncs`, and :mod:`.calibration` for how the book measures) and a small core:
:mod:`.device` (GPU and provenance), :mod:`.measure` (timing, memory counters, the
calibrated GPU delay), :mod:`.registry` (experiments; live or recorded results),
:mod:`.store` (recorded JSON files), :mod:`.runner` (fresh processes with allocator
settings), :mod:`.plotting`, :mod:`.widgets`, :mod:`.claims` and :mod:`.checks`.

Typical page::

    import experiments as ex
    ex.status()                      # live on your GPU, or recorded on the lab GPU
    r = ex.run("alloc.anatomy")      # the same call either way
"""
from .core import (  # noqa: F401  (notebooks: from experiments import alloc_conf)
    alloc_conf,
)
from .core.checks import (
    Feedback,
)
from .core.claims import (
    claims_table,
)
from .core.device import (
    NoGPUError, Provenance, has_cuda,
)
from .core.registry import (
    Param, Result, experiment, get, resolve_mode, run, status, status_text,
)
from .core.store import (
    NotRecordedError, RecordedFileError,
)
from .core.widgets import (
    panel,
)

__all__ = [
    "Feedback", "NoGPUError", "NotRecordedError", "Param", "Provenance", "RecordedFileError", "Result",
    "claims_table", "experiment", "get", "has_cuda", "panel", "resolve_mode", "run", "status", "status_text",
]
__version__ = "0.1.0"
