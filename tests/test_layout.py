"""The package's architecture, checked from its source: one-way imports, faces that only
re-export, one role name per role, modules of a readable size (the layout issue's rules)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from experiments.core.chapters import CHAPTERS

PKG = Path(__file__).resolve().parent.parent / "experiments"
CHAPTER_PACKAGES = [c.module for c in CHAPTERS if (PKG / c.module).is_dir()]
# Tools that readers and instructors take home, packages of their own beside the chapters.
TOOL_PACKAGES = sorted(p.name for p in PKG.iterdir() if (p / "__init__.py").exists()
                       and p.name not in {"core", *CHAPTER_PACKAGES})
ROLES = {"measurements", "model", "plots", "checks", "workloads"}
# Of those, the tools that run in the browser (issue 17): chapters may import them, they import
# no chapter, and of the core only the modules that need neither torch, numpy nor matplotlib
# (the doctor runs in Pyodide, where none of the three exists).
TOOLS = {"doctor"}
TOOL_CORE = {"experiments.core.units", "experiments.core.tables", "experiments.core.text",
             "experiments.core.alloc_conf"}
# ... except where a figure is drawn (matplotlib, imported when drawn).
TOOL_FIGURES = {"experiments.doctor.figure": {"experiments.core.plotting"}}
# Modules a chapter may have beside the roles, each named for what it holds.
# doctor_gpu and doctor_cases record the programs that hold the doctor to what the GPU did.
EXTRA = {"allocator": {"snapshot", "gpu", "predict", "fresh", "doctor_gpu", "doctor_cases", "doctor_programs"},
         "streams": {"fsdp", "fsdp_gpu", "fsdp_trace", "fsdp_plots"}, "pinned": {"host", "host_cache", "staging"},
         "syncs": {"ops", "case", "detector"}}
MAX_LINES = 600
# mirrors one C++ class, DeviceCachingAllocator of CUDACachingAllocator.cpp
LONGER_ALLOWED = {"experiments.doctor.engine"}


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    found = {module_name(p): p for p in PKG.rglob("*.py")}
    assert len(found) > 20, f"found only {len(found)} modules under {PKG}"
    return found


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Modules of the package that ``name`` imports anywhere (top level or inside functions)."""
    is_pkg = path.name == "__init__.py"
    package = name if is_pkg else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for a in node.names:  # `from pkg import submodule` imports the submodule
                if f"{target}.{a.name}" in known:
                    out.add(f"{target}.{a.name}")
                elif target in known:
                    out.add(target)
    out.discard(name)
    return out


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    return {n: imports_of(n, p, set(mods)) for n, p in mods.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each as a cycle path."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_import_graph_sees_lazy_and_relative_imports():
    graph = import_graph()
    assert "experiments.core.runner" in graph["experiments.allocator.fresh"], \
        "the lazy `from ..core.runner import run_fresh` inside a function is an edge"
    assert "experiments.core.alloc_conf" in graph["experiments.core.runner"]


def test_no_import_cycle_anywhere():
    found = cycles(import_graph())
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_core_imports_no_chapter_and_no_tool():
    graph = import_graph()
    assert {"grading", "doctor"} <= set(TOOL_PACKAGES), TOOL_PACKAGES
    outside = tuple(f"experiments.{c.module}" for c in CHAPTERS) + tuple(f"experiments.{t}" for t in TOOL_PACKAGES)
    bad = {m: sorted(t for t in ts if t.startswith(outside)) for m, ts in graph.items()
           if m.startswith("experiments.core")}
    assert not {m: ts for m, ts in bad.items() if ts}


def tool_violations(graph: dict[str, set[str]], tool: str) -> list[str]:
    """What breaks the tools' rule in ``graph``: a chapter, a face or a heavy core module imported."""
    chapters = tuple(f"experiments.{c.module}" for c in CHAPTERS)
    prefix = f"experiments.{tool}"
    out = []
    for m, ts in sorted(graph.items()):
        if not (m == prefix or m.startswith(prefix + ".")):
            continue
        out += [f"{m} imports chapter module {x}" for x in sorted(ts) if x.startswith(chapters)]
        core = {x for x in ts if x.startswith("experiments.core")}
        out += [f"{m} imports {x}" for x in sorted(core - TOOL_CORE - TOOL_FIGURES.get(m, set()))]
        out += [f"{m} imports the face experiments" for x in ts if x == "experiments"]
    return out


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_a_tool_imports_no_chapter_and_only_the_light_core(tool):
    graph = import_graph()
    assert any(m.startswith(f"experiments.{tool}.") for m in graph), f"no modules under experiments.{tool}"
    assert tool_violations(graph, tool) == []


def test_the_tool_rule_finds_planted_imports():
    graph = import_graph()
    graph["experiments.doctor.rules"] = graph["experiments.doctor.rules"] | {"experiments.core.device",
                                                                            "experiments.allocator.model"}
    found = tool_violations(graph, "doctor")
    assert any("core.device" in f for f in found) and any("allocator.model" in f for f in found)


def test_the_chapters_declare_exercises_and_only_the_grader_imports_it():
    graph = import_graph()
    bad = {m: sorted(t for t in ts if t == "experiments.grading" or t.startswith("experiments.grading."))
           for m, ts in graph.items() if not (m == "experiments.grading" or m.startswith("experiments.grading."))}
    assert not {m: ts for m, ts in bad.items() if ts}, "modules that import the grader"
    assert any(t.startswith("experiments.core.checks") for t in graph["experiments.grading.grader"])


def test_nothing_inside_imports_a_face():
    graph = import_graph()
    faces = {f"experiments.{c}" for c in CHAPTER_PACKAGES} | {f"experiments.{t}" for t in TOOLS} | {"experiments"}
    # A chapter may use a tool as its readers do, through the tool's face (its public API):
    # the tool's modules may then move without the chapter noticing.
    tool_faces = {f"experiments.{t}" for t in TOOLS}
    in_chapter = tuple(f"experiments.{c}." for c in CHAPTER_PACKAGES)
    bad = {m: sorted((ts & faces) - (tool_faces if m.startswith(in_chapter) else set())) for m, ts in graph.items()
           if m.startswith("experiments.") and m not in ("experiments.sync_detector",)}
    bad = {m: ts for m, ts in bad.items() if ts}
    assert not bad, f"modules that import a chapter face (import the submodule instead): {bad}"


def test_plots_and_checks_never_import_measurements():
    graph = import_graph()
    for ch in CHAPTER_PACKAGES:
        for role in ("plots", "checks"):
            mod = f"experiments.{ch}.{role}"
            assert f"experiments.{ch}.measurements" not in graph.get(mod, set()), f"{mod} imports measurements"


@pytest.mark.parametrize("chapter", CHAPTER_PACKAGES)
def test_a_face_only_reexports(chapter):
    tree = ast.parse((PKG / chapter / "__init__.py").read_text())
    for node in tree.body:
        # a chapter re-exports its own modules, the core's units, and a tool's API (from its modules)
        ok = (isinstance(node, ast.ImportFrom) and (node.level == 1 or node.module == "core.units"
                                                    or node.level == 2 and node.module.split(".")[0] in TOOLS)
              or isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)  # the docstring
              or isinstance(node, ast.Assign) and [t.id for t in node.targets] == ["__all__"])
        assert ok, f"experiments/{chapter}/__init__.py line {node.lineno}: a face holds re-exports only"


