"""Figures of chapter 3 (pinned memory). Each takes a :class:`~experiments.core.registry.Result`
of the matching ``pinned.*`` experiment (or a list, where it says so), returns a closed
Figure, and stamps where the numbers were measured. Units: ms, MiB, GB/s (1e9 B/s).

The ``*_summary`` / ``*_text`` functions at the end turn the same results into a few lines
of text, so that the chapter quotes measured numbers through code.
"""
from __future__ import annotations

from typing import Sequence

from matplotlib.figure import Figure

from ..core.units import MiB, format_bytes
from ..core.plotting import (MIN_FONT_PT, NARROW_WIDTH, PALETTE, figure_function, is_narrow, legend_below, new_figure,
                             pick, stamp, stream_lanes)
from ..core.registry import Result

_DIRECTION = {"htod": "host to device (HtoD)", "dtoh": "device to host (DtoH)"}




def _request_label(nbytes: int) -> str:
    """Exact labels for odd request sizes: '5000 B', '1 MiB + 1 B', '129.5 MiB'."""
    if nbytes < MiB:
        return f"{nbytes // 1024} KiB" if nbytes % 1024 == 0 else f"{nbytes} B"
    whole, rest = divmod(nbytes, MiB)
    if rest == 0:
        return f"{whole} MiB"
    if rest < 1024:
        return f"{whole} MiB + {rest} B"
    return f"{nbytes / MiB:.1f} MiB"


@figure_function
def plot_bandwidth(result: Result) -> Figure:
    """Achieved GB/s against copy size (log x), pageable and pinned, with the link's peak."""
    d = result.data
    fig, ax = new_figure(width=7.0, height=3.6)
    sizes = d["sizes_bytes"]
    ax.plot(sizes, d["pageable_gbps"], "o-", color=PALETTE[1], label="pageable (blocking copy)")
    ax.plot(sizes, d["pinned_gbps"], "o-", color=PALETTE[0], label="pinned (non_blocking=True)")
    link = d.get("link")
    if link and link.get("peak_gbps"):
        ax.axhline(link["peak_gbps"], color="#888888", linestyle="--", linewidth=1)
        ax.annotate(f"{link['kind']} Gen{link['gen']} x{link['width']} peak {link['peak_gbps']:.0f} GB/s",
                    (sizes[0], link["peak_gbps"]), xytext=(2, 3), textcoords="offset points", fontsize=8,
                    color="#555555")
    ax.set_xscale("log", base=2)
    ticks = sizes[::2] if len(sizes) > 5 else sizes
    ax.set_xticks(ticks)
    ax.set_xticklabels([format_bytes(s) for s in ticks])
    ax.set_xlabel("bytes per copy")
    ax.set_ylabel("bandwidth (GB/s, 1 GB = 1e9 B)")
    big = sizes[-1]
    ax.set_title(f"{_DIRECTION[d['direction']]}: {d['pinned_gbps'][-1]:.1f} GB/s pinned, "
                 f"{d['pageable_gbps'][-1]:.1f} GB/s pageable at {format_bytes(big)}")
    ax.set_ylim(bottom=0, top=max([*d["pinned_gbps"], (link or {}).get("peak_gbps") or 0]) * 1.15)
    if is_narrow():  # in the narrow axes the rising pinned curve runs under it
        legend_below(ax, fontsize=8)
    else:
        ax.legend(loc="center right")
    return stamp(fig, result)


_VARIANT_LABELS = {("pageable", True): "pageable\nnon_blocking=True", ("pageable", False): "pageable\nblocking",
                   ("pinned", True): "pinned\nnon_blocking=True", ("pinned", False): "pinned\nblocking"}


