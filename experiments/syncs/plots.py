"""Chapter 4 figures and tables, drawn from experiment results (live or recorded).

Every figure carries its provenance (:func:`experiments.core.plotting.stamp`); times are in
ms, sizes in KiB/MiB.
"""
from __future__ import annotations

from typing import Any

from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator
from matplotlib.transforms import blended_transform_factory

from ..core.tables import Table
from ..core.plotting import (MIN_FONT_PT, PALETTE, figure_function, is_narrow, legend_below, new_figure, pick, stamp,
                             stream_lanes)
from ..core.registry import Result

SYNC_RED = "#b5403a"
IDLE_GREY = "#dde1e6"
HOST_COLORS = {"python": PALETTE[1], "launch": PALETTE[7], "sync": SYNC_RED}
VARIANT_LABELS = {"none": "no sync", "once": "loss.item() once", "every_step": "loss.item() every step"}
PHASE_COLORS = {"forward + backward": PALETTE[0], "metrics": SYNC_RED, "clip, optimizer, EMA": PALETTE[1],
                "optimizer + EMA": PALETTE[1]}  # the last one: recordings from before clipping was added
CASE_LABELS = {"hidden_sync": "with the hidden sync", "sync_free": "sync removed"}
COPY_LABELS = {"pageable_non_blocking": "pageable, non_blocking=True", "pageable_blocking": "pageable, blocking",
               "pinned_non_blocking": "pinned, non_blocking=True"}
ROW_COLORS = {"reported": SYNC_RED, "missed": PALETTE[4], "quiet": PALETTE[2]}




# ----------------------------------------------------------------- run-ahead

def _gaps(intervals: list[dict[str, float]]) -> list[dict[str, Any]]:
    """Idle intervals between consecutive GPU intervals."""
    out = []
    for a, b in zip(intervals, intervals[1:]):
        if b["start_ms"] > a["end_ms"]:
            out.append({"start_ms": a["end_ms"], "end_ms": b["start_ms"], "color": IDLE_GREY})
    return out


@figure_function
def plot_run_ahead(result: Result) -> Figure:
    """Host and GPU lanes for the three run-ahead variants (ms on a shared axis).

    Host: Python work (orange), launches (grey), waiting in ``.item()`` (red). GPU:
    each step's kernel (blue, numbered) and idle gaps (light grey).
    """
    d = result.data
    fig, axes = new_figure(3, 1, width=8.0, height=6.0, sharex=True)
    for ax, name in zip(axes, ("none", "once", "every_step")):
        v = d["variants"][name]
        host = [{"start_ms": iv["start_ms"], "end_ms": iv["end_ms"], "color": HOST_COLORS[iv["kind"]],
                 "label": "wait" if iv["kind"] == "sync" and iv["end_ms"] - iv["start_ms"] > 1.0 else ""}
                for iv in v["host"]]
        gpu = [{"start_ms": iv["start_ms"], "end_ms": iv["end_ms"], "color": PALETTE[0], "label": str(i + 1)}
               for i, iv in enumerate(v["gpu"])]
        stream_lanes({"host": host, "GPU": _gaps(v["gpu"]) + gpu}, ax=ax,
                     title=(f"{VARIANT_LABELS[name]}: GPU done at {v['end_ms']:.1f} ms, idle {v['gpu_idle_ms']:.1f} ms;"
                            f" host waited {v['host_blocked_ms']:.1f} ms"))
        if ax is not axes[-1]:
            ax.set_xlabel("")
    handles = [Patch(color=HOST_COLORS["python"], label="host: Python work"),
               Patch(color=HOST_COLORS["launch"], label="host: launch"),
               Patch(color=SYNC_RED, label="host: waiting in .item()"),
               Patch(color=PALETTE[0], label="GPU: step's kernels"), Patch(color=IDLE_GREY, label="GPU: idle")]
    fig.legend(handles=handles, loc="outside upper center", ncol=pick(5, 2), fontsize=8,
               title=(f"{result.params['host_ms']:g} ms of host work and {result.params['gpu_ms']:g} ms of GPU "
                      f"work per step, {d['steps']} steps"), title_fontsize=10)
    return stamp(fig, result)


