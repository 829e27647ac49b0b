"""Self-checking exercises: a :class:`Feedback` value and the comparisons exercises share.

Chapter modules write the checks themselves (they know what a wrong answer usually
means); these helpers give every check the same look and the same handling of an
unanswered exercise (``None``: a reminder, not a failure).
"""
from __future__ import annotations

import dataclasses
import html
import math
from typing import Any, Mapping, Sequence


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
        return (f"<div style='border-left:4px solid {color};padding:4px 10px'>"
                f"<b style='color:{color}'>{icon} {self.status}</b>: {html.escape(self.message)}</div>")


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
        return Feedback(False, f"{name} should be a finite number{f' in {unit}' if unit else ''}, got {answer!r}.")
    u = f" {unit}" if unit else ""
    details = {"answer": answer, "expected": expected}
    if math.isclose(answer, expected, rel_tol=rel_tol, abs_tol=abs_tol):
        return Feedback(True, f"{name} = {expected:g}{u}. {explanation}".strip(), details)
    for value, message in hints:
        if math.isclose(answer, value, rel_tol=rel_tol, abs_tol=abs_tol):
            return Feedback(False, f"{answer:g}{u} is not it. {message}", details)
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
    if isinstance(answer, str) and answer not in explanations:
        # 'B' or ' b ' for option 'b': a reader's typing, not a wrong answer
        folded = {str(k).lower(): k for k in explanations}
        answer = folded.get(answer.strip().lower(), answer)
    try:
        known = answer in explanations
    except TypeError:  # a list or dict cannot be an option
        known = False
    if not known:
        return Feedback(False, f"{answer!r} is not an option; choose one of {list(explanations)}.")
    return Feedback(answer == correct, explanations[answer], {"answer": answer, "correct": correct})


def combine(parts: Sequence[Feedback]) -> Feedback:
    """All parts correct -> correct; any unanswered -> unanswered; else the failing messages."""
    if any(p.correct is None for p in parts):
        return Feedback(None, " ".join(p.message for p in parts if p.correct is None))
    failing = [p for p in parts if not p.correct]
    if not failing:
        return Feedback(True, " ".join(p.message for p in parts))
    return Feedback(False, " ".join(p.message for p in failing))
