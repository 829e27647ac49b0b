"""Kept for old instructions: the probe is `python -m experiments probe` (experiments/core/probe.py)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from experiments.core.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["probe", *sys.argv[1:]]))
