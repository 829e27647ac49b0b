"""A restricted, bounded reader of ``torch.cuda.memory._dump_snapshot`` pickles that runs no code.

``pickle.load`` runs whatever callable a file names (``os.system`` included): a reader's
snapshot is untrusted input. This module interprets the pickle opcodes itself and accepts
only those that build plain data (None, bools, numbers, strings, bytes, lists, tuples,
dicts, sets) for protocols 0 to 5; an opcode that names a class or a function (``GLOBAL``,
``STACK_GLOBAL``, ``REDUCE``, ``BUILD``, ``INST``, ``OBJ``, ``NEWOBJ``, extensions,
persistent ids, out-of-band buffers) stops the reading with :class:`PickleRefused` before
anything is called. Every object it builds is charged to a byte budget, checked before the
object is made, and the mark stack has a depth limit.

Trace entries (the dicts of ``device_traces[d]``) are not kept as dicts: each becomes one row
of a :class:`experiments.doctor.entries.Rows` table, and runs of entries of a layout seen
before are matched in C (:mod:`experiments.doctor.entries`).

Opcode semantics follow ``Lib/pickle.py`` and ``Lib/pickletools.py`` (CPython 3.11).
"""
from __future__ import annotations

import codecs
import struct
from typing import Any

from .entries import (_COST_CONTAINER, _COST_ITEM, _COST_OBJ, _MARK, _U4, EntryReader, PickleRefused,
                      _RowTuple)


_I4 = struct.Struct("<i").unpack_from
_Q8 = struct.Struct("<Q").unpack_from
_D8 = struct.Struct(">d").unpack_from
_REFUSED = {
    0x63: "GLOBAL", 0x93: "STACK_GLOBAL", 0x52: "REDUCE", 0x62: "BUILD", 0x69: "INST", 0x6f: "OBJ",
    0x81: "NEWOBJ", 0x92: "NEWOBJ_EX", 0x82: "EXT1", 0x83: "EXT2", 0x84: "EXT4", 0x50: "PERSID",
    0x51: "BINPERSID", 0x97: "NEXT_BUFFER", 0x98: "READONLY_BUFFER",
}


class Reader(EntryReader):
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
        self.max_depth = max_depth
        self.max_rows = max_rows
        self.memo: list[Any] = []
        self.proto = 0
        self._init_entries()

    # -- budget
    def _charge(self, nbytes: int) -> None:
        self.budget -= nbytes
        if self.budget < 0:
            raise PickleRefused("the pickle builds more objects than a memory snapshot of this size holds "
                                "(over the reading budget; raise max_bytes if the snapshot is real)")

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

def loads(data: bytes, *, budget_bytes: int, max_rows: int = 50_000_000, max_depth: int = 10_000) -> Any:
    """Read one pickle. Raises :class:`PickleRefused` (code, malformed data, a limit)."""
    return Reader(data, budget_bytes=budget_bytes, max_rows=max_rows, max_depth=max_depth).load()
