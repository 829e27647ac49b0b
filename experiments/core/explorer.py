"""A recorded-grid explorer that needs no kernel: the static book's form of ``panel()``.

When the book is built (``CUDA_MEMLAB_STATIC=1``, set by ``make book``) in recorded mode,
:func:`experiments.core.widgets.panel` returns an :class:`Explorer` instead of ipywidgets,
whose views need a live kernel and the widget JavaScript from a CDN. The explorer
renders every recorded point of the grid once, at build time, and writes plain HTML:
native, labelled form controls (``<input type="range">`` over the recorded values,
``<select>`` or radio buttons) and one ``<figure>`` per point. The small script the book
ships (``book/_static/memlab.js``) shows the figure of the point the controls select.
A parameter recorded at one value only is held fixed, not offered as a control, and a
control set to a value that was not recorded with the others moves them to the nearest
recorded point, so that no combination the page offers leads nowhere.

Figures: :func:`figure_html` writes a figure as ``<picture>`` with two PNGs,
the default layout and the narrow one (``experiments.core.plotting.narrow``) for screens
under :data:`NARROW_MEDIA`, so that phones get a figure drawn for their width; the
``<img>`` carries alt text naming the figure's titles and parameters, and each variant its
smallest font size (pt), DPI and text collisions for the book's browser tests. The images
are inline ``data:`` URIs in the notebook's output; the book's Sphinx extension
(``book/_ext/memlab_book.py``) moves them into image files. While the book is built,
:func:`install_book_figures` makes every Figure a cell shows go through :func:`figure_html`.
"""
from __future__ import annotations

import base64
import html
import io
import itertools
import json
import os
from typing import Any, Callable, Mapping, Sequence

STATIC_ENV = "CUDA_MEMLAB_STATIC"
# Radio buttons up to this many choices, a <select> beyond.
MAX_RADIOS = 5


def static_build() -> bool:
    """True while the book is built into static pages (``CUDA_MEMLAB_STATIC=1``)."""
    return os.environ.get(STATIC_ENV, "") == "1"


# Screens this narrow get the narrow figures: below it the book's column is narrower
# than about 690 px, where a default-layout figure's 8 pt text would fall under 9 px.
NARROW_MEDIA = "(max-width: 719.98px)"


def _palette_png(data: Any) -> bytes:
    """A PNG (``data``: its bytes, or a Pillow image) reduced to a 256-colour palette: the book's
    figures use a few flat colours, so nothing visible is lost and the file is 3-4x smaller
    (FASTOCTREE is the fastest of Pillow's quantizers and the smallest here)."""
    from PIL import Image

    img = (data if isinstance(data, Image.Image) else Image.open(io.BytesIO(data))).convert("RGB")
    out = io.BytesIO()
    img.quantize(colors=256, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE).save(
        out, format="PNG", optimize=True)
    return out.getvalue()


def png_bytes(fig: Any, dpi: float | None = None) -> bytes:
    """A matplotlib Figure as a small PNG: saved like the inline backend, then reduced to a palette."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight", dpi=dpi or fig.dpi)
    return _palette_png(buf.getvalue())


def _variant(fig: Any) -> dict[str, Any]:
    """One drawn figure: its PNG and what the book's tests measure on it."""
    from PIL import Image

    from .figure_text import save_measured

    # the pixels as drawn, not a PNG: compressing them only to decode them again here cost
    # about 57 ms of a figure variant's 480 (a static build draws two variants per recorded point)
    raw, measured = save_measured(fig, format="rgba")
    width, height = measured["size_px"]
    data = _palette_png(Image.frombuffer("RGBA", (width, height), raw, "raw", "RGBA", 0, 1))
    return {"uri": "data:image/png;base64," + base64.b64encode(data).decode("ascii"), "width": width,
            "height": height, "font_pt": measured["font_pt"], "dpi": fig.dpi, "collisions": measured["collisions"]}


def _measures(v: Mapping[str, Any]) -> str:
    return (f'width="{v["width"]}" height="{v["height"]}" data-font-pt="{v["font_pt"]:g}" data-dpi="{v["dpi"]:g}" '
            f'data-collisions="{html.escape(json.dumps(v["collisions"]))}"')


def figure_alt(fig: Any) -> str:
    """Alt text for a figure: its titles, then the experiment and parameters it shows (from the
    results its :func:`~experiments.core.plotting.figure_function` call was given)."""
    from .registry import Result, get

    def clean(t: Any) -> str:
        return " ".join(t.get_text().split()) if t is not None else ""

    titles = [clean(getattr(fig, "_suptitle", None))]
    titles += [clean(leg.get_title()) for leg in fig.legends]
    titles += [clean(ax.title) for ax in fig.axes]
    titles = [t for t in dict.fromkeys(titles) if t]
    results: list[Any] = []
    recipe = getattr(fig, "memlab_recipe", None)
    for arg in (list(recipe[1]) + list(recipe[2].values())) if recipe else []:
        for a in (arg if isinstance(arg, (list, tuple)) else [arg]):
            if isinstance(a, Result):
                results.append(a)
    shown = []
    for r in results:
        try:
            title = get(r.experiment).title
        except ValueError:
            title = r.experiment
        params = ", ".join(f"{k} = {_label(v)}" for k, v in r.params.items())
        shown.append(f"{title} ({params})" if params else title)
    kind = "Figure" if not results else ("Figure of " + "; ".join(dict.fromkeys(shown)))
    return (kind + (": " + ". ".join(titles) if titles else "") + ".").replace("..", ".")


