"""Figures and tables of chapter 2's FSDP section. Each takes a
:class:`~experiments.core.registry.Result` of ``streams.fsdp_runahead`` or ``streams.fsdp_step``
(and, for the replay table, the doctor's :class:`~experiments.doctor.Run` of the step's
snapshot, made by the caller through ``experiments.doctor``). Memory in MiB, times in ms.
"""
from __future__ import annotations

from typing import Any, Sequence

from ..core.plotting import MIN_FONT_PT, PALETTE, figure_function, is_narrow, legend_below, new_figure, pick, stamp
from ..core.registry import Result
from ..core.tables import Table
from ..core.units import mib

GRAY = "#6b6b6b"
VERSION_STYLE = {  # label, color, marker
    "fsdp2": ("FSDP2", PALETTE[2], "o"),
    "fsdp1": ("FSDP1, limit_all_gathers=True", PALETTE[1], "s"),
    "fsdp1_nolimit": ("FSDP1, limit_all_gathers=False", PALETTE[3], "^"),
}
PROGRAM_STYLE = {"record_stream": ("this chapter's record_stream program", PALETTE[4], "--"),
                 "event": ("this chapter's event handoff", PALETTE[0], "--")}
GROUP_TITLE = {"nccl": "NCCL, one rank (world size 1)", "fake": "torch's fake process group, world size 2"}
GROUP_SHORT = {"nccl": "NCCL, 1 rank", "fake": "fake group, 2 ranks"}
PHASE_LABELS = (("backward", "backward"), ("optimizer", "optimizer"), ("enqueued", "host done"), ("done", "GPU done"))


def _order(d: dict[str, Any]) -> list[int]:
    """Point indices from the smallest run-ahead to the largest."""
    return sorted(range(len(d["points"])), key=lambda k: d["points"][k]["runahead_ms"])


def _point_label(pt: dict[str, Any]) -> str:
    return f"{pt['gpu_ms']:g} / {pt['host_delay_ms']:g}"


@figure_function
def plot_fsdp_runahead(result: Result) -> Any:
    """Two panels over the run-ahead points (GPU work / host delay per layer, ms): the
    training step's peak active bytes above its start (MiB) for each FSDP version (and, at
    world size 1, the chapter's own record_stream and event programs on buffers of one
    layer's parameters), and the most bytes parked at once on ``record_stream`` events."""
    d = result.data
    order = _order(d)
    xs = list(range(len(order)))
    fig, (a0, a1) = new_figure(1, 2, width=10.5, height=4.2)
    for v, (label, color, marker) in VERSION_STYLE.items():
        s = d["versions"][v]
        a0.plot(xs, [mib(s["peak_active_bytes"][k]) for k in order], marker=marker, color=color, label=label)
        a1.plot(xs, [mib(s["max_parked_bytes"][k]) for k in order], marker=marker, color=color, label=label)
    for s, (label, color, ls) in PROGRAM_STYLE.items():
        if "program" in d:
            a0.plot(xs, [mib(d["program"][s]["peak_active_bytes"][k]) for k in order], ls, color=color,
                    marker=".", label=label)
    every = d["layers"] * mib(d["param_bytes"])
    a1.axhline(every, color=GRAY, linestyle=":", linewidth=1)
    a1.annotate(f"all {d['layers']} layers' {d['param_dtype']} parameters", (0.02, every),
                xycoords=("axes fraction", "data"), ha="left", va="bottom", fontsize=MIN_FONT_PT, color=GRAY)
    for ax in (a0, a1):
        ax.set_xticks(xs)
        ax.set_xticklabels([_point_label(d["points"][k]) for k in order])
        ax.set_xlabel("GPU work / host delay per layer (ms): run-ahead grows to the right")
    a0.set_ylabel("peak active above start (MiB)")
    a1.set_ylabel("most bytes parked at once (MiB)")
    a0.set_title("Peak memory of one training step")
    a1.set_title("Frees held back by record_stream events")
    a1.set_ylim(bottom=0, top=max(a1.get_ylim()[1], every * 1.15))
    fig.suptitle(f"{d['layers']} layers × {mib(d['layer_bytes']):g} MiB, {GROUP_TITLE[d['group']]}",
                 fontsize=pick(11, 9))
    handles, labels = a0.get_legend_handles_labels()
    legend_below(a1 if is_narrow() else a0, handles=handles, labels=labels, fontsize=8, ncol=pick(2, 1))
    return stamp(fig, result)


