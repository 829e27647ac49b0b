"""Chapter 2 on FSDP's own code, on one GPU: the experiments, their claims, and the page's
fallback to the recording where FSDP's process group cannot start.

Every run happens in a fresh process (:func:`experiments.streams.fsdp_gpu.fsdp_worker`): a
process group is process-wide state, and FSDP's streams and the allocator's counters start
clean there. Two process groups: NCCL with one rank (``init_process_group("nccl",
world_size=1, rank=0)``), where FSDP2 (since torch 2.9, PR #160135) copies each layer's
parameters on the compute stream instead of all-gathering them and FSDP1 switches to
``NO_SHARD``; and torch's fake process group of two ranks, where both shard and run their
all-gather code path but the collective moves no data. Neither runs a network.

Starting torch in a fresh process costs seconds, so the runs a page asks for together (both
groups' run-ahead sweeps and the page's step runs) share one process, as do the remaining
points of the step experiment's recorded grid; each result is handed out once, within
:data:`SHARE_WINDOW_S` (like chapter 1's shared processes, :mod:`experiments.allocator.fresh`).

Source post: :data:`experiments.streams.measurements.POST_URL`; FSDP's code as cited in
:mod:`experiments.streams.fsdp_gpu`.
"""
from __future__ import annotations

import statistics
import threading
import time
from typing import Any, Mapping, Sequence

from ..core import store
from ..core.claims import claim
from ..core.device import check_fits
from ..core.registry import Param, Result, experiment, resolve_mode, run
from ..core.registry import get as registry_get
from ..core.runner import run_fresh
from ..core.units import mib_figure
from .measurements import POST_URL, _int, _list, _num, _obj  # the chapter's schema helpers

# Here rather than in fsdp_gpu.py (the GPU side, which uses them too): this module, imported with
# the chapter, then does not import that one, whose layers subclass torch's classes.
#: fp32 weight MiB per layer -> hidden size of the square layer (weights hidden × hidden × 4 B).
LAYER_HIDDEN: dict[int, int] = {4: 1024, 16: 2048, 64: 4096, 256: 8192}
GROUPS = ("nccl", "fake")    # the process group: NCCL with one rank, or torch's fake group of two
VERSIONS = ("fsdp2", "fsdp1", "fsdp1_nolimit")

#: (GPU work per layer, host delay per layer) in ms: the run-ahead points of the sweep.
FSDP_POINTS: tuple[tuple[float, float], ...] = ((0.0, 0.0), (1.0, 0.0), (10.0, 0.0), (10.0, 5.0))
SHARE_WINDOW_S = 600.0
#: A memory cap (MiB) for the fresh processes, as on a 16 GB GPU (the GPU tests set it); None: none.
CAP_MIB: float | None = None
#: The stream that carries each version's gathered (or low-precision) parameters, by group.
PARAM_STREAMS = {"fsdp2": ("all-gather copy-in",), "fsdp1": ("unshard", "pre-unshard"),
                 "fsdp1_nolimit": ("unshard", "pre-unshard")}
GROUP_LABELS = {"nccl": "NCCL, world size 1", "fake": "fake group, world size 2"}


class ProcessGroupUnavailable(RuntimeError):
    """FSDP's process group could not start on this machine (the message says why)."""


# ------------------------------------------------------------------ sizes

def bytes_per_layer(layer_mib: int, mixed_precision: bool) -> tuple[int, int]:
    """(fp32 weight bytes, bytes of the parameters FSDP computes with) of one layer."""
    hidden = LAYER_HIDDEN[layer_mib]
    return hidden * hidden * 4, hidden * hidden * (2 if mixed_precision else 4)


def _size_check(layers: int, layer_mib: int) -> None:
    # parameters and gradients in fp32, and every layer's computing copy parked at once, twice
    # (forward and backward): the most a run can hold at world size 1
    check_fits("layers × layer_mib", 4 * layers * layer_mib * 2**20)


# ------------------------------------------------------------------ the shared fresh process

