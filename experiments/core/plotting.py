"""The book's figures: one style, units on every axis (MiB, ms), provenance in the footer.

Functions here draw shapes every chapter needs (memory over time, segment maps,
stream timelines, bars) from plain numbers; chapter modules turn their results into
those numbers. Each function returns a closed :class:`matplotlib.figure.Figure`, so a
notebook shows it once, as the cell's value, and widgets can redraw without leaking.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import matplotlib
import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from .units import format_bytes, mib


PALETTE = ["#3b6ea8", "#d9822b", "#3f9a5b", "#b5403a", "#7b5ea7", "#8c6d46", "#c2549d", "#6b6b6b"]

# Block states as the snapshot names them (torch.cuda.memory._snapshot(), "state").
STATE_COLORS = {
    "active_allocated": "#3b6ea8",
    "active_pending_free": "#d9822b",
    "inactive": "#d8dde3",
}
STATE_LABELS = {
    "active_allocated": "allocated",
    "active_pending_free": "freed, waiting on an event",
    "inactive": "free (cached)",
}

STYLE = {
    "figure.dpi": 110,
    "savefig.dpi": 110,
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.frameon": False,
    "axes.prop_cycle": matplotlib.cycler(color=PALETTE),
}


# The book's content column is 688 px wide at 1280 px. A figure wider than MAX_WIDTH inches
# is shown scaled down so far that its 9 pt footer drops under 9 px (9 pt at 110 dpi is
# 13.75 px; 688 / (8.8 * 110) = 0.71 of it is 9.8 px, with room for the margins that
# bbox_inches="tight" adds), so wider requests are narrowed.
MAX_WIDTH = 8.8
FOOTER_PT = 9


def new_figure(nrows: int = 1, ncols: int = 1, *, width: float = 7.5, height: float = 3.4,
               **kwargs: Any) -> tuple[Figure, Any]:
    """A figure in the book's style; returns (fig, axes) like ``plt.subplots``.

    ``width`` (inches) is capped at :data:`MAX_WIDTH` so that text stays readable in the
    book's column; ``height`` is kept.
    """
    width = min(width, MAX_WIDTH)
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(nrows, ncols, figsize=(width, height), layout="constrained", **kwargs)
    plt.close(fig)  # shown once as a cell value, never by pyplot's end-of-cell hook
    return fig, axes


def stamp(fig: Figure, source: Any) -> Figure:
    """Write where the data came from under the figure.

    Args:
        source: a :class:`~experiments.core.registry.Result`, a list of them (one line if
            they share a provenance), or a string.
    """
    if isinstance(source, str):
        lines = [source]
    else:
        results = list(source) if isinstance(source, (list, tuple)) else [source]
        lines = list(dict.fromkeys(r.caption() for r in results))
    fig.text(0.0, 0.0, "\n".join(lines), ha="left", va="top", fontsize=FOOTER_PT, color="#555555",
             transform=fig.transFigure)
    fit_text(fig)
    return fig


# DejaVu Sans, the default font, averages a little over half an em per character.
_EM_PER_CHAR = 0.58


def fit_text(fig: Figure) -> Figure:
    """Wrap the figure's own texts (footer, suptitle) and the axes titles to their width.

    A line wider than the figure widens the saved PNG (``bbox_inches="tight"``), which the
    book then shows scaled down, every label with it; matplotlib's own ``wrap=True`` does not
    wrap against the tight box. Widths are estimated from the font size (pt), not measured,
    so this needs no renderer.
    """
    import textwrap

    def wrap(text_obj: Any, width_pt: float) -> None:
        chars = max(20, int(width_pt / (text_obj.get_fontsize() * _EM_PER_CHAR)))
        text = text_obj.get_text()
        if any(len(line) > chars for line in text.splitlines()):
            text_obj.set_text("\n".join(textwrap.fill(line, chars) if len(line) > chars else line
                                         for line in text.splitlines()))

    fig_pt = fig.get_figwidth() * 72
    for t in fig.texts:
        wrap(t, fig_pt)
    for ax in fig.axes:
        ax_pt = ax.get_position().width * fig_pt
        for t in (ax.title, ax._left_title, ax._right_title):
            wrap(t, max(1.15 * ax_pt, fig_pt / 3))  # a title may reach a little past its axes
    return fig




def memory_timeline(
    steps: Sequence[Any],
    series: Mapping[str, Sequence[float]],
    *,
    marks: Iterable[tuple[int, str]] = (),
    xlabel: str = "step",
    title: str = "",
    ax: Any = None,
    drawstyle: str = "steps-post",
) -> Figure:
    """Memory counters over a sequence of steps.

    Args:
        steps: x values (step index, or a time in ms; say which in ``xlabel``).
        series: label -> bytes at each step (plotted in MiB).
        marks: (x value, label) pairs drawn as vertical lines, e.g. an ``empty_cache()``.
    """
    if ax is None:
        fig, ax = new_figure()
    else:
        fig = ax.figure
    for label, values in series.items():
        if len(values) != len(steps):
            raise ValueError(f"series {label!r} has {len(values)} values for {len(steps)} steps")
        ax.plot(list(steps), [mib(v) for v in values], label=label, drawstyle=drawstyle, linewidth=1.8)
    for x, label in marks:
        ax.axvline(x, color="#888888", linestyle="--", linewidth=1)
        ax.annotate(label, (x, 1.0), xycoords=("data", "axes fraction"), rotation=90,
                    va="top", ha="right", fontsize=8, color="#555555",
                    bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.85))
    ax.set_xlabel(xlabel)
    ax.set_ylabel("memory (MiB)")
    if title:
        ax.set_title(title)
    ax.legend(loc="upper left")
    return fig


def segment_map(
    segments: Sequence[Mapping[str, Any]],
    *,
    title: str = "",
    ax: Any = None,
    label_min_fraction: float = 0.08,
) -> Figure:
    """One horizontal bar per segment, blocks colored by state, sizes labelled.

    Args:
        segments: dicts with ``total_size`` (bytes), ``pool`` ('small' or 'large') and
            ``blocks``: a list of dicts with ``size`` (bytes) and ``state``
            ('active_allocated', 'active_pending_free' or 'inactive'), in address order.
            An optional ``label`` replaces the default row label.
        label_min_fraction: blocks narrower than this share of the widest segment get
            no size label.

    Raises:
        ValueError: a segment whose blocks do not add up to its size, or an unknown state.
    """
    if ax is None:
        fig, ax = new_figure(height=max(1.6, 0.42 * len(segments) + 1.0))
    else:
        fig = ax.figure
    widest = max((s["total_size"] for s in segments), default=1)
    for row, seg in enumerate(segments):
        offset = 0
        if sum(b["size"] for b in seg["blocks"]) != seg["total_size"]:
            raise ValueError(f"segment {row}: blocks add up to {sum(b['size'] for b in seg['blocks'])} "
                             f"bytes, not its total_size {seg['total_size']}")
        for block in seg["blocks"]:
            state = block["state"]
            if state not in STATE_COLORS:
                raise ValueError(f"unknown block state {state!r}; expected one of {sorted(STATE_COLORS)}")
            ax.barh(row, mib(block["size"]), left=mib(offset), height=0.7,
                    color=STATE_COLORS[state], edgecolor="white", linewidth=0.8)
            if block["size"] >= label_min_fraction * widest:
                ax.text(mib(offset + block["size"] / 2), row, format_bytes(block["size"], digits=3), ha="center",
                        va="center", fontsize=7, color="white" if state != "inactive" else "#333333")
            offset += block["size"]
    ax.set_yticks(range(len(segments)))
    ax.set_yticklabels([s.get("label") or f"{s['pool']} · {format_bytes(s['total_size'], digits=3)}" for s in segments])
    ax.invert_yaxis()
    ax.set_xlabel("offset in segment (MiB)")
    ax.grid(axis="y", visible=False)
    if title:
        ax.set_title(title)
    ax.legend(handles=[Patch(color=STATE_COLORS[s], label=STATE_LABELS[s]) for s in STATE_COLORS],
              loc="lower right", fontsize=8, bbox_to_anchor=(1.0, 1.0), ncol=3)
    return fig




def stream_lanes(
    lanes: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    marks: Iterable[tuple[float, str]] = (),
    title: str = "",
    ax: Any = None,
) -> Figure:
    """A timeline with one lane per stream (or the host), intervals as boxes.

    Args:
        lanes: lane name -> intervals, each a dict with ``start_ms``, ``end_ms``,
            optional ``label`` and ``color`` (a palette index or a color).
        marks: (time in ms, label) pairs drawn as vertical lines (e.g. a free).

    Raises:
        ValueError: an interval that ends before it starts.
    """
    if ax is None:
        fig, ax = new_figure(height=max(1.8, 0.6 * len(lanes) + 1.0))
    else:
        fig = ax.figure
    for row, (lane, intervals) in enumerate(lanes.items()):
        for iv in intervals:
            start, end = float(iv["start_ms"]), float(iv["end_ms"])
            if end < start:
                raise ValueError(f"lane {lane!r}: interval ends at {end} ms before it starts at {start} ms")
            color = iv.get("color", 0)
            color = PALETTE[color % len(PALETTE)] if isinstance(color, int) else color
            ax.barh(row, end - start, left=start, height=0.6, color=color, edgecolor="white", linewidth=0.6)
            if iv.get("label"):
                ax.text((start + end) / 2, row, str(iv["label"]), ha="center", va="center", fontsize=7,
                        color="white", clip_on=True)
    for x, label in marks:
        ax.axvline(x, color="#b5403a", linestyle=":", linewidth=1)
        ax.annotate(label, (x, 1.0), xycoords=("data", "axes fraction"), rotation=90, va="top",
                    ha="right", fontsize=7, color="#b5403a")
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels(list(lanes))
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.grid(axis="y", visible=False)
    if title:
        ax.set_title(title)
    return fig


def bars(
    labels: Sequence[str],
    values: Sequence[float],
    *,
    ylabel: str,
    errors: Sequence[tuple[float, float]] | None = None,
    colors: Sequence[str] | None = None,
    title: str = "",
    ax: Any = None,
    annotate_fmt: str = "{:.0f}",
) -> Figure:
    """A bar per label, values annotated; ``errors`` are (low, high) absolute bounds (e.g. p10, p90).

    ``ylabel`` must name the unit, e.g. 'peak active (MiB)'.
    """
    if len(labels) != len(values):
        raise ValueError(f"{len(labels)} labels for {len(values)} values")
    if "(" not in ylabel:
        raise ValueError(f"ylabel must name a unit in parentheses, got {ylabel!r}")
    if ax is None:
        fig, ax = new_figure(width=max(4.0, 1.1 * len(labels) + 2))
    else:
        fig = ax.figure
    yerr = None
    if errors is not None:
        yerr = [[v - lo for v, (lo, _) in zip(values, errors)], [hi - v for v, (_, hi) in zip(values, errors)]]
    rects = ax.bar(list(labels), list(values), color=list(colors) if colors else PALETTE[0], yerr=yerr, capsize=3)
    for rect, v in zip(rects, values):
        ax.annotate(annotate_fmt.format(v), (rect.get_x() + rect.get_width() / 2, rect.get_height()),
                    ha="center", va="bottom", fontsize=8, xytext=(0, 2), textcoords="offset points")
    ax.set_ylabel(ylabel)
    ax.grid(axis="x", visible=False)
    if title:
        ax.set_title(title)
    return fig
