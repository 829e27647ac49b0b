"""Chapter 4 (Hidden host-device syncs): run-ahead and the bubble after a sync, a catalogue
of operations that sync and that do not, pageable host-to-device copies that drain the
stream, a case study, and a detector readers keep (:mod:`.detector`).

Source post: "Host-to-device syncs are bad too" (Edward Yang, 2026-08-11),
https://docs.pytorch.org/devlogs/eager/2026-08-11-hidden-h2d-sync/. Background: CUDA
semantics, https://docs.pytorch.org/docs/stable/notes/cuda.html#asynchronous-execution,
and ``torch.cuda.set_sync_debug_mode``,
https://docs.pytorch.org/docs/stable/generated/torch.cuda.set_sync_debug_mode.html.

Helpers live in :mod:`.ops` (the catalogue's operations), :mod:`.case`
(the case study), :mod:`.plots` (figures and tables) and :mod:`.checks`
(exercises); everything a page needs is importable from here.
"""
from __future__ import annotations

import re
import time
from typing import Any, Mapping

from ..core.lazy_torch import torch
from ..core.claims import claim
from ..core.device import check_fits, has_cuda
from ..core.measure import STATS_SCHEMA, gpu_sleep, host_spin, time_host
from ..core.registry import Param, experiment, run
from .detector import SyncDetector, count_debug_mode_syncs
from .case import PHASES as CASE_PHASES
from .case import predicted_step_ms, reduce_grad_stats, run_case_study
from .ops import (
    CAPTURE_NUMEL, NUMEL_CHOICES, OP_IDS, OPS, capture_probe, get_op, host_blocked_series, measure_op,
)
from .model import BLOCKED_FRACTION, RUN_AHEAD_STEPS, _slope, copy_threshold

POST = "https://docs.pytorch.org/devlogs/eager/2026-08-11-hidden-h2d-sync/"

_INTERVAL = {
    "type": "object",
    "required": ["start_ms", "end_ms"],
    "properties": {"start_ms": {"type": "number"}, "end_ms": {"type": "number"}},
}

# ----------------------------------------------------------------- run-ahead

RUN_AHEAD_SYNC_STEP = 3
RUN_AHEAD_VARIANTS = ("none", "once", "every_step")

_RUN_AHEAD_VARIANT = {
    "type": "object",
    "required": ["host", "gpu", "end_ms", "gpu_busy_ms", "gpu_idle_ms", "host_blocked_ms", "align_uncertainty_ms"],
    "properties": {
        "host": {"type": "array", "items": {**_INTERVAL, "required": ["kind", "start_ms", "end_ms"]}},
        "gpu": {"type": "array", "items": _INTERVAL, "minItems": 1},
        "end_ms": {"type": "number"}, "gpu_busy_ms": {"type": "number"}, "gpu_idle_ms": {"type": "number"},
        "host_blocked_ms": {"type": "number"}, "align_uncertainty_ms": {"type": "number"},
    },
}




def _run_ahead_variant(variant: str, host_ms: float, gpu_ms: float) -> dict[str, Any]:
    loss = torch.zeros((), device="cuda")
    torch.cuda.synchronize()
    # Host and GPU clocks are aligned through one event recorded on an idle stream: its
    # GPU timestamp lies between the host times before the record and after it completed.
    ref = torch.cuda.Event(enable_timing=True)
    h0 = time.perf_counter()
    ref.record()
    ref.synchronize()
    h1 = time.perf_counter()
    zero = (h0 + h1) / 2

    def ms(t: float) -> float:
        return (t - zero) * 1e3

    host, pairs = [], []
    for i in range(RUN_AHEAD_STEPS):
        a = time.perf_counter()
        host_spin(host_ms)
        b = time.perf_counter()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        gpu_sleep(gpu_ms)
        loss.add_(1.0)
        end.record()
        c = time.perf_counter()
        pairs.append((start, end))
        host += [{"kind": "python", "start_ms": ms(a), "end_ms": ms(b)},
                 {"kind": "launch", "start_ms": ms(b), "end_ms": ms(c)}]
        if variant == "every_step" or (variant == "once" and i == RUN_AHEAD_SYNC_STEP):
            d = time.perf_counter()
            loss.item()
            host.append({"kind": "sync", "start_ms": ms(d), "end_ms": ms(time.perf_counter())})
    torch.cuda.synchronize()
    gpu = [{"start_ms": ref.elapsed_time(s), "end_ms": ref.elapsed_time(e)} for s, e in pairs]
    busy = sum(iv["end_ms"] - iv["start_ms"] for iv in gpu)
    span = gpu[-1]["end_ms"] - gpu[0]["start_ms"]
    return {"host": host, "gpu": gpu, "end_ms": gpu[-1]["end_ms"], "gpu_busy_ms": busy,
            "gpu_idle_ms": max(0.0, span - busy),
            "host_blocked_ms": sum(iv["end_ms"] - iv["start_ms"] for iv in host if iv["kind"] == "sync"),
            "align_uncertainty_ms": (h1 - h0) * 1e3}


