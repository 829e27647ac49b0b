"""Chapter 3, the host caching allocator: power-of-two rounding of pinned blocks, the
cache's lifecycle (reuse guarded by events, nothing given back until empty_cache), and what
pinning itself costs. Source: ``aten/src/ATen/core/CachingHostAllocator.h``; post:
https://docs.pytorch.org/devlogs/eager/2026-08-09-pinned-memory-allocator/"""
from __future__ import annotations

import statistics
import time
from typing import Any, Mapping

from ..core.lazy_torch import torch
from . import model as sup
from ..core.claims import claim
from ..core.device import require_cuda
from ..core.measure import STATS_SCHEMA, stats_dict
from ..core.units import MiB
from .model import POST_URL, empty_host_cache, next_pow2
from ..core.registry import Param, experiment


from .host import _NUMBER, _numbers, _release_pinned, _require_host_tools, _warm_gpu


# ================================================================ 5. power-of-two rounding

POW2_REQUESTS = (1000, 4096, 5000, MiB + 1, 65 * MiB, 100 * MiB, 135_790_592)  # the last: 129.5 MiB


@experiment(
    "pinned.pow2_rounding",
    chapter=3,
    title="Pinned requests are rounded up to a power of two",
    data_schema={
        "type": "object",
        "required": ["requests_bytes", "owned_bytes", "new_blocks", "expected_bytes", "stats_naming"],
        "properties": {k: {"type": "array", "items": {"type": "integer"}, "minItems": 1}
                       for k in ("requests_bytes", "owned_bytes", "new_blocks", "expected_bytes")},
    },
)
def pow2_rounding() -> dict[str, Any]:
    """Pin each request of ``POW2_REQUESTS`` (1000 B to 129.5 MiB, all kept alive) and read how
    many bytes the host allocator came to own for it (``torch.cuda.host_memory_stats()``).

    Returns:
        per request: ``requests_bytes``, ``owned_bytes`` (growth of the owned bytes),
        ``new_blocks`` (growth of ``num_host_alloc``: 1 when a new block was pinned),
        ``expected_bytes`` (the next power of two); ``stats_naming``.

    Raises:
        RuntimeError: this torch cannot empty the host cache or has no host_memory_stats.
    """
    sup.check_host_fits("pinned.pow2_rounding", sum(next_pow2(r) for r in POW2_REQUESTS))
    require_cuda("pinned.pow2_rounding")
    _require_host_tools("pinned.pow2_rounding")
    _warm_gpu()
    _release_pinned()
    hold, owned, new_blocks = [], [], []
    naming = ""
    for r in POW2_REQUESTS:
        before = sup.host_stats()
        hold.append(torch.empty(r, dtype=torch.uint8, pin_memory=True))
        after = sup.host_stats()
        naming = sup.stats_naming(after)
        owned.append(sup.owned_bytes(after) - sup.owned_bytes(before))
        new_blocks.append(int(after["num_host_alloc"]) - int(before["num_host_alloc"]))
    del hold
    _release_pinned()
    return {"requests_bytes": list(POW2_REQUESTS), "owned_bytes": owned, "new_blocks": new_blocks,
            "expected_bytes": [next_pow2(r) for r in POW2_REQUESTS], "stats_naming": naming}


@claim("pinned.pow2_rounding", chapter=3, experiment="pinned.pow2_rounding", source=POST_URL,
       statement="A pinned request is rounded up to the next power of two.")
def _claim_pow2(d: Mapping[str, Any]) -> tuple[bool, dict[str, Any]]:
    rows = [(r, o, e) for r, o, e, nb in zip(d["requests_bytes"], d["owned_bytes"], d["expected_bytes"],
                                              d["new_blocks"]) if nb == 1]
    holds = len(rows) >= 5 and all(o == e for _, o, e in rows)
    return holds, {"requests (bytes)": [r for r, _, _ in rows], "blocks pinned (bytes)": [o for _, o, _ in rows],
                   "fresh blocks": len(rows)}


# ================================================================ 6. lifecycle of the host cache

