"""Figures for chapter 2 (cross-stream memory). Each takes a :class:`~experiments.core.registry.Result`
of one ``streams.*`` experiment and returns a Figure with the provenance footer.
Memory in MiB above the start of a run; times in ms.
"""
from __future__ import annotations

from typing import Any, Sequence

from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

import matplotlib.pyplot as plt

from ..core.plotting import (MIN_FONT_PT, PALETTE, bars, figure_function, is_narrow, legend_below, new_figure, pick,
                             stamp, stream_lanes, style)
from ..core.tables import Table
from ..core.units import mib
from ..core.registry import Result
from .workloads import STRATEGY_LABELS

GOOD, BAD = "#3f9a5b", "#b5403a"
GRAY = "#6b6b6b"
COUNTER_KEYS = (("peak_allocated_bytes", "allocated"), ("peak_active_bytes", "active"),
                ("peak_reserved_bytes", "reserved"))
COUNTER_COLORS = ("#9bb7d4", PALETTE[0], "#1f3d5c")
# Buffers get colors by block, so that equal colors mean the same memory.
BLOCK_COLORS = ("#3b6ea8", "#d9822b", "#3f9a5b", "#7b5ea7", "#8c6d46", "#c2549d", "#17becf", "#6b6b6b")


def _blocks(n: int) -> str:
    return f"{n} block" if n == 1 else f"{n} blocks"


def _grouped(ax: Any, groups: Sequence[str], series: Sequence[tuple[str, Sequence[float], str]],
             *, ylabel: str, fmt: str = "{:.0f}") -> None:
    """Bars for several series per group, values annotated above each bar."""
    width = 0.8 / len(series)
    texts: list[list[tuple[str, float, float]]] = [[] for _ in groups]  # per group: (text, x, height)
    for j, (label, values, color) in enumerate(series):
        xs = [i + (j - (len(series) - 1) / 2) * width for i in range(len(groups))]
        ax.bar(xs, values, width, label=label, color=color)
        for i, (x, v) in enumerate(zip(xs, values)):
            texts[i].append((fmt.format(v), x, v))
    # Equal neighbouring values get one label over their bars: three narrow bars' labels
    # side by side would run together ('128128128').
    for group in texts:
        k = 0
        while k < len(group):
            end = k
            while end + 1 < len(group) and group[end + 1][0] == group[k][0]:
                end += 1
            x = (group[k][1] + group[end][1]) / 2
            ax.annotate(group[k][0], (x, max(h for _, _, h in group[k:end + 1])), ha="center", va="bottom",
                        fontsize=MIN_FONT_PT, xytext=(0, 1), textcoords="offset points")
            k = end + 1
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups)
    ax.set_ylabel(ylabel)
    ax.grid(axis="x", visible=False)


