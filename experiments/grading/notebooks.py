"""Submissions as notebooks: finding them, reading them within limits, and finding each
exercise's check cell and the answer expressions of its check call.

A check cell is the code cell tagged ``exercise: <label>`` in its metadata (the book's
notebook generator tags them with :func:`tag_exercise_cells`), or failing that the first
code cell that calls the exercise's check function. The answers are the arguments bound
to the check's answer parameters (:class:`experiments.core.checks.Exercise`); other
arguments (``result=``) are the check's own and ignored.

Everything here reads student-controlled text in the grader's own process, so every step
is bounded before it starts: the file's size (``max_bytes``), and the size of a cell that
is parsed as Python (:data:`MAX_PARSE_CHARS`); a cell that makes the parser fail in any way
(a syntax error, or nesting deep enough to exhaust it) is a cell without a check call.
"""
from __future__ import annotations

import ast
import dataclasses
import os
import re
import stat
from pathlib import Path
from typing import Any, Mapping, Sequence

import nbformat

from ..core import registry
from ..core.checks import EXERCISES, Exercise

TAG = "exercise"  # cell metadata key: the exercise label of a check cell
MAX_PARSE_CHARS = 64 * 1024  # a check cell is a few lines; larger cells are not parsed


class GradeInputError(ValueError):
    """The instructor's command names nothing gradable: no SUBMISSION, a path that does not
    exist, a file that is not a .ipynb notebook, or a folder without one."""


class Unreadable(ValueError):
    """A submission that cannot be graded at all (its row says ``unreadable`` and why)."""


def exercises() -> dict[str, Exercise]:
    """Every declared exercise, by label (chapters loaded through the registry)."""
    registry.load_chapters()
    return dict(EXERCISES)


# ----------------------------------------------------------------------------- check calls

def parse_cell(source: str) -> tuple[str, ast.Module] | None:
    """A code cell as Python (IPython magics turned into calls): (the transformed source, its
    tree), or None when it is too large to read or does not parse."""
    if not isinstance(source, str) or len(source) > MAX_PARSE_CHARS:
        return None
    from IPython.core.inputtransformer2 import TransformerManager

    try:
        text = TransformerManager().transform_cell(source)
        return text, ast.parse(text)
    except Exception:  # SyntaxError, and what hostile nesting makes the parser raise (RecursionError, MemoryError)
        return None


def _calls(parsed: tuple[str, ast.Module] | None, check_name: str) -> ast.Call | None:
    if parsed is None:
        return None
    calls = [n for n in ast.walk(parsed[1]) if isinstance(n, ast.Call)
             and ((isinstance(n.func, ast.Name) and n.func.id == check_name)
                  or (isinstance(n.func, ast.Attribute) and n.func.attr == check_name))]
    return min(calls, key=lambda n: (n.lineno, n.col_offset)) if calls else None


def find_check_call(source: str, check_name: str) -> tuple[str, ast.Call] | None:
    """The first call of ``check_name`` (``check(...)`` or ``mod.check(...)``) in a cell,
    with the parsed source it belongs to; None when there is none or the cell is not read."""
    parsed = parse_cell(source)
    call = _calls(parsed, check_name)
    return (parsed[0], call) if call is not None else None


def answer_expressions(source: str, call: ast.Call, ex: Exercise) -> dict[str, str] | str:
    """{answer parameter: expression source} for a check call, or a reason it cannot be read."""
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return "the check call uses * or ** arguments; pass the answers directly"
    out = {}
    for name, arg in zip(ex.answers, call.args):
        out[name] = ast.get_source_segment(source, arg)
    for k in call.keywords:
        if k.arg in ex.answers and k.arg not in out:
            out[k.arg] = ast.get_source_segment(source, k.value)
    for name in ex.answers:
        if out.get(name) is None:
            out[name] = "None"  # an answer left out is not answered
    return out


