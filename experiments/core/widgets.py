"""A control panel for an experiment in a few lines: ``panel('alloc.anatomy', render)``.

Live mode (a GPU): one control per parameter, with the allowed range, and a button that
runs the experiment on this GPU. Recorded mode (no GPU): each control offers only the
values recorded on the lab GPU, and changing one shows that recorded point at once.
Works with ipywidgets 7 (Colab's) and 8.
"""
from __future__ import annotations

import html
from typing import Any, Callable, Sequence

from . import store
from .explorer import build_explorer, static_build
from .registry import Param, Result, get, resolve_mode, run


def _live_control(p: Param) -> Any:
    import ipywidgets as w

    desc = f"{p.name}" + (f" ({p.unit})" if p.unit else "")
    common = dict(description=desc, style={"description_width": "initial"}, tooltip=p.help or None)
    if p.kind == "choice":
        return w.Dropdown(options=list(p.choices), value=p.default, **common)
    if p.kind == "bool":
        return w.Checkbox(value=p.default, description=desc, indent=False)
    lo = p.min if p.min is not None else 0
    hi = p.max if p.max is not None else max(10 * abs(p.default), 1)
    if p.kind == "int" and not p.log:
        return w.IntSlider(value=p.default, min=int(lo), max=int(hi), continuous_update=False, **common)
    if p.log and lo > 0:
        import math

        return w.FloatLogSlider(value=p.default, base=10, min=math.log10(lo), max=math.log10(hi),
                                continuous_update=False, **common)
    return w.FloatSlider(value=p.default, min=lo, max=hi, continuous_update=False, **common)


def _label(v: float) -> str:
    """A slider label: 104857603.0 -> '104,857,603', 0.5 -> '0.5'."""
    if float(v).is_integer():
        return f"{int(v):,}"
    return f"{v:g}"


def _recorded_options(p: Param, values: Sequence[Any]) -> tuple[list[Any], Any]:
    """(the recorded values in the order a control offers them, the value it starts at)."""
    if p.choices is not None:  # the order the chapter gave its choices in, not alphabetical
        values = sorted(values, key=lambda v: p.choices.index(v) if v in p.choices else len(p.choices))
    values = list(values)
    return values, (p.default if p.default in values else values[0])


def _recorded_control(p: Param, values: Sequence[Any]) -> Any:
    import ipywidgets as w

    desc = f"{p.name}" + (f" ({p.unit})" if p.unit else "")
    values, value = _recorded_options(p, values)
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    if numeric and len(values) > 1:
        return w.SelectionSlider(options=[(_label(v), v) for v in values], value=value, description=desc,
                                 continuous_update=False, style={"description_width": "initial"})
    return w.Dropdown(options=list(values), value=value, description=desc,
                      style={"description_width": "initial"})


def _displayable(obj: Any) -> Any:
    """Figures become PNG images, so they show without a configured matplotlib backend."""
    from matplotlib.figure import Figure

    if isinstance(obj, Figure):
        import io

        from IPython.display import Image

        buf = io.BytesIO()
        obj.savefig(buf, format="png", bbox_inches="tight")
        return Image(data=buf.getvalue(), format="png")
    return obj


def _recorded_points(exp: Any, names: Sequence[str], fixed: dict[str, Any]) -> list[dict[str, Any]]:
    """The recorded points a panel's controls can show: ``{name: value}`` over ``names``, for
    the points whose other parameters are ``fixed`` (or their defaults)."""
    base = exp.complete(dict(fixed))
    recorded = store.load(exp.id, data_schema=exp.data_schema)
    return [{n: p.params[n] for n in names} for p in recorded.points
            if all(p.params.get(k) == v for k, v in base.items() if k not in names)]


def nearest_recorded(points: Sequence[dict[str, Any]], chosen: dict[str, Any], keep: str,
                     options: dict[str, Sequence[Any]] | None = None) -> dict[str, Any] | None:
    """The recorded point a set of controls should show after the reader set ``keep``.

    ``chosen`` itself when it was recorded; otherwise, among the points with ``keep`` at its
    chosen value, the one that changes the fewest other controls, then moves them the
    least along their ``options`` (the order the controls offer); None if ``keep``'s value
    was never recorded. The static book's explorers do the same in JavaScript
    (``book/_static/memlab-figures.js``).
    """
    if chosen in points:
        return dict(chosen)

    def cost(p: dict[str, Any]) -> tuple[int, float]:
        others = [n for n in chosen if n != keep and p[n] != chosen[n]]
        steps = 0.0
        for n in others:
            opts = list((options or {}).get(n) or [])
            opts = [o[1] if isinstance(o, tuple) else o for o in opts]
            steps += abs(opts.index(p[n]) - opts.index(chosen[n])) if p[n] in opts and chosen[n] in opts else 1
        return len(others), steps

    candidates = [p for p in points if p[keep] == chosen[keep]]
    return dict(min(candidates, key=cost)) if candidates else None


