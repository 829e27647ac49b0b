"""Chapter 1's fresh processes: allocator settings are read once per process, so every
sequence that runs under a setting or a memory cap runs in a new one. The chapter's jobs
under one setting share one process, and its results are kept for a while
(``SHARE_WINDOW_S``) so that recording the chapter starts few processes. The first process
of one setting starts the other setting's alongside it: the chapter asks for both, each
measures bytes in its own allocator (not time), and a fresh process is mostly torch's
start-up (about 6 s of chapter 1's live minute on the H200)."""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import Any, Mapping, Sequence
from ..core import alloc_conf
from .model import normalize_ops
from .workloads import (
    _CAP_PARAM, GRAPH_BATCH_SIZES, GRAPH_DTYPE, GRAPH_HIDDEN, KNOB_CAP_MIB, KNOBS, OOM_CAP_CHOICES,
    OOM_CAP_MIB, OOM_PATTERNS, ORDERS, TIMELINE_SMALL_MIB, boundary_sequences, oom_ops, timeline_ops,
)
from ..core.device import require_cuda


def _fresh_sequences(sequences: Mapping[str, Sequence[Sequence[Any]]], *, settings: Mapping[str, Any] | None = None,
                     cap_mib: float | None = None, timeout_s: float = 180.0) -> dict[str, Any]:
    """Run named operation sequences in one fresh process; raise if the process failed."""
    from ..core.runner import run_fresh

    require_cuda("running allocator experiments")
    result = run_fresh("experiments.allocator.gpu:sequences_worker",
                       {"sequences": {k: normalize_ops(v) for k, v in sequences.items()}},
                       alloc_conf_settings=dict(settings) if settings else None, memory_cap_mib=cap_mib,
                       timeout_s=timeout_s)
    return result.unwrap()


SHARE_WINDOW_S = 600.0


_SHARED_SETTINGS = {"default": None, "expandable": {"expandable_segments": True}}


_kept: dict[tuple[str, str], tuple[float, Mapping[str, Any]]] = {}
_started: dict[str, Future] = {}    # setting -> the other setting's process started alongside
_lock = threading.Lock()            # _kept and _started, shared with the thread that waits on it


def oom_job(cap_mib: int) -> str:
    """The name of the shared job that runs the fragmentation patterns under ``cap_mib``:
    'fragmentation_oom' for the default cap, 'fragmentation_oom_<cap>' for the others.

    Raises:
        ValueError: a cap not in ``OOM_CAP_CHOICES`` (the message names cap_mib).
    """
    _CAP_PARAM.validate(cap_mib)
    return "fragmentation_oom" if cap_mib == OOM_CAP_MIB else f"fragmentation_oom_{cap_mib}"


def shared_jobs(setting: str) -> dict[str, dict[str, Any]]:
    """Every fresh-process job of the chapter under one setting ('default' or 'expandable'):
    the timelines, the pool boundary, the fragmentation patterns (once per cap in
    ``OOM_CAP_CHOICES``, see :func:`oom_job`) and the knobs' baseline (each a set of
    operation sequences, some under a memory cap), and the graph captures.

    Raises:
        ValueError: an unknown setting.
    """
    if setting not in _SHARED_SETTINGS:
        raise ValueError(f"setting must be one of {sorted(_SHARED_SETTINGS)}, got {setting!r}")
    jobs: dict[str, dict[str, Any]] = {
        f"timeline_{m}": {"sequences": {o: timeline_ops(o, m) for o in ORDERS}} for m in TIMELINE_SMALL_MIB}
    jobs["pool_boundary"] = {"sequences": boundary_sequences()}
    jobs["fragmentation_oom"] = {"sequences": {p: oom_ops(p) for p in OOM_PATTERNS}, "cap_mib": OOM_CAP_MIB}
    jobs["knobs"] = {"sequences": {name: k["ops"] for name, k in KNOBS.items()}, "cap_mib": KNOB_CAP_MIB}
    for cap in OOM_CAP_CHOICES:   # the other caps: a few dozen allocations each, in the same process
        if cap != OOM_CAP_MIB:
            jobs[oom_job(cap)] = {"sequences": {p: oom_ops(p) for p in OOM_PATTERNS}, "cap_mib": cap}
    jobs["graph_pools"] = {"graph_pools": {"hidden": GRAPH_HIDDEN, "batch_sizes": list(GRAPH_BATCH_SIZES),
                                           "dtype": GRAPH_DTYPE, "autograd": True}}
    for job in jobs.values():
        if "sequences" in job:
            job["sequences"] = {k: normalize_ops(v) for k, v in job["sequences"].items()}
    return jobs


