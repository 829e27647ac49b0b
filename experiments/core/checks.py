"""Self-checking exercises: a :class:`Feedback` value and the comparisons exercises share.

Chapter modules write the checks themselves (they know what a wrong answer usually
means); these helpers give every check the same look and the same handling of an
unanswered exercise (``None``: a reminder, not a failure).

Each check is declared once with :func:`exercise`: its label in the book, chapter,
points, learning objective and the section whose rule it practises. The declaration
feeds the instructors' table and the grader (:mod:`experiments.grading`, which imports the
chapters' declarations; nothing here imports it), and adds the self-study behaviour: a
wrong answer names the section, and after a second wrong try points to the solution (in
the student edition: to the instructor).

Feedback gives nothing away: neither its message, its ``details`` nor its ``repr`` holds
the expected value, and for answers made of many items (a classification, a dict of
counts) it says how many are wrong, never which. ``details`` holds the student's own
answer and ``wrong_parts``: the parts of a multi-part question that are wrong.

An exercise whose answer is a function is declared with a *harness* and a *judge*: the
harness calls the function on the check's own inputs and returns what happened as plain
data (numbers, strings, lists, dicts); the judge turns that data into the verdict. The
check is ``judge(harness(fn))``; the grader runs the harness in a sandbox and the judge in
its own process.
"""
from __future__ import annotations

import dataclasses
import functools
import html
import inspect
import math
import os
from typing import Any, Callable, Mapping, Sequence


@dataclasses.dataclass(frozen=True)
class Feedback:
    """The outcome of a check.

    ``correct`` is True, False, or None when there is no answer yet. ``details`` holds
    the numbers the check compared (for instructors and tests).
    """

    correct: bool | None
    message: str
    details: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.correct)

    @property
    def status(self) -> str:
        return {True: "correct", False: "not yet", None: "no answer yet"}[self.correct]

    def __str__(self) -> str:
        return f"[{self.status}] {self.message}"

    def _repr_html_(self) -> str:
        color = {True: "#1b6e3a", False: "#b5403a", None: "#7a4b00"}[self.correct]
        icon = {True: "✔", False: "✘", None: "…"}[self.correct]
        kind = {True: "memlab-ok", False: "memlab-bad", None: "memlab-pending"}[self.correct]  # the book's dark scheme
        return (f"<div style='border-left:4px solid {color};padding:4px 10px'>"
                f"<b class='{kind}' style='color:{color}'>{icon} {self.status}</b>: {html.escape(self.message)}</div>")


def unanswered(what: str) -> Feedback:
    """Feedback for an exercise whose answer is still ``None``."""
    return Feedback(None, f"Replace None with {what}, then run the cell again.")


def check_number(
    answer: Any,
    expected: float,
    *,
    name: str,
    unit: str = "",
    rel_tol: float = 0.0,
    abs_tol: float = 0.0,
    hints: Sequence[tuple[float, str]] = (),
    explanation: str = "",
) -> Feedback:
    """Compare a numeric answer with the expected value.

    Args:
        name: what the number is, for the message ('reserved memory').
        rel_tol, abs_tol: tolerances as in :func:`math.isclose`.
        hints: (value, message) pairs for typical wrong answers; the message is shown
            when the answer matches that value (same tolerances).
        explanation: shown with a correct answer.
    """
    if answer is None:
        return unanswered(f"your value for {name}{f' in {unit}' if unit else ''}")
    if isinstance(answer, bool) or not isinstance(answer, (int, float)) or not math.isfinite(answer):
        return Feedback(False, f"{name} should be a finite number{f' in {unit}' if unit else ''}, got {answer!r}.",
                        {"wrong_parts": [name]})
    u = f" {unit}" if unit else ""
    details: dict[str, Any] = {"answer": answer}
    if math.isclose(answer, expected, rel_tol=rel_tol, abs_tol=abs_tol):
        return Feedback(True, f"{name} = {expected:g}{u}. {explanation}".strip(), details)
    details["wrong_parts"] = [name]
    for value, message in hints:
        if math.isclose(answer, value, rel_tol=rel_tol, abs_tol=abs_tol):
            return Feedback(False, f"{answer:g}{u} is not it for {name}. {message}", details)
    # The direction teaches without giving the value away (graded mode leaves it out: it
    # would let a student bisect); the section pointer comes from the exercise's declaration.
    direction = "high" if answer > expected else "low"
    return Feedback(False, f"{answer:g}{u} is too {direction} for {name}.", details)


