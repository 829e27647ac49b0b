"""The code the book hands to readers runs, or at least imports (issue #19).

Readers copy code from the pages, the README and the docstrings; nothing executes it when
the book is built, and a module that moved into ``experiments.core`` left
``from experiments.measure import time_gpu`` raising ``ModuleNotFoundError`` in the book.
Here every displayed snippet (tests/snippets.py finds them) is checked:

- every dotted name of the package (``experiments.core.measure.time_gpu``, in code, prose
  and docstrings) and every name reached through a page's aliases (``al.doctor``,
  ``syncs.no_syncs``) resolves;
- every ``python`` block compiles, its imports resolve, and it is executed in recorded
  mode on the CPU with the page's imports; a block that needs what only the reader has (their
  ``model``, their snapshot file) or a GPU is import-checked only, and says so;
- every ``python -m experiments ...`` command line parses with the command's own parser.

A failure names the snippet (file:line and its first line), the name that broke, and where
a name of that kind lives now.
"""
from __future__ import annotations

import ast
import contextlib
import importlib.util
import io
import re
import shlex
import textwrap
import warnings
from typing import Any

import pytest

from . import snippets as S

ALL = S.markdown_snippets()
DOCSTRINGS = S.docstring_snippets()
PYTHON = [s for s in ALL if s.lang == "python"]
# Literal blocks (``Usage::``) of docstrings are code too.
DOC_BLOCKS = [S.Snippet(s.where, "python", textwrap.dedent(block), module=s.module)
              for s in DOCSTRINGS
              for block in re.findall(r"::\n\n((?:(?:[ \t]+\S.*)?\n)+)", s.code + "\n")]
# Torch names a CPU build lacks; the prose names them for readers on a GPU.
CUDA_ONLY = {"torch._C._host_emptyCache", "torch._C._cuda_clearCublasWorkspaces"}


def _explain(name: str, err: Exception) -> str:
    moved = S.where_now(name)
    hint = f"; it lives now at {', '.join(moved)}" if moved else ""
    return f"{name} does not resolve ({type(err).__name__}: {err}){hint}"


def _package_names(snippet: S.Snippet) -> list[str]:
    return [m.group(1) for m in S.PACKAGE_NAME.finditer(snippet.code)]


def test_every_package_name_shown_to_readers_resolves():
    """Code, prose and docstrings: ``experiments.x.y`` names a module or object that exists."""
    broken = []
    for s in ALL + DOCSTRINGS:
        for name in _package_names(s):
            try:
                S.resolve(name)
            except (ImportError, AttributeError) as err:
                broken.append(f"{s.head()}: {_explain(name, err)}")
    assert not broken, f"{len(broken)} names shown to readers do not resolve:\n" + "\n".join(broken)


def _alias_names(code: str, aliases: dict[str, str]) -> list[tuple[str, str]]:
    """(as written, fully qualified) for every attribute chain rooted at an alias of the page."""
    out = []
    for m in re.finditer(r"(?<![\w.])([A-Za-z_]\w*)((?:\.[A-Za-z_]\w*)+)", code):
        root, rest = m.group(1), m.group(2)
        if root in aliases:
            out.append((root + rest, aliases[root] + rest))
    return out


def _check_names(snippet: S.Snippet, aliases: dict[str, str]) -> list[str]:
    broken = []
    for written, full in _alias_names(snippet.code, aliases):
        if full in CUDA_ONLY:
            continue
        try:
            obj = S.resolve(full)
        except (ImportError, AttributeError) as err:
            broken.append(f"{snippet.head()}: {written} ({_explain(full, err)})")
            continue
        del obj
    return broken


def test_every_name_reached_through_a_page_alias_resolves():
    """Inline code in a page (``al.parse_oom_message``, ``pinned.features_text()``) names
    what the page's imports give it."""
    broken = []
    for s in ALL:
        if s.lang == "inline" and s.page:
            broken += _check_names(s, S.page_aliases(s.page))
    assert not broken, f"{len(broken)} inline names do not resolve:\n" + "\n".join(broken)


def _block_aliases(snippet: S.Snippet, tree: ast.AST) -> dict[str, str]:
    # torch is taken for granted in a book about PyTorch; anything else must be imported
    # by the page or the snippet (a docstring's example may use its module's names).
    aliases = {"torch": "torch", **(S.page_aliases(snippet.page) if snippet.page else {})}
    if snippet.module:
        aliases.update({k: f"{snippet.module}.{k}" for k in vars(S.resolve(snippet.module)) if not k.startswith("_")})
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    return aliases


def _bound_names(tree: ast.AST) -> set[str]:
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
            bound.update(a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg)) if hasattr(node, "args") else None
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name.split(".")[0]) for a in node.names)
    return bound


def _namespace(aliases: dict[str, str]) -> dict[str, Any]:
    ns: dict[str, Any] = {"__name__": "__snippet__"}
    for name, full in aliases.items():
        try:
            ns[name] = S.resolve(full)
        except (ImportError, AttributeError):
            pass  # reported by the name checks
    return ns