def _stream_order(names: Sequence[str]) -> list[str]:
    return sorted(names, key=lambda s: (not s.startswith("compute"), s))


@figure_function
def plot_fsdp_step(result: Result) -> Any:
    """One panel per CUDA stream that allocated in the measured step, over the host time of
    the allocator's calls (ms after the step began): bytes of the stream's blocks in flight
    above the step's start, and the part of them parked on ``record_stream`` events; dashed
    lines mark where the host began backward and the optimizer, finished enqueueing, and
    where the GPU finished; the shaded span is the GPU catching up with the host."""
    d = result.data
    tl = d["timeline"]
    names = _stream_order(list(tl["streams"]))
    n = max(len(names), 1)
    fig, axes = new_figure(n, 1, width=9.0, height=1.0 + 1.25 * n, sharex=True, squeeze=False,
                           narrow_height=1.2 + 1.5 * n)
    axes = [row[0] for row in axes]
    bins = max((len(ser["mib"]) for ser in tl["streams"].values()), default=1)
    edges = [b * tl["bin_ms"] for b in range(bins + 1)]
    for ax, s in zip(axes, names):
        ser = tl["streams"][s]
        u = d["streams"].get(s, {})
        live, parked = list(ser["mib"]), list(ser["parked_mib"])
        ax.stairs(live, edges, fill=True, color=PALETTE[0], alpha=0.35, label="in flight")
        ax.stairs(parked, edges, fill=True, color=PALETTE[3], alpha=0.85, label="parked on events")
        ax.set_ylabel("MiB", fontsize=MIN_FONT_PT + 1)
        ax.set_ylim(0, max(live + parked + [1.0]) * 1.25)
        ax.set_title(f"{s} stream: {u.get('allocs', 0)} allocations, {u.get('deferred_frees', 0)} frees deferred",
                     fontsize=pick(9, 8), loc="left")
        for key, _ in PHASE_LABELS:
            x = d["phases_ms"].get(key)
            if x is not None:
                ax.axvline(x, color=GRAY, linestyle="--", linewidth=0.8)
        if "enqueued" in d["phases_ms"] and "done" in d["phases_ms"]:
            ax.axvspan(d["phases_ms"]["enqueued"], d["phases_ms"]["done"], color=GRAY, alpha=0.07, linewidth=0)
    top, last = axes[0], None
    for key, label in PHASE_LABELS:
        x = d["phases_ms"].get(key)
        # labels of marks closer than 5 % of the axis would cover each other: the first one speaks
        if x is not None and (last is None or x - last > 0.05 * edges[-1]):
            top.annotate(label, (x, 1.0), xycoords=("data", "axes fraction"), rotation=90, va="top", ha="right",
                         fontsize=MIN_FONT_PT, color="#555555",
                         bbox=dict(boxstyle="round,pad=0.1", fc="white", ec="none", alpha=0.85))
            last = x
    axes[-1].set_xlabel("host time of the allocator call (ms after the step began)")
    axes[-1].set_xlim(0, edges[-1])
    # one line for what ran, one for what it did: a long first line would wrap mid-phrase
    fig.suptitle(f"{_version(d)}, {GROUP_SHORT[d['group']]}\n{d['gpu_ms']:g} ms GPU / {d['host_delay_ms']:g} ms "
                 f"host per layer: peak active +{mib(d['peak_active_bytes']):.0f} MiB, at most "
                 f"{mib(d['max_parked_bytes']):.0f} MiB parked", fontsize=pick(10, 9))
    legend_below(axes[-1], fontsize=8, ncol=2)
    return stamp(fig, result)


MARK_LABELS = {"built": "built", "warm": "warmed up", "step": "after step"}


