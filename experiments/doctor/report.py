"""The allocator doctor: a reader's memory snapshot, replayed exactly, and "what if?" answered.

``doctor(snapshot, what_if=["expandable_segments:True", ...])`` reads a snapshot
(``torch.cuda.memory._dump_snapshot`` pickle, its dict, or the doctor's compact JSON), replays
its trace under the settings it was recorded with (:func:`experiments.doctor.replay.replay`
checks every segment event, block address and reserved-bytes value against the trace),
then runs the same requests under each what-if setting and cap
(:func:`experiments.doctor.whatif.what_if`). The :class:`Report` says what was reserved but
not usable at the peak and which live blocks pinned those segments, and puts the settings
side by side; in a notebook it also draws reserved and allocated bytes over the trace for
every setting on one axis, and the segment map at the peak.

Sources: ``c10/cuda/CUDACachingAllocator.cpp`` (via the rules file, RULES.md), the snapshot
format of ``torch/cuda/memory.py`` / ``torch/cuda/_memory_viz.py``, and
https://docs.pytorch.org/docs/stable/torch_cuda_memory.html (how to record a snapshot).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from ..core.tables import Table
from ..core.units import format_bytes
from .engine import H200_TOTAL_MEMORY
from .entries import SIZE_LIMIT
from .loader import DEFAULT_LIMITS, InputError, Limits
from .replay import Run, replay
from .rules import AllocatorConfig
from .trace import Trace, read
from .whatif import _config, what_if as _what_if


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
        one axis, and the segment map at the recorded run's peak (a matplotlib Figure; the
        only part of the doctor that imports matplotlib, when it is drawn)."""
        from .figure import draw

        return draw(self)

    def _repr_html_(self) -> str:
        import html

        return "<pre>" + html.escape(self.summary()) + "</pre>" + self.table()._repr_html_()

    def _ipython_display_(self) -> None:
        from IPython.display import HTML, display

        display(HTML(self._repr_html_()))
        display(self.figure())


def doctor(snapshot: Any, what_if: Sequence[str] = (), *, cap_bytes: int | None = None,
           cap_fraction: float | None = None, device: int = 0, show: bool = False,
           limits: Limits = DEFAULT_LIMITS) -> Report:
    """Replay ``snapshot`` and answer the what-ifs.

    Args:
        snapshot: a path (pickle or JSON), a snapshot dict, or a recorded run.
        what_if: settings strings in ``PYTORCH_CUDA_ALLOC_CONF`` syntax ('' = defaults).
        cap_bytes / cap_fraction: a memory cap for the what-ifs (bytes, or a fraction of the
            device's memory: the snapshot's ``device_total_bytes`` or the H200's); default the
            cap the snapshot records, if any.
        show: in a notebook, display the report and the figure.
        limits: what the loader accepts (:class:`experiments.doctor.loader.Limits`).

    Raises:
        InputError (a ValueError): not a readable snapshot (SnapshotError), an impossible
            trace, bad settings or cap; the message is one line naming what is wrong. Any
            other exception is a bug in the doctor.
    """
    if cap_bytes is not None and cap_fraction is not None:
        raise InputError("give cap_bytes or cap_fraction, not both")
    if cap_bytes is not None and (isinstance(cap_bytes, bool) or not isinstance(cap_bytes, int)
                                  or not 0 <= cap_bytes < SIZE_LIMIT):
        raise InputError(f"cap_bytes must be a whole number of bytes in [0, {SIZE_LIMIT:#x}), got {cap_bytes!r}")
    if cap_fraction is not None and (isinstance(cap_fraction, bool) or not isinstance(cap_fraction, (int, float))
                                     or not 0 < cap_fraction <= 1):
        raise InputError(f"cap_fraction must be in (0, 1], got {cap_fraction!r}")
    if isinstance(device, bool) or not isinstance(device, int) or device < 0:
        raise InputError(f"device must be a device index >= 0, got {device!r}")
    if isinstance(what_if, str):
        what_if = [what_if]
    configs = [(s, _config(s)) for s in what_if]
    trace = read(snapshot, device=device, limits=limits)
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


__all__ = ["Report", "doctor"]