def run_ahead_table(result: Result) -> Table:
    """Measured end times of the three run-ahead variants next to the queue model's (ms)."""
    from .model import predicted_run_ahead_ms

    d = result.data
    model = predicted_run_ahead_ms(result.params["host_ms"], result.params["gpu_ms"], d["steps"])
    rows = []
    for name in ("none", "once", "every_step"):
        v = d["variants"][name]
        rows.append([VARIANT_LABELS[name], f"{v['end_ms']:.1f}", f"{model[name]:.1f}", f"{v['gpu_idle_ms']:.1f}",
                     f"{v['host_blocked_ms']:.1f}"])
    return Table(["variant", "GPU done at (ms)", "queue model (ms)", "GPU idle (ms)", "host waited (ms)"],
                     rows, caption=result.caption())


# ----------------------------------------------------------------- catalogue

def _row_class(row: dict[str, Any]) -> str:
    if row["debug_mode_syncs"] > 0:
        return "reported"
    return "missed" if row["blocks"] else "quiet"


def _capture_text(value: Any) -> str:
    return {True: "captures", False: "fails", None: "?"}[value]


@figure_function
def plot_catalogue(result: Result) -> Figure:
    """Host wait (ms, median with p10-p90) of every operation, with GPU work queued first.

    Colour: reported by ``set_sync_debug_mode`` (red), waited without being reported
    (purple), no wait (green). The dashed line is the queued GPU work; the right column
    says whether the operation could be captured in a CUDA graph.
    """
    d = result.data
    rows = d["rows"]
    narrow = is_narrow()
    # Narrow: each operation's code on a line of its own above its bar (beside the bar, the
    # code would leave the bars no width), and whether it captures at the bar's right end.
    fig, ax = new_figure(width=8.5, height=0.24 * len(rows) + 1.6, narrow_height=0.4 * len(rows) + 2.2)
    ys = list(range(len(rows)))
    med = [r["host_blocked_ms"]["median"] for r in rows]
    err = [[m - r["host_blocked_ms"]["p10"] for m, r in zip(med, rows)],
           [r["host_blocked_ms"]["p90"] - m for m, r in zip(med, rows)]]
    err = [[max(0.0, e) for e in side] for side in err]
    # A log scale shows the microsecond calls next to the full-queue waits.
    ax.set_xscale("log")
    bar_ys = [y + 0.2 for y in ys] if narrow else ys
    ax.barh(bar_ys, med, xerr=err, color=[ROW_COLORS[_row_class(r)] for r in rows], height=0.36 if narrow else 0.7,
            capsize=2)
    lo = min(0.005, 0.5 * min(med))
    top = max([r["host_blocked_ms"]["p90"] for r in rows] + [d["work_ms"]])
    # narrow: the longest bar ends at 68 % of the width, leaving room for 'graph: captures'
    ax.set_xlim(lo, lo * (top / lo) ** (1 / 0.68) if narrow else 3 * max(max(med), d["work_ms"]))
    ax.axvline(d["work_ms"], color="#555555", linestyle="--", linewidth=1)
    ax.invert_yaxis()
    label_at = blended_transform_factory(ax.transAxes, ax.transData)
    if narrow:
        ax.set_yticks([])
        ax.set_ylim(len(rows) - 0.45, -0.6)
        for y, r in zip(ys, rows):
            ax.text(0.012, y - 0.22, r["code"], transform=label_at, ha="left", va="center", fontsize=MIN_FONT_PT,
                    family="monospace", bbox=dict(boxstyle="square,pad=0.1", fc="white", ec="none", alpha=0.9))
            ax.text(1.0, y + 0.2, f"graph: {_capture_text(r['capturable'])}", transform=label_at, ha="right",
                    va="center", fontsize=MIN_FONT_PT, color="#444444")
    else:
        ax.set_yticks(ys)
        ax.set_yticklabels([r["code"] for r in rows], fontsize=MIN_FONT_PT, family="monospace")
        for y, r in zip(ys, rows):
            ax.annotate(f"graph: {_capture_text(r['capturable'])}", (1.0, y), xycoords=("axes fraction", "data"),
                        xytext=(4, 0), textcoords="offset points", va="center", fontsize=MIN_FONT_PT, color="#444444")
    ax.set_xlabel(f"host waits in the call (ms, log scale); {d['work_ms']:g} ms of GPU work queued before it")
    ax.grid(axis="y", visible=False)
    for y in range(1, len(rows)):
        if rows[y]["group"] != rows[y - 1]["group"]:
            ax.axhline(y - 0.5, color="#999999", linewidth=0.6)
    handles = [Patch(color=ROW_COLORS["reported"], label="reported by set_sync_debug_mode"),
               Patch(color=ROW_COLORS["missed"], label="waited, not reported"),
               Patch(color=ROW_COLORS["quiet"], label="no wait")]
    fig.legend(handles=handles, loc="outside upper center", ncol=pick(3, 1), fontsize=8,
               title=f"Which operations make the host wait ({d['numel']:,} float32 elements per tensor)",
               title_fontsize=10)
    return stamp(fig, result)