def panel(
    exp_id: str,
    render: Callable[[Result], Any],
    *,
    params: Sequence[str] | None = None,
    mode: str | None = None,
    **fixed: Any,
) -> Any:
    """An ipywidgets panel that runs (or looks up) ``exp_id`` and shows ``render(result)``.

    Args:
        exp_id: experiment id.
        render: turns a :class:`Result` into something displayable (a Figure, HTML...).
        params: names of the parameters to expose (default: all not in ``fixed``).
        mode: 'auto', 'live' or 'recorded' (see :func:`experiments.core.registry.resolve_mode`).
        **fixed: parameters held at a value, not shown.

    Returns:
        an ``ipywidgets.VBox``; its output shows the default point when it is created.
        While the static book is built (recorded mode and ``CUDA_MEMLAB_STATIC=1``), an
        :class:`experiments.core.explorer.Explorer` instead: every recorded point pre-rendered
        with native HTML controls, which needs no kernel and no widget JavaScript.

    Raises:
        ValueError: an unknown experiment or parameter name.
    """
    exp = get(exp_id)
    exp.complete(fixed)
    names = list(params) if params is not None else [p.name for p in exp.params if p.name not in fixed]
    known = [p.name for p in exp.params]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"{exp.id} has no parameter {unknown[0]!r}; its parameters are {known}")
    resolved = resolve_mode(mode)
    if resolved == "recorded" and static_build():
        recorded = store.load(exp.id, data_schema=exp.data_schema).param_values()
        chosen = {n: _recorded_options(exp.param(n), recorded.get(n, [exp.param(n).default])) for n in names}
        return build_explorer(exp, render, names, fixed, {n: v for n, (v, _) in chosen.items()},
                              {n: d for n, (_, d) in chosen.items()})
    import ipywidgets as w
    from IPython.display import HTML

    if resolved == "recorded":
        recorded = store.load(exp.id, data_schema=exp.data_schema).param_values()
        controls = {n: _recorded_control(exp.param(n), recorded.get(n, [exp.param(n).default])) for n in names}
        note = "Recorded mode: the controls offer the points recorded on the lab GPU."
    else:
        controls = {n: _live_control(exp.param(n)) for n in names}
        note = "Live mode: set the parameters, then press Run to measure on this GPU."
    out = w.Output()
    button = w.Button(description="Run on this GPU", button_style="primary", icon="play")

    def show(obj: Any) -> None:
        # Set the outputs directly rather than `with out:`: it works the same in Colab,
        # Jupyter and without a kernel, and the static book keeps the first render.
        out.outputs = ()
        out.append_display_data(_displayable(obj))

    def refresh(*_: Any, cache: bool = True) -> None:
        values = {**fixed, **{n: c.value for n, c in controls.items()}}
        try:
            show(render(run(exp.id, mode=resolved, cache=cache, **values)))
        except (ValueError, LookupError) as e:
            show(HTML(f"<p style='color:#b5403a'>{html.escape(str(e))}</p>"))

    if resolved == "recorded":
        points = _recorded_points(exp, names, fixed)
        moving = [False]

        def changed(change: Any) -> None:
            if moving[0]:
                return  # a control moved by nearest_recorded below: one refresh at the end
            name = next(n for n, c in controls.items() if c is change["owner"])
            chosen = {n: c.value for n, c in controls.items()}
            target = nearest_recorded(points, chosen, name, {n: list(getattr(c, "options", [])) for n, c in
                                                            controls.items()})
            if target is not None and target != chosen:
                moving[0] = True
                try:
                    for n, c in controls.items():
                        if c.value != target[n]:
                            c.value = target[n]
                finally:
                    moving[0] = False
            refresh()

        for c in controls.values():
            c.observe(changed, names="value")
        buttons: list[Any] = []
    else:
        button.on_click(lambda _b: refresh(cache=False))
        buttons = [button]
    refresh()
    header = w.HTML(f"<b>{html.escape(exp.title)}</b> <span style='color:#666'>{html.escape(note)}</span>")
    return w.VBox([header, w.HBox(list(controls.values()), layout=w.Layout(flex_flow="row wrap")), *buttons, out])
