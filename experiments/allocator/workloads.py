"""The allocation patterns of chapter 1's experiments, as operation sequences.

Each pattern is a list of operations for :func:`experiments.allocator.model.simulate`
(the model) and :func:`experiments.allocator_gpu.run_ops` (the GPU), so the prediction
and the measurement run exactly the same steps. Sizes are in bytes unless a name says MiB.
"""
from __future__ import annotations

from typing import Any

from ..core.registry import Param
from ..core.units import KiB, MiB

# One tensor each: every boundary of the rounding rules (experiments/doctor/RULES.md §I.1).
PROBE_SIZES = (1, 511, 512, 513, 1000, 100 * KiB, MiB - 1, MiB, MiB + 1, 2 * MiB, 5 * MiB, 10 * MiB - 1,
               10 * MiB, 10 * MiB + 1, 11 * MiB, 19 * MiB + MiB // 2, 20 * MiB, 21 * MiB + 1, 100 * MiB + 3)

# The sizes alloc.anatomy records: small, at and across 1 MiB, 1-10 MiB, and ones the split rule rounds.
ANATOMY_SIZES = (1000.0, 102400.0, 1048576.0, 1048577.0, 5242880.0, 11534336.0, 20447232.0, 104857603.0)

ORDERS = ("small_first", "large_first")
TIMELINE_SMALL_MIB = (8, 16)   # the sizes alloc.timeline offers (and records)


def timeline_ops(order: str, small_mib: int) -> list[tuple[Any, ...]]:
    """The post's two orders: 8 × s MiB and 4 × 2s MiB, one phase freed before the other.

    Phase 1 allocates and frees one group; phase 2 allocates the other group, takes a
    snapshot 'phase2', frees it; then ``empty_cache()``.

    Raises:
        ValueError: an unknown order or a size below 1 MiB.
    """
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    if small_mib < 1:
        raise ValueError(f"small_mib must be >= 1 MiB, got {small_mib}")
    small = [("alloc", f"s{i}", small_mib * MiB) for i in range(8)], [("free", f"s{i}") for i in range(8)]
    large = [("alloc", f"L{i}", 2 * small_mib * MiB) for i in range(4)], [("free", f"L{i}") for i in range(4)]
    first, second = (small, large) if order == "small_first" else (large, small)
    return [*first[0], *first[1], *second[0], ("snapshot", "phase2"), *second[1], ("empty_cache",)]

OOM_CAP_MIB = 384           # the default memory cap of the fresh process (fits a 16 GB T4 and the H200 alike)
OOM_FILL_MIB = 32           # phase-1 tensor size; 11 of them leave less than 64 MiB under the default cap
OOM_REQUEST_MIB = 64        # the request that should not fit
OOM_FILL_COUNT = OOM_CAP_MIB // OOM_FILL_MIB - 1   # 11, whatever cap the patterns then run under
# The caps alloc.fragmentation_oom offers; the patterns stay the same under each. The model
# predicts three regimes: below the 352 MiB of the first phase the eleventh 32 MiB tensor
# fails with nothing cached (a plain out-of-memory error); from 352 to 415 MiB the
# fragmented patterns fail on the 64 MiB request; from 416 MiB (352 + 64) a new segment
# fits beside the fragmented ones. For each value the model predicts the same outcomes
# 4 MiB below and above it, with default settings and with expandable segments, so a cap
# set as a fraction of the GPU's memory (set_per_process_memory_fraction) cannot land on
# the other side of a threshold by rounding.
OOM_CAP_CHOICES = (336, OOM_CAP_MIB, 512)
OOM_PATTERNS = {
    "shrink": "11 × 32 MiB allocated and freed; then 11 × 24 MiB kept (each reuses a cached 32 MiB "
              "segment and leaves an 8 MiB tail); then one 64 MiB request",
    "interleave": "11 × 32 MiB allocated and freed; then 22 × 16 MiB in pairs (one kept, one temporary), "
                  "the temporaries freed; then one 64 MiB request",
    "grouped": "the same tensors as 'interleave', but all kept ones first and the temporaries after them; "
               "then one 64 MiB request",
}


def oom_ops(pattern: str) -> list[tuple[Any, ...]]:
    """The operations of one fragmentation pattern (see ``OOM_PATTERNS``).

    Raises:
        ValueError: an unknown pattern.
    """
    if pattern not in OOM_PATTERNS:
        raise ValueError(f"pattern must be one of {sorted(OOM_PATTERNS)}, got {pattern!r}")
    k = OOM_FILL_COUNT
    ops: list[tuple[Any, ...]] = [("alloc", f"p{i}", OOM_FILL_MIB * MiB) for i in range(k)]
    ops += [("free", f"p{i}") for i in range(k)]
    if pattern == "shrink":
        ops += [("alloc", f"a{i}", 24 * MiB) for i in range(k)]
    elif pattern == "interleave":
        for i in range(k):
            ops += [("alloc", f"keep{i}", 16 * MiB), ("alloc", f"tmp{i}", 16 * MiB)]
        ops += [("free", f"tmp{i}") for i in range(k)]
    else:
        ops += [("alloc", f"keep{i}", 16 * MiB) for i in range(k)]
        ops += [("alloc", f"tmp{i}", 16 * MiB) for i in range(k)]
        ops += [("free", f"tmp{i}") for i in range(k)]
    return ops + [("snapshot", "before_request"), ("alloc", "request", OOM_REQUEST_MIB * MiB),
                  ("snapshot", "after_request")]

# The CUDA-graph lab of the book's background notes (seed-posts.md §4.3, after the post's
# motivating case): one graph per batch size of an MLP with this hidden size.
GRAPH_BATCH_SIZES = (256, 512, 768, 1024, 1536, 2048, 3072, 4096)
GRAPH_HIDDEN = 4096
GRAPH_DTYPE = "float16"
GRAPH_ORDERS = ("increasing", "decreasing")
_ELEMENT_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}