@experiment(
    "syncs.run_ahead",
    chapter=4,
    title="Run-ahead, and the bubble after a sync",
    params=[Param("host_ms", 1.0, choices=(0.5, 1.0, 1.5, 3.0), unit="ms",
                  help="host (Python) time per step before its launch"),
            Param("gpu_ms", 2.0, choices=(1.0, 2.0, 4.0), unit="ms", help="GPU time per step")],
    grid={"host_ms": [0.5, 1.0, 1.5, 3.0], "gpu_ms": [1.0, 2.0, 4.0]},
    data_schema={
        "type": "object",
        "required": ["steps", "sync_step", "variants"],
        "properties": {"steps": {"type": "integer"}, "sync_step": {"type": "integer"},
                       "warmed_up": {"type": "boolean"},
                       "variants": {"type": "object", "required": list(RUN_AHEAD_VARIANTS),
                                    "properties": {v: _RUN_AHEAD_VARIANT for v in RUN_AHEAD_VARIANTS}}},
    },
)
def run_ahead(host_ms: float = 1.0, gpu_ms: float = 2.0) -> dict[str, Any]:
    """A loop of 8 steps, each ``host_ms`` of host work then ``gpu_ms`` of GPU work
    (``gpu_sleep`` plus a tiny add into a 0-dim ``loss``), run three ways: no sync,
    ``loss.item()`` once (after step 3), and ``loss.item()`` after every step, after one
    unrecorded warm-up pass (``warmed_up``: True).

    Per variant (times in ms from a reference event; host intervals have ``kind``
    'python', 'launch' or 'sync'): ``host`` and ``gpu`` intervals, ``end_ms`` (the GPU
    finished the last step), ``gpu_busy_ms``, ``gpu_idle_ms`` (gaps between the first
    kernel's start and the last one's end), ``host_blocked_ms`` (time inside
    ``.item()``), ``align_uncertainty_ms`` (bound on the host/GPU clock offset).
    """
    gpu_sleep(gpu_ms)  # calibrates the sleep kernel before anything is timed
    torch.cuda.synchronize()
    # One unrecorded pass first: the first launch of a kernel in a process can take
    # milliseconds (lazy module loading), which once delayed a whole recorded loop.
    _run_ahead_variant("every_step", host_ms, gpu_ms)
    variants = {v: _run_ahead_variant(v, host_ms, gpu_ms) for v in RUN_AHEAD_VARIANTS}
    return {"steps": RUN_AHEAD_STEPS, "sync_step": RUN_AHEAD_SYNC_STEP, "warmed_up": True, "variants": variants}


# ----------------------------------------------------------------- the catalogue

_ROW = {
    "type": "object",
    "required": ["id", "code", "group", "debug_mode_syncs", "detector_syncs", "host_blocked_ms", "blocks",
                 "syncs", "capturable"],
    "properties": {
        "debug_mode_syncs": {"type": "integer", "minimum": 0}, "detector_syncs": {"type": "integer", "minimum": 0},
        "host_blocked_ms": STATS_SCHEMA, "blocks": {"type": "boolean"}, "syncs": {"type": "boolean"},
        "capturable": {"type": ["boolean", "null"]},
    },
}


