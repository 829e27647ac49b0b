"""Grade a class's notebooks: each submission runs in its own sandbox; every verdict is the
grader's own check, in the grader's process, on plain data.

For one submission (:meth:`Grader.grade_notebook`), within one time limit that covers
everything:

1. the file is read only if it is a regular file within the size limit, and its check
   cells are found (:mod:`.notebooks`); a submission that cannot be read gets one row,
   ``unreadable``;
2. its code cells run top to bottom in a fresh kernel inside a sandbox
   (:mod:`.sandbox`, :mod:`.runner`), with one capture cell after each check cell
   (:mod:`.capture`); what comes back is checked plain data (:mod:`.wire`);
3. each answer is scored by the installed package's check in the grader's process; an
   answer that is a function is run by its exercise's harness in a fresh sandbox of its own
   (:mod:`.harness`), and the exercise's judge gives the verdict on the data it returns.

Statuses: ``correct``, ``wrong``, ``unanswered`` (the check's ``None``), ``missing`` (no
check cell, or its check call gone), ``error`` (its cell raised, its answers could not be
read, the kernel crashed, or the grader failed: the feedback says which), ``timeout`` (the
time limit ran out first), ``memory`` (its cell ran out of memory), ``output limit`` (the
notebook printed more than allowed first), ``killed`` (the sandbox's processes were killed
first, by the student's code or a signal), ``unreadable`` (the submission itself), and
``needs_gpu`` (an exercise that runs the student's code on a GPU, graded only with
``live=True``; 0 of 0 points otherwise).

Why not otter-grader (7.0) or nbgrader (0.9): both score with test code that runs in the
student's executed kernel (where a redefined check would answer), and each needs its own
assignment format (otter's assign notebooks and test files, whose results travel as
pickles; nbgrader's course directory, database and exchange). The book already runs
notebooks with nbclient, so the layer here is that, a sandbox, and scoring.
"""
from __future__ import annotations

import concurrent.futures
import csv
import dataclasses
import io
import json
import os
import secrets
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import nbformat

from ..core.checks import Exercise, Feedback, ReportError, graded_feedback
from ..core.files import write_atomic  # noqa: F401  (the grades file: one home for atomic writes)
from . import wire
from .notebooks import (Plan, Unreadable, clean_text, display_name, find_notebooks, notebook_chapter,
                        notebook_exercises, plan, read_notebook)
from .sandbox import Limits, Outcome, Sandbox, request_bytes, rlimits

STATUSES = ("correct", "wrong", "unanswered", "missing", "error", "timeout", "memory", "output limit", "killed",
            "unreadable", "needs_gpu")
COLUMNS = ("notebook", "chapter", "exercise", "score", "max_score", "status", "feedback")
TOTAL = "total"
SETUP = "import experiments.grading.capture as _memlab_grader"
RUNNER = os.path.join(os.path.dirname(os.path.realpath(__file__)), "runner.py")
HARNESS = "experiments.grading.harness"


@dataclasses.dataclass(frozen=True)
class Row:
    """One line of the grades: an exercise of a notebook, or its total (``exercise='total'``,
    empty status, or ``unreadable``). ``chapter``: the chapter the notebook is graded on
    (None when it could not be read). Points are floats; ``feedback`` is one line."""

    notebook: str
    chapter: int | None
    exercise: str
    score: float
    max_score: float
    status: str
    feedback: str

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _text(value: Any, limit: int = 160) -> str:
    """Student-controlled text for a row: one line, printable, bounded."""
    s = " ".join(str(value).split())
    s = clean_text("".join(ch for ch in s if ch.isprintable()))
    return s[:limit] + ("..." if len(s) > limit else "")


def _type_name(e: BaseException | str) -> str:
    """An exception's type name as a row may show it (an identifier, never a message)."""
    name = e if isinstance(e, str) else type(e).__name__
    return "".join(ch for ch in name if ch.isalnum() or ch in "._")[:60] or "Exception"


def _is_memory(error: Mapping[str, str]) -> bool:
    name, value = error.get("ename", ""), error.get("evalue", "")
    return name == "MemoryError" or (name in ("RuntimeError", "OutOfMemoryError")
                                     and ("can't allocate memory" in value or "out of memory" in value.lower()))


