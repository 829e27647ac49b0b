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
in a fresh process (:func:`experiments.runner.run_fresh`), under a memory cap where it
needs one, so it behaves the same on a 16 GB T4 and on the lab's H200. Measurements that
need the same settings share one fresh process (:func:`shared_jobs`): recording the
whole chapter starts five, one each for default settings, expandable segments and the
three knobs. Each result also carries what the pure-Python model
(:mod:`experiments.allocator_model`) predicts.

Source post: https://docs.pytorch.org/devlogs/eager/2026-06-01-cuda-caching-allocator/
(Edward Yang, 2026-06-01); rules: ``c10/cuda/CUDACachingAllocator.cpp``; settings:
https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf
"""
from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

from ..core import alloc_conf
from .model import MiB, AllocatorConfig, compact_layout, normalize_ops, request_anatomy, round_size, simulate
from .snapshot import layout_summary, parse_oom_message
from .workloads import ANATOMY_SIZES, BOUNDARY_SIZES, GRAPH_BATCH_SIZES, GRAPH_DTYPE, GRAPH_HIDDEN, GRAPH_ORDERS, KNOB_CAP_MIB, KNOBS, OOM_CAP_CHOICES, OOM_CAP_MIB, OOM_PATTERNS, OOM_REQUEST_MIB, ORDERS, PROBE_SIZES, SMALL_COUNT, SMALL_SIZE_B, BIG_REQUEST_B, TIMELINE_SMALL_MIB, boundary_sequences, graph_capture_ops, oom_ops, timeline_ops
from ..core.claims import claim
from ..core.device import check_fits, require_cuda
from ..core.registry import Param, experiment

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

def _fresh_sequences(sequences: Mapping[str, Sequence[Sequence[Any]]], *, settings: Mapping[str, Any] | None = None,
                     cap_mib: float | None = None, timeout_s: float = 180.0) -> dict[str, Any]:
    """Run named operation sequences in one fresh process; raise if the process failed."""
    from ..core.runner import run_fresh

    require_cuda("running allocator experiments")
    result = run_fresh("experiments.allocator.gpu:sequences_worker",
                       {"sequences": {k: normalize_ops(v) for k, v in sequences.items()}},
                       alloc_conf_settings=dict(settings) if settings else None, memory_cap_mib=cap_mib,
                       timeout_s=timeout_s)
    return result.unwrap()


# ---- shared fresh processes
#
# A fresh process costs a torch import and a CUDA start, 3-5 s each. Every measurement in
# it starts from an empty cache (and caps the allocator itself where it needs a cap), so
# the chapter's measurements that need the same allocator setting share one process: the
# first experiment that needs a setting runs all of that setting's jobs, and keeps the
# other results for the experiments that ask next. A kept result is handed out once, and
# only within SHARE_WINDOW_S seconds of its measurement; asking again measures again.

SHARE_WINDOW_S = 600.0
_SHARED_SETTINGS = {"default": None, "expandable": {"expandable_segments": True}}
_kept: dict[tuple[str, str], tuple[float, Mapping[str, Any]]] = {}


def oom_job(cap_mib: int) -> str:
    """The name of the shared job that runs the fragmentation patterns under ``cap_mib``:
    'fragmentation_oom' for the default cap, 'fragmentation_oom_<cap>' for the others.

    Raises:
        ValueError: a cap not in ``OOM_CAP_CHOICES`` (the message names cap_mib).
    """
    _CAP_PARAM.validate(cap_mib)
    return "fragmentation_oom" if cap_mib == OOM_CAP_MIB else f"fragmentation_oom_{cap_mib}"


def shared_jobs(setting: str) -> dict[str, dict[str, Any]]:
    """Every fresh-process job of the chapter under one setting ('default' or 'expandable'):
    the timelines, the pool boundary, the fragmentation patterns (once per cap in
    ``OOM_CAP_CHOICES``, see :func:`oom_job`) and the knobs' baseline (each a set of
    operation sequences, some under a memory cap), and the graph captures.

    Raises:
        ValueError: an unknown setting.
    """
    if setting not in _SHARED_SETTINGS:
        raise ValueError(f"setting must be one of {sorted(_SHARED_SETTINGS)}, got {setting!r}")
    jobs: dict[str, dict[str, Any]] = {
        f"timeline_{m}": {"sequences": {o: timeline_ops(o, m) for o in ORDERS}} for m in TIMELINE_SMALL_MIB}
    jobs["pool_boundary"] = {"sequences": boundary_sequences()}
    jobs["fragmentation_oom"] = {"sequences": {p: oom_ops(p) for p in OOM_PATTERNS}, "cap_mib": OOM_CAP_MIB}
    jobs["knobs"] = {"sequences": {name: k["ops"] for name, k in KNOBS.items()}, "cap_mib": KNOB_CAP_MIB}
    for cap in OOM_CAP_CHOICES:   # the other caps: a few dozen allocations each, in the same process
        if cap != OOM_CAP_MIB:
            jobs[oom_job(cap)] = {"sequences": {p: oom_ops(p) for p in OOM_PATTERNS}, "cap_mib": cap}
    jobs["graph_pools"] = {"graph_pools": {"hidden": GRAPH_HIDDEN, "batch_sizes": list(GRAPH_BATCH_SIZES),
                                           "dtype": GRAPH_DTYPE, "autograd": True}}
    for job in jobs.values():
        if "sequences" in job:
            job["sequences"] = {k: normalize_ops(v) for k, v in job["sequences"].items()}
    return jobs


def _measure_shared(job: str, expandable: bool) -> dict[str, Any]:
    """The result of one of :func:`shared_jobs`, from a result kept for it or from a new
    fresh process that runs every job of its setting.

    Raises:
        RuntimeError: the job failed in the fresh process (its error), or the process did.
    """
    from ..core.runner import run_fresh

    require_cuda("running allocator experiments")
    setting = "expandable" if expandable else "default"
    kept = _kept.pop((setting, job), None)
    if kept is not None and time.monotonic() - kept[0] <= SHARE_WINDOW_S:
        results = {job: kept[1]}
    else:
        jobs = shared_jobs(setting)
        if job not in jobs:
            raise ValueError(f"no shared job {job!r}; the jobs are {sorted(jobs)}")
        results = run_fresh("experiments.allocator.gpu:shared_worker", {"jobs": jobs},
                            alloc_conf_settings=_SHARED_SETTINGS[setting], timeout_s=600).unwrap()
        now = time.monotonic()
        for name, value in results.items():
            if name != job:
                _kept[(setting, name)] = (now, value)
    outcome = results[job]
    if not outcome["ok"]:
        raise RuntimeError(f"{job} ({setting} settings) failed in its fresh process: {outcome['error']}")
    return dict(outcome["value"])


def _sizes_equal_layouts(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]) -> bool:
    """Same segments and blocks, ignoring addresses and the order of segments."""
    return sorted(compact_layout(a)) == sorted(compact_layout(b))


def explain_setting_error(settings: Mapping[str, Any] | str) -> str | None:
    """None if the installed torch accepts ``settings``, else a sentence saying why not.

    Allocator options come and go between torch releases (``large_segment_size_mb``
    appeared in 2.10, for example); this turns :class:`experiments.alloc_conf.UnsupportedOptionError`
    and bad values into a message for the page instead of a traceback.
    """
    try:
        alloc_conf.render(settings)
    except alloc_conf.UnsupportedOptionError as e:
        return f"Not available here: {e}. The experiment skips this setting."
    except ValueError as e:
        return f"Not a valid setting: {e}"
    return None


# --------------------------------------------------------------------------- alloc.request_table



def _probe_row(n: int, segments: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    holding = [s for s in segments if any(b["state"] == "active_allocated" for b in s["blocks"])]
    if len(holding) != 1:
        raise RuntimeError(f"expected one segment holding the {n}-byte tensor, found {len(holding)}: "
                           f"{compact_layout(segments)}")
    seg = holding[0]
    block = next(b for b in seg["blocks"] if b["state"] == "active_allocated")
    return {"request_bytes": n, "block_bytes": block["size"], "pool": seg["pool"],
            "segment_bytes": seg["total_size"], "remainder_bytes": seg["total_size"] - block["size"],
            "split": len(seg["blocks"]) > 1, "segments": list(segments), "predicted": request_anatomy(n)}


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
        (:func:`experiments.allocator_model.request_anatomy`); isolation.
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
    from .model import allocation_size, pool_of

    bad_block, bad_segment = [], []
    for p in data["probes"]:
        n, rounded = p["request_bytes"], round_size(p["request_bytes"])
        if p["block_bytes"] % 512 or p["block_bytes"] < rounded or p["block_bytes"] != p["predicted"]["block_bytes"]:
            bad_block.append(n)
        if p["segment_bytes"] != allocation_size(rounded) or p["pool"] != pool_of(rounded):
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



def _timeline_order_data(ops: Sequence[Sequence[Any]], measured: Mapping[str, Any],
                         predicted: Mapping[str, Any]) -> dict[str, Any]:
    kinds = [op[0] for op in normalize_ops(ops) if op[0] != "snapshot"]
    ends, i = [], 0
    while i < len(kinds):
        j = i
        while j + 1 < len(kinds) and kinds[j + 1] == kinds[i]:
            j += 1
        ends.append(j)
        i = j + 1
    return {
        "labels": list(measured["labels"]), "allocated_bytes": list(measured["allocated_bytes"]),
        "reserved_bytes": list(measured["reserved_bytes"]),
        "predicted_allocated_bytes": list(predicted["allocated_bytes"]),
        "predicted_reserved_bytes": list(predicted["reserved_bytes"]),
        "phase_ends": ends, "empty_cache_step": kinds.index("empty_cache"),
        "segments_phase2": measured["snapshots"]["phase2"],
        "predicted_segments_phase2": predicted["snapshots"]["phase2"],
        "expandable_in_effect": measured.get("expandable_in_effect"),
    }


def _timeline_data(measured: Mapping[str, Any], small_mib: int, expandable: bool) -> dict[str, Any]:
    cfg = AllocatorConfig(expandable_segments=expandable)
    orders = {}
    for order in ORDERS:
        ops = timeline_ops(order, small_mib)
        orders[order] = _timeline_order_data(ops, measured[order], simulate(ops, cfg))
    return {"small_bytes": small_mib * MiB, "large_bytes": 2 * small_mib * MiB, "n_small": 8, "n_large": 4,
            "orders": orders}


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



_CAP_PARAM = Param("cap_mib", OOM_CAP_MIB, choices=OOM_CAP_CHOICES, unit="MiB",
                   help="the memory cap of the fresh process the patterns run in")


def _oom_pattern_data(pattern: str, measured: Mapping[str, Any], predicted: Mapping[str, Any]) -> dict[str, Any]:
    oom = measured.get("oom")
    figures, parse_error = None, None
    if oom is not None:
        try:
            figures = parse_oom_message(oom["message"])
        except ValueError as e:
            parse_error = str(e)
    snaps = measured["snapshots"]
    # Under a cap below the first phase's 352 MiB the sequence stops before the request.
    reached = "before_request" in snaps
    before = layout_summary(snaps["before_request"]) if reached else None
    predicted_oom = predicted.get("oom")
    return {
        "description": OOM_PATTERNS[pattern],
        "oom": oom is not None,
        "predicted_oom": predicted_oom is not None,
        "reached_request": reached,
        "predicted_reached_request": "before_request" in predicted["snapshots"],
        "oom_step": oom["step"] if oom else None,
        "predicted_oom_step": predicted_oom["step"] if predicted_oom else None,
        "failed_label": measured["labels"][oom["step"]] if oom else None,
        "failed_request_bytes": oom["request_bytes"] if oom else None,
        "message": oom["message"] if oom else None,
        "figures": figures,
        "parse_error": parse_error,
        "request_bytes": OOM_REQUEST_MIB * MiB,
        "reserved_before_request_bytes": before["reserved_bytes"] if before else None,
        "allocated_before_request_bytes": before["allocated_bytes"] if before else None,
        "reserved_at_failure_bytes": oom["reserved_bytes"] if oom else None,
        "allocated_at_failure_bytes": oom["allocated_bytes"] if oom else None,
        "reserved_unallocated_at_failure_bytes": oom["reserved_unallocated_bytes"] if oom else None,
        "reserved_after_bytes": measured["reserved_bytes"][-1],
        "predicted_reserved_after_bytes": predicted["reserved_bytes"][-1],
        "segments_before_request": snaps.get("before_request", []),
        "segments_after": snaps.get("oom") or snaps.get("after_request") or [],
        "predicted_segments_after": predicted["snapshots"].get("oom") or predicted["snapshots"].get("after_request") or [],
        "num_alloc_retries": measured["num_alloc_retries"],
        "num_ooms": measured["num_ooms"],
        "reserved_bytes": list(measured["reserved_bytes"]),
        "allocated_bytes": list(measured["allocated_bytes"]),
        "expandable_in_effect": measured.get("expandable_in_effect"),
    }


def predict_oom(cap_mib: int = OOM_CAP_MIB, expandable: bool = False) -> dict[str, dict[str, Any]]:
    """The model's run of each pattern of ``alloc.fragmentation_oom`` under ``cap_mib`` MiB:
    pattern -> the result of :func:`experiments.allocator_model.simulate` (no GPU needed).

    Raises:
        ValueError: a cap not in ``OOM_CAP_CHOICES``.
    """
    _CAP_PARAM.validate(cap_mib)
    cfg = AllocatorConfig(expandable_segments=expandable)
    return {name: simulate(oom_ops(name), cfg, cap_bytes=cap_mib * MiB) for name in OOM_PATTERNS}


def _oom_data(measured: Mapping[str, Any], expandable: bool, cap_mib: int = OOM_CAP_MIB) -> dict[str, Any]:
    predicted = predict_oom(cap_mib, expandable)
    patterns = {name: _oom_pattern_data(name, measured[name], predicted[name]) for name in OOM_PATTERNS}
    return {"cap_bytes": cap_mib * MiB, "cap_mib": cap_mib, "request_bytes": OOM_REQUEST_MIB * MiB,
            "patterns": patterns}


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
        segments at the end (see :func:`experiments.allocator_gpu.graph_pools_worker`),
        and expandable_in_effect.
    """
    require_cuda("alloc.graph_pools")
    check_fits("the CUDA-graph experiment", 2 * 1024 * MiB)
    data = _measure_shared("graph_pools", expandable)
    data.pop("_alloc_conf", None)
    segments = [s for o in _graph_variants(data).values() for order in o.values() for s in order["pool_segments"]]
    data["expandable_in_effect"] = any(s.get("is_expandable") for s in segments) if segments else None
    return data