def graph_capture_ops(batch_sizes, hidden: int = GRAPH_HIDDEN, *, order: str = "increasing",
                      autograd: bool = False, dtype: str = GRAPH_DTYPE) -> tuple[list[tuple[Any, ...]], list[int]]:
    """What one capture per batch size of ``(relu(x @ W1) * 0.5 + 1.0) @ W2`` asks of its
    shared pool, as operations for the model.

    W1 is hidden × 2·hidden; the input ``x`` lives outside the pool. Every operator makes a
    new tensor of the batch's activations (B × 2·hidden elements), and Python frees each
    one as soon as the next operator has read it, so at most two are alive at once; the
    output (B × hidden) is freed after its capture. With ``autograd`` (weights that require
    grad, as ``nn.Linear``'s do) relu keeps its output and the last matmul its input for a
    backward pass, until the output is freed: three activations at once.

    Returns:
        (operations, index of the last operation of each capture).

    Raises:
        ValueError: an unknown order or dtype.
    """
    if order not in GRAPH_ORDERS:
        raise ValueError(f"order must be one of {GRAPH_ORDERS}, got {order!r}")
    if dtype not in _ELEMENT_BYTES:
        raise ValueError(f"dtype must be one of {sorted(_ELEMENT_BYTES)}, got {dtype!r}")
    ops: list[tuple[Any, ...]] = []
    ends = []
    for i, b in enumerate(sorted(batch_sizes, reverse=(order == "decreasing"))):
        act, out = b * 2 * hidden * _ELEMENT_BYTES[dtype], b * hidden * _ELEMENT_BYTES[dtype]
        h1, h2, h3, h4, y = (f"g{i}_{n}" for n in ("matmul", "relu", "mul", "add", "out"))
        ops += [("alloc", h1, act), ("alloc", h2, act), ("free", h1), ("alloc", h3, act)]
        if autograd:    # relu's output stays (saved for backward)
            ops += [("alloc", h4, act), ("free", h3), ("alloc", y, out), ("free", y), ("free", h2), ("free", h4)]
        else:
            ops += [("free", h2), ("alloc", h4, act), ("free", h3), ("alloc", y, out), ("free", h4), ("free", y)]
        ends.append(len(ops) - 1)
    return ops, ends

BOUNDARY_SIZES = (256 * KiB, 512 * KiB, 768 * KiB, MiB, MiB + 1, MiB + MiB // 4, MiB + MiB // 2, 2 * MiB, 3 * MiB,
                  4 * MiB)
SMALL_COUNT, SMALL_SIZE_B, BIG_REQUEST_B = 8, 512 * KiB, MiB + MiB // 2


def boundary_sequences() -> dict[str, list[tuple[Any, ...]]]:
    """'sweep_<bytes>': a 2 MiB tensor freed, then one of ``BOUNDARY_SIZES``; and
    'small_to_large': eight 512 KiB tensors freed, then a 1.5 MiB request."""
    seqs: dict[str, list[tuple[Any, ...]]] = {
        f"sweep_{n}": [("alloc", "first", 2 * MiB), ("free", "first"), ("alloc", "second", n), ("snapshot", "end")]
        for n in BOUNDARY_SIZES}
    seqs["small_to_large"] = ([("alloc", f"s{i}", SMALL_SIZE_B) for i in range(SMALL_COUNT)]
                              + [("free", f"s{i}") for i in range(SMALL_COUNT)]
                              + [("snapshot", "freed"), ("alloc", "big", BIG_REQUEST_B), ("snapshot", "after")])
    return seqs

KNOB_CAP_MIB = 384           # the garbage-collection threshold needs a cap; every knob run uses the same one
KNOBS: dict[str, dict[str, Any]] = {
    "max_split_size_mb": {
        "setting": {"max_split_size_mb": 64},
        "workload": "a 160 MiB tensor freed; then a 30 MiB tensor kept; then a 150 MiB request",
        "ops": [("alloc", "a", 160 * MiB), ("free", "a"), ("alloc", "b", 30 * MiB), ("alloc", "c", 150 * MiB)],
    },
    "roundup_power2_divisions": {
        "setting": {"roundup_power2_divisions": 4},
        "workload": "a growing tensor: 33, 35, 37 and 39 MiB, each freed before the next",
        "ops": [op for i, m in enumerate((33, 35, 37, 39))
                for op in (("alloc", f"x{i}", m * MiB), ("free", f"x{i}"))],
    },
    "garbage_collection_threshold": {
        "setting": {"garbage_collection_threshold": 0.5},
        "workload": "ten 30 MiB tensors freed; then a 40 MiB request (cap 384 MiB, so the threshold is 192 MiB)",
        "ops": ([("alloc", f"g{i}", 30 * MiB) for i in range(10)] + [("free", f"g{i}") for i in range(10)]
                + [("alloc", "big", 40 * MiB)]),
    },
}

# The memory caps of the fragmentation patterns, as the parameter every caller validates with.
_CAP_PARAM = Param("cap_mib", OOM_CAP_MIB, choices=OOM_CAP_CHOICES, unit="MiB",
                   help="the memory cap of the fresh process the patterns run in")
