"""The doctor's test oracles: real programs run on a GPU under several allocator settings, so
that its what-ifs can be held to what the GPU did.

The doctor's what-ifs claim: "under setting S, your run would have reserved this much, and
these requests would (not) have failed". The only honest check is to run the same program
under S on the GPU and compare. Each case of :data:`CASES` is a small but real program
(:mod:`experiments.doctor.lab.programs`, which says what each does and the rules they follow
so that the GPU's run is a function of the setting alone), with the memory cap it runs under
and the settings it is recorded under; each runs in a fresh process once per setting
(:func:`case_worker`). The experiment ``alloc.doctor_cases`` records them all (on demand, not
in the wheel): the CPU tests replay each run and compare (tests/test_doctor_cases.py).

torch is imported inside the functions: the module imports without a GPU.
"""
from __future__ import annotations

import gzip
import os
import pickle
from pathlib import Path
from typing import Any

from ...core.files import write_atomic
from ...core.registry import Param, experiment
from ...core.units import GiB, MiB
from ..reading.trace import compact_snapshot
from .programs import PROGRAMS
from .recorder import Recorder, fresh_compile_caches, gpu_stats, start_history

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
    # Cases of our own, one for each kind of snapshot the ones above leave out (other streams, caps,
    # pools, settings, sizes):
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


def case_worker(case: str, frames: bool = False, pickle_path: str | None = None) -> dict[str, Any]:
    """Fresh-process target: run one case with the memory history on; return its snapshot.

    Args:
        case: a key of :data:`CASES`.
        frames: record Python stack frames (``context="all"``) as readers' snapshots have.
        pickle_path: also write the raw ``torch.cuda.memory._snapshot()`` there, gzip'd
            pickle (what ``_dump_snapshot`` writes, compressed).

    Returns:
        dict with snapshot (:func:`~experiments.doctor.reading.trace.compact_snapshot` plus
        device_total_bytes and memory_cap_bytes), phases (the GPU's counters after each
        phase), final (counters at the end) and device_total_bytes.

    Raises:
        ValueError: an unknown case.
    """
    if case not in PROGRAMS:
        raise ValueError(f"case must be one of {sorted(PROGRAMS)}, got {case!r}")
    if case in COMPILED:
        fresh_compile_caches()   # each run compiles from scratch
    import torch

    from ...core.device import cap_memory

    torch.cuda.init()
    total = int(torch.cuda.get_device_properties(0).total_memory)
    cap = CASES[case][0]
    rec = Recorder()
    enforced = cap_memory(cap) if cap is not None else None
    start_history(max_entries=3_000_000, frames=frames)
    PROGRAMS[case](rec)
    torch.cuda.synchronize()
    raw = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    if pickle_path:
        write_atomic(pickle_path, gzip.compress(pickle.dumps(raw, protocol=4), compresslevel=6))
    snap = compact_snapshot(raw)
    snap["device_total_bytes"] = total
    snap["memory_cap_bytes"] = enforced
    return {"snapshot": snap, "phases": rec.phases, "device_total_bytes": total, "final": gpu_stats()}


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
    bench = Path(__file__).resolve().parents[3] / "benchmarks"
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

    from ...core.device import require_cuda
    from ...core.runner import run_fresh

    require_cuda("alloc.doctor_cases")
    if case not in CASES:
        raise ValueError(f"case must be one of {sorted(CASES)}, got {case!r}")
    folder = pickle_dir()
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)

    def one(setting: str) -> dict[str, Any]:
        path = str(folder / f"{case}.pickle.gz") if folder is not None and not setting else None
        r = run_fresh("experiments.doctor.lab.cases:case_worker",
                      {"case": case, "frames": case in FRAMES, "pickle_path": path},
                      alloc_conf_settings=setting or None, timeout_s=480)
        return {"settings": setting, "elapsed_s": round(r.elapsed_s, 1), **r.unwrap()}

    settings = CASES[case][1]
    with ThreadPoolExecutor(min(PARALLEL, len(settings))) as pool:
        runs = list(pool.map(one, settings))
    return {"case": case, "cap_bytes": CASES[case][0], "runs": runs}
