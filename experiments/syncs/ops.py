"""Chapter 4 helpers: the operations of the sync catalogue, and how each one is measured.

Each :class:`Op` builds its inputs once (untimed) and returns a zero-argument callable
that runs just the operation. :func:`measure_op` then asks three questions of it: does
``set_sync_debug_mode`` report it, does the book's detector report it, and how long is
the host blocked in it when GPU work is queued ahead. :func:`capture_probe` asks a
fourth in a fresh process: can it be captured in a CUDA graph?

Expected outcomes are the lab's on torch 2.11 / H200 (field report #14 and the post's
tables, https://docs.pytorch.org/devlogs/eager/2026-08-11-hidden-h2d-sync/).
"""
from __future__ import annotations

import dataclasses
import sys
from typing import Any, Callable

import numpy as np

from ..core.lazy_torch import torch
from ..core.measure import gpu_sleep, time_host
from ..core.runner import run_fresh
from .detector import SyncDetector

CAPTURE_NUMEL = 4096
NUMEL_CHOICES = (4096, 4_194_304)  # float32: 16 KiB and 16 MiB

GROUPS = (
    "device to host: a Python value",
    "device to host: a data-dependent shape",
    "host to device: a hidden copy",
    "explicit copies",
    "explicit waits",
    "stays on the device",
)

Builder = Callable[[int, "torch.device"], Callable[[], Any]]


@dataclasses.dataclass(frozen=True)
class Op:
    """One row of the catalogue.

    Attributes:
        id: short key used in parameters and answers.
        code: what the reader writes (``x`` is a float32 CUDA tensor of ``numel``
            elements, ``x2 = x.view(-1, 8)``, ``mask = x > 0``, ``loss = x.sum()``).
        group: one of :data:`GROUPS`.
        expected_sync: whether the host waits, as measured on the lab H200 / torch 2.11
            at 16 KiB; None where it depends on the size and the driver.
        why: one line on the mechanism.
        build: (numel, device) -> the operation as a zero-argument callable.
        version_note: how other torch releases differ, if they do.
    """

    id: str
    code: str
    group: str
    expected_sync: bool | None
    why: str
    build: Builder
    version_note: str = ""


def _x(numel: int, device: torch.device) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randn(numel, generator=g).to(device)


def _b_item(n, d):
    loss = _x(n, d).sum()
    return lambda: loss.item()


def _b_if(n, d):
    loss = _x(n, d).sum()
    return lambda: bool(loss > 0)


def _b_print(n, d):
    x = _x(n, d)
    return lambda: repr(x)


def _b_cpu(n, d):
    x = _x(n, d)
    return lambda: x.cpu()


def _b_mask_index(n, d):
    x = _x(n, d)
    mask = x > 0
    return lambda: x[mask]


def _b_nonzero(n, d):
    mask = _x(n, d) > 0
    return lambda: mask.nonzero()


def _b_where1(n, d):
    mask = _x(n, d) > 0
    return lambda: torch.where(mask)


def _b_masked_select(n, d):
    x = _x(n, d)
    mask = x > 0
    return lambda: x.masked_select(mask)


def _b_unique(n, d):
    labels = torch.randint(0, 100, (n,), generator=torch.Generator().manual_seed(0)).to(d)
    return lambda: torch.unique(labels)


def _b_repeat_interleave(n, d):
    x = _x(n, d)
    counts = torch.ones(n, dtype=torch.int64, device=d)
    return lambda: x.repeat_interleave(counts)


def _b_repeat_interleave_size(n, d):
    x = _x(n, d)
    counts = torch.ones(n, dtype=torch.int64, device=d)
    return lambda: x.repeat_interleave(counts, output_size=n)


def _b_tensor_list(n, d):
    return lambda: torch.tensor([0.0, 1.0, 2.0], device=d)


def _b_tensor_scalar(n, d):
    return lambda: torch.tensor(3.0, device=d)


