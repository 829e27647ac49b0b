"""The claims ledger: each post's claims, the experiment that measures each, and the
predicate that decides whether it holds.

A chapter registers a claim with :func:`claim`, decorating its predicate. The
predicate receives the experiment's measured data (a dict) and returns
``(holds, measured)``: a bool and the figures that decided it. :func:`evaluate`
runs (or reads) the experiment and applies the predicate, so the same code produces
the table at the end of each chapter and ``python -m experiments claims``.
"""
from __future__ import annotations

import dataclasses
import html
from typing import Any, Callable, Mapping

from . import registry, store


@dataclasses.dataclass(frozen=True)
class Claim:
    """One claim of a post.

    Attributes:
        id: fixed id such as 'alloc.rounding' (ids never change once published).
        chapter: 1-4.
        statement: the claim in one line, as tested.
        experiment: id of the experiment that measures it.
        params: the parameter point it is evaluated at (missing names take defaults).
        predicate: data -> (holds, measured figures).
        source: URL of the post (or doc) the claim comes from.
    """

    id: str
    chapter: int
    statement: str
    experiment: str
    params: Mapping[str, Any]
    predicate: Callable[[Mapping[str, Any]], tuple[bool, Mapping[str, Any]]]
    source: str


@dataclasses.dataclass(frozen=True)
class ClaimResult:
    """A claim checked against a measurement (``holds`` is None when it could not be measured)."""

    id: str
    chapter: int
    statement: str
    measured: dict[str, Any]
    holds: bool | None
    provenance: dict[str, Any] | None
    mode: str
    source: str
    error: str = ""

    def to_json(self) -> dict[str, Any]:
        """The documented JSON form: id, chapter, statement, measured, holds, provenance (+ mode, source, error)."""
        return {
            "id": self.id, "chapter": self.chapter, "statement": self.statement,
            "measured": self.measured, "holds": self.holds, "provenance": self.provenance,
            "mode": self.mode, "source": self.source, "error": self.error,
        }


_CLAIMS: dict[str, Claim] = {}


def claim(id: str, *, chapter: int, statement: str, experiment: str, source: str,
          params: Mapping[str, Any] | None = None) -> Callable:
    """Register the decorated predicate as claim ``id``.

    Raises:
        ValueError: the id is registered twice.
    """
    def decorate(predicate: Callable[[Mapping[str, Any]], tuple[bool, Mapping[str, Any]]]) -> Callable:
        existing = _CLAIMS.get(id)
        if existing is not None and existing.predicate.__qualname__ != predicate.__qualname__:
            raise ValueError(f"claim {id!r} is registered twice")
        _CLAIMS[id] = Claim(id, chapter, statement, experiment, dict(params or {}), predicate, source)
        return predicate

    return decorate


def all_claims(chapter: int | None = None) -> list[Claim]:
    """Registered claims (all, or one chapter's), in chapter then registration order."""
    registry.load_chapters()
    order = list(_CLAIMS)
    claims = sorted(_CLAIMS.values(), key=lambda c: (c.chapter, order.index(c.id)))
    return [c for c in claims if chapter is None or c.chapter == chapter]


def get_claim(claim_id: str) -> Claim:
    """The claim ``claim_id``. Raises ValueError listing the known ids."""
    registry.load_chapters()
    try:
        return _CLAIMS[claim_id]
    except KeyError:
        raise ValueError(f"unknown claim {claim_id!r}; known: {sorted(_CLAIMS)}") from None


def evaluate(c: Claim, *, mode: str | None = None) -> ClaimResult:
    """Measure (or read) the claim's experiment and apply its predicate.

    In live mode a result already measured in this process at the same point is reused.
    A failure to measure (no recording, an error on the GPU) gives ``holds=None`` and
    the error text rather than an exception, so one broken claim does not hide the others.
    """
    resolved = registry.resolve_mode(mode)
    try:
        result = registry.run(c.experiment, mode=resolved, cache=True, **c.params)
    except (store.NotRecordedError, store.RecordedFileError, RuntimeError, ValueError) as e:
        return ClaimResult(c.id, c.chapter, c.statement, {}, None, None, resolved, c.source, error=str(e))
    holds, measured = c.predicate(result.data)
    return ClaimResult(c.id, c.chapter, c.statement, store.to_jsonable(dict(measured)), bool(holds),
                       result.provenance.to_dict(), result.mode, c.source)