def figure_html(fig: Any, alt: str | None = None) -> str:
    """``fig`` as ``<picture>``: the default layout, and for screens under :data:`NARROW_MEDIA`
    the narrow one when the figure can be drawn again (a
    :func:`~experiments.core.plotting.figure_function` made it).

    Both images are ``data:`` URIs, lazily loaded; each carries ``width``/``height``, its
    smallest font (``data-font-pt``), its ``data-dpi`` and ``data-collisions`` (a JSON list
    of texts that cover each other, normally empty).
    """
    from .plotting import redraw

    wide = _variant(fig)
    small = redraw(fig, narrow_layout=True)
    source = ""
    if small is not None:
        n = _variant(small)
        source = f'<source media="{NARROW_MEDIA}" srcset="{n["uri"]}" {_measures(n)}>'
    alt = alt if alt is not None else figure_alt(fig)
    return (f'<picture class="memlab-figure">{source}<img src="{wide["uri"]}" alt="{html.escape(alt)}" '
            f'loading="lazy" decoding="async" {_measures(wide)}></picture>')


def view_html(obj: Any, alt: str = "") -> str:
    """HTML for what a render function returned: a Figure, an object with ``_repr_html_``, or text."""
    from matplotlib.figure import Figure

    if isinstance(obj, Figure):
        return figure_html(obj, alt or None)
    if hasattr(obj, "_repr_html_"):
        return obj._repr_html_() or ""
    if hasattr(obj, "data") and isinstance(getattr(obj, "data"), str):  # IPython.display.HTML
        return obj.data
    return f"<pre>{html.escape(str(obj))}</pre>"


def install_book_figures() -> bool:
    """While the book is built (:func:`static_build`) inside IPython: show every Figure as
    :func:`figure_html` (text/html, which the book prefers to the PNG the notebook keeps).
    Returns whether it was installed."""
    if not static_build():
        return False
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    ip = get_ipython()
    if ip is None:
        return False
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    def register(*_: Any) -> None:
        html_formatter = ip.display_formatter.formatters["text/html"]
        if html_formatter.type_printers.get(Figure) is not figure_html:
            html_formatter.for_type(Figure, figure_html)

    # The inline backend, when it starts (at the first figure) or is set again, drops every
    # formatter registered for Figure but its own PNG one: start it now, and register again
    # before each cell.
    plt.close(plt.figure())
    register()
    ip.events.register("pre_run_cell", register)
    return True


def _label(v: Any) -> str:
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, (int, float)) and float(v).is_integer():
        return f"{int(v):,}"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