def _mark_requests(result: Result, run: Any) -> list[int]:
    """Where each of the step's marks falls in the doctor's series: the index of the first
    request after the mark (``Run.mark_points`` of the mark's 'snapshot' trace entry), or the
    series' last point, the state at the trace's end, for a mark that ends the trace.

    Raises:
        ValueError: a mark that is neither a 'snapshot' entry of the replay nor the trace's end.
    """
    points = {i: k for (i, _, _), k in zip(run.marks, run.mark_points)}
    out = []
    for ph in result["phases"]:
        i = ph["trace_index"]
        if i - 1 in points or i in points:
            out.append(points[i - 1] if i - 1 in points else points[i])
        elif i >= run.events_replayed:
            out.append(len(run.reserved))
        else:
            raise ValueError(f"phase {ph['phase']!r} at trace entry {i} is no 'snapshot' entry of the replay")
    return out


@figure_function
def plot_fsdp_replay(pairs: Sequence[tuple[Result, Any]]) -> Any:
    """The doctor's replay of each step's snapshot drawn beside the GPU's own counters, one
    panel per run.

    Args:
        pairs: (``streams.fsdp_step`` result, the doctor's ``Run`` of its snapshot), as for
            :func:`fsdp_replay_table`; the Run must keep its series (``replay``'s default).

    Lines: the doctor's reserved and allocated bytes after every allocator request of the trace
    (MiB; model built, two warm-up steps, the measured step, which is shaded). Markers: the
    GPU's ``memory_stats`` counters read at the three marks, placed at the first request after
    each mark (an ``empty_cache`` just before a mark shows there); dotted lines: the GPU's peak counters over the trace. Where the replay
    is exact the lines run through the markers and touch the dotted lines.

    Raises:
        ValueError: no pairs, or a Run without its series.
    """
    if not pairs:
        raise ValueError("pairs must hold at least one (result, run) pair, got none")
    for _, run in pairs:
        if len(run.allocated) == 0:
            raise ValueError("each run must keep its series: replay(..., series=True)")
    n = len(pairs)
    fig, axes = new_figure(1, n, width=5.2 * n, height=3.8, squeeze=False, narrow_height=3.4 * n)
    axes = list(axes[0])
    res_color, alloc_color = PALETTE[0], PALETTE[1]
    for ax, (result, run) in zip(axes, pairs):
        d = result.data
        step = max(1, len(run.reserved) // 4000)
        xs = range(0, len(run.reserved), step)
        ax.plot(xs, [mib(run.reserved[i]) for i in xs], color=res_color, lw=1.4, label="doctor: reserved")
        ax.plot(xs, [mib(run.allocated[i]) for i in xs], color=alloc_color, lw=1.1, ls="--",
                label="doctor: allocated")
        at = [min(k, len(run.reserved) - 1) for k in _mark_requests(result, run)]
        ax.scatter(at, [mib(ph["reserved_bytes.all.current"]) for ph in d["phases"]], s=55, marker="o",
                   facecolors="none", edgecolors="black", linewidths=1.3, zorder=3, clip_on=False,
                   label="GPU: reserved at a mark")
        ax.scatter(at, [mib(ph["allocated_bytes.all.current"]) for ph in d["phases"]], s=45, marker="s",
                   facecolors="none", edgecolors=GRAY, linewidths=1.3, zorder=3, clip_on=False,
                   label="GPU: allocated at a mark")
        ax.axhline(mib(max(ph["reserved_bytes.all.peak"] for ph in d["phases"])), color=res_color, ls=":", lw=1,
                   label="GPU: peak reserved")
        ax.axhline(mib(max(ph["allocated_bytes.all.peak"] for ph in d["phases"])), color=alloc_color, ls=":",
                   lw=1, label="GPU: peak allocated")
        phases = {ph["phase"]: x for ph, x in zip(d["phases"], at)}
        if "warm" in phases and "step" in phases:
            ax.axvspan(phases["warm"], phases["step"], color=GRAY, alpha=0.08, linewidth=0)
        for x in at:
            ax.axvline(x, color=GRAY, ls="--", lw=0.7, zorder=1)
        # the marks' names on a top axis: inside the panel they would cover the curves or the markers
        top = ax.secondary_xaxis("top")
        top.set_xticks(at, labels=[MARK_LABELS.get(ph["phase"], ph["phase"]) for ph in d["phases"]])
        top.tick_params(labelsize=MIN_FONT_PT, colors="#555555", length=3)
        # each name ends at its mark, the first starts there: the later marks stand close, and a
        # name past either end of the axis would widen the figure and shrink its text on the page
        labels = top.get_xticklabels()
        for k, t in enumerate(labels):
            t.set_horizontalalignment("left" if k == 0 else "right")
        ax.set_ylim(bottom=0, top=ax.get_ylim()[1] * 1.12)
        ax.set_xlim(0, max(len(run.reserved) - 1, 1) * 1.03)
        verdict = "replays exactly" if run.matches_trace else \
            f"replay differs at event {(run.first_mismatch or {}).get('event_index', '?')}"
        # two short lines: a panel is a third of the page's column wide
        ax.set_title(f"{_short_version(d)}\n{GROUP_SHORT[d['group']]}", fontsize=pick(9, 8), loc="left")
        # on a box of its own: the shaded measured step may reach the panel's corner
        ax.text(0.98, 0.04, verdict, transform=ax.transAxes, ha="right", va="bottom", fontsize=MIN_FONT_PT + 1,
                color="#1f6b35" if run.matches_trace else PALETTE[3],
                bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.9))
        ax.set_xlabel("allocator request, in trace order")
        ax.set_ylabel("MiB")
    legend_below(axes[-1] if is_narrow() else axes[0], fontsize=8, ncol=pick(3, 2))
    fig.suptitle("The doctor's replay (lines) beside the GPU's counters (markers, dotted peaks)",
                 fontsize=pick(10, 9))
    return stamp(fig, [r for r, _ in pairs])