@experiment(
    "syncs.catalogue",
    chapter=4,
    title="Which operations sync: the catalogue",
    params=[Param("numel", 4096, choices=NUMEL_CHOICES, unit="float32 elements",
                  help="size of the tensors (copies move this many floats)"),
            Param("work_ms", 20.0, choices=(5.0, 20.0), unit="ms", help="GPU work queued before each timed call")],
    grid=[{"numel": 4096, "work_ms": 20.0}, {"numel": 4_194_304, "work_ms": 20.0}, {"numel": 4096, "work_ms": 5.0}],
    data_schema={
        "type": "object",
        "required": ["numel", "work_ms", "capture_numel", "rows"],
        "properties": {"rows": {"type": "array", "items": _ROW, "minItems": len(OPS)}},
    },
)
def catalogue(numel: int = 4096, work_ms: float = 20.0) -> dict[str, Any]:
    """Run every operation of :data:`~experiments.syncs.ops.OPS` and record, per row:
    ``debug_mode_syncs`` (warnings from ``set_sync_debug_mode("warn")``),
    ``detector_syncs``/``detector_kinds`` (the book's detector), ``host_blocked_ms``
    (stats, ms, with ``work_ms`` of GPU work queued first), ``blocks`` (waited at least
    half of it), ``syncs`` (flagged or blocked), and ``capturable``/``capture_error``
    (CUDA-graph capture on a side stream, probed in a fresh process with
    ``capture_numel`` elements; None if it could not be probed).
    """
    check_fits("numel", 8 * numel * 4)
    captures = capture_probe(numel=CAPTURE_NUMEL)
    gpu_sleep(work_ms)
    torch.cuda.synchronize()
    rows = []
    for op in OPS:
        m = measure_op(op, numel, work_ms)
        blocks = m["host_blocked_ms"]["median"] >= BLOCKED_FRACTION * work_ms
        cap = captures.get(op.id, {"capturable": None, "error": "not probed"})
        rows.append({"id": op.id, "code": op.code, "group": op.group, "expected_sync": op.expected_sync,
                     "why": op.why, "version_note": op.version_note, **m, "blocks": blocks,
                     "syncs": bool(m["debug_mode_syncs"] > 0 or blocks),
                     "capturable": cap["capturable"], "capture_error": cap["error"]})
        torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return {"numel": numel, "work_ms": work_ms, "capture_numel": CAPTURE_NUMEL, "rows": rows}


QUEUED_MS = (0.0, 5.0, 10.0)


@experiment(
    "syncs.queue_probe",
    chapter=4,
    title="Does the host wait for the queue? One operation, more and more queued work",
    params=[Param("op", "item", choices=OP_IDS, help="the operation (see the catalogue)"),
            Param("numel", 4096, choices=NUMEL_CHOICES, unit="float32 elements")],
    grid={"op": list(OP_IDS), "numel": list(NUMEL_CHOICES)},
    data_schema={
        "type": "object",
        "required": ["op", "code", "queued_ms", "host_blocked_ms", "debug_mode_syncs", "slope"],
        "properties": {"queued_ms": {"type": "array", "items": {"type": "number"}, "minItems": 2},
                       "host_blocked_ms": {"type": "array", "items": STATS_SCHEMA, "minItems": 2},
                       "slope": {"type": "number"}},
    },
)
def queue_probe(op: str = "item", numel: int = 4096) -> dict[str, Any]:
    """Host time inside ``op`` (stats, ms) for each amount of GPU work queued before it
    (``queued_ms``: 0, 5 and 10 ms), and the fitted ``slope`` of blocked time against
    queued time: about 1 for an operation that waits for the queue, about 0 otherwise.
    """
    spec = get_op(op)
    check_fits("numel", 8 * numel * 4)
    gpu_sleep(1.0)
    series = host_blocked_series(spec, numel, list(QUEUED_MS))
    medians = [s["median"] for s in series]
    slope = _slope(list(QUEUED_MS), medians)
    return {"op": op, "code": spec.code, "queued_ms": list(QUEUED_MS), "host_blocked_ms": series,
            "debug_mode_syncs": count_debug_mode_syncs(spec.build(numel, torch.device("cuda"))), "slope": slope}


