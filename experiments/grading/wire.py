"""Answers as plain data: the only form in which anything crosses out of a sandbox.

Plain data is JSON: ``None``, booleans, numbers, strings, lists, and dicts with string keys
(non-finite floats as JSON's ``NaN`` / ``Infinity`` extension). No pickles, no tags that
mean code: nothing here ever builds an object other than those. Everything that arrives
from a sandbox is checked by :func:`loads` (size) and :func:`check_plain` (types, depth,
number of items, string and integer sizes) before any check sees it.

Both sides use this module: the kernel side (:mod:`.capture`) and the harness in a sandbox
turn values into plain data with :func:`to_plain`; the grader reads them back with
:func:`loads` and :func:`parse_answers`. It imports nothing but the standard library, so
the kernel loads it cheaply.
"""
from __future__ import annotations

import json
import math
import numbers
from typing import Any, Mapping

MIME = "application/vnd.cuda-memlab.answers+json"

MAX_DEPTH = 12           # nesting of lists and dicts
MAX_ITEMS = 20_000       # items in one list or dict
MAX_STRING = 200_000     # characters in one string (a function's source fits)
MAX_INT = 2**63          # |int| below this: a check compares numbers, not arbitrarily long ones
MAX_RECORD_BYTES = 1 << 20   # one exercise's answers, as JSON text
MAX_FUNCTION_DEPTH = 6       # helper functions of helper functions


class WireError(ValueError):
    """Data from a sandbox that is not the plain data it should be (malformed, or too large)."""


class NotPlain(TypeError):
    """A value with no plain-data form (a tensor, an object)."""


class NotData:
    """A submitted answer that was not plain data: it shows as its type's name and equals
    nothing, so every check rejects it as the wrong type.

    ``type_name`` is sanitized (letters, digits, ``._``; at most 60 characters): it is text the
    student controls."""

    def __init__(self, type_name: str) -> None:
        self.type_name = "".join(ch for ch in str(type_name) if ch.isalnum() or ch in "._")[:60] or "object"

    def __repr__(self) -> str:
        return f"<{self.type_name} (not plain data)>"

    def __eq__(self, other: object) -> bool:
        return False

    __hash__ = None  # type: ignore[assignment]


def to_plain(value: Any, depth: int = 0) -> Any:
    """``value`` as plain data: tuples become lists, NumPy scalars numbers.

    Raises:
        NotPlain: a value (or a part of it) with no plain form, or one over the limits.
    """
    if depth > MAX_DEPTH:
        raise NotPlain("nested too deeply")
    if value is None or isinstance(value, bool):
        return bool(value) if value is not None else None
    if isinstance(value, str):
        if len(value) > MAX_STRING:
            raise NotPlain("str (too long)")
        return str.__str__(value)  # a str subclass's own __str__ is not asked
    if isinstance(value, numbers.Integral):
        v = int(value)
        if abs(v) >= MAX_INT:
            raise NotPlain("int (too large)")
        return v
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, (list, tuple)):
        if len(value) > MAX_ITEMS:
            raise NotPlain(f"{type(value).__name__} (too long)")
        return [to_plain(v, depth + 1) for v in value]
    if isinstance(value, Mapping):
        if len(value) > MAX_ITEMS:
            raise NotPlain("dict (too long)")
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise NotPlain("dict with a key that is not a string")
            out[str(k)] = to_plain(v, depth + 1)
        return out
    raise NotPlain(type(value).__name__)


def dumps(obj: Any) -> str:
    """Plain data as compact JSON text (``NaN`` and ``Infinity`` allowed)."""
    return json.dumps(obj, separators=(",", ":"), allow_nan=True)


def loads(text: str | bytes, *, max_bytes: int = MAX_RECORD_BYTES) -> Any:
    """JSON text from a sandbox, size-checked first and then checked as plain data.

    Raises:
        WireError: over ``max_bytes``, not JSON, or not plain data.
    """
    if isinstance(text, bytes):
        if len(text) > max_bytes:
            raise WireError(f"larger than {max_bytes} bytes")
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise WireError("not UTF-8 text") from None
    if not isinstance(text, str):
        raise WireError(f"expected JSON text, got {type(text).__name__}")
    if len(text) > max_bytes:
        raise WireError(f"larger than {max_bytes} bytes")
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, int too long, nested too deep
        raise WireError(f"not JSON ({type(e).__name__})") from None
    check_plain(obj)
    return obj


