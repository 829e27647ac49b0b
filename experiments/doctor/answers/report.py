"""The allocator doctor: a reader's memory snapshot, replayed exactly, and "what if?" answered.

``doctor(snapshot, what_if=["expandable_segments:True", ...])`` reads a snapshot
(``torch.cuda.memory._dump_snapshot`` pickle, its dict, or the doctor's compact JSON), replays
its trace under the settings it was recorded with
(:func:`experiments.doctor.replaying.replay.replay` checks every segment event, block address
and reserved-bytes value against the trace), then runs the same requests under each what-if
setting and cap (:func:`experiments.doctor.answers.whatif.what_if`). The :class:`Report` says
what was reserved but not usable at the peak and which live blocks pinned those segments, and
puts the settings side by side; in a notebook it also draws reserved and allocated bytes over
the trace for every setting on one axis, and the segment map at the peak. A progress hook is
told each step as it starts and ends, the finished ones with their result
(:mod:`experiments.doctor.answers.progress`).

Sources: ``c10/cuda/CUDACachingAllocator.cpp`` (via the rules file, RULES.md), the snapshot
format of ``torch/cuda/memory.py`` / ``torch/cuda/_memory_viz.py``, and
https://docs.pytorch.org/docs/stable/torch_cuda_memory.html (how to record a snapshot).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

from ...core.tables import Table
from ...core.units import format_bytes
from ..errors import InputError
from ..model.rules import H200_TOTAL_MEMORY, NOT_PLACEMENT, unmodelled_options
from ..reading.loader import DEFAULT_LIMITS, Limits
from ..reading.rows import SIZE_LIMIT
from ..reading.trace import Trace, read
from ..replaying.replay import RULE_NOTES, replay
from ..replaying.run import Run
from .oom import explain, first_oom, infer_cap, your_frame
from .progress import Progress, Step
from .suggest import run_many, suggest as _suggest
from .whatif import WhatIf, what_if as _what_if

FORMAT = "memlab-doctor-report-1"
JSON_FIELDS = """The ``--json`` object (``Report.to_json()``), format ``memlab-doctor-report-1``:

format            'memlab-doctor-report-1'
trace_events      events in the trace (annotations left out)
settings          the PYTORCH_CUDA_ALLOC_CONF the program ran with ('' = the defaults)
device_total_bytes  the device's memory (given, the snapshot's, else the lab H200's)
device_total_source 'given' (--total-memory), 'snapshot' or 'assumed' (the lab H200's)
cap_bytes         the memory cap the what-ifs ran under, or null
cap_source        'given', 'fraction', 'snapshot', 'settings' (per_process_memory_fraction in the
                  recorded settings), 'inferred' (from the OOM entry) or null
allocator_rule    the best-fit order between equal free blocks the replay followed: version
                  ('2.11': 2.11 and before, by address; '2.12': by Block age; '2.13': 2.13 and
                  2.14, by segment age then address), tried (the orders run, in order), ties
                  (choices between equal blocks it decided), note (how it is known: the 2.12
                  and 2.13 orders are read from the source, not yet checked on a GPU), layout
                  (the trace's layout: '2.11', '2.12' with pool_id, '2.14' with annotate/host keys)
warnings          one line each: recorded settings not modelled, the device memory assumed where
                  it matters, a cap below the recording's need, skipped trace actions, a GC
                  threshold without a known cap
replay            settings, matches_trace, first_mismatch (null, or event_index, action,
                  reason, expected, got), final/peak reserved and allocated bytes, oom_events
what_if           one object per --what-if: settings, final/peak reserved and allocated bytes,
                  oom_events, and how sure the answer is: exact (true when nothing the
                  snapshot leaves open can change it), uncertain (what can: record_stream
                  completion timing, pool attribution, driver address order, pool checkpoint
                  restores, lifetime of requests that failed in the recording), bound_bytes
                  (the most peak or final reserved may be off by; 0 when exact),
                  peak_reserved_range_bytes and final_reserved_range_bytes ([low, high]),
                  oom_events_range ([fewest, most]), finished (false when a request the
                  recording served runs out of memory: a program that does not catch the error
                  stops there) and stopped_at_request (that request, or null)
oom               null, or the explanation of the first out-of-memory: event_index,
                  request_bytes, rounded_bytes, segment_bytes, pool, stream, device_free_bytes,
                  cap_bytes, allocated_bytes, reserved_bytes, reserved_unallocated_bytes,
                  largest_free_bytes, followed, pinned (segments with free bytes that live
                  blocks pin: address, segment_bytes, pool, stream, free_bytes,
                  live_block_count, live_blocks [address, size, requested_size, frames
                  [[file, line, name], ...], forward_frames (torch 2.12+: the forward pass's
                  stack of a block allocated in the backward pass)]), fits_under, fails_under (settings
                  whose exact what-if served / refused the request), uncertain_under
                  (settings whose what-if is not exact)
suggestion        null, or (with --suggest) rows (every setting tried, best first:
                  settings, peak_reserved_bytes, final_reserved_bytes, peak_allocated_bytes,
                  oom_events, saved_bytes, saved_range_bytes, and the certainty fields of
                  what_if), recorded (the recorded run's figures), best (the first row, or
                  null when nothing beats the recorded run even at the worst end of the
                  row's range), alloc_conf (the line to use, or null), cap_bytes,
                  ooms_compared (false when the recorded run ran out of memory under a cap
                  the doctor does not know: the grid ran without one, and only peaks count)
Sizes are bytes. New fields may be added; none is removed or renamed within a format.
"""


def _between(x: Mapping[str, Any], name: str) -> str:
    """A what-if's figure as the reader should take it: one number when exact, else the range
    ("between X and Y") of the runs the snapshot cannot tell apart."""
    rng = x.get(name.replace("_bytes", "_range_bytes"))
    if x.get("exact") is False and rng and rng[0] != rng[1]:
        return f"between {format_bytes(rng[0])} and {format_bytes(rng[1])}"
    return format_bytes(x[name])


def _ooms(x: Mapping[str, Any]) -> str:
    rng = x.get("oom_events_range")
    if x.get("exact") is False and rng and rng[0] != rng[1]:
        return f"between {rng[0]} and {rng[1]}"
    return str(x["oom_events"])


def _uncertain_lines(rows: Sequence[Mapping[str, Any]], label: str = "settings") -> list[str]:
    """Why the what-ifs that are not exact may be off, and by how much: one line for the
    settings that share their reasons and bound; one line for all those whose alternatives
    all gave the same figures (the table shows those figures once)."""
    off: dict[tuple[str, int], list[str]] = {}
    same: dict[str, int] = {}
    for x in rows:
        if x.get("exact") is False:
            why = ", ".join(x.get("uncertain") or ["?"])
            if x.get("bound_bytes"):
                off.setdefault((why, x["bound_bytes"]), []).append(x[label] or "defaults")
            else:
                same[why] = same.get(why, 0) + 1
    # several settings: counted, not named (their names hold commas; their rows show the ranges)
    out = [(names[0] + ":" if len(names) == 1 else f"{len(names)} what-ifs") +
           f" not exact ({why}); peak and final reserved may be off by up to {format_bytes(b)}"
           for (why, b), names in off.items()]
    if same:
        n = sum(same.values())
        what = (f"{n} what-if{'s' if n > 1 else ''} " +
                ("assume" if n > 1 else "assumes") + " the driver's address order"
                if set(same) == {"driver address order"} else
                f"{n} what-if{'s' if n > 1 else ''} not exact (" +
                "; ".join(f"{why}: {k}" if len(same) > 1 else why for why, k in same.items()) + ")")
        out.append(what + "; every alternative the doctor ran gave the same figures")
    return out


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


def check_options(*, cap_bytes: Any = None, cap_fraction: Any = None, device: Any = 0, workers: Any = None,
                  total_memory: Any = None, names: Mapping[str, str] | None = None) -> None:
    """The checks of :func:`doctor`'s options, which the command line makes too (``names``:
    what to call each option in the message, e.g. ``{"cap_bytes": "--cap"}``).

    Raises:
        InputError: the first option out of its range, named, with the range and the value.
    """
    def name(option: str) -> str:
        return (names or {}).get(option, option)

    if cap_bytes is not None and cap_fraction is not None:
        raise InputError(f"give {name('cap_bytes')} or {name('cap_fraction')}, not both")
    if cap_bytes is not None and (isinstance(cap_bytes, bool) or not isinstance(cap_bytes, int)
                                  or not 0 <= cap_bytes < SIZE_LIMIT):
        raise InputError(f"{name('cap_bytes')} must be a whole number of bytes in [0, {SIZE_LIMIT:#x}), "
                         f"got {cap_bytes!r}")
    if cap_fraction is not None and (isinstance(cap_fraction, bool) or not isinstance(cap_fraction, (int, float))
                                     or not 0 < cap_fraction <= 1):
        raise InputError(f"{name('cap_fraction')} must be in (0, 1], got {cap_fraction!r}")
    if isinstance(device, bool) or not isinstance(device, int) or device < 0:
        raise InputError(f"{name('device')} must be a device index >= 0, got {device!r}")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise InputError(f"{name('workers')} must be a whole number >= 1, got {workers!r}")
    if total_memory is not None and (isinstance(total_memory, bool) or not isinstance(total_memory, int)
                                     or not 0 < total_memory < SIZE_LIMIT):
        raise InputError(f"{name('total_memory')} must be a whole number of bytes in (0, {SIZE_LIMIT:#x}), "
                         f"got {total_memory!r}")


def doctor(snapshot: Any, what_if: Sequence[str] = (), *, cap_bytes: int | None = None,
           cap_fraction: float | None = None, device: int = 0, show: bool = False,
           limits: Limits = DEFAULT_LIMITS, suggest: bool = False, explain_oom: bool = True,
           workers: int | None = None, series: bool = False,
           progress: Callable[[Step], Any] | None = None, total_memory: int | None = None) -> Report:
    """Replay ``snapshot`` and answer the what-ifs.

    Args:
        snapshot: a path (pickle, gzip'd pickle or JSON), a snapshot dict, or a recorded run.
        what_if: settings strings in ``PYTORCH_CUDA_ALLOC_CONF`` syntax ('' = defaults), each
            parsed once (:class:`~experiments.doctor.answers.whatif.WhatIf`).
        cap_bytes / cap_fraction: a memory cap for the what-ifs (bytes, or a fraction of the
            device's memory); default the cap the snapshot records, or the one its recorded
            ``per_process_memory_fraction`` sets, if any; for a snapshot that records none and
            ran out of memory, the cap is inferred from its out-of-memory entry
            (:func:`experiments.doctor.answers.oom.infer_cap`). A cap below what the recording
            reserved is not the recording's own: the recording is replayed without it.
        total_memory: the device's memory in bytes (no snapshot records it): used by
            ``cap_fraction``, by ``per_process_memory_fraction`` and by the expandable range
            size; default the snapshot's, else the lab H200's (the report says which).
        suggest: also replay the grid of :mod:`experiments.doctor.answers.suggest` and rank it.
        explain_oom: for a trace with an out-of-memory error, explain the first one (which
            runs the grid too, to say which settings would have fitted).
        workers: processes for the what-ifs and the grid (default: the cores, on Linux, for
            long traces; 1 runs them here).
        series: keep allocated and reserved bytes after every request of the replay and of
            each what-if (the figure's lines; the peaks are kept either way, and no figure of
            the report changes).
        progress: called with each :class:`~experiments.doctor.answers.progress.Step` as it
            starts and ends (the finished ones with their result: the trace, the replay, each
            what-if, the report without the suggestion, each setting of the grid, the OOM
            explanation, the finished report); see :mod:`experiments.doctor.answers.progress`.
            An exception it raises stops the doctor and comes out of this call.
        show: in a notebook, display the report and the figure.
        limits: what the loader accepts (:class:`experiments.doctor.reading.loader.Limits`).

    Raises:
        InputError (a ValueError): not a readable snapshot (SnapshotError), an impossible
            trace, bad settings or cap (:func:`check_options`); the message is one line naming
            what is wrong. Any other exception is a bug in the doctor.
    """
    check_options(cap_bytes=cap_bytes, cap_fraction=cap_fraction, device=device, workers=workers,
                  total_memory=total_memory)
    if isinstance(what_if, str):
        what_if = [what_if]
    parsed = [WhatIf.parse(s) for s in what_if]
    tell = Progress(progress)
    t = tell.start("read")
    trace = read(snapshot, device=device, limits=limits)
    tell.done("read", trace, since=t)
    warnings: list[str] = []
    if total_memory is not None:
        total, total_source = total_memory, "given"
    elif trace.total_memory:
        total, total_source = trace.total_memory, "snapshot"
    else:
        total, total_source = H200_TOTAL_MEMORY, "assumed"
    for name in unmodelled_options(trace.settings):
        warnings.append(f"recorded setting {name}: " + (
            "does not change where device blocks go; not modelled" if name in NOT_PLACEMENT else
            "unknown to the doctor (a newer torch's option, or another build's): replayed without it"))
    fraction = trace.config.memory_fraction
    source = None
    if cap_bytes is not None:
        cap, source = cap_bytes, "given"
    elif cap_fraction:
        cap, source = int(cap_fraction * total), "fraction"
    elif trace.cap_bytes is not None:
        cap, source = trace.cap_bytes, "snapshot"
    elif fraction is not None:
        cap, source = int(fraction * total), "settings"
    else:
        cap = infer_cap(trace, total) if first_oom(trace) is not None else None
        source = "inferred" if cap is not None else None
    if total_source == "assumed":
        needs = [why for why, used in (
            ("--cap-fraction", cap_fraction is not None),
            (f"per_process_memory_fraction:{fraction or 0:g} in the recorded settings", fraction is not None),
            ("the expandable-segment range size", trace.config.expandable_segments
             or any(w.config.expandable_segments for w in parsed))) if used]
        if needs:
            warnings.append(f"the device memory is not known (no snapshot records it): assumed the lab H200's "
                            f"{format_bytes(total)} for {', '.join(needs)}; give --total-memory BYTES "
                            "(torch.cuda.get_device_properties(0).total_memory)")
    replay_cap = trace.cap_bytes if trace.cap_bytes is not None else cap
    t = tell.start("replay")
    base = replay(trace, cap_bytes=replay_cap, total_memory=total, series=series)
    if source == "inferred" and base.first_mismatch and base.first_mismatch["event_index"] == first_oom(trace):
        # the device was not what ran out (a per-process fraction was): the cap is unknown
        cap = replay_cap = None
        source = None
        base.first_mismatch["reason"] = ("the GPU ran out of memory here, under a cap the snapshot does not record "
                                         "(set_per_process_memory_fraction?): pass --cap BYTES or --cap-fraction F")
    elif source in ("given", "fraction") and trace.cap_bytes is None and not base.matches_trace:
        # the cap asked about is below what the recording needed: not the recording's own cap
        free = replay(trace, total_memory=total, series=series)
        if free.matches_trace or free.events_replayed > base.events_replayed:
            warnings.append(f"the cap asked about ({format_bytes(cap)}) is below what the recording reserved "
                            f"({format_bytes(free.peak_reserved_bytes)}): the recording is replayed without it, the "
                            "what-ifs run under it")
            base, replay_cap = free, None
    if trace.skipped_actions and "free_requested" in trace.skipped_actions:
        warnings.append("the trace has no free_requested entries (recorded with _record_memory_history("
                        "skip_actions=['free_requested'])): each free counts where it completed; allocated bytes "
                        "between a record_stream free and its completion are not known")
    if trace.config.garbage_collection_threshold and replay_cap is None:
        gc = trace.config.garbage_collection_threshold
        where = (f"; the trace puts the cap between {format_bytes(base.gc_cap_range[0])} and "
                 f"{format_bytes(base.gc_cap_range[1])}" if base.gc_cap_range and
                 base.gc_cap_range[0] <= base.gc_cap_range[1] else "")
        warnings.append(f"garbage_collection_threshold:{gc:g} acts only under a memory cap, which the snapshot does "
                        f"not record: the collector's releases are taken from the trace{where}; pass --cap BYTES")
    tell.done("replay", base, since=t)
    runs = run_many(base, parsed, cap_bytes=cap, total_memory=total, workers=workers, series=series, progress=tell)
    report = Report(trace, base, runs, parsed, cap, total, source, replay_cap, total_source, warnings)
    tell.done("report", report)
    oom_at = first_oom(trace)
    if suggest or (explain_oom and oom_at is not None):
        report.suggestion = _suggest(base, trace.settings, cap_bytes=cap, total_memory=total, workers=workers,
                                     replay_cap=replay_cap, progress=tell)
    if explain_oom and oom_at is not None:
        grid = dict(report.suggestion["runs"]) if report.suggestion else {}
        grid.update({r.settings: r for r in runs})
        t = tell.start("oom")
        report.oom = explain(trace, base, cap_bytes=replay_cap, total_memory=total, grid=grid)
        tell.done("oom", report.oom, since=t)
    if not suggest:
        report.suggestion = None
    tell.done("done", report)
    if show:
        from IPython.display import display

        display(report)
    return report


@dataclasses.dataclass
class Report:
    """What :func:`doctor` found. ``to_json()`` is the CLI's ``--json`` object (fields:
    :data:`JSON_FIELDS`); ``text()`` the report; in a notebook it shows itself with its figure.

    Attributes:
        trace, replay, what_ifs, what_if_settings: the trace, its exact replay, the what-if
            runs and their parsed settings (:class:`~experiments.doctor.answers.whatif.WhatIf`).
        cap_bytes: the cap the what-ifs ran under; cap_source: where it came from.
        total_memory: the device's memory in bytes.
        oom: the out-of-memory explanation (:func:`experiments.doctor.answers.oom.explain`) or None.
        suggestion: the ranked grid (:func:`experiments.doctor.answers.suggest.suggest`) or None.
    """

    trace: Trace
    replay: Run
    what_ifs: list[Run]
    what_if_settings: list[WhatIf]
    cap_bytes: int | None
    total_memory: int
    cap_source: str | None = None
    replay_cap: int | None = None
    total_source: str = "assumed"
    warnings: list[str] = dataclasses.field(default_factory=list)
    oom: dict[str, Any] | None = None
    suggestion: dict[str, Any] | None = None
    _layouts: dict[int, list[dict[str, Any]]] = dataclasses.field(default_factory=dict, repr=False)
    _series: dict[int, Run] = dataclasses.field(default_factory=dict, repr=False)

    def peak_layout(self, run: Run) -> list[dict[str, Any]]:
        """The segments at ``run``'s peak reserved (computed on first use: a second pass up
        to the peak; for the recorded run, the exact replay with the GPU's addresses)."""
        key = id(run)
        if key not in self._layouts:
            t = self.trace
            if run is self.replay and run.matches_trace:
                segs = replay(t, cap_bytes=self.replay_cap, total_memory=self.total_memory,
                              stop_at=run.peak_event + 1, series=False, rule=run.rule).final_segments
            else:
                if run is self.replay:
                    wi, cap = WhatIf(t.settings, t.config), self.replay_cap
                else:
                    wi, cap = self.what_if_settings[self.what_ifs.index(run)], self.cap_bytes
                _, eng = _what_if(self.replay, wi, cap_bytes=cap, total_memory=self.total_memory,
                                  stop_at=run.peak_index + 1, series=False)
                segs = eng.segments()
            self._layouts[key] = segs
        return self._layouts[key]

    def series(self, run: Run) -> Run:
        """``run`` with its per-request series (allocated and reserved bytes after each
        request), run again if it was computed without (for the figure)."""
        if len(run.reserved) or not len(self.replay.requests):
            return run
        key = id(run)
        if key not in self._series:
            if run is self.replay:
                self._series[key] = replay(self.trace, cap_bytes=self.replay_cap, total_memory=self.total_memory,
                                           rule=run.rule)
            else:
                wi = self.what_if_settings[self.what_ifs.index(run)]
                self._series[key] = _what_if(self.replay, wi, cap_bytes=self.cap_bytes,
                                             total_memory=self.total_memory)[0]
        return self._series[key]

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` object: see :data:`JSON_FIELDS`."""
        sug = None
        if self.suggestion is not None:
            sug = {k: v for k, v in self.suggestion.items() if k != "runs"}
        r = self.replay
        return {"format": FORMAT, "trace_events": len(self.trace.events), "settings": self.trace.settings,
                "device_total_bytes": self.total_memory, "device_total_source": self.total_source,
                "cap_bytes": self.cap_bytes, "cap_source": self.cap_source,
                "allocator_rule": {"version": r.rule, "tried": list(r.rules_tried), "ties": r.rule_ties,
                                   "note": RULE_NOTES[r.rule], "layout": self.trace.layout},
                "warnings": list(self.warnings),
                "replay": self.replay.summary(),
                "what_if": [w.summary() for w in self.what_ifs],
                "oom": self.oom, "suggestion": sug}

    def rows(self) -> list[dict[str, Any]]:
        """One row per setting (recorded first): the figures and the fragmentation at the peak."""
        out = []
        for label, run in [("recorded: " + (self.trace.settings or "defaults"), self.replay)] + \
                [(w.settings or "defaults", w) for w in self.what_ifs]:
            stats = _layout_stats(self.peak_layout(run))
            out.append({"label": label, **run.summary(), **{f"peak_{k}": v for k, v in stats.items()}})
        return out

    def table(self, notes: bool = True) -> Table:
        """The settings side by side: peak and final reserved, peak allocated, fragmentation at the
        peak and OOMs, the recorded setting first (an HTML table in a notebook). A what-if that
        is not exact shows its range ("between X and Y"); the caption says why (``notes``)."""
        rows = self.rows()
        notes = _uncertain_lines(rows, "label") if notes else []
        return Table(["setting", "peak reserved", "peak allocated", "final reserved", "frag@peak", "OOMs"],
                     [[x["label"], _between(x, "peak_reserved_bytes"), format_bytes(x["peak_allocated_bytes"]),
                       _between(x, "final_reserved_bytes"), f"{x['peak_fragmentation']:.2f}", _ooms(x)]
                      for x in rows], "; ".join(notes), right=[False, True, True, True, True, True])

    def suggestion_table(self, top: int = 10, notes: bool = True) -> Table | None:
        """The ranked grid of ``--suggest`` (best first), or None without one."""
        if self.suggestion is None:
            return None
        rec = self.suggestion["recorded"]
        shown = self.suggestion["rows"][:top]
        rows = [[(r["settings"] or "defaults") + (" (recorded)" if r["settings"] == rec["settings"] else ""),
                 _between(r, "peak_reserved_bytes"), _between(r, "final_reserved_bytes"), _ooms(r),
                 _signed_range(r)] for r in shown]
        notes = _uncertain_lines(shown) if notes else []
        caption = f"{len(self.suggestion['rows'])} settings replayed, best first (worst end of a range first)"
        return Table(["setting", "peak reserved", "final reserved", "OOMs", "peak vs yours"], rows,
                     caption + ("; " + "; ".join(notes) if notes else ""),
                     right=[False, True, True, True, True])

    def text(self) -> str:
        """The report: :meth:`summary`, the OOM explanation, the settings side by side, and the
        suggestion when asked for."""
        parts = [self.summary()]
        if self.oom is not None:
            parts.append(self.oom_text())
        if self.what_ifs:
            parts += ["the same requests under each setting:"] + \
                ["  " + line for line in str(self.table(notes=False)).splitlines()] + \
                ["  " + line for line in _uncertain_lines(self.rows(), "label")] + \
                ["  " + line for line in self.stopped_lines()]
        if self.suggestion is not None:
            parts.append(self.suggestion_text())
        return "\n".join(parts)

    def stopped_lines(self) -> list[str]:
        """One line per what-if in which a request the recording served runs out of memory: where
        a program that does not catch the error stops, and how much of the trace came before."""
        n = len(self.replay.requests) or 1
        out = []
        for w in self.what_ifs:
            if not w.finished:
                k = w.stopped_at_request or 0
                out.append(f"{w.settings or 'defaults'}: runs out of memory at request {k:,} of {n:,} "
                           f"({100 * k / n:.0f}% of the trace), where the recording did not; a program that does not "
                           f"catch the error stops there ({w.new_ooms} such error{'s' if w.new_ooms != 1 else ''} "
                           "counted if it goes on); not suggested")
        return out

    def suggestion_text(self) -> str:
        """The ranked grid and the line to use."""
        s = self.suggestion or {}
        lines = ["suggestion:"] + ["  " + line for line in str(self.suggestion_table(notes=False)).splitlines()]
        if not s.get("ooms_compared", True):
            lines.append("  the recorded run ran out of memory under a cap the doctor does not know (pass --cap BYTES): "
                         "the settings above ran without one, so only their peaks are compared")
        lines += ["  " + line for line in _uncertain_lines(s.get("rows", [])[:10])]
        best, rec = s.get("best"), s.get("recorded", {})
        if best is None:
            lines.append("  no setting of the grid beats the one you ran with (" + (rec.get("settings") or "defaults")
                         + "): keep it")
        else:
            why = (f"{_ooms(best)} out-of-memory errors instead of {rec['oom_events']}"
                   if best["oom_events"] < rec["oom_events"] and s.get("ooms_compared", True) else
                   f"peak reserved {_between(best, 'peak_reserved_bytes')} instead of "
                   f"{format_bytes(rec['peak_reserved_bytes'])}")
            lines.append(f"  use: {s['alloc_conf']}   ({why})")
        return "\n".join(lines)

    def oom_text(self) -> str:
        """The out-of-memory explanation as sentences."""
        o = self.oom or {}
        cap = o.get("cap_bytes")
        lines = [f"out of memory at trace entry {o['event_index']}: a request of {format_bytes(o['request_bytes'])} "
                 f"(rounded to {format_bytes(o['rounded_bytes'])}; a new segment would be "
                 f"{format_bytes(o['segment_bytes'])}) on stream {o['stream']} failed"
                 + (f" under a cap of {format_bytes(cap)}" + (" (inferred)" if self.cap_source == "inferred" else "")
                    if cap else "")]
        if not o.get("followed"):
            lines.append("  the exact replay stops before this point (see above), so the doctor cannot say what held "
                         "the memory then")
            return "\n".join(lines)
        lines.append(f"  after the out-of-memory path released what it could, {format_bytes(o['reserved_bytes'])} was "
                     f"reserved and {format_bytes(o['allocated_bytes'])} allocated: "
                     f"{format_bytes(o['reserved_unallocated_bytes'])} reserved but unusable for it (the largest free "
                     f"block {format_bytes(o['largest_free_bytes'])})")
        if o.get("pinned"):
            lines.append("  segments whose free bytes live blocks pin (they cannot be released):")
            for p in o["pinned"]:
                held = []
                for b in p["live_blocks"]:
                    f = your_frame(b["frames"])
                    fw = your_frame(b.get("forward_frames") or [])
                    held.append(format_bytes(b["size"]) + (f" ({f[0].rsplit('/', 1)[-1]}:{f[1]} {f[2]})" if f else "")
                                + (f" (backward of {fw[0].rsplit('/', 1)[-1]}:{fw[1]} {fw[2]})" if fw else ""))
                more = p["live_block_count"] - len(p["live_blocks"])
                lines.append(f"    {format_bytes(p['segment_bytes'])} {p['pool']} segment at {p['address']:#x}: "
                             f"{format_bytes(p['free_bytes'])} free, held by {', '.join(held)}"
                             + (f" and {more} more" if more > 0 else ""))
        if cap and o["allocated_bytes"] + o["segment_bytes"] > cap:
            lines.append(f"  even with no fragmentation it could not fit: {format_bytes(o['allocated_bytes'])} allocated "
                         f"+ {format_bytes(o['segment_bytes'])} > the cap; only freeing tensors (or a larger cap) helps")
        if o.get("fits_under") or o.get("fails_under") or o.get("uncertain_under"):
            fits = [s or "defaults" for s in o["fits_under"]]
            lines.append("  this request would have fitted under: " + (", ".join(fits) if fits else
                                                                       "none of the settings tried"))
            if o.get("uncertain_under"):
                lines.append("  the doctor cannot say for sure under: "
                             + ", ".join(s or "defaults" for s in o["uncertain_under"]) + " (not exact)")
        return "\n".join(lines)

    def summary(self) -> str:
        """The replay's verdict and what is reserved but unusable at the peak (which live blocks
        pin which segments)."""
        t, r = self.trace, self.replay
        cap = ""
        if self.cap_bytes:
            cap = f"; cap {format_bytes(self.cap_bytes)}" + (f" ({self.cap_source})" if self.cap_source else "")
        lines = [f"snapshot: {len(t.events):,} trace events; settings: {t.settings or 'defaults'}" + cap]
        lines.append(f"device memory: {format_bytes(self.total_memory)} ({self.total_source})")
        lines += ["note: " + w for w in self.warnings]
        lines.append(f"allocator rule: torch {r.rule}{'+' if r.rule == '2.13' else ''} best-fit order between equal "
                     f"free blocks ({RULE_NOTES[r.rule]}; {r.rule_ties} tie{'s' if r.rule_ties != 1 else ''} decided"
                     + (f"; also tried {', '.join(x for x in r.rules_tried if x != r.rule)}"
                        if len(r.rules_tried) > 1 else "") + ")")
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

        out = "<pre>" + html.escape(self.summary()) + "</pre>"
        if self.oom is not None:
            out += "<pre>" + html.escape(self.oom_text()) + "</pre>"
        out += self.table()._repr_html_()
        if self.suggestion is not None:
            out += self.suggestion_table()._repr_html_()  # type: ignore[union-attr]
        return out

    def _ipython_display_(self) -> None:
        from IPython.display import HTML, display

        display(HTML(self._repr_html_()))
        display(self.figure())


def _signed(n: int) -> str:
    return ("-" if n < 0 else "+" if n > 0 else "") + format_bytes(abs(n))


def _signed_range(r: Mapping[str, Any]) -> str:
    rng = r.get("saved_range_bytes")
    if r.get("exact") is False and rng and rng[0] != rng[1]:
        return f"between {_signed(-rng[1])} and {_signed(-rng[0])}"
    return _signed(-r["saved_bytes"])


__all__ = ["FORMAT", "JSON_FIELDS", "Report", "check_options", "doctor"]
