"""Kernel side: the cell the grader adds after each exercise's check cell calls :func:`capture`.

It evaluates the check call's answer expressions in the student's kernel and shows them as
one display output of type :data:`~.wire.MIME`: JSON text of plain data only
(:mod:`.wire`). A function answer travels as its source code and the globals it uses
(modules by name, imports by module and name, helper functions, plain values), never as an
object: the grader only hands that record to a harness in a fresh sandbox.

This runs inside the student's kernel, which the student controls: they can rebind it, or
display anything they like. That is harmless by design. What leaves the sandbox is only
ever checked plain data, scored by the grader's own check in its own process, so the most a
student can do through this channel is choose an answer, as they could by typing it.
"""
from __future__ import annotations

import inspect
import json
import textwrap
import types
from typing import Any, Callable, Mapping

from .wire import MAX_FUNCTION_DEPTH, MIME, NotPlain, to_plain


def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names) | set(code.co_freevars)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def function_record(fn: types.FunctionType, depth: int = 0) -> dict[str, Any]:
    """``{"name", "source", "globals"}`` for a function defined in the notebook.

    Raises:
        NotPlain: no source can be found, or helpers nested too deeply.
    """
    if depth > MAX_FUNCTION_DEPTH:
        raise NotPlain("function (helpers nested too deeply)")
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        raise NotPlain("function (no source)") from None
    scope = dict(fn.__globals__)
    if fn.__closure__:
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__):
            try:
                scope[name] = cell.cell_contents
            except ValueError:  # an empty cell
                pass
    globs: dict[str, Any] = {}
    for name in sorted(_code_names(fn.__code__)):
        if name not in scope:
            continue  # a builtin or an attribute name
        value = scope[name]
        if isinstance(value, types.ModuleType):
            globs[name] = {"module": value.__name__}
        elif isinstance(value, types.FunctionType) and value.__module__ in ("__main__", None):
            if value is not fn:
                try:
                    globs[name] = {"function": function_record(value, depth + 1)}
                except NotPlain:
                    pass
        elif callable(value) and isinstance(getattr(value, "__module__", None), str) \
                and value.__module__ != "__main__" and isinstance(getattr(value, "__qualname__", None), str):
            globs[name] = {"import": [value.__module__, value.__qualname__]}
        else:
            try:
                globs[name] = {"value": to_plain(value)}
            except NotPlain:
                pass  # not carried: the rebuilt function raises NameError if it needs it
    return {"name": fn.__name__, "source": source, "globals": globs}


def encode_answer(value: Any) -> dict[str, Any]:
    """One answer as its wire entry: ``{"value": plain}``, ``{"function": record}`` or
    ``{"not_data": type name}``."""
    if isinstance(value, types.FunctionType):
        try:
            return {"function": function_record(value)}
        except NotPlain as e:
            return {"not_data": f"function ({e})"[:60]}
    try:
        return {"value": to_plain(value)}
    except NotPlain as e:
        return {"not_data": str(e)}


def capture(label: str, thunks: Mapping[str, Callable[[], Any]]) -> None:
    """Evaluate each answer expression and display the answers as one :data:`MIME` output."""
    from IPython.display import display

    answers: dict[str, Any] = {}
    for name, thunk in thunks.items():
        try:
            answers[name] = encode_answer(thunk())
        except Exception as e:  # the student's expression: recorded, the others still read
            answers[name] = {"raised": type(e).__name__}
    text = json.dumps({"label": label, "answers": answers}, separators=(",", ":"), allow_nan=True)
    display({MIME: text}, raw=True)
