"""The allocator doctor: a reader's memory snapshot, replayed exactly, and "what if?" answered.

``doctor(snapshot, what_if=["expandable_segments:True", ...])`` reads a snapshot
(``torch.cuda.memory._dump_snapshot`` pickle, its dict, or the book's compact JSON), replays
its trace under the settings it was recorded with (:func:`experiments.allocator.replay.replay`
checks every segment event, block address and reserved-bytes value against the trace),
then runs the same requests under each what-if setting and cap. The report says what was
reserved but not usable at the peak and which live blocks pinned those segments, and puts
the settings side by side; in a notebook it also draws reserved and allocated bytes over the
trace for every setting on one axis, and the segment map at the peak.

The command line is ``python -m experiments doctor SNAPSHOT [--what-if SETTINGS ...]
[--cap BYTES | --cap-fraction F] [--json]`` (:func:`main`).

Sources: ``c10/cuda/CUDACachingAllocator.cpp`` (via allocator-rules.md), the snapshot
format of ``torch/cuda/memory.py`` / ``torch/cuda/_memory_viz.py``, and
https://docs.pytorch.org/docs/stable/torch_cuda_memory.html (how to record a snapshot).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any, Mapping, Sequence

from ..core.tables import Table
from ..core.units import format_bytes, mib
from .model import AllocatorConfig
from .engine import H200_TOTAL_MEMORY, Engine, EngineOutOfMemory
from .replay import R_ALLOC, R_EMPTY, R_FREE_DONE, R_FREE_REQ, Run, _finish, _no_gc, replay
from .trace import SnapshotError, Trace, read


def what_if(base: Run, config: AllocatorConfig, settings: str, *, cap_bytes: int | None = None,
            total_memory: int = 150_109_880_320, stop_at: int | None = None) -> tuple[Run, Engine]:
    """Run the requests of a replay under ``config`` (and ``cap_bytes``) on a fresh engine.

    Returns:
        (the Run, the engine after the last request processed; ``stop_at`` stops after that
        many requests, e.g. to read the layout at the peak).
    """
    with _no_gc():
        return _run_requests(base, config, settings, cap_bytes, total_memory, stop_at)


class _DriverSync:
    """Follows a recorded run's driver calls while a what-if makes the same ones (see what_if)."""

    def __init__(self, log: Sequence[tuple[str, int, int]], eng: Engine):
        self.log, self.eng, self.pos, self.on, self.seen = log, eng, 0, bool(log), 0

    def follow(self) -> None:
        """Check the releases of the operation just done against the log."""
        evs = self.eng.events
        for a, addr, size in evs[self.seen:]:
            if a == "segment_free":
                if self.pos < len(self.log) and self.log[self.pos] == (a, addr, size):
                    self.pos += 1
                else:
                    self.on = False
                    break
        self.seen = 0

    def address(self, size: int) -> int | None:
        if not self.on:
            return None
        self.follow()
        self.seen = len(self.eng.events)
        want = "range" if self.eng.config.expandable_segments else "segment_alloc"
        if self.on and self.pos < len(self.log):
            a, addr, s = self.log[self.pos]
            if a == want and s == size and self.eng.is_free_range(addr, size):
                self.pos += 1
                return addr
        self.on = False
        return None


def _run_requests(base: Run, config: AllocatorConfig, settings: str, cap_bytes: int | None, total_memory: int,
             stop_at: int | None) -> tuple[Run, Engine]:
    eng = Engine(config, cap_bytes=cap_bytes, total_memory=total_memory)
    # The driver picks segment addresses from the history of cudaMalloc and cudaFree calls.
    # While the what-if makes the same calls as the GPU's run, in the same order, it takes
    # the GPU's addresses (ties between equal free blocks go by address); from the first
    # difference on, addresses of its own.
    sync = _DriverSync(base.segment_log, eng)
    address = sync.address
    eng.address_hook = address
    run = Run(settings)
    blocks: dict[int, Any] = {}
    for key, req, stream, pool in base.initial:
        try:
            blocks[key] = eng.malloc(max(req, 1), stream, pool)
        except EngineOutOfMemory:
            run.oom_requests.append((-1, req))
    malloc, free_req, free_done, empty = eng.malloc, eng.free_requested, eng.free_completed, eng.empty_cache
    alloc_a, res_a = run.allocated, run.reserved
    for k, r in enumerate(base.requests):
        if stop_at is not None and k >= stop_at:
            break
        kind = r[0]
        if kind == R_ALLOC:
            try:
                blocks[r[1]] = malloc(r[2], r[3], r[4])
            except EngineOutOfMemory:
                run.oom_requests.append((k, r[2]))
        elif kind == R_FREE_REQ:
            b = blocks.get(r[1])
            if b is not None:
                free_req(b)
        elif kind == R_FREE_DONE:
            b = blocks.pop(r[1], None)
            if b is not None:
                free_done(b)
        elif kind == R_EMPTY:
            empty(r[1])
        else:  # a request that failed on the GPU: try it, and drop it at once if it fits
            try:
                b = malloc(r[1], r[2], r[3])
                free_req(b)
                free_done(b)
            except EngineOutOfMemory:
                run.oom_requests.append((k, r[1]))
        if sync.on and eng.events:
            sync.follow()
        alloc_a.append(eng.allocated_bytes)
        res_a.append(eng.reserved_bytes)
    run.events_replayed = len(alloc_a)
    _finish(run, eng)
    return run, eng


