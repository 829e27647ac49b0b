"""Submissions as notebooks: finding them, reading them within limits, naming them safely,
and finding each exercise's check cell and the answer expressions of its check call.

A check cell is the code cell tagged ``exercise: <label>`` in its metadata (the book's
notebook generator tags them with :func:`tag_exercise_cells`); untagged cells are never
parsed. The answers are the arguments bound to the check's answer parameters
(:class:`experiments.core.checks.Exercise`); other arguments (``result=``) are the check's
own and ignored. A notebook is graded on one chapter, its own (:func:`notebook_chapter`).

Everything here reads student-controlled input in the grader's own process, so every step is
bounded before it starts: a submission is opened without following links and read only if it
is a regular file of its own within ``max_bytes``; a check cell is parsed only up to
:data:`MAX_PARSE_CHARS`, with IPython's syntax masked line by line (:func:`python_source`:
linear, where IPython's own transformer takes minutes on a cell of ``!`` lines); a cell that
makes the parser fail in any way is a cell without a check call. What a row says about a file
never quotes the file, and a file's name is shown through :func:`display_name`.
"""
from __future__ import annotations

import ast
import dataclasses
import errno
import json
import os
import re
import stat
import unicodedata
from pathlib import Path
from typing import Any, Mapping, Sequence

import nbformat

from ..core import registry
from ..core.checks import EXERCISES, Exercise

TAG = "exercise"  # cell metadata key: the exercise label of a check cell
MAX_PARSE_CHARS = 64 * 1024  # a check cell is a few lines; larger cells are not parsed
SUFFIX = ".ipynb"            # compared without case: Ch1.IPYNB is a notebook too
SKIPPED_FOLDERS = (".ipynb_checkpoints", "__MACOSX")   # Jupyter's copies; a Mac archive's resource forks


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

# An IPython line that is not Python: a shell escape (!ls), a magic (%time, %%capture), help
# (obj?), or an assignment from one (x = !ls). Only the start of a line (or what follows
# `name =`) is looked at, so the masking is linear in the cell's length.
_IPYTHON_LINE = re.compile(r"^(?P<indent>[ \t]*)(?:[!%?]|[\w.]+(?:\s*,\s*[\w.]+)*\s*=\s*[!%]|[\w.]+\?\??[ \t]*$)")


def python_source(source: str) -> str:
    """A cell's source with each IPython-only line replaced by ``pass`` at its indentation
    (line numbers, and every other line, unchanged)."""
    out = []
    for line in source.split("\n"):
        m = _IPYTHON_LINE.match(line)
        out.append(line if m is None else (m.group("indent") or "") + "pass")
    return "\n".join(out)


def parse_cell(source: str) -> tuple[str, ast.Module] | None:
    """A code cell as Python (IPython-only lines masked, :func:`python_source`): (that source,
    its tree), or None when it is too large to read or does not parse. Linear in the cell's
    length, which is at most :data:`MAX_PARSE_CHARS`."""
    if not isinstance(source, str) or len(source) > MAX_PARSE_CHARS:
        return None
    text = python_source(source)
    try:
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

def is_notebook_name(name: str) -> bool:
    """Whether a file name ends with ``.ipynb``, in any case."""
    return name.casefold().endswith(SUFFIX)


def _walk(folder: Path) -> list[Path]:
    """Every notebook name under ``folder``, not following links to folders (a link is
    listed when its own name ends in .ipynb: it gets a row saying it is refused)."""
    out: list[Path] = []
    stack = [folder]
    while stack:
        d = stack.pop()
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            try:
                is_dir = e.is_dir(follow_symlinks=False)
            except OSError:
                is_dir = False
            if is_dir:
                if e.name not in SKIPPED_FOLDERS:
                    stack.append(Path(e.path))
            elif is_notebook_name(e.name) and not e.name.startswith("._"):
                out.append(Path(e.path))
    return sorted(out, key=lambda p: os.fsencode(p))


