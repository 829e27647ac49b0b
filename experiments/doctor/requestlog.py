"""The requests an exact replay recovers from a trace, kept compactly for the what-ifs to run
again (:class:`Requests`)."""
from __future__ import annotations

from array import array
from typing import Any

from .engine import DEFAULT_POOL
from .loader import ImpossibleTraceError

# request kinds
R_ALLOC, R_FREE_REQ, R_FREE_DONE, R_EMPTY, R_RETRY = range(5)


class Requests:
    """The requests a replay recovered, for what-ifs to run again: one int64 each,
    ``kind | pool << 3 | index << 16`` (8 bytes a request). ``index`` is, for R_ALLOC, the
    trace event of the allocation (also its key: the event gives size and stream); for
    R_FREE_REQ / R_FREE_DONE, the key of the block (an allocation's event, or ``len(events)
    + j`` for the j-th block that existed before the recording); for R_EMPTY, an index into
    ``empties`` (the pools each inferred empty_cache released); for R_RETRY, the trace's
    'oom' event. ``pools`` lists the pool ids. Iterating yields tuples: (R_ALLOC, key, size,
    stream, pool), (R_FREE_REQ, key), (R_FREE_DONE, key), (R_EMPTY, pools), (R_RETRY, size,
    stream, pool).
    """

    __slots__ = ("data", "events", "pools", "_pool_index", "empties")

    def __init__(self, events: Any = None) -> None:
        self.data = array("q")
        self.events = events
        self.pools: list[tuple[int, int]] = [DEFAULT_POOL]
        self._pool_index = {DEFAULT_POOL: 0}
        self.empties: list[tuple] = []

    def pool_index(self, pool: tuple[int, int]) -> int:
        i = self._pool_index.get(pool)
        if i is None:
            if len(self.pools) >= 8192:
                raise ImpossibleTraceError("the trace uses more than 8,192 private pools")
            i = self._pool_index[pool] = len(self.pools)
            self.pools.append(pool)
        return i

    def add(self, kind: int, index: int, pool: tuple[int, int] = DEFAULT_POOL) -> None:
        self.data.append(kind | self.pool_index(pool) << 3 | index << 16)

    def add_empty(self, pools: tuple) -> None:
        self.empties.append(pools)
        self.data.append(R_EMPTY | (len(self.empties) - 1) << 16)

    def __len__(self) -> int:
        return len(self.data)

    def _tuple(self, x: int) -> tuple:
        kind, i = x & 7, x >> 16
        ev = self.events
        if kind == R_ALLOC:
            return (kind, i, ev.sizes[i], ev.streams[i], self.pools[(x >> 3) & 8191])
        if kind == R_EMPTY:
            return (kind, self.empties[i])
        if kind == R_RETRY:
            return (kind, ev.sizes[i], ev.streams[i], self.pools[(x >> 3) & 8191])
        return (kind, i)

    def __iter__(self) -> Any:
        return map(self._tuple, self.data)

    def __getitem__(self, k: int) -> tuple:
        return self._tuple(self.data[k])


__all__ = ["R_ALLOC", "R_EMPTY", "R_FREE_DONE", "R_FREE_REQ", "R_RETRY", "Requests"]
