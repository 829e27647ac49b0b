"""How `make test` shares the tests out between pytest-xdist's workers (tests/conftest.py).

A test module whose module-scoped fixture is costly (a graded class, a built wheel, the student
site, a Pyodide tab) runs whole in one worker, so that the fixture is made once; so do the
tests, in any module, that take a costly session fixture shared through a file (the pages' one
reading); every other test goes to whichever worker is free. Costly work is handed out first, longest first (the
workers sort the tests so: :func:`order_key`), so that no worker is left with a long test at
the end while the other idles.

xdist's own ``--dist loadgroup`` would do the grouping from ``xdist_group`` marks, but with
pytest 9.2 it silently does not (pytest-xdist issue 1386: the group is appended to a test's id,
which pytest 9.2 no longer reads back), so the groups are found here, from the test files
alone, where the controlling process (which collects nothing) can find them too.
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# Module- and class-scoped fixtures that are cheap to make again in a second worker: a module
# that uses only these is not kept in one worker. The browser starts in about a second.
CHEAP_SHARED = frozenset({"browser"})


def _costly_fixtures(tree: ast.Module) -> set[str]:
    """Names of the module-, class- or package-scoped fixtures a test file defines, less the cheap."""
    names = set()
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name in CHEAP_SHARED:
            continue
        for dec in node.decorator_list:
            if isinstance(dec, ast.Call) and ast.unparse(dec.func).endswith("fixture") and any(
                    k.arg == "scope" and isinstance(k.value, ast.Constant)
                    and k.value.value in ("module", "class", "package") for k in dec.keywords):
                names.add(node.name)
    return names


# Test files whose tests share costly results through a per-worker cache (functools.lru_cache)
# instead of a fixture: kept in one worker too, so that each result is computed once
# (test_doctor_cases: every case's replays and what-ifs, used one by one and all together).
SHARED_CACHE_MODULES = frozenset({"tests/test_doctor_cases.py"})


@functools.lru_cache(maxsize=1)
def shared_setup_modules() -> frozenset[str]:
    """Test files (``tests/test_x.py``, as in test ids) that define a costly module-scoped
    fixture, or import one from another test file, and those of :data:`SHARED_CACHE_MODULES`."""
    gone = sorted(m for m in SHARED_CACHE_MODULES if not (TESTS.parent / m).is_file())
    if gone:
        raise RuntimeError(f"tests/scheduling.py: SHARED_CACHE_MODULES names no test file: {gone}")
    trees = {p: ast.parse(p.read_text(encoding="utf-8")) for p in sorted(TESTS.glob("test_*.py"))}
    costly = {p.stem: _costly_fixtures(t) for p, t in trees.items()}
    out = set()
    for path, tree in trees.items():
        used = set(costly[path.stem])
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module in costly:
                used |= {a.name for a in node.names} & costly[node.module]
        if used:
            out.add(f"{TESTS.name}/{path.name}")
    return frozenset(out | SHARED_CACHE_MODULES)


# Session-scoped fixtures made once per run and shared through a file by the workers (a lock
# makes the second wait for the first): the tests that use one run in one worker, so that no
# worker waits. A group is named after its fixture.
SHARED_SESSION = frozenset({"page_readings"})


@functools.lru_cache(maxsize=1)
def session_groups() -> dict[str, str]:
    """{"tests/test_x.py::test_name": fixture} for every test function that takes a fixture of
    :data:`SHARED_SESSION`."""
    out = {}
    for path in sorted(TESTS.glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
                used = SHARED_SESSION.intersection(a.arg for a in node.args.args)
                if used:
                    out[f"{TESTS.name}/{path.name}::{node.name}"] = min(used)
    return out


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def group_of(nodeid: str) -> str | None:
    """The shared session fixture whose group ``nodeid`` runs in, or None."""
    module, _, rest = nodeid.partition("::")
    return session_groups().get(f"{module}::{rest.split('[', 1)[0].rsplit('::', 1)[-1]}")


def order_key(nodeid: str, slow: bool, module_slow: bool) -> tuple[int, int]:
    """Where a test goes in the order the workers hand tests out: the groups of a shared session
    fixture and the modules that run whole first (the slow ones first), then single slow tests,
    then the rest."""
    if group_of(nodeid) is not None:
        return (0, 0)
    if module_of(nodeid) in shared_setup_modules():
        return (0, 0 if module_slow else 1)
    return (1, 0 if slow else 1)


def make_scheduler(config, log):
    """xdist's scope scheduler, with a scope per test except for the modules that run whole."""
    from xdist.scheduler.loadscope import LoadScopeScheduling

    class SharedSetupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = module_of(nodeid)
            if module in shared_setup_modules():
                return module
            return group_of(nodeid) or nodeid

    return SharedSetupScheduling(config, log)