def catalogue_table(result: Result) -> Table:
    """The catalogue as a table, folded: one row per operation under its group, the
    measured columns and the mechanism."""
    d = result.data
    rows, hi, groups = [], [], []
    for r in d["rows"]:
        extra = [k for k in r.get("detector_kinds", []) if k != "debug_mode"]
        detector = f"{r['detector_syncs']}" + (f" ({', '.join(extra)})" if extra else "")
        why = r["why"] + (f"; {r['version_note']}" if r.get("version_note") else "")
        rows.append([r["code"], r["debug_mode_syncs"], detector, f"{r['host_blocked_ms']['median']:.2f}",
                     _capture_text(r["capturable"]), why])
        hi.append(bool(r["syncs"]))
        groups.append(r["group"])
    cols = ["operation", "debug mode", "detector", "host wait (ms)", "CUDA graph", "why"]
    return Table(cols, rows, highlight=hi, groups=groups, code_columns=(0,),
                     caption=(f"{result.caption()}. Host wait: median, with {d['work_ms']:g} ms of GPU work queued "
                              "first. Shaded rows made the host wait or were reported."),
                     summary=f"The catalogue as a table: {len(rows)} operations and why each does or does not sync")


@figure_function
def plot_queue_probe(result: Result) -> Figure:
    """Host wait inside one operation (ms) against GPU work queued before it (ms)."""
    d = result.data
    fig, ax = new_figure(width=6.0, height=3.4)
    q = d["queued_ms"]
    med = [s["median"] for s in d["host_blocked_ms"]]
    err = [[max(0.0, m - s["p10"]) for m, s in zip(med, d["host_blocked_ms"])],
           [max(0.0, s["p90"] - m) for m, s in zip(med, d["host_blocked_ms"])]]
    ax.plot([0, max(q)], [0, max(q)], "--", color="#888888", label="waits for the whole queue")
    ax.errorbar(q, med, yerr=err, fmt="o-", capsize=3, color=PALETTE[0], label="measured (median, p10-p90)")
    ax.set_xlabel("GPU work queued before the call (ms)")
    ax.set_ylabel("host waits in the call (ms)")
    verdict = "waits for the queue" if d["slope"] > 0.5 else "does not wait"
    ax.set_title(f"{d['code']}: slope {d['slope']:.2f}, {verdict}; debug mode: {d['debug_mode_syncs']} warning(s)",
                 fontsize=9)
    ax.legend(loc="upper left", fontsize=8)
    return stamp(fig, result)


# ----------------------------------------------------------------- pageable copies