# What only the reader has, or only a GPU: a block stopped by one of these is import-checked.
def _needs(err: BaseException, tree: ast.AST, ns: dict[str, Any]) -> str | None:
    import experiments as ex

    if isinstance(err, NameError) and err.name not in _bound_names(tree) and err.name not in ns:
        if importlib.util.find_spec(err.name) is not None:
            return None  # a module the snippet uses without importing it
        return f"the reader's {err.name}"
    if isinstance(err, FileNotFoundError):
        return f"the reader's file {err.filename}"
    if isinstance(err, ex.NoGPUError) or "CUDA" in str(err) or "cuda" in str(err):
        return "a GPU"
    return None


def _run(snippet: S.Snippet, ns: dict[str, Any]) -> str:
    """Run ``snippet`` in ``ns`` (the page's namespace so far); 'ran' or why it was only
    import-checked. Raises AssertionError naming the snippet when it breaks."""
    tree = ast.parse(snippet.code, snippet.where)
    aliases = _block_aliases(snippet, tree)
    broken = _check_names(snippet, aliases)
    if broken:
        raise AssertionError("\n".join(broken))
    ns.update({k: v for k, v in _namespace(aliases).items() if k not in ns})
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(tree, snippet.where, "exec"), ns)  # noqa: S102  (the book's own code)
    except Exception as err:  # noqa: BLE001  (classified below)
        need = _needs(err, tree, ns)
        if need is None:
            raise AssertionError(f"{snippet.head()} raised {type(err).__name__}: {err}") from err
        return f"import-checked (needs {need})"
    finally:
        import matplotlib.pyplot as plt

        plt.close("all")
    return "ran"


# The python blocks of each page (or file), in reading order: a reader runs them one after
# the other, so a block may use what an earlier one defined (``math`` in chapter 1's solution).
GROUPS: dict[str, list[S.Snippet]] = {}
for _s in PYTHON + DOC_BLOCKS:
    GROUPS.setdefault(_s.where.split(":")[0], []).append(_s)


@pytest.mark.parametrize("source", list(GROUPS))
def test_python_blocks_run_or_import(source, recorded_mode, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # a block that writes a file writes it here
    ns: dict[str, Any] = {"__name__": "__snippet__"}
    failures = []
    for snippet in GROUPS[source]:
        try:
            with warnings.catch_warnings():
                # The no_syncs marker is registered by the plugin the snippet enables, not here.
                warnings.simplefilter("ignore", pytest.PytestUnknownMarkWarning)
                outcome = _run(snippet, ns)
        except (AssertionError, SyntaxError) as err:
            failures.append(str(err) if isinstance(err, AssertionError) else f"{snippet.head()}: {err}")
            continue
        print(f"{snippet.head()}: {outcome}")
    assert not failures, "\n".join(failures)


def _command_lines(snippet: S.Snippet) -> list[str]:
    # `python -m experiments.doctor` is another module (the doctor's own __main__), not a command of this parser
    return [m.group(1) for m in re.finditer(r"(?:^|!|\s)python3? -m experiments(?![.\w])((?: [^\n#`]*)?)", snippet.code,
                                            re.M)]


def _option_problems(parser, argv: list[str]) -> str | None:
    """For a command named in prose, where arguments may be placeholders (``--chapter N``,
    a bare ``grade``): the subcommand and every ``--option`` exist."""
    sub = next(a for a in parser._actions if a.dest == "command")  # noqa: SLF001
    if not argv or argv[0] not in sub.choices:
        return f"no subcommand {argv[:1]}"
    known = {o for a in sub.choices[argv[0]]._actions for o in a.option_strings}  # noqa: SLF001
    unknown = [a.split("=")[0] for a in argv[1:] if a.startswith("--") and a.split("=")[0] not in known]
    return f"{argv[0]} has no option {unknown[0]}" if unknown else None


def test_every_command_line_shown_parses():
    """``python -m experiments doctor snap.pickle --what-if ...`` names a subcommand and
    options the command has; a fenced command line parses as written."""
    from experiments.core.cli import build_parser

    lines, broken = 0, []
    for s in ALL:
        for args in _command_lines(s):
            argv = shlex.split(args)
            lines += 1
            parser = build_parser(argv)
            if s.lang == "inline":
                problem = _option_problems(parser, argv)
            else:
                try:
                    with contextlib.redirect_stderr(io.StringIO()) as err:
                        parser.parse_args(argv)
                    problem = None
                except SystemExit:
                    problem = err.getvalue().strip()
            if problem:
                broken.append(f"{s.head()}: `python -m experiments{args}`: {problem}")
    assert lines >= 10, f"only {lines} command lines found"
    assert not broken, "\n".join(broken)


def test_the_snippets_are_found():
    """The finder sees the snippets the book has (so an empty search cannot pass)."""
    heads = [s.head() for s in PYTHON]
    assert set(GROUPS) >= {"book/src/measuring.py", "book/src/ch1_caching_allocator.py", "experiments/__init__.py"}
    assert sum("measuring" in h for h in heads) == 1 and sum("ch4_hidden_syncs" in h for h in heads) >= 5
    assert any("Typical page" in s.code or "import experiments as ex" in s.code for s in DOC_BLOCKS)
    assert any(s.code.startswith("experiments.core.measure") for s in ALL if s.lang == "inline")
