"""CUDA Memory Lab: real CUDA experiments on how PyTorch uses GPU memory.

One package per chapter (:mod:`.allocator`, :mod:`.streams`, :mod:`.pinned`,
:mod:`.syncs`; :mod:`.calibration` for how the book measures) over a small :mod:`.core`:
device and provenance, measurement, the registry of experiments (live or recorded
results), recorded files, fresh processes, plotting, widgets, claims, checks, units,
tables and the command line. Imports run one way: chapters use the core, the core uses
no chapter, and a chapter's ``__init__`` only re-exports its public API.

Typical page::

    import experiments as ex
    ex.status()                      # live on your GPU, or recorded on the lab GPU
    r = ex.run("alloc.anatomy")      # the same call either way
"""
from .core import alloc_conf  # noqa: F401  (notebooks: from experiments import alloc_conf)
from .core.checks import Feedback
from .core.claims import claims_table, show_claim
from .core.device import NoGPUError, Provenance, has_cuda
from .core.registry import Param, Result, experiment, get, resolve_mode, run, status, status_text
from .core.store import NotRecordedError, RecordedFileError
from .core.widgets import panel

__all__ = [
    "Feedback", "NoGPUError", "NotRecordedError", "Param", "Provenance", "RecordedFileError", "Result",
    "claims_table", "show_claim", "experiment", "get", "has_cuda", "panel", "resolve_mode", "run", "status", "status_text",
]
__version__ = "0.1.0"

from .core.explorer import install_book_figures as _install_book_figures  # noqa: E402

# While the book is built (CUDA_MEMLAB_STATIC=1, in a notebook kernel): figures become
# <picture> with a phone-width variant and alt text; elsewhere this does nothing.
_install_book_figures()
