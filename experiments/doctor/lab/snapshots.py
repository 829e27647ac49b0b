"""Recording memory snapshots for the allocator doctor on a GPU (chapter 1, "Your own program").

Each workload below runs in a fresh process (allocator settings are read once, when CUDA
starts) with ``torch.cuda.memory._record_memory_history`` on, takes
``torch.cuda.memory._snapshot()`` at the end, and returns the snapshot in the doctor's
compact JSON form (:func:`compact_snapshot`: no stack frames, no times) together with what
the GPU itself reported after each phase (``memory_stats`` counters and the trace index at
that point). The experiment ``alloc.doctor_snapshots`` records every workload under several
settings; the CPU tests replay each recording and compare with those counters.

Workloads cover every mechanism the doctor models: two streams and ``record_stream``
(``streams``), ``torch.cuda.MemPool`` and CUDA-graph pools (``pools``), a memory cap with the
out-of-memory path and ``garbage_collection_threshold`` (``cap``), recording started after
tensors existed (``late_start``), torch's expandable-segment virtual range
(``expandable_range``), a seeded mix of sizes for the knobs (``mixed``), and a real
``torch.nn`` transformer's training steps at growing batch sizes with a side stream that
prefetches the batches (``training``).

Sources: ``torch/cuda/memory.py`` (``_record_memory_history``, ``_snapshot``, ``MemPool``,
``use_mem_pool``), ``torch/cuda/graphs.py`` and experiments/doctor/RULES.md §B-E. torch is imported
inside the functions so that the module (and its experiment) can be imported without a GPU.
"""
from __future__ import annotations

import gc
import random
from typing import Any, Callable

from ...core.registry import Param, experiment
from ...core.units import GiB, MiB, memory_fraction
from ..reading.trace import compact_snapshot
from .recorder import Recorder, empty, gpu_stats, start_history

# Workload -> the settings it is recorded under. A setting is a PYTORCH_CUDA_ALLOC_CONF string
# ('' = defaults); 'cap' workloads also set a memory fraction inside the process.
SETTINGS: dict[str, tuple[str, ...]] = {
    "mixed": ("", "expandable_segments:True", "max_split_size_mb:64", "roundup_power2_divisions:[>:2]",
              "roundup_power2_divisions:4,max_split_size_mb:128"),
    "streams": ("", "expandable_segments:True"),
    "pools": ("", "expandable_segments:True"),
    "cap": ("", "expandable_segments:True", "max_split_size_mb:64", "garbage_collection_threshold:0.6"),
    "late_start": ("", "expandable_segments:True"),
    "expandable_range": ("", "expandable_segments:True"),
    "training": ("", "expandable_segments:True", "max_split_size_mb:64", "roundup_power2_divisions:4"),
}
WORKLOADS = tuple(SETTINGS)
CAP_BYTES = 1 * GiB           # the 'cap' workload's memory cap
TRAINING_BATCHES = (24, 32, 40, 48)


# ----------------------------------------------------------------------------- the workloads

def _w_mixed(rec: Recorder) -> None:
    import torch

    side = torch.cuda.Stream()
    rng = random.Random(11)
    keep = [empty(2100), empty(3 * MiB + 1), empty(33 * MiB + 1), empty(129 * MiB)]  # rounding probes
    rec.mark("probes")
    live: list[Any] = []
    for i in range(1500):
        if live and rng.random() < 0.47:
            live.pop(rng.randrange(len(live)))
        else:
            band = rng.random()
            n = int(2 ** rng.uniform(0, 20)) if band < 0.5 else int(2 ** rng.uniform(20, 23.3)) if band < 0.8 \
                else int(2 ** rng.uniform(23.3, 27.6))
            live.append(empty(max(1, n), side if rng.random() < 0.3 else None))
        if i % 400 == 399:
            torch.cuda.empty_cache()
        if i % 500 == 499:
            rec.mark(f"step{i + 1}")
    del keep
    live.clear()
    rec.mark("freed")
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    rec.mark("empty_cache")


def _w_streams(rec: Recorder) -> None:
    import torch

    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    a = empty(30 * MiB, s1)
    b = empty(30 * MiB)
    del a                                   # back to s1's pool: a default-stream request cannot use it
    c = empty(30 * MiB)
    d = empty(30 * MiB, s1)                # takes a's block
    rec.mark("stream_pools")
    pending = []
    for i in range(6):
        x = empty(8 * MiB)
        with torch.cuda.stream(s2):
            torch.cuda._sleep(20_000_000)   # ~10 ms: the free below completes only later
            x.add_(1)
        x.record_stream(s2)
        pending.append(x)
    pending.clear()                         # free_requested now, free_completed when s2 gets there
    y = empty(8 * MiB)                      # likely a new block: the old ones are still pending
    rec.mark("record_stream")
    torch.cuda.synchronize()
    z = empty(8 * MiB)                      # process_events: completes the pending frees first
    rec.mark("after_sync")
    w = empty(12 * MiB)
    with torch.cuda.stream(s2):
        torch.cuda._sleep(50_000_000)
        w.add_(1)
    w.record_stream(s2)
    del w
    torch.cuda.empty_cache()                # waits on the event, then releases
    rec.mark("empty_cache_pending")
    del b, c, d, y, z
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    rec.mark("end")


