"""The book's figures: one style, units on every axis (MiB, ms), provenance in the footer.

Functions here draw shapes every chapter needs (memory over time, segment maps,
stream timelines, bars) from plain numbers; chapter modules turn their results into
those numbers. Each function returns a closed :class:`matplotlib.figure.Figure`, so a
notebook shows it once, as the cell's value, and widgets can redraw without leaking.

Two layouts (issue 19): the default one, for the book's 688 px column and for notebooks,
and a narrow one for phones (:func:`narrow`): :data:`NARROW_WIDTH` inches wide, panels that
stand side by side stacked, drawn at :data:`NARROW_DPI`. The static book offers both
through ``<picture>`` and lets the browser choose (``experiments.core.explorer``); a
function decorated with :func:`figure_function` remembers its call, so that its figure
can be drawn again in the other layout. :func:`text_collisions` and
:func:`smallest_font_pt` measure a drawn figure (the book's tests assert on them).
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


# Sizes (issue 19). A figure's text shows at font_pt * dpi / 72 * (displayed / natural width)
# CSS px. The book's column is 688 px wide at 1280 px, so a default-layout figure of
# MAX_WIDTH inches (902 px at 110 dpi) is shown at 0.76 of its pixels and its smallest text,
# MIN_FONT_PT, at 8 * 110 / 72 * 0.76 = 9.3 px. On a 390 px phone the column is about 358 px:
# the narrow layout is NARROW_WIDTH inches wide, so 8 pt shows at 8 * 358 / (72 * 4.0) = 9.9 px,
# whatever the DPI (NARROW_DPI only makes it sharp on screens of 2-3 device pixels per px).
MAX_WIDTH = 8.2
MIN_FONT_PT = 8
FOOTER_PT = 9
WIDE_DPI = 110
NARROW_WIDTH = 4.0
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
        source: a :class:`~experiments.registry.Result`, a list of them (one line if
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
            optional ``label`` (shown where the box is wide enough) and ``color`` (a palette
            index or a color).
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
            text = str(iv.get("label") or "")
            # a label only where the box is wider than the label
            if text and (end - start) / span * axes_pt > (len(text) * _EM_PER_CHAR + 1) * MIN_FONT_PT:
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


# ----------------------------------------------------------------------------- measuring a drawn figure

def _drawn_texts(fig: Figure) -> list[tuple[Any, Any]]:
    """(Text, the legend it belongs to or None) for every text the figure draws, non-empty and visible.

    Tick labels are those of the ticks inside the view limits (the ones drawn)."""
    from matplotlib.text import Text

    out: list[tuple[Any, Any]] = []
    seen: set[int] = set()

    def add(t: Any, owner: Any = None) -> None:
        if isinstance(t, Text) and t.get_visible() and t.get_text().strip() and id(t) not in seen:
            seen.add(id(t))
            out.append((t, owner))

    def add_legend(leg: Any) -> None:
        if leg is not None and leg.get_visible():
            for t in [*leg.get_texts(), leg.get_title()]:
                add(t, leg)

    for t in fig.texts:
        add(t)
    for t in (getattr(fig, "_suptitle", None), getattr(fig, "_supxlabel", None), getattr(fig, "_supylabel", None)):
        if t is not None:
            add(t)
    for leg in fig.legends:
        add_legend(leg)
    for ax in fig.axes:
        if not ax.get_visible() or not ax.axison and not ax.texts:
            continue
        for t in (ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label):
            add(t)
        for axis in (ax.xaxis, ax.yaxis):
            for tick in axis._update_ticks():  # the ticks inside the view limits: the drawn ones
                add(tick.label1)
                add(tick.label2)
        for t in ax.texts:
            add(t)
        add_legend(ax.get_legend())
    return out


def save_measured(fig: Figure, *, dpi: float | None = None) -> tuple[bytes, dict[str, Any]]:
    """Save ``fig`` as a PNG as the book does (``bbox_inches="tight"``) and measure it as drawn.

    Measured during the save itself: a tight box moves figure-level legends and texts, so
    the figure as it was before saving is not what the PNG shows.

    Returns:
        (the PNG's bytes, {'font_pt': the smallest font size in pt, 'collisions': a list of
        sentences, see :func:`text_collisions`}).
    """
    import io

    measured: dict[str, Any] = {}

    def on_draw(event: Any) -> None:
        measured["font_pt"] = min((t.get_fontsize() for t, _ in _drawn_texts(fig)), default=0.0)
        measured["collisions"] = _collisions(fig, event.renderer)

    cid = fig.canvas.mpl_connect("draw_event", on_draw)
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", bbox_inches="tight", dpi=dpi or fig.dpi)
    finally:
        fig.canvas.mpl_disconnect(cid)
    return buf.getvalue(), measured


def smallest_font_pt(fig: Figure) -> float:
    """The smallest font size (pt) of the texts the figure draws (0 for a figure without text)."""
    return save_measured(fig)[1]["font_pt"]


def _shrunk(bb: Any, by: float) -> tuple[float, float, float, float]:
    return bb.x0 + by, bb.y0 + by, bb.x1 - by, bb.y1 - by


def _overlap(a: tuple, b: tuple) -> bool:
    return min(a[2], b[2]) > max(a[0], b[0]) and min(a[3], b[3]) > max(a[1], b[1])


def _text_corners(t: Any, renderer: Any, pad: float) -> Any:
    """The four corners (display px) of a text's box grown by ``pad`` px, turned with the text:
    a rotated tick label's own rectangle, not the upright box around it."""
    import numpy as np
    from matplotlib.text import Text

    bb = Text.get_window_extent(t, renderer)
    angle = t.get_rotation() % 90
    if min(angle, 90 - angle) < 1e-6:
        return np.array([[bb.x0 - pad, bb.y0 - pad], [bb.x1 + pad, bb.y0 - pad], [bb.x1 + pad, bb.y1 + pad],
                         [bb.x0 - pad, bb.y1 + pad]])
    flat = Text(0, 0, t.get_text(), fontproperties=t.get_fontproperties(), linespacing=t.get_linespacing())
    flat.set_figure(t.figure)
    fb = flat.get_window_extent(renderer)
    w, h = fb.width / 2 + pad, fb.height / 2 + pad
    # a rotated rectangle's upright box has the same centre
    theta = np.radians(t.get_rotation())
    rot = np.array([[np.cos(theta), -np.sin(theta)], [np.sin(theta), np.cos(theta)]])
    corners = np.array([[-w, -h], [w, -h], [w, h], [-w, h]]) @ rot.T
    return corners + [(bb.x0 + bb.x1) / 2, (bb.y0 + bb.y1) / 2]


