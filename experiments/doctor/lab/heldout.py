"""Held-back programs for the allocator doctor: classes the doctor's own cases do not cover.

Each program is recorded on the GPU once per allocator setting, each setting in a fresh process
(settings are read once, when CUDA starts), with the GPU's own counters after each phase and at
the end (``memory_stats``: peak and final reserved bytes, the OOM count). The run under the
first setting is the snapshot a reader brings; every other run is what the GPU did under that
what-if, which the doctor's answer is held to (exact means byte-equal, a range holds the GPU's
figure, an OOM count stated as certain is right).

Unlike :mod:`experiments.doctor.lab.cases`, these programs are written the way readers
write theirs, not for determinism:

* ``late_start``: the memory history starts after the model and its optimizer (with state) are
  on the GPU, and the doctor is asked about other settings;
* ``oom_carry_on``: a training loop under a cap tries growing batches, catches the
  out-of-memory error in the middle of a step (activations alive) and carries on with the next;
* ``compiled_expandable``: ``torch.compile(mode="reduce-overhead")`` training (CUDA-graph trees);
* ``paged_kv_mempool``: a paged KV cache whose pages live in a ``torch.cuda.MemPool``, under a
  cap: a page that does not fit preempts the longest request (its pages freed) and is retried;
* ``fsdp2``: ``torch.distributed.fsdp.fully_shard`` on one rank (NCCL, world size 1);
* ``handoff_skip``: a record_stream hand-over recorded with
  ``_record_memory_history(skip_actions=["free_requested"])`` (the example in torch's docstring).

torch is imported inside the functions: the module imports without a GPU.
Sources: ``torch/cuda/memory.py`` (``_record_memory_history``, ``_snapshot``, ``MemPool``,
``use_mem_pool``), ``torch/distributed/fsdp`` (``fully_shard``), ``torch/_inductor/cudagraph_trees.py``.
"""
from __future__ import annotations

import gc
import gzip
import os
import pickle
import random
import socket
from typing import Any, Callable

from ...core.registry import Param, experiment
from ...core.units import MiB
from ..reading.trace import compact_snapshot
from .recorder import Recorder, fresh_compile_caches, gpu_stats, sleep_ms, warm_streams

# case -> (memory cap in bytes or None, the settings it is recorded under; the first is the
# reader's run, the others the GPU's answers to the what-ifs)
HELDOUT: dict[str, tuple[int | None, tuple[str, ...]]] = {
    "late_start": (None, ("", "expandable_segments:True", "max_split_size_mb:64", "roundup_power2_divisions:4")),
    "oom_carry_on": (1280 * MiB, ("", "garbage_collection_threshold:0.6",
                                  "garbage_collection_threshold:0.8,max_split_size_mb:64",
                                  "garbage_collection_threshold:0.7,expandable_segments:True")),
    "compiled_expandable": (None, ("", "expandable_segments:True", "max_split_size_mb:64")),
    "paged_kv_mempool": (1536 * MiB, ("", "expandable_segments:True", "garbage_collection_threshold:0.6",
                                      "max_split_size_mb:40")),
    "fsdp2": (None, ("", "expandable_segments:True", "max_split_size_mb:64")),
    "handoff_skip": (None, ("", "expandable_segments:True", "max_split_size_mb:32")),
}
COMPILED = frozenset({"compiled_expandable"})
LATE = frozenset({"late_start"})                          # the program starts the history itself
SKIP_FREE_REQUESTED = frozenset({"handoff_skip"})
FRAMES = frozenset({"oom_carry_on", "paged_kv_mempool", "fsdp2"})


def _history(frames: bool, skip: bool = False) -> None:
    import torch

    kw: dict[str, Any] = {"skip_actions": ["free_requested"]} if skip else {}
    torch.cuda.memory._record_memory_history(enabled="all", context="all" if frames else None, stacks="python",
                                             max_entries=3_000_000, **kw)


# ----------------------------------------------------------------------------- the programs