def _b_index_list(n, d):
    x2 = _x(n, d).view(-1, 8)
    return lambda: x2[:, [0, 2, 3]]


def _b_index_tuple(n, d):
    x2 = _x(n, d).view(-1, 8)
    return lambda: x2[:, (0, 2, 3)]


def _b_index_numpy(n, d):
    x2 = _x(n, d).view(-1, 8)
    idx = np.array([0, 2, 3])
    return lambda: x2[:, idx]


def _b_index_cpu_tensor(n, d):
    x2 = _x(n, d).view(-1, 8)
    idx = torch.tensor([0, 2, 3])
    return lambda: x2[:, idx]


def _b_to_pageable(n, d):
    src = torch.ones(n)
    return lambda: src.to(d)


def _b_to_pinned_blocking(n, d):
    src = torch.ones(n).pin_memory()
    return lambda: src.to(d)


def _b_to_pageable_nb(n, d):
    src = torch.ones(n)
    return lambda: src.to(d, non_blocking=True)


def _b_to_pinned_nb(n, d):
    src = torch.ones(n).pin_memory()
    return lambda: src.to(d, non_blocking=True)


def _b_dtoh_pinned_nb(n, d):
    x = _x(n, d)
    return lambda: x.to("cpu", non_blocking=True)


def _b_dtoh_pageable_nb(n, d):
    x = _x(n, d)
    host = torch.empty(n)
    return lambda: host.copy_(x, non_blocking=True)


def _b_synchronize(n, d):
    return lambda: torch.cuda.synchronize()


def _b_stream_sync(n, d):
    return lambda: torch.cuda.current_stream().synchronize()


def _b_event_sync(n, d):
    done = torch.cuda.Event()

    def run() -> None:
        done.record()
        done.synchronize()

    return run


def _b_full(n, d):
    return lambda: torch.full((3,), 1.0, device=d)


def _b_add_cpu_scalar(n, d):
    x = _x(n, d)
    return lambda: x + torch.tensor(1.0)


def _b_masked_fill(n, d):
    x = _x(n, d)
    mask = x > 0
    return lambda: x.masked_fill(mask, 0.0)


def _b_where3(n, d):
    x = _x(n, d)
    mask = x > 0
    return lambda: torch.where(mask, x, 0.0)


def _b_mask_assign(n, d):
    x = _x(n, d)
    mask = x > 0

    def run() -> None:
        x[mask] = 0.0

    return run


def _b_any(n, d):
    mask = _x(n, d) > 0
    return lambda: mask.any()


def _b_fill_device_scalar(n, d):
    x = _x(n, d)
    loss = x.sum()
    buf = torch.empty(n, device=d)
    return lambda: buf.fill_(loss)


def _b_index_cuda(n, d):
    x2 = _x(n, d).view(-1, 8)
    idx = torch.tensor([0, 2, 3], device=d)
    return lambda: x2[:, idx]


def _b_index_pinned_nb(n, d):
    x2 = _x(n, d).view(-1, 8)
    idx = torch.tensor([0, 2, 3]).pin_memory()
    return lambda: x2[:, idx.to(d, non_blocking=True)]


def _b_cpu_bool_mask(n, d):
    x = _x(n, d)
    cpu_mask = torch.rand(n, generator=torch.Generator().manual_seed(1)) > 0.5
    return lambda: x[cpu_mask]


def _b_slice(n, d):
    x2 = _x(n, d).view(-1, 8)
    return lambda: x2[:, 1:3]


_PY, _SHAPE, _HIDDEN, _COPY, _WAIT, _DEVICE = GROUPS

