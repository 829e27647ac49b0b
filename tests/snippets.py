"""The code the book shows readers without running it: where it is, and what it names.

A *snippet* is code a reader is meant to copy: a fenced ``python`` or ``bash`` block in a
page's Markdown (book/src/*.py, book/instructors.md, README.md, CONTRIBUTING.md), an inline
``code`` span in that Markdown, or a docstring of the package (readers see those through
``help()``). Nothing executes them when the book is built, so a moved module broke them
silently (issue #19); tests/test_snippets.py imports or runs each one.
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import pkgutil
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARKDOWN_FILES = ["README.md", "CONTRIBUTING.md", "book/instructors.md"]


@dataclasses.dataclass(frozen=True)
class Snippet:
    """One piece of displayed code: ``where`` is 'path:line', ``lang`` 'python', 'bash',
    'inline' or 'docstring'; ``page`` the page stem for book sources (whose imports give its
    aliases), ``module`` the module of a docstring (whose names its examples use)."""

    where: str
    lang: str
    code: str
    page: str = ""
    module: str = ""

    def head(self) -> str:
        first = next((ln for ln in self.code.splitlines() if ln.strip()), "")
        return f"{self.where} ({self.lang}: {first.strip()[:70]!r})"


def _markdown_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of the Markdown in ``path``: a whole .md file, or the markdown
    cells of a jupytext percent source with their '# ' prefix removed."""
    lines = path.read_text().splitlines()
    if path.suffix == ".md":
        return list(enumerate(lines, 1))
    out, in_md = [], False
    for n, line in enumerate(lines, 1):
        if line.startswith("# %%"):
            in_md = "[markdown]" in line
            continue
        if in_md:
            out.append((n, line[2:] if line.startswith("# ") else line.lstrip("#")))
    return out


FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})(?P<lang>[\w-]*)\s*$")


def _blocks(numbered: list[tuple[int, str]]) -> tuple[list[tuple[int, str, str]], list[tuple[int, str]]]:
    """Fenced blocks (first line, language, code) and the prose lines outside them.
    Directive fences (```{exercise}) are prose: their bodies are Markdown."""
    blocks, prose = [], []
    i = 0
    while i < len(numbered):
        n, line = numbered[i]
        m = FENCE.match(line)
        if m and m.group("lang"):
            indent, fence = m.group("indent"), m.group("fence")
            body, j = [], i + 1
            while j < len(numbered) and not re.match(rf"^\s*{re.escape(fence)}\s*$", numbered[j][1]):
                body.append(numbered[j][1][len(indent):] if numbered[j][1].startswith(indent) else numbered[j][1])
                j += 1
            blocks.append((n + 1, m.group("lang"), "\n".join(body)))
            i = j + 1
            continue
        prose.append((n, line))
        i += 1
    return blocks, prose



def _inline(prose: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Inline code spans of the prose, joined across line breaks inside a paragraph."""
    out = []
    text = "\n".join(line for _, line in prose)
    starts = []
    pos = 0
    for n, line in prose:
        starts.append((pos, n))
        pos += len(line) + 1
    for m in re.finditer(r"(?<!`)`([^`]+?)`(?!`)", text):
        line = max(n for p, n in starts if p <= m.start())
        out.append((line, " ".join(m.group(1).split())))
    return out


def book_sources() -> list[Path]:
    return sorted((ROOT / "book" / "src").glob("*.py"))


def markdown_snippets() -> list[Snippet]:
    """Every fenced python/bash block and every inline code span of the book's pages, the
    instructors' page, the README and CONTRIBUTING."""
    out = []
    files = [(p, p.stem) for p in book_sources()] + [(ROOT / f, "") for f in MARKDOWN_FILES]
    for path, page in files:
        rel = path.relative_to(ROOT)
        blocks, prose = _blocks(_markdown_lines(path))
        for line, lang, code in blocks:
            if lang in ("python", "bash"):
                out.append(Snippet(f"{rel}:{line}", lang, code, page))
        for line, code in _inline(prose):
            out.append(Snippet(f"{rel}:{line}", "inline", code, page))
    return out


def docstring_snippets() -> list[Snippet]:
    """The docstrings of every module, class and function in the package."""
    out = []
    for path in sorted((ROOT / "experiments").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node, clean=False)
                if doc:
                    line = 1 if isinstance(node, ast.Module) else node.body[0].lineno
                    module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
                    out.append(Snippet(f"{path.relative_to(ROOT)}:{line}", "docstring", doc, module=module))
    return out


def page_aliases(page: str) -> dict[str, str]:
    """{name: module} bound by the page's own code cells (``import experiments as ex``,
    ``from experiments import allocator as al``)."""
    src = (ROOT / "book" / "src" / f"{page}.py").read_text()
    code = "\n".join(line for line in src.splitlines() if not line.startswith("#"))
    names = {}
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            for a in node.names:
                names[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}"
    return names


# A dotted name rooted at the package, in prose or docstrings (``experiments.core.measure.time_gpu``,
# the module of a fresh-process target "experiments.allocator.gpu:sequences_worker").
PACKAGE_NAME = re.compile(r"(?<![\w./-])~?(experiments(?:\.[A-Za-z_]\w*)+)")


def resolve(dotted: str) -> object:
    """The object a dotted name names: the longest importable module prefix, then attributes.

    Raises:
        ImportError / AttributeError: the name does not resolve (the message says where it stopped).
    """
    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:k]))
        except ModuleNotFoundError as err:
            if err.name and not dotted.startswith(err.name):
                raise  # the module exists but imports something missing: a real error
            continue
        for i, attr in enumerate(parts[k:], k):
            if not hasattr(obj, attr):
                raise AttributeError(f"{'.'.join(parts[:i])} has no attribute {attr!r}")
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(f"no module {parts[0]!r}")


@functools.lru_cache(maxsize=1)
def _package_modules() -> tuple[str, ...]:
    import experiments

    # Not __main__: importing it runs the command line.
    return tuple(m.name for m in pkgutil.walk_packages(experiments.__path__, "experiments.")
                 if not m.name.endswith("__main__"))


def where_now(dotted: str) -> list[str]:
    """Where a name that does not resolve lives now: modules of the package that define
    its last part (or, for a module, modules with that name)."""
    last = dotted.rsplit(".", 1)[-1]
    found = []
    for name in _package_modules():
        if name.rsplit(".", 1)[-1] == last:
            found.append(name)
            continue
        try:
            mod = importlib.import_module(name)
        except Exception:  # noqa: BLE001  (a module that needs what this machine lacks)
            continue
        if last in vars(mod) and getattr(vars(mod)[last], "__module__", name) == name:
            found.append(f"{name}.{last}")
    return list(dict.fromkeys(found))