def _capture_source(label: str, expressions: Mapping[str, str]) -> str:
    thunks = ", ".join(f"{name!r}: lambda: ({expr}\n)" for name, expr in expressions.items())
    return f"_memlab_grader.capture({label!r}, {{{thunks}}})"


@dataclasses.dataclass
class _Run:
    """What the runner reported about one notebook, read from its event lines."""

    outcome: Outcome
    started: bool = False
    done: bool = False
    setup_error: dict | None = None
    checks: dict[str, dict | None] = dataclasses.field(default_factory=dict)
    answers: dict[str, tuple[list, dict | None]] = dataclasses.field(default_factory=dict)
    stopped: dict | None = None
    garbled: int = 0


def _read_events(outcome: Outcome) -> _Run:
    run = _Run(outcome)
    for line in outcome.lines:
        try:
            ev = wire.loads(line, max_bytes=4 << 20)
        except wire.WireError:
            run.garbled += 1
            continue
        if not isinstance(ev, dict):
            run.garbled += 1
            continue
        kind = ev.get("event")
        err = ev.get("error") if isinstance(ev.get("error"), dict) else None
        if kind == "started":
            run.started = True
        elif kind == "setup":
            run.setup_error = err
        elif kind == "check" and isinstance(ev.get("label"), str):
            run.checks[ev["label"]] = err
        elif kind == "answers" and isinstance(ev.get("label"), str) and isinstance(ev.get("payloads"), list):
            run.answers[ev["label"]] = ([p for p in ev["payloads"] if isinstance(p, str)], err)
        elif kind == "stopped" and run.stopped is None:
            run.stopped = ev
        elif kind == "done":
            run.done = True
    return run


