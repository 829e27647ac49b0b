"""Entry point of the fresh process started by :func:`experiments.core.runner.run_fresh`.

Usage: ``python -m experiments.core._child REQUEST.json RESPONSE.json``. Writes
``{"ok": true, "value": ...}`` or ``{"ok": false, "error_kind": ..., "message": ...}``.
"""
from __future__ import annotations

import importlib
import json
import sys
import traceback

from .files import write_atomic
from .units import MiB


def _classify(exc: BaseException) -> str:
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        return "oom"
    text = str(exc)
    if isinstance(exc, RuntimeError) and ("CachingAllocator option" in text or "PYTORCH_CUDA_ALLOC_CONF" in text
                                          or "Unrecognized key" in text or "AllocatorConfig" in text):
        return "config"
    return "error"


def main(argv: list[str]) -> int:
    req_path, resp_path = argv[1], argv[2]
    req = json.loads(open(req_path).read())
    try:
        import torch

        from .store import to_jsonable

        if req.get("memory_fraction") is not None or req.get("memory_cap_mib") is not None:
            if not torch.cuda.is_available():
                raise RuntimeError("a memory cap needs a CUDA GPU")
            if req.get("memory_fraction") is None:
                from .device import cap_memory

                cap_memory(req["memory_cap_mib"] * MiB)
            else:
                torch.cuda.set_per_process_memory_fraction(req["memory_fraction"])
        module_name, _, func_name = req["target"].partition(":")
        func = getattr(importlib.import_module(module_name), func_name)
        value = to_jsonable(func(**req["kwargs"]))
        out = {"ok": True, "value": value}
    except BaseException as exc:  # report every failure as data; the parent decides
        out = {"ok": False, "error_kind": _classify(exc), "message": f"{type(exc).__name__}: {exc}",
               "traceback": traceback.format_exc()}
        sys.stderr.write(out["traceback"])
    write_atomic(resp_path, json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
