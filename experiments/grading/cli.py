"""The ``grade`` command: ``python -m experiments grade SUBMISSION... [--out grades.csv]``
(registered in :data:`experiments.core.chapters.COMMANDS`; imported only when it runs)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .sandbox import Limits, SandboxUnavailable

UNSAFE_HELP = ("run the submissions WITHOUT a sandbox, with your account's rights (files, network, "
               "processes); only for notebooks you trust")


def add_parser(sub: argparse._SubParsersAction) -> None:
    gr = sub.add_parser("grade", help="run and score students' notebooks, each in a sandbox (no GPU needed)")
    gr.add_argument("submission", nargs="+", metavar="SUBMISSION", help="a notebook (.ipynb) or a folder of them")
    gr.add_argument("--out", help="write the grades to this file (default: print them)")
    gr.add_argument("--json", action="store_true", help="a JSON list of rows instead of CSV")
    gr.add_argument("--live", action="store_true",
                    help="run on this machine's GPU and grade the GPU exercises too (default: recorded mode)")
    gr.add_argument("--timeout", type=float, default=600.0,
                    help="time limit per notebook, everything included, seconds (default 600)")
    gr.add_argument("--jobs", type=int, default=1, help="notebooks graded at once (default 1)")
    gr.add_argument("--feedback", choices=("graded", "full"), default="graded",
                    help="graded: correct / wrong / which part (default); full: the checks' messages")
    gr.add_argument("--memory-mib", type=int, default=Limits.memory_mib,
                    help=f"memory per process of a submission, MiB (default {Limits.memory_mib})")
    gr.add_argument("--unsafe-no-sandbox", action="store_true", help=UNSAFE_HELP)
    gr.set_defaults(func=cmd_grade)


def cmd_grade(args: argparse.Namespace) -> int:
    from ..core.device import has_cuda
    from . import grader as grading

    if not args.timeout > 0:
        raise ValueError(f"--timeout must be > 0 seconds, got {args.timeout:g}")
    if args.out and Path(args.out).is_dir():
        raise ValueError(f"--out {args.out!r} is a folder; give a file name such as grades.csv")
    if args.live and not has_cuda():
        raise ValueError("--live needs a CUDA GPU and none is visible; leave it out to grade in recorded mode")
    try:
        limits = Limits(memory_mib=args.memory_mib).validate()
    except ValueError as e:
        raise ValueError(f"--memory-mib: {e}") from None
    hide = [str(Path(args.out).resolve().parent)] if args.out else []
    try:
        rows = grading.grade(args.submission, timeout_s=args.timeout, live=args.live, feedback=args.feedback,
                             jobs=args.jobs, unsafe=args.unsafe_no_sandbox, limits=limits, hide=hide,
                             progress=lambda line: print(line, file=sys.stderr, flush=True))
    except SandboxUnavailable as e:
        raise RuntimeError(f"refusing to run untrusted notebooks unsandboxed: {e}; "
                           "or pass --unsafe-no-sandbox to run them with your rights") from None
    text = grading.rows_to_json(rows) if args.json else grading.rows_to_csv(rows)
    if args.out:
        grading.write_atomic(args.out, text)
        print(f"wrote {args.out} ({sum(r.exercise != grading.TOTAL for r in rows)} exercise rows)", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
