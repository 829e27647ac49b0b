"""``--suggest``: replay a grid of allocator settings and rank them.

The grid (:func:`grid`): the defaults; ``expandable_segments:True``; ``max_split_size_mb`` at
32 ... 1024 MiB, below the largest segment the recorded run made (a limit above every segment
changes nothing); ``roundup_power2_divisions`` 2, 4, 8 and 16; with a memory cap (the
recorded one or ``--cap``), ``garbage_collection_threshold`` 0.5 ... 0.9 where the threshold
is below the recorded peak (above it the collector never runs); then combinations of the best
of each family: expandable segments with the best rounding and, under a cap, the best
threshold; the best split size with the best rounding and threshold.

Each setting runs the replay's requests (:func:`experiments.doctor.whatif.what_if`); the
ranking is by out-of-memory events, then peak reserved bytes, then final reserved bytes, then
the fewest options. On Linux the runs are spread over the machine's cores in forked processes
(they share the replay's requests without copying them); elsewhere, and in a browser, they
run one after the other with the same results.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Callable, Sequence

from .replay import Run
from .rules import MiB
from .whatif import _config, what_if

SPLIT_MB = (32, 64, 128, 256, 512, 1024)
ROUNDUP = (2, 4, 8, 16)
GC_THRESHOLDS = (0.5, 0.6, 0.7, 0.8, 0.9)
EXPANDABLE = "expandable_segments:True"


def _largest_segment(base: Run) -> int:
    sizes = [size for action, _, size in base.segment_log if action == "segment_alloc"]
    sizes += [s["total_size"] for s in base.final_segments]
    return max(sizes, default=0)


def singles(base: Run, cap_bytes: int | None) -> list[str]:
    """The grid's single settings for this run (see the module docstring)."""
    out = ["", EXPANDABLE]
    largest = _largest_segment(base)
    out += [f"max_split_size_mb:{mb}" for mb in SPLIT_MB if mb * MiB < largest]
    out += [f"roundup_power2_divisions:{d}" for d in ROUNDUP]
    if cap_bytes:
        out += [f"garbage_collection_threshold:{t}" for t in GC_THRESHOLDS if t * cap_bytes < base.peak_reserved_bytes]
    return out


def combinations(ranked: Sequence[tuple[str, Run]], cap_bytes: int | None) -> list[str]:
    """Pairs and triples of the best setting of each family (from ranked singles)."""
    def best(prefix: str) -> str | None:
        return next((s for s, _ in ranked if s.startswith(prefix)), None)

    split, roundup = best("max_split_size_mb"), best("roundup_power2_divisions")
    gc = best("garbage_collection_threshold") if cap_bytes else None
    combos = []
    for parts in ([EXPANDABLE, roundup], [EXPANDABLE, gc], [split, roundup], [split, gc], [split, roundup, gc],
                  [EXPANDABLE, roundup, gc]):
        if all(parts):
            combos.append(",".join(parts))
    return list(dict.fromkeys(combos))


def rank_key(settings: str, run: Run) -> tuple:
    """Fewest OOMs, then lowest peak reserved, then lowest final reserved, then fewest options."""
    return (run.oom_events, run.peak_reserved_bytes, run.final_reserved_bytes,
            0 if not settings else settings.count(",") + 1)


# ----------------------------------------------------------------------------- running many what-ifs

_JOB: dict[str, Any] = {}


def _one(settings: str) -> tuple[str, dict[str, Any]]:
    job = _JOB
    run, _ = what_if(job["base"], _config(settings), settings, cap_bytes=job["cap"], total_memory=job["total"],
                     series=False)
    return settings, {k: getattr(run, k) for k in _FIELDS}


_FIELDS = ("events_replayed", "final_reserved_bytes", "final_allocated_bytes", "peak_reserved_bytes",
           "peak_allocated_bytes", "peak_index", "oom_events", "oom_requests")


