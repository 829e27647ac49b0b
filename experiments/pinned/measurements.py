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

import gc
import statistics
import time
from typing import Any, Mapping

import torch

from . import model as sup
from ..core.claims import claim
from ..core.device import check_fits, require_cuda, torch_version
from ..core.measure import gpu_sleep, summarize, time_gpu
from .model import KiB, MiB, POST_URL, empty_host_cache, next_pow2
from ..core.registry import Param, experiment


_NUMBER = {"type": "number"}
_STATS_SCHEMA = {
    "type": "object", "required": ["median", "p10", "p90", "n"],
    "properties": {"median": _NUMBER, "p10": _NUMBER, "p90": _NUMBER, "n": {"type": "integer", "minimum": 1}},
}


def _numbers(min_items: int = 1) -> dict[str, Any]:
    return {"type": "array", "items": _NUMBER, "minItems": min_items}


def _stats(samples: list[float]) -> dict[str, Any]:
    s = summarize(samples)
    return {"median": s.median, "p10": s.p10, "p90": s.p90, "n": s.n}


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


def _spin(ms: float) -> None:
    """Keep the host busy for ``ms`` (stands for decoding or augmenting a batch)."""
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


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
            "pageable_ms": {"type": "array", "items": _STATS_SCHEMA},
            "pinned_ms": {"type": "array", "items": _STATS_SCHEMA},
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
                               "host_blocked_ms": _STATS_SCHEMA, "queued_gpu_ms": _NUMBER, "copy_gpu_ms": _NUMBER}}},
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
        variants.append({"host": kind, "non_blocking": nb, "host_blocked_ms": _stats(blocked),
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
        result: a :class:`~experiments.registry.Result` of ``pinned.async_copy`` or its ``data``.
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
                               "host_blocked_ms": _STATS_SCHEMA}}},
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
                     "host_blocked_ms": _stats(blocked)})
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
    """Run the script ``pinned_support.LIFECYCLE_STEPS`` (pin a, b, c; del a; pin d, e; del all;
    ``torch.cuda.empty_cache()``; empty the host cache) and read the host allocator after
    each step. No copies are involved, so freed blocks are cached at once.

    Returns:
        per step: ``steps`` (labels), ``owned_bytes`` (relative to the start),
        ``num_host_alloc`` and ``num_host_free`` (driver calls since the start),
        ``step_ms`` (host time of the step), and ``model_owned_bytes`` /
        ``model_num_host_alloc``: what :func:`pinned_support.simulate_lifecycle` predicts.

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
                       "fresh_ms": {"type": "array", "items": _STATS_SCHEMA},
                       "cached_ms": {"type": "array", "items": _STATS_SCHEMA},
                       "pin_memory_ms": {"type": "array", "items": _STATS_SCHEMA},
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
            fresh.append(_stats(f))
            cached.append(_stats(c))
            repin.append(_stats(p))
            del pageable
    finally:
        _release_pinned()
    per_mib = [st["median"] / (s / MiB) for s, st in zip(sizes, fresh) if s >= 16 * MiB]
    return {"sizes_bytes": sizes, "fresh_ms": fresh, "cached_ms": cached, "pin_memory_ms": repin,
            "fresh_ms_per_mib": statistics.median(per_mib) if per_mib else fresh[-1]["median"] / (sizes[-1] / MiB)}


# ================================================================ 8. CUDA graphs

STAGING_VALUES = (10.0, 11.0, 12.0, 13.0)


@experiment(
    "pinned.graph_replay",
    chapter=3,
    title="A CUDA graph reads the pinned address it captured",
    params=[Param("size_mib", 1, choices=(1, 16), unit="MiB", help="size of the pinned staging buffer")],
    grid={"size_mib": [1, 16]},
    data_schema={
        "type": "object",
        "required": ["n_elements", "after_capture_equal", "in_place", "rebound", "staging", "pageable_capture_error"],
        "properties": {"n_elements": {"type": "integer"}, "after_capture_equal": {"type": "integer"},
                       "in_place": {"type": "object"}, "rebound": {"type": "object"},
                       "staging": {"type": "array", "minItems": 1},
                       "pageable_capture_error": {"type": ["string", "null"]}},
    },
)
def graph_replay(size_mib: int = 1) -> dict[str, Any]:
    """Capture ``dev.copy_(stage, non_blocking=True)`` from a pinned ``stage`` holding 1.0, plus a
    captured readback of ``[dev.min(), dev.max()]`` into a pinned 2-element tensor; then:

    1. replay: the device receives 1.0 (``after_capture_equal``: elements equal to 1.0);
    2. ``stage.fill_(3.0)`` in place, replay (``in_place``: ``value``, ``device_equal``);
    3. ``stage = torch.full(..., 7.0, pin_memory=True)`` (a new buffer under the old name,
       the old one kept alive), replay (``rebound``: ``new_value``, ``device_equal_new``,
       ``device_equal_old`` = elements equal to 3.0);
    4. the graph-safe staging pattern: for each value in ``STAGING_VALUES``, copy it into
       the captured buffer, replay, wait on an event, read the pinned readback
       (``staging``: ``value``, ``min``, ``max``);
    5. try to capture a copy from *pageable* memory (``pageable_capture_error``: the first
       line of the error, or None if capture accepted it).

    Raises:
        ValueError: the buffers do not fit in host or device memory.
    """
    n = size_mib * MiB // 4
    sup.check_host_fits("size_mib", 4 * size_mib * MiB)
    require_cuda("pinned.graph_replay")
    check_fits("size_mib", 2 * size_mib * MiB)
    _warm_gpu()
    stage = torch.full((n,), 1.0, pin_memory=True)
    dev = torch.zeros(n, device="cuda")
    readback = torch.zeros(2, pin_memory=True)

    def step() -> None:
        dev.copy_(stage, non_blocking=True)
        readback.copy_(torch.stack([dev.amin(), dev.amax()]), non_blocking=True)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the capture stream, as the CUDA-graph notes advise
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    torch.cuda.synchronize()

    def replay_count(value: float) -> int:
        dev.zero_()
        graph.replay()
        torch.cuda.synchronize()
        return int((dev == value).sum().item())

    after_capture = replay_count(1.0)
    stage.fill_(3.0)
    in_place = {"value": 3.0, "device_equal": replay_count(3.0)}
    captured = stage  # the graph reads this block; it must stay alive
    stage = torch.full((n,), 7.0, pin_memory=True)
    equal_old = replay_count(3.0)
    rebound = {"new_value": 7.0, "device_equal_new": int((dev == 7.0).sum().item()), "device_equal_old": equal_old}
    staging = []
    done = torch.cuda.Event()
    for value in STAGING_VALUES:
        captured.copy_(torch.full((n,), value))  # host memcpy into the captured pinned buffer
        graph.replay()
        done.record()
        done.synchronize()  # the replay has read the buffer and written the readback
        lo, hi = readback.tolist()
        staging.append({"value": value, "min": lo, "max": hi})
    error = _try_pageable_capture(dev)
    del graph, stage, captured, readback, dev
    _release_pinned()
    return {"n_elements": n, "after_capture_equal": after_capture, "in_place": in_place, "rebound": rebound,
            "staging": staging, "pageable_capture_error": error,
            "host_private_pools": torch_version() >= (2, 11)}


def _try_pageable_capture(dev: torch.Tensor) -> str | None:
    """Capture a copy from pageable memory; return the error's first line, or None if accepted."""
    pageable = torch.ones(dev.numel())
    graph = torch.cuda.CUDAGraph()
    error = None
    try:
        with torch.cuda.graph(graph):
            dev.mul_(1.0)  # something valid, so the capture is not empty
            dev.copy_(pageable, non_blocking=True)
    except Exception as e:  # the expected RuntimeError names pinned memory
        error = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
    torch.cuda.synchronize()
    return error