def _quads_overlap(p: Any, q: Any) -> bool:
    """Whether two convex quadrilaterals overlap (separating axis theorem)."""
    import numpy as np

    for poly in (p, q):
        for k in range(4):
            edge = poly[(k + 1) % 4] - poly[k]
            axis = np.array([-edge[1], edge[0]])
            a, b = p @ axis, q @ axis
            if a.max() <= b.min() or b.max() <= a.min():
                return False
    return True


def _inside(a: tuple, b: tuple) -> bool:
    return a[0] >= b[0] and a[1] >= b[1] and a[2] <= b[2] and a[3] <= b[3]


def text_collisions(fig: Figure) -> list[str]:
    """Where the figure's texts cover each other or are covered, as sentences (empty: none),
    in the figure as the book saves it (see :func:`save_measured`).

    Four kinds: two texts whose boxes overlap or come closer than 1 pt (tick labels,
    titles, labels, annotations, legend entries of different legends), a legend over a
    text not its own, a data line
    (or its markers) through the text of its axes' legend, and a text in an axes that
    straddles the edge of a bar or box of that axes (partly on it, partly off: a label
    printed across bars). A text wholly inside one bar (a bar's own label) and a
    text on an opaque box of its own are legible and not reported. For the last three
    kinds boxes are shrunk by 0.75 pt before comparing, so that a mere touch does not count.
    """
    return save_measured(fig)[1]["collisions"]