def _shared_process(setting: str, jobs: Mapping[str, Any]) -> Mapping[str, Any]:
    """Every job of ``setting`` in one new fresh process: {job: {'ok', 'value' or 'error'}}."""
    from ..core.runner import run_fresh

    return run_fresh("experiments.allocator.gpu:shared_worker", {"jobs": jobs},
                     alloc_conf_settings=_SHARED_SETTINGS[setting], timeout_s=600).unwrap()


def _keep(setting: str, results: Mapping[str, Any], but: str | None = None) -> None:
    now = time.monotonic()
    with _lock:
        for name, value in results.items():
            if name != but:
                _kept[(setting, name)] = (now, value)


def _start_alongside(setting: str) -> None:
    """Start ``setting``'s shared process in a thread unless its results are kept or on their way."""
    with _lock:
        now = time.monotonic()
        if setting in _started or any(s == setting and now - t <= SHARE_WINDOW_S for (s, _), (t, _) in _kept.items()):
            return
        future: Future = Future()
        _started[setting] = future

    def work() -> None:
        try:
            _keep(setting, _shared_process(setting, shared_jobs(setting)))
            future.set_result(None)
        except BaseException as e:   # asked for later, the setting is measured again and raises there
            future.set_exception(e)

    threading.Thread(target=work, name=f"memlab-fresh-{setting}", daemon=True).start()


def _forget_shared() -> None:
    """Wait for the processes started alongside, then drop every kept result (tests start clean)."""
    with _lock:
        started = list(_started.values())
    for future in started:
        future.exception()
    with _lock:
        _started.clear()
        _kept.clear()


def _measure_shared(job: str, expandable: bool) -> dict[str, Any]:
    """The result of one of :func:`shared_jobs`, from a result kept for it or from a new
    fresh process that runs every job of its setting (the other setting's process starts
    alongside it, see the module's docstring).

    Raises:
        RuntimeError: the job failed in the fresh process (its error), or the process did.
    """
    require_cuda("running allocator experiments")
    setting = "expandable" if expandable else "default"
    jobs = shared_jobs(setting)
    if job not in jobs:
        raise ValueError(f"no shared job {job!r}; the jobs are {sorted(jobs)}")
    with _lock:
        started = _started.pop(setting, None)
    if started is not None:
        started.exception()          # wait; a failure there means measuring again here
    with _lock:
        kept = _kept.pop((setting, job), None)
    if kept is not None and time.monotonic() - kept[0] <= SHARE_WINDOW_S:
        outcome = kept[1]
    else:
        for other in _SHARED_SETTINGS:
            if other != setting:
                _start_alongside(other)
        results = _shared_process(setting, jobs)
        _keep(setting, results, but=job)
        outcome = results[job]
    if not outcome["ok"]:
        raise RuntimeError(f"{job} ({setting} settings) failed in its fresh process: {outcome['error']}")
    return dict(outcome["value"])


def explain_setting_error(settings: Mapping[str, Any] | str) -> str | None:
    """None if the installed torch accepts ``settings``, else a sentence saying why not.

    Allocator options come and go between torch releases (``large_segment_size_mb``
    appeared in 2.10, for example); this turns :class:`experiments.alloc_conf.UnsupportedOptionError`
    and bad values into a message for the page instead of a traceback.
    """
    try:
        alloc_conf.render(settings)
    except alloc_conf.UnsupportedOptionError as e:
        return f"Not available here: {e}. The experiment skips this setting."
    except ValueError as e:
        return f"Not a valid setting: {e}"
    return None