OPS: tuple[Op, ...] = (
    Op("item", "loss.item()", _PY, True, "the Python float exists only after the GPU computed it", _b_item),
    Op("if_tensor", "if loss > 0: ...", _PY, True, "Python's if needs a bool: an implicit .item()", _b_if),
    Op("print", "print(x)", _PY, True, "printing copies values to the host (repr makes several copies)", _b_print),
    Op("cpu", "x.cpu()", _PY, True, "a blocking device-to-host copy waits for the queue", _b_cpu),
    Op("mask_index", "x[mask]", _SHAPE, True, "calls nonzero: the output size must reach the host", _b_mask_index),
    Op("nonzero", "mask.nonzero()", _SHAPE, True, "output size depends on the data on the GPU", _b_nonzero),
    Op("where_1arg", "torch.where(mask)", _SHAPE, True, "one-argument where is nonzero", _b_where1),
    Op("masked_select", "x.masked_select(mask)", _SHAPE, True, "output size depends on the mask", _b_masked_select),
    Op("unique", "torch.unique(labels)", _SHAPE, True, "number of distinct values is data-dependent", _b_unique),
    Op("repeat_interleave", "x.repeat_interleave(counts)", _SHAPE, True,
       "computes the output length on the GPU and reads it back", _b_repeat_interleave),
    Op("tensor_list", "torch.tensor([0., 1., 2.], device='cuda')", _HIDDEN, True,
       "built in pageable host memory, then a blocking copy", _b_tensor_list),
    Op("tensor_scalar", "torch.tensor(3.0, device='cuda')", _HIDDEN, True,
       "same path as a list: pageable buffer, blocking copy", _b_tensor_scalar),
    Op("index_list", "x2[:, [0, 2, 3]]", _HIDDEN, True, "the list becomes a CPU index tensor, copied blocking",
       _b_index_list),
    Op("index_tuple", "x2[:, (0, 2, 3)]", _HIDDEN, True, "a tuple inside the index is a sequence, like a list",
       _b_index_tuple),
    Op("index_numpy", "x2[:, np.array([0, 2, 3])]", _HIDDEN, True, "a NumPy index is copied like a list",
       _b_index_numpy),
    Op("index_cpu_tensor", "x2[:, idx_cpu]", _HIDDEN, True, "a CPU index tensor is copied to the GPU, blocking",
       _b_index_cpu_tensor),
    Op("to_cuda_pageable", "src.to('cuda')", _COPY, True, "PyTorch waits after every blocking copy",
       _b_to_pageable),
    Op("to_cuda_pinned_blocking", "src_pinned.to('cuda')", _COPY, True,
       "pinning alone does not help: without non_blocking PyTorch still waits", _b_to_pinned_blocking),
    Op("to_cuda_pageable_nb", "src.to('cuda', non_blocking=True)", _COPY, None,
       "the driver stages small pageable copies and drains the stream for large ones", _b_to_pageable_nb),
    Op("to_cuda_pinned_nb", "src_pinned.to('cuda', non_blocking=True)", _COPY, False,
       "a DMA from page-locked memory is queued like a kernel", _b_to_pinned_nb),
    Op("dtoh_pinned_nb", "x.to('cpu', non_blocking=True)", _COPY, False,
       "PyTorch allocates a pinned destination; read it only after a sync", _b_dtoh_pinned_nb),
    Op("dtoh_pageable_nb", "host.copy_(x, non_blocking=True)", _COPY, True,
       "into pageable memory the driver completes the copy before returning", _b_dtoh_pageable_nb),
    Op("synchronize", "torch.cuda.synchronize()", _WAIT, True, "waits for every stream of the device",
       _b_synchronize),
    Op("stream_synchronize", "torch.cuda.current_stream().synchronize()", _WAIT, True,
       "waits for one stream", _b_stream_sync),
    Op("event_synchronize", "done.record(); done.synchronize()", _WAIT, True,
       "waits until the GPU reaches the event", _b_event_sync),
    Op("full", "torch.full((3,), 1.0, device='cuda')", _DEVICE, False, "the value travels as a kernel argument",
       _b_full),
    Op("add_cpu_scalar", "x + torch.tensor(1.0)", _DEVICE, False,
       "a 0-dim CPU tensor is read on the host and passed as a kernel argument", _b_add_cpu_scalar),
    Op("masked_fill", "x.masked_fill(mask, 0.0)", _DEVICE, False, "same shape out as in: nothing to report back",
       _b_masked_fill),
    Op("where_3arg", "torch.where(mask, x, 0.0)", _DEVICE, False, "shape-static select", _b_where3),
    Op("mask_assign", "x[mask] = 0.0", _DEVICE, False, "assigning a scalar through a mask is a masked fill",
       _b_mask_assign),
    Op("any", "mask.any()", _DEVICE, False, "the result stays a CUDA tensor", _b_any,
       "synced in 2022 releases (pytorch/pytorch#84291); fixed since"),
    Op("repeat_interleave_size", "x.repeat_interleave(counts, output_size=n)", _DEVICE, False,
       "the host already knows the length", _b_repeat_interleave_size),
    Op("fill_device_scalar", "buf.fill_(loss)", _DEVICE, False, "the fill reads the 0-dim tensor on the GPU",
       _b_fill_device_scalar, "read the value on the host in 2023 releases (pytorch/pytorch#109115); fixed since"),
    Op("index_cuda", "x2[:, idx_cuda]", _DEVICE, False, "the index is already on the GPU: one gather kernel",
       _b_index_cuda),
    Op("index_pinned_nb", "x2[:, idx_pinned.to('cuda', non_blocking=True)]", _DEVICE, False,
       "the post's fix: a pinned index copied asynchronously", _b_index_pinned_nb),
    Op("cpu_bool_mask", "x[cpu_mask]", _DEVICE, False,
       "nonzero runs on the host; its result is copied through pinned memory", _b_cpu_bool_mask,
       "recent releases only (PyTorch PR #156384, 2025); older ones sync here"),
    Op("slice", "x2[:, 1:3]", _DEVICE, False, "basic indexing makes a view: no kernel at all", _b_slice),
)

