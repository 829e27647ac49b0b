"""A restricted, bounded reader of ``torch.cuda.memory._dump_snapshot`` pickles that runs no code.

``pickle.load`` runs whatever callable a file names (``os.system`` included): a reader's
snapshot is untrusted input. :class:`Reader` interprets the pickle opcodes itself and accepts
only those that build plain data (None, bools, numbers, strings, bytes, lists, tuples,
dicts, sets) for protocols 0 to 5; an opcode that names a class or a function (``GLOBAL``,
``STACK_GLOBAL``, ``REDUCE``, ``BUILD``, ``INST``, ``OBJ``, ``NEWOBJ``, extensions,
persistent ids, out-of-band buffers) stops the reading with
:class:`~experiments.doctor.errors.PickleRefused` before anything is called. Every object it
builds is charged to a byte budget, checked before the object is made, and the mark stack has
a depth limit.

Trace entries (the dicts of ``device_traces[d]``) are not kept as dicts: each becomes one row
of a :class:`~experiments.doctor.reading.rows.Rows` table (action code, address, size, stream,
and an interned stack), about 30 bytes instead of about 500. After the first entry of a given
layout has been read opcode by opcode, :meth:`Reader._learn` compiles the layout into a
regular expression of its exact opcode bytes (keys as memo references, values as captured
integer or memo-reference opcodes), and :meth:`Reader._try_fast` matches the entries that
follow many at a time in C; an entry that does not match exactly (a new string, a new stack
frame, a pickle frame boundary) is read opcode by opcode. A match is the unique decoding of
those bytes, so both paths give the same rows (tested against ``pickle.loads``).

Opcode semantics follow ``Lib/pickle.py`` and ``Lib/pickletools.py`` (CPython 3.11).
"""
from __future__ import annotations

import codecs
import re
import struct
import sys
from array import array
from bisect import bisect_right
from itertools import accumulate
from typing import Any, Generator

from ..errors import PickleRefused
from ..steps import run_steps
from .rows import ACTION_CODE, ACTIONS, ADDR_LIMIT, NEEDS, OOM_CODE, SIZE_LIMIT, UNKNOWN_CODE, Rows

_I4 = struct.Struct("<i").unpack_from
_U4 = struct.Struct("<I").unpack_from


class _Sentinel:
    __slots__ = ("what",)

    def __init__(self, what: str) -> None:
        self.what = what

    def __repr__(self) -> str:
        return f"<{self.what}>"


_MARK = _Sentinel("mark")
_ROW_MEMO = _Sentinel("a trace entry")          # memo slot of an entry that became a row
_FRAMES_MEMO = _Sentinel("a trace entry's frames")   # only in a layout: replaced by the stack
_FWD_MEMO = _Sentinel("a trace entry's forward_frames")   # likewise, torch 2.12+
_POOL_MEMO = _Sentinel("a trace entry's pool_id")          # torch 2.12+: (int, int), a new tuple per entry

# Rough bytes each kind of object costs (CPython 3.11, 64-bit), charged before it is built.
_COST_OBJ, _COST_CONTAINER, _COST_ITEM = 32, 64, 16
_INT_FORMS = [rb"K.", rb"M..", rb"J....", rb"\x8a\x00"] + [rb"\x8a" + bytes([rb"\x"[0]]) + f"x{n:02x}".encode()
                                                      + b".{%d}" % n for n in range(1, 9)]
_INT_RE = b"(?:" + b"|".join(_INT_FORMS) + b")"


def _int_re(v: int) -> bytes:
    """An integer opcode of any width, the one that writes ``v`` tried first (the regex engine
    tries alternatives in order: a trace's field keeps its width from entry to entry)."""
    if 0 <= v < 256:
        first = 0
    elif 0 <= v < 65536:
        first = 1
    elif -(1 << 31) <= v < (1 << 31):
        first = 2
    else:
        first = 3 + (v.bit_length() + 8) // 8   # LONG1 of that many bytes (sign bit included)
        first = min(first, len(_INT_FORMS) - 1)
    forms = [_INT_FORMS[first]] + [f for i, f in enumerate(_INT_FORMS) if i != first]
    return b"(?:" + b"|".join(forms) + b")"
_GET_RE = rb"(?:h.|j....)"


def _int_of(raw: bytes) -> int:
    """The value of an integer opcode (K, M, J or LONG1 with its argument)."""
    op = raw[0]
    if op == 0x4B:
        return raw[1]
    if op == 0x4D:
        return raw[1] | raw[2] << 8
    if op == 0x4A:
        return _I4(raw, 1)[0]
    return int.from_bytes(raw[2:], "little", signed=True)


class _OutOfRange(Exception):
    """A value of a trace column outside its range (the caller names the entry)."""


