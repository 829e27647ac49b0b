"""Which pool each request went to: the choices a trace leaves open, and the search over them.

A trace does not say which pool (the default one, a ``torch.cuda.MemPool``, a CUDA graph's)
a request was routed to. A request that lands in a known segment belongs to that segment's
pool, and a segment alive at the end carries its pool id; but a request that made a new
segment could have come from any pool whose cached blocks could not serve it. The replay
(:func:`experiments.doctor.replay.replay`) chooses the stream's last pool first; when the trace
later contradicts a choice (a block elsewhere, a release that differs, the final layout), it
goes back to the choice that placed a segment the contradiction is about (else the latest
open one), takes the next pool there, makes the later choices again and replays: depth first,
at most ``MAX_REPLAYS`` replays and ``MAX_SEARCH_S`` seconds.

Where several attributions agree with the whole trace (a MemPool used for a phase, then
deleted, can look like the default pool in every event), :func:`alternatives` finds others,
one choice at a time; a what-if runs them too and bounds its answer by them.
"""
from __future__ import annotations

import time
from typing import Any, Callable

from .engine import DEFAULT_POOL
from .run import _addresses
from .trace import SEG_MAP

NEW = (-1, -1)           # a choice of "a private pool the trace has not shown yet"
MAX_REPLAYS = 400
MAX_SEARCH_S = 30.0
MAX_ALTERNATIVES = 12


def search(once: Callable[[dict], Any]) -> tuple[Any, Any]:
    """Replay with choices forced, backtracking, until the trace agrees or the budget is spent.

    Args:
        once: replays with {event index: pool} forced; returns the replayer, whose ``result``
            is the Run, ``decisions`` the choices it made as (event index, candidate pools,
            index taken) and ``made`` the segments they placed as (base, end, decision).

    Returns:
        (the Run that agreed, or else the one that got furthest; the last replayer).
    """
    forced: dict[int, tuple[int, int]] = {}
    best = None
    t0 = time.perf_counter()
    for _ in range(MAX_REPLAYS):
        r = once(forced)
        run = r.result
        if best is None or run.matches_trace or run.events_replayed > best.events_replayed:
            best = run
        if run.matches_trace is not False or time.perf_counter() - t0 > MAX_SEARCH_S:
            break
        where = run.first_mismatch["event_index"]
        open_ = [k for k, (i, cands, c) in enumerate(r.decisions) if i <= where and c + 1 < len(cands)]
        if not open_:
            break
        addrs = _addresses(run.first_mismatch)
        suspects = {k for lo, hi, k in r.made if any(lo <= a < hi for a in addrs)} & set(open_)
        # the earliest suspect: the choices after it are made again, following it (a stream keeps its pool)
        k = min(suspects) if suspects else open_[-1]
        forced = {i: cands[c] for i, cands, c in r.decisions[:k]}
        i, cands, c = r.decisions[k]
        forced[i] = cands[c + 1]
    return best, r


def alternatives(once: Callable[[dict], Any], decisions: list) -> list[list[tuple]]:
    """Request lists of other pool attributions the whole trace agrees with: each open choice
    of an agreeing replay taken the other way(s), one at a time, the later ones made again
    (at most ``MAX_ALTERNATIVES``, within ``MAX_SEARCH_S`` seconds)."""
    out: list[list[tuple]] = []
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


class PoolChoices:
    """The replay's side of the choices: which pools a request that made a new segment could
    have come from (the replayer, :class:`experiments.doctor.replay._Replayer`, has ``engine``,
    ``requests``, ``at`` (the trace event being replayed), ``private``, ``forced``,
    ``decisions``, ``inferred`` and its segment table)."""

    def _choose_pool(self, i: int, size: int, stream: int, small: bool, code: int) -> tuple[int, int]:
        """The pool of a request that made a new segment or range the final state does not name.
        Candidates are the pools that could not serve it from their cached blocks (one that
        could would have), the stream's last pool first; replay() backtracks over them."""
        first = self._stream_pool(stream)
        cands = []
        freeable = self.engine.freeable     # no request goes to a pool that nothing holds any more
        for p in [first, DEFAULT_POOL] + self.private[::-1] + [NEW]:
            if p not in cands and p not in freeable and (p == NEW or not self._could_serve(p, size, stream, small,
                                                                                            code)):
                cands.append(p)
        choice = self.forced.get(i)
        k = cands.index(choice) if choice in cands else 0
        if len(cands) > 1:
            self.decisions.append((i, cands, k))
        pool = cands[k]
        if pool == NEW:
            self.inferred += 1
            pool = (-1, self.inferred)
        return pool

    def _pool_guess(self, addr: int, stream: int, creates: list[int]) -> tuple[int, int]:
        base = self._containing(addr)
        if base is not None and not creates:
            return self.seg_pool[base]
        return self._stream_pool(stream)

    def _stream_pool(self, stream: int) -> tuple[int, int]:
        # the pool of the stream's last request (a stream keeps its pool while a MemPool or a
        # capture routes it); looked up only where a choice is made, off the fast path
        return self.requests.last_pool(stream, self.at)

    def _could_serve(self, pool: tuple[int, int], size: int, stream: int, small: bool, code: int) -> bool:
        eng = self.engine
        rounded = eng.round(size)
        fl = eng._free.get((pool, small, stream))
        if fl is not None and eng.get_free_block(fl, rounded) is not None:
            return True
        return code == SEG_MAP and bool(eng._ranges.get((pool, small, stream)))


__all__ = ["NEW", "PoolChoices", "alternatives", "search"]