@figure_function
def plot_async_copy(result: Result) -> Figure:
    """Host-blocked ms of the copy call per variant (median, p10-p90), against the queued GPU work."""
    d = result.data
    fig, ax = new_figure(width=7.0, height=3.6)
    vs = d["variants"]
    labels = [_VARIANT_LABELS[(v["host"], v["non_blocking"])] for v in vs]
    meds = [v["host_blocked_ms"]["median"] for v in vs]
    err = [[m - v["host_blocked_ms"]["p10"] for m, v in zip(meds, vs)],
           [v["host_blocked_ms"]["p90"] - m for m, v in zip(meds, vs)]]
    colors = [PALETTE[0] if v["host"] == "pinned" else PALETTE[1] for v in vs]
    rects = ax.bar(range(len(labels)), meds, yerr=err, capsize=3, color=colors)
    ax.set_xticks(range(len(labels)))
    if is_narrow():  # four two-line names do not fit side by side: one line each, turned
        ax.set_xticklabels([label.replace("\n", ", ") for label in labels], rotation=30, ha="right",
                           rotation_mode="anchor")
    else:
        ax.set_xticklabels(labels)
    for rect, m, v in zip(rects, meds, vs):  # above the bar and its p90 whisker, so neither hides it
        ax.annotate(f"{m:.3g}", (rect.get_x() + rect.get_width() / 2, max(m, v["host_blocked_ms"]["p90"])),
                    ha="center", va="bottom", fontsize=8, xytext=(0, 3), textcoords="offset points")
    queued = max(v["queued_gpu_ms"] for v in vs)
    # named in a legend under the axes: a label by the line would cross the bars
    ax.axhline(queued, color="#b5403a", linestyle="--", linewidth=1, label=f"GPU work queued ahead: {queued:.1f} ms")
    legend_below(ax, fontsize=8, xticklines=2)
    ax.set_ylim(0, max(queued * 1.35, max(v["host_blocked_ms"]["p90"] for v in vs) * 1.15))
    ax.set_ylabel("host blocked in the copy call (ms)")
    p = result.params
    ax.set_title(f"{format_bytes(p['size_kib'] * 1024)} {_DIRECTION[p['direction']]}")
    ax.grid(axis="x", visible=False)
    return stamp(fig, result)


@figure_function
def plot_overwrite_race(result: Result) -> Figure:
    """Two panels per strategy: share of device elements that got the overwritten value (%),
    and how long the host was blocked by the copy call and its guard (ms)."""
    d = result.data
    fig, (ax1, ax2) = new_figure(1, 2, width=9.0, height=3.6, narrow_height=6.2)
    rows = d["strategies"]
    labels = [r["label"].replace(", ", ",\n").replace(" .", "\n.").replace(" a fresh", "\na fresh") for r in rows]
    pct = [100.0 * max(r["wrong_elements"]) / d["n_elements"] for r in rows]
    colors = [PALETTE[3] if v > 0 else PALETTE[2] for v in pct]
    rects = ax1.barh(labels, pct, color=colors)
    for rect, v in zip(rects, pct):
        ax1.annotate(f"{v:.0f} %", (rect.get_width(), rect.get_y() + rect.get_height() / 2), va="center",
                     fontsize=8, xytext=(3, 0), textcoords="offset points")
    ax1.set_xlim(0, 115)
    ax1.set_xlabel("device elements with the new value (%)")
    ax1.invert_yaxis()
    ax1.grid(axis="y", visible=False)
    ms = [r["host_blocked_ms"]["median"] for r in rows]
    rects = ax2.barh(labels, ms, color=PALETTE[0])
    for rect, v in zip(rects, ms):
        ax2.annotate(f"{v:.2f}", (rect.get_width(), rect.get_y() + rect.get_height() / 2), va="center",
                     fontsize=8, xytext=(3, 0), textcoords="offset points")
    ax2.set_xlabel("host blocked by copy + guard (ms)")
    if not is_narrow():  # side by side, the left panel's labels name both
        ax2.set_yticklabels([])
    ax2.invert_yaxis()
    ax2.grid(axis="y", visible=False)
    ax2.set_xlim(0, max(ms) * 1.25 + 0.1)
    p = result.params
    fig.suptitle(f"{p['size_mib']} MiB copied behind {d['work_ms']:g} ms of GPU work; "
                 f"host writes {p['overwrite_after_ms']:g} ms after the guard", fontsize=10)
    return stamp(fig, result)