# ----------------------------------------------------------------- pageable copies

COPY_SIZES_KIB = (64, 256, 1024, 2048, 3072, 4096, 8192, 16384, 65536)
COPY_VARIANTS = ("pageable_non_blocking", "pageable_blocking", "pinned_non_blocking")


@experiment(
    "syncs.pageable_threshold",
    chapter=4,
    title="Host-to-device copies from pageable memory: when does the host wait?",
    params=[Param("work_ms", 30.0, choices=(10.0, 30.0), unit="ms", help="GPU work queued before each copy")],
    grid={"work_ms": [10.0, 30.0]},
    data_schema={
        "type": "object",
        "required": ["work_ms", "sizes_bytes", "variants", "threshold_bytes", "largest_staged_bytes"],
        "properties": {
            "sizes_bytes": {"type": "array", "items": {"type": "integer"}, "minItems": 2},
            "variants": {"type": "object", "required": list(COPY_VARIANTS),
                         "properties": {v: {"type": "object", "required": ["median_ms", "p10_ms", "p90_ms"]}
                                        for v in COPY_VARIANTS}},
            "threshold_bytes": {"type": ["integer", "null"]},
            "largest_staged_bytes": {"type": ["integer", "null"]},
        },
    },
)
def pageable_threshold(work_ms: float = 30.0) -> dict[str, Any]:
    """Host time (ms) of ``dst[:n].copy_(src[:n], non_blocking=...)`` into a preallocated
    CUDA buffer, with ``work_ms`` of GPU work queued first, for ``n`` in
    :data:`COPY_SIZES_KIB` and three sources: pageable with ``non_blocking=True``,
    pageable blocking, pinned with ``non_blocking=True``. ``threshold_bytes`` is the
    smallest size whose pageable ``non_blocking`` copy waited at least half the queued
    work (None if none did); ``largest_staged_bytes`` the largest size below it that did
    not.
    """
    sizes = [k * 1024 for k in COPY_SIZES_KIB]
    largest = sizes[-1]
    check_fits("copy buffer", largest)
    dst = torch.empty(largest, dtype=torch.uint8, device="cuda")
    pageable = torch.ones(largest, dtype=torch.uint8)  # written, so its pages are resident
    pinned = torch.ones(largest, dtype=torch.uint8).pin_memory()
    sources = {"pageable_non_blocking": (pageable, True), "pageable_blocking": (pageable, False),
               "pinned_non_blocking": (pinned, True)}
    gpu_sleep(work_ms)
    torch.cuda.synchronize()
    out: dict[str, dict[str, list[float]]] = {v: {"median_ms": [], "p10_ms": [], "p90_ms": []} for v in COPY_VARIANTS}
    for n in sizes:
        for name, (src, nb) in sources.items():
            s = time_host(lambda src=src, nb=nb, n=n: dst[:n].copy_(src[:n], non_blocking=nb),
                          setup=lambda: gpu_sleep(work_ms), warmup=1, repeats=3)
            out[name]["median_ms"].append(s.median)
            out[name]["p10_ms"].append(s.p10)
            out[name]["p90_ms"].append(s.p90)
    threshold, staged = copy_threshold(sizes, out["pageable_non_blocking"]["median_ms"], work_ms)
    del dst, pinned
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return {"work_ms": work_ms, "sizes_bytes": sizes, "variants": out, "threshold_bytes": threshold,
            "largest_staged_bytes": staged}


# ----------------------------------------------------------------- case study

_PHASE_MS = {"type": "object", "required": list(CASE_PHASES),
             "properties": {p: {"type": "number", "minimum": 0} for p in CASE_PHASES}}