def _workers(n_jobs: int, n_requests: int) -> int:
    if sys.platform != "linux" or n_jobs < 2 or n_requests < 20_000:
        return 1        # forking costs more than a small replay; fork is Linux's only safe default
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(cores, n_jobs))


def run_many(base: Run, settings: Sequence[str], *, cap_bytes: int | None, total_memory: int,
             workers: int | None = None) -> list[Run]:
    """The what-ifs of ``settings`` (validated first: an InputError names a bad one), in order.

    Runs them in forked worker processes when that helps (Linux, a long trace, two or more
    settings and cores); the Runs returned carry the figures, not the per-request series.
    """
    for s in settings:
        _config(s)
    n = workers if workers is not None else _workers(len(settings), len(base.requests))
    _JOB.update(base=base, cap=cap_bytes, total=total_memory)
    try:
        if n <= 1:
            results = [_one(s) for s in settings]
        else:
            results = _parallel(_one, list(settings), n)
    finally:
        _JOB.clear()
    out = []
    for s, fields in results:
        run = Run(s)
        for k, v in fields.items():
            setattr(run, k, v)
        out.append(run)
    return out


def _parallel(fn: Callable[[str], Any], items: list[str], workers: int) -> list[Any]:
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    # longest first would be better but all take about as long: plain order, chunks of one
    with ctx.Pool(workers) as pool:
        return pool.map(fn, items, chunksize=1)


# ----------------------------------------------------------------------------- the suggestion

def suggest(base: Run, recorded: str, *, cap_bytes: int | None, total_memory: int,
            workers: int | None = None) -> dict[str, Any]:
    """Rank the grid for the replay ``base`` (recorded under ``recorded``).

    Returns:
        dict with ``rows`` (every setting tried, best first: settings, peak_reserved_bytes,
        final_reserved_bytes, peak_allocated_bytes, oom_events, and saved_bytes against the
        recorded run's peak), ``recorded`` (the recorded run's figures), ``best`` (the first
        row, or None when nothing beats the recorded run), ``alloc_conf`` (the line to use:
        ``PYTORCH_CUDA_ALLOC_CONF=...``, or None), ``cap_bytes`` and ``runs`` (settings ->
        Run, for the OOM explanation).
    """
    first = singles(base, cap_bytes)
    runs = dict(zip(first, run_many(base, first, cap_bytes=cap_bytes, total_memory=total_memory, workers=workers)))
    ranked = sorted(runs.items(), key=lambda kv: rank_key(*kv))
    more = [c for c in combinations(ranked, cap_bytes) if c not in runs]
    if more:
        runs.update(zip(more, run_many(base, more, cap_bytes=cap_bytes, total_memory=total_memory, workers=workers)))
    ranked = sorted(runs.items(), key=lambda kv: rank_key(*kv))
    rec = {"settings": recorded, "peak_reserved_bytes": base.peak_reserved_bytes,
           "final_reserved_bytes": base.final_reserved_bytes, "oom_events": base.oom_events}
    rows = [{"settings": s, "peak_reserved_bytes": r.peak_reserved_bytes, "final_reserved_bytes": r.final_reserved_bytes,
             "peak_allocated_bytes": r.peak_allocated_bytes, "oom_events": r.oom_events,
             "saved_bytes": base.peak_reserved_bytes - r.peak_reserved_bytes} for s, r in ranked]
    top = rows[0] if rows else None
    better = top is not None and top["settings"] != recorded and (
        top["oom_events"] < base.oom_events
        or (top["oom_events"] == base.oom_events and top["peak_reserved_bytes"] < base.peak_reserved_bytes))
    return {"rows": rows, "recorded": rec, "best": top if better else None,
            "alloc_conf": f"PYTORCH_CUDA_ALLOC_CONF={top['settings']}" if better and top["settings"] else
            ("PYTORCH_CUDA_ALLOC_CONF= (unset: the defaults)" if better else None),
            "cap_bytes": cap_bytes, "runs": dict(ranked)}


__all__ = ["combinations", "rank_key", "run_many", "singles", "suggest"]
