"""How far :func:`~experiments.doctor.answers.report.doctor` has got: the steps it reports to a
progress hook, each finished one with its result, so that a caller (the command line, the page's
worker) can say what is running and show each answer as soon as it is ready.

The steps, in order (``stage``; each reported when it starts, ``done=False``, and when it ends,
``done=True`` with ``result`` and ``seconds``):

* ``read``: the snapshot read and checked; result: the
  :class:`~experiments.doctor.reading.trace.Trace`;
* ``replay``: the exact replay; result: its :class:`~experiments.doctor.replaying.run.Run`;
* ``what_if``: each of the caller's what-ifs, ``index`` 0 to ``count - 1`` in the order given,
  ``settings`` its text; result: its Run;
* ``report``: the replay and the what-ifs are ready (``done=True`` only); result: the
  :class:`~experiments.doctor.answers.report.Report`, whose ``suggestion`` and ``oom`` are
  still None: they follow, and the same object is completed;
* ``grid``: each setting of the suggestion's grid (with ``--suggest``, or to explain an
  out-of-memory error), ``index`` from 0 in the order they are run, ``count`` the settings known
  so far (the single settings first, then their combinations), ``settings`` its text; result:
  its Run;
* ``oom``: the explanation of the first out-of-memory error, if the trace has one; result: its dict;
* ``done``: result: the finished Report (``done=True`` only).

Where the what-ifs or the grid run in processes of their own (``workers``), only their ``done``
steps are reported, in order, as they finish. A hook that raises stops the doctor there: the
exception comes out of ``doctor()`` unchanged (the grid's processes are stopped), and what was
reported before it stays valid. That is how a caller cancels, for example the grid after the
report is shown.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

STAGES = ("read", "replay", "what_if", "report", "grid", "oom", "done")


@dataclasses.dataclass(frozen=True)
class Step:
    """One step of the doctor, started or done (see the module docstring).

    Attributes:
        stage: one of :data:`STAGES`.
        done: False when the step starts, True when it ended.
        index, count: which what-if or grid setting (0-based) of how many (0 for the others).
        settings: the what-if's or grid setting's ``PYTORCH_CUDA_ALLOC_CONF`` text, else None.
        result: what the step made (done steps only; see the module docstring).
        seconds: how long the step took (done steps only).
    """

    stage: str
    done: bool
    index: int = 0
    count: int = 0
    settings: str | None = None
    result: Any = None
    seconds: float = 0.0


class Progress:
    """Reports steps to a hook (``hook(step)``; None reports nothing) and times them."""

    def __init__(self, hook: Callable[[Step], Any] | None = None) -> None:
        self.hook = hook

    def start(self, stage: str, index: int = 0, count: int = 0, settings: str | None = None) -> float:
        """Report that a step starts; returns the clock to give :meth:`done`."""
        if self.hook is not None:
            self.hook(Step(stage, False, index, count, settings))
        return time.perf_counter()

    def done(self, stage: str, result: Any, *, since: float | None = None, seconds: float = 0.0, index: int = 0,
             count: int = 0, settings: str | None = None) -> None:
        """Report that a step ended with ``result`` (its time: since the clock ``since``, or ``seconds``)."""
        if self.hook is not None:
            took = time.perf_counter() - since if since is not None else seconds
            self.hook(Step(stage, True, index, count, settings, result, took))


__all__ = ["STAGES", "Progress", "Step"]