_CASE_VARIANT = {
    "type": "object",
    "required": ["step_ms", "wall_ms_per_step", "syncs_per_step", "sync_report", "timeline"],
    "properties": {"step_ms": STATS_SCHEMA, "syncs_per_step": {"type": "integer", "minimum": 0},
                   "host_phase_ms": _PHASE_MS,
                   "timeline": {"type": "object", "required": ["host", "gpu"]}},
}


@experiment(
    "syncs.case_study",
    chapter=4,
    title="Case study: a metrics helper that hides a sync",
    params=[Param("balance", 1.0, choices=(0.5, 1.0, 2.0), unit="× host time",
                  help="GPU time of a whole step as a multiple of its host time"),
            Param("steps", 40, min=10, max=200, unit="steps", help="timed steps per variant")],
    grid={"balance": [0.5, 1.0, 2.0]},
    data_schema={
        "type": "object",
        "required": ["batch", "host_ms_per_step", "heavy_gpu_ms", "variants", "speedup"],
        # Written since the step clips and updates one tensor at a time; older recordings lack them.
        "properties": {"host_phase_ms": _PHASE_MS, "gpu_phase_ms": _PHASE_MS,
                       "gpu_ms_per_step": {"type": "number"},
                       "predicted_ms": {"type": "object", "required": ["hidden_sync", "sync_free"]},
                       "variants": {"type": "object", "required": ["hidden_sync", "sync_free"],
                                    "properties": {"hidden_sync": _CASE_VARIANT, "sync_free": _CASE_VARIANT}},
                       "speedup": {"type": "number"}},
    },
)
def case_study(balance: float = 1.0, steps: int = 40) -> dict[str, Any]:
    """Step time of a training step (MLP, per-group gradient metrics, then gradient
    clipping, AdamW and an EMA that each update one tensor at a time; :mod:`.case`)
    with the post's ``reduce_grad_stats`` (tuple index: a hidden sync) and with the column
    index kept on the device.

    The batch is chosen so that the GPU time of a whole step is ``balance`` times its
    host time. Returns ``batch``, ``host_ms_per_step`` and ``host_phase_ms`` (host time
    of the sync-free step and of each phase, GPU drained first), ``gpu_phase_ms`` (GPU
    time of each phase with its launches queued ahead; ``heavy_gpu_ms`` is the forward +
    backward one), ``gpu_ms_per_step``, ``gpu_to_host`` (the ratio reached),
    ``predicted_ms`` (the queue model, :func:`~experiments.syncs.case.predicted_step_ms`),
    per variant ``step_ms`` (stats of the GPU-side step period, ms),
    ``wall_ms_per_step``, ``host_phase_ms``, ``syncs_per_step`` (the detector, one
    step), ``sync_report`` and a three-step ``timeline``; and ``speedup`` (hidden /
    sync-free).
    """
    return run_case_study(balance, steps)


# ----------------------------------------------------------------- blind spots

BLIND_SPOT_CASES = (
    ("torch.cuda.synchronize()", "synchronize", 4096),
    ("stream.synchronize()", "stream_synchronize", 4096),
    ("event.synchronize()", "event_synchronize", 4096),
    ("loss.item()", "item", 4096),
    ("pageable to GPU, non_blocking, 16 MiB", "to_cuda_pageable_nb", 4_194_304),
    ("pageable to GPU, non_blocking, 16 KiB", "to_cuda_pageable_nb", 4096),
    ("GPU to pageable, non_blocking", "dtoh_pageable_nb", 4096),
    ("pinned to GPU, non_blocking", "to_cuda_pinned_nb", 4096),
    ("torch.full((3,), 1.0, device='cuda')", "full", 4096),
)
BLIND_SPOT_WORK_MS = 20.0


