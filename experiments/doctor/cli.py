"""The doctor's command line: ``python -m experiments doctor SNAPSHOT [--what-if SETTINGS ...]
[--cap BYTES | --cap-fraction F] [--json]``.

It imports neither torch, numpy nor matplotlib: starting it costs a fraction of a second.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .report import doctor


def add_parser(sub: Any) -> None:
    """Register ``doctor`` on an argparse subparsers object (the CLI calls this lazily)."""
    p = sub.add_parser("doctor", help="replay a memory snapshot and compare allocator settings",
                       description="Replay a torch.cuda.memory snapshot exactly and answer 'what if I changed "
                                   "the allocator settings?'")
    p.add_argument("snapshot", help="a _dump_snapshot pickle or a JSON snapshot")
    p.add_argument("--what-if", action="append", default=[], metavar="SETTINGS",
                   help="settings in PYTORCH_CUDA_ALLOC_CONF syntax, e.g. expandable_segments:True (repeatable)")
    cap = p.add_mutually_exclusive_group()
    cap.add_argument("--cap", type=int, metavar="BYTES", help="memory cap for the what-ifs, in bytes")
    cap.add_argument("--cap-fraction", type=float, metavar="F", help="memory cap as a fraction of the device (0-1]")
    p.add_argument("--device", type=int, default=0, help="which device's trace (default 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run_cli)


def run_cli(args: argparse.Namespace) -> int:
    """The ``doctor`` command: print the report (or JSON); errors become one line and exit 2."""
    if args.cap is not None and args.cap < 0:
        raise ValueError(f"--cap must be a number of bytes >= 0, got {args.cap}")
    if args.cap_fraction is not None and not 0 < args.cap_fraction <= 1:
        raise ValueError(f"--cap-fraction must be in (0, 1], got {args.cap_fraction}")
    rep = doctor(args.snapshot, args.what_if, cap_bytes=args.cap, cap_fraction=args.cap_fraction, device=args.device)
    if args.json:
        json.dump(rep.to_json(), sys.stdout)
        print()
    else:
        print(rep.text())
    return 0


__all__ = ["add_parser", "run_cli"]
