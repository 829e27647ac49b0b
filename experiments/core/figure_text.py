"""Measuring a drawn figure's text: its smallest font and the texts that cover
each other, as the book saves the figure (``bbox_inches="tight"``).

The book's build writes both onto every figure it shows
(``experiments.core.explorer.figure_html``) and the browser tests assert on them;
``scripts/figure_gallery.py`` lists them for every figure of a page.
"""
from __future__ import annotations

from typing import Any, Sequence

from matplotlib.figure import Figure

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


def save_measured(fig: Figure, *, dpi: float | None = None, format: str = "png") -> tuple[bytes, dict[str, Any]]:
    """Save ``fig`` as the book does (``bbox_inches="tight"``) and measure it as drawn.

    Measured during the save itself: a tight box moves figure-level legends and texts, so
    the figure as it was before saving is not what the PNG shows.

    Args:
        format: ``"png"``, or ``"rgba"`` for the pixels themselves (8-bit RGBA, rows from the
            top; ``size_px`` gives their width and height): the same pixels as the PNG's, without
            compressing them for a caller that only decodes them again.

    Returns:
        (the file's bytes, {'font_pt': the smallest font size in pt, 'collisions': a list of
        sentences, see :func:`text_collisions`, 'size_px': (width, height) of the image}).

    Raises:
        ValueError: ``format`` is neither "png" nor "rgba".
    """
    import io

    if format not in ("png", "rgba"):
        raise ValueError(f"format must be 'png' or 'rgba', got {format!r}")
    measured: dict[str, Any] = {}

    def on_draw(event: Any) -> None:
        # A figure with a layout engine is drawn twice per save: first with the renderer's
        # draw_* methods stubbed out (``RendererBase._draw_disabled``, only to lay it out), then
        # for real. What the first draw measured was always overwritten by the second; skipping
        # it saves about 7 % of a figure variant's time.
        if "draw_path" in vars(event.renderer):
            return
        measured["font_pt"] = min((t.get_fontsize() for t, _ in _drawn_texts(fig)), default=0.0)
        measured["collisions"] = _collisions(fig, event.renderer)
        measured["size_px"] = (int(event.renderer.width), int(event.renderer.height))

    cid = fig.canvas.mpl_connect("draw_event", on_draw)
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format=format, bbox_inches="tight", dpi=dpi or fig.dpi)
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
