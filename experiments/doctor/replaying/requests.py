"""The requests a replay recovers from a trace, kept compactly for the what-ifs to run again
(:class:`Requests`, the request log), and the kinds of request.

A replay (:mod:`experiments.doctor.replaying.replay`) recovers from a trace the list of
requests the program made of the allocator; a what-if (:mod:`experiments.doctor.answers.whatif`)
runs the same list again under other settings. A long trace has hundreds of thousands of
requests: as tuples they took about 90 bytes each (40 MiB on the 450k-event trace); here the
common ones take one int64 each, and the rare ones (inferred releases of freeable pools,
requests that failed on the GPU) keep their tuple in a side dict keyed by the request's index.
"""
from __future__ import annotations

from array import array
from itertools import compress
from typing import Any, Iterable, Iterator

from ..errors import ImpossibleTraceError
from ..model.rules import DEFAULT_POOL
from ..reading.rows import ALLOC
from .run import int64s

# Request kinds (small ints, so that the loops stay fast), as tuples: (R_ALLOC, key, bytes,
# stream, pool), (R_FREE_REQ, key), (R_FREE_DONE, key), (R_EMPTY, pool id: the default for
# empty_cache(), a private one for a deleted MemPool), (R_RETRY, bytes, stream, pool: a request
# that failed on the GPU), (R_FREEABLE, pool ids), (R_RESTORE, key, bytes, stream, pool: a block
# a private pool's checkpoint put in place).
R_ALLOC, R_FREE_REQ, R_FREE_DONE, R_EMPTY, R_RETRY, R_FREEABLE, R_RESTORE = range(7)

POOL_SHIFT = 3
POOL_BITS = 20
POOL_MASK = (1 << POOL_BITS) - 1
KEY_SHIFT = POOL_SHIFT + POOL_BITS       # 41 bits of key left: far more than any trace has
POOL_FIELD = POOL_MASK << POOL_SHIFT     # a request's pool bits: none set for the default pool (index 0)
_IS_ALLOC = bytes(int(c == ALLOC) for c in range(256))     # a trace code -> 1 for 'alloc', else 0


