"""Chapter 3 (Pinned memory): what page-locked host memory buys, how an asynchronous copy
keeps using its buffer after the host has moved on, how PyTorch's host caching allocator
guards reuse and never gives memory back on its own, and why CUDA graphs fix host
addresses for good.

Post: "Pinned memory: what it is for, and why nobody gives it back",
https://docs.pytorch.org/devlogs/eager/2026-08-09-pinned-memory-allocator/ . Mechanism:
``aten/src/ATen/core/CachingHostAllocator.h`` (power-of-two blocks, event-deferred reuse,
empty_cache) and ``aten/src/ATen/native/cuda/Copy.cu`` (non_blocking copies record an
event on the pinned block). Tutorial: https://docs.pytorch.org/tutorials/intermediate/pinmem_nonblock.html

Units: sizes in bytes unless a key says MiB/KiB; times in ms; bandwidth in GB/s with
GB = 1e9 bytes. Every experiment needs a CUDA GPU; import works without one.
"""
from __future__ import annotations

import statistics
import time
from typing import Any, Mapping

from ..core.lazy_torch import torch
from . import model as sup
from ..core.claims import claim
from ..core.device import check_fits, require_cuda
from ..core.measure import STATS_SCHEMA, gpu_sleep, stats_dict, time_gpu
from ..core.units import KiB, MiB
from .model import POST_URL
from ..core.registry import Param, experiment


from .host import _NUMBER, _numbers, _release_pinned, _warm_gpu


# ================================================================ 1. bandwidth

BANDWIDTH_SIZES = tuple(4 * KiB * 4**i for i in range(10))  # 4 KiB, 16 KiB, ..., 1 GiB


@experiment(
    "pinned.bandwidth",
    chapter=3,
    title="Copy bandwidth from pageable and from pinned host memory",
    params=[Param("direction", "htod", choices=("htod", "dtoh"), help="htod: host to device; dtoh: device to host"),
            Param("max_mib", 1024, choices=(64, 256, 1024), unit="MiB", help="largest copy; sizes grow 4x from 4 KiB"),
            Param("repeats", 5, min=3, max=20, unit="runs", help="timed copies per size")],
    grid={"direction": ["htod", "dtoh"]},
    data_schema={
        "type": "object",
        "required": ["direction", "sizes_bytes", "pageable_gbps", "pinned_gbps", "pageable_ms", "pinned_ms", "link"],
        "properties": {
            "direction": {"enum": ["htod", "dtoh"]},
            "sizes_bytes": {"type": "array", "items": {"type": "integer", "minimum": 1}, "minItems": 2},
            "pageable_gbps": _numbers(2), "pinned_gbps": _numbers(2),
            "pageable_ms": {"type": "array", "items": STATS_SCHEMA},
            "pinned_ms": {"type": "array", "items": STATS_SCHEMA},
            "link": {"type": ["object", "null"]},
        },
    },
)
def bandwidth(direction: str = "htod", max_mib: int = 1024, repeats: int = 5) -> dict[str, Any]:
    """Achieved copy bandwidth for sizes from 4 KiB to ``max_mib``, pageable against pinned.

    A pageable copy is the plain blocking ``copy_`` (PyTorch copies and then synchronizes);
    a pinned copy uses ``non_blocking=True``. Each size is timed with CUDA events around
    the copy (median of ``repeats`` after one warm-up).

    Returns:
        ``sizes_bytes``; ``pageable_gbps`` and ``pinned_gbps`` (GB/s, GB = 1e9 B, from the
        median); ``pageable_ms`` and ``pinned_ms`` (timing summaries per size); ``link``:
        the PCIe link and its peak GB/s from nvidia-smi, or None.

    Raises:
        ValueError: the largest buffers do not fit in host memory (half of MemAvailable
            for a pageable and a pinned buffer) or on the device.
    """
    nmax = max_mib * MiB
    sup.check_host_fits("max_mib", 2 * nmax)
    require_cuda("pinned.bandwidth")
    check_fits("max_mib", nmax)
    _warm_gpu()
    sizes = [n for n in BANDWIDTH_SIZES if n <= nmax]
    dev = torch.empty(nmax, dtype=torch.uint8, device="cuda")
    out: dict[str, Any] = {"direction": direction, "sizes_bytes": sizes}
    try:
        for kind in ("pageable", "pinned"):
            # torch.ones touches every page, so first-touch page faults stay out of the timings.
            host = torch.ones(nmax, dtype=torch.uint8, pin_memory=(kind == "pinned"))
            nb = kind == "pinned"
            timings = []
            for n in sizes:
                h, d = host[:n], dev[:n]
                if direction == "htod":
                    def fn(h=h, d=d, nb=nb):
                        d.copy_(h, non_blocking=nb)
                else:
                    def fn(h=h, d=d, nb=nb):
                        h.copy_(d, non_blocking=nb)
                s = time_gpu(fn, warmup=1, repeats=repeats)
                timings.append({"median": s.median, "p10": s.p10, "p90": s.p90, "n": s.n})
            out[f"{kind}_ms"] = timings
            out[f"{kind}_gbps"] = [n / (t["median"] * 1e-3) / 1e9 for n, t in zip(sizes, timings)]
            del host
    finally:
        del dev
        _release_pinned()
    out["link"] = sup.query_pcie_link()
    return out