def _line_crosses(line: Any, boxes: Sequence[tuple], renderer: Any) -> bool:
    """Whether a plotted line (or its markers) passes through any of ``boxes`` (display px)."""
    import numpy as np
    from matplotlib.lines import STEP_LOOKUP_MAP
    from matplotlib.path import Path
    from matplotlib.transforms import Bbox

    xy = np.column_stack([np.asarray(line.get_xdata(), float), np.asarray(line.get_ydata(), float)])
    if len(xy) == 0:
        return False
    if line.get_drawstyle() in STEP_LOOKUP_MAP and line.get_drawstyle() != "default":
        xy = np.column_stack(STEP_LOOKUP_MAP[line.get_drawstyle()](*xy.T))
    pts = line.get_transform().transform(xy)
    pts = pts[np.isfinite(pts).all(axis=1)]
    if len(pts) == 0:
        return False
    clip = line.axes.bbox
    for box in boxes:
        bb = Bbox.from_extents(*box)
        if line.get_linestyle() not in ("None", "none", "", " ") and len(pts) > 1:
            if Path(pts).intersects_bbox(bb, filled=False) and bb.overlaps(clip):
                return True
        if line.get_marker() not in (None, "None", "none", "", " "):
            r = line.get_markersize() * renderer.points_to_pixels(1.0) / 2
            if any(bb.x0 - r <= x <= bb.x1 + r and bb.y0 - r <= y <= bb.y1 + r for x, y in pts):
                return True
    return False


def _collisions(fig: Figure, renderer: Any, tolerance_pt: float = 0.75) -> list[str]:
    from matplotlib.patches import Rectangle
    from matplotlib.text import Text

    texts = _drawn_texts(fig)
    tol = tolerance_pt * fig.dpi / 72
    extents = [Text.get_window_extent(t, renderer) for t, _ in texts]
    boxes = [_shrunk(bb, tol) for bb in extents]
    # two texts need a gap of at least 1 pt between them: '256' and '256' that touch read '256256'
    spaced = [_text_corners(t, renderer, 0.5 * fig.dpi / 72) for t, _ in texts]
    problems = []

    def name(t: Any) -> str:
        return repr(" ".join(t.get_text().split())[:40])

    for i, (a, la) in enumerate(texts):
        for j in range(i + 1, len(texts)):
            b, lb = texts[j]
            if la is not None and la is lb:
                continue
            if _quads_overlap(spaced[i], spaced[j]):
                problems.append(f"text {name(a)} overlaps text {name(b)}")
    legends = [leg for leg in fig.legends if leg.get_visible()]
    legends += [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None and ax.get_legend().get_visible()]
    for leg in legends:
        lb = _shrunk(leg.get_window_extent(renderer), tol)
        for (t, owner), box in zip(texts, boxes):
            if owner is not leg and _overlap(lb, box):
                problems.append(f"the legend covers text {name(t)}")
    for ax in fig.axes:
        leg = ax.get_legend()
        if leg is None or not leg.get_visible():
            continue
        own = [box for (t, owner), box in zip(texts, boxes) if owner is leg]
        for line in ax.lines:
            if line.get_visible() and line.get_label() and _line_crosses(line, own, renderer):
                what = "" if line.get_label().startswith("_") else f" {line.get_label()!r}"
                problems.append(f"a data line{what} runs through the legend's text")
    for (t, owner), box in zip(texts, boxes):
        ax = t.axes
        if owner is not None or ax is None or t not in ax.texts:
            continue
        patch = t.get_bbox_patch()
        if patch is not None and patch.get_facecolor()[3] >= 0.8:
            continue  # printed on a box of its own
        clip = ax.bbox
        for p in ax.patches:
            if not isinstance(p, Rectangle) or not p.get_visible() or p.get_facecolor()[3] == 0:
                continue
            pb = p.get_window_extent(renderer)
            pb = (max(pb.x0, clip.x0), max(pb.y0, clip.y0), min(pb.x1, clip.x1), min(pb.y1, clip.y1))
            if pb[2] - pb[0] < 1 or pb[3] - pb[1] < 1:
                continue
            if _overlap(box, pb) and not _inside(box, (pb[0] - tol, pb[1] - tol, pb[2] + tol, pb[3] + tol)):
                problems.append(f"text {name(t)} is printed across a bar")
                break
    return list(dict.fromkeys(problems))