def _w_pools(rec: Recorder) -> None:
    import torch

    base = empty(5 * MiB)
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        p1 = empty(5 * MiB)
        p2 = empty(700 * 1024)
        p3 = empty(40 * MiB)
    del p1
    q = empty(5 * MiB)                     # default pool: does not take p1's free block
    with torch.cuda.use_mem_pool(pool):
        p4 = empty(4 * MiB)                # private pool: reuses p1's block
    rec.mark("mempool")
    pool2 = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool2):
        r1 = empty(24 * MiB)
        r2 = empty(300 * 1024)
    del r1, r2
    del pool2                               # releases pool2's free segments
    gc.collect()
    rec.mark("mempool_deleted")
    x = torch.ones(1024, 1024, device="cuda")
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            y = x * 2 + 1
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        t = x * 2
        y = t + 1
        del t
        big = torch.empty(12 * MiB, dtype=torch.uint8, device="cuda")
        del big
    g.replay()
    rec.mark("graph")
    g2 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g2):
        y2 = x * 3
        tmp = torch.empty(6 * MiB, dtype=torch.uint8, device="cuda")
        del tmp
    del g2, y2
    gc.collect()
    torch.cuda.empty_cache()                # g2's pool is freeable now: its segments go
    rec.mark("graph_released")
    del base, q, p2, p3, p4
    torch.cuda.empty_cache()
    rec.mark("end")
    _ = (pool, g, y)                        # alive until the snapshot


def _w_cap(rec: Recorder) -> None:
    import torch

    from ...core.device import cap_memory

    total = torch.cuda.get_device_properties(0).total_memory
    enforced = cap_memory(CAP_BYTES)
    rec.phases.append({"phase": "cap", "trace_index": 0, "cap_bytes": enforced,
                       "fraction": memory_fraction(CAP_BYTES, total), "total_memory": int(total), **gpu_stats()})
    blocks = [empty(30 * MiB) for _ in range(30)]          # 900 MiB in 30 segments
    del blocks[::2]                                         # 450 MiB free in 15 holes
    rec.mark("fragmented")
    big = empty(200 * MiB)        # needs the OOM path: release the free segments, then retry
    rec.mark("retry")
    try:
        huge = empty(700 * MiB)   # does not fit even after releasing everything
    except torch.OutOfMemoryError:
        huge = None
    rec.mark("oom")
    del big, huge
    small = [empty(6 * MiB) for _ in range(40)]
    del small[1::2]
    mid = [empty(25 * MiB) for _ in range(10)]   # 450 + 120 + 250 MiB allocated: fits the cap
    rec.mark("refill")
    del small, mid, blocks
    gc.collect()
    for n in (150, 260, 90, 300):
        t = empty(n * MiB)
        del t
    rec.mark("end")


def _w_late_start(rec: Recorder) -> None:
    import torch

    early = [empty(n) for n in (3 * MiB, 500 * 1024, 25 * MiB, 9 * MiB, 100 * 1024)]
    gap = empty(7 * MiB)
    del gap
    start_history(max_entries=2_000_000)
    rec.mark("recording")
    del early[1], early[2]
    more = [empty(n) for n in (2 * MiB, 24 * MiB, 400 * 1024, 11 * MiB)]
    rec.mark("mixed")
    early.clear()
    more.pop(0)
    torch.cuda.empty_cache()
    rec.mark("end")


def _w_expandable_range(rec: Recorder) -> None:
    import torch

    a = empty(60 * GiB)
    b = empty(1 * GiB)
    c = empty(60 * GiB)
    del a, c
    torch.cuda.empty_cache()
    rec.mark("freed")
    d = empty(100 * GiB - 10 * MiB)
    rec.mark("big")
    del b, d
    torch.cuda.empty_cache()
    rec.mark("end")


def _w_training(rec: Recorder) -> None:
    import torch
    from torch import nn

    torch.manual_seed(0)
    d_model, seq = 512, 128
    layer = nn.TransformerEncoderLayer(d_model, nhead=8, dim_feedforward=2048, batch_first=True, dropout=0.0)
    model = nn.Sequential(nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False),
                          nn.Linear(d_model, 1000)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loss_fn = nn.CrossEntropyLoss()
    side = torch.cuda.Stream()
    rec.mark("model")
    for bs in TRAINING_BATCHES:
        host_x = torch.randn(bs, seq, d_model).pin_memory()
        host_y = torch.randint(0, 1000, (bs, seq)).pin_memory()
        for _ in range(2):
            with torch.cuda.stream(side):     # prefetch on a side stream
                x = host_x.to("cuda", non_blocking=True)
                y = host_y.to("cuda", non_blocking=True)
            torch.cuda.current_stream().wait_stream(side)
            x.record_stream(torch.cuda.current_stream())
            y.record_stream(torch.cuda.current_stream())
            out = model(x)
            loss = loss_fn(out.reshape(-1, 1000), y.reshape(-1))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            del x, y, out, loss
        rec.mark(f"batch{bs}")


