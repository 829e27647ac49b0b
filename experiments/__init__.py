"""CUDA Memory Lab: real CUDA experiments on how PyTorch uses GPU memory.

One package per chapter (:mod:`.allocator`, :mod:`.streams`, :mod:`.pinned`,
:mod:`.syncs`; :mod:`.calibration` for how the book measures) over a small :mod:`.core`:
device and provenance, measurement, the registry of experiments (live or recorded
results), recorded files, fresh processes, plotting, widgets, claims, checks, units,
tables and the command line. Tools readers take home are packages of their own beside the
chapters: :mod:`.doctor` (the allocator doctor; it imports neither torch, numpy nor
matplotlib). Imports run one way: chapters use the core and the tools, the core uses no
chapter, and a chapter's ``__init__`` only re-exports its public API.

Typical page::

    import experiments as ex
    ex.status()                      # live on your GPU, or recorded on the lab GPU
    r = ex.run("alloc.anatomy")      # the same call either way

The names below are imported on first use (PEP 562), so that ``import experiments.doctor``
(or ``python -m experiments doctor``) does not import torch through them.
"""
from __future__ import annotations

import importlib
from typing import Any

# name -> (module under experiments, attribute; None for the module itself)
_EXPORTS: dict[str, tuple[str, str | None]] = {
    "alloc_conf": ("core.alloc_conf", None),   # notebooks: from experiments import alloc_conf
    "Feedback": ("core.checks", "Feedback"),
    "claims_table": ("core.claims", "claims_table"),
    "show_claim": ("core.claims", "show_claim"),
    "NoGPUError": ("core.device", "NoGPUError"),
    "Provenance": ("core.device", "Provenance"),
    "has_cuda": ("core.device", "has_cuda"),
    "Param": ("core.registry", "Param"),
    "Result": ("core.registry", "Result"),
    "experiment": ("core.registry", "experiment"),
    "get": ("core.registry", "get"),
    "resolve_mode": ("core.registry", "resolve_mode"),
    "run": ("core.registry", "run"),
    "status": ("core.registry", "status"),
    "status_text": ("core.registry", "status_text"),
    "NotRecordedError": ("core.store", "NotRecordedError"),
    "RecordedFileError": ("core.store", "RecordedFileError"),
    "panel": ("core.widgets", "panel"),
}

__all__ = [
    "Feedback", "NoGPUError", "NotRecordedError", "Param", "Provenance", "RecordedFileError", "Result",
    "claims_table", "show_claim", "experiment", "get", "has_cuda", "panel", "resolve_mode", "run", "status", "status_text",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    try:
        module, attr = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'experiments' has no attribute {name!r}") from None
    mod = importlib.import_module(f"{__name__}.{module}")
    value = mod if attr is None else getattr(mod, attr)
    globals()[name] = value      # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
