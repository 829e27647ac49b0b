"""Experiments, their parameters, and the one code path for live and recorded results.

Every experiment is a function that runs on a CUDA GPU and returns plain numbers. It is
registered with :func:`experiment`, which names its parameters (with allowed ranges)
and the grid of points that ``python -m experiments record`` measures. :func:`run` is
what pages call: on a GPU it runs the function live; without one it returns the point
recorded on the lab GPU, with that run's provenance. Both return a :class:`Result`.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import html
import itertools
import math
import os
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

from . import store
from .text import close_names
from .units import number
from .device import Provenance, collect_provenance, has_cuda, in_colab, require_cuda, COLAB_SWITCH_HINT

MODES = ("auto", "live", "recorded")


@dataclasses.dataclass(frozen=True)
class Param:
    """One parameter of an experiment.

    Attributes:
        name: keyword name.
        default: value used when the caller gives none; must be in ``choices`` or range.
        choices: allowed values (str, int, float or bool); exclusive with ``min``/``max``.
        min, max: inclusive numeric range for int and float parameters.
        unit: unit shown in widgets and messages ('MiB', 'ms', 'layers', ...).
        help: one line for the widget's tooltip.
        log: widgets use a logarithmic slider (sizes spanning decades).
    """

    name: str
    default: Any
    choices: tuple[Any, ...] | None = None
    min: float | None = None
    max: float | None = None
    unit: str = ""
    help: str = ""
    log: bool = False

    def __post_init__(self) -> None:
        if self.choices is not None and (self.min is not None or self.max is not None):
            raise TypeError(f"parameter {self.name}: give choices or a range, not both")
        if self.choices is not None:
            object.__setattr__(self, "choices", tuple(self.choices))
        self.validate(self.default)

    @property
    def kind(self) -> str:
        """'choice', 'bool', 'int' or 'float', from the default's type."""
        if self.choices is not None:
            return "choice"
        if isinstance(self.default, bool):
            return "bool"
        if isinstance(self.default, int):
            return "int"
        return "float"

    def describe_range(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        if self.choices is not None:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        if self.kind == "bool":
            return "True or False"
        lo = "-inf" if self.min is None else number(self.min)
        hi = "inf" if self.max is None else number(self.max)
        return f"a{'n integer' if self.kind == 'int' else ' number'} in [{lo}, {hi}]{unit}"

    def validate(self, value: Any) -> Any:
        """Return ``value`` if allowed, else raise ValueError naming the parameter and range."""
        bad = ValueError(f"{self.name} must be {self.describe_range()}, got {value!r}")
        if self.choices is not None:
            if value not in self.choices or isinstance(value, bool) != any(isinstance(c, bool) for c in self.choices):
                raise bad
            return value
        if self.kind == "bool":
            if not isinstance(value, bool):
                raise bad
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad
        if self.kind == "int":
            if isinstance(value, float):
                if not value.is_integer():
                    raise bad
                value = int(value)
        else:
            value = float(value)
            if not math.isfinite(value):
                raise bad
        if (self.min is not None and value < self.min) or (self.max is not None and value > self.max):
            raise bad
        return value


@dataclasses.dataclass(frozen=True)
class Experiment:
    """A registered experiment. Use :func:`experiment` to create one."""

    id: str
    chapter: int
    title: str
    func: Callable[..., Mapping[str, Any]]
    params: tuple[Param, ...]
    grid: tuple[dict[str, Any], ...]
    data_schema: dict[str, Any] | None = None
    doc: str = ""
    own_budget: bool = False     # recorded only when named: record --experiment ID

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    @property
    def defaults(self) -> dict[str, Any]:
        return {p.name: p.default for p in self.params}

    def complete(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Fill defaults and validate.

        Raises:
            ValueError: an unknown parameter name, or a value out of range (naming both).
        """
        known = [p.name for p in self.params]
        unknown = [k for k in params if k not in known]
        if unknown:
            raise ValueError(f"{self.id} has no parameter {unknown[0]!r}{close_names(unknown[0], known)}; "
                             f"its parameters are {known}")
        out = {}
        for p in self.params:
            out[p.name] = p.validate(params[p.name]) if p.name in params else p.default
        return out


_REGISTRY: dict[str, Experiment] = {}


def _expand_grid(params: Sequence[Param], grid: Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Any]] | None) -> list[dict]:
    defaults = {p.name: p.default for p in params}
    if grid is None:
        points: list[Mapping[str, Any]] = [{}]
    elif isinstance(grid, Mapping):
        names = list(grid)
        points = [dict(zip(names, combo)) for combo in itertools.product(*(grid[n] for n in names))]
    else:
        points = list(grid)
    out, seen = [], set()
    for pt in points:
        full = {**defaults, **pt}
        key = store.params_key(full)
        if key not in seen:
            seen.add(key)
            out.append(full)
    return out


def experiment(
    id: str,
    *,
    chapter: int,
    title: str,
    params: Sequence[Param] = (),
    grid: Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Any]] | None = None,
    data_schema: Mapping[str, Any] | None = None,
    own_budget: bool = False,
) -> Callable[[Callable[..., Mapping[str, Any]]], Callable[..., Mapping[str, Any]]]:
    """Register the decorated function as experiment ``id``.

    Args:
        id: '<chapter topic>.<name>', e.g. 'alloc.anatomy'; used in file names.
        chapter: 0 (the book's own calibration) to 4.
        params: the function's keyword parameters.
        grid: the points ``record`` measures: a dict of value lists (Cartesian
            product) or a list of partial points; missing names take defaults. The
            default point is always recorded, so pages can render it without a GPU.
        data_schema: JSON schema of the returned data, checked on record and on load.
        own_budget: a long recording (the doctor's validation set) kept out of ``record``
            and ``record --chapter N``; ``record --experiment ID`` records it.

    The function takes the parameters as keywords and returns a JSON-able dict. The
    decorator returns it wrapped so that direct calls validate their arguments through
    :meth:`Experiment.complete`, like :func:`run` (a ValueError naming the parameter and
    its range).
    """
    def decorate(func: Callable[..., Mapping[str, Any]]) -> Callable[..., Mapping[str, Any]]:
        if id in _REGISTRY and _REGISTRY[id].func.__qualname__ != func.__qualname__:
            raise ValueError(f"experiment {id!r} is registered twice")
        ps = tuple(params)
        points = _expand_grid(ps, grid)
        defaults = {p.name: p.default for p in ps}
        if store.params_key(defaults) not in {store.params_key(pt) for pt in points}:
            points.insert(0, defaults)
        exp = Experiment(id=id, chapter=chapter, title=title, func=func, params=ps,
                         grid=tuple(points), data_schema=dict(data_schema) if data_schema else None,
                         doc=(func.__doc__ or "").strip(), own_budget=own_budget)
        for pt in points:
            exp.complete(pt)  # a grid point outside a parameter's range is a bug in the module
        _REGISTRY[id] = exp
        names = list(inspect.signature(func).parameters)

        @functools.wraps(func)
        def validated(*args: Any, **kwargs: Any) -> Mapping[str, Any]:
            # A direct call (al.anatomy(size_bytes=-1)) checks its parameters with the same
            # ranges, and the same messages, as ex.run does.
            if len(args) > len(names):
                raise ValueError(f"{id} takes at most {len(names)} parameters ({names}), got {len(args)}")
            given = dict(zip(names, args))
            twice = sorted(set(given) & set(kwargs))
            if twice:
                raise ValueError(f"{id}: parameter {twice[0]!r} given twice")
            return func(**exp.complete({**given, **kwargs}))

        validated.experiment = exp  # type: ignore[attr-defined]
        return validated

    return decorate


def get(exp_id: str) -> Experiment:
    """The registered experiment ``exp_id``. Raises ValueError listing the known ids."""
    load_chapters()
    try:
        return _REGISTRY[exp_id]
    except KeyError:
        raise ValueError(f"unknown experiment {exp_id!r}{close_names(exp_id, _REGISTRY)}; "
                         f"known: {sorted(_REGISTRY)}") from None


def all_experiments(chapter: int | None = None) -> list[Experiment]:
    """Registered experiments in chapter order (all chapters, or one)."""
    load_chapters()
    exps = sorted(_REGISTRY.values(), key=lambda e: (e.chapter, list(_REGISTRY).index(e.id)))
    return [e for e in exps if chapter is None or e.chapter == chapter]


def load_chapters() -> None:
    """Import every chapter module (declared in :mod:`.chapters`) so that its experiments
    and claims are registered. Raises :class:`.chapters.ChapterImportError` naming a chapter
    that fails to import."""
    from . import chapters

    chapters.load_all()


def resolve_mode(mode: str | None = None) -> str:
    """'live' or 'recorded'.

    ``mode`` (or ``$CUDA_MEMLAB_MODE``) may be 'auto' (live when a GPU is visible),
    'live' or 'recorded'.

    Raises:
        ValueError: an unknown mode.
    """
    mode = mode or os.environ.get("CUDA_MEMLAB_MODE") or "auto"
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode == "auto":
        return "live" if has_cuda() else "recorded"
    return mode


@dataclasses.dataclass(frozen=True)
class Result:
    """What an experiment measured, with where it was measured.

    Attributes:
        experiment: experiment id.
        params: the complete parameter point.
        data: the measured values (units in the experiment's docstring).
        provenance: GPU, driver, CUDA, torch, date and commit of the measurement.
        mode: 'live' (measured in this process) or 'recorded' (read from the lab's run).
        elapsed_s: wall time of the measurement in seconds.
    """

    experiment: str
    params: dict[str, Any]
    data: dict[str, Any]
    provenance: Provenance
    mode: str
    elapsed_s: float

    @property
    def recorded(self) -> bool:
        return self.mode == "recorded"

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def caption(self) -> str:
        """One line for figure footers: live or recorded, and on what."""
        if self.recorded:
            return f"Recorded on {self.provenance.summary()}"
        return f"Measured live on {self.provenance.summary()}"

    def _repr_html_(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        color = "#1b6e3a" if not self.recorded else "#7a4b00"
        return (
            f"<div style='border-left:4px solid {color};padding:2px 8px;font-size:90%'>"
            f"<b>{html.escape(self.experiment)}</b>({html.escape(params)})<br>"
            f"{html.escape(self.caption())}</div>"
        )

    def __repr__(self) -> str:
        return f"Result({self.experiment}, {self.params}, mode={self.mode})"


_LIVE_CACHE: dict[tuple[str, str], Result] = {}


def run(exp_id: str, *, mode: str | None = None, cache: bool = False, **params: Any) -> Result:
    """Run experiment ``exp_id`` live on the GPU, or read its recorded result.

    Args:
        exp_id: experiment id, e.g. 'alloc.anatomy'.
        mode: 'auto' (default: live with a GPU, recorded without), 'live' or 'recorded'.
        cache: in live mode, reuse this process's last live result for the same point.
        **params: the experiment's parameters; missing ones take their defaults.

    Raises:
        ValueError: unknown experiment or parameter, or a value out of range.
        NoGPUError: ``mode='live'`` without a GPU.
        NotRecordedError: recorded mode and this point was not recorded (the message
            lists the recorded values).
    """
    exp = get(exp_id)
    point = exp.complete(params)
    if resolve_mode(mode) == "live":
        key = (exp.id, store.params_key(point))
        if cache and key in _LIVE_CACHE:
            return _LIVE_CACHE[key]
        require_cuda(f"running {exp.id} live")
        t0 = time.perf_counter()
        data = store.to_jsonable(dict(exp.func(**point)))
        elapsed = time.perf_counter() - t0
        if exp.data_schema:
            import jsonschema

            jsonschema.validate(data, exp.data_schema)
        result = Result(exp.id, point, data, collect_provenance(), "live", elapsed)
        _LIVE_CACHE[key] = result
        return result
    rec = store.load(exp.id, data_schema=exp.data_schema)
    found = rec.find(point)
    if found is None:
        values = "; ".join(f"{k}: {v}" for k, v in rec.param_values().items())
        raise store.NotRecordedError(
            f"{exp.id} was not recorded at {point} on {rec.provenance.gpu_name}; recorded values: {values}. "
            "Run it on a GPU to measure other points."
        )
    return Result(exp.id, dict(found.params), dict(found.data), rec.provenance, "recorded", found.elapsed_s)


def status_text() -> str:
    """A paragraph for the top of each page: live or recorded, and how to change it."""
    mode = resolve_mode()
    if mode == "live":
        prov = collect_provenance()
        return (f"Live mode: experiments on this page run on your {prov.gpu_name} "
                f"(torch {prov.torch}, CUDA {prov.cuda}). Figures say 'Measured live'.")
    msg = ("Recorded mode: no CUDA GPU is visible, so this page shows results recorded on the "
           "lab GPU by `python -m experiments record`; each figure names the GPU, driver, CUDA, "
           "torch and date of that run.")
    if in_colab():
        msg += " " + COLAB_SWITCH_HINT
    return msg


def status() -> "Any":
    """Display :func:`status_text` as a colored note (or print it outside IPython)."""
    text = status_text()
    try:
        from IPython import get_ipython
        from IPython.display import HTML, display

        if get_ipython() is None:  # a plain Python prompt or script: HTML would print as an object
            raise ImportError

        import re

        color = "#1b6e3a" if text.startswith("Live") else "#7a4b00"
        body = re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))
        display(HTML(f"<div style='border-left:4px solid {color};padding:4px 10px'>{body}</div>"))
    except ImportError:
        print(text)
    return None


def _release_cached_memory() -> None:
    import gc

    import torch

    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def record(
    experiments: Iterable[Experiment],
    *,
    root=None,
    progress: bool = True,
    keep_going: bool = True,
) -> tuple[list, dict[str, str]]:
    """Run every grid point of ``experiments`` live and write one file per experiment.

    A file is written only after all of its points succeeded, so a failure never leaves
    a partial recording. With ``keep_going`` a failing experiment is reported and the
    others still run.

    Returns:
        (written paths, {experiment id: error text} for the experiments that failed).

    Raises:
        NoGPUError: without a GPU. Any experiment error when ``keep_going`` is False.
    """
    import traceback

    from tqdm.auto import tqdm

    require_cuda("recording results")
    exps = list(experiments)
    prov = collect_provenance()
    total = sum(len(e.grid) for e in exps)
    paths, failures = [], {}
    with tqdm(total=total, disable=not progress, unit="point", desc="recording") as bar:
        for exp in exps:
            _release_cached_memory()  # each experiment starts from an empty cache
            points = []
            try:
                for pt in exp.grid:
                    bar.set_postfix_str(exp.id)
                    t0 = time.perf_counter()
                    data = store.to_jsonable(dict(exp.func(**pt)))
                    points.append(store.RecordedPoint(pt, data, time.perf_counter() - t0))
                    bar.update(1)
                paths.append(store.save(exp.id, exp.chapter, prov, points, data_schema=exp.data_schema, root=root))
            except Exception:
                if not keep_going:
                    raise
                failures[exp.id] = traceback.format_exc()
                bar.update(len(exp.grid) - len(points))
    return paths, failures
