"""Real programs recorded on a GPU to hold the allocator doctor to what the GPU did.

The doctor's what-ifs claim: "under setting S, your run would have reserved this much, and
these requests would (not) have failed". The only honest check is to run the same program
under S on the GPU and compare. Each case below is a small but real program of a class
readers record (a side-stream producer handing batches over with ``record_stream``, a KV
cache grown on two streams, training under a memory cap with requests that may fail, a
loader under a cap, CUDA graphs captured into one shared pool, ``torch.compile`` with CUDA
graphs, a ``torch.cuda.MemPool`` used for a phase, a long eager loop), with seven more of
our own in :mod:`experiments.allocator.doctor_programs` (FSDP-style prefetch whose buffers
fill expandable pages exactly, two streams under a cap, garbage collection by age, graph pools
of every kind, two MemPools at once, compiled inference); each runs in a fresh process once
per setting in :data:`CASES`. The experiment ``alloc.doctor_cases`` records them all (on
demand, not in the wheel): they are the doctor's test oracles (tests/test_doctor_cases.py).

The programs are written so that the GPU's run is a function of the setting alone:

* work on the streams is long (calibrated ``torch.cuda._sleep``) against the host's issue
  time, and the host synchronizes at fixed points, so a ``record_stream`` free completes at
  the same point of the program in every run;
* a request that may fail under a cap is a probe: it is allocated and freed at once, and an
  out-of-memory error is caught and the program goes on, so what the program does next does
  not depend on whether the probe fitted.

torch is imported inside the functions: the module imports without a GPU.
Sources: ``torch/cuda/memory.py`` (``_record_memory_history``, ``_snapshot``, ``MemPool``,
``use_mem_pool``), ``torch/cuda/graphs.py`` (``graph``, ``graph_pool_handle``),
``torch/_inductor/cudagraph_trees.py`` (``mode="reduce-overhead"``).
"""
from __future__ import annotations

import gc
import gzip
import os
import pickle
import random
from pathlib import Path
from typing import Any, Callable

from ..core.registry import Param, experiment
from . import doctor_programs
from .doctor_gpu import _Recorder, _stats, compact_snapshot
from .doctor_programs import _empty, _probe, _sleep_ms, _start_history

MiB = 1024**2
GiB = 1024**3

# case -> (memory cap in bytes or None, settings it is recorded under). The first setting is
# always the defaults: that run is what a reader would have recorded; the others are what the
# GPU itself did under each what-if.
CASES: dict[str, tuple[int | None, tuple[str, ...]]] = {
    "handoff": (None, ("", "expandable_segments:True", "max_split_size_mb:32",
                       "roundup_power2_divisions:[256:2,>:4]")),
    "kv_two_streams": (None, ("", "expandable_segments:True", "max_split_size_mb:64",
                              "expandable_segments:True,max_split_size_mb:64",
                              "roundup_power2_divisions:[128:1,256:2,512:4,>:8]")),
    "capped_training": (1536 * MiB, ("", "expandable_segments:True", "garbage_collection_threshold:0.6",
                                     "garbage_collection_threshold:0.8,max_split_size_mb:64",
                                     "expandable_segments:True,garbage_collection_threshold:0.7")),
    "loader_capped": (768 * MiB, ("", "expandable_segments:True", "garbage_collection_threshold:0.5",
                                  "max_split_size_mb:40")),
    "graph_shared_pool": (None, ("", "expandable_segments:True", "max_split_size_mb:64")),
    "compiled_graphs": (None, ("", "expandable_segments:True")),
    "mempool_phase": (None, ("", "expandable_segments:True", "max_split_size_mb:64")),
    "mempool_capped": (2 * GiB, ("", "expandable_segments:True", "garbage_collection_threshold:0.6")),
    "eager_long": (None, ("", "expandable_segments:True", "max_split_size_mb:64")),
    # Cases of our own for the classes of issue 17 (other streams, caps, pools, settings, sizes):
    "prefetch_pages": (None, ("", "expandable_segments:True", "max_split_size_mb:48",
                              "expandable_segments:True,roundup_power2_divisions:4")),
    "cap_two_streams": (1024 * MiB, ("", "expandable_segments:True", "max_split_size_mb:48",
                                     "expandable_segments:True,garbage_collection_threshold:0.6")),
    "gc_ages": (1280 * MiB, ("", "garbage_collection_threshold:0.5", "garbage_collection_threshold:0.8",
                             "garbage_collection_threshold:0.6,max_split_size_mb:40",
                             "garbage_collection_threshold:0.7,roundup_power2_divisions:2")),
    "graph_pools_mixed": (None, ("", "expandable_segments:True", "max_split_size_mb:48")),
    "mempools_two": (None, ("", "expandable_segments:True", "max_split_size_mb:64")),
    "mempools_two_capped": (1536 * MiB, ("", "expandable_segments:True", "garbage_collection_threshold:0.6")),
    "compiled_infer": (None, ("", "expandable_segments:True", "max_split_size_mb:64")),
}
COMPILED = frozenset({"compiled_graphs", "compiled_infer"})   # torch.compile programs
# Cases whose snapshots keep Python stack frames (as readers' usually do): the OOM explanation
# names the frames of the blocks that pinned the memory.
FRAMES = frozenset({"capped_training", "loader_capped", "mempool_capped", "handoff", "cap_two_streams",
                    "gc_ages", "mempools_two_capped"})


