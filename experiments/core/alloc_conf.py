"""Caching-allocator settings (``PYTORCH_CUDA_ALLOC_CONF``): parse, format, validate.

The allocator reads its settings once, when CUDA initialises, so every setting is
tried in a fresh process (:mod:`experiments.core.runner`). Option names and the release
that introduced each come from ``c10/cuda/CUDAAllocatorConfig.h`` and
``c10/core/AllocatorConfig.h`` of the 2.4.1 ... 2.14.1 wheels (see the background
note experiments/doctor/RULES.md §G) and the CUDA semantics notes,
https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from .text import close_names


@dataclasses.dataclass(frozen=True)
class AllocOption:
    """A known option: its value type, the first torch release that accepts it, and a note."""

    name: str
    kind: str  # 'bool', 'int', 'float', 'str', 'divisions'
    since: tuple[int, int]
    note: str


KNOWN_OPTIONS: dict[str, AllocOption] = {o.name: o for o in [
    AllocOption("backend", "str", (2, 4), "'native' (the caching allocator) or 'cudaMallocAsync'"),
    AllocOption("expandable_segments", "bool", (2, 4), "grow one mapped segment per pool and stream"),
    AllocOption("max_split_size_mb", "int", (2, 4), "blocks at least this large (MiB, >= large_segment_size_mb, 20 by default) are never split"),
    AllocOption("roundup_power2_divisions", "divisions", (2, 4), "round requests to 1/N steps of their power-of-two interval"),
    AllocOption("garbage_collection_threshold", "float", (2, 4), "free old cached blocks above this fraction (0-1) of the cap"),
    AllocOption("release_lock_on_cudamalloc", "bool", (2, 4), "drop the allocator lock around cudaMalloc"),
    AllocOption("release_lock_on_hipmalloc", "bool", (2, 4), "the same, ROCm's spelling (CUDA builds accept it)"),
    AllocOption("pinned_use_hip_host_register", "bool", (2, 4), "pinned_use_cuda_host_register, ROCm's spelling (CUDA builds accept it)"),
    AllocOption("pinned_use_cuda_host_register", "bool", (2, 4), "pin with cudaHostRegister instead of cudaHostAlloc"),
    AllocOption("pinned_num_register_threads", "int", (2, 4), "threads that touch pages before cudaHostRegister"),
    AllocOption("max_non_split_rounding_mb", "int", (2, 6), "how much larger than a request an unsplit block may be (MiB, >= large_segment_size_mb)"),
    AllocOption("pinned_use_background_threads", "bool", (2, 6), "poll pinned-block events on a background thread"),
    AllocOption("graph_capture_record_stream_reuse", "bool", (2, 9), "reuse record_stream blocks during graph capture"),
    AllocOption("large_segment_size_mb", "int", (2, 10), "segment size for 1-10 MiB requests (MiB, > 10)"),
    AllocOption("per_process_memory_fraction", "float", (2, 10), "cap on the allocator's memory, as a fraction of the device"),
    AllocOption("pinned_reserve_segment_size_mb", "int", (2, 10), "reserve one pinned region up front (MiB)"),
    AllocOption("throw_on_cudamalloc_oom", "bool", (2, 12), "with a memory fraction: refuse a segment over it at once (no release, no retry)"),
    AllocOption("pinned_free_catch_all", "bool", (2, 12), "swallow errors when freeing pinned memory at shutdown"),
    AllocOption("pinned_max_round_threshold_mb", "int", (2, 13), "no power-of-two rounding for pinned requests above this (MiB)"),
    AllocOption("pinned_max_cached_size_mb", "int", (2, 13), "pinned blocks above this (MiB) are freed, not cached"),
]}


def torch_version() -> tuple[int, int]:
    """(major, minor) of the installed torch. Imported only when asked: parsing settings needs
    no torch (the allocator doctor runs where there is none)."""
    from .device import torch_version as installed

    return installed()


class UnsupportedOptionError(ValueError):
    """The option exists in some torch release, but not in the installed one."""


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside [...] (roundup_power2_divisions lists)."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def _convert(opt: AllocOption, raw: str) -> Any:
    if opt.kind == "bool":
        if raw not in ("True", "False", "true", "false"):
            raise ValueError(f"{opt.name} must be True or False, got {raw!r}")
        return raw.lower() == "true"
    if opt.kind == "int":
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"{opt.name} must be an integer number of MiB, got {raw!r}") from None
    if opt.kind == "float":
        try:
            return float(raw)
        except ValueError:
            raise ValueError(f"{opt.name} must be a number, got {raw!r}") from None
    if opt.kind == "divisions" and raw.isdigit():
        return int(raw)  # 'roundup_power2_divisions:4' is one division count for every size
    return raw


def parse(text: str) -> dict[str, Any]:
    """'expandable_segments:True,max_split_size_mb:64' -> {'expandable_segments': True, ...}.

    Raises:
        ValueError: a malformed entry or an unknown option name (listing the known ones).
    """
    out: dict[str, Any] = {}
    for part in _split_top_level(text):
        name, sep, raw = part.partition(":")
        if not sep:
            raise ValueError(f"allocator setting {part!r} must look like name:value")
        name = name.strip()
        if name not in KNOWN_OPTIONS:
            raise ValueError(f"unknown allocator option {name!r}{close_names(name, KNOWN_OPTIONS)}; "
                             f"known options: {sorted(KNOWN_OPTIONS)}")
        out[name] = _convert(KNOWN_OPTIONS[name], raw.strip())
    return out


def _value_text(opt: AllocOption, value: Any) -> str:
    if opt.kind == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"{opt.name} must be True or False, got {value!r}")
        return "True" if value else "False"
    if opt.kind == "int":
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{opt.name} must be a non-negative integer (MiB), got {value!r}")
        if opt.name == "max_split_size_mb" and value < 20:
            raise ValueError(f"max_split_size_mb must be >= 20 (MiB; >= large_segment_size_mb), got {value}")
        return str(value)
    if opt.kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{opt.name} must be a number, got {value!r}")
        if opt.name == "garbage_collection_threshold" and not 0 < value < 1:
            raise ValueError(f"{opt.name} must be in (0, 1), got {value}")
        if opt.name == "per_process_memory_fraction" and not 0 <= value <= 1:
            raise ValueError(f"{opt.name} must be in [0, 1], got {value}")
        return f"{value:g}"
    if opt.kind == "divisions":
        if isinstance(value, int) and not isinstance(value, bool):
            if value < 0 or (value > 1 and value & (value - 1)):
                raise ValueError(f"roundup_power2_divisions must be 0, 1 or a power of two, got {value}")
            return str(value)
        if isinstance(value, str) and value.startswith("[") and value.endswith("]"):
            return value
        raise ValueError(f"roundup_power2_divisions must be a power of two or a '[MB:N,...,>:N]' list, got {value!r}")
    if opt.name == "backend" and value not in ("native", "cudaMallocAsync"):
        raise ValueError(f"backend must be 'native' or 'cudaMallocAsync', got {value!r}")
    return str(value)


def render(settings: Mapping[str, Any] | str | None, *, version: tuple[int, int] | None = None) -> str:
    """Validate ``settings`` and render them as a ``PYTORCH_CUDA_ALLOC_CONF`` string.

    Args:
        settings: a dict such as ``{'expandable_segments': True}``, a string in the
            environment variable's syntax, or None (no settings: '').
        version: (major, minor) of torch to check against; default the installed one.

    Raises:
        ValueError: unknown option or bad value, naming the option and what it accepts.
        UnsupportedOptionError: the option is newer than the torch checked against.
    """
    if settings is None:
        return ""
    if isinstance(settings, str):
        settings = parse(settings)
    version = version or torch_version()
    parts = []
    for name, value in settings.items():
        opt = KNOWN_OPTIONS.get(name)
        if opt is None:
            raise ValueError(f"unknown allocator option {name!r}{close_names(name, KNOWN_OPTIONS)}; "
                             f"known options: {sorted(KNOWN_OPTIONS)}")
        if version < opt.since:
            raise UnsupportedOptionError(
                f"allocator option {name!r} needs torch >= {opt.since[0]}.{opt.since[1]}; "
                f"this is torch {version[0]}.{version[1]}"
            )
        parts.append(f"{name}:{_value_text(opt, value)}")
    return ",".join(parts)