@figure_function
def plot_pageable_threshold(result: Result) -> Figure:
    """Host wait (ms) of host-to-device copies against size (log scale), three sources."""
    d = result.data
    fig, ax = new_figure(width=7.0, height=3.6)
    mib = [s / 2**20 for s in d["sizes_bytes"]]
    colors = {"pageable_blocking": PALETTE[1], "pinned_non_blocking": PALETTE[2], "pageable_non_blocking": PALETTE[3]}
    for name, color in colors.items():  # the pageable non_blocking line last, on top where they coincide
        v = d["variants"][name]
        err = [[max(0.0, m - lo) for m, lo in zip(v["median_ms"], v["p10_ms"])],
               [max(0.0, hi - m) for m, hi in zip(v["median_ms"], v["p90_ms"])]]
        ax.errorbar(mib, v["median_ms"], yerr=err, fmt="o-" if name != "pageable_non_blocking" else "s--",
                    capsize=2, color=color, label=COPY_LABELS[name])
    ax.axhline(d["work_ms"], color="#555555", linestyle="--", linewidth=1, label="GPU work queued before the copy")
    t, s = d.get("threshold_bytes"), d.get("largest_staged_bytes")
    if t is not None and s is not None:
        ax.axvspan(s / 2**20, t / 2**20, color=PALETTE[3], alpha=0.12, label="the driver starts draining here")
    ax.set_xscale("log", base=2)
    ax.set_xticks(mib)
    every = pick(1, 2)  # the narrow axes name every other size
    ax.set_xticklabels([(f"{m * 1024:.0f} KiB" if m < 1 else f"{m:g} MiB") if k % every == 0 else ""
                        for k, m in enumerate(mib)], fontsize=MIN_FONT_PT, rotation=45, ha="right")
    ax.minorticks_off()
    ax.set_xlabel("copy size")
    ax.set_ylabel("host waits in the call (ms)")
    where = "no size in the sweep" if t is None else f"{t / 2**20:g} MiB"
    ax.set_title(f"Host-to-device copies behind {d['work_ms']:g} ms of GPU work: "
                 f"non_blocking pageable copies wait from {where}", fontsize=9)
    legend_below(ax, fontsize=MIN_FONT_PT, ncol=pick(2, 1))  # inside, the curves cross it
    return stamp(fig, result)


# ----------------------------------------------------------------- case study

@figure_function
def plot_case_study(result: Result) -> Figure:
    """Median time per step (ms, p10-p90) with the hidden sync and without it, next to
    the step's host time and GPU time and the queue model's prediction (when recorded)."""
    d = result.data
    names = ("hidden_sync", "sync_free")
    steps = [d["variants"][n]["step_ms"] for n in names]
    fig, ax = new_figure(width=6.4, height=4.0)
    xs = list(range(len(names)))
    med = [s["median"] for s in steps]
    err = [[max(0.0, m - s["p10"]) for m, s in zip(med, steps)], [max(0.0, s["p90"] - m) for m, s in zip(med, steps)]]
    ax.bar(xs, med, yerr=err, capsize=4, width=0.55, color=[SYNC_RED, PALETTE[2]], label="measured (median, p10-p90)")
    model = d.get("predicted_ms")
    marks = [model[n] for n in names] if model else [0.0] * len(names)
    if model:
        ax.scatter(xs, marks, marker="D", s=30, color="#222222", zorder=3, label="queue model")
    # The value goes above the error bar and the model's marker alike, so that neither hides it.
    for x, m, s, mark in zip(xs, med, steps, marks):
        ax.annotate(f"{m:.1f} ms", (x, max(m, s["p90"], mark)), xytext=(0, 6), textcoords="offset points",
                    ha="center", va="bottom", fontsize=9)
    ax.axhline(d["host_ms_per_step"], color=PALETTE[1], linestyle="--", linewidth=1.2,
               label="host time per step (sync-free)")
    if d.get("gpu_ms_per_step"):
        ax.axhline(d["gpu_ms_per_step"], color=PALETTE[0], linestyle=":", linewidth=1.5, label="GPU time per step")
    ax.set_xticks(xs)
    ax.set_xticklabels([CASE_LABELS[n] for n in names])
    ax.set_xlim(-0.6, len(names) - 0.4)
    ax.set_ylim(0, 1.3 * max(max(s["p90"] for s in steps), max(marks), d["host_ms_per_step"],
                             d.get("gpu_ms_per_step") or 0))
    ax.set_ylabel("time per training step (ms)")
    ax.grid(axis="x", visible=False)
    ax.set_title(f"{d['speedup']:.2f}x faster without the sync (batch {d['batch']:,})", fontsize=10)
    legend_below(ax, ncol=pick(2, 1), fontsize=8)
    return stamp(fig, result)