@figure_function
def plot_strategies(result: Result) -> Any:
    """Three panels per strategy: corrupted trials, peak allocated/active/reserved (MiB),
    and GPU span with the time producer and consumer ran concurrently (ms)."""
    d = result.data
    names = d["strategies"]
    res = d["results"]
    labels = [STRATEGY_LABELS[s] for s in names]
    # Two panels side by side and the memory panel, with its three bars per strategy, below
    # them at full width: in one row of three the labels collide at the book's column width.
    if is_narrow():  # one column: the three panels stacked
        fig, column = new_figure(3, 1, height=9.0)
        axes = list(column)
    else:
        fig, grid = new_figure(2, 2, width=8.8, height=6.6)
        spec = grid[1][0].get_subplotspec().get_gridspec()
        for ax in grid[1]:
            ax.remove()
        with plt.rc_context(style()):
            memory = fig.add_subplot(spec[1, :])
        axes = [grid[0][0], memory, grid[0][1]]
    n = res[names[0]]["trials"]
    corrupted = [res[s]["corrupted_trials"] for s in names]
    bars(labels, corrupted, ylabel=f"corrupted trials (of {n})", colors=[BAD if c else GOOD for c in corrupted],
         ax=axes[0], title="Did the consumer read its own layer?")
    axes[0].set_ylim(0, n * 1.15 + 0.5)
    for ax in axes:  # four strategies side by side in half the width: their names at 8 pt
        ax.tick_params(axis="x", labelsize=8)
    _grouped(axes[1], labels, [(label, [mib(res[s][key]) for s in names], color)
                               for (key, label), color in zip(COUNTER_KEYS, COUNTER_COLORS)],
             ylabel="peak above start (MiB)")
    axes[1].axhline(mib(d["buffer_bytes"]), color=GRAY, linestyle=":", linewidth=1,
                    label=f"one buffer ({mib(d['buffer_bytes']):g} MiB)")
    axes[1].set_title("Memory (largest of the trials)")
    axes[1].legend(loc="upper left", fontsize=8)
    x = range(len(names))
    spans = axes[2].bar(x, [res[s]["span_ms"] for s in names], 0.6, color=PALETTE[0], label="GPU span")
    overlaps = axes[2].bar(x, [res[s]["overlap_ms"] for s in names], 0.3, color=PALETTE[1],
                           label="producer and consumer both busy")
    for rects, key in ((spans, "span_ms"), (overlaps, "overlap_ms")):
        for rect, s in zip(rects, names):
            axes[2].annotate(f"{res[s][key]:.1f}", (rect.get_x() + rect.get_width() / 2, rect.get_height()),
                             ha="center", va="bottom", fontsize=MIN_FONT_PT, xytext=(0, 1), textcoords="offset points")
    axes[2].axhline(d["serial_ms"], color=GRAY, linestyle="--", linewidth=1, label="no overlap at all")
    axes[2].set_xticks(list(x))
    axes[2].set_xticklabels(labels)
    axes[2].set_ylabel("GPU time (ms)")
    axes[2].set_title("Time (median of the trials)")
    axes[2].set_ylim(0, 1.55 * max([d["serial_ms"]] + [res[s]["span_ms"] for s in names]))
    axes[2].legend(loc="upper left", fontsize=MIN_FONT_PT)
    axes[2].grid(axis="x", visible=False)
    return stamp(fig, result)


@figure_function
def plot_pipeline(result: Result) -> Any:
    """Left: the value each layer's consumer read against its own layer number (the
    correctness check). Right: peak allocated, active and reserved bytes (MiB) of the run."""
    d, p = result.data, result.params
    layers = d["layers"]
    buf = mib(d["buffer_bytes"])
    fig, (a0, a1) = new_figure(1, 2, width=10.5, height=3.6)
    xs = list(range(1, layers + 1))
    a0.plot(xs, xs, "--", color=GRAY, linewidth=1, label="its own layer's value")
    a0.plot(xs, d["read_mean"], "o", markersize=4, color=BAD if d["corrupted_layers"] else GOOD,
            label="value the consumer read")
    a0.set_xlabel("layer")
    a0.set_ylabel("value read (layer number)")
    a0.set_title(f"{d['corrupted_layers']} of {layers} layers read the wrong buffer")
    legend_below(a0, fontsize=8, ncol=1)  # inside, the values read (anywhere up to the top) would cross it
    values = [mib(d[key]) for key, _ in COUNTER_KEYS]
    bars([label for _, label in COUNTER_KEYS], values, ylabel="peak above start (MiB)", colors=list(COUNTER_COLORS),
         ax=a1, title=f"{_blocks(d['distinct_blocks'])} used")
    # The two reference lines are named in a legend under the panel: a label on the line
    # itself would print across the bars' values when a bar reaches it.
    a1.axhline(layers * buf, color=GRAY, linestyle="--", linewidth=1,
               label=f"every layer's buffer ({layers} × {buf:g} MiB)")
    a1.axhline(buf, color=GRAY, linestyle=":", linewidth=1, label=f"one buffer ({buf:g} MiB)")
    legend_below(a1, fontsize=8, ncol=1)
    a1.set_ylim(0, max(max(values), layers * buf) * 1.12)
    kept = f", {d['in_flight']} in flight" if d["strategy"] == "event" else ""
    fig.suptitle(f"{d['strategy']}{kept}: {p.get('consumer_ms', 0):g} ms GPU work and {p.get('host_delay_ms', 0):g} "
                 f"ms host work per layer, {layers} × {buf:g} MiB")
    return stamp(fig, result)