@claim("pinned.graph_reads_captured_address", chapter=3, experiment="pinned.graph_replay", source=POST_URL,
       statement="A graph replay reflects in-place edits of the captured pinned buffer.")
def _claim_graph(d: Mapping[str, Any]) -> tuple[bool, dict[str, Any]]:
    n = d["n_elements"]
    holds = (d["in_place"]["device_equal"] == n and d["rebound"]["device_equal_old"] == n
             and d["rebound"]["device_equal_new"] == 0)
    return holds, {"elements": n,
                   "after the in-place fill_: elements with the filled value": d["in_place"]["device_equal"],
                   "after rebinding: elements with the captured buffer's value": d["rebound"]["device_equal_old"],
                   "after rebinding: elements with the new tensor's value": d["rebound"]["device_equal_new"]}


# ================================================================ 9. double buffering

def compute_schedule(pattern: str, compute_ms: float, batches: int) -> list[float]:
    """GPU ms per batch: 'steady' (``compute_ms`` each) or 'bursty' (every 4th batch takes
    4 x ``compute_ms``, the others none; the same mean).

    Raises:
        ValueError: an unknown pattern or a negative time or count.
    """
    if compute_ms < 0 or batches < 0:
        raise ValueError(f"compute_ms and batches must be >= 0, got {compute_ms}, {batches}")
    if pattern == "steady":
        return [compute_ms] * batches
    if pattern == "bursty":
        return [4 * compute_ms if k % 4 == 0 else 0.0 for k in range(batches)]
    raise ValueError(f"pattern must be 'steady' or 'bursty', got {pattern!r}")