class _Column(dict):
    """Raw integer opcode bytes -> the value as 8 little-endian bytes, for one column (traces
    repeat sizes, streams and addresses): a batch becomes ``array.frombytes`` of their join,
    with no int objects and no per-item conversion; a value's range is checked once."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def __missing__(self, raw: bytes) -> bytes:
        v = _int_of(raw)
        if not 0 <= v < self.limit:
            raise _OutOfRange(v)
        b = self[raw] = v.to_bytes(8, sys.byteorder)     # as array("q") holds it
        return b

    def pack(self, raws: list[bytes]) -> bytes:
        """The values of ``raws`` as 8 bytes each, joined (``array.frombytes`` of a batch).
        Where every opcode of the batch has one form and width (a trace's addresses and streams
        mostly do), the argument bytes are moved into place by strided copies, with no lookup
        per value (the lookups were most of reading a trace in the browser's Python); else,
        and where a value may be out of range, one lookup each. Raises _OutOfRange."""
        n = len(raws)
        if n and sys.byteorder == "little":
            head = raws[0][:2] if raws[0][:1] == b"\x8a" else raws[0][:1]
            width = _ARG_BYTES.get(head)
            if width is not None:
                step = len(head) + width
                joined = b"".join(raws)
                # Every raw starts with its opcode: the first one of another form (or width)
                # would start where a raw of this one does, and show there.
                if len(joined) == n * step and all(joined[k::step] == head[k:k + 1] * n for k in range(len(head))):
                    # non-negative and under the limit: the top byte of each argument says so
                    if width == 0 or max(joined[step - 1::step]) < min(
                            0x100 if head in (b"K", b"M") else 0x80, self.limit >> 8 * (width - 1)):
                        out = bytearray(8 * n)
                        for k in range(width):
                            out[k::8] = joined[len(head) + k::step]
                        return bytes(out)
        return b"".join(map(self.__getitem__, raws))


def _int32s(values: Any, n: int) -> array:
    """The ``n`` ints of ``values`` as an int32 array: packed at once (an array made from an
    iterator parses each item as an append does, at several times the cost)."""
    out = array("i")
    out.frombytes(struct.pack(f"{n}i", *values))
    return out


# The argument bytes of each integer opcode of a fixed width (little-endian; K and M unsigned,
# J and LONG1 two's complement): BININT1, BININT2, BININT, LONG1 of 0 to 8 bytes.
_ARG_BYTES = {b"K": 1, b"M": 2, b"J": 4, **{b"\x8a" + bytes([w]): w for w in range(9)}}


class _Shape:
    """A compiled layout of trace entries: the regex and what each match means, and ``run``,
    the regex of up to :data:`_RUN` consecutive entries of the layout."""

    __slots__ = ("regex", "run", "groups", "memo_slots", "has_frames", "put_groups", "frames_slot", "fwd_slot",
                 "pool_slot")

    def __init__(self, regex: Any, groups: dict[str, int], memo_slots: list[Any], has_frames: bool,
                 put_groups: list[int]) -> None:
        self.regex, self.groups, self.memo_slots = regex, groups, memo_slots
        # possessive: the entries as the layout's regex matches them one after the other (a
        # repeat never gives an entry back once matched, and keeps no state to), found faster
        self.run = re.compile(b"(?:" + regex.pattern + b"){1,%d}+" % _RUN, regex.flags)
        self.has_frames, self.put_groups = has_frames, put_groups
        self.frames_slot = memo_slots.index(_FRAMES_MEMO) if has_frames else -1
        self.fwd_slot = memo_slots.index(_FWD_MEMO) if _FWD_MEMO in memo_slots else -1
        self.pool_slot = memo_slots.index(_POOL_MEMO) if _POOL_MEMO in memo_slots else -1
        # forward_frames is optional in a layout learnt from an entry that has it: an entry
        # without it has one memo slot fewer (the list's)


# Entries matched by one call of a layout's run regex (torch's pickles hold 1,000 per batch).
_RUN = 4096

_Q8 = struct.Struct("<Q").unpack_from
_D8 = struct.Struct(">d").unpack_from
_REFUSED = {
    0x63: "GLOBAL", 0x93: "STACK_GLOBAL", 0x52: "REDUCE", 0x62: "BUILD", 0x69: "INST", 0x6f: "OBJ",
    0x81: "NEWOBJ", 0x92: "NEWOBJ_EX", 0x82: "EXT1", 0x83: "EXT2", 0x84: "EXT4", 0x50: "PERSID",
    0x51: "BINPERSID", 0x97: "NEXT_BUFFER", 0x98: "READONLY_BUFFER",
}


class Reader:
    """Reads one pickle from ``data`` (bytes). See the module docstring.

    Args:
        budget_bytes: the most memory the objects built outside the trace tables may take
            (checked before each is built).
        max_depth: the deepest nesting of marks (open containers).
        max_rows: the most trace entries, all devices together.
    """

    def __init__(self, data: bytes, *, budget_bytes: int, max_depth: int = 10_000, max_rows: int = 50_000_000):
        self.data = data
        self.budget = budget_bytes
        self.limit_text = f"{budget_bytes:,} bytes of objects besides the trace tables"
        self.max_depth = max_depth
        self.max_rows = max_rows
        self.memo: list[Any] = []
        self.proto = 0
        # -- trace entries (see the module docstring)
        self.rows_total = 0
        self.fast_rows = 0          # rows read by the fast path (the rest opcode by opcode)
        self.shapes: list[_Shape] = []
        self.seen_sigs: set[tuple] = set()
        self.key_idx: dict[str, int] = {}
        self._acts = _Acts(self)
        self._stacks = _Stacks(self)
        # The memo slots of entries read on the fast path are not stored one by one (8 bytes
        # each): each batch is a run of slots that repeat a pattern, kept as (virtual start,
        # length, pattern, stack ids). A memo index is virtual: real slots and runs interleaved.
        self.run_vstart: list[int] = []
        self.run_real: list[int] = []          # len(memo) when the run was added
        self.run_end: list[int] = []           # virtual slots in runs up to and including this one
        self.run_pattern: list[list[Any]] = []
        self.run_sids: list[Any] = []
        self.run_fslot: list[int] = []
        self.run_extra: list[Any] = []         # (shape, pool indices, forward stack ids) of each run
        self.run_offsets: list[Any] = []       # None, or where each entry's slots start (entries that
                                               # lack an optional list have one slot fewer)
        self.pool_table: list[tuple[int, int]] = []
        self.pool_index: dict[tuple[int, int], int] = {}
        self._pools = _Pools(self)
        self._pool_refs = _PoolRefs(self)
        self.vcount = 0
        self.columns = {"addr": _Column(ADDR_LIMIT), "size": _Column(SIZE_LIMIT), "stream": _Column(ADDR_LIMIT)}
        self.stack_ids: dict[Any, int] = {}
        self.stack_table: list[Any] = []

    # -- budget
    def _charge(self, nbytes: int) -> None:
        self.budget -= nbytes
        if self.budget < 0:
            raise PickleRefused(f"the pickle builds more objects than the reading budget allows ({self.limit_text}); "
                                "if the snapshot is real, raise it: --read-budget BYTES "
                                "(Limits(budget_bytes=...) from Python)")

    # -- memo
    def _put(self, idx: int, obj: Any) -> None:
        memo = self.memo
        vlen = self._vlen()
        if idx == vlen:
            memo.append(obj)
        elif idx < vlen:
            real = self._real(idx)
            if real is None:      # a slot of a fast-path run: torch never writes one twice
                raise PickleRefused(f"memo index {idx} written twice (torch writes each once)")
            memo[real] = obj
        else:
            if idx > vlen + 1_000_000:
                raise PickleRefused(f"memo index {idx} is far beyond the objects read so far")
            self._charge(8 * (idx - vlen))
            memo.extend([None] * (idx - vlen))
            memo.append(obj)

    # -- the main loop
    def load(self) -> Any:
        """The pickle's object (read in steps: experiments.doctor.steps)."""
        return run_steps(self._load())

    def _load(self) -> Generator[None, None, Any]:
        data, n = self.data, len(self.data)
        stack: list[Any] = []
        marks: list[int] = []
        memo = self.memo
        push, pop = stack.append, stack.pop
        pos = 0
        cost_obj, cost_item, cost_cont = _COST_OBJ, _COST_ITEM, _COST_CONTAINER
        while True:
            if pos >= n:
                raise PickleRefused("the pickle ends before its STOP opcode (truncated)")
            op = data[pos]
            pos += 1
            if op == 0x68:                                   # BINGET
                push(self._get(data[pos], pos))
                pos += 1
            elif op == 0x94:                                 # MEMOIZE
                if not stack:
                    raise self._fail(pos, "MEMOIZE on an empty stack")
                memo.append(stack[-1])
            elif op == 0x7D:                                 # EMPTY_DICT
                fast = self._try_fast(stack, marks, pos - 1) if self.shapes else None
                if fast is not None:
                    pos = fast
                    yield                                    # a step: a batch of entries read
                    continue
                self._charge(cost_cont)
                push({})
            elif op == 0x28:                                 # MARK
                if len(marks) >= self.max_depth:
                    raise self._fail(pos, f"nesting deeper than {self.max_depth} levels")
                marks.append(len(stack))
            elif op == 0x4B:                                 # BININT1
                push(data[pos])
                pos += 1
            elif op == 0x8A:                                 # LONG1
                k = data[pos]
                push(int.from_bytes(data[pos + 1:pos + 1 + k], "little", signed=True))
                pos += 1 + k
            elif op == 0x8C:                                 # SHORT_BINUNICODE
                k = data[pos]
                self._charge(cost_obj + k)
                push(self._text(data[pos + 1:pos + 1 + k], pos))
                pos += 1 + k
            elif op == 0x75:                                 # SETITEMS
                m = self._pop_mark(marks, pos)
                items = stack[m:]
                del stack[m:]
                if not stack or type(stack[-1]) is not dict or len(items) % 2:
                    raise self._fail(pos, "SETITEMS without a dict and key/value pairs")
                d = stack[-1]
                self._charge(cost_item * len(items))
                try:
                    for i in range(0, len(items), 2):
                        d[items[i]] = items[i + 1]
                except TypeError:
                    raise self._fail(pos, "a dict key that cannot be a key (a list or dict)") from None
                if "action" in d and self.proto >= 2:
                    self._learn_entry(d)                     # complete now: its layout can be compiled
            elif op == 0x4A:                                 # BININT
                push(_I4(data, pos)[0])
                pos += 4
            elif op == 0x6A:                                 # LONG_BINGET
                push(self._get(_U4(data, pos)[0], pos))
                pos += 4
            elif op == 0x65:                                 # APPENDS
                m = self._pop_mark(marks, pos)
                items = stack[m:]
                del stack[m:]
                self._extend(stack, items, pos)
            elif op == 0x5D:                                 # EMPTY_LIST
                self._charge(cost_cont)
                push([])
            elif op == 0x4D:                                 # BININT2
                push(data[pos] | data[pos + 1] << 8)
                pos += 2
            elif op == 0x71:                                 # BINPUT
                if not stack:
                    raise self._fail(pos, "BINPUT on an empty stack")
                self._put(data[pos], stack[-1])
                pos += 1
            elif op == 0x72:                                 # LONG_BINPUT
                if not stack:
                    raise self._fail(pos, "LONG_BINPUT on an empty stack")
                self._put(_U4(data, pos)[0], stack[-1])
                pos += 4
            elif op == 0x58:                                 # BINUNICODE
                k = _U4(data, pos)[0]
                if pos + 4 + k > n:
                    raise self._fail(pos, "a string runs past the end of the file")
                self._charge(cost_obj + k)
                push(self._text(data[pos + 4:pos + 4 + k], pos))
                pos += 4 + k
            elif op == 0x95:                                 # FRAME: the data is all here already
                pos += 8
            elif op == 0x61:                                 # APPEND
                if len(stack) < 2:
                    raise self._fail(pos, "APPEND without a list")
                v = pop()
                self._extend(stack, [v], pos)
            elif op == 0x73:                                 # SETITEM
                if len(stack) < 3 or type(stack[-3]) is not dict:
                    raise self._fail(pos, "SETITEM without a dict")
                v = pop()
                k = pop()
                self._charge(cost_item)
                try:
                    stack[-1][k] = v
                except TypeError:
                    raise self._fail(pos, "a dict key that cannot be a key (a list or dict)") from None
            elif op == 0x2E:                                 # STOP
                if len(stack) != 1 or marks:
                    raise self._fail(pos, "STOP with an unfinished structure")
                return stack[0]
            elif op == 0x80:                                 # PROTO
                self.proto = data[pos]
                if self.proto > 5:
                    raise self._fail(pos, f"pickle protocol {self.proto} (this reader knows 0 to 5)")
                pos += 1
            elif op == 0x4E:                                 # NONE
                push(None)
            elif op == 0x88:                                 # NEWTRUE
                push(True)
            elif op == 0x89:                                 # NEWFALSE
                push(False)
            elif op == 0x47:                                 # BINFLOAT
                self._charge(cost_obj)
                push(_D8(data, pos)[0])
                pos += 8
            elif op in (0x85, 0x86, 0x87):                   # TUPLE1, TUPLE2, TUPLE3
                k = op - 0x84
                if len(stack) < k:
                    raise self._fail(pos, "TUPLE without its items")
                self._charge(cost_cont + cost_item * k)
                t = tuple(stack[-k:])
                del stack[-k:]
                push(t)
            elif op == 0x74:                                 # TUPLE
                m = self._pop_mark(marks, pos)
                self._charge(cost_cont + cost_item * (len(stack) - m))
                t = tuple(stack[m:])
                del stack[m:]
                push(t)
            elif op == 0x29:                                 # EMPTY_TUPLE
                push(())
            elif op == 0x6C:                                 # LIST
                m = self._pop_mark(marks, pos)
                self._charge(cost_cont + cost_item * (len(stack) - m))
                lst = stack[m:]
                del stack[m:]
                push(lst)
                if any(type(x) is _RowTuple for x in lst):
                    raise self._fail(pos, "trace entries in a list built at once (torch appends them)")
            elif op == 0x64:                                 # DICT
                m = self._pop_mark(marks, pos)
                items = stack[m:]
                del stack[m:]
                if len(items) % 2:
                    raise self._fail(pos, "DICT with an odd number of items")
                self._charge(cost_cont + cost_item * len(items))
                try:
                    push({items[i]: items[i + 1] for i in range(0, len(items), 2)})
                except TypeError:
                    raise self._fail(pos, "a dict key that cannot be a key (a list or dict)") from None
            elif op == 0x8F:                                 # EMPTY_SET
                self._charge(cost_cont)
                push(set())
            elif op == 0x90:                                 # ADDITEMS
                m = self._pop_mark(marks, pos)
                items = stack[m:]
                del stack[m:]
                if not stack or type(stack[-1]) is not set:
                    raise self._fail(pos, "ADDITEMS without a set")
                self._charge(cost_item * len(items))
                try:
                    stack[-1].update(items)
                except TypeError:
                    raise self._fail(pos, "a set item that cannot be hashed") from None
            elif op == 0x91:                                 # FROZENSET
                m = self._pop_mark(marks, pos)
                self._charge(cost_cont + cost_item * (len(stack) - m))
                try:
                    f = frozenset(stack[m:])
                except TypeError:
                    raise self._fail(pos, "a set item that cannot be hashed") from None
                del stack[m:]
                push(f)
            elif op == 0x30:                                 # POP
                if stack and stack[-1] is not _MARK:
                    pop()
                elif marks and marks[-1] == len(stack):
                    marks.pop()
                else:
                    raise self._fail(pos, "POP on an empty stack")
            elif op == 0x31:                                 # POP_MARK
                m = self._pop_mark(marks, pos)
                del stack[m:]
            elif op == 0x32:                                 # DUP
                if not stack:
                    raise self._fail(pos, "DUP on an empty stack")
                push(stack[-1])
            elif op == 0x8B:                                 # LONG4
                k = _I4(data, pos)[0]
                if k < 0 or pos + 4 + k > n:
                    raise self._fail(pos, "a LONG4 runs past the end of the file")
                if k > 64:
                    raise self._fail(pos, f"an integer of {k} bytes (a snapshot's numbers fit in 8)")
                push(int.from_bytes(data[pos + 4:pos + 4 + k], "little", signed=True))
                pos += 4 + k
            elif op in (0x43, 0x55):                         # SHORT_BINBYTES, SHORT_BINSTRING
                k = data[pos]
                self._charge(cost_obj + k)
                raw = data[pos + 1:pos + 1 + k]
                push(bytes(raw) if op == 0x43 else self._latin1(raw))
                pos += 1 + k
            elif op in (0x42, 0x54):                         # BINBYTES, BINSTRING
                k = _I4(data, pos)[0] if op == 0x54 else _U4(data, pos)[0]
                if k < 0 or pos + 4 + k > n:
                    raise self._fail(pos, "a string runs past the end of the file")
                self._charge(cost_obj + k)
                raw = data[pos + 4:pos + 4 + k]
                push(bytes(raw) if op == 0x42 else self._latin1(raw))
                pos += 4 + k
            elif op in (0x8D, 0x8E, 0x96):                   # BINUNICODE8, BINBYTES8, BYTEARRAY8
                k = _Q8(data, pos)[0]
                if pos + 8 + k > n:
                    raise self._fail(pos, "a string runs past the end of the file")
                self._charge(cost_obj + k)
                raw = data[pos + 8:pos + 8 + k]
                push(self._text(raw, pos) if op == 0x8D else bytes(raw) if op == 0x8E else bytearray(raw))
                pos += 8 + k
            elif op in (0x49, 0x4C, 0x46, 0x53, 0x56, 0x67, 0x70):   # protocol 0: text arguments
                end = data.find(b"\n", pos)
                if end < 0:
                    raise self._fail(pos, "a text argument without its newline")
                arg = bytes(data[pos:end])
                pos = end + 1
                self._charge(cost_obj + len(arg))
                push_val = self._text_op(op, arg, pos)
                if op == 0x67:                               # GET
                    push(self._get(push_val, pos))
                elif op == 0x70:                             # PUT
                    if not stack:
                        raise self._fail(pos, "PUT on an empty stack")
                    self._put(push_val, stack[-1])
                else:
                    push(push_val)
            elif op in _REFUSED:
                raise self._refuse(op, pos)
            else:
                raise self._fail(pos, f"opcode {op:#04x} is not a pickle opcode")

    # -- helpers of the slow path
    @staticmethod
    def _pop_mark(marks: list[int], pos: int) -> int:
        if not marks:
            raise PickleRefused(f"byte {pos}: an opcode that needs a MARK found none")
        return marks.pop()

    def _text(self, raw: Any, pos: int) -> str:
        try:
            return codecs.decode(raw, "utf-8", "surrogatepass")
        except UnicodeDecodeError:
            raise self._fail(pos, "a string that is not UTF-8") from None

    @staticmethod
    def _latin1(raw: Any) -> str:
        return codecs.decode(raw, "latin-1")

    def _text_op(self, op: int, arg: bytes, pos: int) -> Any:
        try:
            if op == 0x49:                                   # INT (I01/I00 are bools)
                if arg == b"01":
                    return True
                if arg == b"00":
                    return False
                if len(arg) > 40:
                    raise ValueError
                return int(arg)
            if op == 0x4C:                                   # LONG
                if len(arg) > 41:
                    raise ValueError
                return int(arg[:-1] if arg.endswith(b"L") else arg)
            if op == 0x46:                                   # FLOAT
                return float(arg)
            if op == 0x53:                                   # STRING (quoted repr)
                if len(arg) < 2 or arg[:1] != arg[-1:] or arg[:1] not in (b"'", b'"'):
                    raise ValueError
                return codecs.escape_decode(arg[1:-1])[0].decode("latin-1")
            if op == 0x56:                                   # UNICODE (raw-unicode-escape)
                return codecs.decode(arg, "raw-unicode-escape")
            return int(arg)                                  # GET / PUT index
        except (ValueError, UnicodeDecodeError):
            raise self._fail(pos, f"a malformed text argument {arg[:40]!r}") from None

    def _refuse(self, op: int, pos: int) -> PickleRefused:
        name = _REFUSED[op]
        what = name
        if op in (0x63, 0x69):                               # GLOBAL / INST name the callable as text
            a = self.data.find(b"\n", pos)
            b = self.data.find(b"\n", a + 1) if a >= 0 else -1
            if a >= 0 and b >= 0:
                what = f"{bytes(self.data[pos:a]).decode('latin-1')}.{bytes(self.data[a + 1:b]).decode('latin-1')}"
        return PickleRefused(f"refusing to load {what} from the pickle (byte {pos - 1}): a memory snapshot "
                             "holds only dicts, lists, strings and numbers, so nothing in it is run "
                             "(is this file really from torch.cuda.memory._dump_snapshot?)")

    # -- trace entries as rows
    def _fail(self, pos: int, what: str) -> PickleRefused:
        return PickleRefused(f"byte {pos}: {what}")

    def _real(self, idx: int) -> int | None:
        """The real memo slot of virtual index ``idx``; None when it is in a fast-path run."""
        vstart = self.run_vstart
        if not vstart or idx < vstart[0]:
            return idx
        i = bisect_right(vstart, idx) - 1
        if idx - vstart[i] < self.run_end[i] - (self.run_end[i - 1] if i else 0):
            return None
        return idx - self.run_end[i]

    def _get(self, idx: int, pos: int) -> Any:
        """The object memo index ``idx`` (virtual) refers to."""
        real = self._real(idx)
        if real is None:
            i = bisect_right(self.run_vstart, idx) - 1
            offsets = self.run_offsets[i]
            if offsets is True:
                k = len(self.run_pattern[i])
                offsets = self.run_offsets[i] = array("q", [0]) + array(
                    "q", accumulate(k - (f == -2) for f in self.run_extra[i][2]))
            if offsets is None:
                e, s = divmod(idx - self.run_vstart[i], len(self.run_pattern[i]))
            else:
                rel = idx - self.run_vstart[i]
                e = bisect_right(offsets, rel) - 1
                s = rel - offsets[e]
                fslot = self.run_extra[i][0].fwd_slot
                if self.run_extra[i][2][e] == -2 and s >= fslot:
                    s += 1                       # this entry has no forward_frames list
            if s == self.run_fslot[i]:
                sid = self.run_sids[i][e]
                return self.stack_table[sid] if sid >= 0 else ()
            obj = self.run_pattern[i][s]
            if obj is _POOL_MEMO:
                return self.pool_table[self.run_extra[i][1][e]]
            if obj is _FWD_MEMO:
                sid = self.run_extra[i][2][e]
                return self.stack_table[sid] if sid >= 0 else ()
        elif real < 0:
            raise self._fail(pos, f"memo reference {idx} to an object not read yet")
        else:
            try:
                obj = self.memo[real]
            except IndexError:
                raise self._fail(pos, f"memo reference {idx} to an object not read yet") from None
        if obj is _ROW_MEMO:
            raise self._fail(pos, "a second reference to a trace entry (torch writes each once)")
        return obj

    def _vlen(self) -> int:
        """The memo's length in virtual indices (the index the next MEMOIZE gets)."""
        return len(self.memo) + self.vcount

    def _virtual(self, real: int) -> int:
        """The virtual memo index of real slot ``real``."""
        j = bisect_right(self.run_real, real)
        return real + (self.run_end[j - 1] if j else 0)

    def _row_of(self, d: dict[str, Any], pos: int) -> Any:
        """A completed dict with an 'action' key: a row tuple (its memo slot freed), and learn
        its layout for the fast path."""
        action = d.get("action")
        if type(action) is not str:
            return d                                 # not a trace entry; a malformed one is caught later
        frames = d.get("frames")
        sid = self._stack_id_of(frames) if frames else -1
        row = _RowTuple(action, d.get("device_free") if action == "oom" else d.get("addr"), d.get("size"),
                        d.get("stream"), sid, d)
        didx = self._memo_slot(d)
        if didx is not None:
            self.memo[didx] = _ROW_MEMO
        return row

    def _memo_slot(self, d: dict[str, Any]) -> int | None:
        memo = self.memo
        for i in range(len(memo) - 1, max(-1, len(memo) - 4097), -1):
            if memo[i] is d:
                return i
        return None

    def _learn_entry(self, d: dict[str, Any]) -> None:
        """An entry dict just completed (SETITEMS): compile its layout if it is a new one."""
        if len(self.shapes) >= 12 or type(d.get("action")) is not str:
            return
        didx = self._memo_slot(d)
        if didx is None:
            return
        # the layout: keys, value types, and whether each string is new in this entry
        tail = self.memo[didx + 1:]
        sig = tuple((k, type(v), type(v) is str and k != "action" and any(x is v for x in tail))
                    for k, v in d.items())
        if sig not in self.seen_sigs:
            self.seen_sigs.add(sig)
            self._learn(d, didx)

    def _stack_id_of(self, frames: Any) -> int:
        if type(frames) is tuple:                    # a stack read before, referenced again
            sid = self.stack_ids.get(frames)
            return -1 if sid is None else sid
        if type(frames) is not list:
            return -1
        key = []
        for f in frames:
            if type(f) is dict:
                line = f.get("line")
                key.append((str(f.get("filename", "?"))[:500], line if type(line) is int else 0,
                            str(f.get("name", "?"))[:200]))
        t = tuple(key)
        sid = self.stack_ids.get(t)
        if sid is None:
            self._charge(_COST_CONTAINER + _COST_ITEM * len(t))
            sid = self.stack_ids[t] = len(self.stack_table)
            self.stack_table.append(t)
        return sid

    def _extend(self, stack: list[Any], items: list[Any], pos: int) -> None:
        """APPEND(S) of ``items`` to the list or Rows at the top of ``stack``."""
        if not stack:
            raise self._fail(pos, "APPENDS without a list")
        if not items:
            return
        target = stack[-1]
        for j, x in enumerate(items):
            # a trace entry becomes a row when it is appended to its list (protocols 0 and 1
            # fill a dict key by key, so it is complete only then)
            if type(x) is dict and type(x.get("action")) is str:
                items[j] = self._row_of(x, pos)
        nrows = sum(1 for x in items if type(x) is _RowTuple)
        if not nrows:
            if type(target) is list:
                self._charge(_COST_ITEM * len(items))
                target.extend(items)
                return
            raise self._fail(pos, "APPENDS without a list" if type(target) is not Rows
                             else "a trace that mixes entries with other values")
        if nrows != len(items):
            raise self._fail(pos, "a trace that mixes entries with other values")
        if type(target) is list:
            if target:
                raise self._fail(pos, "a trace that mixes entries with other values")
            target = self._rows_for(stack, len(stack) - 1, target)
        elif type(target) is not Rows:
            raise self._fail(pos, "trace entries outside a list")
        for r in items:
            self._add_row(target, r)

    def _rows_for(self, stack: list[Any], k: int, lst: list[Any]) -> Rows:
        """Turn the (empty) list at stack[k] into a Rows table, in the memo too."""
        rows = Rows(self.stack_table)
        rows.pool_table, rows.pool_index = self.pool_table, self.pool_index
        stack[k] = rows
        memo = self.memo
        for i in range(len(memo) - 1, -1, -1):
            if memo[i] is lst:
                memo[i] = rows
                break
        return rows

    def _add_row(self, rows: Rows, r: "_RowTuple") -> None:
        i = len(rows)
        self.rows_total += 1
        if self.rows_total > self.max_rows:
            raise PickleRefused(f"more than {self.max_rows:,} trace entries; if the snapshot is real, raise the "
                                f"limit: --max-events N (Limits(max_events=...) from Python)")
        action = r.action
        code = ACTION_CODE.get(action, UNKNOWN_CODE)
        values = [0, 0, 0]
        need = NEEDS.get(code, ())
        d = r.d
        names = ("device_free" if code == OOM_CODE else "addr", "size", "stream")
        for j, (name, v) in enumerate(zip(names, (r.addr, r.size, r.stream))):
            if name not in d:
                if name in need:
                    raise PickleRefused(f"trace entry {i} ({action[:40]}): '{name}' is missing")
                continue
            limit = SIZE_LIMIT if name == "size" else ADDR_LIMIT
            if type(v) is not int or not 0 <= v < limit:
                what = "a whole number of bytes" if name == "size" else "a whole number"
                raise PickleRefused(f"trace entry {i} ({action[:40]}): '{name}' must be {what} in "
                                    f"[0, {limit:#x}), got {_short(v)}")
            values[j] = v
        rows.codes.append(code)
        rows.addrs.append(values[0])
        rows.sizes.append(values[1])
        rows.streams.append(values[2])
        rows.add_stacks((r.sid,))
        pool = d.get("pool_id")
        if pool is None:
            rows.add_pools((-1,))
        else:
            if type(pool) not in (tuple, list) or len(pool) != 2 or not all(
                    type(x) is int and 0 <= x < ADDR_LIMIT for x in pool):
                raise PickleRefused(f"trace entry {i} ({action[:40]}): 'pool_id' must be two whole numbers, "
                                    f"got {_short(pool)}")
            rows.add_pools((self._pool_index((pool[0], pool[1])),))
        fwd = d.get("forward_frames")
        rows.add_fwd((self._stack_id_of(fwd) if fwd else -1,))
        if code == UNKNOWN_CODE:
            rows.unknown[i] = action[:100]

    def _pool_index(self, pool: tuple[int, int]) -> int:
        i = self.pool_index.get(pool)
        if i is None:
            self._charge(_COST_CONTAINER)
            i = self.pool_index[pool] = len(self.pool_table)
            self.pool_table.append(pool)
        return i

    # -- the fast path
    def _learn(self, d: dict[str, Any], didx: int) -> None:
        """Compile the layout of entry ``d`` (just read opcode by opcode; its memo slot is
        ``didx``) into a regex of its exact opcodes."""
        memo = self.memo
        put_forms = self.proto < 4
        if self.proto < 2:
            return
        memo_tok = rb"(q.|r....)" if put_forms else rb"\x94"
        parts = [rb"\}" + memo_tok + rb"\("]
        ng = 1 if put_forms else 0
        groups: dict[str, int] = {}
        put_groups = [1] if put_forms else []
        slots: list[Any] = [_ROW_MEMO]
        has_frames = False
        for k, v in d.items():
            if type(k) is not str:
                return
            idx = self.key_idx.get(k)
            if idx is None:
                idx = next((i for i in range(didx, -1, -1) if memo[i] is k), None)
                if idx is None:
                    idx = next((i for i in range(didx + 1, len(memo)) if memo[i] is k), None)
                if idx is None:
                    return
                idx = self.key_idx[k] = self._virtual(idx)
            parts.append(re.escape((b"h" + bytes([idx])) if idx < 256 else (b"j" + struct.pack("<I", idx))))
            if k == "action":
                parts.append(b"(" + _GET_RE + b")")
                ng += 1
                groups["action"] = ng
            elif type(v) is int and k in ("addr", "size", "stream", "device_free"):
                parts.append(b"(" + _int_re(v) + b")")
                ng += 1
                groups[k] = ng
            elif type(v) is int:
                parts.append(_int_re(v))
            elif type(v) is str:
                # as written: a reference to a string read before, or a new string of this
                # entry, memoized (each entry then has its own: 'N/A' for compile_context)
                new = any(memo[i] is v for i in range(didx + 1, len(memo)))
                if new:
                    raw = self._new_str_bytes(v)
                    if raw is None:
                        return
                    parts.append(re.escape(raw) + memo_tok)
                    if put_forms:
                        ng += 1
                        put_groups.append(ng)
                    slots.append(v)
                else:
                    parts.append(_GET_RE)
            elif type(v) is list and k == "frames":
                parts.append(rb"\]" + memo_tok)
                if put_forms:
                    ng += 1
                    put_groups.append(ng)
                parts.append(rb"((?:\(" + _GET_RE + rb"+e|" + _GET_RE + rb"a)?)")
                ng += 1
                groups["frames"] = ng
                slots.append(_FRAMES_MEMO)
                has_frames = True
            elif type(v) is list and k == "forward_frames":
                # optional: the key, a new list and its items, or nothing (a free, a forward
                # allocation): one layout for both, so that they alternate in one run
                key_part = parts.pop()
                opt = [key_part, rb"\]" + memo_tok]
                if put_forms:
                    ng += 1
                    put_groups.append(ng)
                opt.append(rb"((?:\(" + _GET_RE + rb"+e|" + _GET_RE + rb"a)?)")
                ng += 1
                groups["fwd"] = ng
                parts.append(b"(?:" + b"".join(opt) + b")?")
                slots.append(_FWD_MEMO)
            elif type(v) is tuple and k == "pool_id" and len(v) == 2 and all(type(x) is int for x in v):
                # torch 2.12+: a new (int, int) tuple per entry (TUPLE2, memoized), or one
                # read before, referenced
                if any(memo[i] is v for i in range(didx + 1, len(memo))):
                    parts.append(b"(" + _int_re(v[0]) + _int_re(v[1]) + rb")\x86" + memo_tok)
                    ng += 1
                    groups["pool"] = ng
                    if put_forms:
                        ng += 1
                        put_groups.append(ng)
                    slots.append(_POOL_MEMO)
                else:
                    parts.append(b"(" + _GET_RE + b")")
                    ng += 1
                    groups["pool_ref"] = ng
            else:
                return
        if "action" not in groups:
            return
        parts.append(b"u")
        regex = re.compile(b"".join(parts), re.DOTALL)
        if any(s.regex.pattern == regex.pattern for s in self.shapes):
            return
        self.shapes.insert(0, _Shape(regex, groups, slots, has_frames, put_groups))

    def _new_str_bytes(self, s: str) -> bytes | None:
        raw = s.encode("utf-8", "surrogatepass")
        if self.proto >= 4 and len(raw) < 256:
            return b"\x8c" + bytes([len(raw)]) + raw
        if self.proto in (2, 3):
            return b"X" + struct.pack("<I", len(raw)) + raw
        return None

    def _match_any(self, pos: int, skip: Any = None) -> Any:
        for shape in self.shapes:
            if shape is not skip and shape.regex.match(self.data, pos) is not None:
                return shape
        return None

    def _try_fast(self, stack: list[Any], marks: list[int], start: int) -> int | None:
        """At an EMPTY_DICT inside a list: match as many entries as possible in C. Returns the
        position after them, or None when the first does not match a known layout."""
        if not marks or marks[-1] == 0:
            return None
        m0 = marks[-1]
        target = stack[m0 - 1]
        if type(target) is not list and type(target) is not Rows:
            return None
        shape = self._match_any(start)
        if shape is None:
            return None
        # the entries read since the mark go first (the APPENDS to come would add them first)
        items = stack[m0:]
        if items:
            del stack[m0:]
            self._extend(stack, items, start)
        target = stack[m0 - 1]
        if type(target) is list:
            if target:
                raise self._fail(start, "a trace that mixes entries with other values")
            target = self._rows_for(stack, m0 - 1, target)
        data = self.data
        pos = start
        runs: list[tuple[_Shape, list[Any], int, int]] = []
        while True:
            # The entries that follow, found by one regex, then split into their fields by
            # another: no match object per entry, which cost as much as the rest of reading it.
            m = shape.run.match(data, pos)
            if m is not None:
                end = m.end()
                parts = shape.regex.split(data[pos:end])
                step = shape.regex.groups + 1
                cols = [parts[j::step] for j in range(1, step)]
                n = len(cols[0])
                runs.append((shape, cols, n, pos))
                pos = end
                if len(runs) >= 4096:                # bound the entries held at once
                    self._take(target, runs)
                    runs = []
                if n == _RUN:
                    continue
            if data[pos:pos + 3] == b"e(}":          # the next batch of APPENDS: same list, same mark
                nxt = self._match_any(pos + 2)
                if nxt is None:
                    break                            # the opcode loop takes the 'e' and the '('
                pos += 2
                shape = nxt
                continue
            nxt = self._match_any(pos, skip=shape)
            if nxt is None:
                break
            shape = nxt
        if runs:
            self._take(target, runs)
        return pos

    def _take(self, rows: Rows, runs: list[tuple[_Shape, list[Any], int, int]]) -> None:
        """Add the entries of consecutive runs of matches (each run one layout: its regex's groups
        as columns, the number of entries, where the first starts) to ``rows``.

        Each run is recorded in the memo bookkeeping in order (a later entry may refer to an
        earlier one's objects), and its columns are gathered; the columns of all the runs are
        then converted at once: entries of different layouts that alternate (torch 2.12's
        backward allocations carry ``forward_frames``, their frees do not) cost no more than
        one long run of one layout."""
        n_all = sum(n for _, _, n, _ in runs)
        self.rows_total += n_all
        self.fast_rows += n_all
        if self.rows_total > self.max_rows:
            raise PickleRefused(f"more than {self.max_rows:,} trace entries; if the snapshot is real, raise the "
                                f"limit: --max-events N (Limits(max_events=...) from Python)")
        base = len(rows)
        memo = self.memo
        acts_all: list[bytes] = []
        cols_all: dict[str, list[bytes]] = {"addr": [], "size": [], "stream": []}
        sids_all, pids_all, fwd_all = array("i"), array("i"), array("i")
        any_sids = rows.stacks is not None
        any_pids = rows.pools is not None
        any_fwd = rows.fwd is not None
        zero = b"K\x00"
        for shape, cols, n, start in runs:
            g = shape.groups
            k = len(shape.memo_slots)
            if shape.put_groups:
                # protocols 2 and 3 name each memo index: they must be the next ones, in order
                want = self._vlen()
                puts = [cols[gi - 1] for gi in shape.put_groups]
                for j in range(n):
                    for col in puts:
                        raw = col[j]
                        if raw is None:              # an optional list the entry does not have
                            continue
                        got = raw[1] if raw[0] == 0x71 else _U4(raw, 1)[0]
                        if got != want:
                            at = list(iter(shape.regex.scanner(self.data, start).match, None))[j].start()
                            raise self._fail(at, "memo indices out of order in a trace entry")
                        want += 1
            sids = None
            if shape.has_frames:
                # a frames list may be referenced again (torch shares some): its slot gives the stack
                sids = _int32s(map(self._stacks.__getitem__, cols[g["frames"] - 1]), n)
            pids = fsids = None
            if "pool" in g or "pool_ref" in g:
                raws, pools = (cols[g["pool"] - 1], self._pools) if "pool" in g else \
                    (cols[g["pool_ref"] - 1], self._pool_refs)
                # a run's entries mostly name one pool: its opcodes then compare equal, unhashed
                pids = array("i", [pools[raws[0]]]) * n if raws.count(raws[0]) == n else \
                    _int32s(map(pools.__getitem__, raws), n)
            if "fwd" in g:
                fsids = _int32s(map(self._stacks.__getitem__, cols[g["fwd"] - 1]), n)
            self.run_vstart.append(self._vlen())
            self.run_real.append(len(memo))
            missing = fsids.count(-2) if fsids is not None and shape.fwd_slot >= 0 else 0
            if missing:
                # entries without the optional forward_frames list have one slot fewer; where
                # each entry's slots start is worked out if a memo reference ever needs it
                self.run_offsets.append(True)
                self.vcount += k * n - missing
            else:
                self.run_offsets.append(None)
                self.vcount += k * n
            self.run_end.append(self.vcount)
            self.run_pattern.append(shape.memo_slots)
            self.run_sids.append(sids)
            self.run_fslot.append(shape.frames_slot)
            self.run_extra.append((shape, pids, fsids))
            acts_all.extend(cols[g["action"] - 1])
            for name, col in cols_all.items():
                gi = g.get(name) or (g.get("device_free") if name == "addr" else None)
                col.extend(cols[gi - 1] if gi is not None else [zero] * n)
            sids_all.extend(sids if sids is not None else array("i", [-1]) * n)
            any_sids = any_sids or sids is not None
            pids_all.extend(pids if pids is not None else array("i", [-1]) * n)
            any_pids = any_pids or pids is not None
            fwd_all.extend(fsids if fsids is not None else array("i", [-1]) * n)
            any_fwd = any_fwd or fsids is not None
        self._charge(4 * n_all * (any_sids + any_pids + any_fwd))
        codes = self._acts.pack(acts_all)                               # one byte a row
        if UNKNOWN_CODE in codes:
            for j, c in enumerate(codes):
                if c == UNKNOWN_CODE:
                    rows.unknown[base + j] = str(self._get(_get_index(acts_all[j]), -1))[:100]
        at = 0
        for shape, _, n, _ in runs:               # a field a run's layout lacks, where its actions need it
            g = shape.groups
            for name in ("addr", "size", "stream"):
                if g.get(name) is None and (name != "addr" or g.get("device_free") is None):
                    for j in range(at, at + n):
                        c = codes[j]
                        if name in NEEDS.get(c, ()) or (name == "addr" and "device_free" in NEEDS.get(c, ())):
                            raise PickleRefused(f"trace entry {base + j} ({ACTIONS[c]}): '{name}' is missing")
            at += n
        for name, col in (("addr", rows.addrs), ("size", rows.sizes), ("stream", rows.streams)):
            column = self.columns[name]
            raws = cols_all[name]
            try:
                data = column.pack(raws)
            except _OutOfRange:
                j = next(j for j, raw in enumerate(raws) if not 0 <= _int_of(raw) < column.limit)
                what = "a whole number of bytes" if name == "size" else "a whole number"
                fname = "device_free" if name == "addr" and codes[j] == OOM_CODE else name
                raise PickleRefused(f"trace entry {base + j} ({self._action_name(codes[j], acts_all[j])}): "
                                    f"'{fname}' must be {what} in [0, {column.limit:#x}), got {_int_of(raws[j])}") from None
            col.frombytes(data)
        rows.codes.frombytes(codes)
        if any_sids:
            rows.add_stacks(sids_all)
        if any_pids:
            rows.add_pools(pids_all)
        if any_fwd:
            rows.add_fwd(fwd_all)

    def _action_name(self, code: int, raw: bytes) -> str:
        return ACTIONS[code] if code < len(ACTIONS) else str(self._get(_get_index(raw), -1))[:40]


class _Acts(dict):
    """Memo-reference opcode bytes of an action string -> its code, as one byte."""

    def __init__(self, reader: "Reader") -> None:
        super().__init__()
        self.reader = reader

    def __missing__(self, raw: bytes) -> bytes:
        v = self.reader._get(_get_index(raw), -1)
        if type(v) is not str:
            raise PickleRefused(f"a trace entry whose action is not a string ({_short(v)})")
        code = self[raw] = bytes([ACTION_CODE.get(v, UNKNOWN_CODE)])
        return code

    def pack(self, raws: list[bytes]) -> bytes:
        """The codes of ``raws``, joined. Where all are one-byte memo references (``h`` and
        the index), the index bytes are translated through a table of the indices the batch
        uses, each looked up once, in the order they first appear (so that a bad one is the
        one a lookup per reference meets first)."""
        n = len(raws)
        joined = b"".join(raws)
        if n and len(joined) == 2 * n and joined[0::2] == b"h" * n:
            indices = joined[1::2]
            table = bytearray(256)
            for i in dict.fromkeys(indices):
                table[i] = self[b"h" + bytes([i])][0]
            return indices.translate(table)
        return b"".join(map(self.__getitem__, raws))


class _Pools(dict):
    """The two integer opcodes of a new pool_id tuple -> its index in the pool table."""

    def __init__(self, reader: "EntryReader") -> None:
        super().__init__()
        self.reader = reader

    def __missing__(self, raw: bytes) -> int:
        first = _INT_RE_ONE.match(raw)
        a, b = _int_of(first.group()), _int_of(raw[first.end():])
        if not (0 <= a < ADDR_LIMIT and 0 <= b < ADDR_LIMIT):
            raise PickleRefused(f"a trace entry's 'pool_id' must be two whole numbers, got ({a}, {b})")
        i = self[raw] = self.reader._pool_index((a, b))
        return i


class _PoolRefs(dict):
    """A memo reference to a pool_id tuple read before -> its index in the pool table."""

    def __init__(self, reader: "EntryReader") -> None:
        super().__init__()
        self.reader = reader

    def __missing__(self, raw: bytes) -> int:
        v = self.reader._get(_get_index(raw), -1)
        if type(v) is not tuple or len(v) != 2 or not all(type(x) is int and 0 <= x < ADDR_LIMIT for x in v):
            raise PickleRefused(f"a trace entry's 'pool_id' must be two whole numbers, got {_short(v)}")
        i = self[raw] = self.reader._pool_index((v[0], v[1]))
        return i


class _Stacks(dict):
    """The items of a frames list (memo references to frame dicts) -> a stack id."""

    def __init__(self, reader: "Reader") -> None:
        super().__init__()
        self.reader = reader
        self[None] = -2                  # an optional list (forward_frames) a matched entry does not have

    def __missing__(self, raw: bytes) -> int:
        frames = [self.reader._get(_get_index(t), -1) for t in _GETS_RE.findall(raw, 1 if raw[:1] == b"(" else 0)]
        sid = self[raw] = self.reader._stack_id_of(frames) if frames else -1
        return sid


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


class _RowTuple(tuple):
    """A trace entry read opcode by opcode, waiting to be appended to its Rows."""

    def __new__(cls, action: str, addr: Any, size: Any, stream: Any, sid: int, d: dict) -> "_RowTuple":
        return tuple.__new__(cls, (action, addr, size, stream, sid, d))

    action = property(lambda self: self[0])
    addr = property(lambda self: self[1])
    size = property(lambda self: self[2])
    stream = property(lambda self: self[3])
    sid = property(lambda self: self[4])
    d = property(lambda self: self[5])


_INT_RE_ONE = re.compile(_INT_RE, re.DOTALL)
_GETS_RE = re.compile(rb"(?:h.|j....)", re.DOTALL)


def _get_index(raw: bytes) -> int:
    return raw[1] if raw[0] == 0x68 else _U4(raw, 1)[0]


def loads(data: bytes, *, budget_bytes: int, max_rows: int = 50_000_000, max_depth: int = 10_000) -> Any:
    """Read one pickle. Raises :class:`PickleRefused` (code, malformed data, a limit)."""
    return Reader(data, budget_bytes=budget_bytes, max_rows=max_rows, max_depth=max_depth).load()


__all__ = ["Reader", "loads"]