@figure_function
def plot_runahead(result: Result) -> Any:
    """Peak memory (MiB) against GPU work per layer (left) and host delay per layer
    (right): record_stream's active and allocated peaks, the event handoff's active peak."""
    d = result.data
    pts = d["points"]
    buf = mib(d["buffer_bytes"])
    top = max(pt["consumer_ms"] for pt in pts)
    left = [k for k, pt in enumerate(pts) if pt["host_delay_ms"] == 0]
    right = [k for k, pt in enumerate(pts) if pt["consumer_ms"] == top]
    right.sort(key=lambda k: pts[k]["host_delay_ms"])
    fig, axes = new_figure(1, 2, width=10.0, height=4.3, sharey=True)
    panels = ((axes[0], left, "consumer_ms", "GPU work per layer (ms), no host delay"),
              (axes[1], right, "host_delay_ms", f"host delay per layer (ms), {top:g} ms of GPU work per layer"))
    rs, ev = d["record_stream"], d["event"]
    for ax, idx, key, xlabel in panels:
        xs = list(range(len(idx)))
        ax.plot(xs, [mib(rs["peak_active_bytes"][k]) for k in idx], "o-", color=PALETTE[1],
                label="record_stream: peak active")
        ax.plot(xs, [mib(rs["peak_allocated_bytes"][k]) for k in idx], "s--", color=PALETTE[1], alpha=0.55,
                label="record_stream: max_memory_allocated")
        ax.plot(xs, [mib(ev["peak_active_bytes"][k]) for k in idx], "o-", color=PALETTE[2],
                label=f"event handoff ({d['in_flight']} in flight): peak active")
        ax.axhline(d["layers"] * buf, color=GRAY, linestyle=":", linewidth=1)
        # centred: the curves meet this line at the panels' outer ends
        ax.annotate(f"every layer's buffer ({d['layers']} × {buf:g} MiB)", (0.5, d["layers"] * buf),
                    xycoords=("axes fraction", "data"), ha="center", va="bottom", fontsize=MIN_FONT_PT, color=GRAY)
        ax.set_xticks(xs)
        ax.set_xticklabels([f"{pts[k][key]:g}" for k in idx])
        ax.set_xlabel(xlabel)
    axes[0].set_ylabel("peak above start (MiB)")
    axes[0].set_title("More GPU work per layer: the host runs further ahead")
    axes[1].set_title("More host work per layer: the GPU keeps up")
    if is_narrow():  # under the lower panel: in the narrow panels it would sit on the curves
        handles, labels = axes[0].get_legend_handles_labels()
        legend_below(axes[1], handles=handles, labels=labels, fontsize=8)
    else:
        axes[0].legend(loc="center right", fontsize=8)
    return stamp(fig, result)


@figure_function
def plot_counters(result: Result, *, point: int | None = None) -> Any:
    """Allocated, active and reserved peaks (MiB) of both strategies at one point of the
    run-ahead sweep (default: the largest run-ahead): what each counter sees."""
    d = result.data
    ra = [pt["runahead_ms"] for pt in d["points"]]
    k = ra.index(max(ra)) if point is None else point
    if not 0 <= k < len(ra):
        raise ValueError(f"point must be in [0, {len(ra) - 1}], got {point}")
    fig, ax = new_figure(width=6.5, height=3.6)
    groups = ["record_stream", "event handoff"]
    _grouped(ax, groups, [(label, [mib(d[s][key][k]) for s in ("record_stream", "event")], color)
                          for (key, label), color in zip(COUNTER_KEYS, COUNTER_COLORS)],
             ylabel="peak above start (MiB)")
    pt = d["points"][k]
    ax.set_title(f"{pt['consumer_ms']:g} ms GPU / {pt['host_delay_ms']:g} ms host per layer, "
                 f"{d['layers']} × {mib(d['buffer_bytes']):g} MiB")
    ax.legend(loc="upper right", fontsize=8, title="peak of", title_fontsize=8)
    return stamp(fig, result)