@claim("pinned.bandwidth", chapter=3, experiment="pinned.bandwidth", params={"direction": "htod"}, source=POST_URL,
       statement="Pinned HtoD bandwidth is at least 1.5x pageable at 256 MiB or more.")
def _claim_bandwidth(d: Mapping[str, Any]) -> tuple[bool, dict[str, Any]]:
    rows = [(n, pin, page) for n, pin, page in zip(d["sizes_bytes"], d["pinned_gbps"], d["pageable_gbps"])
            if n >= 256 * MiB]
    if not rows:
        return False, {"note": "no copy of 256 MiB or more was measured"}
    ratios = [pin / page for _, pin, page in rows]
    return all(r >= 1.5 for r in ratios), {
        "copy sizes (MiB)": [n // MiB for n, _, _ in rows], "pinned (GB/s)": [pin for _, pin, _ in rows],
        "pageable (GB/s)": [page for _, _, page in rows], "pinned / pageable": ratios,
    }


# ================================================================ 2. host-blocked time

ASYNC_VARIANTS = (("pageable", True), ("pageable", False), ("pinned", True), ("pinned", False))


@experiment(
    "pinned.async_copy",
    chapter=3,
    title="How long the host waits: a copy queued behind GPU work",
    params=[Param("size_kib", 65536, choices=(64, 2048, 65536), unit="KiB", help="bytes copied"),
            Param("direction", "htod", choices=("htod", "dtoh"), help="htod: host to device; dtoh: device to host"),
            Param("work_ms", 30.0, choices=(10.0, 30.0), unit="ms", help="GPU work queued ahead of the copy"),
            Param("repeats", 5, min=3, max=20, unit="runs")],
    grid={"size_kib": [64, 2048, 65536], "direction": ["htod", "dtoh"]},
    data_schema={
        "type": "object", "required": ["variants", "work_ms"],
        "properties": {
            "work_ms": _NUMBER,
            "variants": {"type": "array", "minItems": 4, "items": {
                "type": "object",
                "required": ["host", "non_blocking", "host_blocked_ms", "queued_gpu_ms", "copy_gpu_ms"],
                "properties": {"host": {"enum": ["pageable", "pinned"]}, "non_blocking": {"type": "boolean"},
                               "host_blocked_ms": STATS_SCHEMA, "queued_gpu_ms": _NUMBER, "copy_gpu_ms": _NUMBER}}},
        },
    },
)
def async_copy(size_kib: int = 65536, direction: str = "htod", work_ms: float = 30.0,
               repeats: int = 5) -> dict[str, Any]:
    """Time the host side of one copy call while ``work_ms`` of GPU work is queued ahead of it.

    Four variants: pageable or pinned host buffer, ``non_blocking`` True or False. For each
    repeat: record an event, queue ``gpu_sleep(work_ms)``, record an event, time the copy
    call with ``perf_counter`` (the host-blocked time), record an event, synchronize.

    Returns:
        ``variants``: one dict per variant with ``host`` ('pageable' or 'pinned'),
        ``non_blocking``, ``host_blocked_ms`` (summary), ``queued_gpu_ms`` (median GPU time
        of the queued work, CUDA events) and ``copy_gpu_ms`` (median GPU time from the end
        of that work to the end of the copy).

    Raises:
        ValueError: the buffers do not fit in host or device memory.
    """
    nbytes = size_kib * KiB
    sup.check_host_fits("size_kib", 2 * nbytes)
    require_cuda("pinned.async_copy")
    check_fits("size_kib", nbytes)
    _warm_gpu()
    dev = torch.zeros(nbytes, dtype=torch.uint8, device="cuda")
    hosts = {"pageable": torch.ones(nbytes, dtype=torch.uint8),
             "pinned": torch.ones(nbytes, dtype=torch.uint8, pin_memory=True)}
    variants = []
    for kind, nb in ASYNC_VARIANTS:
        host = hosts[kind]

        def copy(host=host, nb=nb) -> None:
            if direction == "htod":
                dev.copy_(host, non_blocking=nb)
            else:
                host.copy_(dev, non_blocking=nb)

        copy()
        torch.cuda.synchronize()
        blocked, queued, copy_ms = [], [], []
        for _ in range(repeats):
            e0, e1, e2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            e0.record()
            gpu_sleep(work_ms)
            e1.record()
            t0 = time.perf_counter()
            copy()
            t1 = time.perf_counter()
            e2.record()
            torch.cuda.synchronize()
            blocked.append((t1 - t0) * 1e3)
            queued.append(e0.elapsed_time(e1))
            copy_ms.append(e1.elapsed_time(e2))
        variants.append({"host": kind, "non_blocking": nb, "host_blocked_ms": stats_dict(blocked),
                         "queued_gpu_ms": statistics.median(queued), "copy_gpu_ms": statistics.median(copy_ms)})
    del hosts, dev
    _release_pinned()
    return {"variants": variants, "work_ms": work_ms}


def _variant(d: Mapping[str, Any], host: str, non_blocking: bool) -> Mapping[str, Any]:
    for v in d["variants"]:
        if v["host"] == host and v["non_blocking"] == non_blocking:
            return v
    raise KeyError(f"no variant host={host!r}, non_blocking={non_blocking}")


def host_blocked_ms(result: Any, host: str, non_blocking: bool) -> float:
    """Median ms the host spent in one copy call of a ``pinned.async_copy`` result.

    Args:
        result: a :class:`~experiments.core.registry.Result` of ``pinned.async_copy`` or its ``data``.
        host: 'pageable' or 'pinned'.
        non_blocking: the variant's ``non_blocking`` flag.

    Raises:
        KeyError: the result has no such variant.
    """
    d = result.data if hasattr(result, "data") else result
    return float(_variant(d, host, non_blocking)["host_blocked_ms"]["median"])


@claim("pinned.async_returns", chapter=3, experiment="pinned.async_copy",
       params={"size_kib": 65536, "direction": "htod"}, source=POST_URL,
       statement="A pinned non_blocking HtoD returns to the host in under 10 % of the GPU time queued "
                 "ahead of it; a pageable one blocks for most of it.")
def _claim_async_returns(d: Mapping[str, Any]) -> tuple[bool, dict[str, Any]]:
    pin, page = _variant(d, "pinned", True), _variant(d, "pageable", True)
    pin_frac = pin["host_blocked_ms"]["median"] / pin["queued_gpu_ms"]
    page_frac = page["host_blocked_ms"]["median"] / page["queued_gpu_ms"]
    return pin_frac < 0.1 and page_frac >= 0.5, {
        "GPU work queued (ms)": pin["queued_gpu_ms"], "pinned: host blocked (ms)": pin["host_blocked_ms"]["median"],
        "pageable: host blocked (ms)": page["host_blocked_ms"]["median"],
        "pinned: blocked / queued": pin_frac, "pageable: blocked / queued": page_frac,
    }


# ================================================================ 3. the overwrite race

RACE_STRATEGIES = ("race", "pageable", "synchronize", "event", "fresh_buffer")
RACE_LABELS = {
    "race": "pinned, no guard",
    "pageable": "pageable source",
    "synchronize": "torch.cuda.synchronize()",
    "event": "copy event .synchronize()",
    "fresh_buffer": "write a fresh pinned buffer",
}


@experiment(
    "pinned.overwrite_race",
    chapter=3,
    title="Overwriting the source of a queued non_blocking copy",
    params=[Param("size_mib", 16, choices=(1, 16, 64), unit="MiB", help="bytes copied"),
            Param("overwrite_after_ms", 0.0, choices=(0.0, 10.0, 60.0), unit="ms",
                  help="how long after the copy call (and its guard) the host writes new values"),
            Param("work_ms", 30.0, choices=(10.0, 30.0), unit="ms",
                  help="GPU work queued before the copy, and again after it"),
            Param("repeats", 3, min=1, max=10, unit="runs")],
    grid={"size_mib": [1, 16], "overwrite_after_ms": [0.0, 10.0, 60.0]},
    data_schema={
        "type": "object", "required": ["n_elements", "strategies", "work_ms"],
        "properties": {
            "n_elements": {"type": "integer", "minimum": 1}, "work_ms": _NUMBER,
            "strategies": {"type": "array", "minItems": len(RACE_STRATEGIES), "items": {
                "type": "object", "required": ["name", "label", "wrong_elements", "host_blocked_ms"],
                "properties": {"name": {"enum": list(RACE_STRATEGIES)}, "label": {"type": "string"},
                               "wrong_elements": {"type": "array", "items": {"type": "integer", "minimum": 0}},
                               "host_blocked_ms": STATS_SCHEMA}}},
        },
    },
)
def overwrite_race(size_mib: int = 16, overwrite_after_ms: float = 0.0, work_ms: float = 30.0,
                   repeats: int = 3) -> dict[str, Any]:
    """Copy 1.0s to the device with ``non_blocking=True`` behind ``work_ms`` of GPU work, queue
    another ``work_ms`` (the program goes on), then write 2.0 into the source on the host.

    Strategies: ``race`` (pinned source, no guard); ``pageable`` (pageable source: the
    driver stages it before the call returns); ``synchronize`` (``torch.cuda.synchronize()``
    before the write: waits for *all* queued work); ``event`` (an event recorded right
    after the copy, ``.synchronize()`` on it: waits for the copy only); ``fresh_buffer``
    (write the new values into a newly allocated pinned buffer and drop the old one; the
    host caching allocator keeps the old block until its copy finished).

    Returns:
        ``n_elements`` (float32 elements copied) and ``strategies``: per strategy its
        ``name``, ``label``, ``wrong_elements`` per repeat (device elements not equal to 1.0)
        and ``host_blocked_ms`` (copy call plus guard, summary).

    Raises:
        ValueError: the buffers do not fit in host or device memory.
    """
    n = size_mib * MiB // 4
    sup.check_host_fits("size_mib", 4 * size_mib * MiB)
    require_cuda("pinned.overwrite_race")
    check_fits("size_mib", size_mib * MiB)
    _warm_gpu()
    dst = torch.empty(n, device="cuda")
    pinned_src = torch.empty(n, pin_memory=True)
    pageable_src = torch.empty(n)
    rows = []
    for strategy in RACE_STRATEGIES:
        wrong, blocked = [], []
        for _ in range(repeats):
            if strategy == "fresh_buffer":
                src = torch.empty(n, pin_memory=True)
            else:
                src = pageable_src if strategy == "pageable" else pinned_src
            src.fill_(1.0)
            dst.zero_()
            torch.cuda.synchronize()
            gpu_sleep(work_ms)
            t0 = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
            gpu_sleep(work_ms)  # the program queues its next step before it reuses the buffer
            target = src
            if strategy == "synchronize":
                torch.cuda.synchronize()
            elif strategy == "event":
                done.synchronize()
            elif strategy == "fresh_buffer":
                target = torch.empty(n, pin_memory=True)
                del src  # the allocator holds the block back until the copy's event completes
            t1 = time.perf_counter()
            if overwrite_after_ms:
                time.sleep(overwrite_after_ms / 1e3)
            target.fill_(2.0)
            torch.cuda.synchronize()
            wrong.append(int((dst != 1.0).sum().item()))
            blocked.append((t1 - t0) * 1e3)
            del target
        rows.append({"name": strategy, "label": RACE_LABELS[strategy], "wrong_elements": wrong,
                     "host_blocked_ms": stats_dict(blocked)})
    del dst, pinned_src, pageable_src
    _release_pinned()
    return {"n_elements": n, "strategies": rows, "work_ms": work_ms}


def _strategy(d: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    for row in d["strategies"]:
        if row["name"] == name:
            return row
    raise KeyError(f"no strategy {name!r}")


@claim("pinned.overwrite_race", chapter=3, experiment="pinned.overwrite_race", source=POST_URL,
       statement="Overwriting the pinned source before the copy ran changes the device data.")
def _claim_overwrite_race(d: Mapping[str, Any]) -> tuple[bool, dict[str, Any]]:
    race = _strategy(d, "race")
    worst = min(race["wrong_elements"])
    return worst > 0, {"elements copied": d["n_elements"], "wrong elements (fewest in a run)": worst,
                       "wrong fraction (fewest in a run)": worst / d["n_elements"]}


# ================================================================ 4. del is safe

@experiment(
    "pinned.del_is_safe",
    chapter=3,
    title="Dropping the pinned source after a non_blocking copy",
    params=[Param("size_mib", 16, choices=(1, 16, 64), unit="MiB", help="bytes copied"),
            Param("work_ms", 50.0, choices=(20.0, 50.0), unit="ms", help="GPU work queued ahead of the copy")],
    grid={"size_mib": [1, 16, 64]},
    data_schema={
        "type": "object",
        "required": ["n_elements", "wrong_elements", "copy_pending_at_realloc", "reused_while_pending",
                     "reused_after_completion", "cache_emptied_first", "gpu", "host"],
        "properties": {
            "n_elements": {"type": "integer"}, "wrong_elements": {"type": "integer", "minimum": 0},
            "copy_pending_at_realloc": {"type": "boolean"}, "reused_while_pending": {"type": "boolean"},
            "reused_after_completion": {"type": "boolean"}, "cache_emptied_first": {"type": ["string", "null"]},
            "gpu": {"type": "object"}, "host": {"type": "object"},
        },
    },
)
def del_is_safe(size_mib: int = 16, work_ms: float = 50.0) -> dict[str, Any]:
    """Queue an HtoD copy of pinned 1.0s behind ``work_ms``, ``del`` the source at once, allocate
    a same-size pinned tensor and fill it with 5.0 while the copy is pending; then
    synchronize and allocate once more.

    Returns:
        ``wrong_elements`` (device elements not 1.0), ``copy_pending_at_realloc`` (the copy
        had not run when the new tensor was allocated), ``reused_while_pending`` and
        ``reused_after_completion`` (the new tensor got the dropped tensor's address),
        ``cache_emptied_first`` (the call that emptied the host cache first, or None: then
        an older cached block may be handed out and ``reused_after_completion`` is not
        meaningful), and a timeline: ``gpu`` (ms from the start: ``sleep_end_ms``,
        ``copy_end_ms``) and ``host`` (ms from the start: ``copy_call_ms``, ``realloc_ms``,
        ``fill_ms``, ``sync_ms``, ``realloc_after_ms``).

    Raises:
        ValueError: the buffers do not fit in host or device memory.
    """
    n = size_mib * MiB // 4
    sup.check_host_fits("size_mib", 3 * size_mib * MiB)
    require_cuda("pinned.del_is_safe")
    check_fits("size_mib", size_mib * MiB)
    _warm_gpu()
    emptied = _release_pinned()  # an empty bucket: the only block that can come back is the dropped one
    dst = torch.zeros(n, device="cuda")
    src = torch.ones(n, pin_memory=True)
    old_ptr = src.data_ptr()
    torch.cuda.synchronize()
    start, slept, copied = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    t0 = time.perf_counter()
    start.record()
    gpu_sleep(work_ms)
    slept.record()
    dst.copy_(src, non_blocking=True)
    copied.record()
    t_call = time.perf_counter()
    del src
    fresh = torch.empty(n, pin_memory=True)
    t_alloc = time.perf_counter()
    pending = not copied.query()
    reused_pending = fresh.data_ptr() == old_ptr
    fresh.fill_(5.0)
    t_fill = time.perf_counter()
    torch.cuda.synchronize()  # every event, including the one recorded when src was freed, is complete
    t_sync = time.perf_counter()
    again = torch.empty(n, pin_memory=True)
    t_again = time.perf_counter()
    reused_after = again.data_ptr() == old_ptr
    wrong = int((dst != 1.0).sum().item())
    gpu = {"sleep_end_ms": start.elapsed_time(slept), "copy_end_ms": start.elapsed_time(copied)}
    ms = lambda t: (t - t0) * 1e3  # noqa: E731
    host = {"copy_call_ms": ms(t_call), "realloc_ms": ms(t_alloc), "fill_ms": ms(t_fill), "sync_ms": ms(t_sync),
            "realloc_after_ms": ms(t_again)}
    del fresh, again, dst
    _release_pinned()
    return {"n_elements": n, "wrong_elements": wrong, "copy_pending_at_realloc": pending,
            "reused_while_pending": reused_pending, "reused_after_completion": reused_after,
            "cache_emptied_first": emptied, "gpu": gpu, "host": host}


@claim("pinned.del_is_safe", chapter=3, experiment="pinned.del_is_safe", source=POST_URL,
       statement="Dropping the source after the copy: no wrong elements, and the block is not handed out "
                 "again before the copy completes.")
def _claim_del_is_safe(d: Mapping[str, Any]) -> tuple[bool, dict[str, Any]]:
    holds = (d["wrong_elements"] == 0 and d["copy_pending_at_realloc"] and not d["reused_while_pending"])
    if d["cache_emptied_first"]:
        holds = holds and d["reused_after_completion"]  # the block does come back once its copy is done
    return holds, {"wrong elements": d["wrong_elements"],
                   "copy still pending at the new allocation": d["copy_pending_at_realloc"],
                   "block handed out again while pending": d["reused_while_pending"],
                   "block reused after the copy ran": d["reused_after_completion"]}