_what_if = what_if  # doctor() takes a parameter of that name


def _config(settings: str) -> AllocatorConfig:
    try:
        return AllocatorConfig.from_settings(settings or None)
    except ValueError as e:
        raise ValueError(f"what-if settings {settings!r}: {e}") from None


def _layout_stats(segments: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    free = [b["size"] for s in segments for b in s["blocks"] if b["state"] == "inactive"]
    total_free = sum(free)
    return {"reserved_unallocated_bytes": total_free,
            "largest_free_bytes": max(free, default=0),
            "fragmentation": 0.0 if not total_free else 1.0 - max(free) / total_free}


def _pinning(segments: Sequence[Mapping[str, Any]], top: int = 5) -> list[dict[str, Any]]:
    """Segments that hold free bytes but cannot be released: live blocks pin them."""
    rows = []
    for s in segments:
        live = [b for b in s["blocks"] if b["state"] != "inactive"]
        free = sum(b["size"] for b in s["blocks"] if b["state"] == "inactive")
        if live and free:
            rows.append({"address": s["address"], "segment_bytes": s["total_size"], "pool": s["pool"],
                         "pool_id": s.get("pool_id"), "expandable": s.get("is_expandable", False),
                         "free_bytes": free,
                         "live_blocks": [{"size": b["size"], "requested_size": b["requested_size"]} for b in live]})
    rows.sort(key=lambda r: -r["free_bytes"])
    return rows[:top]


@dataclasses.dataclass
class Report:
    """What :func:`doctor` found. ``to_json()`` is the CLI's ``--json`` object; ``text()`` the report."""

    trace: Trace
    replay: Run
    what_ifs: list[Run]
    configs: list[AllocatorConfig]
    cap_bytes: int | None
    total_memory: int
    _layouts: dict[int, list[dict[str, Any]]] = dataclasses.field(default_factory=dict, repr=False)

    def peak_layout(self, run: Run) -> list[dict[str, Any]]:
        """The segments at ``run``'s peak reserved (computed on first use: a second pass up
        to the peak; for the recorded run, the exact replay with the GPU's addresses)."""
        key = id(run)
        if key not in self._layouts:
            t = self.trace
            if run is self.replay and run.matches_trace:
                segs = replay(t, total_memory=self.total_memory, stop_at=run.peak_event + 1).final_segments
            else:
                if run is self.replay:
                    cfg, cap = t.config, t.cap_bytes
                else:
                    cfg, cap = self.configs[self.what_ifs.index(run)], self.cap_bytes
                _, eng = _what_if(self.replay, cfg, run.settings, cap_bytes=cap, total_memory=self.total_memory,
                                  stop_at=run.peak_index + 1)
                segs = eng.segments()
            self._layouts[key] = segs
        return self._layouts[key]

    def to_json(self) -> dict[str, Any]:
        """``{"trace_events", "settings", "replay": {...}, "what_if": [...]}`` (issue 11's format)."""
        return {"trace_events": len(self.trace.events), "settings": self.trace.settings,
                "replay": self.replay.summary(),
                "what_if": [w.summary() for w in self.what_ifs]}

    def rows(self) -> list[dict[str, Any]]:
        """One row per setting (recorded first): the figures and the fragmentation at the peak."""
        out = []
        for label, run in [("recorded: " + (self.trace.settings or "defaults"), self.replay)] + \
                [(w.settings or "defaults", w) for w in self.what_ifs]:
            stats = _layout_stats(self.peak_layout(run))
            out.append({"label": label, **run.summary(), **{f"peak_{k}": v for k, v in stats.items()}})
        return out

    def table(self) -> Table:
        """The settings side by side: peak and final reserved, peak allocated, fragmentation at the
        peak and OOMs, the recorded setting first (an HTML table in a notebook)."""
        return Table(["setting", "peak reserved", "peak allocated", "final reserved", "frag@peak", "OOMs"],
                     [[x["label"], format_bytes(x["peak_reserved_bytes"]), format_bytes(x["peak_allocated_bytes"]),
                       format_bytes(x["final_reserved_bytes"]), f"{x['peak_fragmentation']:.2f}", x["oom_events"]]
                      for x in self.rows()], right=[False, True, True, True, True, True])

    def text(self) -> str:
        """The short report: :meth:`summary`, then :meth:`table` as text."""
        return "\n".join([self.summary(), "the same requests under each setting:"]
                          + ["  " + line for line in str(self.table()).splitlines()])

    def summary(self) -> str:
        """The replay's verdict and what is reserved but unusable at the peak (which live blocks
        pin which segments)."""
        t, r = self.trace, self.replay
        lines = [f"snapshot: {len(t.events):,} trace events; settings: {t.settings or 'defaults'}"
                 + (f"; cap {format_bytes(self.cap_bytes)}" if self.cap_bytes else "")]
        if r.matches_trace:
            lines.append("replay: matches the trace exactly (every segment event, block address and reserved byte)")
        else:
            m = r.first_mismatch or {}
            lines.append(f"replay: stops at trace event {m.get('event_index')} ({m.get('action')}): {m.get('reason')}; "
                         "the figures below cover the events before it")
        layout = self.peak_layout(r)
        stats = _layout_stats(layout)
        lines.append(f"peak reserved {format_bytes(r.peak_reserved_bytes)}, peak allocated "
                     f"{format_bytes(r.peak_allocated_bytes)}; at the peak {format_bytes(stats['reserved_unallocated_bytes'])} "
                     f"is reserved but not allocated (fragmentation {stats['fragmentation']:.2f})")
        pins = _pinning(layout)
        if pins:
            lines.append("segments that hold it, pinned by live blocks:")
            for p in pins:
                blocks = ", ".join(format_bytes(b["size"]) for b in p["live_blocks"][:4])
                more = f" and {len(p['live_blocks']) - 4} more" if len(p["live_blocks"]) > 4 else ""
                lines.append(f"  {format_bytes(p['segment_bytes'])} {p['pool']} segment at {p['address']:#x}: "
                             f"{format_bytes(p['free_bytes'])} free, held by {blocks}{more}")
        return "\n".join(lines)

    def figure(self) -> Any:
        """Reserved (solid) and allocated (dashed) bytes over the requests for every setting on
        one axis, and the segment map at the recorded run's peak."""
        from ..core.plotting import figure_function

        # a figure_function call, so that the book can draw it again for phones
        return figure_function(self._draw_figure)()

    def _draw_figure(self) -> Any:
        from ..core.plotting import fit_text, is_narrow, legend_below, mib, new_figure, segment_map

        fig, (ax, ax2) = new_figure(2, 1, height=6.4)
        runs = [self.replay] + self.what_ifs
        for k, run in enumerate(runs):
            label = ("recorded: " if k == 0 else "") + (run.settings or "defaults")
            step = max(1, len(run.reserved) // 4000)
            xs = range(0, len(run.reserved), step)
            line, = ax.plot(xs, [mib(run.reserved[i]) for i in xs], label=f"reserved, {label}")
            ax.plot(xs, [mib(run.allocated[i]) for i in xs], ls="--", color=line.get_color(), lw=0.8)
        ax.set_xlabel("request (alloc, free, empty_cache) in trace order")
        ax.set_ylabel("MiB (solid reserved, dashed allocated)")
        if is_narrow():  # inside the narrow axes the legend would cover the lines
            legend_below(ax, fontsize=8)
        else:
            ax.legend(fontsize=8)
        layout = self.peak_layout(self.replay)
        # segments that live blocks pin first (most free bytes first), then the largest others
        def order(seg: Mapping[str, Any]) -> tuple[int, int]:
            live = any(b["state"] != "inactive" for b in seg["blocks"])
            free = sum(b["size"] for b in seg["blocks"] if b["state"] == "inactive")
            return (0 if live and free else 1, -free if live else -seg["total_size"])

        layout = sorted(layout, key=order)[:12]
        if layout:
            segment_map(layout, ax=ax2, title="at the recorded run's peak: pinned segments first (12 shown)")
        return fit_text(fig)  # titles wrapped to the width, with or without a footer

    def _repr_html_(self) -> str:
        import html

        return "<pre>" + html.escape(self.summary()) + "</pre>" + self.table()._repr_html_()

    def _ipython_display_(self) -> None:
        from IPython.display import HTML, display

        display(HTML(self._repr_html_()))
        display(self.figure())


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
    # imported here: the doctor itself runs without matplotlib (in Pyodide)
    from ..core.plotting import figure_function, stamp

    def draw(result: Any, workload_settings: str) -> Any:
        rep = _recorded_point(result, workload_settings)[2]
        return stamp(rep.figure(), result) if hasattr(result, "caption") else rep.figure()

    # a figure_function call, so that the book can draw it again for phones
    return figure_function(draw)(result, workload_settings)


def lab_comparison_table(rows: Sequence[Mapping[str, Any]]) -> Table:
    """:func:`lab_comparison` as a table: peak and final reserved MiB, the what-if's and the GPU's."""
    return Table(["setting", "what-if peak (MiB)", "GPU peak (MiB)", "what-if end (MiB)", "GPU end (MiB)"],
                 [[r["settings"], f"{mib(r['what_if_peak_reserved_bytes']):.0f}", f"{mib(r['gpu_peak_reserved_bytes']):.0f}",
                   f"{mib(r['what_if_final_reserved_bytes']):.0f}", f"{mib(r['gpu_final_reserved_bytes']):.0f}"]
                  for r in rows], "reserved memory", right=[False, True, True, True, True])


def doctor(snapshot: Any, what_if: Sequence[str] = (), *, cap_bytes: int | None = None,
           cap_fraction: float | None = None, device: int = 0, show: bool = False) -> Report:
    """Replay ``snapshot`` and answer the what-ifs.

    Args:
        snapshot: a path (pickle or JSON), a snapshot dict, or a recorded run.
        what_if: settings strings in ``PYTORCH_CUDA_ALLOC_CONF`` syntax ('' = defaults).
        cap_bytes / cap_fraction: a memory cap for the what-ifs (bytes, or a fraction of the
            device's memory: the snapshot's ``device_total_bytes`` or the H200's); default the
            cap the snapshot records, if any.
        show: in a notebook, display the report and the figure.

    Raises:
        SnapshotError: not a readable snapshot. ValueError: bad settings or cap.
    """
    if cap_bytes is not None and cap_fraction is not None:
        raise ValueError("give cap_bytes or cap_fraction, not both")
    if cap_bytes is not None and (isinstance(cap_bytes, bool) or not isinstance(cap_bytes, int) or cap_bytes < 0):
        raise ValueError(f"cap_bytes must be a whole number of bytes >= 0, got {cap_bytes!r}")
    if cap_fraction is not None and not (isinstance(cap_fraction, (int, float)) and 0 < cap_fraction <= 1):
        raise ValueError(f"cap_fraction must be in (0, 1], got {cap_fraction!r}")
    if isinstance(what_if, str):
        what_if = [what_if]
    configs = [(s, _config(s)) for s in what_if]
    trace = read(snapshot, device=device)
    total = trace.total_memory or H200_TOTAL_MEMORY
    cap = cap_bytes if cap_bytes is not None else int(cap_fraction * total) if cap_fraction else trace.cap_bytes
    base = replay(trace, total_memory=total)
    runs = [_what_if(base, cfg, settings, cap_bytes=cap, total_memory=total)[0] for settings, cfg in configs]
    report = Report(trace, base, runs, [cfg for _, cfg in configs], cap, total)
    if show:
        from IPython.display import display

        display(report)
        display(report.figure())
    return report


# ----------------------------------------------------------------------------- command line

def add_parser(sub: Any) -> None:
    """Register ``doctor`` on an argparse subparsers object (the CLI calls this lazily)."""
    p = sub.add_parser("doctor", help="replay a memory snapshot and compare allocator settings",
                       description="Replay a torch.cuda.memory snapshot exactly and answer 'what if I changed "
                                   "the allocator settings?'")
    p.add_argument("snapshot", help="a _dump_snapshot pickle or a JSON snapshot")
    p.add_argument("--what-if", action="append", default=[], metavar="SETTINGS",
                   help="settings in PYTORCH_CUDA_ALLOC_CONF syntax, e.g. expandable_segments:True (repeatable)")
    cap = p.add_mutually_exclusive_group()
    cap.add_argument("--cap", type=int, metavar="BYTES", help="memory cap for the what-ifs, in bytes")
    cap.add_argument("--cap-fraction", type=float, metavar="F", help="memory cap as a fraction of the device (0-1]")
    p.add_argument("--device", type=int, default=0, help="which device's trace (default 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run_cli)


def run_cli(args: argparse.Namespace) -> int:
    """The ``doctor`` command: print the report (or JSON); errors become one line and exit 2."""
    if args.cap is not None and args.cap < 0:
        raise ValueError(f"--cap must be a number of bytes >= 0, got {args.cap}")
    if args.cap_fraction is not None and not 0 < args.cap_fraction <= 1:
        raise ValueError(f"--cap-fraction must be in (0, 1], got {args.cap_fraction}")
    rep = doctor(args.snapshot, args.what_if, cap_bytes=args.cap, cap_fraction=args.cap_fraction, device=args.device)
    if args.json:
        json.dump(rep.to_json(), sys.stdout)
        print()
    else:
        print(rep.text())
    return 0


__all__ = ["Report", "SnapshotError", "add_parser", "doctor", "lab_comparison", "lab_comparison_table",
           "plot_doctor_snapshots", "run_cli", "what_if"]