def evaluate_all(chapter: int | None = None, *, mode: str | None = None) -> list[ClaimResult]:
    """:func:`evaluate` for every claim (of one chapter, or all)."""
    return [evaluate(c, mode=mode) for c in all_claims(chapter)]


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    if isinstance(v, list) and len(v) > 6:
        return "[" + ", ".join(_fmt(x) for x in v[:6]) + ", ...]"
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    return str(v)


def format_measured(measured: Mapping[str, Any]) -> str:
    """'key = value; ...' with short floats."""
    return "; ".join(f"{k} = {_fmt(v)}" for k, v in measured.items())


class ClaimsTable:
    """Claim results displayed as an HTML table in notebooks and as text elsewhere."""

    def __init__(self, results: list[ClaimResult]):
        self.results = results

    def __iter__(self):
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    def verdict(self, r: ClaimResult) -> str:
        return "not measured" if r.holds is None else ("holds" if r.holds else "does not hold")

    def _where(self, r: ClaimResult) -> str:
        if not r.provenance:
            return r.error
        p = r.provenance
        how = "recorded" if r.mode == "recorded" else "live"
        return f"{how} · {p['gpu_name']} · torch {p['torch']} · {p['date'][:10]}"

    def summary(self) -> str:
        """'18 of 20 claims hold; 1 does not; 1 not measured.'"""
        verdicts = [self.verdict(r) for r in self.results]
        parts = [f"{verdicts.count('holds')} of {len(verdicts)} claims hold"]
        if verdicts.count("does not hold"):
            parts.append(f"{verdicts.count('does not hold')} do{'es' if verdicts.count('does not hold') == 1 else ''} not")
        if verdicts.count("not measured"):
            parts.append(f"{verdicts.count('not measured')} not measured")
        return "; ".join(parts) + "."

    def __str__(self) -> str:
        lines = [self.summary()]
        for r in self.results:
            lines.append(f"[{self.verdict(r):>13}] {r.id} (ch. {r.chapter}): {r.statement}")
            if r.measured:
                lines.append(f"                measured: {format_measured(r.measured)}")
            lines.append(f"                {self._where(r)}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        colors = {"holds": "#1b6e3a", "does not hold": "#b5403a", "not measured": "#7a4b00"}
        # classes for the book's dark scheme, which recolours them (book/_static/memlab.css)
        kinds = {"holds": "memlab-ok", "does not hold": "memlab-bad", "not measured": "memlab-pending"}
        rows = []
        for r in self.results:
            v = self.verdict(r)
            rows.append(
                "<tr>"
                f"<td><code>{html.escape(r.id)}</code></td>"
                f"<td class='{kinds[v]}' style='color:{colors[v]};font-weight:bold'>{v}</td>"
                f"<td>{html.escape(r.statement)} <a href='{html.escape(r.source)}'>source</a></td>"
                f"<td>{html.escape(format_measured(r.measured))}</td>"
                f"<td style='font-size:85%'>{html.escape(self._where(r))}</td>"
                "</tr>"
            )
        return (f"<p><b>{html.escape(self.summary())}</b> Each statement comes from the linked source; "
                "the number that decides it is this book's test of that statement.</p>"
                "<table style='font-size:88%'><thead><tr><th>claim</th><th>verdict</th><th>statement</th>"
                "<th>measured</th><th>where</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>")


def claims_table(chapter: int | None = None, *, mode: str | None = None) -> ClaimsTable:
    """Evaluate a chapter's claims (or all) and return a displayable table."""
    return ClaimsTable(evaluate_all(chapter, mode=mode))


def show_claim(claim_id: str, *, mode: str | None = None) -> "ClaimsTable":
    """One claim evaluated (live on a GPU, on the recording otherwise) as a one-row
    :class:`ClaimsTable`, for the sentence of a chapter that makes the claim.

    Raises:
        ValueError: an unknown claim id (naming the near misses).
    """
    return ClaimsTable([evaluate(get_claim(claim_id), mode=mode)])