def _version(d: dict[str, Any]) -> str:
    label = VERSION_STYLE[d["version"]][0]
    if d["version"].startswith("fsdp1"):
        return f"{label} ({d['sharding']})"
    return label + ("" if d["reshard_after_forward"] else ", reshard_after_forward=False")


# ------------------------------------------------------------------ tables

TABLE_LABELS = {"fsdp2": "FSDP2", "fsdp1": "FSDP1, limit on", "fsdp1_nolimit": "FSDP1, limit off",
                "record_stream": "record_stream program", "event": "event handoff program"}


def _short_version(d: dict[str, Any]) -> str:
    """A step's version in a few words: 'FSDP1, limit off, FULL_SHARD', 'FSDP2, no reshard'."""
    label = TABLE_LABELS[d["version"]]
    if d["version"] != "fsdp2":
        return f"{label}, {d['sharding']}"
    return label + ("" if d["reshard_after_forward"] else ", no reshard")


def _short(d: dict[str, Any]) -> str:
    """A step's run in a few words: 'FSDP1, limit off, FULL_SHARD, fake group, 2 ranks'."""
    return f"{_short_version(d)}, {GROUP_SHORT[d['group']]}"


def fsdp_runahead_table(result: Result) -> Table:
    """One row per version of a ``streams.fsdp_runahead`` result: what FSDP ran (sharding,
    collectives per step), the peak active MiB above the step's start at each run-ahead point,
    and the host and wall time of the step at the largest run-ahead (ms); at world size 1 also
    the chapter's own programs on buffers of one layer's parameters."""
    d = result.data
    order = _order(d)
    hi = order[-1]
    rows = []
    for v in VERSION_STYLE:
        s = d["versions"][v]
        c = s["collectives"]
        rows.append([TABLE_LABELS[v], s["sharding"].replace("FSDP2 (per-parameter)", "per-parameter"),
                     f"{c['all_gather']} / {c['reduce_scatter']} / {c['all_reduce']}"]
                    + [f"{mib(s['peak_active_bytes'][k]):.0f}" for k in order]
                    + [f"{s['host_ms'][hi]:.0f} / {s['wall_ms'][hi]:.0f}"])
    if "program" in d:
        for s in PROGRAM_STYLE:
            rows.append([TABLE_LABELS[s], "", ""] + [f"{mib(d['program'][s]['peak_active_bytes'][k]):.0f}"
                                                     for k in order] + [""])
    # one item a line: the page wraps each line to the table's width, never inside a phrase
    lines = [f"{d['layers']} layers × {mib(d['layer_bytes']):g} MiB, {GROUP_TITLE[d['group']]}.",
             f"Middle columns: peak active MiB above the step's start, at GPU work / host delay per layer (ms); "
             f"medians of {d['repeats']} runs.",
             "limit: limit_all_gathers. collectives: all-gathers / reduce-scatters / all-reduces in one step.",
             "host / wall: ms until the host had enqueued the step, and until the GPU finished it, at the largest "
             "run-ahead."]
    if "program" in d:
        lines.append("programs: this chapter's own, on buffers of one layer's parameters.")
    caption = "\n".join(lines)
    return Table(["version", "sharding", "collectives"] + [_point_label(d["points"][k]) for k in order]
                 + ["host / wall"], rows, caption, right=[False, False, True] + [True] * (len(order) + 1))


