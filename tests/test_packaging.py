"""Install story: lower bounds for Colab, exact pins for builds, recorded results shipped in the wheel."""
import re
import subprocess
import sys
tomllib = __import__("pytest").importorskip("tomllib")
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _reqs(lines):
    return [l.split("#")[0].strip() for l in lines if l.split("#")[0].strip()]


def test_package_dependencies_are_lower_bounds_only():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for d in deps:
        assert re.fullmatch(r"[A-Za-z0-9_.-]+>=[0-9.]+", d), f"{d}: a lower bound only, so Colab keeps its packages"
    assert "torch>=2.4" in deps


def test_requirements_cover_the_package_and_keep_lower_bounds():
    reqs = _reqs((ROOT / "requirements.txt").read_text().splitlines())
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert set(deps) <= set(reqs)
    for r in reqs:
        assert "==" not in r, f"{r}: exact pins belong in constraints.txt"
    assert "jupyter-book>=1.0.4,<2" in reqs


def test_constraints_pin_everything_and_a_cpu_torch():
    pins = _reqs((ROOT / "constraints.txt").read_text().splitlines())
    assert all("==" in p for p in pins)
    names = {p.split("==")[0].lower() for p in pins}
    for r in _reqs((ROOT / "requirements.txt").read_text().splitlines()):
        name = re.split(r"[<>=]", r)[0].lower()
        assert name in names, f"{name} is not pinned in constraints.txt"
    assert "torch==2.13.0" in pins


@pytest.mark.slow
def test_wheel_ships_recorded_results_and_schema(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path), str(ROOT)], check=True)
    wheel = next(tmp_path.glob("cuda_memory_lab-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    recorded = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "experiments" / "recorded").glob("*/*.json"))
    assert recorded and set(recorded) <= set(names)
    assert "experiments/schemas/recorded.schema.json" in names
    assert not any(n.startswith("tests/") for n in names)