def check_plain(obj: Any, depth: int = 0) -> None:
    """Raise :class:`WireError` unless ``obj`` is plain data within the limits."""
    if depth > MAX_DEPTH:
        raise WireError("nested too deeply")
    if obj is None or isinstance(obj, bool):
        return
    if isinstance(obj, int):
        if abs(obj) >= MAX_INT:
            raise WireError("an integer too large")
        return
    if isinstance(obj, float):
        return
    if isinstance(obj, str):
        if len(obj) > MAX_STRING:
            raise WireError("a string too long")
        return
    if isinstance(obj, list):
        if len(obj) > MAX_ITEMS:
            raise WireError("a list too long")
        for v in obj:
            check_plain(v, depth + 1)
        return
    if isinstance(obj, dict):
        if len(obj) > MAX_ITEMS:
            raise WireError("a dict too long")
        for k, v in obj.items():
            if not isinstance(k, str):
                raise WireError("a dict key that is not a string")
            check_plain(v, depth + 1)
        return
    raise WireError(f"a {type(obj).__name__}, which is not plain data")


# ----------------------------------------------------------------------------- answers

def _field(obj: Any, key: str, kind: type, where: str) -> Any:
    if not isinstance(obj, dict) or key not in obj or not isinstance(obj[key], kind):
        raise WireError(f"{where}: no {key!r} of type {kind.__name__}")
    return obj[key]


def check_function_record(record: Any, depth: int = 0) -> dict[str, Any]:
    """A function answer's record, checked: ``{"name": str, "source": str, "globals": {name:
    entry}}``, each entry ``{"module": name}``, ``{"import": [module, qualified name]}``,
    ``{"function": record}`` or ``{"value": plain data}``. The grader never runs it; only a
    harness in a sandbox does (:mod:`.harness`).

    Raises:
        WireError: any other shape.
    """
    if depth > MAX_FUNCTION_DEPTH:
        raise WireError("helper functions nested too deeply")
    name = _field(record, "name", str, "function")
    _field(record, "source", str, "function")
    globs = _field(record, "globals", dict, "function")
    if not name.isidentifier() and name != "<lambda>":
        raise WireError("function: its name is not an identifier")
    for g, entry in globs.items():
        if not g.isidentifier() or not isinstance(entry, dict) or len(entry) != 1:
            raise WireError(f"function: global {g[:40]!r} is malformed")
        (kind, value), = entry.items()
        if kind == "module":
            if not (isinstance(value, str) and all(p.isidentifier() for p in value.split("."))):
                raise WireError("function: a module name is malformed")
        elif kind == "import":
            if not (isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value)):
                raise WireError("function: an import is malformed")
        elif kind == "function":
            check_function_record(value, depth + 1)
        elif kind != "value":
            raise WireError(f"function: unknown global kind {kind[:20]!r}")
    return record


class FunctionAnswer:
    """A function submitted as an answer, as its checked record (source and the globals it
    uses). It is only data here; a harness in a sandbox rebuilds and runs it."""

    def __init__(self, record: dict[str, Any]) -> None:
        self.record = record

    @property
    def name(self) -> str:
        return self.record["name"]

    def __repr__(self) -> str:
        return f"<function {self.name} (submitted)>"


def parse_answers(text: str | bytes, label: str, names: tuple[str, ...]) -> dict[str, Any]:
    """One exercise's answers as the kernel side sent them: ``{"label": label, "answers":
    {name: entry}}``, each entry ``{"value": plain data}``, ``{"function": record}``,
    ``{"not_data": type name}`` or ``{"raised": exception type name}``.

    Returns:
        {name: value}: plain data, :class:`FunctionAnswer`, :class:`NotData`, or a
        :class:`Raised` for an answer whose expression raised.

    Raises:
        WireError: malformed, too large, for another exercise, or missing an answer.
    """
    obj = loads(text)
    if not isinstance(obj, dict) or obj.get("label") != label:
        raise WireError("the answers are not this exercise's")
    answers = _field(obj, "answers", dict, "answers")
    out: dict[str, Any] = {}
    for name in names:
        entry = answers.get(name)
        if not isinstance(entry, dict) or len(entry) != 1:
            raise WireError(f"the answer {name} is malformed")
        (kind, value), = entry.items()
        if kind == "value":
            out[name] = value
        elif kind == "function":
            out[name] = FunctionAnswer(check_function_record(value))
        elif kind == "not_data":
            out[name] = NotData(str(value))
        elif kind == "raised":
            out[name] = Raised(str(value))
        else:
            raise WireError(f"the answer {name} is malformed")
    return out


class Raised:
    """An answer whose expression raised when the grader evaluated it (exception type only)."""

    def __init__(self, type_name: str) -> None:
        self.type_name = NotData(type_name).type_name

    def __repr__(self) -> str:
        return f"<raised {self.type_name}>"


def finite(x: Any) -> bool:
    """Whether ``x`` is a finite int or float (not a bool)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
