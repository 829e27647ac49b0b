"""The package's architecture, checked from its source: one-way imports with no cycle, faces that
only re-export, one role name per role, and one concept per file.

One concept per file has no line limit (a single class may be long: the allocator engine
mirrors one C++ class). What it rules out, checked here: a class cut across files (a class that
inherits a class of another module of the package, as a mixin does; exceptions aside), a
module reaching into another's private names (importing ``_name`` from another module of the
doctor, or touching the engine's private state outside it), a name that is both a function
and a module, and a doctor deeper than seven import floors."""
from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

import pytest

from experiments.core.chapters import CHAPTERS

PKG = Path(__file__).resolve().parent.parent / "experiments"
CHAPTER_PACKAGES = [c.module for c in CHAPTERS if (PKG / c.module).is_dir()]
# Tools that readers and instructors take home, packages of their own beside the chapters.
TOOL_PACKAGES = sorted(p.name for p in PKG.iterdir() if (p / "__init__.py").exists()
                       and p.name not in {"core", *CHAPTER_PACKAGES})
ROLES = {"measurements", "model", "plots", "checks", "workloads"}
# Of those, the tools that run in the browser: chapters may import them, they import no chapter,
# and of the core only the modules that need neither torch, numpy nor matplotlib (the doctor
# runs in Pyodide, where none of the three exists).
TOOLS = {"doctor"}
TOOL_CORE = {"experiments.core.units", "experiments.core.tables", "experiments.core.text",
             "experiments.core.alloc_conf", "experiments.core.oneline"}
# ... except where a figure is drawn (matplotlib, imported when drawn).
TOOL_FIGURES = {"experiments.doctor.answers.figure": {"experiments.core.plotting"}}
# ... and the doctor's lab, the GPU programs that hold it to what the GPU did: it records (the
# registry, fresh processes, the device) and is never imported by the rest of the doctor.
LABS = {"experiments.doctor.lab": {"experiments.core.registry", "experiments.core.runner", "experiments.core.device",
                                   "experiments.core.files"}}
# Modules a chapter may have beside the roles, each named for what it holds.
EXTRA = {"allocator": {"snapshot", "gpu", "predict", "fresh"},
         "streams": {"fsdp", "fsdp_gpu", "fsdp_trace", "fsdp_plots"}, "pinned": {"host", "host_cache", "staging"},
         "syncs": {"ops", "case", "detector"}}
DOCTOR_FLOORS = 7      # import floors inside the doctor: a newcomer reads it top to bottom
ENGINE = ("experiments.doctor.model.engine", "Engine")   # the one model of the allocator; its state is its own


@lru_cache(maxsize=None)
def parsed(source: str) -> ast.Module:
    """``source``'s syntax tree, parsed once per process: the tests here walk every module's tree
    (about 1.5 s of CPU each when each parsed them again) and none changes one."""
    return ast.parse(source)


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
    for node in ast.walk(parsed(path.read_text())):
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


def _inside(m: str, prefix: str) -> bool:
    return m == prefix or m.startswith(prefix + ".")


def tool_violations(graph: dict[str, set[str]], tool: str) -> list[str]:
    """What breaks the tools' rule in ``graph``: a chapter, a face or a heavy core module imported,
    and for a tool's lab, being imported by the rest of the tool."""
    chapters = tuple(f"experiments.{c.module}" for c in CHAPTERS)
    prefix = f"experiments.{tool}"
    out = []
    for m, ts in sorted(graph.items()):
        if not _inside(m, prefix):
            continue
        lab = next((lab for lab in LABS if _inside(m, lab)), None)
        out += [f"{m} imports chapter module {x}" for x in sorted(ts) if x.startswith(chapters)]
        core = {x for x in ts if x.startswith("experiments.core")}
        allowed = TOOL_CORE | TOOL_FIGURES.get(m, set()) | (LABS[lab] if lab else set())
        out += [f"{m} imports {x}" for x in sorted(core - allowed)]
        out += [f"{m} imports the face experiments" for x in ts if x == "experiments"]
        if lab is None:
            out += [f"{m} imports its lab's {x}" for x in sorted(ts) if any(_inside(x, lb) for lb in LABS)]
    return out


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_a_tool_imports_no_chapter_and_only_the_light_core(tool):
    graph = import_graph()
    assert any(m.startswith(f"experiments.{tool}.") for m in graph), f"no modules under experiments.{tool}"
    assert tool_violations(graph, tool) == []