class Requests:
    """The requests of a replay, in order; what-ifs run them again.

    Each request is one int64 in ``data``: ``kind | pool << 3 | key << 23``. ``kind`` is one of
    the R_* codes above; ``pool`` an index into ``pools`` (R_ALLOC,
    R_RESTORE, R_EMPTY); ``key`` the block's key (R_ALLOC, R_RESTORE, R_FREE_REQ, R_FREE_DONE).
    R_FREEABLE and R_RETRY keep their tuple in ``extras`` under their index. A block's bytes
    and stream are not stored per request: key ``k`` of a replay is its ``(k - first)``-th
    'alloc' trace event (keys below ``first`` are blocks from before the recording, which are
    only freed), so they are read from the trace's columns when first asked for
    (:meth:`sizes_streams`).

    Iterating, indexing or slicing gives the request tuples:
    (R_ALLOC, key, bytes, stream, pool), (R_FREE_REQ, key), (R_FREE_DONE, key), (R_EMPTY, pool),
    (R_RETRY, bytes, stream, pool), (R_FREEABLE, pools), (R_RESTORE, key, bytes, stream, pool).

    A replay appends to ``tail``, a short list (an append to a list costs a fraction of one to
    an array, which parses its argument: in the browser's Python, the most a replay did per
    request), packed into ``data`` by :meth:`pack`, at each of the replay's steps and whenever
    ``data`` is read.

    Raises ImpossibleTraceError when a trace uses more than 2^20 pools.
    """

    __slots__ = ("_data", "tail", "pools", "_pool_index", "extras", "first", "_events", "_sizes", "_streams")

    def __init__(self, events: Any = None, first: int = 0) -> None:
        self._data = array("q")
        self.tail: list[int] = []
        self.pools: list[tuple[int, int]] = [DEFAULT_POOL]
        self._pool_index = {DEFAULT_POOL: 0}
        self.extras: dict[int, tuple] = {}
        self.first = first
        self._events = events
        self._sizes: Any = None
        self._streams: Any = None

    # -- building
    @property
    def data(self) -> array:
        """Every request, as the int64 array (the tail packed first)."""
        if self.tail:
            self.pack()
        return self._data

    def pack(self) -> "Requests":
        """Move the tail's requests into ``data`` (returns the log)."""
        if self.tail:
            self._data.extend(int64s(self.tail))
            self.tail.clear()
        return self

    def pool_index(self, pool: tuple[int, int]) -> int:
        """The index of ``pool`` in ``pools`` (added if new)."""
        i = self._pool_index.get(pool)
        if i is None:
            if len(self.pools) > POOL_MASK:
                raise ImpossibleTraceError(f"the trace uses more than {POOL_MASK + 1:,} pools")
            i = self._pool_index[pool] = len(self.pools)
            self.pools.append(pool)
        return i

    def add_alloc(self, kind: int, key: int, pool: tuple[int, int]) -> None:
        """An R_ALLOC or R_RESTORE of block ``key`` (its bytes and stream: see the class)."""
        self.tail.append(kind | self.pool_index(pool) << POOL_SHIFT | key << KEY_SHIFT)

    def add_empty(self, pool: tuple[int, int]) -> None:
        self.tail.append(R_EMPTY | self.pool_index(pool) << POOL_SHIFT)

    def add_extra(self, request: tuple) -> None:
        """A rare request (R_FREEABLE, R_RETRY), kept as its tuple."""
        self.extras[len(self)] = request
        self.tail.append(request[0])

    @classmethod
    def from_tuples(cls, requests: Iterable[tuple]) -> "Requests":
        """The log of a list of request tuples (as iterating a log gives them; keys are ints >= 0).
        Raises ValueError naming the request that is not one."""
        out = cls()
        sizes, streams = array("q"), array("q")
        out._sizes, out._streams = sizes, streams
        for k, r in enumerate(requests):
            kind = r[0] if isinstance(r, tuple) and r else None
            if kind in (R_ALLOC, R_RESTORE, R_FREE_REQ, R_FREE_DONE):
                key = r[1]
                if not isinstance(key, int) or not 0 <= key < 1 << 40:
                    raise ValueError(f"request {k}: key {key!r:.40} is not an int in [0, 2^40)")
                if kind in (R_ALLOC, R_RESTORE):
                    if key >= len(sizes):
                        zeros = bytes(8 * (key + 1 - len(sizes)))
                        sizes.frombytes(zeros)
                        streams.frombytes(zeros)
                    sizes[key], streams[key] = r[2], r[3]
                    out.add_alloc(kind, key, r[4])
                else:
                    out.tail.append(kind | key << KEY_SHIFT)
            elif kind == R_EMPTY:
                out.add_empty(r[1])
            elif kind in (R_FREEABLE, R_RETRY):
                out.add_extra(r)
            else:
                raise ValueError(f"request {k}: {r!r:.60} is not a request tuple")
        return out.pack()

    # -- reading
    def sizes_streams(self) -> tuple[Any, Any]:
        """(bytes, stream) of every block key, as two arrays indexed by key."""
        if self._sizes is None:
            ev = self._events
            pad = array("q", bytes(8 * self.first))
            if ev is None:
                self._sizes, self._streams = pad, array("q", pad)
            else:
                # the 'alloc' events' columns, selected in C (the first what-if waits for them)
                is_alloc = ev.codes.tobytes().translate(_IS_ALLOC)
                self._sizes = pad + array("q", compress(ev.sizes, is_alloc))
                self._streams = pad + array("q", compress(ev.streams, is_alloc))
        return self._sizes, self._streams

    def last_pool(self, stream: int, end: int | None = None) -> tuple[int, int]:
        """The pool of the last R_ALLOC / R_RESTORE on ``stream`` (the default pool if none).
        ``end``: for a replay's log, the trace event being replayed (every 'alloc' before it
        has made its request), so that the walk back reads the trace from there."""
        pools, data = self.pools, self.data
        if self._sizes is None and self._events is not None and end is not None:
            # walk back over the requests and the trace's 'alloc' events together
            codes, evstreams, j = self._events.codes, self._events.streams, end
            for x in reversed(data):
                kind = x & 7
                if kind == R_ALLOC or kind == R_RESTORE:
                    j -= 1
                    while codes[j] != ALLOC:
                        j -= 1
                    if evstreams[j] == stream:
                        return pools[(x >> POOL_SHIFT) & POOL_MASK]
            return DEFAULT_POOL
        streams = self.sizes_streams()[1]
        for x in reversed(data):
            kind = x & 7
            if (kind == R_ALLOC or kind == R_RESTORE) and streams[x >> KEY_SHIFT] == stream:
                return pools[(x >> POOL_SHIFT) & POOL_MASK]
        return DEFAULT_POOL

    def without(self, kind: int) -> "Requests":
        """A log of the same requests less those of ``kind`` (sharing the pools and blocks)."""
        out = Requests(self._events, self.first)
        out.pools, out._pool_index = self.pools, self._pool_index
        out._sizes, out._streams = self.sizes_streams()
        data = out.data
        for k, x in enumerate(self.data):
            if x & 7 != kind:
                if k in self.extras:
                    out.extras[len(data)] = self.extras[k]
                data.append(x)
        return out.pack()

    def indices(self, kind: int) -> list[int]:
        """The indices of the requests of ``kind``."""
        return [k for k, x in enumerate(self.data) if x & 7 == kind]

    def _tuple(self, k: int, x: int) -> tuple:
        kind = x & 7
        if kind == R_ALLOC or kind == R_RESTORE:
            key = x >> KEY_SHIFT
            sizes, streams = self.sizes_streams()
            return (kind, key, sizes[key], streams[key], self.pools[(x >> POOL_SHIFT) & POOL_MASK])
        if kind == R_FREE_REQ or kind == R_FREE_DONE:
            return (kind, x >> KEY_SHIFT)
        if kind == R_EMPTY:
            return (kind, self.pools[(x >> POOL_SHIFT) & POOL_MASK])
        return self.extras[k]

    def __len__(self) -> int:
        return len(self._data) + len(self.tail)

    def __iter__(self) -> Iterator[tuple]:
        return map(self._tuple, range(len(self.data)), self.data)

    def __getitem__(self, k: Any) -> Any:
        if isinstance(k, slice):
            return [self._tuple(j, self.data[j]) for j in range(*k.indices(len(self.data)))]
        if k < 0:
            k += len(self.data)
        return self._tuple(k, self.data[k])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (Requests, list, tuple)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


def as_requests(requests: Any) -> Requests:
    """``requests`` as a :class:`Requests` (a list of request tuples is converted)."""
    return requests if isinstance(requests, Requests) else Requests.from_tuples(requests)


__all__ = ["KEY_SHIFT", "POOL_FIELD", "POOL_MASK", "POOL_SHIFT", "R_ALLOC", "R_EMPTY", "R_FREEABLE", "R_FREE_DONE",
           "R_FREE_REQ", "R_RESTORE", "R_RETRY", "Requests", "as_requests"]