def check_choice(answer: Any, correct: Any, *, explanations: Mapping[Any, str], name: str = "your choice") -> Feedback:
    """Multiple choice: ``explanations`` maps every option to why it is right or wrong.

    Raises:
        ValueError: ``correct`` is not among the options (a bug in the exercise).
    """
    if correct not in explanations:
        raise ValueError(f"the correct option {correct!r} has no explanation")
    if answer is None:
        return unanswered(f"one of {list(explanations)} as {name}")
    if not isinstance(answer, str) and all(isinstance(k, str) for k in explanations):
        # options are letters: 3 or ["c"] is a reader's typing, answered with the form to use
        return Feedback(False, f"Answer with one letter in quotes, one of {', '.join(map(repr, explanations))}; got {answer!r}.",
                        {"wrong_parts": [name]})
    if isinstance(answer, str) and answer not in explanations:
        # 'B' or ' b ' for option 'b': a reader's typing, not a wrong answer
        folded = {str(k).lower(): k for k in explanations}
        answer = folded.get(answer.strip().lower(), answer)
    try:
        known = answer in explanations
    except TypeError:  # a list or dict cannot be an option
        known = False
    if not known:
        return Feedback(False, f"{answer!r} is not an option; choose one of {list(explanations)}.",
                        {"wrong_parts": [name]})
    details: dict[str, Any] = {"answer": answer}
    if answer != correct:
        details["wrong_parts"] = [name]
    return Feedback(answer == correct, explanations[answer], details)


def combine(parts: Sequence[Feedback]) -> Feedback:
    """All parts correct -> correct; any unanswered -> unanswered; else the failing messages."""
    if any(p.correct is None for p in parts):
        return Feedback(None, " ".join(p.message for p in parts if p.correct is None))
    failing = [p for p in parts if not p.correct]
    if not failing:
        return Feedback(True, " ".join(p.message for p in parts))
    wrong = [name for p in failing for name in p.details.get("wrong_parts", [])]
    return Feedback(False, " ".join(p.message for p in failing), {"wrong_parts": wrong})


# ----------------------------------------------------------------------------- declarations

@dataclasses.dataclass(frozen=True)
class Exercise:
    """One exercise of the book, declared beside its check with :func:`exercise`.

    ``check`` is the undecorated check function (no self-study wording); ``answers`` are
    its parameters without a default, in order: the values a student fills in. Other
    parameters (``result=``, ``expandable=``) are the check's own and never taken from a
    submission.

    ``harness`` and ``judge`` are set for an exercise whose one answer is a function:
    ``harness(fn)`` runs it on the check's inputs and returns plain data,
    ``judge(data)`` returns the :class:`Feedback` (raising :class:`ReportError` on data that
    is not what a harness returns).
    """

    label: str
    chapter: int
    points: float
    objective: str
    section: str
    check: Callable[..., Feedback]
    answers: tuple[str, ...]
    needs_gpu: bool = False
    harness: Callable[[Callable[..., Any]], Any] | None = None
    judge: Callable[[Any], Feedback] | None = None

    @property
    def check_name(self) -> str:
        return self.check.__name__

    @property
    def takes_function(self) -> bool:
        """Whether the answer is a function (scored through ``harness`` and ``judge``)."""
        return self.harness is not None


EXERCISES: dict[str, Exercise] = {}
_WRONG_TRIES: dict[str, int] = {}
# The handed-out notebooks' set-up cell sets it to "student" (scripts/student_edition.py).
EDITION_ENV = "CUDA_MEMLAB_EDITION"