def case_study_table(result: Result) -> Table:
    """Host and GPU time of each phase of the step (ms), the measured step times and the
    queue model's. Recordings made before the phases were recorded give the totals only."""
    from .case import predicted_step_ms

    d = result.data
    host, gpu = d.get("host_phase_ms"), d.get("gpu_phase_ms")
    rows = []
    if host and gpu:
        for phase in host:
            rows.append([phase, f"{host[phase]:.2f}", f"{gpu[phase]:.2f}"])
        rows.append(["whole step", f"{sum(host.values()):.2f}", f"{sum(gpu.values()):.2f}"])
        model = d.get("predicted_ms") or predicted_step_ms(host, gpu)
    else:
        rows.append(["whole step", f"{d['host_ms_per_step']:.2f}", f"forward + backward: {d['heavy_gpu_ms']:.2f}"])
        model = None
    for name in ("sync_free", "hidden_sync"):
        v = d["variants"][name]
        predicted = f", model {model[name]:.2f}" if model else ""
        rows.append([f"time per step, {CASE_LABELS[name]}", "", f"measured {v['step_ms']['median']:.2f}{predicted}"])
    return Table(["phase", "host (ms)", "GPU (ms)"], rows,
                     caption=(f"{result.caption()}. Host: sync-free step, GPU drained first. GPU: the phase's "
                              "kernels queued behind other work, so that launches cost nothing."))


