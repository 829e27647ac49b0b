"""Figures and tables of chapter 1 (imported into :mod:`experiments.allocator`).

Every ``plot_*`` function takes a :class:`~experiments.core.registry.Result` (or a list of
them) and returns a matplotlib Figure with the provenance footer; the ``*_table``
functions return a small object that notebooks show as an HTML table and ``print``
shows as text. Sizes on axes are in MiB.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..core.units import format_bytes
from .model import compact_layout
from .snapshot import oom_rows
from ..core.tables import Table
from ..core.units import mib
from ..core.plotting import (MIN_FONT_PT, PALETTE, figure_function, is_narrow, legend_below, memory_timeline,
                              new_figure, pick, segment_map, stamp)
from ..doctor.answers.report import Report, doctor

ORDER_LABELS = {"small_first": "small tensors first", "large_first": "large tensors first",
                "increasing": "increasing batch size", "decreasing": "decreasing batch size"}






# ----------------------------------------------------------------------------- request table, anatomy

def request_table_html(result: Any) -> Table:
    """The probes of ``alloc.request_table`` as a table: request, block, pool, segment, free tail."""
    rows = []
    for p in result.data["probes"]:
        pred = p["predicted"]
        same = (p["block_bytes"], p["segment_bytes"], p["pool"]) == (pred["block_bytes"], pred["segment_bytes"], pred["pool"])
        tail = format_bytes(p["remainder_bytes"]) if p["remainder_bytes"] else "none"
        block = format_bytes(p["block_bytes"])
        if p["block_bytes"] > pred["rounded_bytes"]:
            block += f" ({format_bytes(p['block_bytes'] - pred['rounded_bytes'])} unsplit)"
        rows.append([format_bytes(p["request_bytes"]), format_bytes(pred["rounded_bytes"]), block, p["pool"],
                     format_bytes(p["segment_bytes"]), tail, "yes" if same else "NO"])
    return Table(["request", "rounded", "block", "pool", "segment", "free tail", "as the model predicts"], rows,
                 caption=result.caption())


@figure_function
def plot_request_table(result: Any) -> Any:
    """For each probe size (rows): the request, the block it got and its segment, on a log scale."""
    probes = result.data["probes"]
    fig, ax = new_figure(width=7.5, height=0.28 * len(probes) + 1.4)
    for i, p in enumerate(probes):
        color = PALETTE[0] if p["pool"] == "small" else PALETTE[1]
        ax.barh(i, p["segment_bytes"] - 1, left=1, height=0.7, color=color, alpha=0.25)
        ax.barh(i, p["block_bytes"] - 1, left=1, height=0.7, color=color)
        ax.plot([p["request_bytes"]], [i], marker="|", color="black", markersize=9)
    ax.set_xscale("log")
    ax.set_yticks(range(len(probes)))
    ax.set_yticklabels([format_bytes(p["request_bytes"]) for p in probes], fontsize=8)
    ax.invert_yaxis()
    for boundary in (2**20, 10 * 2**20):
        ax.axvline(boundary, color="#888888", linestyle=":", linewidth=1)
    ticks = pick([1, 512, 2**10 * 100, 2**20, 10 * 2**20, 100 * 2**20], [1, 2**10, 2**20, 100 * 2**20])
    ax.set_xticks(ticks)
    ax.set_xticklabels([format_bytes(t) for t in ticks], fontsize=8)
    ax.minorticks_off()
    ax.set_xlabel("bytes (log scale): | request, dark bar block, light bar segment")
    ax.grid(axis="y", visible=False)
    from matplotlib.patches import Patch

    handles = [Patch(color=PALETTE[0], label="small pool"), Patch(color=PALETTE[1], label="large pool")]
    if is_narrow():
        legend_below(ax, handles=handles, ncol=2, fontsize=8)
    else:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    ax.set_title("Each request's block (dark) and segment (light)")
    return stamp(fig, result)


@figure_function
def plot_segments(segments: Sequence[Mapping[str, Any]], *, title: str = "", source: Any = None) -> Any:
    """A segment map of any layout, e.g. ``parse_segments(torch.cuda.memory._snapshot())``.

    Args:
        segments: plain segment dicts (:func:`experiments.allocator.snapshot.parse_segments`).
        title: shown above the map (may have two lines).
        source: a Result, or a string for the footer (default: 'your snapshot').
    """
    if not segments:
        fig, ax = new_figure(height=1.4)
        ax.text(0.5, 0.5, "no segments", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
    else:
        labelled = [{**s, "label": f"{s['pool']}{' (exp.)' if s.get('is_expandable') else ''} · "
                                   f"{format_bytes(s['total_size'])}"} for s in segments]
        fig = segment_map(labelled)
    if title:
        fig.suptitle(title, fontsize=10)
    return stamp(fig, source if source is not None else "your snapshot")


@figure_function
def plot_anatomy(result: Any) -> Any:
    """Segment map of ``alloc.anatomy``: the measured layout, with the model's verdict."""
    d = result.data
    summary = f"{d['count']} × {format_bytes(d['request_bytes'])} → blocks of {format_bytes(d['rounded_bytes'])} or more"
    verdict = "the model predicts exactly this layout" if d["matches_model"] else (
        "the model predicted " + ", ".join(compact_layout(d["predicted_segments"])))
    return plot_segments(d["segments"], title=f"{summary}; {verdict}", source=result)