_kept: dict[tuple[str, str], tuple[float, dict[str, Any]]] = {}
_handed: dict[tuple[str, str], float] = {}     # when each result was last handed out
_lock = threading.Lock()
#: A request for a recorded point that comes this soon (s) after the previous one ended is
#: taken for a walk over the grid (``python -m experiments record``), and brings the rest of
#: the grid into its process; a reader's click comes later and runs its point alone.
GRID_WALK_S = 1.0


def _take(exp_id: str, point: Mapping[str, Any]) -> dict[str, Any] | None:
    key = (exp_id, store.params_key(point))
    with _lock:
        got = _kept.pop(key, None)
    if got is None or time.monotonic() - got[0] > SHARE_WINDOW_S:
        return None
    return got[1]


def _handed_out(exp_id: str, point: Mapping[str, Any]) -> None:
    with _lock:
        _handed[(exp_id, store.params_key(point))] = time.monotonic()


def _forget_shared() -> None:
    """Drop every kept result (tests; a page that wants fresh numbers)."""
    with _lock:
        _kept.clear()
        _handed.clear()


def _step_config(p: Mapping[str, Any]) -> dict[str, Any]:
    return {k: p[k] for k in ("version", "layers", "layer_mib", "gpu_ms", "host_delay_ms", "reshard_after_forward",
                              "mixed_precision")}


def _sweep_jobs(p: Mapping[str, Any]) -> list[dict[str, Any]]:
    base = {"layers": p["layers"], "layer_mib": p["layer_mib"], "reshard_after_forward": True,
            "mixed_precision": p["mixed_precision"], "gpu_ms": 0.0, "host_delay_ms": 0.0}
    points = [list(pt) for pt in FSDP_POINTS]
    jobs = [{"kind": "sweep", "key": f"sweep:{v}", "config": {**base, "version": v}, "points": points,
             "repeats": p["repeats"]} for v in VERSIONS]
    if p["group"] == "nccl":  # the chapter's own program on the same buffers, once (it needs no group)
        _, param_bytes = bytes_per_layer(p["layer_mib"], p["mixed_precision"])
        jobs.append({"kind": "pipeline", "key": "sweep:program", "layers": p["layers"],
                     "buffer_mib": param_bytes / 2**20, "points": points, "repeats": p["repeats"]})
    return jobs


def _jobs_for(exp_id: str, point: Mapping[str, Any]) -> list[tuple[str, dict[str, Any], list[dict[str, Any]]]]:
    """What one fresh process runs for a request: [(exp id, point, jobs)], the request first.

    The first request for a point the page shows (:data:`PAGE_STEPS`, either sweep's recorded
    point) brings all of those; a request for another recorded point of ``streams.fsdp_step``
    during a walk over the grid (:data:`GRID_WALK_S`) brings every recorded step point not
    measured lately; anything else runs alone."""
    from ..core.registry import get

    def unit(eid: str, pt: Mapping[str, Any]) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
        if eid == "streams.fsdp_runahead":
            return eid, dict(pt), _sweep_jobs(pt)
        return eid, dict(pt), [{"kind": "step", "key": "step", "config": _step_config(pt), "snapshot": True}]

    sweep, step = get("streams.fsdp_runahead"), get("streams.fsdp_step")
    page = [("streams.fsdp_runahead", g) for g in sweep.grid] + \
           [("streams.fsdp_step", step.complete(s)) for s in PAGE_STEPS]
    key = store.params_key(point)
    now = time.monotonic()
    with _lock:
        recent = {(e, k) for (e, k), t in _handed.items() if now - t <= SHARE_WINDOW_S} | set(_kept)
    page_keys = [(eid, store.params_key(pt)) for eid, pt in page]
    if (exp_id, key) in page_keys and not recent & set(page_keys):   # the page's first request
        chosen = page
    elif exp_id == "streams.fsdp_step" and key in {store.params_key(g) for g in step.grid} and _walking(exp_id):
        done = {k for (e, k) in recent if e == exp_id}
        chosen = [(exp_id, g) for g in step.grid if store.params_key(g) not in done or store.params_key(g) == key]
    else:
        chosen = [(exp_id, point)]
    chosen.sort(key=lambda u: not (u[0] == exp_id and store.params_key(u[1]) == key))   # the request first
    return [unit(eid, pt) for eid, pt in chosen]