@figure_function
def plot_case_study_timeline(result: Result) -> Figure:
    """Host and GPU lanes of three consecutive steps, with and without the hidden sync (ms).

    Intervals are the step's phases between marks: on the host, the time spent issuing
    (or, in 'metrics', waiting); on the GPU, the time between reaching one mark and the
    next, which includes any idle time while kernels trickle in.
    """
    d = result.data
    fig, axes = new_figure(2, 1, width=8.0, height=4.4, sharex=True)
    phases: list[str] = []
    for ax, name in zip(axes, ("hidden_sync", "sync_free")):
        tl = d["variants"][name]["timeline"]
        for iv in tl["host"]:
            if iv["phase"] not in phases:
                phases.append(iv["phase"])

        def lane(ivs: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [{"start_ms": iv["start_ms"], "end_ms": max(iv["start_ms"], iv["end_ms"]),
                     "color": PHASE_COLORS.get(iv["phase"], PALETTE[7])} for iv in ivs]

        stream_lanes({"host": lane(tl["host"]), "GPU": lane(tl["gpu"])}, ax=ax,
                     title=f"{CASE_LABELS[name]}: {d['variants'][name]['step_ms']['median']:.2f} ms per step")
        if ax is not axes[-1]:
            ax.set_xlabel("")
    fig.legend(handles=[Patch(color=PHASE_COLORS.get(p, PALETTE[7]), label=p) for p in phases],
               loc="outside upper center", ncol=pick(3, 2), fontsize=8)
    return stamp(fig, result)


# ----------------------------------------------------------------- blind spots

@figure_function
def plot_blind_spots(result: Result) -> Figure:
    """Syncs reported by the debug mode alone and by the book's detector, per case (counts).

    Above each pair: how long the host really waited with GPU work queued (ms). Labels
    in red mark waits the debug mode did not report.
    """
    d = result.data
    cases = d["cases"]
    if is_narrow():
        return _blind_spots_rows(result)
    fig, ax = new_figure(width=9.0, height=4.2)
    xs = list(range(len(cases)))
    dm = [c["debug_mode_syncs"] for c in cases]
    det = [c["detector_syncs"] for c in cases]
    ax.bar([x - 0.2 for x in xs], dm, width=0.4, color=PALETTE[7], label="set_sync_debug_mode('warn')")
    ax.bar([x + 0.2 for x in xs], det, width=0.4, color=PALETTE[0], label="the book's detector")
    top = max(dm + det + [1])
    for x, c in zip(xs, cases):
        waited = c["host_blocked_ms"]["median"]
        ax.annotate(f"waited\n{waited:.1f} ms", (x, top * 1.05), ha="center", va="bottom", fontsize=MIN_FONT_PT,
                    color=SYNC_RED if _missed(c, d) else "#444444")
    ax.set_ylim(0, top * 1.45)
    ax.set_xticks(xs)
    ax.set_xticklabels([c["label"] for c in cases], rotation=30, ha="right", fontsize=MIN_FONT_PT)
    ax.set_ylabel("syncs reported (count)")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(f"Reported syncs against real waits ({d['work_ms']:g} ms of GPU work queued)", fontsize=10)
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(axis="x", visible=False)
    return stamp(fig, result)


def _missed(case: dict[str, Any], d: dict[str, Any]) -> bool:
    """The host waited (half the queued work or more) and the debug mode said nothing."""
    return case["debug_mode_syncs"] == 0 and case["host_blocked_ms"]["median"] >= 0.5 * d["work_ms"]


def _blind_spots_rows(result: Result) -> Figure:
    """The narrow form of :func:`plot_blind_spots`: one row per case, its label and wait on a
    line above its two bars (counts along x)."""
    d = result.data
    cases = d["cases"]
    fig, ax = new_figure(height=0.62 * len(cases) + 1.8)
    ys = list(range(len(cases)))
    dm = [c["debug_mode_syncs"] for c in cases]
    det = [c["detector_syncs"] for c in cases]
    ax.barh([y + 0.03 for y in ys], dm, height=0.21, color=PALETTE[7], label="set_sync_debug_mode('warn')")
    ax.barh([y + 0.27 for y in ys], det, height=0.21, color=PALETTE[0], label="the book's detector")
    label_at = blended_transform_factory(ax.transAxes, ax.transData)
    for y, c, a, b in zip(ys, cases, dm, det):
        for value, at in ((a, y + 0.03), (b, y + 0.27)):  # the count, so that a 0 shows too
            ax.annotate(f"{value}", (value, at), xytext=(3, 0), textcoords="offset points", va="center",
                        fontsize=MIN_FONT_PT, color="#444444")
        if y:
            ax.axhline(y - 0.55, color="#dddddd", linewidth=0.8)
        ax.text(0.012, y - 0.25, c["label"], transform=label_at, ha="left", va="center", fontsize=MIN_FONT_PT)
        ax.text(1.0, y - 0.25, f"waited {c['host_blocked_ms']['median']:.1f} ms", transform=label_at, ha="right",
                va="center", fontsize=MIN_FONT_PT, color=SYNC_RED if _missed(c, d) else "#444444")
    ax.set_yticks([])
    ax.set_ylim(len(cases) - 0.5, -0.55)
    ax.set_xlim(0, max(dm + det + [1]) * 1.2)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("syncs reported (count)")
    ax.set_title(f"Reported syncs against real waits ({d['work_ms']:g} ms of GPU work queued)", fontsize=10)
    legend_below(ax, fontsize=8, ncol=1)
    ax.grid(axis="y", visible=False)
    return stamp(fig, result)


def blind_spot_table(result: Result) -> Table:
    """The blind-spot cases as a table: what each detector reported, and the real wait."""
    d = result.data
    rows, hi = [], []
    for c in d["cases"]:
        waited = c["host_blocked_ms"]["median"]
        rows.append([c["label"], c["debug_mode_syncs"], c["detector_syncs"], ", ".join(c["detector_kinds"]) or "-",
                     f"{waited:.2f}"])
        hi.append(c["debug_mode_syncs"] == 0 and waited >= 0.5 * d["work_ms"])
    return Table(["case", "debug mode", "detector", "detector's kinds", f"host waits (ms of {d['work_ms']:g})"],
                     rows, caption=f"{result.caption()}. Shaded: the host waited and the debug mode said nothing.",
                     highlight=hi)