# ----------------------------------------------------------------------------- timeline

@figure_function
def plot_timeline(result: Any) -> Any:
    """Allocated and reserved MiB after every operation, one panel per order, model dotted."""
    d = result.data
    fig, axes = new_figure(2, 1, width=8.0, height=5.6, sharex=True)
    small, large = format_bytes(d["small_bytes"]), format_bytes(d["large_bytes"])
    for k, (ax, order) in enumerate(zip(axes, ("small_first", "large_first"))):
        o = d["orders"][order]
        # one extra x position so the value after the last operation shows as a step too
        steps = list(range(1, len(o["labels"]) + 2))
        ext = lambda xs: list(xs) + [xs[-1]]  # noqa: E731
        memory_timeline(steps, {"allocated": ext(o["allocated_bytes"]), "reserved": ext(o["reserved_bytes"])},
                        marks=[(o["empty_cache_step"] + 1, "empty_cache()")], ax=ax, xlabel="")
        ax.plot(steps, [mib(v) for v in ext(o["predicted_reserved_bytes"])], linestyle=":", color="black",
                drawstyle="steps-post", linewidth=1.2, label="reserved, model")
        for end in o["phase_ends"][:-2]:
            ax.axvline(end + 2, color="#bbbbbb", linewidth=0.8)
        if k == 0 and not is_narrow():
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
        else:
            handles, labels = ax.get_legend_handles_labels()
            ax.get_legend().remove()
        first, second = (f"8 × {small}", f"4 × {large}") if order == "small_first" else (f"4 × {large}", f"8 × {small}")
        peak = max(o["reserved_bytes"][: o["phase_ends"][2] + 1])
        ax.set_title(f"{ORDER_LABELS[order]}: {first}, free, {second} → {format_bytes(peak)} reserved", fontsize=10)
    axes[-1].set_xlabel("operation (grey lines separate the phases: alloc, free, alloc, free, empty_cache)")
    if is_narrow():
        legend_below(axes[-1], handles=handles, labels=labels, ncol=3, fontsize=8)
    return stamp(fig, result)


