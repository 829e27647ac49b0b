"""A device's trace as columns (:class:`Rows`), and the codes of its actions: what the restricted
loader (:mod:`experiments.doctor.reading.unpickler`, :mod:`experiments.doctor.reading.loader`)
builds instead of torch's list of dicts, about 30 bytes a trace entry instead of about 500. The
replay reads the same codes (small ints keep its loop fast)."""
from __future__ import annotations

from array import array
from typing import Any, Iterator

# Trace actions and their codes: ACTIONS[code] is the action's name.
ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
           "segment_unmap", "snapshot", "oom")
ALLOC, FREE_REQ, FREE_DONE, SEG_ALLOC, SEG_FREE, SEG_MAP, SEG_UNMAP, SNAPSHOT, OOM, UNKNOWN = range(10)
IGNORED_CODE = 10                           # a marker that does not touch memory: 'user_defined'
ANNOTATE_CODE = 11                          # torch 2.14's 'annotate' (metadata for a live block): likewise
IGNORED = ("annotate", "user_defined")      # the markers (codes ANNOTATE_CODE, IGNORED_CODE)
UNKNOWN_CODE = UNKNOWN                      # any other action: the name is kept in Rows.unknown
ACTION_CODE = {a: i for i, a in enumerate(ACTIONS)} | {"user_defined": IGNORED_CODE, "annotate": ANNOTATE_CODE}
OOM_CODE = OOM
# Fields every memory action must carry (an 'oom' entry has device_free where the others have addr).
NEEDS = {c: ("addr", "size", "stream") for c in range(7)} | {OOM_CODE: ("device_free", "size", "stream")}
ADDR_LIMIT = 1 << 62        # addresses and stream ids: below this (device pointers are < 2^57)
SIZE_LIMIT = 1 << 46        # sizes: at most 64 TiB, more than any GPU has


class Rows:
    """One device's trace, as columns: ``codes`` (array of action codes), ``addrs``,
    ``sizes``, ``streams`` (arrays of int64; for 'oom' the address column holds device_free),
    ``stacks`` (array of stack ids, -1 for none, into :attr:`stack_table`), ``unknown``
    ({row: action name} for actions the doctor does not know), and from torch 2.12 on
    ``pools`` (array of indices into :attr:`pool_table` of each entry's ``pool_id``, -1 where an
    entry has none; None when no entry has one) and ``fwd`` (stack ids of ``forward_frames``,
    the forward pass's stack of a backward allocation; None when no entry has one).

    Reads like the list of dicts torch wrote (``len``, indexing, iteration build one dict
    at a time), so code that expects ``device_traces[d]`` to be a list keeps working.
    """

    __slots__ = ("codes", "addrs", "sizes", "streams", "stacks", "unknown", "stack_table", "pools", "pool_table",
                 "pool_index", "fwd")

    def add_stacks(self, sids: Any) -> None:
        """The stack ids of the rows just added (the last ``len(sids)``); -1 for none."""
        if self.stacks is None:
            if not any(s >= 0 for s in sids):
                return
            self.stacks = array("i", [-1]) * (len(self.codes) - len(sids))
        self.stacks.extend(sids)

    def add_pools(self, pids: Any) -> None:
        """The pool indices of the rows just added (the last ``len(pids)``); -1 for none."""
        if self.pools is None:
            if not any(p >= 0 for p in pids):
                return
            self.pools = array("i", [-1]) * (len(self.codes) - len(pids))
        self.pools.extend(pids)

    def add_fwd(self, sids: Any) -> None:
        """The forward stack ids of the rows just added; -1 for none."""
        if self.fwd is None:
            if not any(s >= 0 for s in sids):
                return
            self.fwd = array("i", [-1]) * (len(self.codes) - len(sids))
        self.fwd.extend(sids)

    def pool_of(self, pool: tuple[int, int]) -> int:
        """The index of ``pool`` in :attr:`pool_table` (added if new)."""
        i = self.pool_index.get(pool)
        if i is None:
            i = self.pool_index[pool] = len(self.pool_table)
            self.pool_table.append(pool)
        return i

    def __init__(self, stack_table: list[Any] | None = None) -> None:
        self.codes = array("B")
        self.addrs = array("q")
        self.sizes = array("q")
        self.streams = array("q")
        self.stacks: array | None = None      # made at the first row with a stack (-1: none)
        self.unknown: dict[int, str] = {}
        self.stack_table = stack_table if stack_table is not None else []
        self.pools: array | None = None       # made at the first row with a pool_id (-1: none)
        self.pool_table: list[tuple[int, int]] = []
        self.pool_index: dict[tuple[int, int], int] = {}
        self.fwd: array | None = None

    def __len__(self) -> int:
        return len(self.codes)

    def action(self, i: int) -> str:
        c = self.codes[i]
        if c < len(ACTIONS):
            return ACTIONS[c]
        if c == ANNOTATE_CODE:
            return "annotate"
        return self.unknown.get(i, "user_defined")

    def __getitem__(self, i: int) -> dict[str, Any]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]  # type: ignore[return-value]
        if i < 0:
            i += len(self)
        action = self.action(i)
        out: dict[str, Any] = {"action": action, "device_free" if self.codes[i] == OOM_CODE else "addr": self.addrs[i],
                               "size": self.sizes[i], "stream": self.streams[i]}
        s = self.stacks[i] if self.stacks is not None else -1
        out["frames"] = [dict(zip(("filename", "line", "name"), f)) for f in self.stack_table[s]] if s >= 0 else []
        if self.pools is not None and self.pools[i] >= 0:
            out["pool_id"] = self.pool_table[self.pools[i]]
        if self.fwd is not None and self.fwd[i] >= 0:
            out["forward_frames"] = [dict(zip(("filename", "line", "name"), f)) for f in self.stack_table[self.fwd[i]]]
        return out

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (self[i] for i in range(len(self)))

    def frames(self, i: int) -> list[tuple[str, int, str]]:
        """The stack of row ``i`` as (filename, line, name), innermost first ([] if none)."""
        s = self.stacks[i] if self.stacks is not None else -1
        return list(self.stack_table[s]) if s >= 0 else []


__all__ = ["ACTIONS", "ACTION_CODE", "ADDR_LIMIT", "ALLOC", "ANNOTATE_CODE", "FREE_DONE", "FREE_REQ", "IGNORED", "IGNORED_CODE", "NEEDS",
           "OOM", "OOM_CODE", "Rows", "SEG_ALLOC", "SEG_FREE", "SEG_MAP", "SEG_UNMAP", "SIZE_LIMIT", "SNAPSHOT",
           "UNKNOWN", "UNKNOWN_CODE"]
