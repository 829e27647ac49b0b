"""Which pool each request went to: the choices a trace leaves open, and the search over them.

A trace does not say which pool (the default one, a ``torch.cuda.MemPool``, a CUDA graph's)
a request was routed to. A request that lands in a known segment belongs to that segment's
pool, and a segment alive at the end carries its pool id; but a request that made a new
segment could have come from any pool whose cached blocks could not serve it. The replay
(:func:`experiments.doctor.replaying.replay.replay`) asks its :class:`PoolAttribution` for
such a request's pool: the stream's last pool first. When the trace later contradicts a choice
(a block elsewhere, a release that differs, the final layout), :func:`search` goes back to the
choice that placed a segment the contradiction is about (else the latest open one), takes the
next pool there, makes the later choices again and replays: depth first, at most
``MAX_REPLAYS`` replays and ``MAX_SEARCH_S`` seconds.

Where several attributions agree with the whole trace (a MemPool used for a phase, then
deleted, can look like the default pool in every event), :func:`alternatives` finds others,
one choice at a time; a what-if runs them too and bounds its answer by them.
"""
from __future__ import annotations

import time
from typing import Any, Callable

from ..model.rules import DEFAULT_POOL
from ..reading.rows import ALLOC

NEW = (-1, -1)           # a choice of "a private pool the trace has not shown yet"
MAX_REPLAYS = 400
MAX_SEARCH_S = 30.0
MAX_ALTERNATIVES = 12


class PoolAttribution:
    """The pools of one replay's requests where the trace leaves them open.

    Args:
        engine: the replay's :class:`~experiments.doctor.model.engine.Engine` (which pools
            could have served a request from their cached blocks; which are freeable).
        requests: the replay's :class:`~experiments.doctor.replaying.requests.Requests` so far
            (each stream's last pool).
        forced: {trace event index: pool} of choices to make otherwise (:func:`search`).

    Attributes:
        private: the private pools the trace has shown, oldest first (:meth:`saw`).
        decisions: the choices made, as (trace event index, candidate pools, index taken),
            for those with more than one candidate.
        made: the segments those choices placed, as (base, end, decision index).
        inferred: private pools taken for a new one the trace had not shown yet.
    """

    def __init__(self, engine: Any, requests: Any, forced: dict[int, tuple[int, int]] | None = None) -> None:
        self.engine = engine
        self.requests = requests
        self.forced = forced or {}
        self.private: list[tuple[int, int]] = []
        self.decisions: list[tuple[int, list[tuple[int, int]], int]] = []
        self.made: list[tuple[int, int, int]] = []
        self.inferred = 0

    def saw(self, pool: tuple[int, int]) -> None:
        """The trace shows a segment of ``pool``."""
        if pool != DEFAULT_POOL and pool not in self.private:
            self.private.append(pool)

    def stream_pool(self, stream: int, at: int | None) -> tuple[int, int]:
        """The pool of ``stream``'s last request before trace event ``at`` (a stream keeps its
        pool while a MemPool or a capture routes it); looked up only where a choice is made,
        off the replay's fast path."""
        return self.requests.last_pool(stream, at)

    def choose(self, i: int, size: int, stream: int, maps: bool, region: tuple[int, int]) -> tuple[int, int]:
        """The pool of the request of trace event ``i`` that made a new segment or range
        (``region``: its base and end; ``maps``: it mapped pages) the final state does not name.
        Candidates are the pools that could not serve it from their cached blocks (one that
        could would have), the stream's last pool first; :func:`search` backtracks over them."""
        eng = self.engine
        first = self.stream_pool(stream, i)
        cands = []
        freeable = eng.freeable     # no request goes to a pool that nothing holds any more
        for p in [first, DEFAULT_POOL] + self.private[::-1] + [NEW]:
            if p not in cands and p not in freeable and (p == NEW or not eng.can_serve(size, stream, p, maps=maps)):
                cands.append(p)
        choice = self.forced.get(i)
        k = cands.index(choice) if choice in cands else 0
        if len(cands) > 1:
            self.made.append((region[0], region[1], len(self.decisions)))
            self.decisions.append((i, cands, k))
        pool = cands[k]
        if pool == NEW:
            self.inferred += 1
            pool = (-1, self.inferred)
        return pool

    def open_keys(self, trace: Any, first: int) -> frozenset:
        """The request keys placed in segments whose pool was a choice: the ``k``-th 'alloc' of
        ``trace`` is key ``first + k``."""
        placed = [e[1] for e in trace.events if e[0] == ALLOC]     # keys follow allocation order
        return frozenset(first + n for n, a in enumerate(placed) if any(lo <= a < hi for lo, hi, _ in self.made))


def search(once: Callable[[dict], Any]) -> tuple[Any, Any]:
    """Replay with choices forced, backtracking, until the trace agrees or the budget is spent.

    Args:
        once: replays with {event index: pool} forced; returns the replayer, whose ``result``
            is the Run and ``attribution`` its :class:`PoolAttribution`.

    Returns:
        (the Run that agreed, or else the one that got furthest; the last replayer).
    """
    forced: dict[int, tuple[int, int]] = {}
    best = None
    t0 = time.perf_counter()
    for _ in range(MAX_REPLAYS):
        r = once(forced)
        run, att = r.result, r.attribution
        if best is None or run.matches_trace or run.events_replayed > best.events_replayed:
            best = run
        if run.matches_trace is not False or time.perf_counter() - t0 > MAX_SEARCH_S:
            break
        where = run.first_mismatch["event_index"]
        open_ = [k for k, (i, cands, c) in enumerate(att.decisions) if i <= where and c + 1 < len(cands)]
        if not open_:
            break
        addrs = _addresses(run.first_mismatch)
        suspects = {k for lo, hi, k in att.made if any(lo <= a < hi for a in addrs)} & set(open_)
        # the earliest suspect: the choices after it are made again, following it (a stream keeps its pool)
        k = min(suspects) if suspects else open_[-1]
        forced = {i: cands[c] for i, cands, c in att.decisions[:k]}
        i, cands, c = att.decisions[k]
        forced[i] = cands[c + 1]
    return best, r


def alternatives(once: Callable[[dict], Any], decisions: list) -> list[Any]:
    """Request lists of other pool attributions the whole trace agrees with: each open choice
    of an agreeing replay taken the other way(s), one at a time, the later ones made again
    (at most ``MAX_ALTERNATIVES``, within ``MAX_SEARCH_S`` seconds)."""
    out: list[Any] = []
    t0 = time.perf_counter()
    for k, (i, cands, c) in enumerate(decisions):
        for alt in range(len(cands)):
            if alt == c:
                continue
            if len(out) >= MAX_ALTERNATIVES or time.perf_counter() - t0 > MAX_SEARCH_S:
                return out
            forced = {i2: cands2[c2] for i2, cands2, c2 in decisions[:k]}
            forced[i] = cands[alt]
            run = once(forced).result
            if run.matches_trace:
                out.append(run.requests)
    return out


def _addresses(mismatch: dict[str, Any]) -> set[int]:
    """The addresses a mismatch is about: those in what was expected or got but not in both."""
    def walk(x: Any, out: set) -> set:
        if isinstance(x, bool):
            return out
        if isinstance(x, int):
            out.add(x)
        elif isinstance(x, (list, tuple)):
            if len(x) == 3 and isinstance(x[0], str):
                out.add(x[1])
            else:
                for y in x:
                    walk(y, out)
        return out
    want, got = walk(mismatch.get("expected"), set()), walk(mismatch.get("got"), set())
    return (want ^ got) or (want | got)


__all__ = ["NEW", "PoolAttribution", "alternatives", "search"]
