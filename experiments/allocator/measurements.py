"""Chapter 1 (The caching allocator and fragmentation): how PyTorch's CUDA caching allocator
turns tensor requests into blocks and segments, and why memory that is free can still be
unusable.

Experiments (all ids start with ``alloc.``):

* ``alloc.request_table``: the rounding rules, one probe size at a time;
* ``alloc.anatomy``: the layout of ``count`` tensors of a size you choose;
* ``alloc.timeline``: allocated against reserved bytes over the post's two allocation
  orders, with ``empty_cache()`` at the end;
* ``alloc.fragmentation_oom``: under a memory cap you choose, a request that fails
  although more than its size is reserved but unallocated;
* ``alloc.graph_pools``: CUDA graphs captured into one shared pool, largest batch first
  or last, without and with autograd keeping activations;
* ``alloc.pool_boundary``: memory freed in the small pool (≤ 1 MiB) cannot serve the
  large pool, and the reverse;
* ``alloc.knobs``: what ``max_split_size_mb``, ``roundup_power2_divisions`` and
  ``garbage_collection_threshold`` change, each on a workload that shows it.

Everything that depends on allocator settings or provokes an out-of-memory error runs
in a fresh process (:func:`experiments.core.runner.run_fresh`), under a memory cap where it
needs one, so it behaves the same on a 16 GB T4 and on the lab's H200. Measurements that
need the same settings share one fresh process (:func:`shared_jobs`): recording the
whole chapter starts five, one each for default settings, expandable segments and the
three knobs. Each result also carries what the pure-Python model
(:mod:`experiments.allocator.model`) predicts.

Source post: https://docs.pytorch.org/devlogs/eager/2026-06-01-cuda-caching-allocator/
(Edward Yang, 2026-06-01); rules: ``c10/cuda/CUDACachingAllocator.cpp``; settings:
https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Mapping

from ..core import alloc_conf
from ..core.units import MiB
from .model import round_size, simulate
from .snapshot import layout_summary
from .workloads import (
    _CAP_PARAM, ANATOMY_SIZES, GRAPH_ORDERS, KNOB_CAP_MIB, KNOBS, OOM_CAP_CHOICES, OOM_CAP_MIB,
    OOM_PATTERNS, ORDERS, PROBE_SIZES, TIMELINE_SMALL_MIB,
)
from ..core.claims import claim
from ..core.device import check_fits, require_cuda
from ..core.registry import Param, experiment
from .fresh import _fresh_sequences, _measure_shared, explain_setting_error, oom_job
from .predict import (
    _boundary_data, _graph_variants, _oom_data, _probe_row, _sizes_equal_layouts, _timeline_data,
)

POST_URL = "https://docs.pytorch.org/devlogs/eager/2026-06-01-cuda-caching-allocator/"
ALLOC_CONF_DOCS = "https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf"

# --------------------------------------------------------------------------- data schemas

_INTS = {"type": "array", "items": {"type": "integer"}}
_SEGMENTS = {
    "type": "array",
    "items": {
        "type": "object",
        "required": ["total_size", "pool", "blocks"],
        "properties": {
            "total_size": {"type": "integer", "minimum": 0},
            "pool": {"enum": ["small", "large"]},
            "blocks": {"type": "array", "items": {
                "type": "object", "required": ["size", "state"],
                "properties": {"size": {"type": "integer", "minimum": 0},
                               "state": {"enum": ["active_allocated", "active_pending_free", "inactive"]}}}},
        },
    },
}
_SERIES = {
    "type": "object",
    "required": ["labels", "allocated_bytes", "reserved_bytes"],
    "properties": {"labels": {"type": "array", "items": {"type": "string"}},
                   "allocated_bytes": _INTS, "reserved_bytes": _INTS},
}


# --------------------------------------------------------------------------- helpers


# ---- shared fresh processes
#
# A fresh process costs a torch import and a CUDA start, 3-5 s each. Every measurement in
# it starts from an empty cache (and caps the allocator itself where it needs a cap), so
# the chapter's measurements that need the same allocator setting share one process: the
# first experiment that needs a setting runs all of that setting's jobs, and keeps the
# other results for the experiments that ask next. A kept result is handed out once, and
# only within SHARE_WINDOW_S seconds of its measurement; asking again measures again.


# --------------------------------------------------------------------------- alloc.request_table


@experiment(
    "alloc.request_table",
    chapter=1,
    title="From a tensor request to a block and a segment",
    data_schema={
        "type": "object", "required": ["probes", "isolation"],
        "properties": {
            "isolation": {"enum": ["mempool", "fresh_process"]},
            "probes": {"type": "array", "minItems": 1, "items": {
                "type": "object",
                "required": ["request_bytes", "block_bytes", "pool", "segment_bytes", "remainder_bytes", "split",
                             "segments", "predicted"],
                "properties": {"segments": _SEGMENTS, "pool": {"enum": ["small", "large"]}}}},
        },
    },
)
def request_table() -> dict[str, Any]:
    """One tensor at a time, for each size in ``PROBE_SIZES`` (1 B to 100 MiB + 3 B): the block
    it got, its pool, the segment it landed in and the free remainder, read from a snapshot
    of a private pool (or of a fresh process on torch < 2.6), next to the model's prediction.

    Returns:
        probes: one dict per size with request_bytes, block_bytes, pool, segment_bytes,
        remainder_bytes, split, segments (the layout) and predicted
        (:func:`experiments.allocator.model.request_anatomy`); isolation.
    """
    from .gpu import measure_layouts

    require_cuda("alloc.request_table")
    layouts, isolation = measure_layouts([[n] for n in PROBE_SIZES])
    return {"probes": [_probe_row(n, segs) for n, segs in zip(PROBE_SIZES, layouts)], "isolation": isolation}


@claim(
    "alloc.rounding",
    chapter=1,
    statement="Requests round up to a multiple of 512 B; a request of at most 1 MiB lands in a 2 MiB segment, "
              "1-10 MiB in a 20 MiB segment, and larger requests get a segment rounded up to 2 MiB.",
    experiment="alloc.request_table",
    source=POST_URL,
)
def _claim_rounding(data: Mapping[str, Any]) -> tuple[bool, dict[str, Any]]:
    from .model import get_allocation_size, get_pool

    bad_block, bad_segment = [], []
    for p in data["probes"]:
        n, rounded = p["request_bytes"], round_size(p["request_bytes"])
        if p["block_bytes"] % 512 or p["block_bytes"] < rounded or p["block_bytes"] != p["predicted"]["block_bytes"]:
            bad_block.append(n)
        if p["segment_bytes"] != get_allocation_size(rounded) or p["pool"] != get_pool(rounded):
            bad_segment.append(n)
    n = len(data["probes"])
    return (not bad_block and not bad_segment and n > 0), {
        "probes": n, "blocks as predicted": n - len(bad_block), "segments as the rule says": n - len(bad_segment),
        "mismatched sizes (B)": bad_block + bad_segment,
    }


# --------------------------------------------------------------------------- alloc.anatomy


@experiment(
    "alloc.anatomy",
    chapter=1,
    title="Anatomy of a request: blocks, pools and segments",
    params=[Param("size_bytes", 5242880.0, min=1, max=512 * MiB, unit="B", log=True,
                  help="bytes per tensor (rounded to whole bytes)"),
            Param("count", 3, min=1, max=8, unit="tensors", help="how many tensors of that size")],
    grid={"size_bytes": list(ANATOMY_SIZES), "count": [1, 3]},
    data_schema={
        "type": "object",
        "required": ["request_bytes", "count", "rounded_bytes", "segments", "predicted_segments", "matches_model",
                     "reserved_bytes", "allocated_bytes", "isolation"],
        "properties": {"segments": _SEGMENTS, "predicted_segments": _SEGMENTS},
    },
)
def anatomy(size_bytes: float = 5242880.0, count: int = 3) -> dict[str, Any]:
    """Allocate ``count`` tensors of ``size_bytes`` (rounded to whole bytes) into an empty
    private pool and read the layout from a snapshot.

    Returns:
        request_bytes, count, rounded_bytes, segments (measured), predicted_segments (the
        model's), matches_model, reserved_bytes and allocated_bytes (of those segments),
        isolation.

    Raises:
        ValueError: a size or count out of range, or more than the GPU can hold.
    """
    from .gpu import measure_layouts

    n = int(round(size_bytes))
    require_cuda("alloc.anatomy")
    check_fits("size_bytes × count", n * count)
    layouts, isolation = measure_layouts([[n] * count])
    segments = layouts[0]
    ops = [("alloc", f"t{i}", n) for i in range(count)] + [("snapshot", "end")]
    predicted = simulate(ops)["snapshots"]["end"]
    summary = layout_summary(segments)
    return {"request_bytes": n, "count": count, "rounded_bytes": round_size(n), "segments": segments,
            "predicted_segments": predicted, "matches_model": _sizes_equal_layouts(segments, predicted),
            "reserved_bytes": summary["reserved_bytes"], "allocated_bytes": summary["allocated_bytes"],
            "isolation": isolation}


# --------------------------------------------------------------------------- alloc.timeline


@experiment(
    "alloc.timeline",
    chapter=1,
    title="Allocated versus reserved: the same tensors in two orders",
    params=[Param("small_mib", 16, choices=TIMELINE_SMALL_MIB, unit="MiB", help="size of the 8 small tensors; the 4 large ones are twice that"),
            Param("expandable", False, help="expandable_segments:True")],
    grid={"small_mib": list(TIMELINE_SMALL_MIB), "expandable": [False, True]},
    data_schema={
        "type": "object", "required": ["small_bytes", "large_bytes", "orders"],
        "properties": {"orders": {"type": "object", "required": list(ORDERS), "additionalProperties": {
            "type": "object",
            "required": ["labels", "allocated_bytes", "reserved_bytes", "predicted_reserved_bytes", "phase_ends",
                         "empty_cache_step", "segments_phase2", "predicted_segments_phase2"],
            "properties": {**_SERIES["properties"], "predicted_reserved_bytes": _INTS,
                           "segments_phase2": _SEGMENTS, "predicted_segments_phase2": _SEGMENTS}}}},
    },
)
def timeline(small_mib: int = 16, expandable: bool = False) -> dict[str, Any]:
    """In a fresh process (shared, :func:`shared_jobs`): 8 × ``small_mib`` MiB and
    4 × 2·``small_mib`` MiB tensors, small group first then large, and the reverse (the
    cache emptied in between), then ``empty_cache()``. Allocated and reserved bytes after
    every operation.

    Returns:
        small_bytes, large_bytes, n_small, n_large and orders: for 'small_first' and
        'large_first', labels, allocated_bytes, reserved_bytes (measured, after each
        operation), predicted_allocated_bytes, predicted_reserved_bytes (the model),
        phase_ends (index of the last step of each phase), empty_cache_step,
        segments_phase2 and predicted_segments_phase2 (layouts at the end of phase 2),
        expandable_in_effect.
    """
    measured = _measure_shared(f"timeline_{small_mib}", expandable)
    return _timeline_data(measured, small_mib, expandable)


# --------------------------------------------------------------------------- alloc.fragmentation_oom


@experiment(
    "alloc.fragmentation_oom",
    chapter=1,
    title="Fragmentation to out-of-memory under a memory cap",
    params=[_CAP_PARAM, Param("expandable", False, help="expandable_segments:True")],
    grid={"cap_mib": list(OOM_CAP_CHOICES), "expandable": [False, True]},
    data_schema={
        "type": "object", "required": ["cap_bytes", "request_bytes", "patterns"],
        "properties": {"patterns": {"type": "object", "required": list(OOM_PATTERNS), "additionalProperties": {
            "type": "object",
            "required": ["oom", "predicted_oom", "message", "figures", "request_bytes", "segments_before_request",
                         "segments_after", "num_alloc_retries", "num_ooms"],
            "properties": {"oom": {"type": "boolean"}, "segments_before_request": _SEGMENTS,
                           "segments_after": _SEGMENTS,
                           "oom_step": {"type": ["integer", "null"]},
                           "predicted_oom_step": {"type": ["integer", "null"]}}}}},
    },
)
def fragmentation_oom(cap_mib: int = OOM_CAP_MIB, expandable: bool = False) -> dict[str, Any]:
    """In a fresh process (shared, :func:`shared_jobs`), capped at ``cap_mib`` MiB (one of
    ``OOM_CAP_CHOICES``, default 384): three ways to use the same cached memory, each
    ending with a 64 MiB request (``OOM_PATTERNS``). The out-of-memory error is caught and
    its message parsed. Under a cap below the 352 MiB of the first phase, the sequence
    fails (and stops) before the request.

    Returns:
        cap_bytes, cap_mib, request_bytes and patterns: per pattern, oom (bool),
        predicted_oom (the model), reached_request and predicted_reached_request (whether
        the 64 MiB request was made), oom_step and predicted_oom_step (index of the
        failed operation, or None), failed_label and failed_request_bytes (the operation
        that failed), message,
        figures (:func:`parse_oom_message`, or None), the reserved and allocated bytes
        before the request (None if it was not reached) and at the failure,
        reserved_unallocated_at_failure_bytes, the layouts before and after the request
        (or at the failure), num_alloc_retries, num_ooms and the reserved and allocated
        bytes after every operation.

    Raises:
        ValueError: a cap not in ``OOM_CAP_CHOICES`` (before any GPU work).
    """
    measured = _measure_shared(oom_job(cap_mib), expandable)
    return _oom_data(measured, expandable, cap_mib)


@claim(
    "alloc.fragmentation_oom",
    chapter=1,
    statement="Under a memory cap, with default settings, a request can fail with an out-of-memory error while "
              "the memory reserved but unallocated is at least as large as the request.",
    experiment="alloc.fragmentation_oom",
    params={"cap_mib": OOM_CAP_MIB, "expandable": False},
    source=POST_URL,
)
def _claim_fragmentation_oom(data: Mapping[str, Any]) -> tuple[bool, dict[str, Any]]:
    p = data["patterns"]["interleave"]
    default_settings = p.get("expandable_in_effect") is not True
    if p["figures"] is not None:
        unallocated, source = p["figures"]["reserved_unallocated_bytes"], "OOM message"
    else:
        unallocated, source = p["reserved_unallocated_at_failure_bytes"], "memory_stats"
    measured = {"request MiB": p["request_bytes"] / MiB, "OOM raised": p["oom"],
                "reserved but unallocated MiB": None if unallocated is None else unallocated / MiB,
                "cap MiB": data["cap_bytes"] / MiB, "figures from": source}
    on_request = p.get("reached_request", True)   # the 64 MiB request failed, not the first phase
    return bool(p["oom"] and on_request and default_settings and unallocated is not None
                and unallocated >= p["request_bytes"]), measured


# --------------------------------------------------------------------------- alloc.graph_pools


_GRAPH_ORDER = {"type": "object", "required": ["capture_order", "growth_after_each_bytes", "reserved_growth_bytes",
                                              "pool_segments"],
                "properties": {"growth_after_each_bytes": _INTS, "pool_segments": _SEGMENTS,
                               "pool_after_each_bytes": {"anyOf": [{"type": "null"}, _INTS]}}}


@experiment(
    "alloc.graph_pools",
    chapter=1,
    title="Order matters: CUDA graphs sharing one memory pool",
    params=[Param("expandable", False, help="expandable_segments:True")],
    grid={"expandable": [False, True]},
    data_schema={
        "type": "object", "required": ["hidden", "batch_sizes", "increasing", "decreasing"],
        "additionalProperties": True,
        "properties": {"increasing": _GRAPH_ORDER, "decreasing": _GRAPH_ORDER,
                       "autograd": {"type": "object", "required": list(GRAPH_ORDERS),
                                    "properties": {o: _GRAPH_ORDER for o in GRAPH_ORDERS}}},
    },
)
def graph_pools(expandable: bool = False) -> dict[str, Any]:
    """In a fresh process (shared, :func:`shared_jobs`): the toy MLP of the book's lab notes,
    ``(relu(x @ W1) * 0.5 + 1.0) @ W2`` (hidden 4096, W1 4096 × 8192, float16), one CUDA
    graph per batch size in ``GRAPH_BATCH_SIZES``, all captured into one shared pool on one
    stream, each output freed after its capture; once in increasing and once in
    decreasing batch order; under ``torch.no_grad()`` (the top-level orders) and with
    autograd keeping activations for a backward pass ('autograd'; the model reproduces the
    lab notes' numbers for this way of capturing).

    Returns:
        hidden, dtype, batch_sizes, 'increasing' and 'decreasing' (no grad), 'autograd'
        (the same two orders with grad), each with the growth of reserved bytes after
        each capture and in total, the pool's own bytes after each capture and its
        segments at the end (see :func:`experiments.allocator.gpu.graph_pools_worker`),
        and expandable_in_effect.
    """
    require_cuda("alloc.graph_pools")
    check_fits("the CUDA-graph experiment", 2 * 1024 * MiB)
    data = _measure_shared("graph_pools", expandable)
    data.pop("_alloc_conf", None)
    segments = [s for o in _graph_variants(data).values() for order in o.values() for s in order["pool_segments"]]
    data["expandable_in_effect"] = any(s.get("is_expandable") for s in segments) if segments else None
    return data


def _growths(data: Mapping[str, Any]) -> tuple[int, int]:
    return data["increasing"]["reserved_growth_bytes"], data["decreasing"]["reserved_growth_bytes"]


@claim(
    "alloc.order_matters",
    chapter=1,
    statement="Capturing CUDA graphs into one shared pool from the smallest batch up reserves at least 1.5 times "
              "the memory of capturing from the largest batch down (default settings).",
    experiment="alloc.graph_pools",
    params={"expandable": False},
    source=POST_URL,
)
def _claim_order_matters(data: Mapping[str, Any]) -> tuple[bool, dict[str, Any]]:
    inc, dec = _growths(data)
    ratio = inc / dec if dec > 0 else float("inf")
    in_effect = data.get("expandable_in_effect")
    return bool(ratio >= 1.5 and dec > 0 and in_effect is not True), {
        "increasing MiB": inc / MiB, "decreasing MiB": dec / MiB, "ratio": ratio}


@claim(
    "alloc.expandable_order_free",
    chapter=1,
    statement="With expandable segments, the two capture orders reserve within 10 % of each other.",
    experiment="alloc.graph_pools",
    params={"expandable": True},
    source=POST_URL,
)
def _claim_expandable_order_free(data: Mapping[str, Any]) -> tuple[bool, dict[str, Any]]:
    inc, dec = _growths(data)
    diff = abs(inc - dec) / max(inc, dec, 1)
    in_effect = data.get("expandable_in_effect")
    return bool(diff <= 0.10 and min(inc, dec) > 0 and in_effect is True), {
        "increasing MiB": inc / MiB, "decreasing MiB": dec / MiB, "relative difference": diff,
        "expandable in effect": in_effect}


# --------------------------------------------------------------------------- alloc.pool_boundary


@experiment(
    "alloc.pool_boundary",
    chapter=1,
    title="The 1 MiB line: small and large pools do not share",
    params=[Param("expandable", False, help="expandable_segments:True")],
    grid={"expandable": [False, True]},
    data_schema={
        "type": "object", "required": ["sweep", "small_to_large"],
        "properties": {
            "sweep": {"type": "object", "required": ["sizes_bytes", "first_reserved_bytes", "reserved_bytes",
                                                     "predicted_reserved_bytes", "segments"],
                      "properties": {"sizes_bytes": _INTS, "reserved_bytes": _INTS}},
            "small_to_large": {"type": "object", "required": ["request_bytes", "reserved_before_bytes",
                                                              "reserved_after_bytes", "segments_after"],
                               "properties": {"segments_after": _SEGMENTS, "segments_freed": _SEGMENTS}},
        },
    },
)
def pool_boundary(expandable: bool = False) -> dict[str, Any]:
    """In a fresh process (shared, :func:`shared_jobs`): (1) for each size in
    ``BOUNDARY_SIZES`` (256 KiB to 4 MiB), free a 2 MiB tensor, then request that size;
    (2) free eight 512 KiB tensors (4 MiB of the small pool), then request 1.5 MiB.

    Returns:
        sweep: sizes_bytes, first_reserved_bytes (after the 2 MiB tensor),
        reserved_bytes (after the second request), predicted_reserved_bytes, segments;
        small_to_large: small_count, small_bytes, request_bytes, reserved_before_bytes
        (after the frees), reserved_after_bytes, predicted_after_bytes, segments_freed,
        segments_after; expandable_in_effect.
    """
    measured = _measure_shared("pool_boundary", expandable)
    return _boundary_data(measured, expandable)


@claim(
    "alloc.pool_boundary",
    chapter=1,
    statement="Memory freed by tensors of at most 1 MiB does not serve a request above 1 MiB (and memory freed by a "
              "large tensor does not serve a request of at most 1 MiB).",
    experiment="alloc.pool_boundary",
    params={"expandable": False},
    source=POST_URL,
)
def _claim_pool_boundary(data: Mapping[str, Any]) -> tuple[bool, dict[str, Any]]:
    s = data["small_to_large"]
    freed = s["small_count"] * s["small_bytes"]
    growth = s["reserved_after_bytes"] - s["reserved_before_bytes"]
    sw = data["sweep"]
    rows = list(zip(sw["sizes_bytes"], sw["first_reserved_bytes"], sw["reserved_bytes"]))
    small = [r > f for n, f, r in rows if n <= MiB]              # each needs a small segment of its own
    large = [r == f for n, f, r in rows if MiB < n <= 2 * MiB]   # each fits the freed 2 MiB block
    small_grew, large_reused = bool(small) and all(small), bool(large) and all(large)
    holds = freed >= s["request_bytes"] and growth >= s["request_bytes"] and small_grew and large_reused
    return holds, {"small-pool MiB freed": freed / MiB, "request MiB": s["request_bytes"] / MiB,
                   "reserved growth MiB": growth / MiB, "≤ 1 MiB requests after a freed 2 MiB block grew": small_grew,
                   "1-2 MiB requests reused it": large_reused}


# --------------------------------------------------------------------------- alloc.knobs


_EXPANDABLE = {"expandable_segments": True}


def _series(r: Mapping[str, Any]) -> dict[str, Any]:
    return {"labels": list(r["labels"]), "reserved_bytes": list(r["reserved_bytes"]),
            "allocated_bytes": list(r["allocated_bytes"]), "num_alloc_retries": r["num_alloc_retries"]}


@experiment(
    "alloc.knobs",
    chapter=1,
    title="The allocator's knobs, one workload each",
    data_schema={
        "type": "object", "required": ["cap_bytes", "knobs"],
        "properties": {"knobs": {"type": "object", "required": list(KNOBS), "additionalProperties": {
            "type": "object", "required": ["setting", "workload", "default", "knob", "expandable", "predicted"],
            "properties": {"default": _SERIES, "expandable": _SERIES,
                           "knob": {"anyOf": [{"type": "null"}, _SERIES]}}}}},
    },
)
def knobs() -> dict[str, Any]:
    """Each knob in ``KNOBS`` on a workload that shows what it changes, in fresh processes
    capped at 384 MiB: once with default settings, once with the knob, once with
    ``expandable_segments:True`` for comparison (the default and expandable runs share
    their processes with the other experiments, :func:`shared_jobs`; each knob gets one
    of its own). A knob the installed torch does not know is skipped with a message.

    Returns:
        cap_bytes and knobs: per knob, setting (the string), workload (a sentence), default,
        knob and expandable (labels, reserved_bytes, allocated_bytes, num_alloc_retries;
        knob is None when unsupported), unsupported (message or None) and predicted (the
        model's reserved_bytes for the three runs).
    """
    require_cuda("alloc.knobs")
    default = _measure_shared("knobs", expandable=False)
    expandable = _measure_shared("knobs", expandable=True)
    out: dict[str, Any] = {"cap_bytes": KNOB_CAP_MIB * MiB, "knobs": {}}
    problems = {name: explain_setting_error(k["setting"]) for name, k in KNOBS.items()}
    # One fresh process per knob, all at once: each measures bytes under its own cap, not time,
    # so running them together changes no figure and saves chapter 1 two process starts.
    with ThreadPoolExecutor(max(1, len(KNOBS))) as pool:
        running = {name: pool.submit(_fresh_sequences, {name: k["ops"]}, settings=k["setting"], cap_mib=KNOB_CAP_MIB)
                   for name, k in KNOBS.items() if not problems[name]}
        measured = {name: f.result()[name] for name, f in running.items()}
    for name, k in KNOBS.items():
        problem = problems[name]
        with_knob = measured.get(name)
        cap = KNOB_CAP_MIB * MiB
        out["knobs"][name] = {
            "setting": alloc_conf.render(k["setting"], version=(99, 0)),
            "workload": k["workload"],
            "default": _series(default[name]),
            "knob": _series(with_knob) if with_knob else None,
            "expandable": _series(expandable[name]),
            "unsupported": problem,
            "predicted": {"default": simulate(k["ops"], cap_bytes=cap)["reserved_bytes"],
                          "knob": simulate(k["ops"], k["setting"], cap_bytes=cap)["reserved_bytes"],
                          "expandable": simulate(k["ops"], _EXPANDABLE, cap_bytes=cap)["reserved_bytes"]},
        }
    return out


# The doctor's recordings (alloc.doctor_snapshots, alloc.doctor_cases), made by the doctor's lab, are
# registered with the chapter's experiments.
from ..doctor.lab import cases, heldout, snapshots  # noqa: E402,F401
