"""torch, imported the first time something of it is used rather than when a chapter is imported.

Importing torch costs about 2 s of CPU. Without a GPU a page shows recorded results, an
instructor's grader runs each student notebook in a fresh kernel, and the command line answers
``list`` or ``doctor``: most of that never touches torch, yet every chapter module imported it.
The package's modules take ``torch`` from here instead (``from experiments.core.lazy_torch
import torch``, relative inside the package) and use it as the module itself. The first
attribute read (``torch.cuda``, ``torch.Tensor``) imports torch and puts the real module in
place of this stand-in in every ``experiments`` module that holds it, so afterwards a lookup
costs what it always did (the chapter 4 timings measure microseconds) and
``monkeypatch.setattr(torch.cuda, ...)`` patches the real module. A default argument bound to
the stand-in (``torch_module=torch``) keeps it and forwards every read.
"""
from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

_real: ModuleType | None = None


def load() -> ModuleType:
    """Import torch (once) and bind it in place of the stand-in wherever the package holds it.

    Returns:
        the torch module.

    Raises:
        ImportError: torch is not installed (as ``import torch`` would).
    """
    global _real, torch
    if _real is None:
        import torch as real

        _real = real
        for name, module in list(sys.modules.items()):
            if name != __name__ and (name == "experiments" or name.startswith("experiments.")) \
                    and isinstance(module, ModuleType):
                for key, value in list(vars(module).items()):
                    if value is _STAND_IN:
                        setattr(module, key, real)
        torch = real  # a module imported later takes the real one (_STAND_IN stays what it is)
    return _real


class _TorchOnFirstUse:
    """Stands for the torch module until something of it is read (then imports it)."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        return getattr(load(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(load(), name, value)

    def __delattr__(self, name: str) -> None:
        delattr(load(), name)

    def __repr__(self) -> str:
        return repr(_real) if _real is not None else "<torch, imported on first use>"


_STAND_IN = _TorchOnFirstUse()
torch: Any = _STAND_IN

__all__ = ["load", "torch"]