def test_the_tool_rule_finds_planted_imports():
    graph = import_graph()
    rules = "experiments.doctor.model.rules"
    graph[rules] = graph[rules] | {"experiments.core.device", "experiments.allocator.model",
                                   "experiments.doctor.lab.recorder"}
    found = tool_violations(graph, "doctor")
    assert any("core.device" in f for f in found) and any("allocator.model" in f for f in found)
    assert any("lab.recorder" in f for f in found)
    assert not [f for f in found if not f.startswith(rules)], "the lab may record (registry, device, runner)"


def test_only_the_lab_of_the_doctor_imports_torch():
    heavy = {"torch", "numpy", "matplotlib"}
    bad = []
    for name, path in modules().items():
        if not _inside(name, "experiments.doctor") or any(_inside(name, lab) for lab in LABS):
            continue
        for node in ast.walk(parsed(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            bad += [f"{name}:{node.lineno} imports {n}" for n in names if n.split(".")[0] in heavy]
    assert not bad, bad


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
    tree = parsed((PKG / chapter / "__init__.py").read_text())
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
        tree = parsed(path.read_text())
        aliases = _module_aliases(name, path, tree, set(mods))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
                target = importlib.import_module(aliases[node.value.id])
                if not hasattr(target, node.attr):
                    missing.append(f"{name}:{node.lineno}: {node.value.id}.{node.attr} ({aliases[node.value.id]})")
    assert not missing, missing


# ----------------------------------------------------------------------------- one concept per file

def _imported_names(name: str, path: Path, tree: ast.AST, known: set[str]) -> dict[str, tuple[str, str]]:
    """{local name: (module of the package, name there)} of the ``from X import name`` of a module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target in known:
                for a in node.names:
                    out[a.asname or a.name] = (target, a.name)
    return out


def straddling_classes(sources: dict[str, tuple[Path, str]]) -> list[str]:
    """Classes that inherit a class defined in another module of the package (a mixin, or a base
    split off a class): one class, two files. Exceptions may (an error family is one concept)."""
    import importlib

    known = set(sources)
    out = []
    for name, (path, text) in sorted(sources.items()):
        tree = parsed(text)
        imported = _imported_names(name, path, tree, known)
        aliases = _module_aliases(name, path, tree, known)
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            for b in node.bases:
                origin = None
                if isinstance(b, ast.Name) and b.id in imported:
                    origin = imported[b.id]
                elif isinstance(b, ast.Attribute) and isinstance(b.value, ast.Name) and b.value.id in aliases:
                    origin = (aliases[b.value.id], b.attr)
                if origin is None:
                    continue
                base = getattr(importlib.import_module(origin[0]), origin[1], None)
                if not (isinstance(base, type) and issubclass(base, BaseException)):
                    out.append(f"{name}.{node.name} inherits {origin[0]}.{origin[1]}")
    return out


def _sources() -> dict[str, tuple[Path, str]]:
    return {n: (p, p.read_text()) for n, p in modules().items()}


def test_no_class_straddles_files():
    assert straddling_classes(_sources()) == []


def test_the_straddle_finder_finds_a_planted_mixin():
    src = _sources()
    src["experiments.doctor.reading.fake"] = (PKG / "doctor" / "reading" / "fake.py",
                                              "from .unpickler import Reader\nfrom ..errors import InputError\n"
                                              "class Half(Reader):\n    pass\nclass Bad(InputError):\n    pass\n")
    assert straddling_classes(src) == ["experiments.doctor.reading.fake.Half inherits "
                                       "experiments.doctor.reading.unpickler.Reader"]


def private_imports(sources: dict[str, tuple[Path, str]], prefix: str = "experiments.doctor") -> list[str]:
    """``from X import _name`` between two modules of ``prefix``: a module reaching into another's
    private names (the name should be public where it lives, or live where it is used)."""
    known = set(sources)
    out = []
    for name, (path, text) in sorted(sources.items()):
        if not _inside(name, prefix):
            continue
        for local, (target, attr) in _imported_names(name, path, parsed(text), known).items():
            if attr.startswith("_") and not attr.startswith("__") and target != name and _inside(target, prefix):
                out.append(f"{name} imports {target}.{attr}")
    return sorted(out)


def test_no_private_name_crosses_modules_of_the_doctor():
    assert private_imports(_sources()) == []


def test_the_private_import_finder_finds_a_planted_one():
    src = _sources()
    src["experiments.doctor.answers.fake"] = (PKG / "doctor" / "answers" / "fake.py",
                                              "from ..model.engine import _FreeList, Engine\n")
    assert private_imports(src) == ["experiments.doctor.answers.fake imports experiments.doctor.model.engine._FreeList"]


def engine_private_names(text: str, cls: str) -> set[str]:
    """The private attributes and methods of class ``cls`` in ``text`` (``self._x`` it sets, ``def _x``)."""
    tree = parsed(text)
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    out = set()
    for n in ast.walk(node):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("_") \
                and not n.name.startswith("__"):
            out.add(n.name)
        elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self" \
                and isinstance(n.ctx, ast.Store) and n.attr.startswith("_"):
            out.add(n.attr)
    return out


def engine_state_touched(sources: dict[str, tuple[Path, str]]) -> list[str]:
    """Reads or writes of the engine's private state (``x._free``, ``eng._gc_calls``) outside its module."""
    module, cls = ENGINE
    private = engine_private_names(sources[module][1], cls)
    assert {"_free", "_segments", "_ranges", "_gc_calls"} <= private, private
    out = []
    for name, (path, text) in sorted(sources.items()):
        if name == module:
            continue
        for n in ast.walk(parsed(text)):
            if isinstance(n, ast.Attribute) and n.attr in private and \
                    not (isinstance(n.value, ast.Name) and n.value.id in ("self", "cls")):
                out.append(f"{name}:{n.lineno}: .{n.attr}")
    return out


def test_only_the_engine_touches_its_state():
    """The replay reaches the engine through its public seams (seed_segment, malloc_releases,
    can_serve, release_cached_events, segment_bases): each allocator rule is written once, in
    the engine."""
    assert engine_state_touched(_sources()) == []


def test_the_engine_state_finder_finds_planted_reads():
    src = _sources()
    src["experiments.doctor.replaying.fake"] = (PKG / "doctor" / "replaying" / "fake.py",
                                                "def f(eng):\n    return eng._free.get(1), eng.reserved_bytes\n")
    assert engine_state_touched(src) == ["experiments.doctor.replaying.fake:2: ._free"]


def test_no_name_is_both_a_function_and_a_module():
    """The doctor's ``replay`` was both the function its face exports and a module: once every
    module is imported, a package's attribute named like one of its submodules must be that module."""
    import importlib
    import types

    mods = {n: p for n, p in modules().items() if not n.endswith("__main__")}   # (running one runs a command)
    for name in sorted(mods):
        importlib.import_module(name)
    bad = []
    for name, path in sorted(mods.items()):
        if path.name != "__init__.py":
            continue
        pkg = importlib.import_module(name)
        for child in sorted(m for m in mods if m.rpartition(".")[0] == name):
            attr = getattr(pkg, child.rpartition(".")[2], None)
            if not isinstance(attr, types.ModuleType):
                bad.append(f"{child}: {name}.{child.rpartition('.')[2]} is {type(attr).__name__}, not the module")
    assert not bad, bad


def floors(graph: dict[str, set[str]], prefix: str) -> dict[str, int]:
    """Each module's import floor inside ``prefix``: 1 for one that imports none of the others,
    else one above the highest it imports. Packages' ``__init__`` faces that only hand names on
    are left out (nothing inside imports a face)."""
    inside = {m: {t for t in ts if _inside(t, prefix) and t in graph} for m, ts in graph.items() if _inside(m, prefix)}
    faces = {m for m in inside if (PKG.parent / Path(*m.split(".")) / "__init__.py").exists()}
    out: dict[str, int] = {}

    def floor(m: str) -> int:
        if m not in out:
            out[m] = 0   # (no cycle: test_no_import_cycle_anywhere)
            out[m] = 1 + max((floor(t) for t in inside[m] - faces), default=0)
        return out[m]

    for m in sorted(set(inside) - faces):
        floor(m)
    return out


def test_the_doctor_stands_on_at_most_seven_floors():
    got = floors(import_graph(), "experiments.doctor")
    assert len(got) > 15 and max(got.values()) <= DOCTOR_FLOORS, sorted(got.items(), key=lambda kv: -kv[1])[:10]
    # the data flow: the model and the errors below the reading, the reading below the replay,
    # the replay below the answers, the answers below the command line
    assert got["experiments.doctor.model.engine"] < got["experiments.doctor.replaying.replay"] \
        < got["experiments.doctor.answers.report"] < got["experiments.doctor.cli"]
    assert got["experiments.doctor.reading.trace"] < got["experiments.doctor.answers.report"]


def test_the_floor_count_climbs_a_planted_chain():
    graph = {"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": set(), "q": {"p.a"}}
    assert floors(graph, "p") == {"p.a": 3, "p.b": 2, "p.c": 1}
