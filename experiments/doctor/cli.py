"""The doctor's command line: ``python -m experiments doctor SNAPSHOT [--what-if SETTINGS ...]
[--cap BYTES | --cap-fraction F] [--json]`` (also ``python -m experiments.doctor ...``).

It imports neither torch, numpy nor matplotlib: starting it costs a fraction of a second.

Exit status: 0 done; 2 bad input (a missing or hostile file, a field of the wrong type, an
impossible trace, a bad option), with one line on stderr naming what is wrong; 1 a bug in the
doctor itself, with one line saying so and where its traceback was written.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
import tempfile
import traceback
from typing import Any

from .loader import DEFAULT_LIMITS, InputError, Limits

HELP = "replay a memory snapshot exactly and compare allocator settings"
DESCRIPTION = """\
Replay a torch.cuda.memory snapshot exactly through a model of PyTorch's caching allocator
and answer "what would my run have done under other allocator settings?".

Record a snapshot in your program with
    torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    ... your code ...
    torch.cuda.memory._dump_snapshot("snap.pickle")
then run this command on the file (a pickle, gzip'd or not, or the lab's JSON form). No GPU
and no torch are needed. The file is read without running anything in it.

The report says whether the replay matched the trace event for event, what was reserved
but unusable at the peak and which live blocks pinned it, and the figures of each --what-if.
If the program ran out of memory, it explains the first OOM: the request that failed, what
was reserved but unusable, which live blocks pinned it (with their stack frames when the
snapshot has them) and which settings would have fitted. --suggest ranks a grid of settings
and prints the PYTORCH_CUDA_ALLOC_CONF line to use.

examples:
  python -m experiments doctor snap.pickle --what-if expandable_segments:True
  python -m experiments doctor snap.pickle.gz --suggest
  python -m experiments doctor snap.pickle --cap 8589934592 --json
"""


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``doctor`` on an argparse subparsers object (the CLI calls this lazily)."""
    p = sub.add_parser("doctor", help=HELP, description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    _arguments(p)
    return p


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("snapshot", help="a _dump_snapshot pickle (.pickle, .pickle.gz) or a JSON snapshot")
    p.add_argument("--what-if", action="append", default=[], metavar="SETTINGS",
                   help="settings in PYTORCH_CUDA_ALLOC_CONF syntax, e.g. expandable_segments:True (repeatable)")
    cap = p.add_mutually_exclusive_group()
    cap.add_argument("--cap", type=int, metavar="BYTES", help="memory cap for the what-ifs, in bytes")
    cap.add_argument("--cap-fraction", type=float, metavar="F", help="memory cap as a fraction of the device (0-1]")
    p.add_argument("--device", type=int, default=0, help="which device's trace (default 0)")
    p.add_argument("--suggest", action="store_true",
                   help="replay a grid of settings (expandable segments, split sizes, roundup divisions, GC "
                        "thresholds under the cap, and combinations), rank them by OOMs and peak reserved, and "
                        "print the PYTORCH_CUDA_ALLOC_CONF line to use")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object (fields: python -c 'import experiments.doctor.report as r; "
                        "print(r.JSON_FIELDS)')")
    p.add_argument("--workers", type=int, metavar="N",
                   help="processes for the what-ifs and the grid (default: this machine's cores, for long traces)")
    p.add_argument("--max-bytes", type=int, metavar="BYTES", default=DEFAULT_LIMITS.max_bytes,
                   help=f"read snapshots up to this size once decompressed (default {DEFAULT_LIMITS.max_bytes >> 20} MiB)")
    p.set_defaults(func=run_cli)


def run_cli(args: argparse.Namespace) -> int:
    """The ``doctor`` command: print the report (or JSON). Returns the exit status: 2 with one
    line for bad input, 1 with one line and a traceback file for a bug in the doctor."""
    try:
        return _run(args)
    except InputError as e:
        print(f"error: {_one_line(e)}", file=sys.stderr)
        return 2
    except MemoryError:
        print("error: the doctor ran out of memory on this snapshot (the machine's memory or a limit set with "
              "ulimit); try a smaller --max-bytes to be told early, or a machine with more memory", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # anything else is a bug of ours, never the reader's input
        where = _write_traceback()
        print(f"error: internal error in the allocator doctor, a bug (not a problem with your snapshot): "
              f"{type(e).__name__}: {_one_line(e)[:200]}. {where}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    from .report import doctor

    if args.cap is not None and args.cap < 0:
        raise InputError(f"--cap must be a number of bytes >= 0, got {args.cap}")
    if args.cap_fraction is not None and not 0 < args.cap_fraction <= 1:
        raise InputError(f"--cap-fraction must be in (0, 1], got {args.cap_fraction}")
    if args.max_bytes < 1:
        raise InputError(f"--max-bytes must be a positive number of bytes, got {args.max_bytes}")
    if args.device < 0:
        raise InputError(f"--device must be a device index >= 0, got {args.device}")
    if args.workers is not None and args.workers < 1:
        raise InputError(f"--workers must be >= 1, got {args.workers}")
    limits = Limits(max_bytes=args.max_bytes)
    rep = doctor(args.snapshot, args.what_if, cap_bytes=args.cap, cap_fraction=args.cap_fraction,
                 device=args.device, limits=limits, suggest=args.suggest, workers=args.workers)
    out = json.dumps(rep.to_json()) if args.json else rep.text()
    try:
        print(out)
    except BrokenPipeError:  # `... | head` closed the pipe: not an error of ours
        sys.stderr.close()
    return 0


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def _write_traceback() -> str:
    """Write the current exception's traceback to a file; say where (or why not)."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = os.path.join(tempfile.gettempdir(), f"memlab-doctor-bug-{stamp}-{os.getpid()}.txt")
    try:
        with open(path, "w") as f:
            f.write(f"python -m experiments doctor {' '.join(sys.argv[1:])}\n\n")
            traceback.print_exc(file=f)
    except OSError as err:
        return f"Its traceback could not be written ({err}); please report the command that failed."
    return f"Its traceback is in {path}; please report it with that file."


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"error: {self.prog}: {message}", file=sys.stderr)
        raise SystemExit(2)


def main(argv: list[str] | None = None) -> int:
    """``python -m experiments.doctor``: the same command without the rest of the package."""
    p = _Parser(prog="python -m experiments.doctor", description=DESCRIPTION,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    _arguments(p)
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    return run_cli(args)


__all__ = ["add_parser", "main", "run_cli"]