def _graph_variants(data: Mapping[str, Any]) -> dict[str, dict[str, Mapping[str, Any]]]:
    """'no_grad' (the top-level orders) and, when measured, 'autograd': order -> its data."""
    out = {"no_grad": {o: data[o] for o in GRAPH_ORDERS}}
    if data.get("autograd"):
        out["autograd"] = {o: data["autograd"][o] for o in GRAPH_ORDERS}
    return out


def predict_graph_pools(data: Mapping[str, Any], expandable: bool) -> dict[str, dict[str, list[int]]]:
    """The model's bytes in the shared pool after each capture of ``alloc.graph_pools``, for
    both capture styles ('no_grad', 'autograd') and both orders, from the recorded model
    shape (batch sizes, hidden size, dtype). The model knows nothing of CUDA graphs: a
    private pool is an allocator of its own, and these are its requests
    (:func:`experiments.allocator_workloads.graph_capture_ops`)."""
    cfg = AllocatorConfig(expandable_segments=expandable)
    out: dict[str, dict[str, list[int]]] = {}
    for variant, autograd in (("no_grad", False), ("autograd", True)):
        out[variant] = {}
        for order in GRAPH_ORDERS:
            ops, ends = graph_capture_ops(data["batch_sizes"], data["hidden"], order=order, autograd=autograd,
                                          dtype=data.get("dtype", GRAPH_DTYPE))
            reserved = simulate(ops, cfg)["reserved_bytes"]
            out[variant][order] = [reserved[e] for e in ends]
    return out


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



