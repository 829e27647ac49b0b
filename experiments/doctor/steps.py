"""Long loops run in steps, each resumed from C.

In the browser the doctor runs on Pyodide, CPython compiled to WebAssembly. The browser's
engine (V8) first runs the interpreter's code as compiled by its fast baseline compiler and
compiles the hot functions again, optimized, in the background; a function takes up its
optimized code only when it is next called, never in the middle of a call. Since Python 3.11
a call from Python to Python stays inside the interpreter function's running invocation, so a
replay or a what-if (hundreds of thousands of requests in one loop) would run entirely on the
baseline code it started with: on the 450,888-event trace in chromium, about 2.3 s for each
instead of 1.7 s with the optimized code from the start (``--js-flags=--no-liftoff``).

So those loops are generators that yield every :data:`STEP` requests, and :func:`run_steps`
resumes them from C: each resumption is a new call of the interpreter function, which takes up
the optimized code as soon as it is ready. Under CPython this costs one test per request and
a resumption per step, nothing measurable.
"""
from __future__ import annotations

from collections import deque
from typing import Any, Generator

STEP = 1 << 13                     # requests between two resumptions (a power of two)
STEP_MASK = STEP - 1               # the loops yield where index & STEP_MASK == 0


def run_steps(steps: Generator[None, None, Any]) -> Any:
    """Run the generator ``steps`` to its end, resuming it from C; returns what it returns."""
    out: list[Any] = []

    def keep() -> Generator[None, None, None]:
        out.append((yield from steps))

    deque(keep(), maxlen=0)        # a C loop: each step is a new call of the interpreter
    return out[0]


__all__ = ["STEP", "STEP_MASK", "run_steps"]
