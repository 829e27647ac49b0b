"""Chapter 1's results assembled from what the GPU measured, beside what the allocator
model (:mod:`.model`) predicts for the same sequences: the request table, timelines, the
fragmentation patterns, the pool boundary and the CUDA-graph pools. Plain Python: no GPU."""
from __future__ import annotations

from typing import Any, Mapping, Sequence
from ..core.units import MiB
from .model import AllocatorConfig, compact_layout, normalize_ops, request_anatomy, simulate
from .snapshot import layout_summary, parse_oom_message
from .workloads import (
    _CAP_PARAM, BOUNDARY_SIZES, GRAPH_DTYPE, GRAPH_ORDERS, OOM_CAP_MIB, OOM_PATTERNS, OOM_REQUEST_MIB,
    ORDERS, SMALL_COUNT, SMALL_SIZE_B, BIG_REQUEST_B, boundary_sequences, graph_capture_ops, oom_ops,
    timeline_ops,
)


def _sizes_equal_layouts(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]) -> bool:
    """Same segments and blocks, ignoring addresses and the order of segments."""
    return sorted(compact_layout(a)) == sorted(compact_layout(b))


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
    pattern -> the result of :func:`experiments.allocator.model.simulate` (no GPU needed).

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
    (:func:`experiments.allocator.workloads.graph_capture_ops`)."""
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