class Grader:
    """Grades notebooks one at a time or several at once (thread-safe), each in a sandbox.

    Args:
        live: run on this machine's GPU (``CUDA_MEMLAB_MODE=live``) and grade the GPU
            exercises too; default recorded mode, which needs no GPU.
        feedback: 'graded' (correct / wrong / which part) or 'full' (the check's message).
        limits: :class:`~.sandbox.Limits` per submission.
        unsafe: run submissions without a sandbox (the instructor's ``--unsafe-no-sandbox``).
        hide: more folders the sandboxes must not see (the submissions', the output's).

    Raises:
        ValueError: an unknown feedback style or limits out of range.
    """

    def __init__(self, *, live: bool = False, feedback: str = "graded", limits: Limits | None = None,
                 unsafe: bool = False, hide: Sequence[str | os.PathLike[str]] = ()):
        if feedback not in ("graded", "full"):
            raise ValueError(f"feedback must be 'graded' or 'full', got {feedback!r}")
        self.live, self.feedback = live, feedback
        self.limits = (limits or Limits()).validate()
        self.sandbox = Sandbox(live=live, hide=hide, unsafe=unsafe)
        self._score_lock = threading.Lock()

    def prepare(self) -> str:
        """Find the sandbox (see :meth:`.sandbox.Sandbox.prepare`); returns its description.

        Raises:
            SandboxUnavailable: no sandbox here, and ``unsafe`` was not given.
        """
        return self.sandbox.prepare()

    def close(self) -> None:
        self.sandbox.close()

    # ------------------------------------------------------------------ one notebook

    def grade_notebook(self, path: str | os.PathLike[str], *, name: str | None = None) -> list[Row]:
        """One row per exercise of the notebook's chapter, then its total; or a single
        ``unreadable`` row. Never raises for anything the submission does; a failure of the
        grader itself becomes an ``error`` row that says so, with its exception's type only
        (never text a submission could have put there), and a traceback on stderr.

        ``name``: the notebook column (default: the path, shown safely, :func:`.notebooks.display_name`)."""
        path = Path(path)
        nb_name = clean_text(name) if name is not None else display_name(path)
        deadline = time.monotonic() + self.limits.timeout_s
        try:
            return self._grade(path, nb_name, deadline)
        except Exception as e:  # our bug: reported as one, for this notebook only
            _print_bug(f"grading {nb_name}")
            return [Row(nb_name, None, TOTAL, 0.0, 0.0, "error",
                        f"the grader failed on this notebook (a bug in the grader, please report it): {_type_name(e)}")]

    def _grade(self, path: Path, nb_name: str, deadline: float) -> list[Row]:
        try:
            nb = read_notebook(path, max_bytes=int(self.limits.notebook_mib) << 20)
            chapter, refused = notebook_chapter(nb)
            exs = notebook_exercises(nb)
        except Unreadable as e:
            return [Row(nb_name, None, TOTAL, 0.0, 0.0, "unreadable", str(e))]
        plans = plan(nb, exs)
        run = self._execute(nb, plans, deadline)
        results: dict[str, tuple[str, str, str]] = {}
        pending: list[tuple[Plan, wire.FunctionAnswer]] = []
        for p in plans:
            got = self._exercise(p, run)
            if isinstance(got, wire.FunctionAnswer):
                pending.append((p, got))
            else:
                results[p.ex.label] = got
        for p, fn in pending:
            results[p.ex.label] = self._function(p.ex, fn, deadline)
        rows = []
        for p in plans:
            status, text, full = results[p.ex.label]
            points = 0.0 if (p.ex.needs_gpu and not self.live) else float(p.ex.points)
            # the check's own message can echo the student's answer: one line, bounded
            shown = _text(full, 1000) if (self.feedback == "full" and full) else text
            rows.append(Row(nb_name, chapter, p.ex.label, points if status == "correct" else 0.0, points, status, shown))
        counts = {s: sum(r.status == s for r in rows) for s in STATUSES}
        summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        if refused:
            summary += (f"; check cells of chapter{'s' if len(refused) > 1 else ''} {', '.join(map(str, refused))} "
                        f"not graded (this notebook is chapter {chapter}'s)")
        stop = self._stop_reason(run)
        if stop:
            summary += f"; stopped early: {stop}"
        rows.append(Row(nb_name, chapter, TOTAL, sum(r.score for r in rows), sum(r.max_score for r in rows), "",
                        summary))
        return rows

    def _execute(self, nb: nbformat.NotebookNode, plans: Sequence[Plan], deadline: float) -> _Run | None:
        """Run the notebook in a sandbox; None when nothing needs running."""
        by_cell = {p.cell: p for p in plans if p.expressions is not None
                   and not (p.ex.needs_gpu and not self.live)}
        if not by_cell:
            return None
        cells = [{"source": SETUP, "role": "setup"}]
        for i, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            p = by_cell.get(i)
            cells.append({"source": cell.source, "role": "check" if p else "student",
                          "label": p.ex.label if p else None})
            if p:
                cells.append({"source": _capture_source(p.ex.label, p.expressions), "role": "capture",
                              "label": p.ex.label})
        seconds = deadline - time.monotonic()
        if seconds < 2:
            return _Run(Outcome([], None, True, False, "", 0.0))
        copy = nbformat.from_dict(nb)
        for cell in copy.cells:
            if cell.cell_type == "code":
                cell.outputs, cell.execution_count = [], None
        request = {"limits": rlimits(self.limits, live=self.live, seconds=seconds), "seconds": seconds - 1,
                   "max_output_bytes": int(self.limits.output_mib) << 20,
                   "copy": {"name": "submission.ipynb", "text": nbformat.writes(copy)}, "cells": cells}
        outcome = self.sandbox.run([RUNNER], request_bytes(request), seconds=seconds, limits=self.limits, module=None)
        return _read_events(outcome)

    def _stop_reason(self, run: _Run | None) -> str:
        if run is None:
            return ""
        if run.stopped:
            why = run.stopped.get("why")
            if why == "timeout":
                return f"the time limit ({self.limits.timeout_s:g} s) ran out"
            if why == "output limit":
                return f"the notebook printed more than {self.limits.output_mib:g} MiB"
            if why == "kernel died":
                sig = run.stopped.get("signal")
                return f"the kernel died{f' (signal {sig})' if isinstance(sig, int) else ''}"
            return _text(why, 60)
        o = run.outcome
        if o.timed_out:
            return f"the time limit ({self.limits.timeout_s:g} s) ran out"
        if o.too_much_output:
            return "the sandbox wrote more than the grader reads"
        if not run.done:
            return f"the sandbox ended unexpectedly (exit status {o.returncode})"
        return ""

    def _unfinished(self, run: _Run) -> tuple[str, str]:
        """(status, feedback) for an exercise the run did not reach."""
        if run.stopped:
            why = run.stopped.get("why")
            if why == "timeout":
                return "timeout", f"the notebook's time limit ({self.limits.timeout_s:g} s) ran out before this exercise finished"
            if why == "output limit":
                return "output limit", (f"the notebook printed more than {self.limits.output_mib:g} MiB before this "
                                        "exercise finished")
            if why == "kernel died":
                sig = run.stopped.get("signal")
                if run.outcome.group_oom:
                    return "memory", self._group_memory_text()
                if sig == 9:
                    return "killed", "the kernel was killed (signal 9) before this exercise finished"
                if sig == 24:
                    return "timeout", "the kernel ran out of CPU time before this exercise finished"
                return "error", f"the kernel died{f' (signal {sig})' if isinstance(sig, int) else ''} before this exercise finished"
            if why == "kernel did not start":
                return "error", f"the notebook's kernel did not start in the sandbox ({_text(run.stopped.get('detail', ''), 120)})"
        o = run.outcome
        if o.group_oom:
            return "memory", self._group_memory_text()
        if o.timed_out:
            return "timeout", f"the notebook's time limit ({self.limits.timeout_s:g} s) ran out before this exercise finished"
        if o.too_much_output:
            return "output limit", "the sandbox wrote more than the grader reads before this exercise finished"
        if not run.started and not run.done:
            return "error", f"the sandbox did not run the notebook: {o.last_error_line() or f'exit status {o.returncode}'}"
        return "killed", "the sandbox's processes were killed before this exercise finished"

    def _exercise(self, p: Plan, run: _Run | None) -> tuple[str, str, str] | wire.FunctionAnswer:
        """(status, graded feedback, full feedback), or a function answer still to run."""
        ex = p.ex
        if ex.needs_gpu and not self.live:
            return "needs_gpu", "runs the student's code on a GPU: grade with --live on a GPU machine", ""
        if p.status is not None:
            return p.status, p.problem or "", ""
        assert run is not None
        if run.setup_error:
            e = run.setup_error
            return "error", (f"the grader's capture code did not load in the sandbox's kernel "
                             f"({_text(e.get('ename'), 60)}: {_text(e.get('evalue'), 120)})"), ""
        if ex.label not in run.answers:
            if ex.label in run.checks and run.checks[ex.label] and _is_memory(run.checks[ex.label]):
                return "memory", self._memory_text(), ""
            status, text = self._unfinished(run)
            return status, text, ""
        raised = run.checks.get(ex.label)
        if raised:
            if _is_memory(raised):
                return "memory", self._memory_text(), ""
            return "error", f"its cell raised {_text(raised.get('ename'), 60)}: {_text(raised.get('evalue'), 120)}", ""
        payloads, capture_error = run.answers[ex.label]
        if len(payloads) != 1:
            why = _text(capture_error.get("ename"), 60) if capture_error else f"{len(payloads)} answer records"
            return "error", f"its answers could not be read ({why})", ""
        try:
            answers = wire.parse_answers(payloads[0], ex.label, ex.answers)
        except wire.WireError as e:
            return "error", f"its answers could not be read ({_text(e, 100)})", ""
        for name, value in answers.items():
            if isinstance(value, wire.Raised):
                return "error", f"evaluating the answer {name} raised {value.type_name}", ""
        if ex.takes_function and isinstance(answers[ex.answers[0]], wire.FunctionAnswer):
            return answers[ex.answers[0]]
        args = {k: (wire.NotData("function") if isinstance(v, wire.FunctionAnswer) else v) for k, v in answers.items()}
        return self._verdict(ex, lambda: ex.check(**args))

    def _memory_text(self) -> str:
        return f"its cell ran out of memory (the limit is {self.limits.memory_mib:g} MiB per process)"

    def _group_memory_text(self) -> str:
        return (f"the notebook's processes together ran out of memory before this exercise finished (the limit is "
                f"{self.limits.group_mib(live=self.live):g} MiB for all of them)")

    def _verdict(self, ex: Exercise, decide: Callable[[], Feedback]) -> tuple[str, str, str]:
        try:
            with self._score_lock:
                fb = decide()
        except ReportError as e:
            return "error", f"its function's run returned data no harness returns ({_text(e, 100)})", ""
        except Exception as e:  # the check failed on plain data: ours to fix (its message may quote the answer)
            _print_bug(f"checking {ex.label}")
            return "error", f"the check failed on this answer (a bug in the grader, please report it): {_type_name(e)}", ""
        status = {True: "correct", False: "wrong", None: "unanswered"}[fb.correct]
        return status, graded_feedback(fb), fb.message

    def _function(self, ex: Exercise, fn: wire.FunctionAnswer, deadline: float) -> tuple[str, str, str]:
        """Run a function answer through its harness in a fresh sandbox (the harness measures
        there; the function runs in a child with nothing of the harness's); judge what the
        harness reports, after checking the facts the grader can: the line carries the nonce of
        this run, and a GPU exercise graded live ran where the harness itself saw a GPU."""
        seconds = deadline - time.monotonic()
        if seconds < 2:
            return "timeout", "the time limit ran out before this exercise's function was run", ""
        nonce = secrets.token_hex(16)
        request = {"label": ex.label, "function": fn.record, "nonce": nonce, "gpu_exercise": bool(ex.needs_gpu),
                   "limits": rlimits(self.limits, live=self.live, seconds=seconds)}
        outcome = self.sandbox.run([], request_bytes(request), seconds=seconds, limits=self.limits, module=HARNESS,
                                   max_output=4 << 20)
        results = []
        for line in outcome.lines:
            try:
                ev = wire.loads(line, max_bytes=4 << 20)
            except wire.WireError:
                continue
            if isinstance(ev, dict) and ev.get("event") == "result":
                results.append(ev)
        ours = [ev for ev in results if ev.get("nonce") == nonce]
        if len(results) != 1 or len(ours) != 1:
            if outcome.timed_out:
                return "timeout", f"running the submitted function took past the time limit ({self.limits.timeout_s:g} s)", ""
            if outcome.group_oom:
                return "memory", "running the submitted function ran out of the memory its sandbox may use", ""
            if results:
                return "error", "running the submitted function gave no result the grader can trust", ""
            if outcome.returncode is not None and outcome.returncode < 0:
                return "killed", f"running the submitted function was killed (signal {-outcome.returncode})", ""
            return "error", f"running the submitted function gave no result (exit status {outcome.returncode})", ""
        ev = ours[0]
        kind = ev.get("kind")
        if kind == "rebuild":
            return "error", f"the submitted function could not be rebuilt: {_text(ev.get('why'), 120)}", ""
        if kind == "raised":
            return "error", f"running the submitted function raised {_type_name(str(ev.get('why')))}", ""
        if kind == "ended":
            status = ev.get("status")
            if outcome.group_oom:
                return "memory", "running the submitted function ran out of the memory its sandbox may use", ""
            how = f"signal {-status}" if isinstance(status, int) and status < 0 else f"exit status {status}"
            return "error", f"the submitted function ended its own process while it ran ({how})", ""
        if kind == "protocol":
            return "error", "the submitted function wrote over the channel the grader calls it through", ""
        if kind == "bug":
            return "error", (f"the exercise's harness failed (a bug in the grader, please report it): "
                             f"{_type_name(str(ev.get('why')))}"), ""
        if kind != "report":
            return "error", "running the submitted function gave no result the grader can trust", ""
        report = ev.get("report")
        if ex.needs_gpu and self.live and not (ev.get("gpu") is True and isinstance(report, Mapping)
                                                and report.get("gpu") is True):
            return "error", ("the grader's harness saw no GPU in the sandbox, so this exercise was not judged: check "
                             "that the GPU works here (nvidia-smi) and grade again"), ""
        return self._verdict(ex, lambda: ex.judge(report))


