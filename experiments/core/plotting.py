"""The book's figures: one style, units on every axis (MiB, ms), provenance in the footer.

Functions here draw shapes every chapter needs (memory over time, segment maps,
stream timelines, bars) from plain numbers; chapter modules turn their results into
those numbers. Each function returns a closed :class:`matplotlib.figure.Figure`, so a
notebook shows it once, as the cell's value, and widgets can redraw without leaking.

Two layouts: the default one, for the book's 688 px column and for notebooks,
and a narrow one for phones (:func:`narrow`): :data:`NARROW_WIDTH` inches wide, panels that
stand side by side stacked, drawn at :data:`NARROW_DPI`. The static book offers both
through ``<picture>`` and lets the browser choose (``experiments.core.explorer``); a
function decorated with :func:`figure_function` remembers its call, so that its figure
can be drawn again in the other layout. :func:`text_collisions` and
:func:`smallest_font_pt` (from :mod:`.figure_text`) measure a drawn figure (the book's
tests assert on them).
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import matplotlib
import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.transforms import blended_transform_factory, offset_copy

from .figure_text import save_measured, smallest_font_pt, text_collisions  # noqa: F401  (re-exported)
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


# Sizes. A figure's text shows at font_pt * dpi / 72 * (displayed / natural width)
# CSS px; bbox_inches="tight" adds about 0.16 in to the natural width. The book's column is
# 688 px wide at 1280 px (686 inside an explorer), so a default-layout figure of MAX_WIDTH
# inches (897 px at 110 dpi) is shown at 0.76 of its pixels and its smallest text,
# MIN_FONT_PT, at 8 * 110 / 72 * 0.76 = 9.4 px. On a 390 px phone the column is 358 px, and
# 336 px inside an exercise or solution box: the narrow layout is NARROW_WIDTH inches wide,
# so 8 pt shows at 8 * 336 / (72 * 3.96) = 9.4 px there, whatever the DPI (NARROW_DPI only
# makes it sharp on screens of 2-3 device pixels per px).
MAX_WIDTH = 8.0
MIN_FONT_PT = 8
FOOTER_PT = 9
WIDE_DPI = 110
NARROW_WIDTH = 3.8
NARROW_DPI = 180
NARROW_FOOTER_PT = 8

NARROW_STYLE = {
    **STYLE,
    "figure.dpi": NARROW_DPI,
    "savefig.dpi": NARROW_DPI,
    "font.size": 9,
    "axes.titlesize": 9.5,
    "axes.labelsize": 9,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "legend.fontsize": 8,
    "legend.title_fontsize": 8.5,
}

_LAYOUT: contextvars.ContextVar[str] = contextvars.ContextVar("memlab_figure_layout", default="wide")


@contextlib.contextmanager
def narrow() -> Iterator[None]:
    """Draw figures in the narrow layout (phones) inside this block."""
    token = _LAYOUT.set("narrow")
    try:
        yield
    finally:
        _LAYOUT.reset(token)


def is_narrow() -> bool:
    """True inside :func:`narrow`."""
    return _LAYOUT.get() == "narrow"


def style() -> dict[str, Any]:
    """The rc settings of the current layout."""
    return NARROW_STYLE if is_narrow() else STYLE


def pick(wide: Any, narrow_value: Any) -> Any:
    """``wide`` in the default layout, ``narrow_value`` in the narrow one (a size, a legend place...)."""
    return narrow_value if is_narrow() else wide


def figure_function(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a function that returns a Figure: it runs in the current layout's style, and
    the figure remembers the call (``fig.memlab_recipe``), so :func:`redraw` can draw it
    again in the other layout. A call that draws into a given ``ax`` records nothing: its
    caller's call is the one to repeat."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with plt.rc_context(style()):
            fig = fn(*args, **kwargs)
        if isinstance(fig, Figure) and kwargs.get("ax") is None:
            fig.memlab_recipe = (wrapper, args, kwargs)
        return fig
    return wrapper


def redraw(fig: Figure, *, narrow_layout: bool) -> Figure | None:
    """``fig`` drawn again by the call that made it, in the narrow or the default layout;
    None for a figure no :func:`figure_function` made."""
    recipe = getattr(fig, "memlab_recipe", None)
    if recipe is None:
        return None
    fn, args, kwargs = recipe
    if narrow_layout:
        with narrow():
            return fn(*args, **kwargs)
    token = _LAYOUT.set("wide")
    try:
        return fn(*args, **kwargs)
    finally:
        _LAYOUT.reset(token)


def new_figure(nrows: int = 1, ncols: int = 1, *, width: float = 7.5, height: float = 3.4,
               narrow_height: float | None = None, narrow_ratios: Sequence[float] | None = None,
               **kwargs: Any) -> tuple[Figure, Any]:
    """A figure in the book's style; returns (fig, axes) like ``plt.subplots``.

    ``width`` (inches) is capped at :data:`MAX_WIDTH` so that text stays readable in the
    book's column; ``height`` is kept. In the narrow layout (:func:`narrow`) the figure is
    :data:`NARROW_WIDTH` wide, and the panels of a single row are stacked in one column
    (``axes`` keeps the shape the caller asked for), each as tall as in the default layout
    unless ``narrow_height`` (inches, the whole figure) says otherwise; ``narrow_ratios``
    are then the stacked panels' height ratios.
    """
    if is_narrow():
        if nrows == 1 and ncols > 1:
            kw = dict(kwargs)
            squeeze = kw.pop("squeeze", True)
            gs = dict(kw.pop("gridspec_kw", None) or {})
            gs.pop("width_ratios", None)  # the panels now share the width
            if narrow_ratios is not None:
                gs["height_ratios"] = list(narrow_ratios)
            with plt.rc_context(NARROW_STYLE):
                fig, axes = plt.subplots(ncols, 1, figsize=(NARROW_WIDTH, narrow_height or height * ncols),
                                         layout="constrained", gridspec_kw=gs or None, squeeze=False, **kw)
            plt.close(fig)
            axes = axes.reshape(1, ncols)
            return fig, (axes[0] if squeeze else axes)
        with plt.rc_context(NARROW_STYLE):
            fig, axes = plt.subplots(nrows, ncols, figsize=(NARROW_WIDTH, narrow_height or height),
                                     layout="constrained", **kwargs)
        plt.close(fig)
        return fig, axes
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
    fig.text(0.0, 0.0, "\n".join(lines), ha="left", va="top", fontsize=NARROW_FOOTER_PT if is_narrow() else FOOTER_PT,
             color="#555555", transform=fig.transFigure)
    fit_text(fig)
    return fig


# DejaVu Sans, the default font, averages a little over half an em per character.
_EM_PER_CHAR = 0.58


def _wrap(text_obj: Any, width_pt: float) -> None:
    """Wrap a Text's lines to about ``width_pt`` points."""
    import textwrap

    chars = max(20, int(width_pt / (text_obj.get_fontsize() * _EM_PER_CHAR)))
    text = text_obj.get_text()
    if any(len(line) > chars for line in text.splitlines()):
        text_obj.set_text("\n".join(textwrap.fill(line, chars) if len(line) > chars else line
                                     for line in text.splitlines()))