def tag_exercise_cells(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Tag each exercise's check cell (``cell.metadata['exercise'] = label``) and record the
    chapter and the exercises' order in ``nb.metadata['memlab']``, for the grader. The check
    cell is the first code cell that calls the exercise's declared check. Returns ``nb``
    (changed in place).

    Raises:
        ValueError: a check is called in the notebook for exercises of several chapters.
    """
    found: dict[str, Exercise] = {}
    all_exercises = exercises().values()
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        cell.metadata.pop(TAG, None)
        parsed = parse_cell(cell.source)
        for ex in all_exercises:
            if ex.label not in found and _calls(parsed, ex.check_name) is not None:
                cell.metadata[TAG] = ex.label
                found[ex.label] = ex
                break
    chapters = sorted({ex.chapter for ex in found.values()})
    if len(chapters) > 1:
        raise ValueError(f"checks of chapters {chapters} in one notebook")
    if chapters:
        # the order lets every student's rows come in the book's order, whatever they deleted
        nb.metadata["memlab"] = {"chapter": chapters[0], "exercises": list(found)}
    return nb


# ----------------------------------------------------------------------------- submissions

def find_notebooks(submissions: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """The notebooks to grade: each SUBMISSION is a .ipynb file or a folder (searched
    recursively, checkpoints left out), in the order given. Inside a folder, anything named
    ``*.ipynb`` that is not a folder counts (a broken link or a pipe gets an ``unreadable`` row).

    Raises:
        GradeInputError: nothing given, a path that does not exist, a file that is not a
            .ipynb notebook, or a folder without one.
    """
    if not submissions:
        raise GradeInputError("no SUBMISSION given: pass notebooks (.ipynb) or folders of them")
    out: list[Path] = []
    for s in submissions:
        p = Path(s)
        if p.is_dir():
            found = sorted(q for q in p.rglob("*.ipynb")
                           if ".ipynb_checkpoints" not in q.parts and not q.is_dir())
            if not found:
                raise GradeInputError(f"SUBMISSION {str(p)!r} is a folder without any .ipynb notebook")
            out.extend(found)
        elif p.exists() or p.is_symlink():
            if p.suffix != ".ipynb":
                raise GradeInputError(f"SUBMISSION {str(p)!r} is not a notebook: expected a .ipynb file or a folder")
            out.append(p)
        else:
            raise GradeInputError(f"SUBMISSION {str(p)!r} does not exist")
    return out


def read_notebook(path: Path, *, max_bytes: int) -> nbformat.NotebookNode:
    """The notebook at ``path``, read only if it is a regular file of at most ``max_bytes``.

    Raises:
        Unreadable: not a regular file (a pipe, a broken link), too large, not UTF-8 JSON, or
            not a valid notebook.
    """
    try:
        st = os.stat(path)  # follows a link: what would be read
    except OSError as e:
        raise Unreadable(f"cannot read the file ({type(e).__name__})") from None
    if not stat.S_ISREG(st.st_mode):
        raise Unreadable("not a regular file")
    if st.st_size > max_bytes:
        raise Unreadable(f"larger than the {max_bytes / 2**20:g} MiB a submission may have ({st.st_size / 2**20:.1f} MiB)")
    try:
        with open(path, "rb") as f:
            raw = f.read(max_bytes + 1)
    except OSError as e:
        raise Unreadable(f"cannot read the file ({type(e).__name__})") from None
    if len(raw) > max_bytes:
        raise Unreadable(f"larger than the {max_bytes / 2**20:g} MiB a submission may have")
    try:
        nb = nbformat.reads(raw.decode("utf-8"), as_version=4)
        nbformat.validate(nb)
    except UnicodeDecodeError:
        raise Unreadable("not a valid notebook (not UTF-8 text)") from None
    except Exception as e:  # JSON errors and nbformat's validation errors have no common base
        first = str(e).strip().splitlines()[0][:120] if str(e).strip() else type(e).__name__
        raise Unreadable(f"not a valid notebook ({first})") from None
    return nb


def notebook_exercises(nb: nbformat.NotebookNode) -> list[Exercise]:
    """The exercises a notebook is graded on: every exercise of its chapter(s), in the
    book's order where the notebook's metadata records it.

    The chapter comes from the notebook's ``memlab`` metadata, else from its tagged
    cells, else from the checks it calls.

    Raises:
        Unreadable: no exercise of the book found.
    """
    exs = exercises()
    chapters: set[int] = set()
    meta = nb.metadata.get("memlab", {})
    if isinstance(meta, Mapping) and meta.get("chapter") in (1, 2, 3, 4):
        chapters.add(meta["chapter"])
    code = [c for c in nb.cells if c.cell_type == "code"]
    if not chapters:
        chapters = {exs[c.metadata[TAG]].chapter for c in code
                    if isinstance(c.metadata.get(TAG), str) and c.metadata[TAG] in exs}
    if not chapters:
        names = {ex.check_name: ex.chapter for ex in exs.values()}
        pattern = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\s*\(")
        chapters = {names[m.group(1)] for c in code for m in pattern.finditer(c.source[:MAX_PARSE_CHARS])}
    if not chapters:
        raise Unreadable("no exercise of the book in it (hand out the notebooks that `make book-student` writes)")
    mine = [ex for ex in exs.values() if ex.chapter in chapters]
    order = meta.get("exercises", []) if isinstance(meta, Mapping) else []
    rank = {label: i for i, label in enumerate(order) if isinstance(label, str)} if isinstance(order, list) else {}
    return sorted(mine, key=lambda ex: rank.get(ex.label, len(rank)))


@dataclasses.dataclass
class Plan:
    """How one exercise of a notebook is graded: its check cell, or why it has none."""

    ex: Exercise
    cell: int | None = None           # index of the check cell in the student's notebook
    status: str | None = None         # 'missing' or 'error' found before running
    problem: str | None = None
    expressions: dict[str, str] | None = None


def plan(nb: nbformat.NotebookNode, exs: Sequence[Exercise]) -> list[Plan]:
    """One :class:`Plan` per exercise (each code cell parsed at most once)."""
    parsed: dict[int, Any] = {}

    def cell_tree(i: int) -> Any:
        if i not in parsed:
            parsed[i] = parse_cell(nb.cells[i].source)
        return parsed[i]

    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    plans = []
    for ex in exs:
        p = Plan(ex)
        tagged = [i for i in code if nb.cells[i].metadata.get(TAG) == ex.label]
        if tagged:
            p.cell = tagged[0]
        else:
            p.cell = next((i for i in code if len(nb.cells[i].source) <= MAX_PARSE_CHARS
                           and _calls(cell_tree(i), ex.check_name) is not None), None)
        if p.cell is None:
            p.status, p.problem = "missing", "its check cell is missing (deleted, or its check call renamed)"
        elif len(nb.cells[p.cell].source) > MAX_PARSE_CHARS:
            p.status, p.problem = "error", f"its check cell is larger than the {MAX_PARSE_CHARS // 1024} KiB the grader reads"
        else:
            call = _calls(cell_tree(p.cell), ex.check_name)
            if cell_tree(p.cell) is None:
                p.status, p.problem = "error", "its check cell does not parse as Python (or nests too deeply to read)"
            elif call is None:
                p.status, p.problem = "missing", f"its check cell no longer calls {ex.check_name}"
            else:
                exprs = answer_expressions(cell_tree(p.cell)[0], call, ex)
                if isinstance(exprs, str):
                    p.status, p.problem = "error", exprs
                else:
                    p.expressions = exprs
        plans.append(p)
    return plans


# ----------------------------------------------------------------------------- the instructors' table

def exercise_table(order: Sequence[str] = ()) -> str:
    """The instructors' table, objectives -> exercises -> points, as MyST Markdown (one row
    per exercise, by chapter, with each chapter's total), from the exercises' declarations.

    Args:
        order: exercise labels in the book's order (the generator passes them); labels
            not in it follow in the order they were declared.
    """
    from ..core.chapters import by_number

    lines = ["| chapter | learning objective | exercise | check | points | graded without a GPU |",
             "|---|---|---|---|---|---|"]
    rank = {label: i for i, label in enumerate(order)}
    exs = sorted(exercises().values(), key=lambda e: (e.chapter, rank.get(e.label, len(rank))))
    for chapter in sorted({e.chapter for e in exs}):
        mine = [e for e in exs if e.chapter == chapter]
        for e in mine:
            objective = e.objective.replace("|", "\\|")
            face = e.check.__module__.split(".")[1]  # experiments.<chapter>.checks
            lines.append(f"| {chapter} | {objective} | {{ref}}`{e.label}` | `{face}.{e.check_name}` | {e.points:g} | "
                         f"{'no: `--live` on a GPU' if e.needs_gpu else 'yes'} |")
        lines.append(f"| {chapter} | **{by_number(chapter).title}: total** | | | "
                     f"**{sum(e.points for e in mine):g}** | |")
    return "\n".join(lines) + "\n"