@figure_function
def plot_sequence(run: Mapping[str, Any], *, title: str = "") -> Any:
    """Allocated and reserved MiB after each operation of :func:`experiments.allocator.try_sequence`
    (the model as lines; the measurement, when there is one, as dots)."""
    fig, ax = new_figure(width=7.0, height=3.4)
    pred = run["predicted"]
    n = len(pred["labels"])
    steps = list(range(1, n + 2))
    series = {"allocated, model": pred["allocated_bytes"] + pred["allocated_bytes"][-1:],
              "reserved, model": pred["reserved_bytes"] + pred["reserved_bytes"][-1:]}
    memory_timeline(steps, series, ax=ax, xlabel="operation", title=title)
    measured = run.get("measured")
    if measured:
        m = len(measured["labels"])
        ax.plot([i + 0.5 for i in range(1, m + 1)], [mib(v) for v in measured["reserved_bytes"]], "o",
                color="black", markersize=4, label="reserved, measured")
        ax.legend(loc="upper left", fontsize=8)
    top = max(mib(v) for v in pred["reserved_bytes"] + (measured["reserved_bytes"] if measured else []))
    ax.set_ylim(0, max(top, 1e-3) * 1.45)  # head room: the legend sits above the lines
    if n <= 16:
        ax.set_xticks([i + 0.5 for i in range(1, n + 1)])
        ax.set_xticklabels(pred["labels"], rotation=30, ha="right", fontsize=MIN_FONT_PT)
    return stamp(fig, run.get("source", "model prediction"))


# ----------------------------------------------------------------------------- fragmentation / OOM

PATTERN_ORDER = ("shrink", "interleave", "grouped")


def _outcome(p: Mapping[str, Any], predicted: bool = False) -> str:
    """'fits', 'out of memory', or where the sequence failed when it never reached the request."""
    if not p["predicted_oom" if predicted else "oom"]:
        return "fits"
    if p.get("predicted_reached_request" if predicted else "reached_request", True) is False:
        return "out of memory in phase 1"
    return "out of memory"


def _mib_or_dash(n: float | None) -> str:
    return "-" if n is None else f"{mib(n):.0f}"


def oom_table(result: Any) -> Table:
    """One row per pattern of ``alloc.fragmentation_oom``: what happened to the 64 MiB request
    (or, under a cap too small for the first phase, to the tensor that failed before it)."""
    d = result.data
    rows = []
    for name in PATTERN_ORDER:
        p = d["patterns"][name]
        rows.append([name, _outcome(p), _outcome(p, predicted=True),
                     _mib_or_dash(p["reserved_before_request_bytes"]), _mib_or_dash(p["allocated_before_request_bytes"]),
                     _mib_or_dash(p["reserved_unallocated_at_failure_bytes"]), _mib_or_dash(p["reserved_after_bytes"])])
    request = format_bytes(d["request_bytes"])
    early = any(p.get("reached_request") is False for p in d["patterns"].values())
    note = (" Phase 1 (eleven 32 MiB tensors, 352 MiB) does not fit under this cap: no pattern reaches the "
            f"{request} request." if early else "")
    return Table(["pattern", f"{request} request (measured)", "model", "reserved before it (MiB)",
                  "allocated before it (MiB)", "reserved but unallocated at the failure (MiB)",
                  "reserved at the end (MiB)"], rows,
                 caption=f"Memory cap {format_bytes(d['cap_bytes'])}.{note} {result.caption()}")


def oom_figures_table(result: Any, pattern: str = "interleave") -> Table:
    """The figures of one pattern's out-of-memory message, one per row (MiB / GiB)."""
    from .snapshot import parse_oom_message

    p = result.data["patterns"][pattern]
    if not p["oom"]:
        return Table(["figure", "value"], [["outcome", "no out-of-memory error: the request fitted"]],
                     caption=result.caption())
    try:   # parse the recorded message again: the parser may have learnt since the recording
        figures = parse_oom_message(p["message"])
    except ValueError:
        figures = p["figures"]
    if figures is None:
        return Table(["figure", "value"], [["message (not parsed)", p["message"]]], caption=result.caption())
    return Table(["what the message says", "value"], oom_rows(figures), caption=result.caption())


def oom_message(result: Any, pattern: str = "interleave", width: int | None = None) -> str:
    """The out-of-memory message one pattern raised, as one paragraph (or a line saying
    that the request fitted).

    Args:
        width: wrap to this many characters (a terminal). By default the text is not
            wrapped: a page or notebook wraps it to its own width, and a second wrap at
            a fixed width leaves ragged lines there.
    """
    import textwrap

    p = result.data["patterns"][pattern]
    if not p["oom"]:
        return f"'{pattern}': no out-of-memory error, the request fitted."
    text = " ".join(p["message"].split())
    return textwrap.fill(text, width, break_long_words=False, break_on_hyphens=False) if width else text