_WORKLOADS: dict[str, Callable[[Recorder], None]] = {
    "mixed": _w_mixed, "streams": _w_streams, "pools": _w_pools, "cap": _w_cap,
    "late_start": _w_late_start, "expandable_range": _w_expandable_range, "training": _w_training,
}


def snapshot_worker(workload: str) -> dict[str, Any]:
    """Fresh-process target: run one workload with the trace on; return its compact snapshot.

    Returns:
        dict with snapshot (:func:`compact_snapshot`), phases (list of the GPU's counters
        after each phase, each with the trace index at that point) and device_total_bytes.

    Raises:
        ValueError: an unknown workload.
    """
    import torch

    if workload not in _WORKLOADS:
        raise ValueError(f"workload must be one of {sorted(_WORKLOADS)}, got {workload!r}")
    torch.cuda.init()
    rec = Recorder()
    if workload != "late_start":
        start_history(max_entries=2_000_000)
    _WORKLOADS[workload](rec)
    torch.cuda.synchronize()
    snap = compact_snapshot(torch.cuda.memory._snapshot())
    torch.cuda.memory._record_memory_history(enabled=None)
    total = int(torch.cuda.get_device_properties(0).total_memory)
    snap["device_total_bytes"] = total
    cap = next((p.get("cap_bytes") for p in rec.phases if "cap_bytes" in p), None)
    snap["memory_cap_bytes"] = cap
    return {"snapshot": snap, "phases": rec.phases, "device_total_bytes": total, "final": gpu_stats()}


# ----------------------------------------------------------------------------- the experiment

_PHASES = {"type": "array", "items": {"type": "object", "required": ["phase", "trace_index",
                                                                      "allocated_bytes.all.current",
                                                                      "reserved_bytes.all.current"]}}


@experiment(
    "alloc.doctor_snapshots",
    chapter=1,
    title="Memory snapshots of seven workloads under several allocator settings, for the doctor",
    own_budget=True,   # 21 fresh processes, ~140 s: record --experiment alloc.doctor_snapshots
    params=[Param("workload", "training", choices=WORKLOADS, help="the program whose snapshot is recorded")],
    grid={"workload": WORKLOADS},
    data_schema={
        "type": "object", "required": ["runs"],
        "properties": {"runs": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["settings", "snapshot", "phases"],
            "properties": {"settings": {"type": "string"}, "phases": _PHASES,
                           "snapshot": {"type": "object", "required": ["format", "trace_z", "segments"]}}}}},
    },
)
def doctor_snapshots(workload: str = "training") -> dict[str, Any]:
    """Record ``workload`` once per setting in ``SETTINGS[workload]``, each in a fresh process.

    Returns:
        runs: one dict per setting with settings (the PYTORCH_CUDA_ALLOC_CONF string),
        snapshot (compact form), phases (the GPU's counters after each phase), final
        (counters at the end) and device_total_bytes.
    """
    from ...core.device import require_cuda
    from ...core.runner import run_fresh

    require_cuda("alloc.doctor_snapshots")
    if workload not in SETTINGS:
        raise ValueError(f"workload must be one of {sorted(SETTINGS)}, got {workload!r}")
    runs = []
    for setting in SETTINGS[workload]:
        value = run_fresh("experiments.doctor.lab.snapshots:snapshot_worker", {"workload": workload},
                          alloc_conf_settings=setting or None, timeout_s=300).unwrap()
        runs.append({"settings": setting, **value})
    return {"runs": runs}


# ----------------------------------------------------------------------------- the reader's own GPU

def own_snapshot(workload: str = "training", *, mode: str | None = None) -> dict[str, Any]:
    """One snapshot of ``workload`` under the default settings: recorded live on this GPU in a
    fresh process (a few seconds), or, without a GPU (or ``mode='recorded'``), the lab H200's
    run of the same program under the same settings from ``alloc.doctor_snapshots``.

    Returns:
        a run as :func:`doctor_snapshots` returns them (settings '', snapshot, phases, final,
        device_total_bytes), with ``source``: 'live on <GPU>' or 'recorded on <GPU>, <date>'.

    Raises:
        ValueError: an unknown workload or mode.
    """
    from ...core.registry import resolve_mode, run

    if workload not in SETTINGS:
        raise ValueError(f"workload must be one of {sorted(SETTINGS)}, got {workload!r}")
    if resolve_mode(mode) == "live":
        from ...core.device import collect_provenance
        from ...core.runner import run_fresh

        value = run_fresh("experiments.doctor.lab.snapshots:snapshot_worker", {"workload": workload},
                          alloc_conf_settings=None, timeout_s=300).unwrap()
        return {"settings": "", **value, "source": f"live on {collect_provenance().gpu_name}"}
    result = run("alloc.doctor_snapshots", mode="recorded", workload=workload)
    base = next(r for r in result["runs"] if r["settings"] == "")
    return {**base, "source": f"recorded on {result.provenance.gpu_name}, {result.provenance.day}"}