def find_notebooks(submissions: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """The notebooks to grade: each SUBMISSION is a notebook (``.ipynb`` in any case) or a
    folder, searched recursively without following links to folders (checkpoints and Mac
    resource forks left out), in the order given. Inside a folder, anything named
    ``*.ipynb`` that is not a folder counts: a link, a pipe or a broken file gets an
    ``unreadable`` row.

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
            found = _walk(p)
            if not found:
                raise GradeInputError(f"SUBMISSION {display_name(p)!r} is a folder without any .ipynb notebook")
            out.extend(found)
        elif p.exists() or p.is_symlink():
            if not is_notebook_name(p.name):
                raise GradeInputError(f"SUBMISSION {display_name(p)!r} is not a notebook: expected a .ipynb file or a folder")
            out.append(p)
        else:
            raise GradeInputError(f"SUBMISSION {display_name(p)!r} does not exist")
    return out


def read_notebook(path: Path, *, max_bytes: int) -> nbformat.NotebookNode:
    """The notebook at ``path``, opened without following a link, and read only if it is a
    regular file with no other name (one hard link) of at most ``max_bytes``.

    Raises:
        Unreadable: a link, not a regular file (a pipe, a folder), a file with several
            names, too large, not UTF-8 JSON, or not a valid notebook. The message never
            quotes the file.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP or os.path.islink(path):
            raise Unreadable("a link, not a file: submissions are read only from files of their own") from None
        raise Unreadable(f"cannot read the file ({errno.errorcode.get(e.errno, 'OSError')})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Unreadable("not a regular file")
        if st.st_nlink != 1:
            raise Unreadable(f"a file with {st.st_nlink} names (hard links): submissions are read only from "
                             "files of their own")
        if st.st_size > max_bytes:
            raise Unreadable(f"larger than the {max_bytes / 2**20:g} MiB a submission may have "
                             f"({st.st_size / 2**20:.1f} MiB)")
        chunks, size = [], 0
        while size <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as e:
        raise Unreadable(f"cannot read the file ({errno.errorcode.get(e.errno, 'OSError')})") from None
    finally:
        os.close(fd)
    raw = b"".join(chunks)
    if len(raw) > max_bytes:
        raise Unreadable(f"larger than the {max_bytes / 2**20:g} MiB a submission may have")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise Unreadable("not a valid notebook (not UTF-8 text)") from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise Unreadable(f"not a valid notebook (not JSON: line {e.lineno}, column {e.colno})") from None
    except (ValueError, RecursionError):
        raise Unreadable("not a valid notebook (not JSON)") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("cells"), list):
        raise Unreadable("not a valid notebook (no list of cells)")
    try:
        nb = nbformat.reads(text, as_version=4)
        nbformat.validate(nb)
    except Exception:  # nbformat's errors quote the file: say only what failed
        raise Unreadable("not a valid notebook (it does not follow the notebook format)") from None
    return nb


def notebook_chapter(nb: nbformat.NotebookNode) -> tuple[int, list[int]]:
    """(the chapter a notebook is graded on, the other chapters its tagged cells belong to,
    which are refused). The chapter is the one the handed-out notebook records in its
    ``memlab`` metadata, else the one chapter of its tagged cells.

    Raises:
        Unreadable: no chapter recorded and tagged cells of several chapters (each notebook
            is graded on one chapter), or no exercise of the book in it.
    """
    exs = exercises()
    meta = nb.metadata.get("memlab", {})
    own = meta.get("chapter") if isinstance(meta, Mapping) else None
    tagged = {exs[c.metadata[TAG]].chapter for c in nb.cells if c.cell_type == "code"
              and isinstance(c.metadata.get(TAG), str) and c.metadata[TAG] in exs}
    if isinstance(own, int) and not isinstance(own, bool) and own in (1, 2, 3, 4):
        return own, sorted(tagged - {own})
    if len(tagged) > 1:
        raise Unreadable(f"check cells of chapters {', '.join(map(str, sorted(tagged)))} in one notebook: each "
                         "notebook is graded on one chapter (hand in one notebook per chapter)")
    if not tagged:
        raise Unreadable("no exercise of the book in it (hand out the notebooks that `make book-student` writes)")
    return tagged.pop(), []


def notebook_exercises(nb: nbformat.NotebookNode) -> list[Exercise]:
    """The exercises a notebook is graded on: every exercise of its chapter
    (:func:`notebook_chapter`), in the book's order where the notebook's metadata records it.

    Raises:
        Unreadable: see :func:`notebook_chapter`.
    """
    chapter, _ = notebook_chapter(nb)
    meta = nb.metadata.get("memlab", {})
    mine = [ex for ex in exercises().values() if ex.chapter == chapter]
    order = meta.get("exercises", []) if isinstance(meta, Mapping) else []
    rank = {label: i for i, label in enumerate(order) if isinstance(label, str)} if isinstance(order, list) else {}
    return sorted(mine, key=lambda ex: rank.get(ex.label, len(rank)))


# ----------------------------------------------------------------------------- names

# Unicode categories a name loses: controls (Cc: CR, LF, ESC, BEL...), format characters (Cf:
# bidirectional overrides), line and paragraph separators, surrogates, unassigned.
_STRIPPED = {"Cc", "Cf", "Zl", "Zp", "Cs", "Cn"}


def clean_text(text: str) -> str:
    """``text`` without control, format or separator characters (what a terminal or a
    spreadsheet would act on: CR, LF, ESC, BEL, tabs, bidirectional overrides)."""
    return "".join(ch for ch in text if unicodedata.category(ch) not in _STRIPPED)


def display_name(path: str | os.PathLike[str]) -> str:
    """A readable, safe name for a path of any bytes: UTF-8 where it is; a name in another
    encoding (a Windows zip's ``L\x94sung.ipynb``) read as code page 437 (ZIP's own) and
    marked so; control characters stripped."""
    raw = os.fsencode(path)
    try:
        text, marked = raw.decode("utf-8"), False
    except UnicodeDecodeError:
        text, marked = raw.decode("utf-8", "surrogateescape"), True
        text = "".join(ch if not 0xDC80 <= ord(ch) <= 0xDCFF else bytes([ord(ch) - 0xDC00]).decode("cp437")
                       for ch in text)
    text = clean_text(text)
    return f"{text} (name not UTF-8, read as cp437)" if marked else text


@dataclasses.dataclass
class Plan:
    """How one exercise of a notebook is graded: its check cell, or why it has none."""

    ex: Exercise
    cell: int | None = None           # index of the check cell in the student's notebook
    status: str | None = None         # 'missing' or 'error' found before running
    problem: str | None = None
    expressions: dict[str, str] | None = None


def plan(nb: nbformat.NotebookNode, exs: Sequence[Exercise]) -> list[Plan]:
    """One :class:`Plan` per exercise: its check cell is the first code cell tagged with its
    label (no other cell is parsed, each at most once)."""
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    plans = []
    for ex in exs:
        p = Plan(ex)
        p.cell = next((i for i in code if nb.cells[i].metadata.get(TAG) == ex.label), None)
        if p.cell is None:
            p.status, p.problem = "missing", (f"its check cell is missing (no cell tagged exercise: {ex.label}; "
                                              "deleted, or its metadata removed)")
            plans.append(p)
            continue
        source = nb.cells[p.cell].source
        if len(source) > MAX_PARSE_CHARS:
            p.status, p.problem = "error", f"its check cell is larger than the {MAX_PARSE_CHARS // 1024} KiB the grader reads"
            plans.append(p)
            continue
        tree = parse_cell(source)
        call = _calls(tree, ex.check_name)
        if tree is None:
            p.status, p.problem = "error", "its check cell does not parse as Python (or nests too deeply to read)"
        elif call is None:
            p.status, p.problem = "missing", f"its check cell no longer calls {ex.check_name}"
        else:
            exprs = answer_expressions(tree[0], call, ex)
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