@experiment(
    "pinned.lifecycle",
    chapter=3,
    title="What the host caching allocator owns, step by step",
    params=[Param("unit_mib", 1, choices=(1, 16, 64), unit="MiB",
                  help="the sizes of the script are multiples of this")],
    grid={"unit_mib": [1, 64]},
    data_schema={
        "type": "object",
        "required": ["steps", "owned_bytes", "num_host_alloc", "num_host_free", "model_owned_bytes", "step_ms"],
        "properties": {"steps": {"type": "array", "items": {"type": "string"}, "minItems": 2},
                       "owned_bytes": {"type": "array", "items": {"type": "integer"}},
                       "model_owned_bytes": {"type": "array", "items": {"type": "integer"}},
                       "num_host_alloc": {"type": "array", "items": {"type": "integer"}},
                       "num_host_free": {"type": "array", "items": {"type": "integer"}},
                       "step_ms": _numbers(2)},
    },
)
def lifecycle(unit_mib: int = 1) -> dict[str, Any]:
    """Run the script ``model.LIFECYCLE_STEPS`` (pin a, b, c; del a; pin d, e; del all;
    ``torch.cuda.empty_cache()``; empty the host cache) and read the host allocator after
    each step. No copies are involved, so freed blocks are cached at once.

    Returns:
        per step: ``steps`` (labels), ``owned_bytes`` (relative to the start),
        ``num_host_alloc`` and ``num_host_free`` (driver calls since the start),
        ``step_ms`` (host time of the step), and ``model_owned_bytes`` /
        ``model_num_host_alloc``: what :func:`.model.simulate_lifecycle` predicts.

    Raises:
        RuntimeError: this torch cannot empty the host cache or has no host_memory_stats.
    """
    unit = unit_mib * MiB
    model = sup.simulate_lifecycle(sup.LIFECYCLE_STEPS, unit_bytes=unit)
    sup.check_host_fits("unit_mib", max(m["owned_bytes"] for m in model))
    require_cuda("pinned.lifecycle")
    _require_host_tools("pinned.lifecycle")
    _warm_gpu()
    call = _release_pinned()
    base = sup.host_stats()
    live: dict[str, torch.Tensor] = {}
    owned, allocs, frees, step_ms = [], [], [], []
    for step in sup.LIFECYCLE_STEPS:
        t0 = time.perf_counter()
        kind = step[0]
        if kind == "pin":
            live[step[1]] = torch.empty(step[2] * unit, dtype=torch.uint8, pin_memory=True)
        elif kind == "del":
            del live[step[1]]
        elif kind == "del_all":
            live.clear()
        elif kind == "empty_device":
            torch.cuda.empty_cache()
        else:
            empty_host_cache()
        step_ms.append((time.perf_counter() - t0) * 1e3)
        s = sup.host_stats()
        owned.append(sup.owned_bytes(s) - sup.owned_bytes(base))
        allocs.append(int(s["num_host_alloc"]) - int(base["num_host_alloc"]))
        frees.append(int(s["num_host_free"]) - int(base["num_host_free"]))
    return {"steps": [sup.step_label(s, unit_mib) for s in sup.LIFECYCLE_STEPS], "owned_bytes": owned,
            "num_host_alloc": allocs, "num_host_free": frees, "step_ms": step_ms,
            "model_owned_bytes": [m["owned_bytes"] for m in model],
            "model_num_host_alloc": [m["num_host_alloc"] for m in model],
            "empty_host_cache_call": call, "stats_naming": sup.stats_naming(base)}


# ================================================================ 7. what pinning costs

PIN_SIZES_MIB = (1, 4, 16, 64, 256, 1024)


@experiment(
    "pinned.pin_cost",
    chapter=3,
    title="Pinning fresh memory against reusing a cached block",
    params=[Param("max_mib", 1024, choices=(64, 256, 1024), unit="MiB", help="largest size pinned"),
            Param("repeats", 3, min=1, max=10, unit="runs")],
    data_schema={
        "type": "object",
        "required": ["sizes_bytes", "fresh_ms", "cached_ms", "pin_memory_ms", "fresh_ms_per_mib"],
        "properties": {"sizes_bytes": {"type": "array", "items": {"type": "integer"}, "minItems": 2},
                       "fresh_ms": {"type": "array", "items": STATS_SCHEMA},
                       "cached_ms": {"type": "array", "items": STATS_SCHEMA},
                       "pin_memory_ms": {"type": "array", "items": STATS_SCHEMA},
                       "fresh_ms_per_mib": _NUMBER},
    },
)
def pin_cost(max_mib: int = 1024, repeats: int = 3) -> dict[str, Any]:
    """Host time of ``torch.empty(size, pin_memory=True)`` after emptying the host cache (a new
    ``cudaHostAlloc``), of the same call served from the cache, and of
    ``pageable.pin_memory()`` (a cached block plus a copy), for 1 MiB to ``max_mib``.

    Returns:
        ``sizes_bytes``; ``fresh_ms``, ``cached_ms``, ``pin_memory_ms`` (summaries per size);
        ``fresh_ms_per_mib`` (median over sizes of at least 16 MiB of fresh ms per MiB).

    Raises:
        ValueError: the largest size does not fit in host memory.
        RuntimeError: this torch cannot empty the host cache.
    """
    sup.check_host_fits("max_mib", 2 * max_mib * MiB)
    require_cuda("pinned.pin_cost")
    _require_host_tools("pinned.pin_cost", stats=False)
    _warm_gpu()
    sizes = [s * MiB for s in PIN_SIZES_MIB if s <= max_mib]
    fresh, cached, repin = [], [], []
    try:
        for size in sizes:
            pageable = torch.ones(size, dtype=torch.uint8)
            f, c, p = [], [], []
            for _ in range(repeats):
                empty_host_cache()
                t0 = time.perf_counter()
                block = torch.empty(size, dtype=torch.uint8, pin_memory=True)
                t1 = time.perf_counter()
                del block  # no copy used it: straight back to the free list
                t2 = time.perf_counter()
                block = torch.empty(size, dtype=torch.uint8, pin_memory=True)
                t3 = time.perf_counter()
                del block
                t4 = time.perf_counter()
                copy = pageable.pin_memory()
                t5 = time.perf_counter()
                del copy
                f.append((t1 - t0) * 1e3)
                c.append((t3 - t2) * 1e3)
                p.append((t5 - t4) * 1e3)
            fresh.append(stats_dict(f))
            cached.append(stats_dict(c))
            repin.append(stats_dict(p))
            del pageable
    finally:
        _release_pinned()
    per_mib = [st["median"] / (s / MiB) for s, st in zip(sizes, fresh) if s >= 16 * MiB]
    return {"sizes_bytes": sizes, "fresh_ms": fresh, "cached_ms": cached, "pin_memory_ms": repin,
            "fresh_ms_per_mib": statistics.median(per_mib) if per_mib else fresh[-1]["median"] / (sizes[-1] / MiB)}