@pytest.mark.parametrize("chapter", CHAPTER_PACKAGES)
def test_one_role_name_per_role(chapter):
    names = {p.stem for p in (PKG / chapter).glob("*.py")} - {"__init__"}
    assert {"measurements", "plots", "checks"} <= names
    assert names <= ROLES | EXTRA[chapter], f"{chapter}: modules outside the roles: {sorted(names - ROLES - EXTRA[chapter])}"


def test_modules_stay_readable():
    long = {n: len(p.read_text().splitlines()) for n, p in modules().items()}
    long = {n: k for n, k in long.items() if k > MAX_LINES and n not in LONGER_ALLOWED}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def _module_aliases(name: str, path: Path, tree: ast.AST, known: set[str]) -> dict[str, str]:
    """Names a module binds to other modules of the package (``from . import model as sup``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")
            base = base[: len(base) - (node.level - 1)] if node.level else []
            target = ".".join(base + ([node.module] if node.module else [])) if node.level else (node.module or "")
            for a in node.names:
                if f"{target}.{a.name}" in known:
                    out[a.asname or a.name] = f"{target}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name in known and a.asname:
                    out[a.asname] = a.name
    return out


def test_attributes_of_imported_modules_exist():
    """`sup.host_stats()` through a module alias is invisible to a linter; a renamed or
    mistyped attribute (`sup.hoststats_dict`) failed only on the GPU. Check each one here."""
    import importlib

    mods = modules()
    missing = []
    for name, path in mods.items():
        tree = ast.parse(path.read_text())
        aliases = _module_aliases(name, path, tree, set(mods))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
                target = importlib.import_module(aliases[node.value.id])
                if not hasattr(target, node.attr):
                    missing.append(f"{name}:{node.lineno}: {node.value.id}.{node.attr} ({aliases[node.value.id]})")
    assert not missing, missing