class Explorer:
    """Every recorded point of an experiment's grid, with controls to pick one, as static HTML.

    Args:
        exp: the :class:`~experiments.core.registry.Experiment`.
        title: shown above the controls.
        options: ``{parameter: recorded values}`` in control order (each list non-empty).
        fixed: parameters held at a value (not shown as controls).
        views: ``{tuple of values in control order: (point's parameters, HTML)}`` for the
            recorded points; combinations missing here were not recorded.
        default: the values shown first, in control order.
    """

    def __init__(self, exp: Any, title: str, options: Mapping[str, Sequence[Any]], fixed: Mapping[str, Any],
                 views: Mapping[tuple, tuple[dict, str]], default: tuple, note: str = ""):
        self.exp, self.title, self.note = exp, title, note
        self.options, self.fixed, self.views, self.default = dict(options), dict(fixed), dict(views), default

    def _control(self, n: int, name: str, values: Sequence[Any]) -> str:
        p = self.exp.param(name)
        label = html.escape(name + (f" ({p.unit})" if p.unit and p.unit != name else ""))
        cid = f"memlab-{self.exp.id.replace('.', '-')}-{id(self)}-{name}"
        start = values.index(self.default[n])
        hint = f' title="{html.escape(p.help)}"' if getattr(p, "help", None) else ""
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        if numeric and len(values) > 1:
            labels = [_label(v) for v in values]
            return (f'<div class="memlab-control"><label for="{cid}"{hint}>{label}</label> '
                    f'<input type="range" id="{cid}" min="0" max="{len(values) - 1}" step="1" value="{start}" '
                    f'data-param="{html.escape(name)}" data-values="{html.escape(json.dumps(values))}" '
                    f'data-labels="{html.escape(json.dumps(labels))}" aria-valuetext="{html.escape(labels[start])}">'
                    f' <output for="{cid}">{html.escape(labels[start])}</output></div>')
        if len(values) <= MAX_RADIOS:
            radios = "".join(
                f'<label><input type="radio" name="{cid}" value="{html.escape(json.dumps(v))}" '
                f'data-param="{html.escape(name)}"{" checked" if i == start else ""}> {html.escape(_label(v))}</label> '
                for i, v in enumerate(values))
            return f'<fieldset class="memlab-control"><legend{hint}>{label}</legend>{radios}</fieldset>'
        opts = "".join(f'<option value="{html.escape(json.dumps(v))}"{" selected" if i == start else ""}>'
                       f'{html.escape(_label(v))}</option>' for i, v in enumerate(values))
        return (f'<div class="memlab-control"><label for="{cid}"{hint}>{label}</label> '
                f'<select id="{cid}" data-param="{html.escape(name)}">{opts}</select></div>')

    def _repr_html_(self) -> str:
        controls = "".join(self._control(i, n, vs) for i, (n, vs) in enumerate(self.options.items()))
        figures = []
        for key, (params, body) in self.views.items():
            shown = "" if key == self.default else " hidden"
            if shown:  # a hidden view's images load when it is shown (book/_static/memlab.js)
                body = body.replace(' srcset="data:', ' data-srcset="data:').replace(' src="data:', ' data-src="data:')
            point = {n: v for n, v in zip(self.options, key)}
            figures.append(f'<figure class="memlab-view" data-point="{html.escape(json.dumps(point))}"{shown}>'
                           f'{body}</figure>')
        missing_hidden = "" if self.default not in self.views else " hidden"
        missing = (f'<p class="memlab-explorer-missing" role="status"{missing_hidden}>This combination was not '
                   "recorded on the lab GPU; choose another value, or run the notebook on a GPU to measure it.</p>")
        status = '<p class="memlab-explorer-status" role="status" aria-live="polite"></p>'
        return (f'<div class="memlab-explorer" data-experiment="{html.escape(self.exp.id)}" '
                f'data-fixed="{html.escape(json.dumps(self.fixed))}">'
                f'<p class="memlab-explorer-title"><b>{html.escape(self.title)}</b> '
                f'<span>{html.escape(self.note)}</span></p>'
                f'<form class="memlab-explorer-controls" onsubmit="return false">{controls}</form>{status}'
                f'<div class="memlab-explorer-views" aria-live="polite">{"".join(figures)}{missing}</div></div>')

    def __repr__(self) -> str:
        return f"<Explorer {self.exp.id}: {len(self.views)} recorded points>"


def build_explorer(exp: Any, render: Callable[[Any], Any], names: Sequence[str], fixed: Mapping[str, Any],
                   options: Mapping[str, Sequence[Any]], default: Mapping[str, Any]) -> Explorer:
    """Render ``render(result)`` for every recorded combination of ``options``.

    Args:
        exp: the experiment.
        render: the panel's render function (Result -> Figure, HTML or text).
        names: the parameters to show as controls, in order; one recorded at a single value
            (with ``fixed``) is held instead, and the note names it.
        fixed: parameters held at a value.
        options: for each name, the recorded values in the order the control offers them.
        default: for each name, the value shown first.
    """
    from . import store
    from .registry import run

    recorded = store.load(exp.id, data_schema=exp.data_schema)
    points: dict[tuple, Any] = {}
    for combo in itertools.product(*(options[n] for n in names)):
        values = {**fixed, **dict(zip(names, combo))}
        if recorded.find(exp.complete(dict(values))) is not None:
            points[combo] = values
    # A parameter recorded at one value only is no choice: it is held, and the note says so.
    controls = [n for i, n in enumerate(names) if len({c[i] for c in points}) > 1]
    held = {n: next(iter(points))[i] for i, n in enumerate(names) if n not in controls} if points else {}
    views: dict[tuple, tuple[dict, str]] = {}
    for combo, values in points.items():
        result = run(exp.id, mode="recorded", **values)
        key = tuple(v for n, v in zip(names, combo) if n in controls)
        views[key] = (dict(result.params), view_html(render(result)))
    start = tuple(default[n] for n in controls)
    if start not in views and views:
        start = next(iter(views))
    offered = {n: [v for v in options[n] if any(k[i] == v for k in views)] for i, n in enumerate(controls)}
    note = "Recorded on the lab GPU: each control offers the recorded values"
    if held:
        note += " (" + ", ".join(f"{n} = {_label(v)}" for n, v in held.items()) + ", the only values recorded)"
    note += ("; a value recorded only with other settings moves the other controls there. "
             "Run the notebook on a GPU to measure others.")
    return Explorer(exp, exp.title, offered, {**fixed, **held}, views, start, note)