@figure_function
def plot_del_is_safe(result: Result) -> Figure:
    """Timeline: the GPU's queued work and copy, and what the host did meanwhile (ms)."""
    d = result.data
    g, h = d["gpu"], d["host"]
    lanes = {
        "GPU stream": [
            {"start_ms": 0.0, "end_ms": g["sleep_end_ms"], "label": "queued work", "color": "#9aa5b1"},
            {"start_ms": g["sleep_end_ms"], "end_ms": max(g["copy_end_ms"], g["sleep_end_ms"] + 0.5),
             "label": "", "color": 0},
        ],
        "host": [
            {"start_ms": h["copy_call_ms"], "end_ms": h["realloc_ms"],
             "label": "alloc", "color": 1},
            {"start_ms": h["realloc_ms"], "end_ms": h["sync_ms"], "label": "waits in synchronize()",
             "color": "#c9ced6"},
        ],
    }
    first = "the SAME address" if d["reused_while_pending"] else "a new address"
    again = "the old address again" if d["reused_after_completion"] else "another address"
    title = f"{result.params['size_mib']} MiB: {d['wrong_elements']} wrong elements on the device"
    fig = stream_lanes(lanes, title=title)
    ax = fig.axes[0]
    box = {"boxstyle": "round,pad=0.2", "facecolor": "white", "edgecolor": "#b5403a", "linewidth": 0.6}
    for x in (h["realloc_ms"], h["realloc_after_ms"]):
        ax.axvline(x, color="#b5403a", linestyle=":", linewidth=1)
    # in the narrow figure the two notes overlap in time: one row each, between the lanes
    y_first, y_again = pick((0.5, 0.5), (0.37, 0.63))
    ax.annotate(f"del src + pinned alloc: {first}", (h["realloc_ms"], y_first), xytext=(4, 0), textcoords="offset points",
                ha="left", va="center", fontsize=MIN_FONT_PT, color="#b5403a", bbox=box)
    ax.annotate(f"after synchronize, alloc: {again}", (h["realloc_after_ms"], y_again), xytext=(-4, 0),
                textcoords="offset points", ha="right", va="center", fontsize=MIN_FONT_PT, color="#b5403a", bbox=box)
    ax.annotate("HtoD copy", (g["copy_end_ms"], 0), xytext=(4, 10), textcoords="offset points", fontsize=8,
                color=PALETTE[0])
    fig.set_size_inches(*pick((7.5, 2.6), (NARROW_WIDTH, 3.4)))
    return stamp(fig, result)


@figure_function
def plot_pow2_rounding(result: Result) -> Figure:
    """Requested and owned bytes per request (log scale), with the waste ratio annotated."""
    d = result.data
    fig, ax = new_figure(width=7.5, height=3.6)
    x = list(range(len(d["requests_bytes"])))
    req = [r / MiB for r in d["requests_bytes"]]
    own = [o / MiB if o > 0 else float("nan") for o in d["owned_bytes"]]
    w = 0.4
    ax.bar([i - w / 2 for i in x], req, width=w, color=PALETTE[1], label="requested")
    ax.bar([i + w / 2 for i in x], own, width=w, color=PALETTE[0], label="owned by the host allocator")
    for i, (r, o, nb) in enumerate(zip(d["requests_bytes"], d["owned_bytes"], d["new_blocks"])):
        text = f"x{o / r:.2f}" if nb == 1 and o > 0 else "cached block"
        ax.annotate(text, (i + w / 2, max(o, r) / MiB), ha="center", va="bottom", fontsize=8,
                    xytext=(0, 2), textcoords="offset points")
    ax.set_yscale("log")
    ax.set_xticks(x)
    ax.set_xticklabels([_request_label(r) for r in d["requests_bytes"]], fontsize=8, rotation=pick(0, 35),
                       ha=pick("center", "right"))
    ax.set_xlabel("pin_memory=True request")
    ax.set_ylabel("size (MiB, log scale)")
    if is_narrow():  # above the bars it would cover their ratios
        legend_below(ax, fontsize=8)
    else:
        ax.legend(loc="upper left")
    ax.grid(axis="x", visible=False)
    return stamp(fig, result)