OPS_BY_ID = {op.id: op for op in OPS}
OP_IDS = tuple(OPS_BY_ID)


def get_op(op_id: str) -> Op:
    """The :class:`Op` with this id. Raises ValueError listing the ids."""
    try:
        return OPS_BY_ID[op_id]
    except KeyError:
        raise ValueError(f"op must be one of {list(OP_IDS)}, got {op_id!r}") from None




def measure_op(op: Op, numel: int, work_ms: float, *, repeats: int = 3) -> dict[str, Any]:
    """Ask the three in-process questions of one operation on the current GPU.

    Returns a dict: ``debug_mode_syncs`` (warnings from ``set_sync_debug_mode("warn")``
    alone), ``detector_syncs`` and ``detector_kinds`` (the book's detector),
    ``host_blocked_ms`` (median/p10/p90/n of the host time inside the call, in ms, with
    ``work_ms`` of GPU work queued just before it).
    """
    device = torch.device("cuda", torch.cuda.current_device())
    fn = op.build(numel, device)
    torch.cuda.synchronize()
    with SyncDetector("report", explicit=False, copies=False) as alone:
        fn()  # also the warm-up: lazy initialisation happens here, not in the timed calls
    torch.cuda.synchronize()
    with SyncDetector("report") as full:
        fn()
    torch.cuda.synchronize()
    blocked = time_host(fn, setup=lambda: gpu_sleep(work_ms), warmup=1, repeats=repeats)
    del fn
    return {"debug_mode_syncs": alone.count, "detector_syncs": full.count,
            "detector_kinds": sorted(full.counts()), "host_blocked_ms": blocked.to_dict()}


def host_blocked_series(op: Op, numel: int, queued_ms: list[float], *, repeats: int = 3) -> list[dict[str, Any]]:
    """Host time inside the call (stats in ms) for each amount of queued GPU work."""
    device = torch.device("cuda", torch.cuda.current_device())
    fn = op.build(numel, device)
    fn()
    torch.cuda.synchronize()
    out = []
    for q in queued_ms:
        out.append(time_host(fn, setup=lambda q=q: gpu_sleep(q), warmup=1, repeats=repeats).to_dict())
    del fn
    return out


