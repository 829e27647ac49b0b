"""The GPU side of chapter 1: run allocator operations, read segment layouts, and capture
CUDA graphs into one shared memory pool.

Functions whose names end in ``_worker`` are targets for
:func:`experiments.core.runner.run_fresh`: they run in a fresh process (with the allocator
settings and memory cap the parent chose), take and return JSON values, and assume that
nothing else in the process has touched the allocator. :func:`measure_layouts` instead
works inside the caller's process, in a private ``torch.cuda.MemPool``, when the
installed torch has one.

Sources: the post https://docs.pytorch.org/devlogs/eager/2026-06-01-cuda-caching-allocator/,
``torch.cuda.memory`` (``_snapshot``, ``MemPool``, ``use_mem_pool``) and
``torch.cuda.graph`` (https://docs.pytorch.org/docs/stable/notes/cuda.html#cuda-graphs).
"""
from __future__ import annotations

import gc
import math
import os
from typing import Any, Mapping, Sequence

from ..core.lazy_torch import torch
from .model import normalize_ops, op_label
from .snapshot import PoolIdsMissingError, parse_segments
from ..core.device import require_cuda


def _stats() -> tuple[int, int, int, int]:
    s = torch.cuda.memory_stats()
    return (int(s.get("allocated_bytes.all.current", 0)), int(s.get("reserved_bytes.all.current", 0)),
            int(s.get("num_alloc_retries", 0)), int(s.get("num_ooms", 0)))


def _layout(pool_id: Sequence[int] | None = None) -> list[dict[str, Any]]:
    torch.cuda.synchronize()
    return parse_segments(torch.cuda.memory._snapshot(), pool_id=pool_id, device=torch.cuda.current_device())


def _release() -> None:
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


_settled = False


def _settle_fresh_process() -> None:
    """Once per fresh process: collect, then freeze what exists (torch's own objects).

    Every measurement starts with ``gc.collect()`` so no forgotten tensor skews it; with
    the objects of the torch import frozen, those collections take microseconds instead
    of tens of milliseconds. Only for fresh-process targets, never for a reader's kernel.
    """
    global _settled
    if not _settled:
        gc.collect()
        gc.freeze()
        _settled = True


# ----------------------------------------------------------------------------- sequences

def run_ops(ops: Sequence[Sequence[Any]]) -> dict[str, Any]:
    """Run allocator operations (see :func:`experiments.allocator.model.normalize_ops`) here.

    Uses this process's default pools, so call it in a fresh process where nothing else
    is allocated (snapshots list every segment of the process). Each tensor is
    ``torch.empty(size, dtype=torch.uint8, device='cuda')``. An out-of-memory error is
    caught: the sequence stops there, and the message, the counters and a snapshot
    labelled 'oom' are returned.

    Returns:
        the structure of :func:`experiments.allocator.model.simulate`: labels,
        allocated_bytes and reserved_bytes after each alloc/free/empty_cache (relative
        to the start), snapshots, oom (None, or step, message, request_bytes,
        allocated_bytes, reserved_bytes, reserved_unallocated_bytes), num_alloc_retries,
        num_ooms; plus start_allocated_bytes, start_reserved_bytes and
        expandable_in_effect (whether the first segment made was expandable; None if
        nothing was allocated).
    """
    require_cuda("running allocator operations")
    ops = normalize_ops(ops)
    _release()
    a0, r0, retries0, ooms0 = _stats()
    out: dict[str, Any] = {"labels": [], "allocated_bytes": [], "reserved_bytes": [], "snapshots": {}, "oom": None,
                           "start_allocated_bytes": a0, "start_reserved_bytes": r0, "expandable_in_effect": None}
    live: dict[str, torch.Tensor] = {}
    try:
        for op in ops:
            if op[0] == "snapshot":
                out["snapshots"][op[1]] = _layout()
                continue
            label, message = op_label(op), None
            if op[0] == "alloc":
                try:
                    live[op[1]] = torch.empty(op[2], dtype=torch.uint8, device="cuda")
                except torch.cuda.OutOfMemoryError as e:
                    message = str(e)
                    label += " → OOM"
                if out["expandable_in_effect"] is None and message is None:
                    out["expandable_in_effect"] = any(s["is_expandable"] for s in _layout())
            elif op[0] == "free":
                del live[op[1]]
            else:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
            a, r, _, _ = _stats()
            out["labels"].append(label)
            out["allocated_bytes"].append(a - a0)
            out["reserved_bytes"].append(r - r0)
            if message is not None:
                out["oom"] = {"step": len(out["labels"]) - 1, "message": message, "request_bytes": op[2],
                              "allocated_bytes": a - a0, "reserved_bytes": r - r0,
                              "reserved_unallocated_bytes": r - a}
                out["snapshots"]["oom"] = _layout()
                break
    finally:
        live.clear()
        _release()
    _, _, retries, ooms = _stats()
    out["num_alloc_retries"] = retries - retries0
    out["num_ooms"] = ooms - ooms0
    return out