@figure_function
def plot_fragmentation_oom(result: Any, pattern: str = "interleave") -> Any:
    """Left: the segments after the 64 MiB request of ``pattern`` (at the failure, if it
    failed). Right: for every pattern, reserved and allocated MiB before the request (at
    the failure for a pattern that failed earlier, in phase 1) and reserved MiB at the end,
    against the cap, marked 'OOM', 'OOM (phase 1)' or 'fits'.

    Raises:
        ValueError: an unknown pattern.
    """
    d = result.data
    if pattern not in d["patterns"]:
        raise ValueError(f"pattern must be one of {list(d['patterns'])}, got {pattern!r}")
    p = d["patterns"][pattern]
    segs = p["segments_after"]
    map_height = max(3.2, 0.3 * len(segs) + 1.6)
    fig, (left, right) = new_figure(1, 2, width=10.0, height=map_height, gridspec_kw={"width_ratios": [3, 2]},
                                    narrow_height=0.3 * len(segs) + 1.4 + 3.6,
                                    narrow_ratios=[0.3 * len(segs) + 1.2, 3.0])
    setting = "expandable segments" if result.params.get("expandable") else "default settings"
    cap = mib(d["cap_bytes"])
    segment_map(segs, ax=left)
    if p.get("reached_request", True):
        what = f"the 64 MiB request → {'out of memory' if p['oom'] else 'fits'}"
    else:
        failed = f"a {format_bytes(p['failed_request_bytes'])}" if p.get("failed_request_bytes") else "a"
        what = f"{failed} tensor of phase 1 → out of memory, before the 64 MiB request"
    first, second = pick(("Left", "right"), ("Above", "below"))
    fig.suptitle(f"'{pattern}', {setting}, cap {cap:.0f} MiB: {what}. {first}: the segments "
                 f"{'at the failure' if p['oom'] else 'after it'}; {second}: all three patterns", fontsize=10)
    names = [n for n in PATTERN_ORDER if n in d["patterns"]]
    pats = [d["patterns"][n] for n in names]
    reached = [q.get("reached_request", True) for q in pats]
    x = range(len(names))
    reserved = [mib(q["reserved_before_request_bytes"] if r else q["reserved_at_failure_bytes"])
                for q, r in zip(pats, reached)]
    allocated = [mib(q["allocated_before_request_bytes"] if r else q["allocated_at_failure_bytes"])
                 for q, r in zip(pats, reached)]
    after = [mib(q["reserved_after_bytes"]) for q in pats]
    stage = ("before the request" if all(reached) else "at the failure" if not any(reached)
             else "before the request or at the failure")
    right.bar([i - 0.2 for i in x], reserved, width=0.4, color=PALETTE[1], label=f"reserved {stage}")
    right.bar([i + 0.2 for i in x], allocated, width=0.4, color=PALETTE[0], label=f"allocated {stage}")
    right.scatter([i - 0.2 for i in x], after, marker="_", s=350, linewidths=2, color="black", zorder=3,
                  label="reserved at the end")
    right.axhline(cap, color=PALETTE[3], linestyle="--", linewidth=1, label="cap")
    for i, (q, r) in enumerate(zip(pats, reached)):
        right.annotate(("OOM" if r else "OOM\n(phase 1)") if q["oom"] else "fits", (i, cap), ha="center",
                       va="bottom", fontsize=9 if r else 8, fontweight="bold",
                       color=PALETTE[3] if q["oom"] else PALETTE[2], xytext=(0, 3),
                       textcoords="offset points")
    right.set_xticks(list(x))
    right.set_xticklabels(names)
    right.set_ylabel("memory (MiB)")
    right.set_ylim(0, max(cap, *after) * 1.18)
    legend_below(right, ncol=2, fontsize=8)
    right.grid(axis="x", visible=False)
    return stamp(fig, result)


