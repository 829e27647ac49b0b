"""What the docs and docstrings point at exists, and they explain rules instead of citing issues.

Every ``experiments.x.y`` dotted path, every Sphinx role (``:func:`...```, ``:mod:``,
``:class:``, ...) and every path of this repository (``experiments/doctor/RULES.md``) in the
package's source, the benchmarks and scripts, the book's sources and extensions, and the
Markdown (README, CONTRIBUTING, the doctor's RULES.md, the book's pages) must resolve: a module
renamed or moved leaves no stale reference behind. And "issue N" stands for nothing a reader
can look up: where a text gives a rule, it says the rule.

The tests themselves are left out (they import what they name, and fail when it moves).
"""
from __future__ import annotations

import ast
import builtins
import importlib
import importlib.util
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOTTED = re.compile(r"(?<![\w.])experiments(?:\.[A-Za-z_]\w*)+")
ROLE = re.compile(r":(?:py:)?(func|meth|class|mod|data|attr|exc|obj|const):`([^`]+)`")
# a path of the repository; one that a placeholder ends (book/src/chN_*.py) is checked up to it
PATH = re.compile(r"(?<![\w/.<{$-])((?:experiments|tests|benchmarks|scripts|book)/[\w./-]*[\w/])(?![*<{\w])")
ISSUE = re.compile(r"\bissues?\s+#?\d+", re.IGNORECASE)
OPTIONAL = {"IPython", "ipywidgets", "pyodide", "js", "playwright"}   # other packages a role may name


def texts() -> list[Path]:
    """The files whose references are checked (tests and generated files aside)."""
    py = [*ROOT.joinpath("experiments").rglob("*.py"), *ROOT.joinpath("benchmarks").glob("*.py"),
          *ROOT.joinpath("scripts").glob("*.py"), *ROOT.joinpath("book", "src").glob("*.py"),
          *ROOT.joinpath("book", "_ext").glob("*.py")]
    md = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *ROOT.joinpath("experiments").rglob("*.md"),
          *(p for p in ROOT.joinpath("book").rglob("*.md") if "_build" not in p.parts)]
    return sorted(p for p in py + md if p.is_file())


def _rel(path: Path) -> Path:
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else Path(path.name)


def module_of(path: Path) -> str | None:
    """The dotted name of a module of the package (None for other files)."""
    rel = _rel(path)
    if rel.parts[0] != "experiments" or path.suffix != ".py":
        return None
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@lru_cache(maxsize=None)
def resolves(dotted: str) -> bool:
    """Whether ``dotted`` names a module, or an object reached from a module by attributes."""
    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):
        name = ".".join(parts[:k])
        if name.endswith("__main__"):       # importing it would run a command
            return False
        try:
            obj: Any = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name and name.startswith(e.name) or e.name == name:
                continue          # no such module: try the shorter prefix and attributes
            raise
        for attr in parts[k:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


@lru_cache(maxsize=None)
def instance_attribute(dotted: str) -> bool:
    """Whether ``dotted`` is ``Class.attr`` of an attribute its instances get (``self.attr = ...``
    in the class, a dataclass field, a slot or an annotation): what ``:attr:`` usually names."""
    import inspect

    owner, _, attr = dotted.rpartition(".")
    if not owner or not resolves(owner):
        return False
    parts = owner.split(".")
    for k in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:k]))
        except ImportError:
            continue
        for a in parts[k:]:
            obj = getattr(obj, a)
        break
    if not isinstance(obj, type):
        return False
    if attr in getattr(obj, "__annotations__", {}) or attr in getattr(obj, "__slots__", ()):
        return True
    try:
        return re.search(rf"self\.{re.escape(attr)}\b(?:\s*:[^=\n]*)?\s*=", inspect.getsource(obj)) is not None
    except (OSError, TypeError):
        return False


@lru_cache(maxsize=None)
def _classes(module: str) -> tuple[str, ...]:
    try:
        mod = importlib.import_module(module)
    except ImportError:
        return ()
    return tuple(n for n, v in vars(mod).items() if isinstance(v, type) and v.__module__ == module)


