"""Install story: lower bounds for Colab, exact pins for builds, recorded results shipped in the wheel."""
import json
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


# What a reader's fresh environment runs after `pip install` of the wheel: every chapter
# imports, and one recorded experiment per chapter renders through the chapter's plot.
_OUTSIDE = """
import importlib, io, json, sys
import experiments as ex
from experiments.core import chapters, registry
out = {"package": ex.__file__, "rendered": {}}
for c in chapters.CHAPTERS:
    module = importlib.import_module("experiments." + c.module)
    exp = registry.all_experiments(c.number)[0]
    r = ex.run(exp.id, mode="recorded")
    fig = getattr(module, "plot_" + exp.id.split(".", 1)[1])(r)
    fig.savefig(io.BytesIO(), format="png")
    out["rendered"][exp.id] = r.provenance.gpu_name
json.dump(out, sys.stdout)
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The wheel, built from a copy of the source: setuptools would reuse a stale build/ of the checkout."""
    import shutil

    src, out = tmp_path_factory.mktemp("src") / "checkout", tmp_path_factory.mktemp("wheel")
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".venv", ".git", "build", "_build", "*.egg-info",
                                                             "__pycache__", ".pytest_cache"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "-w", str(out), str(src)], check=True)
    wheels = list(out.glob("cuda_memory_lab-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.mark.slow
def test_wheel_ships_every_subpackage_recorded_results_and_schema(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    packages = sorted(p.parent.relative_to(ROOT).as_posix() for p in (ROOT / "experiments").rglob("__init__.py"))
    assert len(packages) >= 6, packages          # the face, core and one package per chapter
    for package in packages:
        modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / package).glob("*.py")}
        assert modules <= names, f"{package}: not in the wheel: {sorted(modules - names)}"
    recorded = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "experiments" / "recorded").glob("*/*.json"))
    # the doctor's test oracles (alloc.doctor_cases, several MB) stay in the repository, out of the wheel
    oracles = {r for r in recorded if r.startswith("experiments/recorded/alloc.doctor_cases/")}
    assert recorded and set(recorded) - oracles <= names
    assert not [n for n in names if n.startswith("experiments/recorded/alloc.doctor_cases/")]
    assert "experiments/schemas/recorded.schema.json" in names
    assert not any(n.startswith(("tests/", "book/", "scripts/")) for n in names)


@pytest.mark.slow
def test_the_wheel_works_in_a_fresh_environment_outside_the_checkout(wheel, tmp_path):
    """A virtual environment of its own, the wheel installed without its dependencies (they
    come from this environment's site-packages through a .pth file: its paths are added, its
    own .pth files, among them this checkout's editable install, are not run), and a working
    directory outside the checkout, so nothing can be imported from the source tree."""
    import sysconfig

    env_dir = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    python = env_dir / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(site) / "checkout_dependencies.pth").write_text("\n".join(sorted(deps)) + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                    "--no-index", str(wheel)], check=True)
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("PYTHONPATH", "CUDA_MEMLAB_RECORDED_DIR")}
    env["MPLBACKEND"] = "Agg"
    r = subprocess.run([str(python), "-c", _OUTSIDE], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert Path(out["package"]).is_relative_to(Path(site)), f"imported {out['package']}, not the installed wheel"
    from experiments.core import chapters

    assert len(out["rendered"]) == len(chapters.CHAPTERS)
    assert set(out["rendered"].values()) == {"NVIDIA H200"}
    cli = subprocess.run([str(env_dir / "bin" / "cuda-memory-lab"), "list"], cwd=tmp_path, env=env,
                         capture_output=True, text=True)
    assert cli.returncode == 0 and "alloc.anatomy" in cli.stdout, cli.stderr[-2000:]