def _print_bug(what: str) -> None:
    """A grader bug's traceback on stderr, with control characters stripped (its messages may
    hold text from a submission, which must not drive the instructor's terminal)."""
    text = traceback.format_exc()
    sys.stderr.write(f"a bug in the grader while {clean_text(what)}:\n"
                     + "\n".join(clean_text(line) for line in text.splitlines()) + "\n")


# ----------------------------------------------------------------------------- a class

def grade(submissions: Sequence[str | os.PathLike[str]], *, jobs: int = 1, timeout_s: float = 600.0,
          live: bool = False, feedback: str = "graded", unsafe: bool = False, limits: Limits | None = None,
          hide: Sequence[str | os.PathLike[str]] = (), progress: Callable[[str], None] | None = None) -> list[Row]:
    """Grade every notebook of ``submissions`` (files or folders): every one gets rows,
    whatever it does.

    Args:
        jobs: notebooks graded at once (1 to 64), each in its own sandbox; rows keep the
            order of the notebooks.
        timeout_s: time limit per notebook, everything included (> 0).
        live, feedback, unsafe, hide: see :class:`Grader`. The submissions' folders are
            always hidden from the sandboxes.
        limits: the other limits (its ``timeout_s`` is replaced by ``timeout_s``).
        progress: called with one line per notebook graded.

    Raises:
        GradeInputError: see :func:`.notebooks.find_notebooks`.
        SandboxUnavailable: no sandbox can be made here and ``unsafe`` is false.
        ValueError: jobs outside 1-64, timeout_s <= 0, an unknown feedback style.
    """
    if not (isinstance(jobs, int) and not isinstance(jobs, bool) and 1 <= jobs <= 64):
        raise ValueError(f"jobs must be an integer in [1, 64], got {jobs!r}")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s}")
    paths = find_notebooks(submissions)
    limits = dataclasses.replace(limits or Limits(), timeout_s=float(timeout_s))
    folders = {str(Path(s).resolve()) if Path(s).is_dir() else str(Path(s).resolve().parent) for s in submissions}
    grader = Grader(live=live, feedback=feedback, limits=limits, unsafe=unsafe, hide=[*folders, *hide])
    saved = os.environ.get("CUDA_MEMLAB_MODE")
    os.environ["CUDA_MEMLAB_MODE"] = "live" if live else "recorded"  # the checks look up recorded (or live) results
    try:
        described = grader.prepare()
        if progress:
            progress(f"grading {len(paths)} notebook(s) in a {described}")

        def one(i_path: tuple[int, Path]) -> list[Row]:
            i, p = i_path
            t0 = time.monotonic()
            rows = grader.grade_notebook(p)
            if progress:
                total = rows[-1]
                progress(f"[{i + 1}/{len(paths)}] {total.notebook}: {total.score:g}/{total.max_score:g} "
                         f"{total.status or ''}{' ' if total.status else ''}({time.monotonic() - t0:.0f} s)")
            return rows

        if jobs == 1 or len(paths) == 1:
            per_notebook = [one(x) for x in enumerate(paths)]
        else:
            with concurrent.futures.ThreadPoolExecutor(min(jobs, len(paths))) as pool:
                per_notebook = list(pool.map(one, enumerate(paths)))
    finally:
        grader.close()
        if saved is None:
            os.environ.pop("CUDA_MEMLAB_MODE", None)
        else:
            os.environ["CUDA_MEMLAB_MODE"] = saved
    return [row for rows in per_notebook for row in rows]