def _xlabel_width_pt(ax: Any) -> float:
    fig_pt = ax.figure.get_figwidth() * 72
    return max(1.1 * ax.get_position().width * fig_pt, fig_pt / 3)


def fit_text(fig: Figure) -> Figure:
    """Wrap the figure's own texts (footer, suptitle, legend titles), the axes titles and the
    axis labels to their width (a y label to the axes' height).

    A line wider than the figure widens the saved PNG (``bbox_inches="tight"``), which the
    book then shows scaled down, every label with it; matplotlib's own ``wrap=True`` does not
    wrap against the tight box. Widths are estimated from the font size (pt), not measured,
    so this needs no renderer.
    """
    wrap = _wrap
    fig_pt = fig.get_figwidth() * 72
    for t in fig.texts:
        wrap(t, fig_pt)
    for leg in fig.legends:
        wrap(leg.get_title(), fig_pt)
    for ax in fig.axes:
        ax_pt = ax.get_position().width * fig_pt
        for t in (ax.title, ax._left_title, ax._right_title):
            wrap(t, max(1.15 * ax_pt, fig_pt / 3))  # a title may reach a little past its axes
        wrap(ax.xaxis.label, _xlabel_width_pt(ax))
        wrap(ax.yaxis.label, 1.1 * ax.get_position().height * fig.get_figheight() * 72)
    return fig


def legend_below(ax: Any, *, xticklines: float = 1.0, **kwargs: Any) -> Any:
    """``ax.legend(**kwargs)`` centred under the axes' x label, where it covers nothing.

    Args:
        xticklines: at least how many text lines tall the x tick labels are (their text and
            rotation are measured too: set them before calling this).
    """
    import math

    _wrap(ax.xaxis.label, _xlabel_width_pt(ax))  # as fit_text will: the label's height is final
    fs = plt.rcParams["font.size"]
    ticks = [t for t in ax.xaxis.get_ticklabels() if t.get_text()]
    tick_pt = 1.25 * (ticks[0].get_fontsize() if ticks else fs) * xticklines
    for t in ticks:  # how far each tick label reaches down, turned as it is
        lines = t.get_text().splitlines() or [""]
        angle = math.radians(t.get_rotation() % 180)
        wide = max(len(line) for line in lines) * _EM_PER_CHAR * t.get_fontsize()
        tall = 1.25 * t.get_fontsize() * len(lines)
        tick_pt = max(tick_pt, wide * abs(math.sin(angle)) + tall * abs(math.cos(angle)))
    label_lines = len(ax.get_xlabel().splitlines()) if ax.get_xlabel() else 0
    label = ax.xaxis.label.get_fontsize()
    drop = 7 + tick_pt + (4 + 1.25 * label * label_lines if label_lines else 0)
    # in the narrow layout the axes stand in one column: centre on the figure, not on the
    # axes that its tick labels push to the right
    x_ref = ax.figure.transFigure if is_narrow() else ax.transAxes
    below = offset_copy(blended_transform_factory(x_ref, ax.transAxes), fig=ax.figure, y=-drop, units="points")
    kwargs.setdefault("loc", "upper center")
    kwargs.setdefault("bbox_to_anchor", (0.5, 0.0))
    return ax.legend(bbox_transform=below, **kwargs)