@figure_function
def plot_memory_cap(result: Result) -> Any:
    """Host time of each buffer allocation (ms, log scale) under the cap, and the
    allocator's retries, for record_stream and the event handoff."""
    d = result.data
    st = d["strategies"]
    fig, (a0, a1) = new_figure(1, 2, width=10.5, height=3.6, gridspec_kw={"width_ratios": [2.3, 1]})
    names = (("record_stream", PALETTE[1], "record_stream"), ("event", PALETTE[2], "event handoff"))
    for key, color, label in names:
        s = st[key]
        if s["oom"]:
            a0.plot([], [], color=color, label=f"{label}: out of memory")
            continue
        ys = [max(v, 1e-3) for v in s["alloc_host_ms"]]
        a0.plot(range(1, len(ys) + 1), ys, ".-", color=color, linewidth=0.8,
                label=f"{label}: worst {s['worst_alloc_ms']:.1f} ms")
    a0.set_yscale("log")
    worst = max([v for key, _, _ in names if not st[key]["oom"] for v in st[key]["alloc_host_ms"]] + [1e-3])
    a0.set_ylim(top=worst * 60)  # about 1.8 decades above the slowest allocation: room for the legend
    a0.set_xlabel("layer")
    a0.set_ylabel("host time of torch.empty (ms)")
    a0.set_title(f"Allocation stalls under a {d['cap_mib']} MiB cap")
    a0.legend(loc="upper left", fontsize=8)
    retries = [st[key]["num_alloc_retries"] for key, _, _ in names]
    bars([label for _, _, label in names], retries, ylabel="allocator retries (count)",
         colors=[color for _, color, _ in names], ax=a1, title="num_alloc_retries")
    a1.yaxis.set_major_locator(MaxNLocator(integer=True))
    a1.set_ylim(0, max(retries + [1]) * 1.15)
    return stamp(fig, result)


@figure_function
def plot_timeline(result: Result) -> Any:
    """Host, producer and consumer lanes (ms after a reference event). Each layer's boxes
    are colored by the memory block its buffer got, so equal colors overlapping in time
    on the two streams are the race; triangles mark the host's ``del``."""
    d = result.data
    span = max([d["span_ms"]] + [e for _, e in d["consumer"]])
    min_w = span / 400  # keep microsecond-long host steps visible
    def box(s: float, e: float, color: str, label: str, short: str = "") -> dict[str, Any]:
        return {"start_ms": s, "end_ms": max(e, s + min_w), "color": color,
                "label": label if e - s > 0.07 * span else "", "short_label": short}
    colors = [BLOCK_COLORS[b % len(BLOCK_COLORS)] for b in d["block"]]
    consumer = []
    for i, ((s, e), c) in enumerate(zip(d["consumer"], colors)):
        read = d["read_mean"][i]
        text = f"L{i + 1}" if read == i + 1 else f"L{i + 1} read {read:.3g}"
        consumer.append(box(s, e, c, text, f"L{i + 1}" if read == i + 1 else f"L{i + 1}→{read:.3g}"))
    lanes = {
        "host": [box(s, e, GRAY, f"L{i + 1}") for i, (s, e) in enumerate(d["host"])],
        "producer stream": [box(s, e, c, f"AG {i + 1}") for i, ((s, e), c) in enumerate(zip(d["producer"], colors))],
        "consumer stream": consumer,
    }
    fig = stream_lanes(lanes)
    fig.suptitle(f"{d['strategy']}: {_blocks(d['distinct_blocks'])}, {d['corrupted_layers']} of {d['layers']} "
                 f"layers read the wrong buffer")
    ax = fig.axes[0]
    ax.plot(d["del_ms"], [0.0] * len(d["del_ms"]), "v", color=BAD, markersize=6, zorder=5)
    ax.set_xlim(0, span * 1.02)
    handles = [Patch(color=BLOCK_COLORS[b % len(BLOCK_COLORS)], label=f"block {chr(65 + b % 26)}")
               for b in sorted(set(d["block"]))]
    handles.append(ax.plot([], [], "v", color=BAD, label="host drops its reference")[0])
    ax.legend(handles=handles, loc="lower right", fontsize=MIN_FONT_PT, ncol=min(len(handles), pick(5, 3)),
              bbox_to_anchor=(1.0, 1.0))
    return stamp(fig, result)