def grade_notebook(path: str | os.PathLike[str], *, timeout_s: float = 600.0, live: bool = False,
                   feedback: str = "graded", unsafe: bool = False, name: str | None = None) -> list[Row]:
    """Grade one notebook (see :func:`grade`): one row per exercise of its chapter, then the total.

    Raises:
        SandboxUnavailable: no sandbox here and ``unsafe`` is false.
        ValueError: timeout_s <= 0 or an unknown feedback style.
    """
    rows = grade([path], timeout_s=timeout_s, live=live, feedback=feedback, unsafe=unsafe)
    return [dataclasses.replace(r, notebook=clean_text(name)) for r in rows] if name is not None else rows


# ----------------------------------------------------------------------------- output

# A spreadsheet runs a cell that starts with one of these as a formula (and fullwidth forms
# some of them read the same way); a tab or a carriage return before one is skipped by some.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "\uff1d", "\uff0b", "\uff0d", "\uff20")


def _cell(value: Any) -> str:
    """A CSV cell: control characters stripped (no line starts inside a cell), and a cell
    that would start a formula prefixed with a quote."""
    text = clean_text(str(value))
    return "'" + text if text.lstrip(" ").startswith(FORMULA_STARTS) else text


def rows_to_csv(rows: Sequence[Row]) -> str:
    """The rows as CSV, one line per row, with :data:`COLUMNS`; every cell guarded (:func:`_cell`)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COLUMNS)
    for r in rows:
        w.writerow([_cell(r.notebook), "" if r.chapter is None else str(r.chapter), _cell(r.exercise),
                    f"{r.score:g}", f"{r.max_score:g}", _cell(r.status), _cell(r.feedback)])
    return buf.getvalue()


def rows_to_json(rows: Sequence[Row]) -> str:
    return json.dumps([r.to_json() for r in rows], indent=1) + "\n"