def _boundary_data(measured: Mapping[str, Any], expandable: bool) -> dict[str, Any]:
    cfg = AllocatorConfig(expandable_segments=expandable)
    seqs = boundary_sequences()
    sweep = {"sizes_bytes": list(BOUNDARY_SIZES), "first_reserved_bytes": [], "reserved_bytes": [],
             "predicted_reserved_bytes": [], "segments": []}
    for n in BOUNDARY_SIZES:
        m = measured[f"sweep_{n}"]
        sweep["first_reserved_bytes"].append(m["reserved_bytes"][0])
        sweep["reserved_bytes"].append(m["reserved_bytes"][-1])
        sweep["predicted_reserved_bytes"].append(simulate(seqs[f"sweep_{n}"], cfg)["reserved_bytes"][-1])
        sweep["segments"].append(m["snapshots"]["end"])
    m = measured["small_to_large"]
    p = simulate(seqs["small_to_large"], cfg)
    freed_at = 2 * SMALL_COUNT - 1
    s2l = {"small_count": SMALL_COUNT, "small_bytes": SMALL_SIZE_B, "request_bytes": BIG_REQUEST_B,
           "reserved_before_bytes": m["reserved_bytes"][freed_at], "reserved_after_bytes": m["reserved_bytes"][-1],
           "predicted_after_bytes": p["reserved_bytes"][-1],
           "segments_freed": m["snapshots"]["freed"], "segments_after": m["snapshots"]["after"]}
    return {"sweep": sweep, "small_to_large": s2l, "expandable_in_effect": m.get("expandable_in_effect")}


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
    for name, k in KNOBS.items():
        problem = explain_setting_error(k["setting"])
        with_knob = None if problem else _fresh_sequences({name: k["ops"]}, settings=k["setting"],
                                                          cap_mib=KNOB_CAP_MIB)[name]
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
