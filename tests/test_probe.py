"""`python -m experiments probe` runs from the installed package (what the instructors page recommends)."""
import json
import subprocess
import sys

import torch


def test_probe_reports_this_torch_and_its_features():
    r = subprocess.run([sys.executable, "-m", "experiments", "probe", "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["torch"] == torch.__version__
    # torch.cuda.set_sync_debug_mode exists in every torch the book supports (>= 2.4).
    assert report["features"]["torch.cuda.set_sync_debug_mode"] is True
    assert (report["gpu"] is None) == (not torch.cuda.is_available())


def test_probe_text_names_the_gpu_or_says_none():
    r = subprocess.run([sys.executable, "-m", "experiments", "probe"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith(f"torch {torch.__version__}")
    assert ("none visible" in r.stdout) == (not torch.cuda.is_available())
