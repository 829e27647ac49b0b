"""Build the book for the tests the way `make book` / `make book-student` do."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build_book(out: Path, *, student: bool = False, cache: Path | None = None) -> Path:
    """Build the full (or student) book with ``--path-output out``; returns ``out``.

    Args:
        out: the folder the build goes into (its ``_build/html`` holds the pages).
        student: the student edition (scripts/student_edition.py's config).
        cache: an execution cache to reuse (the full book's), so that the student edition
            does not execute the notebooks again.

    Raises:
        AssertionError: the build failed (its log's tail is the message).
    """
    import yaml

    env = {**os.environ, "CUDA_MEMLAB_MODE": "recorded", "CUDA_MEMLAB_STATIC": "1"}
    py = sys.executable
    subprocess.run([py, str(ROOT / "scripts" / "sync_notebooks.py")], check=True, cwd=ROOT, capture_output=True)
    jb = [str(Path(py).parent / "jupyter-book"), "build", str(ROOT), "--path-output", str(out),
          "--warningiserror", "--keep-going"]
    if student:
        import importlib.util

        spec = importlib.util.spec_from_file_location("student_edition", ROOT / "scripts" / "student_edition.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        config = mod.student_config()
        if cache is not None:
            config["execute"]["cache"] = str(cache)
        out.mkdir(parents=True, exist_ok=True)
        cfg = out / "student_config.yml"
        cfg.write_text(yaml.safe_dump(config, sort_keys=False))
        jb += ["--config", str(cfg)]
    r = subprocess.run(jb, capture_output=True, text=True, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    return out
