"""Answers on their way from a student's kernel to the grader, as JSON (never pickle).

Three parts, used by :mod:`experiments.core.grading`:

* :func:`capture` runs inside the notebook's kernel, in a cell the grader adds after each
  exercise's check cell. It evaluates the answer expressions of the check call and
  shows them as one display output of type :data:`MIME`, which nbclient keeps in the
  executed notebook. Values become tagged JSON (:func:`encode`); a function becomes its
  source code plus the modules and plain values it uses from the notebook's globals.
* :func:`decode` turns that JSON back into Python values in the grader. Code is
  rebuilt only where ``allow_code`` is true, which the grader sets only in
* the scoring subprocess (``python -m experiments.core.grading_answers``): a fresh Python
  that rebuilds the student's functions from their source, calls the installed
  package's check with them and prints the verdict as JSON. So neither a check that the
  notebook redefined nor anything else in its namespace reaches the score.

Values that have no JSON form (a tensor, an object) arrive as :class:`Opaque`, which
every check rejects as the wrong type.
"""
from __future__ import annotations

import builtins
import importlib
import inspect
import json
import linecache
import math
import numbers
import sys
import textwrap
import types
from typing import Any, Callable, Mapping

MIME = "application/vnd.cuda-memlab.answers+json"
RESULT_MARK = "MEMLAB-GRADE-RESULT "
_MAX_DEPTH = 8
_MAX_ITEMS = 10_000


class Opaque:
    """A submitted value without a JSON form: shows as the student's repr, equals nothing."""

    def __init__(self, type_name: str, text: str) -> None:
        self.type_name, self.text = type_name, text

    def __repr__(self) -> str:
        return self.text


# ----------------------------------------------------------------------------- kernel side

def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def _function(fn: types.FunctionType, seen: set[int], depth: int) -> dict[str, Any]:
    src = textwrap.dedent(inspect.getsource(fn))
    globs: dict[str, Any] = {}
    for name in sorted(_code_names(fn.__code__)):
        if name not in fn.__globals__:
            continue  # a builtin or an attribute name
        value = fn.__globals__[name]
        if isinstance(value, types.ModuleType):
            globs[name] = {"$": "module", "name": value.__name__}
        elif isinstance(value, types.FunctionType) and value.__module__ == "__main__":
            if id(value) not in seen:  # a helper the student wrote: its source too
                seen.add(id(value))
                globs[name] = _function(value, seen, depth + 1)
        elif callable(value) and getattr(value, "__module__", None) not in (None, "__main__") \
                and hasattr(value, "__qualname__"):
            globs[name] = {"$": "import", "module": value.__module__, "name": value.__qualname__}
        else:
            encoded = encode(value, depth + 1)
            if not (isinstance(encoded, dict) and encoded.get("$") == "other"):
                globs[name] = encoded
    return {"$": "function", "name": fn.__name__, "source": src, "globals": globs}