@experiment(
    "syncs.blind_spots",
    chapter=4,
    title="What set_sync_debug_mode misses, and what the book's detector adds",
    params=[],
    data_schema={
        "type": "object",
        "required": ["work_ms", "cases"],
        "properties": {"cases": {"type": "array", "minItems": len(BLIND_SPOT_CASES), "items": {
            "type": "object",
            "required": ["label", "op", "numel", "debug_mode_syncs", "detector_syncs", "detector_kinds",
                         "host_blocked_ms"]}}},
    },
)
def blind_spots() -> dict[str, Any]:
    """For each case of :data:`BLIND_SPOT_CASES`: syncs reported by the debug mode alone
    and by the book's detector (with the kinds), and the host time inside the call (stats,
    ms) with 20 ms of GPU work queued first: the evidence of whether it really waited.
    """
    gpu_sleep(BLIND_SPOT_WORK_MS)
    torch.cuda.synchronize()
    cases = []
    for label, op_id, numel in BLIND_SPOT_CASES:
        m = measure_op(get_op(op_id), numel, BLIND_SPOT_WORK_MS)
        cases.append({"label": label, "op": op_id, "numel": numel, **m})
    torch.cuda.empty_cache()
    return {"work_ms": BLIND_SPOT_WORK_MS, "cases": cases}


# ----------------------------------------------------------------- claims

CATALOGUE_SYNCING = ("item", "mask_index", "nonzero", "tensor_list")
CATALOGUE_QUIET = ("masked_fill", "where_3arg", "full", "to_cuda_pinned_nb")


@claim("syncs.catalogue", chapter=4, experiment="syncs.catalogue", source=POST,
       statement=".item(), boolean-mask indexing, nonzero and torch.tensor(list, device='cuda') are detected as "
                 "syncing; masked_fill, three-argument where, torch.full and a pinned non_blocking copy are not")
def _claim_catalogue(d: Mapping[str, Any]) -> tuple[bool, dict[str, Any]]:
    rows = {r["id"]: r for r in d["rows"]}
    measured = {k: rows[k]["debug_mode_syncs"] for k in CATALOGUE_SYNCING + CATALOGUE_QUIET}
    holds = (all(measured[k] >= 1 for k in CATALOGUE_SYNCING)
             and all(measured[k] == 0 for k in CATALOGUE_QUIET))
    return holds, {f"{rows[k]['code']}: debug-mode warnings": v for k, v in measured.items()}


@claim("syncs.pageable_htod_blocks", chapter=4, experiment="syncs.pageable_threshold", source=POST,
       statement="With GPU work queued, a pageable host-to-device copy keeps the host waiting at least 80 % of "
                 "the queued GPU time (blocking: at every size; non_blocking: at 64 MiB)")
def _claim_pageable(d: Mapping[str, Any]) -> tuple[bool, dict[str, Any]]:
    work = d["work_ms"]
    blocking = min(d["variants"]["pageable_blocking"]["median_ms"]) / work
    nb_largest = d["variants"]["pageable_non_blocking"]["median_ms"][-1] / work
    t = d["threshold_bytes"]
    return (blocking >= 0.8 and nb_largest >= 0.8), {
        "queued GPU work (ms)": work, "blocking copy: shortest wait / queued": blocking,
        f"non_blocking {d['sizes_bytes'][-1] / 2**20:g} MiB: wait / queued": nb_largest,
        "non_blocking starts waiting at (MiB)": None if t is None else t / 2**20}


@claim("syncs.debug_mode_blind_spot", chapter=4, experiment="syncs.blind_spots", source=POST,
       statement="set_sync_debug_mode does not report torch.cuda.synchronize(); the book's detector does")
def _claim_blind_spot(d: Mapping[str, Any]) -> tuple[bool, dict[str, Any]]:
    case = next(c for c in d["cases"] if c["op"] == "synchronize")
    return (case["debug_mode_syncs"] == 0 and case["detector_syncs"] >= 1), {
        "debug mode warnings": case["debug_mode_syncs"], "detector syncs": case["detector_syncs"],
        "host blocked (ms)": case["host_blocked_ms"]["median"], "queued (ms)": d["work_ms"]}


@claim("syncs.case_study_speedup", chapter=4, experiment="syncs.case_study", source=POST,
       statement="Removing the hidden sync makes the training step at least 15 % faster")
