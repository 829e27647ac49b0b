"""``--suggest``: replay a grid of allocator settings and rank them.

The grid (:func:`singles`, then :func:`combinations`): the defaults; ``expandable_segments:True``; ``max_split_size_mb`` at
32 ... 1024 MiB, below the largest segment the recorded run made (a limit above every segment
changes nothing); ``roundup_power2_divisions`` 2, 4, 8 and 16; with a memory cap (the
recorded one or ``--cap``), ``garbage_collection_threshold`` 0.5 ... 0.9 where the threshold
is below the recorded peak (above it the collector never runs); then combinations of the best
of each family: expandable segments with the best rounding and, under a cap, the best
threshold; the best split size with the best rounding and threshold.

Each setting runs the replay's requests (:func:`experiments.doctor.answers.whatif.what_if`); the
ranking is by out-of-memory events, then peak reserved bytes, then final reserved bytes (each
at the worst end of its range where the what-if is not exact), then the fewest options; a
setting is suggested only if even the worst end of its range beats the recorded run. On Linux the runs are spread over the machine's cores in forked processes
(they share the replay's requests without copying them); elsewhere, and in a browser, they
run one after the other with the same results.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Any, Sequence

from ...core.units import MiB
from ..replaying.run import Run
from .progress import Progress
from .whatif import WhatIf, what_if

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
    """Fewest OOMs, then lowest peak reserved, then lowest final reserved (each at the worst end
    of its range, the figure itself when exact), then fewest options."""
    def worst(figure: int, rng: tuple[int, int] | None) -> int:
        return rng[1] if rng else figure

    return (worst(run.oom_events, run.oom_events_range), worst(run.peak_reserved_bytes, run.peak_reserved_range_bytes),
            worst(run.final_reserved_bytes, run.final_reserved_range_bytes),
            0 if not settings else settings.count(",") + 1)


# ----------------------------------------------------------------------------- running many what-ifs

_JOB: dict[str, Any] = {}   # what every what-if shares: forked processes inherit it, uncopied


def _one(wi: WhatIf) -> tuple[Run, float]:
    job = _JOB
    t0 = time.perf_counter()
    run, _ = what_if(job["base"], wi, cap_bytes=job["cap"], total_memory=job["total"], series=job["series"])
    # not sent back: the report computes a layout where it needs one (Report.peak_layout)
    run.final_segments = []
    return run, time.perf_counter() - t0


def _recorded_is_the_replay(runs: dict[str, Run], recorded: str, base: Run, same_cap: bool) -> None:
    # The recorded setting's row is what the GPU did: the exact replay's figures (its what-if
    # may be bounded, e.g. by record_stream timing, where the replay followed the GPU's own).
    run = runs.get(recorded)
    if run is None or not base.matches_trace or not same_cap:
        return
    run.peak_reserved_bytes, run.final_reserved_bytes = base.peak_reserved_bytes, base.final_reserved_bytes
    run.peak_allocated_bytes, run.final_allocated_bytes = base.peak_allocated_bytes, base.final_allocated_bytes
    run.oom_events = base.oom_events
    run.exact, run.bound_bytes, run.uncertain = True, 0, []
    run.peak_reserved_range_bytes = (base.peak_reserved_bytes,) * 2
    run.final_reserved_range_bytes = (base.final_reserved_bytes,) * 2
    run.oom_events_range = (base.oom_events,) * 2


def _workers(n_jobs: int, n_requests: int) -> int:
    if sys.platform != "linux" or n_jobs < 2 or n_requests < 20_000:
        return 1        # forking costs more than a small replay; fork is Linux's only safe default
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(cores, n_jobs))


def run_many(base: Run, what_ifs: Sequence[WhatIf], *, cap_bytes: int | None, total_memory: int,
             workers: int | None = None, series: bool = False, progress: Progress | None = None,
             stage: str = "what_if", first: int = 0, count: int | None = None) -> list[Run]:
    """The what-ifs of ``what_ifs`` (parsed settings: :class:`WhatIf`), in order.

    Runs them in forked worker processes when that helps (Linux, a long trace, two or more
    settings and cores). The Runs returned carry the figures and the certainty, not the final
    layout; the per-request series only with ``series``.

    ``progress``: each reported as a step of ``stage`` (:mod:`experiments.doctor.answers.progress`),
    numbered from ``first`` of ``count`` (default: these); in worker processes only when done.
    """
    n = workers if workers is not None else _workers(len(what_ifs), len(base.requests))
    tell = progress or Progress()
    total = count if count is not None else first + len(what_ifs)
    _JOB.update(base=base, cap=cap_bytes, total=total_memory, series=series)
    out: list[Run] = []
    try:
        if n <= 1:
            for k, wi in enumerate(what_ifs):
                tell.start(stage, first + k, total, wi.settings)
                run, took = _one(wi)
                out.append(run)
                tell.done(stage, run, seconds=took, index=first + k, count=total, settings=wi.settings)
        else:
            import multiprocessing

            # longest first would be better but all take about as long: plain order, chunks of one
            with multiprocessing.get_context("fork").Pool(n) as pool:
                for k, (run, took) in enumerate(pool.imap(_one, list(what_ifs), chunksize=1)):
                    out.append(run)
                    tell.done(stage, run, seconds=took, index=first + k, count=total, settings=run.settings)
    finally:
        _JOB.clear()
    return out


# ----------------------------------------------------------------------------- the suggestion

def suggest(base: Run, recorded: str, *, cap_bytes: int | None, total_memory: int,
            workers: int | None = None, replay_cap: int | None = None,
            progress: Progress | None = None) -> dict[str, Any]:
    """Rank the grid for the replay ``base`` (recorded under ``recorded``).

    ``replay_cap``: the cap the replay ran under; where the grid runs under the same one, the
    recorded setting's row is the exact replay's (what the GPU did). ``progress``: each
    setting reported as a ``grid`` step (:mod:`experiments.doctor.answers.progress`).

    Returns:
        dict with ``rows`` (every setting tried, best first: settings, peak_reserved_bytes,
        final_reserved_bytes, peak_allocated_bytes, oom_events, saved_bytes against the
        recorded run's peak, and the what-if's certainty: exact, bound_bytes, uncertain,
        peak_reserved_range_bytes, final_reserved_range_bytes, oom_events_range,
        saved_range_bytes), ``recorded`` (the recorded run's figures), ``best`` (the first
        row, or None when nothing beats the recorded run even at the worst end of the row's
        range), ``alloc_conf`` (the line to use:
        ``PYTORCH_CUDA_ALLOC_CONF=...``, or None), ``cap_bytes`` and ``runs`` (settings ->
        Run, for the OOM explanation), ``ooms_compared`` (False when the recorded run ran out of
        memory under a cap the doctor does not know: the what-ifs, capless, are then ranked
        and compared by their peaks alone).
    """
    first = singles(base, cap_bytes)
    runs = dict(zip(first, run_many(base, [WhatIf.parse(s) for s in first], cap_bytes=cap_bytes,
                                    total_memory=total_memory, workers=workers, progress=progress, stage="grid")))
    _recorded_is_the_replay(runs, recorded, base, replay_cap == cap_bytes)
    ranked = sorted(runs.items(), key=lambda kv: rank_key(*kv))
    more = [c for c in combinations(ranked, cap_bytes) if c not in runs]
    if more:
        runs.update(zip(more, run_many(base, [WhatIf.parse(s) for s in more], cap_bytes=cap_bytes,
                                       total_memory=total_memory, workers=workers, progress=progress, stage="grid",
                                       first=len(first))))
    # a run in which a request the recording served fails did not finish (unless the program
    # catches the error): it is ranked after every run that did, and never suggested
    ranked = sorted(runs.items(), key=lambda kv: (not kv[1].finished, rank_key(*kv)))
    rec = {"settings": recorded, "peak_reserved_bytes": base.peak_reserved_bytes,
           "final_reserved_bytes": base.final_reserved_bytes, "oom_events": base.oom_events}
    rows = []
    for s, r in ranked:
        row = {"settings": s, **{k: v for k, v in r.summary().items() if k != "settings"},
               "saved_bytes": base.peak_reserved_bytes - r.peak_reserved_bytes}
        lo, hi = r.peak_reserved_range_bytes or (r.peak_reserved_bytes, r.peak_reserved_bytes)
        row["saved_range_bytes"] = [base.peak_reserved_bytes - hi, base.peak_reserved_bytes - lo]
        rows.append(row)
    top = rows[0] if rows and rows[0].get("finished", True) else None
    worst_ooms = (top.get("oom_events_range") or [0, top["oom_events"]])[1] if top else 0
    # Without a cap no what-if can run out of memory: the GPU's OOMs (under a cap the snapshot
    # does not record) are then no measure to beat, only the peak is.
    ooms_compared = cap_bytes is not None or base.oom_events == 0
    better = top is not None and top["settings"] != recorded and (
        (ooms_compared and worst_ooms < base.oom_events)
        or ((worst_ooms == base.oom_events or not ooms_compared) and top["saved_range_bytes"][0] > 0))
    return {"rows": rows, "recorded": rec, "best": top if better else None, "ooms_compared": ooms_compared,
            "alloc_conf": f"PYTORCH_CUDA_ALLOC_CONF={top['settings']}" if better and top["settings"] else
            ("PYTORCH_CUDA_ALLOC_CONF= (unset: the defaults)" if better else None),
            "cap_bytes": cap_bytes, "runs": dict(ranked)}


__all__ = ["combinations", "rank_key", "run_many", "singles", "suggest"]