def exercise(label: str, *, chapter: int, points: float, objective: str, section: str,
             needs_gpu: bool = False, harness: Callable[[Callable[..., Any]], Any] | None = None,
             judge: Callable[[Any], Feedback] | None = None,
             ) -> Callable[[Callable[..., Feedback]], Callable[..., Feedback]]:
    """Declare a check function as the check of exercise ``label`` (as in the book's
    ``:label:``) and register it in :data:`EXERCISES`.

    Args:
        chapter: 1-4. points: > 0. objective: the learning objective, one sentence.
        section: the title of the section whose rule the exercise practises (named in
            wrong-answer feedback).
        needs_gpu: the check runs the student's code on a GPU and cannot judge it without.
        harness, judge: for an exercise whose one answer is a function (see :class:`Exercise`).

    The returned function behaves like the check for a reader: a wrong answer also
    names the section, and from the second wrong try on points to the solution. With
    ``CUDA_MEMLAB_FEEDBACK=graded`` in the environment (an exam) it says only correct /
    wrong / which part, and its details keep nothing but the wrong parts.

    Raises:
        ValueError: a label not starting with 'ex-', a chapter outside 1-4, points <= 0,
            a harness without a judge (or the reverse) or for a check of several answers,
            or the label declared twice for different checks.
    """
    if not label.startswith("ex-"):
        raise ValueError(f"label must start with 'ex-', got {label!r}")
    if chapter not in (1, 2, 3, 4):
        raise ValueError(f"chapter must be 1-4, got {chapter!r}")
    if not points > 0:
        raise ValueError(f"points must be > 0, got {points!r}")
    if (harness is None) != (judge is None):
        raise ValueError("harness and judge go together: give both or neither")

    def declare(check: Callable[..., Feedback]) -> Callable[..., Feedback]:
        params = inspect.signature(check).parameters.values()
        answers = tuple(p.name for p in params if p.default is p.empty
                        and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
        if harness is not None and len(answers) != 1:
            raise ValueError(f"a harness scores one function answer; {check.__name__} takes {list(answers)}")
        old = EXERCISES.get(label)
        if old is not None and old.check.__qualname__ != check.__qualname__:
            raise ValueError(f"exercise {label!r} is declared twice: {old.check.__qualname__} and "
                             f"{check.__qualname__}")
        EXERCISES[label] = Exercise(label, chapter, points, objective, section, check, answers, needs_gpu,
                                    harness, judge)

        @functools.wraps(check)
        def self_study(*args: Any, **kwargs: Any) -> Feedback:
            return _self_study(label, section, check(*args, **kwargs))

        # No way around the exam wording through the wrapper (the signature stays visible).
        del self_study.__wrapped__  # type: ignore[attr-defined]
        self_study.__signature__ = inspect.signature(check)  # type: ignore[attr-defined]
        self_study.exercise_label = label  # type: ignore[attr-defined]
        return self_study

    return declare


def _self_study(label: str, section: str, fb: Feedback) -> Feedback:
    if os.environ.get("CUDA_MEMLAB_FEEDBACK", "").strip().lower() == "graded":
        return Feedback(fb.correct, graded_feedback(fb), {"wrong_parts": list(fb.details.get("wrong_parts", []))})
    if fb.correct is not False:
        return fb
    tries = _WRONG_TRIES[label] = _WRONG_TRIES.get(label, 0) + 1
    more = f" The rule is in the section '{section}'."
    if tries >= 2:
        if os.environ.get(EDITION_ENV, "").strip().lower() == "student":
            # the student edition has no solutions, and sends no one to the book that has them
            more += " Stuck after two tries? Ask your instructor."
        else:
            more += " Stuck after two tries? The exercise's solution, folded under it, walks through it."
    return Feedback(False, fb.message + more, fb.details)


def graded_feedback(fb: Feedback) -> str:
    """The feedback of graded mode: only correct / wrong / which part is wrong."""
    if fb.correct is None:
        return "unanswered"
    if fb.correct:
        return "correct"
    parts = fb.details.get("wrong_parts") or []
    return "wrong" + (f": {', '.join(str(p) for p in parts)}" if parts else "")


# ----------------------------------------------------------------------------- function answers

class ReportError(ValueError):
    """A judge was given data that no harness returns (malformed, or forged in a sandbox)."""


def call_for_data(fn: Callable[..., Any], *args: Any) -> dict[str, Any]:
    """Call a student's function; what happened as plain data: ``{"value": float}`` for a
    finite number, ``{"returned": text}`` for anything else (its repr, at most 80
    characters), ``{"raised": "Type: message"}`` (at most 200 characters)."""
    try:
        got = fn(*args)
    except Exception as e:  # the reader's code: report, do not crash the page
        return {"raised": f"{type(e).__name__}: {e}"[:200]}
    if isinstance(got, bool) or not isinstance(got, (int, float)) or not math.isfinite(got):
        try:
            text = repr(got)[:80]
        except Exception:  # a repr that raises: its type is enough
            text = f"a {type(got).__name__}"
        return {"returned": text}
    return {"value": float(got)}


def report_outputs(report: Any, n: int) -> list[dict[str, Any]]:
    """The ``outputs`` of a harness's report, checked: ``n`` entries as :func:`call_for_data`
    returns them.

    Raises:
        ReportError: anything else.
    """
    outputs = report.get("outputs") if isinstance(report, Mapping) else None
    if not isinstance(outputs, list) or len(outputs) != n:
        raise ReportError(f"expected {n} outputs")
    for out in outputs:
        if not (isinstance(out, Mapping) and len(out) == 1):
            raise ReportError("an output is malformed")
        (kind, value), = out.items()
        ok = (kind == "value" and isinstance(value, (int, float)) and not isinstance(value, bool)
              and math.isfinite(value)) or (kind in ("returned", "raised") and isinstance(value, str))
        if not ok:
            raise ReportError("an output is malformed")
    return outputs