# ----------------------------------------------------------------------------- CUDA graph pools

VARIANT_LABELS = {"no_grad": "no grad", "autograd": "autograd"}


def _graph_results(results: Any) -> list[Any]:
    return list(results) if isinstance(results, (list, tuple)) else [results]


@figure_function
def plot_graph_pools(results: Any) -> Any:
    """Reserved growth while capturing one graph per batch size into a shared pool.

    Args:
        results: one ``alloc.graph_pools`` Result or a list of them (e.g. without and with
            expandable segments). Left: growth after each capture under ``no_grad``;
            right: the growth after all captures, per setting and capture style
            (no grad; autograd keeping activations, where it was measured).
    """
    from .predict import _graph_variants

    results = _graph_results(results)
    fig, (left, right) = new_figure(1, 2, width=10.5, height=3.8, gridspec_kw={"width_ratios": [1, 1]})
    styles = {"increasing": "-", "decreasing": "--"}
    groups = []
    for k, r in enumerate(results):
        setting = "expandable" if r.params.get("expandable") else "default"
        variants = _graph_variants(r.data)
        for order in ("increasing", "decreasing"):
            o = variants["no_grad"][order]
            color = PALETTE[(2 * k + (order == "decreasing")) % len(PALETTE)]
            left.plot(range(1, len(o["growth_after_each_bytes"]) + 1), [mib(v) for v in o["growth_after_each_bytes"]],
                      styles[order], marker="o", markersize=3, color=color, label=f"{setting}, {order}")
        for variant, orders in variants.items():
            groups.append((f"{setting}\n{VARIANT_LABELS[variant]}", orders))
    left.set_xlabel("graphs captured")
    left.set_ylabel("reserved growth (MiB)")
    left.set_title("no grad: growth after each capture", fontsize=10)
    left.set_ylim(bottom=0)
    left.legend(loc="upper left", fontsize=8)
    groups.sort(key=lambda g: "autograd" in g[0])   # the no-grad groups first
    width = 0.38
    for order, dx, color in (("increasing", -width / 2, PALETTE[0]), ("decreasing", width / 2, PALETTE[1])):
        values = [mib(orders[order]["reserved_growth_bytes"]) for _, orders in groups]
        rects = right.bar([i + dx for i in range(len(groups))], values, width=width, color=color,
                          label=f"{order} batch size")
        for rect, v in zip(rects, values):
            right.annotate(f"{v:.0f}", (rect.get_x() + rect.get_width() / 2, v), ha="center", va="bottom",
                           fontsize=8, xytext=(0, 2), textcoords="offset points")
    right.set_xticks(range(len(groups)))
    right.set_xticklabels([label for label, _ in groups], fontsize=8)
    right.set_ylabel("reserved growth, all captures (MiB)")
    right.set_title("after all captures", fontsize=10)
    top = max(mib(orders[o]["reserved_growth_bytes"]) for _, orders in groups for o in ("increasing", "decreasing"))
    right.set_ylim(0, top * 1.2)
    legend_below(right, ncol=2, fontsize=8, xticklines=2)  # above the bars it would cover their values
    right.grid(axis="x", visible=False)
    d = results[0].data
    fig.suptitle(f"{len(d['batch_sizes'])} CUDA graphs of an MLP (hidden {d['hidden']}, {d.get('dtype', '')}, batch "
                 f"{min(d['batch_sizes'])} to {max(d['batch_sizes'])}) in one shared pool", fontsize=10)
    return stamp(fig, results)


