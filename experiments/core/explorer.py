"""A recorded-grid explorer that needs no kernel: the static book's form of ``panel()``.

When the book is built (``CUDA_MEMLAB_STATIC=1``, set by ``make book``) in recorded mode,
:func:`experiments.core.widgets.panel` returns an :class:`Explorer` instead of ipywidgets,
whose views need a live kernel and the widget JavaScript from a CDN. The explorer
renders every recorded point of the grid once, at build time, and writes plain HTML:
native, labelled form controls (``<input type="range">`` over the recorded values,
``<select>`` or radio buttons) and one ``<figure>`` per point. The small script the book
ships (``book/_static/memlab.js``) shows the figure of the point the controls select,
or says that the point was not recorded.
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


def png_bytes(fig: Any) -> bytes:
    """A matplotlib Figure as a small PNG: saved like the inline backend, then reduced to a
    256-colour palette (the book's figures use a few flat colours, so nothing visible is lost
    and the file is 3-4x smaller; FASTOCTREE is the fastest of Pillow's quantizers and the smallest here)."""
    from PIL import Image

    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    img = Image.open(io.BytesIO(buf.getvalue())).convert("RGB")
    out = io.BytesIO()
    img.quantize(colors=256, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE).save(
        out, format="PNG", optimize=True)
    return out.getvalue()


def view_html(obj: Any, alt: str) -> str:
    """HTML for what a render function returned: a Figure, an object with ``_repr_html_``, or text."""
    from matplotlib.figure import Figure

    if isinstance(obj, Figure):
        data = base64.b64encode(png_bytes(obj)).decode("ascii")
        return f'<img src="data:image/png;base64,{data}" alt="{html.escape(alt)}">'
    if hasattr(obj, "_repr_html_"):
        return obj._repr_html_() or ""
    if hasattr(obj, "data") and isinstance(getattr(obj, "data"), str):  # IPython.display.HTML
        return obj.data
    return f"<pre>{html.escape(str(obj))}</pre>"


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
        fixed: parameters held at a value (not shown).
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
            point = {n: v for n, v in zip(self.options, key)}
            figures.append(f'<figure class="memlab-view" data-point="{html.escape(json.dumps(point))}"{shown}>'
                           f'{body}</figure>')
        missing_hidden = "" if self.default not in self.views else " hidden"
        missing = (f'<p class="memlab-explorer-missing" role="status"{missing_hidden}>This combination was not '
                   "recorded on the lab GPU; choose another value, or run the notebook on a GPU to measure it.</p>")
        return (f'<div class="memlab-explorer" data-experiment="{html.escape(self.exp.id)}" '
                f'data-fixed="{html.escape(json.dumps(self.fixed))}">'
                f'<p class="memlab-explorer-title"><b>{html.escape(self.title)}</b> '
                f'<span>{html.escape(self.note)}</span></p>'
                f'<form class="memlab-explorer-controls" onsubmit="return false">{controls}</form>'
                f'<div class="memlab-explorer-views" aria-live="polite">{"".join(figures)}{missing}</div></div>')

    def __repr__(self) -> str:
        return f"<Explorer {self.exp.id}: {len(self.views)} recorded points>"


def build_explorer(exp: Any, render: Callable[[Any], Any], names: Sequence[str], fixed: Mapping[str, Any],
                   options: Mapping[str, Sequence[Any]], default: Mapping[str, Any]) -> Explorer:
    """Render ``render(result)`` for every recorded combination of ``options``.

    Args:
        exp: the experiment.
        render: the panel's render function (Result -> Figure, HTML or text).
        names: the parameters shown as controls, in order.
        fixed: parameters held at a value.
        options: for each name, the recorded values in the order the control offers them.
        default: for each name, the value shown first.
    """
    from . import store
    from .registry import run

    recorded = store.load(exp.id, data_schema=exp.data_schema)
    views: dict[tuple, tuple[dict, str]] = {}
    for combo in itertools.product(*(options[n] for n in names)):
        values = {**fixed, **dict(zip(names, combo))}
        if recorded.find(exp.complete(dict(values))) is None:
            continue  # not recorded: the page says so when the controls reach it
        result = run(exp.id, mode="recorded", **values)
        alt = f"{exp.title}: " + ", ".join(f"{n} = {_label(v)}" for n, v in zip(names, combo))
        views[combo] = (dict(result.params), view_html(render(result), alt))
    start = tuple(default[n] for n in names)
    if start not in views and views:
        start = next(iter(views))
    note = "Recorded on the lab GPU: each control offers the recorded values; run the notebook on a GPU to measure others."
    return Explorer(exp, exp.title, {n: list(options[n]) for n in names}, fixed, views, start, note)