# ----------------------------------------------------------------------------- the programs

def _c_handoff(rec: _Recorder) -> None:
    """Chapter 2's pattern: a side stream produces ragged batches, the default stream consumes
    them; each batch is handed over with ``record_stream`` and dropped while the consumer is
    still behind (run-ahead), then the host waits at the end of each window."""
    import torch

    rng = random.Random(5)
    side, main = torch.cuda.Stream(), torch.cuda.current_stream()
    w = torch.randn(1024, 1024, device="cuda")
    rec.mark("weights")
    for window in range(12):
        for _ in range(6):
            rows = rng.choice((96, 160, 224, 288, 352, 512, 700)) * rng.randint(1, 4)
            with torch.cuda.stream(side):
                _sleep_ms(0.2)
                batch = torch.empty(rows, 1024, device="cuda").normal_()
            main.wait_stream(side)
            batch.record_stream(main)
            _sleep_ms(3.0)                     # the consumer is slow: the host runs ahead
            act = torch.relu(batch @ w)
            del batch
            total = act.sum()
            del act, total
        torch.cuda.synchronize()
        if window % 4 == 3:
            rec.mark(f"window{window + 1}")
    torch.cuda.empty_cache()
    rec.mark("end")


def _c_kv_two_streams(rec: _Recorder) -> None:
    """Two request streams each grow a per-layer KV cache by concatenation; stream 1 also
    reads stream 0's cache (a shared prefix), so stream 0's old caches are handed over with
    ``record_stream`` and free only when stream 1 gets there. Requests end and restart."""
    import torch

    rng = random.Random(17)
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    layers, width = 4, 2 * 8 * 128
    caches: list[list[Any]] = [[None] * layers for _ in streams]
    rec.mark("start")
    for step in range(48):
        for i, st in enumerate(streams):
            with torch.cuda.stream(st):
                _sleep_ms(0.5)
                tokens = rng.choice((1, 1, 1, 16, 64)) if step % 12 else rng.choice((128, 512, 1000))
                for layer in range(layers):
                    new = torch.empty(tokens, width, dtype=torch.bfloat16, device="cuda").normal_()
                    old = caches[i][layer]
                    caches[i][layer] = new if old is None else torch.cat([old, new])
                    del old, new
        with torch.cuda.stream(streams[1]):
            _sleep_ms(1.5)
            for layer in range(layers):
                prefix = caches[0][layer]
                prefix.record_stream(streams[1])
                _ = prefix[:1].float().sum()
                del prefix, _
        if step % 12 == 11:
            torch.cuda.synchronize()
            caches[step // 12 % 2] = [None] * layers     # a request ends: its cache goes
            rec.mark(f"step{step + 1}")
    torch.cuda.synchronize()
    caches.clear()
    torch.cuda.empty_cache()
    rec.mark("end")


def _c_capped_training(rec: _Recorder) -> None:
    """An MLP trained with AdamW on ragged batches under a memory cap; after each step the
    program asks for a large workspace (a probe) that fits or not depending on the setting."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    rng = random.Random(23)
    model = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(2048, 2048), nn.GELU())]).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rec.mark("model")
    for step in range(20):
        bs = rng.choice((256, 384, 640, 1024, 1536, 2048, 3072))
        x = torch.randn(bs, 2048, device="cuda")
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del x, loss
        _probe(rng.choice((300, 420, 560, 700, 820)) * MiB)
        if step % 5 == 4:
            rec.mark(f"step{step + 1}")
    del model, opt
    gc.collect()
    for n in (900, 1100, 1300, 1450):
        _probe(n * MiB)
    rec.mark("end")


def _c_loader_capped(rec: _Recorder) -> None:
    """A data loader under a memory cap: pinned host images copied on a side stream
    (``non_blocking``), handed to the default stream with ``record_stream``, decoded into
    ragged crops; a probe for a large buffer after each window."""
    import torch

    rng = random.Random(31)
    side, main = torch.cuda.Stream(), torch.cuda.current_stream()
    host = [torch.empty(n * MiB, dtype=torch.uint8).pin_memory() for n in (6, 10, 14, 24)]
    rec.mark("pinned")
    for window in range(8):
        for _ in range(8):
            src = rng.choice(host)
            with torch.cuda.stream(side):
                img = src.to("cuda", non_blocking=True)
            main.wait_stream(side)
            img.record_stream(main)
            _sleep_ms(2.0)
            crop = img[: rng.randint(1, img.numel())].float()
            del img
            feat = crop * 2
            del crop, feat
        torch.cuda.synchronize()
        _probe(rng.choice((180, 260, 340, 420, 500)) * MiB)
        if window % 2 == 1:
            rec.mark(f"window{window + 1}")
    torch.cuda.empty_cache()
    rec.mark("end")


def _c_graph_shared_pool(rec: _Recorder) -> None:
    """Inference graphs captured by hand into one shared pool at growing batch sizes, replayed;
    then the small batches' graphs are deleted and the cache emptied."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).cuda().eval()
    pool = torch.cuda.graph_pool_handle()
    graphs: dict[int, tuple[Any, Any, Any]] = {}
    rec.mark("model")
    with torch.no_grad():
        for bs in (8, 32, 96, 256, 640):
            static_in = torch.randn(bs, 1024, device="cuda")
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(2):
                    model(static_in)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                out = model(static_in)
            graphs[bs] = (g, static_in, out)
            g.replay()
            rec.mark(f"captured{bs}")
        for bs in (8, 32):
            del graphs[bs]
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        rec.mark("small_deleted")
        for g, _, _ in graphs.values():
            g.replay()
        x = torch.randn(300, 1024, device="cuda")
        y = model(x)
        del x, y
        rec.mark("eager_after")
        graphs.clear()
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    rec.mark("end")


def _c_compiled_graphs(rec: _Recorder) -> None:
    """A small model under ``torch.compile(mode="reduce-overhead")`` (CUDA-graph trees),
    forward and backward, at two batch sizes."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    compiled = torch.compile(model, mode="reduce-overhead", dynamic=False)
    rec.mark("model")
    for bs in (64, 192):
        for _ in range(4):
            x = torch.randn(bs, 512, device="cuda")
            loss = compiled(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            del x, loss
        torch.cuda.synchronize()
        rec.mark(f"batch{bs}")
    torch.cuda.empty_cache()
    rec.mark("end")


def _mempool_program(rec: _Recorder, probes: tuple[int, ...]) -> None:
    import torch

    rng = random.Random(41)
    keep = [_empty(n * MiB) for n in (64, 96, 128)]
    rec.mark("base")
    pool = torch.cuda.MemPool()
    phase: list[Any] = []
    with torch.cuda.use_mem_pool(pool):
        for _ in range(60):
            if phase and rng.random() < 0.35:
                phase.pop(rng.randrange(len(phase)))
            phase.append(_empty(rng.choice((1, 3, 7, 24, 40, 90)) * MiB + rng.randrange(4096)))
    rec.mark("phase")
    outside = [_empty(n * MiB) for n in (30, 50)]   # default pool while the private one lives
    phase.clear()
    del pool
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    rec.mark("pool_deleted")
    after = [_empty(n * MiB) for n in (2, 12, 48, 160, 12, 48)]
    for n in probes:
        _probe(n * MiB)
    rec.mark("after")
    del keep, outside, after
    torch.cuda.empty_cache()
    rec.mark("end")


def _c_mempool_phase(rec: _Recorder) -> None:
    """A ``torch.cuda.MemPool`` used for one phase, then deleted and the cache emptied."""
    _mempool_program(rec, (512, 2048))


def _c_mempool_capped(rec: _Recorder) -> None:
    """The MemPool program under a 2 GiB cap, with probes near what is left after the phase."""
    _mempool_program(rec, (600, 900, 1100, 1300))


def _c_eager_long(rec: _Recorder) -> None:
    """A long eager training loop (hundreds of thousands of trace events): a small transformer,
    AdamW, ragged sequence lengths, gradient clipping, bf16 autocast."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    rng = random.Random(3)
    layer = nn.TransformerEncoderLayer(256, nhead=4, dim_feedforward=1024, batch_first=True, dropout=0.0)
    model = nn.Sequential(nn.TransformerEncoder(layer, num_layers=3, enable_nested_tensor=False),
                          nn.Linear(256, 512)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rec.mark("model")
    # Stop after a fixed number of allocations (about three trace events each: alloc,
    # free_requested, free_completed), the same in every setting.
    target = int(os.environ.get("MEMLAB_EAGER_ALLOCS", "150000"))
    start = torch.cuda.memory_stats()["allocation.all.allocated"]
    step = 0
    while torch.cuda.memory_stats()["allocation.all.allocated"] - start < target:
        seq = rng.choice((48, 64, 80, 96, 128))
        x = torch.randn(16, seq, 256, device="cuda")
        y = torch.randint(0, 512, (16, seq), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(x)
            loss = nn.functional.cross_entropy(out.float().reshape(-1, 512), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        del x, y, out, loss
        step += 1
        if step % 150 == 0:
            rec.mark(f"step{step}")
    torch.cuda.empty_cache()
    rec.mark("end")


PROGRAMS: dict[str, Callable[[_Recorder], None]] = {
    "handoff": _c_handoff, "kv_two_streams": _c_kv_two_streams, "capped_training": _c_capped_training,
    "loader_capped": _c_loader_capped, "graph_shared_pool": _c_graph_shared_pool,
    "compiled_graphs": _c_compiled_graphs, "mempool_phase": _c_mempool_phase,
    "mempool_capped": _c_mempool_capped, "eager_long": _c_eager_long,
    **doctor_programs.PROGRAMS,
}


def case_worker(case: str, frames: bool = False, pickle_path: str | None = None) -> dict[str, Any]:
    """Fresh-process target: run one case with the memory history on; return its snapshot.

    Args:
        case: a key of :data:`CASES`.
        frames: record Python stack frames (``context="all"``) as readers' snapshots have.
        pickle_path: also write the raw ``torch.cuda.memory._snapshot()`` there, gzip'd
            pickle (what ``_dump_snapshot`` writes, compressed).

    Returns:
        dict with snapshot (:func:`~experiments.allocator.doctor_gpu.compact_snapshot` plus
        device_total_bytes and memory_cap_bytes), phases (the GPU's counters after each
        phase), final (counters at the end) and device_total_bytes.

    Raises:
        ValueError: an unknown case.
    """
    if case not in PROGRAMS:
        raise ValueError(f"case must be one of {sorted(PROGRAMS)}, got {case!r}")
    if case in COMPILED:
        # Each run compiles from scratch: a warm Inductor or Triton cache (another setting's
        # process of the same recording) skips work that allocates, and the runs would differ.
        import tempfile

        fresh = tempfile.mkdtemp(prefix="memlab-inductor-")
        os.environ.update(TORCHINDUCTOR_CACHE_DIR=fresh, TRITON_CACHE_DIR=os.path.join(fresh, "triton"),
                          TORCHINDUCTOR_FX_GRAPH_CACHE="0", TORCHINDUCTOR_AUTOGRAD_CACHE="0")
    import torch

    torch.cuda.init()
    total = int(torch.cuda.get_device_properties(0).total_memory)
    cap = CASES[case][0]
    rec = _Recorder()
    if cap is not None:
        torch.cuda.set_per_process_memory_fraction(cap / total)
    _start_history(frames)
    PROGRAMS[case](rec)
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
    return {"snapshot": snap, "phases": rec.phases, "device_total_bytes": total, "final": _stats()}


# ----------------------------------------------------------------------------- the experiment

CASE_NAMES = tuple(CASES)
PARALLEL = 5            # fresh processes at once per case (the most settings a case has)


def pickle_dir() -> Path | None:
    """Where the raw snapshots of the default runs go when the experiment records
    (``$MEMLAB_DOCTOR_PICKLES``, else ``benchmarks/data/doctor_cases/`` of a source checkout,
    else nowhere): the benchmark's input and readers' pickles with stack frames."""
    env = os.environ.get("MEMLAB_DOCTOR_PICKLES")
    if env:
        return Path(env)
    bench = Path(__file__).resolve().parents[2] / "benchmarks"
    return bench / "data" / "doctor_cases" if bench.is_dir() else None


_CASE_RUN = {"type": "object", "required": ["settings", "snapshot", "phases", "final"],
             "properties": {"settings": {"type": "string"},
                            "phases": {"type": "array", "minItems": 1, "items": {
                                "type": "object", "required": ["phase", "trace_index", "allocated_bytes.all.current",
                                                               "reserved_bytes.all.current"]}},
                            "final": {"type": "object", "required": ["reserved_bytes.all.current",
                                                                     "reserved_bytes.all.peak", "num_ooms"]},
                            "snapshot": {"type": "object", "required": ["format", "trace_z", "segments"]}}}


@experiment(
    "alloc.doctor_cases",
    chapter=1,
    title="Real programs of every class the doctor must follow, each under several settings on the GPU",
    params=[Param("case", "handoff", choices=CASE_NAMES, help="the program")],
    grid={"case": CASE_NAMES},
    data_schema={"type": "object", "required": ["case", "runs"],
                 "properties": {"case": {"type": "string"}, "cap_bytes": {"type": ["integer", "null"]},
                                "runs": {"type": "array", "minItems": 2, "items": _CASE_RUN}}},
    own_budget=True,   # 16 programs, 2-5 fresh processes each, ~4 min: record --experiment alloc.doctor_cases
)
def doctor_cases(case: str = "handoff") -> dict[str, Any]:
    """Run ``case`` once per setting of ``CASES[case]``, each in a fresh process, several at once.

    The test oracles of the allocator doctor (tests/test_doctor_cases.py): the run under the
    defaults is what a reader would have recorded, every other run is what the GPU did under
    that what-if. Recorded alone (``record --experiment alloc.doctor_cases``; about 4 minutes on
    the H200), never in the chapter's default recording; not shipped in the wheel.

    Returns:
        case; cap_bytes (the memory cap, or None); runs: one dict per setting with settings
        (PYTORCH_CUDA_ALLOC_CONF string), elapsed_s, snapshot (compact form with
        device_total_bytes and memory_cap_bytes), phases (the GPU's counters and the trace
        index after each phase), final (memory_stats counters at the end: bytes and counts)
        and device_total_bytes. The default run's raw ``_snapshot()`` is also written, gzip'd,
        to :func:`pickle_dir` when there is one.

    Raises:
        ValueError: an unknown case. FreshProcessError: a run that did not finish.
    """
    from concurrent.futures import ThreadPoolExecutor

    from ..core.device import require_cuda
    from ..core.runner import run_fresh

    require_cuda("alloc.doctor_cases")
    if case not in CASES:
        raise ValueError(f"case must be one of {sorted(CASES)}, got {case!r}")
    folder = pickle_dir()
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)

    def one(setting: str) -> dict[str, Any]:
        path = str(folder / f"{case}.pickle.gz") if folder is not None and not setting else None
        r = run_fresh("experiments.allocator.doctor_cases:case_worker",
                      {"case": case, "frames": case in FRAMES, "pickle_path": path},
                      alloc_conf_settings=setting or None, timeout_s=480)
        return {"settings": setting, "elapsed_s": round(r.elapsed_s, 1), **r.unwrap()}

    settings = CASES[case][1]
    with ThreadPoolExecutor(min(PARALLEL, len(settings))) as pool:
        runs = list(pool.map(one, settings))
    return {"case": case, "cap_bytes": CASES[case][0], "runs": runs}