@figure_function
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
                    va="top", ha="right", fontsize=MIN_FONT_PT, color="#555555",
                    bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.85))
    ax.set_xlabel(xlabel)
    ax.set_ylabel("memory (MiB)")
    if title:
        ax.set_title(title)
    ax.legend(loc="upper left")
    return fig


@figure_function
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
    # the axes' width in points, before the layout runs (tick labels take about 1.2 in)
    axes_pt = max(72.0, (ax.get_position().width * fig.get_figwidth() - 1.2) * 72)
    seen: list[str] = []
    for row, seg in enumerate(segments):
        offset = 0
        if sum(b["size"] for b in seg["blocks"]) != seg["total_size"]:
            raise ValueError(f"segment {row}: blocks add up to {sum(b['size'] for b in seg['blocks'])} "
                             f"bytes, not its total_size {seg['total_size']}")
        for block in seg["blocks"]:
            state = block["state"]
            if state not in STATE_COLORS:
                raise ValueError(f"unknown block state {state!r}; expected one of {sorted(STATE_COLORS)}")
            if state not in seen:
                seen.append(state)
            ax.barh(row, mib(block["size"]), left=mib(offset), height=0.7,
                    color=STATE_COLORS[state], edgecolor="white", linewidth=0.8)
            text = format_bytes(block["size"], digits=3)
            # a label only where the block is wider than the label (and than label_min_fraction)
            fits = block["size"] / widest * axes_pt > (len(text) * _EM_PER_CHAR + 1) * MIN_FONT_PT
            if block["size"] >= label_min_fraction * widest and fits:
                ax.text(mib(offset + block["size"] / 2), row, text, ha="center",
                        va="center", fontsize=MIN_FONT_PT, color="white" if state != "inactive" else "#333333")
            offset += block["size"]
    ax.set_yticks(range(len(segments)))
    ax.set_yticklabels([s.get("label") or f"{s['pool']} · {format_bytes(s['total_size'], digits=3)}" for s in segments])
    ax.invert_yaxis()
    ax.set_xlabel("offset in segment (MiB)")
    ax.grid(axis="y", visible=False)
    if title:
        ax.set_title(title)
    # Only the states some block is in, in a row under the axis label: above the axes the
    # legend would cover a title.
    states = [s for s in STATE_COLORS if s in seen]
    legend_below(ax, handles=[Patch(color=STATE_COLORS[s], label=STATE_LABELS[s]) for s in states],
                 loc="upper right", bbox_to_anchor=(1.0, 0.0), fontsize=MIN_FONT_PT,
                 ncol=len(states) if len(states) < 3 or not is_narrow() else 2)
    return fig


@figure_function
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
            optional ``label`` (shown where the box is wide enough, else ``short_label`` if
            that fits) and ``color`` (a palette index or a color).
        marks: (time in ms, label) pairs drawn as vertical lines (e.g. a free).

    Raises:
        ValueError: an interval that ends before it starts.
    """
    if ax is None:
        fig, ax = new_figure(height=max(1.8, 0.6 * len(lanes) + 1.0))
    else:
        fig = ax.figure
    ends = [float(iv["end_ms"]) for ivs in lanes.values() for iv in ivs] + [x for x, _ in marks]
    span = max(ends, default=1.0) or 1.0
    # the axes' width in points before the layout runs (lane names take about 1.1 in)
    axes_pt = max(72.0, (ax.get_position().width * fig.get_figwidth() - 1.1) * 72)
    for row, (lane, intervals) in enumerate(lanes.items()):
        for iv in intervals:
            start, end = float(iv["start_ms"]), float(iv["end_ms"])
            if end < start:
                raise ValueError(f"lane {lane!r}: interval ends at {end} ms before it starts at {start} ms")
            color = iv.get("color", 0)
            color = PALETTE[color % len(PALETTE)] if isinstance(color, int) else color
            ax.barh(row, end - start, left=start, height=0.6, color=color, edgecolor="white", linewidth=0.6)
            # a label only where the box is wider than the label (or than its short form)
            room = (end - start) / span * axes_pt
            fits = [t for t in (str(iv.get("label") or ""), str(iv.get("short_label") or ""))
                    if t and room > (len(t) * _EM_PER_CHAR + 1) * MIN_FONT_PT]
            text = fits[0] if fits else ""
            if text:
                ax.text((start + end) / 2, row, text, ha="center", va="center", fontsize=MIN_FONT_PT,
                        color="white", clip_on=True)
    for x, label in marks:
        ax.axvline(x, color="#b5403a", linestyle=":", linewidth=1)
        ax.annotate(label, (x, 1.0), xycoords=("data", "axes fraction"), rotation=90, va="top",
                    ha="right", fontsize=MIN_FONT_PT, color="#b5403a")
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels(list(lanes))
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.grid(axis="y", visible=False)
    if title:
        ax.set_title(title)
    return fig


@figure_function
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