def _h_late_start(rec: Recorder, frames: bool) -> None:
    """An MLP and AdamW with its state on the GPU (one step taken), then the history starts and
    the loop goes on with ragged batches; the cache is emptied at the end."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    rng = random.Random(101)
    model = nn.Sequential(*[m for _ in range(5) for m in (nn.Linear(1536, 1536), nn.GELU())],
                          nn.Linear(1536, 640)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(bs: int) -> None:
        x = torch.randn(bs, 1536, device="cuda")
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step(512)
    torch.cuda.synchronize()
    _history(frames)
    rec.mark("recording")
    for i in range(14):
        step(rng.choice((96, 384, 700, 1024, 1800, 2600)))
        if i % 5 == 4:
            rec.mark(f"step{i + 1}")
    del model, opt
    gc.collect()
    torch.cuda.empty_cache()
    rec.mark("end")


def _h_oom_carry_on(rec: Recorder, frames: bool) -> None:
    """Training under a 1.25 GiB cap with a batch-size schedule that overshoots: a step that
    runs out of memory (in the forward or the backward, activations alive) is dropped, the
    error caught, and the loop goes on with the next batch."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(2048, 2048), nn.GELU())]).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rec.mark("model")
    schedule = (1024, 3072, 6144, 14336, 2048, 9216, 20480, 4096, 12288, 768, 16384, 5120, 2560, 10240)
    failed = 0

    def step(bs: int) -> None:
        x = torch.randn(bs, 2048, device="cuda")
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for i, bs in enumerate(schedule):
        try:
            step(bs)
        except torch.OutOfMemoryError:
            failed += 1
            opt.zero_grad(set_to_none=True)     # grads of the layers the backward reached
        if i % 4 == 3:
            rec.mark(f"step{i + 1}")
    rec.phases[-1]["failed_steps"] = failed
    del model, opt
    gc.collect()
    rec.mark("end")