# ----------------------------------------------------------------- CUDA-graph capture probes

def _root_error(exc: BaseException) -> str:
    """The first error in a chain (a failed capture also fails in capture_end; the body's error is the cause)."""
    root = exc
    while root.__context__ is not None and root.__context__ is not root:
        root = root.__context__
    text = str(root).strip().splitlines()[0] if str(root).strip() else ""
    return f"{type(root).__name__}: {text}"[:200]


def _context_ok() -> bool:
    try:
        torch.cuda.synchronize()
        return float(torch.ones(4, device="cuda").sum().item()) == 4.0
    except Exception:
        return False


def _capture_worker(op_ids: list[str], numel: int) -> dict[str, Any]:
    """Fresh-process target: try to capture each op in a CUDA graph on a side stream.

    Each op runs once eagerly first (lazy initialisation cannot happen during capture).
    After each probe the current stream is reset and the context checked; if it no
    longer works the worker stops and names the op (the parent resumes in a new process).
    """
    device = torch.device("cuda", 0)
    results: dict[str, Any] = {}
    poisoned = None
    for op_id in op_ids:
        print(f"probing {op_id}", file=sys.stderr, flush=True)
        op = OPS_BY_ID[op_id]
        try:
            fn = op.build(numel, device)
            fn()
            torch.cuda.synchronize()
        except Exception as e:
            results[op_id] = {"capturable": None, "error": "eager run failed: " + _root_error(e)}
            continue
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        try:
            with torch.cuda.graph(graph, stream=side):
                fn()
            results[op_id] = {"capturable": True, "error": ""}
        except Exception as e:
            results[op_id] = {"capturable": False, "error": _root_error(e)}
        finally:
            # A failed capture_end skips the stream context's exit: put the default stream back.
            torch.cuda.set_stream(torch.cuda.default_stream())
        del graph, fn
        if not _context_ok():
            poisoned = op_id
            break
    return {"results": results, "poisoned_after": poisoned}


_CAPTURE_CACHE: dict[int, dict[str, Any]] = {}


def capture_probe(op_ids: list[str] | None = None, *, numel: int = CAPTURE_NUMEL, max_processes: int = 5,
                  timeout_s: float = 120.0) -> dict[str, dict[str, Any]]:
    """Capturability of each op, probed in fresh processes (cached per process and size).

    Returns {op id: {"capturable": True/False/None, "error": text}}; None means the op
    could not be probed (an eager failure, or the probing process crashed).
    """
    ids = list(op_ids or OP_IDS)
    cache = _CAPTURE_CACHE.setdefault(numel, {})
    todo = [i for i in ids if i not in cache]
    processes = 0
    while todo and processes < max_processes:
        processes += 1
        fresh = run_fresh("experiments.syncs.ops:_capture_worker", {"op_ids": todo, "numel": numel},
                          timeout_s=timeout_s)
        if fresh.ok:
            value = fresh.value
            cache.update(value["results"])
        else:
            # The child died mid-probe: blame the op it announced last, keep going after it.
            last = _last_probed(fresh.stderr_tail) or todo[0]
            cache[last] = {"capturable": None, "error": f"probe process {fresh.error_kind}: {fresh.message}"[:200]}
        todo = [i for i in todo if i not in cache]
    for i in todo:
        cache[i] = {"capturable": None, "error": "not probed (too many probe processes failed)"}
    return {i: cache[i] for i in ids}


def _last_probed(stderr_tail: str) -> str | None:
    for line in reversed((stderr_tail or "").splitlines()):
        if line.startswith("probing "):
            name = line.split(" ", 1)[1].strip()
            if name in OPS_BY_ID:
                return name
    return None