@figure_function
def plot_lifecycle(result: Result) -> Figure:
    """Owned MiB after each step of the script (measured, and the model's prediction)."""
    d = result.data
    fig, ax = new_figure(width=8.0, height=3.8)
    x = list(range(len(d["steps"])))
    ax.plot(x, [o / MiB for o in d["owned_bytes"]], "o-", drawstyle="steps-post", color=PALETTE[0],
            linewidth=2, label="measured: owned (host_memory_stats)")
    ax.plot(x, [o / MiB for o in d["model_owned_bytes"]], "x--", drawstyle="steps-post", color=PALETTE[1],
            label="model: power-of-two blocks, cached until emptied")
    for i, (o, a, f) in enumerate(zip(d["owned_bytes"], d["num_host_alloc"], d["num_host_free"])):
        ax.annotate(f"{a}/{f}", (i, o / MiB), xytext=(0, 6), textcoords="offset points", ha="center", fontsize=MIN_FONT_PT,
                    color="#555555")
    ax.set_xticks(x)
    ax.set_xticklabels(d["steps"], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("pinned memory owned (MiB)")
    ax.set_title("labels: cudaHostAlloc / cudaFreeHost calls so far")
    ax.set_ylim(bottom=0, top=max(max(d["owned_bytes"]), max(d["model_owned_bytes"])) / MiB * 1.25 + 0.1)
    if is_narrow():  # above the steps there is no room for it in the narrow axes
        legend_below(ax, fontsize=8, xticklines=4)
    else:
        ax.legend(loc="upper left", fontsize=8)
    return stamp(fig, result)


@figure_function
def plot_pin_cost(result: Result) -> Figure:
    """Host ms to get a pinned block (log-log): fresh cudaHostAlloc, from the cache, pin_memory()."""
    d = result.data
    fig, ax = new_figure(width=7.0, height=3.6)
    mib = [s / MiB for s in d["sizes_bytes"]]
    for key, label, color in (("fresh_ms", "fresh: cache emptied first", PALETTE[3]),
                              ("pin_memory_ms", "tensor.pin_memory(): cached block + copy", PALETTE[1]),
                              ("cached_ms", "reused cached block", PALETTE[2])):
        st = d[key]
        med = [s["median"] for s in st]
        err = [[m - s["p10"] for m, s in zip(med, st)], [s["p90"] - m for m, s in zip(med, st)]]
        ax.errorbar(mib, med, yerr=err, fmt="o-", capsize=3, color=color, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(mib)
    ax.set_xticklabels([f"{m:g}" for m in mib])
    ax.set_xlabel("size (MiB)")
    ax.set_ylabel("host time (ms, log scale)")
    ax.set_title(f"fresh pinning: {d['fresh_ms_per_mib']:.2f} ms per MiB "
                 f"({d['fresh_ms_per_mib'] * 1024:.0f} ms per GiB)")
    top = max(s["p90"] for key in ("fresh_ms", "cached_ms", "pin_memory_ms") for s in d[key])
    ax.set_ylim(top=top * 40)  # about 1.6 decades of head room, so the legend sits above the data
    ax.legend(loc="upper left", fontsize=8)
    return stamp(fig, result)


@figure_function
def plot_graph_replay(result: Result) -> Figure:
    """What the device received on each replay, against what the host's buffer held (values)."""
    d = result.data
    n = d["n_elements"]
    fig, (ax1, ax2) = new_figure(1, 2, width=9.0, height=3.4, gridspec_kw={"width_ratios": [3, 2]})
    cases = ["after capture\n(stage = 1)", "stage.fill_(3)\nin place", "stage = new\npinned 7s"]
    host_vals = [1.0, d["in_place"]["value"], d["rebound"]["new_value"]]
    dev_vals = [1.0 if d["after_capture_equal"] == n else float("nan"),
                d["in_place"]["value"] if d["in_place"]["device_equal"] == n else float("nan"),
                d["in_place"]["value"] if d["rebound"]["device_equal_old"] == n else
                (d["rebound"]["new_value"] if d["rebound"]["device_equal_new"] == n else float("nan"))]
    x = list(range(len(cases)))
    w = 0.38
    ax1.bar([i - w / 2 for i in x], host_vals, width=w, color=PALETTE[1], label="the Python name `stage` holds")
    ax1.bar([i + w / 2 for i in x], dev_vals, width=w, color=PALETTE[0], label="the replay delivered")
    for i, v in enumerate(dev_vals):
        ax1.annotate("mixed" if v != v else f"{v:g}", (i + w / 2, 0 if v != v else v), ha="center", va="bottom",
                     fontsize=8, xytext=(0, 2), textcoords="offset points")
    ax1.set_xticks(x)
    ax1.set_xticklabels(cases, fontsize=8)
    ax1.set_ylabel("element value")
    ax1.set_ylim(0, max(host_vals) * 1.3)
    ax1.legend(loc="upper left", fontsize=8)
    ax1.grid(axis="x", visible=False)
    st = d["staging"]
    ax2.plot([s["value"] for s in st], [s["max"] for s in st], "o", color=PALETTE[0], label="readback max")
    ax2.plot([s["value"] for s in st], [s["min"] for s in st], "x", color=PALETTE[2], label="readback min")
    lo, hi = min(s["value"] for s in st), max(s["value"] for s in st)
    ax2.plot([lo, hi], [lo, hi], "--", color="#888888", linewidth=1, label="expected")
    ax2.set_xlabel("value copied into the captured buffer")
    ax2.set_ylabel("value read back (pinned)")
    ax2.set_title("staging pattern: refill, replay, event", fontsize=9)
    ax2.legend(loc="upper left", fontsize=MIN_FONT_PT)
    return stamp(fig, result)


@figure_function
def plot_double_buffer(result: Result) -> Figure:
    """ms per batch with and without waiting on the buffer's event, and the batches that arrived wrong."""
    d = result.data
    fig, ax = new_figure(width=6.5, height=3.4)
    names = [("with_events", "wait on the buffer's event"), ("no_wait", "no wait (unsafe)")]
    vals = [d[k]["ms_per_batch"] for k, _ in names]
    colors = [PALETTE[0], PALETTE[3]]
    rects = ax.bar([label for _, label in names], vals, color=colors)
    for rect, (k, _) in zip(rects, names):
        bad = d[k]["wrong_batches"] + d[k]["stall_wrong_batches"]
        ax.annotate(f"{rect.get_height():.2f} ms\n{bad} batch{'es' if bad != 1 else ''} wrong",
                    (rect.get_x() + rect.get_width() / 2, rect.get_height()), ha="center", va="bottom",
                    fontsize=8, xytext=(0, 2), textcoords="offset points")
    # named in a legend under the axes: a label on the line would sit on the bars
    ax.axhline(d["mean_compute_ms"], color="#555555", linestyle=":", linewidth=1, label="mean GPU work per batch")
    legend_below(ax, fontsize=8)
    ax.set_ylim(0, max(vals) * 1.4)
    ax.set_ylabel("time per batch (ms)")
    p = result.params
    ax.set_title(f"ring of {p['buffers']} pinned buffer{'s' if p['buffers'] > 1 else ''}, {p['compute']} GPU work")
    ax.grid(axis="x", visible=False)
    return stamp(fig, result)


@figure_function
def plot_ring_sweep(results: Sequence[Result]) -> Figure:
    """Two panels against ring size, one series per compute pattern: ms per batch of the safe
    ring (waits on events), and batches that arrived wrong in the unsafe ring (no wait),
    stacked: the timed run below, the run in which the GPU starts behind on top (hatched).
    Takes results of ``pinned.double_buffer``.

    Raises:
        ValueError: an empty list.
    """
    if not results:
        raise ValueError("plot_ring_sweep needs at least one pinned.double_buffer result")
    fig, (ax1, ax2) = new_figure(1, 2, width=9.0, height=3.6)
    patterns = sorted({r.params["compute"] for r in results})
    sizes = sorted({r.params["buffers"] for r in results})
    width = 0.8 / len(patterns)
    tallest = 0
    for i, pattern in enumerate(patterns):
        rs = sorted((r for r in results if r.params["compute"] == pattern), key=lambda r: r.params["buffers"])
        xs = [r.params["buffers"] for r in rs]
        ax1.plot(xs, [r.data["with_events"]["ms_per_batch"] for r in rs], "o-", color=PALETTE[i],
                 label=f"{pattern} GPU work")
        timed = [r.data["no_wait"]["wrong_batches"] for r in rs]
        stalled = [r.data["no_wait"]["stall_wrong_batches"] for r in rs]
        offset = (i - (len(patterns) - 1) / 2) * width
        pos = [x + offset for x in xs]
        tallest = max([tallest, *(a + b for a, b in zip(timed, stalled))])
        ax2.bar(pos, timed, width=width, color=PALETTE[i], label=f"{pattern}: timed run")
        ax2.bar(pos, stalled, width=width, bottom=timed, color=PALETTE[i], alpha=0.45, hatch="//",
                edgecolor="white", label=f"{pattern}: GPU starts behind")
    mean = results[0].data["mean_compute_ms"]
    ax1.axhline(mean, color="#555555", linestyle=":", linewidth=1)
    ax1.annotate("mean GPU work per batch", (0.02, mean), xycoords=("axes fraction", "data"), va="top",
                 fontsize=MIN_FONT_PT, color="#555555", xytext=(0, -2), textcoords="offset points")
    ax1.set_xticks(sizes)
    ax1.set_xlabel("pinned buffers in the ring")
    ax1.set_ylabel("time per batch (ms)")
    ax1.set_ylim(bottom=0)
    ax1.set_title("waiting on each buffer's event", fontsize=10)
    ax1.legend(loc="upper right", fontsize=8)
    ax2.set_xticks(sizes)
    ax2.set_xlabel("pinned buffers in the ring")
    ax2.set_ylabel("batches with wrong data (count)")
    ax2.set_title("not waiting (unsafe)", fontsize=10)
    ax2.set_ylim(0, max(tallest, 1) * 1.45)  # room for the legend above the bars
    ax2.legend(loc="upper right", fontsize=MIN_FONT_PT)
    ax2.grid(axis="x", visible=False)
    return stamp(fig, list(results))


# ================================================================ one-line summaries for the text
# The chapter quotes measured numbers through these, so the prose never types a lab number.

def bandwidth_summary(result: Result) -> str:
    """A ``pinned.bandwidth`` result in four short lines: the direction; pinned against
    pageable at the largest size (with the share of the link's peak); at the smallest size;
    and pageable's best."""
    d = result.data
    sizes, pin, page = d["sizes_bytes"], d["pinned_gbps"], d["pageable_gbps"]
    link = d.get("link")
    share = (f" ({pin[-1] / link['peak_gbps']:.0%} of the link's {link['peak_gbps']:.0f} GB/s)"
             if link and link.get("peak_gbps") else "")
    best = max(range(len(page)), key=page.__getitem__)
    return "\n".join([
        f"{_DIRECTION[d['direction']]}:",
        f"  {format_bytes(sizes[-1]):>6}: pinned {pin[-1]:.1f} GB/s{share}, pageable {page[-1]:.1f} GB/s: "
        f"{pin[-1] / page[-1]:.1f}x",
        f"  {format_bytes(sizes[0]):>6}: pinned {pin[0]:.2f} GB/s, pageable {page[0]:.2f} GB/s",
        f"  pageable at best: {page[best]:.1f} GB/s ({format_bytes(sizes[best])})",
    ])


def guard_costs_text(result: Result) -> str:
    """A ``pinned.overwrite_race`` result as lines, cheapest guard first: the share of wrong
    device elements (worst repeat) and the ms the host was blocked (median and p90)."""
    d = result.data
    rows = sorted(d["strategies"], key=lambda r: r["host_blocked_ms"]["median"])
    head = (f"{result.params['size_mib']} MiB, {d['work_ms']:g} ms of GPU work queued before and after the copy"
            f"\n{'':29}{'wrong':>7}{'blocked (median)':>18}{'p90':>10}")
    lines = [f"{r['label']:<29}{max(r['wrong_elements']) / d['n_elements']:>7.0%}"
             f"{r['host_blocked_ms']['median']:>15.2f} ms{r['host_blocked_ms']['p90']:>7.2f} ms" for r in rows]
    return "\n".join([head, *lines])


def race_timing_text(results: Sequence[Result]) -> str:
    """One line per ``pinned.overwrite_race`` result: when the host wrote, and the share of
    device elements the unguarded copy got wrong (worst repeat)."""
    lines = []
    for r in sorted(results, key=lambda r: r.params["overwrite_after_ms"]):
        race = next(s for s in r.data["strategies"] if s["name"] == "race")
        share = max(race["wrong_elements"]) / r.data["n_elements"]
        lines.append(f"{r.params['size_mib']} MiB, {r.data['work_ms']:g} ms of GPU work ahead; host writes "
                     f"{r.params['overwrite_after_ms']:>2g} ms after the call: {share:>4.0%} wrong")
    return "\n".join(lines)


def del_summary(result: Result) -> str:
    """What a ``pinned.del_is_safe`` result says, in two lines: how long each pinned
    allocation took and which address it got, and the device's wrong elements."""
    d, h = result.data, result.data["host"]
    pending = "pending" if d["copy_pending_at_realloc"] else "already done"
    first = "the dropped block's address" if d["reused_while_pending"] else "a different address"
    again = "the dropped block's address" if d["reused_after_completion"] else "a different address"
    return (f"del + pinned alloc while the copy was {pending}: {h['realloc_ms'] - h['copy_call_ms']:.2f} ms, "
            f"{first}\npinned alloc after synchronize(): {h['realloc_after_ms'] - h['sync_ms']:.2f} ms, {again}"
            f"\nwrong elements on the device: {d['wrong_elements']}")


def pin_cost_summary(result: Result) -> str:
    """The largest size of a ``pinned.pin_cost`` result: fresh pinning, a cached block and
    ``pin_memory()`` (ms, and pin_memory()'s copy rate in GB/s), plus fresh ms per MiB."""
    d = result.data
    size = d["sizes_bytes"][-1]
    fresh, cached, repin = (d[k][-1]["median"] for k in ("fresh_ms", "cached_ms", "pin_memory_ms"))
    return (f"{format_bytes(size)}: fresh {fresh:.1f} ms, from the cache {cached * 1e3:.0f} µs "
            f"({fresh / cached:,.0f}x faster)\n{format_bytes(size)}: pin_memory() of a pageable tensor "
            f"{repin:.1f} ms ({size / (repin * 1e-3) / 1e9:.0f} GB/s)"
            f"\nfresh pinning, sizes of 16 MiB and up: {d['fresh_ms_per_mib']:.2f} ms per MiB")


def ring_summary(results: Sequence[Result]) -> str:
    """A table of ``pinned.double_buffer`` results, one block per compute pattern and one
    column per ring size: ms per batch and total host wait of the safe ring, and the wrong
    batches of the unsafe one (timed run, and the run in which the GPU starts behind)."""
    lines: list[str] = []
    for pattern in sorted({r.params["compute"] for r in results}):
        if lines:
            lines.append("")
        rs = sorted((r for r in results if r.params["compute"] == pattern), key=lambda r: r.params["buffers"])
        lines.append(f"{pattern + ' GPU work, buffers':<36}" + "".join(f"{r.params['buffers']:>9}" for r in rs))
        lines.append(f"{'  safe: ms per batch':<36}" + "".join(f"{r.data['with_events']['ms_per_batch']:>9.2f}"
                                                                for r in rs))
        lines.append(f"{'  safe: host waited, ms in all':<36}"
                     + "".join(f"{r.data['with_events']['host_wait_ms']:>9.1f}" for r in rs))
        lines.append(f"{'  unsafe: wrong batches, timed run':<36}"
                     + "".join(f"{r.data['no_wait']['wrong_batches']:>6}/{r.params['batches']:<2}" for r in rs))
        lines.append(f"{'  unsafe: wrong, GPU starts behind':<36}"
                     + "".join(f"{r.data['no_wait']['stall_wrong_batches']:>6}/{2 * r.params['buffers'] + 2:<2}"
                               for r in rs))
        if len(rs) > 1:
            first, last = rs[0], rs[-1]
            ratio = first.data["with_events"]["ms_per_batch"] / last.data["with_events"]["ms_per_batch"] - 1
            lines.append(f"  safe, {first.params['buffers']} buffer{'s' * (first.params['buffers'] != 1)} against "
                         f"{last.params['buffers']}: {ratio:+.0%} time per batch")
    return "\n".join(lines)