def _ring_run(buffers: int, guarded: bool, numel: int, host_ms: float, schedule: list[float],
              stall_ms: float) -> dict[str, Any]:
    """One pass of the ring pipeline; see :func:`double_buffer`."""
    n = len(schedule)
    copy_stream = torch.cuda.Stream()
    compute_stream = torch.cuda.current_stream()
    ring = [torch.empty(numel, pin_memory=True) for _ in range(buffers)]
    dev = [torch.empty(numel, device="cuda") for _ in range(buffers)]
    copied: list[Any] = [None] * buffers
    consumed: list[Any] = [None] * buffers
    wrong = torch.zeros(n, dtype=torch.int64, device="cuda")
    torch.cuda.synchronize()
    if stall_ms:
        gpu_sleep(stall_ms)  # the GPU starts behind, like a slow first step
    waited = 0.0
    t0 = time.perf_counter()
    for k, gpu_ms in enumerate(schedule):
        slot = k % buffers
        _spin(host_ms)
        if guarded and copied[slot] is not None:
            tw = time.perf_counter()
            copied[slot].synchronize()  # the copy that last read this buffer has finished
            waited += time.perf_counter() - tw
        ring[slot].fill_(float(k + 1))
        with torch.cuda.stream(copy_stream):
            if consumed[slot] is not None:
                copy_stream.wait_event(consumed[slot])  # the device slot is free again
            dev[slot].copy_(ring[slot], non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(copy_stream)
            copied[slot] = ev
        compute_stream.wait_event(copied[slot])
        gpu_sleep(gpu_ms)
        wrong[k] = (dev[slot] != float(k + 1)).sum()
        done = torch.cuda.Event()
        done.record(compute_stream)
        consumed[slot] = done
    torch.cuda.synchronize()
    total_ms = (time.perf_counter() - t0) * 1e3
    counts = [int(x) for x in wrong.tolist()]
    del ring, dev
    return {"ms_per_batch": total_ms / n, "wrong_batches": sum(c > 0 for c in counts),
            "host_wait_ms": waited * 1e3, "total_ms": total_ms}


@experiment(
    "pinned.double_buffer",
    chapter=3,
    title="A ring of pinned staging buffers: throughput and correctness",
    params=[Param("buffers", 2, min=1, max=4, unit="buffers", help="pinned staging buffers in the ring"),
            Param("compute", "bursty", choices=("steady", "bursty"),
                  help="GPU time per batch: steady, or every 4th batch 4x as long"),
            Param("batch_mib", 8, choices=(2, 8, 32), unit="MiB", help="bytes per batch"),
            Param("host_ms", 2.0, choices=(1.0, 2.0, 4.0), unit="ms", help="host work per batch before the fill"),
            Param("compute_ms", 3.0, choices=(1.0, 3.0, 6.0), unit="ms", help="mean GPU work per batch"),
            Param("batches", 32, min=8, max=128, unit="batches")],
    grid={"buffers": [1, 2, 3, 4], "compute": ["steady", "bursty"]},
    data_schema={
        "type": "object",
        "required": ["with_events", "no_wait", "host_fill_ms", "copy_ms", "mean_compute_ms", "stall_ms"],
        "properties": {
            **{k: {"type": "object", "required": ["ms_per_batch", "wrong_batches", "stall_wrong_batches"],
                   "properties": {"ms_per_batch": _NUMBER, "wrong_batches": {"type": "integer", "minimum": 0},
                                  "stall_wrong_batches": {"type": "integer", "minimum": 0}}}
               for k in ("with_events", "no_wait")},
            "host_fill_ms": _NUMBER, "copy_ms": _NUMBER, "mean_compute_ms": _NUMBER, "stall_ms": _NUMBER,
        },
    },
)
def double_buffer(buffers: int = 2, compute: str = "bursty", batch_mib: int = 8, host_ms: float = 2.0,
                  compute_ms: float = 3.0, batches: int = 32) -> dict[str, Any]:
    """A loader with a ring of ``buffers`` pinned staging buffers feeding a compute stream.

    Per batch k: the host works ``host_ms``, (``with_events`` only) waits for the event of
    the copy that last read slot k % buffers, fills the slot with k+1; a copy stream waits
    until the compute stream is done with the matching device buffer and copies; the
    compute stream waits for the copy, runs the batch's GPU work and counts elements not
    equal to k+1 (a checksum). ``no_wait`` skips the host's wait: the unsafe version.

    Each variant runs twice: a short pass in which the GPU starts ``stall_ms`` behind (it
    exposes an unsafe ring), and a timed pass of ``batches`` batches.

    Returns:
        ``with_events`` and ``no_wait``: ``ms_per_batch`` (timed pass), ``wrong_batches``
        (timed pass) and ``stall_wrong_batches`` (stall pass) and ``host_wait_ms``;
        ``host_fill_ms`` (host time to fill one buffer), ``copy_ms`` (GPU time of one HtoD
        copy), ``mean_compute_ms`` and ``stall_ms``.

    Raises:
        ValueError: the buffers do not fit in host or device memory.
    """
    numel = batch_mib * MiB // 4
    sup.check_host_fits("batch_mib", (buffers + 1) * batch_mib * MiB)
    require_cuda("pinned.double_buffer")
    check_fits("batch_mib", (2 * buffers + 1) * batch_mib * MiB)
    _warm_gpu()
    probe = torch.empty(numel, pin_memory=True)
    fills = []
    for _ in range(3):
        t0 = time.perf_counter()
        probe.fill_(1.0)
        fills.append((time.perf_counter() - t0) * 1e3)
    fill_ms = statistics.median(fills)
    target = torch.empty(numel, device="cuda")
    copy_ms = time_gpu(lambda: target.copy_(probe, non_blocking=True), warmup=1, repeats=5).median
    del probe, target
    schedule = compute_schedule(compute, compute_ms, batches)
    # Long enough that an unguarded ring wraps around before the delayed copies run.
    stall_ms = 2 * buffers * (host_ms + fill_ms) + 20.0
    stall_schedule = compute_schedule(compute, compute_ms, 2 * buffers + 2)
    out: dict[str, Any] = {}
    for name, guarded in (("with_events", True), ("no_wait", False)):
        stalled = _ring_run(buffers, guarded, numel, host_ms, stall_schedule, stall_ms)
        timed = _ring_run(buffers, guarded, numel, host_ms, schedule, 0.0)
        out[name] = {**timed, "stall_wrong_batches": stalled["wrong_batches"]}
    _release_pinned()
    out.update({"host_fill_ms": fill_ms, "copy_ms": copy_ms, "mean_compute_ms": sum(schedule) / len(schedule),
                "stall_ms": stall_ms})
    return out


# ================================================================ claims in the text

def claim_check(claim_id: str, *, mode: str | None = None) -> Any:
    """One claim evaluated (live or recorded) as a one-row table, for the chapter's text.

    Raises:
        ValueError: an unknown claim id.
    """
    from ..core.claims import ClaimsTable, evaluate, get_claim

    return ClaimsTable([evaluate(get_claim(claim_id), mode=mode)])