def _h_compiled_expandable(rec: Recorder, frames: bool) -> None:
    """A small residual MLP with LayerNorm trained under ``torch.compile(mode="reduce-overhead")``
    (CUDA-graph trees), AdamW, two batch sizes."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, d: int) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(d)
            self.up = nn.Linear(d, 4 * d)
            self.down = nn.Linear(4 * d, d)

        def forward(self, x: Any) -> Any:
            return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))

    torch.manual_seed(3)
    model = nn.Sequential(Block(384), Block(384), nn.Linear(384, 128)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    compiled = torch.compile(model, mode="reduce-overhead", dynamic=False)
    rec.mark("model")
    for bs in (96, 320):
        for _ in range(4):
            x = torch.randn(bs, 384, device="cuda")
            loss = compiled(x).float().square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            del x, loss
        torch.cuda.synchronize()
        rec.mark(f"batch{bs}")
    torch.cuda.empty_cache()
    rec.mark("end")


def _h_paged_kv_mempool(rec: Recorder, frames: bool) -> None:
    """A paged KV cache under a 1.5 GiB cap: requests arrive with a prompt (a prefill that makes
    large temporaries in the default pool), then decode one token a step; every 16 tokens a
    request takes a page (24 layers x K/V x 16 tokens x 8 heads x 128, bf16: 1.5 MiB) allocated
    in a ``torch.cuda.MemPool``; a page that does not fit preempts the request holding the most
    pages (its pages freed) and is asked for again; finished requests free their pages."""
    import torch

    rng = random.Random(131)
    pool = torch.cuda.MemPool()
    page_shape = (24, 2, 16, 8, 128)
    requests: dict[int, dict[str, Any]] = {}
    ooms = preempted = 0
    next_id = 0
    w = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    rec.mark("start")

    def new_page() -> Any:
        with torch.cuda.use_mem_pool(pool):
            return torch.empty(page_shape, dtype=torch.bfloat16, device="cuda")

    def take_page(rid: int) -> None:
        nonlocal ooms, preempted
        while True:
            try:
                requests[rid]["pages"].append(new_page())
                return
            except torch.OutOfMemoryError:
                ooms += 1
                victim = max(requests, key=lambda r: (len(requests[r]["pages"]), r))
                requests.pop(victim)
                preempted += 1
                if victim == rid:
                    return

    for step in range(260):
        if step % 6 == 0 and len(requests) < 24:
            prompt = rng.choice((200, 600, 1500, 3000))
            rid, next_id = next_id, next_id + 1
            requests[rid] = {"tokens": 0, "len": prompt + rng.choice((40, 120, 400)), "pages": []}
            act = torch.randn(prompt, 1024, device="cuda", dtype=torch.bfloat16)   # the prefill
            hidden = torch.relu(act @ w)
            del act, hidden
            for _ in range(-(-prompt // 16)):
                if rid in requests:
                    take_page(rid)
            if rid in requests:
                requests[rid]["tokens"] = prompt
        live = list(requests)
        if live:
            x = torch.randn(len(live), 1024, device="cuda", dtype=torch.bfloat16)
            logits = (x @ w).float()                                               # the decode step
            del x, logits
        for rid in live:
            if rid not in requests:
                continue
            r = requests[rid]
            r["tokens"] += 1
            if r["tokens"] >= r["len"]:
                requests.pop(rid)
            elif r["tokens"] % 16 == 0:
                take_page(rid)
        if step % 65 == 64:
            torch.cuda.synchronize()
            rec.mark(f"step{step + 1}")
    rec.phases[-1].update(preempted=preempted, caught_ooms=ooms)
    requests.clear()
    del pool
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    rec.mark("end")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _h_fsdp2(rec: Recorder, frames: bool) -> None:
    """FSDP2 (``fully_shard``) on one rank, NCCL with world size 1: four MLP blocks sharded one
    by one and the root, AdamW, ragged batches, then the process group is destroyed."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.fsdp import fully_shard

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(_free_port())
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    try:
        torch.manual_seed(5)
        rng = random.Random(151)
        blocks = [nn.Sequential(nn.Linear(1024, 3072), nn.GELU(), nn.Linear(3072, 1024)) for _ in range(4)]
        model = nn.Sequential(*blocks, nn.Linear(1024, 256)).cuda()
        for b in blocks:
            fully_shard(b)
        fully_shard(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        rec.mark("model")
        for i in range(10):
            x = torch.randn(rng.choice((128, 512, 1024, 2048)), 1024, device="cuda")
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            del x, loss
            if i % 4 == 3:
                torch.cuda.synchronize()
                rec.mark(f"step{i + 1}")
        del model, opt, blocks
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        rec.mark("end")
    finally:
        dist.destroy_process_group()


def _h_handoff_skip(rec: Recorder, frames: bool) -> None:
    """A side stream produces ragged batches that the default stream consumes; each is handed
    over with ``record_stream`` and dropped while the consumer is behind. The history skips
    ``free_requested``: only the frees' completions are in the trace."""
    import torch

    rng = random.Random(7)
    side, main = torch.cuda.Stream(), torch.cuda.current_stream()
    warm_streams(side, main)
    w = torch.randn(1024, 1024, device="cuda")
    rec.mark("weights")
    for window in range(8):
        for _ in range(6):
            rows = rng.choice((128, 256, 384, 640, 900)) * rng.randint(1, 3)
            with torch.cuda.stream(side):
                sleep_ms(0.2)
                batch = torch.empty(rows, 1024, device="cuda").normal_()
            main.wait_stream(side)
            batch.record_stream(main)
            sleep_ms(3.0)
            act = torch.relu(batch @ w)
            del batch
            total = act.sum()
            del act, total
        torch.cuda.synchronize()
        if window % 4 == 3:
            rec.mark(f"window{window + 1}")
    torch.cuda.empty_cache()
    rec.mark("end")


PROGRAMS: dict[str, Callable[[Recorder, bool], None]] = {
    "late_start": _h_late_start, "oom_carry_on": _h_oom_carry_on, "compiled_expandable": _h_compiled_expandable,
    "paged_kv_mempool": _h_paged_kv_mempool, "fsdp2": _h_fsdp2, "handoff_skip": _h_handoff_skip,
}


def heldout_worker(case: str, pickle_path: str | None = None) -> dict[str, Any]:
    """Fresh-process target: run one held-back program with the memory history on.

    Args:
        case: a key of :data:`HELDOUT`.
        pickle_path: also write the raw ``torch.cuda.memory._snapshot()`` there (gzip'd pickle).

    Returns:
        dict with snapshot (compact form plus device_total_bytes and memory_cap_bytes), phases
        (the GPU's counters and trace index after each phase), final (``memory_stats`` counters
        at the end) and device_total_bytes.

    Raises:
        ValueError: an unknown case.
    """
    if case not in PROGRAMS:
        raise ValueError(f"case must be one of {sorted(PROGRAMS)}, got {case!r}")
    if case in COMPILED:
        fresh_compile_caches()   # each run compiles from scratch
    import torch

    torch.cuda.init()
    total = int(torch.cuda.get_device_properties(0).total_memory)
    cap = HELDOUT[case][0]
    rec = Recorder()
    if cap is not None:
        torch.cuda.set_per_process_memory_fraction(cap / total)
    frames = case in FRAMES
    if case not in LATE:
        _history(frames, skip=case in SKIP_FREE_REQUESTED)
    PROGRAMS[case](rec, frames)
    torch.cuda.synchronize()
    raw = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    if pickle_path:
        tmp = pickle_path + ".tmp"
        with gzip.open(tmp, "wb", compresslevel=6) as f:
            pickle.dump(raw, f, protocol=4)
        os.replace(tmp, pickle_path)
    snap = compact_snapshot(raw)
    snap["device_total_bytes"] = total
    snap["memory_cap_bytes"] = int(cap / total * total) if cap is not None else None
    return {"snapshot": snap, "phases": rec.phases, "device_total_bytes": total, "final": gpu_stats()}


CASE_NAMES = tuple(HELDOUT)
_RUN = {"type": "object", "required": ["settings", "snapshot", "phases", "final"],
        "properties": {"settings": {"type": "string"},
                       "final": {"type": "object", "required": ["reserved_bytes.all.current", "reserved_bytes.all.peak",
                                                                "num_ooms"]},
                       "snapshot": {"type": "object", "required": ["format", "trace_z", "segments"]}}}


@experiment(
    "alloc.doctor_heldout",
    chapter=1,
    title="Held-back programs the doctor never saw, each under several settings on the GPU",
    params=[Param("case", "late_start", choices=CASE_NAMES, help="the program")],
    grid={"case": CASE_NAMES},
    data_schema={"type": "object", "required": ["case", "runs"],
                 "properties": {"case": {"type": "string"}, "cap_bytes": {"type": ["integer", "null"]},
                                "runs": {"type": "array", "minItems": 3, "items": _RUN}}},
    own_budget=True,   # 6 programs, 3-4 fresh processes each at once, ~2 min: record --experiment alloc.doctor_heldout
)
def doctor_heldout(case: str = "late_start") -> dict[str, Any]:
    """Run ``case`` once per setting of ``HELDOUT[case]``, each in a fresh process, all at once.

    The held-back oracles of the allocator doctor (tests/test_doctor_heldout.py): the run under
    the first setting is what a reader would have recorded, every other run is what the GPU did
    under that what-if. Recorded alone (``record --experiment alloc.doctor_heldout``).

    Returns:
        case; cap_bytes (the memory cap, or None); runs: one dict per setting with settings,
        elapsed_s, snapshot (compact form with device_total_bytes and memory_cap_bytes),
        phases (the GPU's counters and trace index after each phase) and final
        (``memory_stats`` counters at the end).

    Raises:
        ValueError: an unknown case. FreshProcessError: a run that did not finish.
    """
    from concurrent.futures import ThreadPoolExecutor

    from ...core.device import require_cuda
    from ...core.runner import run_fresh

    require_cuda("alloc.doctor_heldout")
    if case not in HELDOUT:
        raise ValueError(f"case must be one of {sorted(HELDOUT)}, got {case!r}")

    def one(setting: str) -> dict[str, Any]:
        r = run_fresh("experiments.doctor.lab.heldout:heldout_worker", {"case": case},
                      alloc_conf_settings=setting or None, timeout_s=300)
        return {"settings": setting, "elapsed_s": round(r.elapsed_s, 1), **r.unwrap()}

    settings = HELDOUT[case][1]
    with ThreadPoolExecutor(len(settings)) as pool:
        runs = list(pool.map(one, settings))
    return {"case": case, "cap_bytes": HELDOUT[case][0], "runs": runs}


def record_all(out: str, workers: int = 8, cases: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Run every (case, setting) of :data:`HELDOUT` in fresh processes, ``workers`` at a time,
    and write one gzip'd JSON per case to ``out`` (a folder); the default runs' raw snapshots
    go there too. Returns {case: [elapsed seconds or the error of each setting]}."""
    import json
    from concurrent.futures import ThreadPoolExecutor

    from ...core.runner import run_fresh

    os.makedirs(out, exist_ok=True)
    jobs = [(c, s) for c in (cases or tuple(HELDOUT)) for s in HELDOUT[c][1]]

    def one(job: tuple[str, str]) -> tuple[str, str, Any]:
        case, setting = job
        r = run_fresh("experiments.doctor.lab.heldout:heldout_worker", {"case": case, "pickle_path": None},
                      alloc_conf_settings=setting or None, timeout_s=300)
        if not r.ok:
            return case, setting, {"error": f"{r.error_kind}: {r.message}", "stderr": r.stderr_tail}
        return case, setting, {"settings": setting, "elapsed_s": round(r.elapsed_s, 1), **r.value}

    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(one, jobs))
    summary: dict[str, Any] = {}
    for case in dict.fromkeys(c for c, _, _ in results):
        runs = [v for c, _, v in results if c == case]
        with gzip.open(os.path.join(out, f"{case}.json.gz"), "wt") as f:
            json.dump({"case": case, "cap_bytes": HELDOUT[case][0], "runs": runs}, f)
        summary[case] = [r.get("elapsed_s", r.get("error")) for r in runs]
    return summary


if __name__ == "__main__":   # python -m experiments.doctor.lab.heldout OUT [case ...]
    import json
    import sys

    print(json.dumps(record_all(sys.argv[1], cases=tuple(sys.argv[2:]) or None), indent=1))