def encode(value: Any, depth: int = 0) -> Any:
    """Tagged JSON for ``value``: JSON scalars as they are, containers and the rest as
    ``{"$": kind, ...}`` objects (so a plain JSON object never means a dict)."""
    if depth > _MAX_DEPTH:
        return {"$": "other", "type": type(value).__name__, "repr": "(nested too deeply)"}
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):  # float, NumPy floats
        v = float(value)
        return v if math.isfinite(v) else {"$": "float", "v": repr(v)}
    if isinstance(value, (list, tuple)) and len(value) <= _MAX_ITEMS:
        return {"$": type(value).__name__ if type(value) in (list, tuple) else "list",
                "v": [encode(v, depth + 1) for v in value]}
    if isinstance(value, Mapping) and len(value) <= _MAX_ITEMS:
        return {"$": "dict", "v": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    if isinstance(value, types.FunctionType):
        try:
            return _function(value, {id(value)}, depth)
        except (OSError, TypeError) as e:  # no source (built in a way inspect cannot follow)
            return {"$": "other", "type": "function", "repr": f"<function {value.__name__}: no source ({e})>"}
    return {"$": "other", "type": type(value).__name__, "repr": repr(value)[:300]}


def capture(label: str, thunks: Mapping[str, Callable[[], Any]]) -> None:
    """Kernel side: evaluate each answer expression and show the answers as one
    :data:`MIME` display output. An expression that raises is recorded as raised."""
    from IPython.display import display

    answers: dict[str, Any] = {}
    for name, thunk in thunks.items():
        try:
            answers[name] = {"value": encode(thunk())}
        except Exception as e:  # the student's expression: report it, keep the others
            answers[name] = {"raised": f"{type(e).__name__}: {e}"[:300]}
    display({MIME: {"label": label, "answers": answers}}, raw=True)


# ----------------------------------------------------------------------------- grader side

def has_code(obj: Any) -> bool:
    """Whether an encoded answer holds a function or a module (scored in the subprocess)."""
    if isinstance(obj, dict):
        return obj.get("$") in ("function", "module", "import") or any(has_code(v) for v in obj.values())
    if isinstance(obj, list):
        return any(has_code(v) for v in obj)
    return False


def _build_function(obj: Mapping[str, Any], ns: dict[str, Any]) -> Callable[..., Any]:
    for name, g in obj["globals"].items():
        if isinstance(g, dict) and g.get("$") == "function":
            ns[name] = _build_function(g, ns)
        else:
            ns[name] = decode(g, allow_code=True, ns=ns)
    filename = f"<answer {obj['name']}>"
    # inspect.getsource must find it (the sync-free check reads the source)
    linecache.cache[filename] = (len(obj["source"]), None, obj["source"].splitlines(True), filename)
    before = {k: id(v) for k, v in ns.items()}
    exec(compile(obj["source"], filename, "exec"), ns)  # noqa: S102 - only in the scoring subprocess
    if obj["name"] != "<lambda>" and callable(ns.get(obj["name"])):
        return ns[obj["name"]]
    new = [v for k, v in ns.items() if isinstance(v, types.FunctionType) and before.get(k) != id(v)]
    if not new:
        raise ValueError(f"could not rebuild the function {obj['name']!r} from its source")
    return new[-1]


def decode(obj: Any, *, allow_code: bool = False, ns: dict[str, Any] | None = None) -> Any:
    """Python values from :func:`encode`'s JSON.

    Raises:
        ValueError: a function, module or import while ``allow_code`` is false, or a
            malformed object.
    """
    if not isinstance(obj, dict):
        if isinstance(obj, list):
            raise ValueError("malformed answer: a bare JSON list")
        return obj
    kind = obj.get("$")
    if kind == "float":
        return float(obj["v"])
    if kind in ("list", "tuple"):
        items = [decode(v, allow_code=allow_code, ns=ns) for v in obj["v"]]
        return items if kind == "list" else tuple(items)
    if kind == "dict":
        out = {}
        for k, v in obj["v"]:
            key = decode(k, allow_code=allow_code, ns=ns)
            try:
                out[key] = decode(v, allow_code=allow_code, ns=ns)
            except TypeError:  # an unhashable key: the dict is not one a check takes
                return Opaque("dict", "<a dict with unhashable keys>")
        return out
    if kind == "other":
        return Opaque(str(obj.get("type")), str(obj.get("repr")))
    if kind in ("module", "import", "function") and not allow_code:
        # importing or running what a submission names happens in the scoring subprocess only
        raise ValueError(f"a {kind} in an answer is scored in the scoring subprocess only")
    if kind == "module":
        return importlib.import_module(obj["name"])
    if kind == "import":
        value: Any = importlib.import_module(obj["module"])
        for part in obj["name"].split("."):
            value = getattr(value, part)
        return value
    if kind == "function":
        space = ns if ns is not None else {"__name__": "__answer__", "__builtins__": builtins}
        return _build_function(obj, space)
    raise ValueError(f"malformed answer: unknown kind {kind!r}")


def _main() -> int:
    """Scoring subprocess: JSON {"label", "answers"} on stdin -> one result line on stdout."""
    from . import registry
    from .checks import EXERCISES

    request = json.loads(sys.stdin.read())
    out = sys.stdout
    sys.stdout = sys.stderr  # whatever the student's code prints stays out of the result line
    try:
        registry.load_chapters()
        ex = EXERCISES[request["label"]]
        ns: dict[str, Any] = {"__name__": "__answer__", "__builtins__": builtins}
        answers = {k: decode(v, allow_code=True, ns=ns) for k, v in request["answers"].items()}
        fb = ex.check(**answers)
        result = {"correct": fb.correct, "message": fb.message,
                  "wrong_parts": [str(p) for p in fb.details.get("wrong_parts", [])]}
    except Exception as e:  # the student's code or its rebuild: an error row, not a crash
        result = {"error": f"{type(e).__name__}: {e}"[:300]}
    out.write(RESULT_MARK + json.dumps(result) + "\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(_main())