def graph_pools_table(results: Any) -> Table:
    """The shared pool's size after all captures, measured and as the allocator model
    predicts it, for each capture style, order and setting (MiB)."""
    from .predict import _graph_variants, predict_graph_pools

    results = _graph_results(results)
    by_setting = {("expandable" if r.params.get("expandable") else "default"): r for r in results}
    settings = [k for k in ("default", "expandable") if k in by_setting]
    outside = set()
    rows = []
    for variant, what in (("no_grad", "no grad"), ("autograd", "autograd")):
        for order in ("increasing", "decreasing"):
            row = [what, order]
            for setting in settings:
                r = by_setting[setting]
                model = predict_graph_pools(r.data, expandable=setting == "expandable")[variant][order][-1]
                measured = _graph_variants(r.data).get(variant, {}).get(order)
                if measured is None:
                    row.append("not recorded")
                elif measured.get("pool_reserved_bytes") is None:
                    row.append("-")
                else:
                    row.append(f"{mib(measured['pool_reserved_bytes']):.0f}")
                    outside.add(measured["reserved_growth_bytes"] - measured["pool_reserved_bytes"])
                row.append(f"{mib(model):.0f}")
            rows.append(row)
    header = ["captured with", "order"]
    for setting in settings:
        header += [f"{setting}: pool (MiB)", f"{setting}: model (MiB)"]
    note = ""
    if len(outside) == 1:
        note = (f"memory_reserved() grew by {mib(outside.pop()):.0f} MiB more in every run, outside the shared "
                "pool. ")
    elif outside:
        note = (f"memory_reserved() grew by {mib(min(outside)):.0f} to {mib(max(outside)):.0f} MiB more, outside "
                "the shared pool. ")
    return Table(header, rows, caption=note + " / ".join(dict.fromkeys(r.caption() for r in results)))


def autograd_pool_totals(results: Any) -> str:
    """What the autograd captures of ``alloc.graph_pools`` cost the whole process, per
    setting and order (MiB): the model's shared pool plus the memory the same run reserved
    outside the pool (the growth of ``memory_reserved()`` less the pool). These are the
    figures the lab notes measured for the MLP in bfloat16; one line per setting, or a line
    saying that the autograd captures were not recorded."""
    from .predict import _graph_variants, predict_graph_pools

    lines = []
    for r in _graph_results(results):
        expandable = bool(r.params.get("expandable"))
        measured = _graph_variants(r.data).get("autograd")
        name = "expandable segments" if expandable else "default settings"
        if not measured:
            lines.append(f"{name}: the autograd captures were not recorded")
            continue
        model = predict_graph_pools(r.data, expandable=expandable)["autograd"]
        totals = [mib(model[o][-1] + measured[o]["reserved_growth_bytes"] - measured[o]["pool_reserved_bytes"])
                  for o in ("increasing", "decreasing")]
        lines.append(f"{name}: model plus outside the pool, {totals[0]:.0f} MiB smallest batch first, "
                     f"{totals[1]:.0f} MiB largest first")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- pool boundary

@figure_function
def plot_pool_boundary(result: Any) -> Any:
    """Left: reserved MiB after a freed 2 MiB block and a second request, against that request's
    size (1 MiB line dashed). Right: the layout after eight freed 512 KiB tensors and a
    1.5 MiB request."""
    d = result.data
    sw = d["sweep"]
    rows = len(d["small_to_large"]["segments_after"])
    fig, (left, right) = new_figure(1, 2, width=10.0, height=3.4, gridspec_kw={"width_ratios": [1, 1]},
                                    narrow_height=3.2 + 0.42 * rows + 1.6, narrow_ratios=[3.2, 0.42 * rows + 1.2])
    xs = [mib(n) for n in sw["sizes_bytes"]]
    left.plot(xs, [mib(v) for v in sw["reserved_bytes"]], "o-", color=PALETTE[1], label="reserved, measured")
    left.plot(xs, [mib(v) for v in sw["predicted_reserved_bytes"]], ":", color="black", label="model")
    left.axvline(1.0, color=PALETTE[3], linestyle="--", linewidth=1)
    left.annotate("1 MiB: small | large", (1.0, 0.02), xycoords=("data", "axes fraction"), rotation=90,
                  fontsize=8, ha="right", va="bottom", color=PALETTE[3], xytext=(-3, 0), textcoords="offset points")
    left.set_xlabel("second request (MiB), after a freed 2 MiB tensor")
    left.set_ylabel("reserved (MiB)")
    lo = min(mib(v) for v in sw["reserved_bytes"] + sw["predicted_reserved_bytes"])
    hi = max(mib(v) for v in sw["reserved_bytes"] + sw["predicted_reserved_bytes"])
    left.set_ylim(max(0.0, lo - 4), hi + 4)
    left.legend(loc="upper right", fontsize=8)
    s = d["small_to_large"]
    labelled = [{**seg, "label": f"{seg['pool']} · {format_bytes(seg['total_size'])}"} for seg in s["segments_after"]]
    segment_map(labelled, ax=right)
    first, second = pick(("Left", "Right"), ("Above", "Below"))
    fig.suptitle(f"{first}: a 2 MiB tensor freed, then a second request. {second}: {s['small_count']} × "
                 f"{format_bytes(s['small_bytes'])} freed, then {format_bytes(s['request_bytes'])}: reserved "
                 f"{mib(s['reserved_before_bytes']):.0f} → {mib(s['reserved_after_bytes']):.0f} MiB", fontsize=10)
    return stamp(fig, result)