def role_resolves(target: str, module: str | None, local: set[str]) -> bool:
    """Whether a Sphinx role's target resolves as the Python domain would: absolute, in the
    current module (and its classes, for a method), or from its package (``.name``)."""
    t = target.strip()
    if "<" in t and t.endswith(">"):
        t = t[t.index("<") + 1:-1]
    t = t.lstrip("~!").removesuffix("()")
    if t.split(".")[0] in local or hasattr(builtins, t):
        return True
    bare = t.lstrip(".")
    cands = [bare] if not t.startswith(".") else []
    if module is not None:
        pkg = module if ROOT.joinpath(*module.split("."), "__init__.py").exists() else module.rpartition(".")[0]
        cands += [f"{module}.{bare}", f"{pkg}.{bare}"] + [f"{module}.{c}.{bare}" for c in _classes(module)]
    for c in cands:
        if c.split(".")[0] in OPTIONAL and importlib.util.find_spec(c.split(".")[0]) is None:
            return True           # a package this machine lacks: not ours to check
        if resolves(c) or instance_attribute(c):
            return True
    return False


def _local_names(text: str) -> set[str]:
    """Names a script outside the package defines or imports (its roles may name them)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return set()
    out = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.Assign):
            out |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return out


def stale_references(paths: list[Path]) -> list[str]:
    """Every dotted path, role and repository path in ``paths`` that does not resolve."""
    out = []
    for path in paths:
        text = path.read_text()
        module = module_of(path)
        local = _local_names(text) if path.suffix == ".py" and module is None else set()
        rel = _rel(path)
        for m in DOTTED.finditer(text):
            if not resolves(m.group(0)):
                out.append(f"{rel}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}")
        for m in ROLE.finditer(text):
            if not role_resolves(m.group(2), module, local):
                out.append(f"{rel}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}")
        for m in PATH.finditer(text):
            if not _path_exists(m.group(1)):
                out.append(f"{rel}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(1)}")
    return out


def _path_exists(rel: str) -> bool:
    """A file or folder of the repository; a page named without its suffix (a Sphinx docname);
    or a pattern whose placeholder is in capitals (``book/NAME.md``)."""
    if any(Path(part).stem.isupper() for part in rel.split("/")):
        return True
    return any((ROOT / (rel + suffix)).exists() for suffix in ("", ".md", ".py", ".ipynb"))


def issue_numbers(paths: list[Path]) -> list[str]:
    out = []
    for path in paths:
        text = path.read_text()
        for m in ISSUE.finditer(text):
            out.append(f"{_rel(path)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}")
    return out


def test_every_reference_resolves():
    found = stale_references(texts())
    assert not found, f"{len(found)} stale references:\n" + "\n".join(found)


def test_no_issue_number_stands_for_a_rule():
    found = issue_numbers(texts())
    assert not found, f"{len(found)} 'issue N' references (say the rule instead):\n" + "\n".join(found)


def test_the_checks_find_planted_references(tmp_path):
    planted = tmp_path / "planted.md"
    planted.write_text("See experiments.doctor.report.doctor and :func:`experiments.doctor.answers.nope`, "
                       "experiments/doctor/replay.py, as issue 17 said; experiments.doctor.answers.report.doctor "
                       "and experiments/doctor/RULES.md are fine.\n")
    assert [f.split(": ", 1)[1] for f in stale_references([planted])] == [
        "experiments.doctor.report.doctor", "experiments.doctor.answers.nope",
        ":func:`experiments.doctor.answers.nope`", "experiments/doctor/replay.py"]
    assert [f.split(": ", 1)[1] for f in issue_numbers([planted])] == ["issue 17"]
    assert role_resolves(".answers.report", "experiments.doctor", set())
    assert role_resolves("Engine.malloc", "experiments.doctor.model.engine", set())
    assert role_resolves("malloc", "experiments.doctor.model.engine", set())      # a method, in its class's docstring
    assert role_resolves("~experiments.doctor.model.rules.round_size", None, set())
    assert not role_resolves("Engine.mallocc", "experiments.doctor.model.engine", set())
