"""The allocator doctor as a package of its own: torch-, numpy- and matplotlib-free.

The browser page runs ``experiments.doctor`` in Pyodide, where none of the three exists, and
``python -m experiments doctor`` must start in a fraction of a second: each is checked in a
fresh interpreter, by the modules it has loaded."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RECORDED = ROOT / "experiments" / "recorded" / "alloc.doctor_snapshots" / "nvidia-h200.json"
HEAVY = ("torch", "numpy", "matplotlib")


def _loaded_after(code: str) -> list[str]:
    probe = code + f"\nimport sys, json; print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_probe_sees_a_heavy_import():
    """The checks below can fail: a chapter's plotting (matplotlib) and torch's first use show up."""
    assert "matplotlib" in _loaded_after("import experiments.allocator")
    assert "torch" in _loaded_after("import experiments.core.device as d; d.torch_version()")


def test_import_experiments_doctor_loads_no_torch_numpy_or_matplotlib():
    assert _loaded_after("import experiments.doctor") == []


def test_a_whole_doctor_run_with_what_ifs_loads_none_of_them():
    doc = json.loads(RECORDED.read_text())
    run = next(r for p in doc["points"] if p["params"]["workload"] == "cap" for r in p["data"]["runs"]
               if r["settings"] == "")
    code = ("import json, experiments.doctor as d\n"
            f"rep = d.doctor(json.loads(open({str(RECORDED)!r}).read())['points'][0]['data']['runs'][0], "
            "what_if=['expandable_segments:True', 'max_split_size_mb:64'])\n"
            "rep.text(); json.dumps(rep.to_json())")
    assert run  # the recorded file has the runs the code reads
    assert _loaded_after(code) == []


def test_the_doctor_command_loads_none_of_them(tmp_path):
    doc = json.loads(RECORDED.read_text())
    snap = tmp_path / "snap.json"
    snap.write_text(json.dumps(doc["points"][0]["data"]["runs"][0]["snapshot"]))
    code = ("import sys\nfrom experiments.core.cli import main\n"
            f"code = main(['doctor', {str(snap)!r}, '--json', '--what-if', 'expandable_segments:True'])\n"
            "assert code == 0, code")
    assert _loaded_after(code) == []


def test_import_experiments_stays_light_until_a_name_is_used():
    """experiments/__init__ imports on first use (PEP 562): ex.run still works in notebooks."""
    assert _loaded_after("import experiments") == []
    # a name imports its module when first used (and the registry no longer imports torch itself)
    probe = ("import sys, experiments as ex\nbefore = 'experiments.core.registry' in sys.modules\nex.run\n"
             "assert not before and 'experiments.core.registry' in sys.modules")
    assert _loaded_after(probe) == []
    import experiments as ex

    assert callable(ex.run) and ex.alloc_conf.parse("expandable_segments:True") == {"expandable_segments": True}
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        ex.nope  # noqa: B018


# ----------------------------------------------------------------------------- the rules file

RULES = ROOT / "experiments" / "doctor" / "RULES.md"


def _sections(text: str) -> set[str]:
    """'A', 'A.7', ... from the headings '## A. Device ...' and '### A.7 Splitting ...'."""
    import re

    out = set()
    for m in re.finditer(r"^#{2,3} ([A-Z])(?:\.(\d+))?[. ]", text, re.M):
        out.add(m.group(1) if m.group(2) is None else f"{m.group(1)}.{m.group(2)}")
    return out


def _citations(path: Path) -> list[tuple[int, str]]:
    """(line, 'A.7') for every § citation of the rules file in ``path`` (a range §B-E gives B and E;
    a citation of another note on the same line, seed-posts.md §4.3, is not one)."""
    import re

    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        for m in re.finditer(r"§([A-Z](?:\.\d+)?)(?:-([A-Z]))?", line):
            if "seed-posts.md" in line[: m.start()]:
                continue
            out.append((n, m.group(1)))
            if m.group(2):
                out.append((n, m.group(2)))
    return out


def test_every_rules_citation_resolves_to_a_section_of_the_shipped_rules_file():
    sections = _sections(RULES.read_text())
    assert {"A", "A.2", "A.7", "A.10", "E.2", "I.3"} <= sections
    citing = [p for p in sorted((ROOT / "experiments").rglob("*.py")) + sorted((ROOT / "tests").glob("*.py"))
              if ("RULES.md" in p.read_text() or p.parent.name == "doctor") and p.name != Path(__file__).name]
    assert len(citing) >= 10
    cited = [(p.relative_to(ROOT), n, s) for p in citing for n, s in _citations(p)]
    assert len(cited) >= 25
    assert [c for c in cited if c[2] not in sections] == []
    assert not [p for p in citing if "allocator-rules" in p.read_text()], "cite RULES.md, the file that ships"


def test_the_citation_check_finds_a_dangling_one(tmp_path):
    bad = tmp_path / "x.py"
    bad.write_text("# the split rule (RULES.md " + chr(167) + "A.77), not seed-posts.md " + chr(167) + "4.3\n")
    assert _citations(bad) == [(1, "A.77")] and "A.77" not in _sections(RULES.read_text())


def test_the_rules_file_ships_in_the_package():
    import tomllib

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["experiments"]
    assert "doctor/*.md" in data


# ----------------------------------------------------------------------------- each rule once

def test_the_engine_splits_by_the_one_split_rule(monkeypatch):
    """The split rule the tests check (rules.should_split) is the one the engine runs."""
    import experiments.doctor.model.engine as engine_mod
    from experiments.allocator.model import request_anatomy
    from experiments.doctor.model.rules import AllocatorConfig, MiB, should_split

    calls = []

    def spy(*args, **kwargs):
        calls.append(args)
        return should_split(*args, **kwargs)

    monkeypatch.setattr(engine_mod, "should_split", spy)
    for cfg in (AllocatorConfig(), AllocatorConfig(max_split_size=64 * MiB), AllocatorConfig(expandable_segments=True)):
        for n in (100, 600 * 1024, 3 * MiB + 1, 12 * MiB, 70 * MiB, 130 * MiB - 1):
            a = request_anatomy(n, cfg)
            assert a["split"] == should_split(a["segment_bytes"], a["rounded_bytes"], a["pool"], cfg), (cfg, n)
    assert calls, "the engine did not call rules.should_split"

# (each rule's docstring names its C++ function: tests/test_doctor_engine.py)