# ----------------------------------------------------------------------------- knobs

@figure_function
def plot_knobs(result: Any) -> Any:
    """One panel per knob: MiB reserved at the end of its workload with default settings,
    with the knob, and with expandable segments (model values as black ticks)."""
    d = result.data
    names = list(d["knobs"])
    fig, grid = new_figure(1, len(names), width=max(4.0, 3.4 * len(names)), height=3.4, squeeze=False,
                           narrow_height=2.7 * len(names) + 0.6)
    axes = list(grid[0])
    for ax, name in zip(axes, names):
        k = d["knobs"][name]
        runs = [("default", k["default"]), ("with the\nsetting", k["knob"]), ("expandable\nsegments", k["expandable"])]
        keys = ["default", "knob", "expandable"]
        values = [mib(r["reserved_bytes"][-1]) if r else 0.0 for _, r in runs]
        rects = ax.bar([label for label, _ in runs], values, color=[PALETTE[7], PALETTE[1], PALETTE[2]])
        for rect, (label, r), key in zip(rects, runs, keys):
            text = f"{rect.get_height():.0f}" if r else "not\nsupported"
            ax.annotate(text, (rect.get_x() + rect.get_width() / 2, rect.get_height()), ha="center", va="bottom",
                        fontsize=8, xytext=(0, 2), textcoords="offset points")
            pred = k["predicted"][key][-1]
            ax.plot([rect.get_x() + 0.1, rect.get_x() + rect.get_width() - 0.1], [mib(pred)] * 2, color="black",
                    linewidth=1.5)
        ax.set_title(k["setting"], fontsize=10)
        ax.tick_params(axis="x", labelsize=8)
        ax.grid(axis="x", visible=False)
        ax.set_ylim(0, max(values + [1.0]) * 1.25)
    for ax in axes if is_narrow() else axes[:1]:  # stacked, each panel has its own y axis
        ax.set_ylabel("reserved at the end (MiB)")
    fig.suptitle(f"Each knob on its own workload (memory cap {format_bytes(d['cap_bytes'])}; "
                 "black ticks: the model)", fontsize=10)
    return stamp(fig, result)


def knobs_table(result: Any) -> Table:
    """Workload, setting and reserved MiB at the end (default / knob / expandable) per knob."""
    rows = []
    for name, k in result.data["knobs"].items():
        knob = f"{mib(k['knob']['reserved_bytes'][-1]):.0f}" if k["knob"] else (k["unsupported"] or "not run")
        rows.append([k["setting"], k["workload"], f"{mib(k['default']['reserved_bytes'][-1]):.0f}", knob,
                     f"{mib(k['expandable']['reserved_bytes'][-1]):.0f}"])
    return Table(["setting", "workload", "default (MiB)", "with the setting (MiB)", "expandable (MiB)"], rows,
                 caption=result.caption())


# ----------------------------------------------------------------------------- the doctor's lab comparison