def fsdp_streams_table(result: Result) -> Table:
    """One row per stream of a ``streams.fsdp_step`` result: allocations and MiB allocated in
    the measured step, the most blocks and MiB in flight and parked at once, deferred frees."""
    d = result.data
    rows = []
    for s in _stream_order(list(d["streams"])):
        u = d["streams"][s]
        rows.append([s, u["allocs"], f"{mib(u['alloc_bytes']):.0f}", u["max_blocks"], f"{mib(u['max_bytes']):.0f}",
                     u["deferred_frees"], u["max_parked_blocks"], f"{mib(u['max_parked_bytes']):.0f}"])
    caption = (f"{_version(d)}, {GROUP_TITLE[d['group']]}. Streams are named after FSDP's own stream objects.\n"
               "in flight: allocated, or freed and parked. parked: freed by Python, held back by record_stream "
               "events.")
    return Table(["stream", "allocs", "MiB", "blocks in flight", "MiB in flight", "deferred frees",
                  "blocks parked", "MiB parked"], rows, caption, right=[False] + [True] * 7)


def fsdp_replay_table(pairs: Sequence[tuple[Result, Any]]) -> Table:
    """The doctor's replay of each step's snapshot beside the GPU's own counters.

    Args:
        pairs: (``streams.fsdp_step`` result, the doctor's ``Run`` of its snapshot): the Run
            from ``experiments.doctor.replay(experiments.doctor.read(result["snapshot"]))``.

    One row per run: whether the replay matched every event of the trace, how many of the
    three marks (built, warm, after the step) agree to the byte in allocated and reserved
    bytes, and the peaks of reserved and allocated bytes over the whole trace, GPU against
    doctor (MiB; the GPU's peak is the highest of its peak counters at the marks).
    """
    rows = []
    for result, run in pairs:
        d = result.data
        marks = {i: (a, r) for i, a, r in run.marks}
        equal = 0
        for ph in d["phases"]:
            # the mark's own 'snapshot' entry sits at trace_index - 1 or trace_index
            i = ph["trace_index"] - 1 if ph["trace_index"] - 1 in marks else ph["trace_index"]
            equal += marks.get(i) == (ph["allocated_bytes.all.current"], ph["reserved_bytes.all.current"])
        gpu_res = max(ph["reserved_bytes.all.peak"] for ph in d["phases"])
        gpu_alloc = max(ph["allocated_bytes.all.peak"] for ph in d["phases"])
        rows.append([_short(d),
                     "yes" if run.matches_trace else f"no: {run.first_mismatch}",
                     f"{equal} of {len(d['phases'])}", f"{mib(gpu_res):.0f} / {mib(run.peak_reserved_bytes):.0f}",
                     f"{mib(gpu_alloc):.0f} / {mib(run.peak_allocated_bytes):.0f}"])
    caption = ("marks equal: the GPU's allocated and reserved bytes after the model was built, after warm-up and "
               "after the measured step, against the doctor's at the same trace entries.\n"
               "peak reserved, peak allocated: over the whole trace, MiB, GPU / doctor.")
    return Table(["run", "replays exactly", "marks equal", "peak reserved", "peak allocated"], rows, caption,
                 right=[False, False, False, True, True])