def _claim_case_study(d: Mapping[str, Any]) -> tuple[bool, dict[str, Any]]:
    hidden, free = d["variants"]["hidden_sync"], d["variants"]["sync_free"]
    holds = d["speedup"] >= 1.15 and hidden["syncs_per_step"] >= 1 and free["syncs_per_step"] == 0
    return holds, {"with the hidden sync (ms/step)": hidden["step_ms"]["median"],
                   "sync-free (ms/step)": free["step_ms"]["median"], "speedup": d["speedup"],
                   "syncs per step (hidden, free)": [hidden["syncs_per_step"], free["syncs_per_step"]]}


def _off(model: float, measured: float) -> str:
    """'7% above', '12% below' or 'within 1% of': a model's figure against a measured one."""
    rel = model / measured - 1
    return "within 1% of" if abs(rel) < 0.01 else f"{abs(rel):.0%} {'above' if rel > 0 else 'below'}"


def describe_case_study(result: Any) -> str:
    """The case study's numbers in a few sentences, from a ``syncs.case_study`` result.

    Recordings made before the step's phases were recorded give the step times only.
    """
    d = result.data if hasattr(result, "data") else result
    hidden, free = (d["variants"][v]["step_ms"]["median"] for v in ("hidden_sync", "sync_free"))
    lines = [f"Time per step: {hidden:.1f} ms with the hidden sync, {free:.1f} ms without it: "
             f"{d['speedup']:.2f}x faster (batch {d['batch']:,})."]
    host, gpu = d.get("host_phase_ms"), d.get("gpu_phase_ms")
    if host and gpu:
        fb, met, upd = CASE_PHASES
        model = d.get("predicted_ms") or predicted_step_ms(host, gpu)
        lines += [
            f"Before the sync the GPU has {gpu[fb] + gpu[met]:.1f} ms of forward, backward and metrics to run; "
            f"after it the host spends {host[upd]:.1f} ms issuing the update loops, which need {gpu[upd]:.1f} ms "
            "of GPU time.",
            f"Sync-free, the step needs {sum(host.values()):.1f} ms of host and {sum(gpu.values()):.1f} ms of "
            "GPU time.",
            f"The queue model predicts {model['hidden_sync']:.1f} ms with the sync ({_off(model['hidden_sync'], hidden)} "
            f"the measured {hidden:.1f} ms) and {model['sync_free']:.1f} ms without it "
            f"({_off(model['sync_free'], free)} the measured {free:.1f} ms).",
        ]
    # One sentence a line, not wrapped: the page or notebook wraps to its own width.
    return "\n".join(lines)




# ----------------------------------------------------------------- the detector on a page

def _report_lines(lines: list[str]) -> list[str]:
    """Detector report lines, each split into 'what, where' and the line of code below it."""
    out = []
    for i, line in enumerate(lines, 1):
        m = re.match(r"^(.*? in [^:\s]+): (.*)$", line)
        out += [f"  {i}. {m.group(1)}", f"       {m.group(2)}"] if m else [f"  {i}. {line}"]
    return out


def find_hidden_syncs() -> str:
    """Run one case-study step under the detector and return its report.

    Live on a GPU (builds a small step); without one, the report recorded on the lab GPU.
    """
    if has_cuda():
        from .case import TrainingStep

        ts = TrainingStep(device=torch.device("cuda", torch.cuda.current_device()), layers=4, batch=64)
        ts.step(reduce_grad_stats)
        torch.cuda.synchronize()
        with SyncDetector("report") as det:
            ts.step(reduce_grad_stats)
        torch.cuda.synchronize()
        lines = [str(e) for e in det.events]
        head = "Live, on this GPU:"
    else:
        r = run("syncs.case_study")
        lines = r["variants"]["hidden_sync"]["sync_report"]
        head = r.caption() + ":"
    count = f"{len(lines)} host-device sync{'s' if len(lines) != 1 else ''} detected in one step"
    return "\n".join([head, count + (":" if lines else ".")] + _report_lines(lines))