def _recorded_point(result: Any, workload_settings: str) -> tuple[Mapping[str, Any], list[Any], Report]:
    """(the run recorded under ``workload_settings``, the other runs, the doctor's report on the
    first with the others' settings as what-ifs)."""
    runs = result["runs"]
    base = next((r for r in runs if r["settings"] == workload_settings), None)
    if base is None:
        raise ValueError(f"workload_settings must be one of {[r['settings'] for r in runs]}, got {workload_settings!r}")
    others = [r for r in runs if r is not base]
    return base, others, doctor(base, what_if=[r["settings"] for r in others])


def lab_comparison(result: Any, workload_settings: str = "") -> list[dict[str, Any]]:
    """The doctor's what-ifs next to the GPU's own runs, for a recorded ``alloc.doctor_snapshots`` point.

    The run recorded under ``workload_settings`` is the snapshot (its row is the exact
    replay); every other run of the point is a what-if, and its row shows the GPU's own
    figures for that setting too.

    Returns:
        one dict per setting: settings, what_if_peak_reserved_bytes, what_if_final_reserved_bytes,
        gpu_peak_reserved_bytes, gpu_final_reserved_bytes, what_if_oom_events, gpu_ooms.

    Raises:
        ValueError: ``result`` has no run under ``workload_settings``.
    """
    base, others, rep = _recorded_point(result, workload_settings)
    rows = []
    for r, w in [(base, rep.replay)] + list(zip(others, rep.what_ifs)):
        rows.append({"settings": r["settings"] or "defaults",
                     "what_if_peak_reserved_bytes": w.peak_reserved_bytes,
                     "what_if_final_reserved_bytes": w.final_reserved_bytes,
                     "gpu_peak_reserved_bytes": max(p["reserved_bytes.all.peak"] for p in r["phases"]),
                     "gpu_final_reserved_bytes": r["final"]["reserved_bytes.all.current"],
                     "what_if_oom_events": w.oom_events, "gpu_ooms": r["final"]["num_ooms"],
                     "exact_replay": r is base})
    return rows


def plot_doctor_snapshots(result: Any, workload_settings: str = "") -> Any:
    """The what-if figure for a result of ``alloc.doctor_snapshots``: the run recorded under
    ``workload_settings`` replayed, every other run's setting as a what-if, stamped with
    where the recording came from.

    Raises:
        ValueError: ``result`` has no run under ``workload_settings``.
    """
    def draw(result: Any, workload_settings: str) -> Any:
        rep = _recorded_point(result, workload_settings)[2]
        return stamp(rep.figure(), result) if hasattr(result, "caption") else rep.figure()

    # a figure_function call, so that the book can draw it again for phones
    return figure_function(draw)(result, workload_settings)


def plot_doctor_cases(result: Any, workload_settings: str = "") -> Any:
    """The what-if figure for a result of ``alloc.doctor_cases`` (one real program under several
    settings): the run under ``workload_settings`` replayed, the others' settings as what-ifs.

    Raises:
        ValueError: ``result`` has no run under ``workload_settings``.
    """
    return plot_doctor_snapshots(result, workload_settings)


def plot_doctor_heldout(result: Any, workload_settings: str = "") -> Any:
    """The what-if figure for a result of ``alloc.doctor_heldout`` (a program held back from the
    doctor's design, under several settings): as :func:`plot_doctor_cases`.

    Raises:
        ValueError: ``result`` has no run under ``workload_settings``.
    """
    return plot_doctor_snapshots(result, workload_settings)


def lab_comparison_table(rows: Sequence[Mapping[str, Any]]) -> Table:
    """:func:`lab_comparison` as a table: peak and final reserved MiB, the what-if's and the GPU's."""
    return Table(["setting", "what-if peak (MiB)", "GPU peak (MiB)", "what-if end (MiB)", "GPU end (MiB)"],
                 [[r["settings"], f"{mib(r['what_if_peak_reserved_bytes']):.0f}", f"{mib(r['gpu_peak_reserved_bytes']):.0f}",
                   f"{mib(r['what_if_final_reserved_bytes']):.0f}", f"{mib(r['gpu_final_reserved_bytes']):.0f}"]
                  for r in rows], "reserved memory", right=[False, True, True, True, True])