# ------------------------------------------------------------------ text tables for the page

def strategies_table(result: Result) -> Table:
    """One row per strategy of a ``streams.strategies`` result: corrupted trials, blocks,
    peak active memory (MiB), GPU span and overlap (ms), and the value each layer read."""
    d = result.data
    rows = []
    for s in d["strategies"]:
        r = d["results"][s]
        rows.append([s, f"{r['corrupted_trials']} of {r['trials']}", r["distinct_blocks"],
                     f"{mib(r['peak_active_bytes']):.0f}", f"{r['span_ms']:.1f}", f"{r['overlap_ms']:.1f}",
                     ", ".join(f"{v:g}" for v in r["read_mean"])])
    caption = ("active: peak above the start; span: GPU time; overlap: producer and consumer both busy.\n"
               f"With no overlap at all, the GPU would need {d['serial_ms']:g} ms.")
    return Table(["strategy", "corrupted", "blocks", "active (MiB)", "span (ms)", "overlap (ms)", "layers read"],
                 rows, caption, right=[False, True, True, True, True, True, False])


def runahead_table(result: Result) -> Table:
    """One row per point of a ``streams.runahead`` result: GPU and host time per layer (ms),
    and the blocks and peak active memory (MiB) of record_stream and the event handoff."""
    d = result.data
    rs, ev = d["record_stream"], d["event"]
    rows = [[f"{pt['consumer_ms']:g}", f"{pt['host_delay_ms']:g}", f"{rs['distinct_blocks'][k]:.0f}",
             f"{mib(rs['peak_active_bytes'][k]):.0f}", f"{ev['distinct_blocks'][k]:.0f}",
             f"{mib(ev['peak_active_bytes'][k]):.0f}"] for k, pt in enumerate(d["points"])]
    caption = (f"GPU and host: time per layer; active: peak above the start.\n{d['layers']} layers of "
               f"{mib(d['buffer_bytes']):g} MiB, medians of {d['repeats']} runs.")
    return Table(["GPU (ms)", "host (ms)", "record_stream blocks", "active (MiB)", "event blocks", "active (MiB)"],
                 rows, caption, right=[True] * 6)


def memory_cap_table(result: Result) -> Table:
    """Retries, slowest allocation (ms), peak reserved (MiB) and GPU span (ms) of both
    strategies under the cap, and an estimate of one record_stream stall: the buffers that
    fill the cap times the consumer's work per layer (ms)."""
    d = result.data
    st = d["strategies"]
    rows = []
    for key, label in (("record_stream", "record_stream"), ("event", "event handoff")):
        s = st[key]
        if s["oom"]:
            rows.append([label, "out of memory", "", "", ""])
            continue
        rows.append([label, s["num_alloc_retries"], f"{s['worst_alloc_ms']:.2f}", f"{mib(s['peak_reserved_bytes']):.0f}",
                     f"{s['span_ms']:.1f}"])
    columns = ["strategy", "retries", "slowest torch.empty (ms)", "reserved (MiB)", "span (ms)"]
    right = [False, True, True, True, True]
    rs = st["record_stream"]
    if rs["oom"]:
        return Table(columns, rows, right=right)
    parked = rs["peak_reserved_bytes"] // d["buffer_bytes"]
    consumer_ms = result.params["consumer_ms"]
    caption = (f"reserved: peak above the start; span: GPU time.\n"
               f"One record_stream stall, estimated: {parked} buffers fill the cap, each behind "
               f"{consumer_ms:g} ms\nof consumer work, so about {parked * consumer_ms:.1f} ms; the slowest "
               f"allocation took {rs['worst_alloc_ms']:.1f} ms.")
    return Table(columns, rows, caption, right=right)