def _assemble(eid: str, point: Mapping[str, Any], group_out: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """The experiment's data from its jobs' results (keys under ``prefix``)."""
    errs = {k: v for k, v in group_out["errors"].items() if k.startswith(prefix)}
    if errs:
        k, msg = next(iter(errs.items()))
        raise RuntimeError(f"{eid} at {dict(point)}: the run {k!r} failed in the fresh process: {msg}")
    res = {k[len(prefix):].removeprefix("sweep:"): v for k, v in group_out["results"].items() if k.startswith(prefix)}
    if eid == "streams.fsdp_step":
        return {**_step_config(point), "group": point["group"], **res["step"]}
    return _sweep_data(point, res, int(group_out["world_size"]))


def _measure(exp_id: str, point: Mapping[str, Any]) -> dict[str, Any]:
    """Run the request (and what shares its process) in one fresh process; keep the rest."""
    units = _jobs_for(exp_id, point)
    by_group: dict[str, list[dict[str, Any]]] = {g: [] for g in GROUPS}
    for n, (eid, pt, jobs) in enumerate(units):
        by_group[pt["group"]] += [{**j, "key": f"{n}/{j['key']}"} for j in jobs]
    # the request's group first: a later group starts after the earlier one is destroyed
    order = sorted((g for g in GROUPS if by_group[g]), key=lambda g: g != point["group"])
    specs = [{"group": g, "jobs": by_group[g]} for g in order]
    out = run_fresh("experiments.streams.fsdp_gpu:fsdp_worker", {"groups": specs}, timeout_s=540,
                    memory_cap_mib=CAP_MIB).unwrap()["groups"]
    retry = [s for s in specs[1:] if "process_group_error" in out.get(s["group"], {})]
    for s in retry:   # a second group that did not start after the first: in a process of its own
        out.update(run_fresh("experiments.streams.fsdp_gpu:fsdp_worker", {"groups": [s]}, timeout_s=540,
                             memory_cap_mib=CAP_MIB).unwrap()["groups"])
    mine = out.get(point["group"], {})
    if "process_group_error" in mine:
        raise ProcessGroupUnavailable(mine["process_group_error"])
    if "session_error" in mine:
        raise RuntimeError(f"FSDP's process group started but the run could not: {mine['session_error']}")
    now = time.monotonic()
    for n, (eid, pt, _) in list(enumerate(units))[1:]:
        g = out.get(pt["group"], {})
        if "results" not in g:
            continue
        try:
            data = _assemble(eid, pt, g, f"{n}/")
        except RuntimeError:
            continue   # measured again, and its error raised, when it is asked for
        with _lock:
            _kept[(eid, store.params_key(pt))] = (now, data)
    eid, pt, _ = units[0]
    return _assemble(eid, pt, mine, "0/")


def _walking(exp_id: str) -> bool:
    with _lock:
        last = max((t for (e, _), t in _handed.items() if e == exp_id), default=None)
    return last is not None and time.monotonic() - last <= GRID_WALK_S


def _value(exp_id: str, point: Mapping[str, Any]) -> dict[str, Any]:
    kept = _take(exp_id, point)
    value = kept if kept is not None else _measure(exp_id, point)
    _handed_out(exp_id, point)
    return value


# ------------------------------------------------------------------ the sweep's data

def _median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


def _sweep_data(p: Mapping[str, Any], res: Mapping[str, Any], world_size: int) -> dict[str, Any]:
    layer_bytes, param_bytes = bytes_per_layer(p["layer_mib"], p["mixed_precision"])
    out: dict[str, Any] = {
        "group": p["group"], "world_size": world_size, "layers": p["layers"], "layer_bytes": layer_bytes,
        "param_bytes": param_bytes, "repeats": p["repeats"],
        "points": [{"gpu_ms": g, "host_delay_ms": h, "runahead_ms": g - h} for g, h in FSDP_POINTS],
        "versions": {},
    }
    keys = ("peak_active_bytes", "peak_allocated_bytes", "peak_reserved_bytes", "max_parked_bytes", "host_ms",
            "wall_ms")
    for v in VERSIONS:
        r = res[v]
        series: dict[str, Any] = {k: [_median([x[k] for x in runs]) for runs in r["runs"]] for k in keys}
        series["deferred_frees"] = [max(x["deferred_frees"] for x in runs) for runs in r["runs"]]
        streams = sorted({s for runs in r["runs"] for x in runs for s in x["streams"]})
        series["param_buffers"] = [max((_median([x["streams"].get(s, {}).get("max_blocks", 0) for x in runs])
                                        for s in PARAM_STREAMS[v]), default=0) for runs in r["runs"]]
        out["versions"][v] = {"sharding": r["sharding"], "param_dtype": r["param_dtype"],
                              "collectives": r["collectives"], "streams": streams, **series}
        out["param_dtype"] = r["param_dtype"]
    if "program" in res:
        out["program"] = {s: {k: [_median([x[s][k] for x in runs]) for runs in res["program"]["runs"]]
                              for k in ("peak_active_bytes", "peak_allocated_bytes", "peak_reserved_bytes",
                                        "distinct_blocks")} for s in ("record_stream", "event")}
    return out


# ------------------------------------------------------------------ experiments

_COLLECTIVES = _obj({"all_gather": _int(), "reduce_scatter": _int(), "all_reduce": _int()})
_VERSION_SERIES = _obj({
    "sharding": {"type": "string"}, "param_dtype": {"type": "string"}, "collectives": _COLLECTIVES,
    "streams": _list({"type": "string"}), "peak_active_bytes": _list(_num()), "peak_allocated_bytes": _list(_num()),
    "peak_reserved_bytes": _list(_num()), "max_parked_bytes": _list(_num(0)), "host_ms": _list(_num(0)),
    "wall_ms": _list(_num(0)), "deferred_frees": _list(_int()), "param_buffers": _list(_num(0)),
})


@experiment(
    "streams.fsdp_runahead",
    chapter=2,
    title="FSDP's own code on one GPU: peak memory as the CPU runs ahead",
    params=[
        Param("group", "nccl", choices=GROUPS, help="process group: NCCL with one rank, or torch's fake group of two"),
        Param("layers", 16, min=4, max=32, unit="layers", help="FSDP units, one linear layer each"),
        Param("layer_mib", 64, choices=tuple(LAYER_HIDDEN), unit="MiB", help="fp32 weights of one layer"),
        Param("mixed_precision", True, help="compute in bf16 (fp16 on GPUs without bf16), reduce in fp32"),
        Param("repeats", 2, min=1, max=5, unit="runs", help="runs per point; medians are reported"),
    ],
    grid={"group": list(GROUPS)},
    data_schema=_obj({
        "group": {"type": "string", "enum": list(GROUPS)}, "world_size": _int(1), "layers": _int(1),
        "layer_bytes": _int(1), "param_bytes": _int(1), "repeats": _int(1), "param_dtype": {"type": "string"},
        "points": _list(_obj({"gpu_ms": _num(0), "host_delay_ms": _num(0), "runahead_ms": _num()})),
        "versions": {"type": "object", "required": list(VERSIONS),
                     "properties": {v: _VERSION_SERIES for v in VERSIONS}},
    }),
)
def fsdp_runahead(group: str = "nccl", layers: int = 16, layer_mib: int = 64, mixed_precision: bool = True,
                  repeats: int = 2) -> dict[str, Any]:
    """Train ``layers`` linear layers with FSDP2, FSDP1 and FSDP1 without ``limit_all_gathers``,
    one training step per run-ahead point (:data:`FSDP_POINTS`: GPU work and host delay per
    layer, in forward and backward) and repeat, in a fresh process.

    Per version, lists aligned with ``points`` hold the medians over ``repeats`` of the step's
    peak active, allocated and reserved bytes above its start, the most bytes parked at once
    (frees deferred by ``record_stream`` events), host enqueue and wall time (ms), the most
    deferred frees, and ``param_buffers``: the most blocks alive at once on the stream that
    carries the version's gathered (or low-precision) parameters (:data:`PARAM_STREAMS`);
    also the collectives of a warm step and the sharding FSDP ran. With ``group='nccl'``,
    ``program`` holds the chapter's own record_stream and event programs
    (:func:`~experiments.streams.workloads.run_pipeline`) on buffers of one layer's
    parameters. About 15 s, most of it starting torch.

    Raises:
        ValueError: a parameter out of range, or sizes beyond the GPU.
        ProcessGroupUnavailable: the process group cannot start here.
        FreshProcessError: the fresh process failed.
    """
    _size_check(layers, layer_mib)
    return _value("streams.fsdp_runahead", {"group": group, "layers": layers, "layer_mib": layer_mib,
                                            "mixed_precision": mixed_precision, "repeats": repeats})


_STEP_GRID_POINTS = ((10.0, 0.0), (10.0, 5.0))
#: The step runs the page shows (its default, and the timelines of the all-gather path).
PAGE_STEPS: tuple[dict[str, Any], ...] = ({}, {"group": "fake"}, {"group": "fake", "version": "fsdp1_nolimit"})
_STEP_GRID = (
    [{"group": g, "version": v, "gpu_ms": c, "host_delay_ms": h}
     for g in GROUPS for v in VERSIONS for c, h in _STEP_GRID_POINTS]
    + [{"group": g, "version": v, "reshard_after_forward": False} for g in GROUPS for v in VERSIONS]
)

_STREAM_USAGE = _obj({k: _int() for k in ("allocs", "alloc_bytes", "deferred_frees", "max_blocks", "max_bytes",
                                          "max_parked_blocks", "max_parked_bytes")})


@experiment(
    "streams.fsdp_step",
    chapter=2,
    title="One FSDP training step: its streams, its parked blocks, its snapshot",
    # memory snapshots for the doctor and the explorer, like alloc.doctor_snapshots: 18 points,
    # about 30 s in a process of their own; record --experiment streams.fsdp_step
    own_budget=True,
    params=[
        Param("version", "fsdp2", choices=VERSIONS, help="FSDP2, FSDP1, or FSDP1 with limit_all_gathers=False"),
        Param("group", "nccl", choices=GROUPS, help="NCCL with one rank, or torch's fake group of two"),
        Param("gpu_ms", 10.0, min=0.0, max=20.0, unit="ms", help="GPU work per layer, forward and backward"),
        Param("host_delay_ms", 0.0, min=0.0, max=20.0, unit="ms", help="host delay per layer: less run-ahead"),
        Param("reshard_after_forward", True, help="FSDP2 reshard_after_forward; FSDP1 FULL_SHARD (else SHARD_GRAD_OP)"),
        Param("layers", 16, min=2, max=32, unit="layers"),
        Param("layer_mib", 64, choices=tuple(LAYER_HIDDEN), unit="MiB", help="fp32 weights of one layer"),
        Param("mixed_precision", True, help="compute in bf16 (fp16 on GPUs without bf16)"),
    ],
    grid=_STEP_GRID,
    data_schema=_obj({
        "version": {"type": "string", "enum": list(VERSIONS)}, "group": {"type": "string", "enum": list(GROUPS)},
        "world_size": _int(1), "sharding": {"type": "string"}, "param_dtype": {"type": "string"},
        "collectives": _COLLECTIVES, "peak_active_bytes": _int(), "peak_allocated_bytes": _int(),
        "peak_reserved_bytes": _int(), "start_allocated_bytes": _int(), "host_ms": _num(0), "wall_ms": _num(0),
        "span_ms": _num(0), "phases_ms": {"type": "object"}, "stream_names": _list({"type": "string"}),
        "streams": {"type": "object", "additionalProperties": _STREAM_USAGE},
        "timeline": _obj({"bin_ms": _num(0), "streams": {"type": "object", "additionalProperties": _obj({
            "mib": _list(_num(0)), "parked_mib": _list(_num(0))})}}),
        "max_parked_bytes": _int(), "deferred_frees": _int(),
        "snapshot": {"type": "object", "required": ["format", "trace_z", "segments"]},
        "phases": _list({"type": "object", "required": ["phase", "trace_index", "allocated_bytes.all.current",
                                                        "reserved_bytes.all.current"]}),
    }),
)
def fsdp_step(version: str = "fsdp2", group: str = "nccl", gpu_ms: float = 10.0, host_delay_ms: float = 0.0,
              reshard_after_forward: bool = True, layers: int = 16, layer_mib: int = 64,
              mixed_precision: bool = True) -> dict[str, Any]:
    """One FSDP configuration in a fresh process: built, warmed up, then one measured
    training step with the memory trace on (:meth:`experiments.streams.fsdp_gpu.Session.step`).

    Returns the configuration; the sharding FSDP ran and the collectives of a warm step;
    the step's peaks above its start (bytes); host, wall and GPU time (ms) and the host's
    phase marks; per stream (named after FSDP's own stream objects) allocations, the most
    blocks and bytes in flight and parked, deferred frees; the per-stream timeline (host
    time of the allocator calls, ms after the step's start); and the memory snapshot in the
    doctor's compact form with the GPU's counters at three marks (``phases``).

    Raises:
        ValueError: a parameter out of range, or sizes beyond the GPU.
        ProcessGroupUnavailable: the process group cannot start here.
        FreshProcessError: the fresh process failed.
    """
    _size_check(layers, layer_mib)
    return _value("streams.fsdp_step", {"version": version, "group": group, "gpu_ms": gpu_ms,
                                        "host_delay_ms": host_delay_ms, "reshard_after_forward": reshard_after_forward,
                                        "layers": layers, "layer_mib": layer_mib, "mixed_precision": mixed_precision})


# ------------------------------------------------------------------ the page's fallback

_unavailable: dict[str, str] = {}   # process group -> why it did not start in this kernel


def fsdp_run(exp_id: str, **params: Any) -> Result:
    """``ex.run`` for the FSDP experiments: live where FSDP's process group starts; where it
    cannot (no NCCL, a torch without the fake group), the lab GPU's recording of the same
    point, after one line that says why. The reader's kernel is never at risk: FSDP runs in
    a fresh process either way.

    Raises:
        ValueError: an unknown experiment or parameter, or a value out of range.
        NotRecordedError: the fallback's point was not recorded.
    """
    if exp_id not in ("streams.fsdp_runahead", "streams.fsdp_step"):
        raise ValueError(f"exp_id must be 'streams.fsdp_runahead' or 'streams.fsdp_step', got {exp_id!r}")
    group = registry_get(exp_id).complete(params)["group"]
    if resolve_mode() == "live" and group not in _unavailable:
        try:
            return run(exp_id, cache=True, **params)
        except ProcessGroupUnavailable as e:
            said = bool(_unavailable)
            _unavailable[group] = str(e)
            if not said:
                print(f"FSDP's process group did not start on this machine ({str(e).splitlines()[0][:160]}); "
                      "this section shows the lab GPU's recording instead.")
    return run(exp_id, mode="recorded", **params)


def fsdp_mode() -> str | None:
    """'recorded' once a FSDP process group failed to start in this kernel (for ``ex.panel``'s
    ``mode``: its controls then offer the recorded points), else None (the page's mode)."""
    return "recorded" if _unavailable else None


# ------------------------------------------------------------------ claims

def _ends(d: Mapping[str, Any]) -> tuple[int, int]:
    ra = [pt["runahead_ms"] for pt in d["points"]]
    return ra.index(min(ra)), ra.index(max(ra))


def _growth(d: Mapping[str, Any], version: str) -> float:
    lo, hi = _ends(d)
    act = d["versions"][version]["peak_active_bytes"]
    return act[hi] - act[lo]


def _at(d: Mapping[str, Any], k: int) -> str:
    pt = d["points"][k]
    return f"{pt['gpu_ms']:g} ms GPU / {pt['host_delay_ms']:g} ms host per layer"


@claim("streams.fsdp2_flat", chapter=2, experiment="streams.fsdp_runahead", params={"group": "nccl"},
       source=POST_URL,
       statement="FSDP2 (fully_shard with a MixedPrecisionPolicy; one GPU, NCCL with one rank): peak active bytes "
                 "at the largest CPU run-ahead exceed those at the smallest by less than one layer's parameters, "
                 "and no free waits on an event.")
def _claim_fsdp2_flat(d: Mapping[str, Any]) -> tuple[bool, dict[str, Any]]:
    v = d["versions"]["fsdp2"]
    grow, parked = _growth(d, "fsdp2"), max(v["max_parked_bytes"])
    out = {"growth MiB": mib_figure(grow), "one layer's parameters MiB": mib_figure(d["param_bytes"]),
           "most parked MiB": mib_figure(parked), "largest run-ahead": _at(d, _ends(d)[1])}
    if "program" in d:
        act = d["program"]["record_stream"]["peak_active_bytes"]
        lo, hi = _ends(d)
        out["the chapter's record_stream program: growth MiB"] = mib_figure(act[hi] - act[lo])
    return grow < d["param_bytes"] and parked == 0, out


@claim("streams.fsdp1_follows_runahead", chapter=2, experiment="streams.fsdp_runahead", params={"group": "nccl"},
       source=POST_URL,
       statement="FSDP1 (MixedPrecision, limit_all_gathers=True; one GPU, NCCL with one rank, where it runs "
                 "NO_SHARD): record_stream parks its parameter copies, and peak active bytes at the largest CPU "
                 "run-ahead exceed those at the smallest by at least half of all layers' parameters.")
def _claim_fsdp1_grows(d: Mapping[str, Any]) -> tuple[bool, dict[str, Any]]:
    grow, need = _growth(d, "fsdp1"), 0.5 * d["layers"] * d["param_bytes"]
    lo, hi = _ends(d)
    v = d["versions"]["fsdp1"]
    return grow >= need, {"growth MiB": mib_figure(grow), "half of all layers' parameters MiB": mib_figure(need),
                          "parked MiB at the largest run-ahead": mib_figure(v["max_parked_bytes"][hi]),
                          "parked MiB at the smallest": mib_figure(v["max_parked_bytes"][lo]),
                          "sharding": v["sharding"], "all-gathers per step": v["collectives"]["all_gather"]}


@claim("streams.fsdp1_limit_bounds", chapter=2, experiment="streams.fsdp_runahead", params={"group": "fake"},
       source=POST_URL,
       statement="FSDP1 sharded over two ranks (torch's fake process group): without limit_all_gathers, peak "
                 "active bytes grow with CPU run-ahead by at least half of all layers' gathered parameters; with "
                 "it, by less than a quarter of that growth, because the rate limiter blocks the CPU.")
def _claim_fsdp1_limit(d: Mapping[str, Any]) -> tuple[bool, dict[str, Any]]:
    free, limited = _growth(d, "fsdp1_nolimit"), _growth(d, "fsdp1")
    need = 0.5 * d["layers"] * d["param_bytes"]
    _, hi = _ends(d)
    v = d["versions"]["fsdp1"]
    return free >= need and limited < 0.25 * free, {
        "growth without the limit MiB": mib_figure(free), "growth with the limit MiB": mib_figure(limited),
        "half of all layers' parameters MiB": mib_figure(need),
        "host ms per step with the limit, largest run-ahead": round(v["host_ms"][hi], 1),
        "wall ms": round(v["wall_ms"][hi], 1)}


@claim("streams.fsdp2_allgather_bounded", chapter=2, experiment="streams.fsdp_runahead", params={"group": "fake"},
       source=POST_URL,
       statement="FSDP2 sharded over two ranks (torch's fake process group): the all-gather buffers alive at once "
                 "are the same few at every CPU run-ahead, and peak active bytes grow by less than one layer's "
                 "parameters.")
def _claim_fsdp2_bounded(d: Mapping[str, Any]) -> tuple[bool, dict[str, Any]]:
    v = d["versions"]["fsdp2"]
    bufs, grow = v["param_buffers"], _growth(d, "fsdp2")
    return len(set(bufs)) == 1 and 1 <= bufs[0] <= 4 and grow < d["param_bytes"] and max(v["max_parked_bytes"]) == 0, {
        "all-gather buffers alive at once, per point": bufs, "growth MiB": mib_figure(grow),
        "all-gathers per step": v["collectives"]["all_gather"]}
