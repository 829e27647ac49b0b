"""The outcome of a replay or a what-if: :class:`Run`.

A replay (:func:`experiments.doctor.replaying.replay.replay`) fills the fields it can check
against the trace (``matches_trace``, ``first_mismatch``) and those the what-ifs reuse
(``requests``, ``initial``, ``segment_log``, ``alternatives``, ``open_keys``, ``restores``); a
what-if (:func:`experiments.doctor.answers.whatif.what_if`) fills its certainty (``exact``,
``uncertain``, ``bound_bytes`` and the ranges) from the figures its runs found
(``timing_bytes``, ``open_bytes``, ``retries_fit``).
"""
from __future__ import annotations

import dataclasses
import struct
from array import array
from typing import Any


def int64s(values: list[int]) -> array:
    """``values`` as an int64 array, packed at once. The replay and the what-ifs collect a value
    per request in a list and pack it at each step: an array's append parses its argument, which
    made it their costliest step in the browser's Python (three times a list's append and the
    packing together)."""
    out = array("q")
    out.frombytes(struct.pack(f"{len(values)}q", *values))
    return out


@dataclasses.dataclass
class Run:
    """The outcome of one replay or what-if.

    Attributes:
        settings: the settings string it ran under.
        matches_trace: every checked event agreed (replay only; None for a what-if).
        first_mismatch: None, or a dict with event_index, action, reason, expected, got.
        events_replayed: trace events (replay) or requests (what-if) processed.
        allocated, reserved: bytes after each request (arrays of equal length; empty when
            run with ``series=False``: the peaks are kept either way).
        final_* / peak_*: bytes; peak_index: the request (index into the run's requests)
            after which reserved bytes peaked.
        oom_events: requests that did not fit; oom_requests: their (index, bytes).
        requests: the request list (replay only) that what-ifs reuse.
        initial: the blocks rebuilt for a late-started recording, (key, requested, stream, pool).
        marks: (trace index, allocated, reserved) at each 'snapshot' entry (replay only).
        mark_points: for each of ``marks``, the length of the series there: the index of the
            first request after the mark (replay with ``series`` only), where a figure puts it.
        peak_event: the trace event after which reserved bytes peaked (replay only).
        segment_log: (action, address, size) of every segment the GPU allocated or freed and of
            every expandable range it reserved, in order (replay only; a what-if takes the
            GPU's addresses while its own calls to the driver are the same).
        pool_choices: new segments whose pool the trace left open (replay only).
        alternatives: the request lists of the other pool attributions the whole trace
            agrees with (replay only; found one choice at a time, see replay()).
        open_keys: the requests placed in segments whose pool was such a choice (replay only).
        live_keys: {block address: trace event of its allocation} of the blocks allocated
            when a replay stopped early (``stop_at``; blocks from before the recording left out).
        restores: blocks a private pool's checkpoint put in place (CUDA-graph trees).
        exact, bound_bytes, uncertain, *_range: a what-if's certainty (what_if()): exact when
            nothing the snapshot leaves open can change its answer; else the reasons, the
            range of peak / final reserved bytes and OOM counts over the alternatives explored,
            and bound_bytes, the most the answer may be off by.
        allocated_upper_bound: the trace has no free_requested entries (recorded with
            ``skip_actions=["free_requested"]``): a block counts as allocated until its free
            completed, so the allocated figures are active bytes, at least the allocated ones.
        timing_bytes: what-if only: the most bytes that blocks waiting on ``record_stream``
            events held when a request came (what their completion timing may move).
        open_bytes: what-if only: the most bytes the requests whose pool the trace leaves open
            (the replay's ``open_keys``) held at once.
        retries_fit: what-if only: requests that failed on the GPU and fit here.
    """

    settings: str
    matches_trace: bool | None = None
    first_mismatch: dict[str, Any] | None = None
    events_replayed: int = 0
    allocated: array = dataclasses.field(default_factory=lambda: array("q"))
    reserved: array = dataclasses.field(default_factory=lambda: array("q"))
    final_reserved_bytes: int = 0
    final_allocated_bytes: int = 0
    peak_reserved_bytes: int = 0
    peak_allocated_bytes: int = 0
    peak_index: int = 0
    oom_events: int = 0
    oom_requests: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    final_segments: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    requests: list[tuple] = dataclasses.field(default_factory=list)
    initial: list[tuple[int, int, int, tuple[int, int]]] = dataclasses.field(default_factory=list)
    marks: list[tuple[int, int, int]] = dataclasses.field(default_factory=list)
    mark_points: list[int] = dataclasses.field(default_factory=list)
    peak_event: int = 0
    segment_log: list[tuple[str, int, int]] = dataclasses.field(default_factory=list)
    pool_choices: int = 0
    alternatives: list[list[tuple]] = dataclasses.field(default_factory=list)
    open_keys: frozenset = frozenset()
    live_keys: dict[int, int] = dataclasses.field(default_factory=dict)
    restores: int = 0
    initial_extended: int = 0          # blocks from before the recording found longer than their request
    # the trace records no free_requested (skip_actions): a freed block counts as allocated until
    # its free completed, so the allocated figures are the GPU's active bytes, an upper bound
    allocated_upper_bound: bool = False
    start_reserved: int = 0            # reserved and allocated bytes the recording started with
    start_allocated: int = 0
    finished: bool = True              # a what-if: no request failed that the recording served
    stopped_at_request: int | None = None
    new_ooms: int = 0
    gc_cap_range: tuple[int, int] | None = None   # a GC threshold under an unknown cap: where the cap lies
    rule: str = "2.11"
    rules_tried: tuple[str, ...] = ()
    rule_ties: int = 0
    exact: bool | None = None
    bound_bytes: int = 0
    uncertain: list[str] = dataclasses.field(default_factory=list)
    peak_reserved_range_bytes: tuple[int, int] | None = None
    final_reserved_range_bytes: tuple[int, int] | None = None
    oom_events_range: tuple[int, int] | None = None
    timing_bytes: int = 0
    open_bytes: int = 0
    retries_fit: int = 0

    def summary(self) -> dict[str, Any]:
        """The JSON fields of the doctor's report for this run."""
        out = {"settings": self.settings}
        if self.matches_trace is not None:
            out["matches_trace"] = self.matches_trace
            out["first_mismatch"] = self.first_mismatch
        out.update(final_reserved_bytes=self.final_reserved_bytes, final_allocated_bytes=self.final_allocated_bytes,
                   peak_reserved_bytes=self.peak_reserved_bytes, peak_allocated_bytes=self.peak_allocated_bytes,
                   oom_events=self.oom_events)
        if self.allocated_upper_bound:
            out["allocated_upper_bound"] = True
        if self.exact is not None:
            out.update(exact=self.exact, bound_bytes=self.bound_bytes, uncertain=list(self.uncertain),
                       peak_reserved_range_bytes=list(self.peak_reserved_range_bytes or ()),
                       final_reserved_range_bytes=list(self.final_reserved_range_bytes or ()),
                       oom_events_range=list(self.oom_events_range or ()),
                       finished=self.finished, stopped_at_request=self.stopped_at_request)
        return out

    def pack(self, allocated: list[int], reserved: list[int]) -> None:
        """Move the values a loop collected since its last call into the series (the lists are
        emptied): at each of its steps, so that they never hold more than a step's values."""
        if allocated:
            self.allocated.extend(int64s(allocated))
            allocated.clear()
        if reserved:
            self.reserved.extend(int64s(reserved))
            reserved.clear()

    def finish(self, engine: Any) -> None:
        """Take the final figures and layout from ``engine`` (a
        :class:`~experiments.doctor.model.engine.Engine`) after the run's last request (the
        peaks are the loops' own: tracked as they happen, with or without the series)."""
        self.final_allocated_bytes = engine.allocated_bytes
        self.final_reserved_bytes = engine.reserved_bytes
        self.oom_events = len(self.oom_requests)
        self.final_segments = engine.segments()


__all__ = ["Run", "int64s"]