def sequences_worker(sequences: Mapping[str, Sequence[Sequence[Any]]]) -> dict[str, Any]:
    """Fresh-process target: :func:`run_ops` for each named sequence, cache emptied between.

    Returns:
        name -> result of :func:`run_ops`, and '_alloc_conf' -> the settings string the
        process ran with.
    """
    _settle_fresh_process()
    out: dict[str, Any] = {name: run_ops(ops) for name, ops in sequences.items()}
    out["_alloc_conf"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    return out


def _set_cap(cap_mib: float | None, capped: bool) -> bool:
    """Cap this process's allocator at ``cap_mib`` MiB (None: lift an earlier cap). Returns
    whether a cap is in force. Call it only with nothing reserved."""
    if cap_mib is not None:
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap_mib * 2**20 / total))
        return True
    if capped:
        torch.cuda.set_per_process_memory_fraction(1.0)
    return False


def shared_worker(jobs: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Fresh-process target: several of the chapter's measurements under one allocator setting.

    A fresh process costs seconds (the torch import and the CUDA start), and every
    measurement here starts from an empty cache, so measurements that need the same
    setting can share one process without seeing each other.

    Args:
        jobs: name -> either ``{"sequences": {name: ops}, "cap_mib": MiB or None}``
            (:func:`sequences_worker` under that memory cap) or ``{"graph_pools": kwargs}``
            (:func:`graph_pools_worker`, uncapped). Uncapped sequence jobs run first, then
            capped ones, then the graph captures, whose weights and cuBLAS workspaces stay
            allocated to the end of the process.

    Returns:
        name -> ``{"ok": True, "value": ...}``, or ``{"ok": False, "error": "Type: message"}``
        for a job that raised (the others still run).
    """
    require_cuda("running allocator experiments")
    torch.cuda.init()
    _settle_fresh_process()

    def rank(name: str) -> int:
        job = jobs[name]
        return 2 if "graph_pools" in job else int(job.get("cap_mib") is not None)

    out: dict[str, Any] = {}
    capped = False
    for name in sorted(jobs, key=rank):
        job = jobs[name]
        try:
            capped = _set_cap(job.get("cap_mib"), capped)
            if "graph_pools" in job:
                value = graph_pools_worker(**job["graph_pools"])
            else:
                value = sequences_worker(job["sequences"])
            out[name] = {"ok": True, "value": value}
        except Exception as e:  # one failed job must not cost the others their results
            _release()
            out[name] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    return out


# ----------------------------------------------------------------------------- layouts

class _IsolationFailed(RuntimeError):
    """A private pool did not show the tensors allocated into it."""


def mempool_available() -> bool:
    """Whether layouts can be measured in this process, in a private MemPool.

    Needs ``torch.cuda.MemPool`` and ``use_mem_pool`` (torch 2.6+) and default allocator
    settings (``PYTORCH_CUDA_ALLOC_CONF`` / ``PYTORCH_ALLOC_CONF`` unset or empty), so
    the layout is the one the chapter explains.
    """
    return (hasattr(torch.cuda, "MemPool") and hasattr(torch.cuda, "use_mem_pool")
            and not os.environ.get("PYTORCH_CUDA_ALLOC_CONF") and not os.environ.get("PYTORCH_ALLOC_CONF"))


def layouts_in_mempools(groups: Sequence[Sequence[int]]) -> list[list[dict[str, Any]]]:
    """For each group of sizes: allocate them in a new private pool; return that pool's segments.

    The pool keeps the layout apart from everything else this process has allocated (a
    notebook's tensors, cached blocks). The pool is deleted after each group.

    Raises:
        PoolIdsMissingError: the snapshot cannot tell pools apart.
        _IsolationFailed: the pool's segments do not hold the tensors.
    """
    require_cuda("measuring allocator layouts")
    out = []
    for sizes in groups:
        pool = torch.cuda.MemPool()
        tensors = []
        with torch.cuda.use_mem_pool(pool):
            for n in sizes:
                tensors.append(torch.empty(int(n), dtype=torch.uint8, device="cuda"))
        segments = _layout(pool_id=pool.id)
        held = sum(b["size"] for s in segments for b in s["blocks"] if b["state"] == "active_allocated")
        del tensors
        del pool
        gc.collect()
        torch.cuda.empty_cache()
        if held < sum(int(n) for n in sizes):
            raise _IsolationFailed(f"the private pool shows {held} allocated bytes for {sum(sizes)} requested")
        out.append(segments)
    return out


def layouts_worker(groups: Sequence[Sequence[int]]) -> list[list[dict[str, Any]]]:
    """Fresh-process target: the segments of each group of sizes, allocated in the default pools."""
    require_cuda("measuring allocator layouts")
    _settle_fresh_process()
    out = []
    for sizes in groups:
        _release()
        tensors = [torch.empty(int(n), dtype=torch.uint8, device="cuda") for n in sizes]
        out.append(_layout())
        del tensors
        _release()
    return out


def measure_layouts(groups: Sequence[Sequence[int]]) -> tuple[list[list[dict[str, Any]]], str]:
    """The segment layout after allocating each group of sizes into an empty allocator.

    Returns:
        (one list of segments per group, 'mempool' or 'fresh_process': how the layout was
        kept apart from the rest of the process).
    """
    groups = [[int(n) for n in g] for g in groups]
    if mempool_available():
        try:
            return layouts_in_mempools(groups), "mempool"
        except (PoolIdsMissingError, _IsolationFailed):
            pass  # an older snapshot format: measure in a clean process instead
    from ..core.runner import run_fresh

    result = run_fresh(f"{__name__}:layouts_worker", {"groups": groups}, timeout_s=180)
    return result.unwrap(), "fresh_process"


# ----------------------------------------------------------------------------- CUDA graphs

def graph_pools_worker(
    hidden: int = 4096,
    batch_sizes: Sequence[int] = (256, 512, 768, 1024, 1536, 2048, 3072, 4096),
    orders: Sequence[str] = ("increasing", "decreasing"),
    dtype: str = "float16",
    warmup: int = 2,
    autograd: bool = True,
) -> dict[str, Any]:
    """Fresh-process target: capture one CUDA graph per batch size into one shared pool.

    The model is the toy MLP of the book's lab notes, ``(relu(x @ W1) * 0.5 + 1.0) @ W2``
    with W1 of shape hidden × 2·hidden. For each order, every batch size is captured on
    one capture stream into one ``torch.cuda.graph_pool_handle()``, and each output is
    freed right after its capture, so the next capture may reuse its memory (the graphs
    never run at the same time). Warm-up runs on the capture stream first, so cuBLAS
    workspaces exist before any capture and do not land in the pool. After each order the
    graphs are deleted and the cache emptied, so the orders do not share memory.

    The captures run twice: under ``torch.no_grad()`` as a server would (at most two
    activations alive at once), and, with ``autograd``, with grad enabled on weights that
    require grad (autograd keeps relu's output and the last matmul's input until the
    output is freed: three activations at once); the allocator model reproduces the lab
    notes' numbers (574/194/202 MiB, seed-posts.md §4.3) only for this second way.

    Returns:
        hidden, dtype, batch_sizes, per order the no-grad captures (below) and, with
        ``autograd``, 'autograd': the same per order. Per order: capture_order,
        growth_after_each_bytes (reserved bytes above the pre-capture level after each
        capture), pool_after_each_bytes (the shared pool's own segments after each
        capture; None if the snapshot has no pool ids), reserved_growth_bytes (after all
        captures), pool_reserved_bytes and pool_segments (the pool at the end),
        replayed (every graph replayed without error) and left_after_release_bytes
        (reserved bytes above the start once the graphs are gone).
    """
    require_cuda("capturing CUDA graphs")
    dtypes = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
    if dtype not in dtypes:
        raise ValueError(f"dtype must be one of {sorted(dtypes)}, got {dtype!r}")
    bad = [o for o in orders if o not in ("increasing", "decreasing")]
    if bad:
        raise ValueError(f"orders must be 'increasing' or 'decreasing', got {bad}")
    torch.manual_seed(0)
    dt = dtypes[dtype]
    # Leaf weights that require grad, like nn.Linear's; under no_grad they record nothing.
    w1 = (torch.randn(hidden, 2 * hidden, device="cuda", dtype=dt) / math.sqrt(hidden)).requires_grad_()
    w2 = (torch.randn(2 * hidden, hidden, device="cuda", dtype=dt) / math.sqrt(2 * hidden)).requires_grad_()

    def mlp(x: torch.Tensor) -> torch.Tensor:
        return (torch.relu(x @ w1) * 0.5 + 1.0) @ w2

    inputs = {b: torch.randn(b, hidden, device="cuda", dtype=dt) for b in batch_sizes}
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for grad in (False, True):
            with torch.set_grad_enabled(grad):
                for _ in range(warmup):
                    for b in batch_sizes:
                        mlp(inputs[b])
    torch.cuda.current_stream().wait_stream(stream)
    _release()

    def pool_bytes(pool: Any) -> int | None:
        try:
            return sum(s["total_size"] for s in _layout(pool_id=pool))
        except PoolIdsMissingError:
            return None

    def capture(order: str, grad: bool) -> dict[str, Any]:
        sizes = sorted(batch_sizes, reverse=(order == "decreasing"))
        _release()
        base = torch.cuda.memory_reserved()
        pool = torch.cuda.graph_pool_handle()
        graphs, growth, in_pool = [], [], []
        for b in sizes:
            graph = torch.cuda.CUDAGraph()
            with torch.set_grad_enabled(grad):
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    y = mlp(inputs[b])
            del y  # back to the shared pool (with autograd, the saved activations too)
            graphs.append(graph)
            growth.append(torch.cuda.memory_reserved() - base)
            in_pool.append(pool_bytes(pool))
        for graph in graphs:
            graph.replay()
        torch.cuda.synchronize()
        try:
            pool_segments = _layout(pool_id=pool)
            pool_reserved = sum(s["total_size"] for s in pool_segments)
        except PoolIdsMissingError:
            pool_segments, pool_reserved = [], None
        total = torch.cuda.memory_reserved() - base
        del graph, graphs
        _release()
        return {
            "capture_order": sizes,
            "growth_after_each_bytes": growth,
            "pool_after_each_bytes": None if None in in_pool else in_pool,
            "reserved_growth_bytes": total,
            "pool_reserved_bytes": pool_reserved,
            "pool_segments": pool_segments,
            "replayed": True,
            "left_after_release_bytes": torch.cuda.memory_reserved() - base,
        }

    out: dict[str, Any] = {"hidden": hidden, "dtype": dtype, "batch_sizes": list(batch_sizes)}
    for order in orders:
        out[order] = capture(order, grad=False)
    if autograd:
        out["autograd"] = {order: capture(order, grad=True) for order in orders}
    out["_alloc_conf"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    return out
