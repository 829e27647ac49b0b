"""The doctor's figure, drawn with matplotlib (imported only here, and only when a figure is
drawn: the rest of the doctor runs where matplotlib does not exist)."""
from __future__ import annotations

from typing import Any, Mapping


def draw(report: Any) -> Any:
    """The figure of a :class:`experiments.doctor.answers.report.Report`: reserved (solid) and allocated
    (dashed) bytes over the requests for every setting on one axis, and the segment map at the
    recorded run's peak. Returns a matplotlib Figure."""
    from ...core.plotting import figure_function

    # a figure_function call, so that the book can draw it again for phones
    return figure_function(_draw)(report)


def _draw(report: Any) -> Any:
    from ...core.plotting import fit_text, is_narrow, legend_below, mib, new_figure, segment_map

    fig, (ax, ax2) = new_figure(2, 1, height=6.4)
    runs = [report.series(r) for r in [report.replay] + report.what_ifs]
    for k, run in enumerate(runs):
        label = ("recorded: " if k == 0 else "") + (run.settings or "defaults")
        step = max(1, len(run.reserved) // 4000)
        xs = range(0, len(run.reserved), step)
        line, = ax.plot(xs, [mib(run.reserved[i]) for i in xs], label=f"reserved, {label}")
        ax.plot(xs, [mib(run.allocated[i]) for i in xs], ls="--", color=line.get_color(), lw=0.8)
    ax.set_xlabel("request (alloc, free, empty_cache) in trace order")
    ax.set_ylabel("MiB (solid reserved, dashed allocated)")
    if is_narrow():  # inside the narrow axes the legend would cover the lines
        legend_below(ax, fontsize=8)
    else:
        ax.legend(fontsize=8)
    layout = report.peak_layout(report.replay)
    # segments that live blocks pin first (most free bytes first), then the largest others
    def order(seg: Mapping[str, Any]) -> tuple[int, int]:
        live = any(b["state"] != "inactive" for b in seg["blocks"])
        free = sum(b["size"] for b in seg["blocks"] if b["state"] == "inactive")
        return (0 if live and free else 1, -free if live else -seg["total_size"])

    layout = sorted(layout, key=order)[:12]
    if layout:
        segment_map(layout, ax=ax2, title="at the recorded run's peak: pinned segments first (12 shown)")
    return fit_text(fig)  # titles wrapped to the width, with or without a footer
