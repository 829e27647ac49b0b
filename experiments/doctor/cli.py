"""The doctor's command line: ``python -m experiments doctor SNAPSHOT [--what-if SETTINGS ...]
[--cap BYTES | --cap-fraction F] [--json]`` (also ``python -m experiments.doctor ...``).

It imports neither torch, numpy nor matplotlib: starting it costs a fraction of a second.

Exit status: 0 done; 2 bad input (a missing or hostile file, a field of the wrong type, an
impossible trace, a bad option), with one line on stderr naming what is wrong; 1 a bug in the
doctor itself, with one line saying so and where its traceback was written.

:func:`outcome` is the command without the printing (what it would print, its exit status and
the report): the page "Check your own snapshot" runs it in the browser, with a progress hook
(:mod:`experiments.doctor.answers.progress`), and shows the same JSON, byte for byte.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import os
import sys
import tempfile
import traceback
from typing import Any, Callable

from ..core.oneline import OneLineParser, one_line
from .errors import InputError
from .reading.loader import DEFAULT_LIMITS, Limits

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
                   help="print one JSON object (fields: python -c 'import experiments.doctor.answers.report as r; "
                        "print(r.JSON_FIELDS)')")
    p.add_argument("--workers", type=int, metavar="N",
                   help="processes for the what-ifs and the grid (default: this machine's cores, for long traces)")
    p.add_argument("--total-memory", type=int, metavar="BYTES",
                   help="the device's memory (torch.cuda.get_device_properties(0).total_memory), which no snapshot "
                        "records: used by --cap-fraction, by per_process_memory_fraction in the recorded settings and "
                        "by the expandable-segment range size (default: the snapshot's, else the lab H200's)")
    p.add_argument("--max-bytes", type=int, metavar="BYTES", default=DEFAULT_LIMITS.max_bytes,
                   help=f"read snapshots up to this size once decompressed (default {DEFAULT_LIMITS.max_bytes >> 20} MiB)")
    p.add_argument("--max-events", type=int, metavar="N", default=DEFAULT_LIMITS.max_events,
                   help=f"read traces of up to this many entries (default {DEFAULT_LIMITS.max_events:,})")
    p.add_argument("--read-budget", type=int, metavar="BYTES", default=DEFAULT_LIMITS.budget_bytes,
                   help="memory the objects of a snapshot other than its trace may take while it is read "
                        f"(default {DEFAULT_LIMITS.budget_bytes >> 20} MiB)")
    p.set_defaults(func=run_cli)


# what the command calls each option of doctor() in its messages
OPTION_NAMES = {"cap_bytes": "--cap", "cap_fraction": "--cap-fraction", "device": "--device", "workers": "--workers",
                "total_memory": "--total-memory"}


@dataclasses.dataclass
class Outcome:
    """What the ``doctor`` command does with its arguments, before anything is printed.

    Attributes:
        status: its exit status: 0 done, 2 bad input, 1 a bug of the doctor's or no memory
            left, 130 interrupted.
        out: what it prints on stdout (the report, or the ``--json`` object); '' unless done.
        error: the one line it prints on stderr (``error: ...``); '' when done.
        report: the :class:`~experiments.doctor.answers.report.Report` (None unless done).
        memory: the doctor ran out of memory (status 1).
        traceback: a bug's traceback (status 1; the command writes it to a file).
    """

    status: int
    out: str = ""
    error: str = ""
    report: Any = None
    memory: bool = False
    traceback: str | None = None


def outcome(args: argparse.Namespace, *, progress: Callable[[Any], Any] | None = None,
            series: bool = False) -> Outcome:
    """Run the ``doctor`` command on parsed ``args`` without printing (see :class:`Outcome`).

    ``progress`` and ``series`` go to :func:`~experiments.doctor.answers.report.doctor` (neither
    changes what is printed). A ``KeyboardInterrupt`` (also one the hook raises) gives status 130.
    """
    try:
        rep = _report(args, progress, series)
    except InputError as e:
        return Outcome(2, error=f"error: {one_line(e)}")
    except MemoryError:
        return Outcome(1, memory=True, error="error: the doctor ran out of memory on this snapshot (the machine's "
                       "memory or a limit set with ulimit); try a smaller --max-bytes to be told early, or a machine "
                       "with more memory")
    except KeyboardInterrupt:
        return Outcome(130, error="error: interrupted")
    except Exception as e:  # anything else is a bug of ours, never the reader's input
        return Outcome(1, traceback=traceback.format_exc(),
                       error=f"error: internal error in the allocator doctor, a bug (not a problem with your "
                             f"snapshot): {type(e).__name__}: {one_line(e)[:200]}.")
    return Outcome(0, out=json.dumps(rep.to_json()) if args.json else rep.text(), report=rep)


def run_cli(args: argparse.Namespace) -> int:
    """The ``doctor`` command: print the report (or JSON). Returns the exit status: 2 with one
    line for bad input, 1 with one line and a traceback file for a bug in the doctor. On a
    terminal, stderr says how far it has got while it works."""
    shown = _Shown() if sys.stderr.isatty() else None
    try:
        res = outcome(args, progress=shown)
    finally:
        if shown is not None:
            shown.clear()
    if res.status:
        where = f" {_write_traceback(res.traceback)}" if res.traceback is not None else ""
        print(res.error + where, file=sys.stderr)
        return res.status
    try:
        print(res.out)
    except BrokenPipeError:  # `... | head` closed the pipe: not an error of ours
        sys.stderr.close()
    return 0


def _report(args: argparse.Namespace, progress: Callable[[Any], Any] | None, series: bool) -> Any:
    from .answers.report import check_options, doctor

    check_options(cap_bytes=args.cap, cap_fraction=args.cap_fraction, device=args.device, workers=args.workers,
                  total_memory=args.total_memory, names=OPTION_NAMES)
    for flag, v in (("--max-bytes", args.max_bytes), ("--max-events", args.max_events),
                    ("--read-budget", args.read_budget)):
        if v < 1:
            raise InputError(f"{flag} must be a positive number, got {v}")
    limits = Limits(max_bytes=args.max_bytes, max_events=args.max_events, budget_bytes=args.read_budget)
    return doctor(args.snapshot, args.what_if, cap_bytes=args.cap, cap_fraction=args.cap_fraction,
                  device=args.device, limits=limits, suggest=args.suggest, workers=args.workers, series=series,
                  progress=progress, total_memory=args.total_memory)


class _Shown:
    """The step the doctor is at, on one line of a terminal's stderr (rewritten in place)."""

    def __init__(self) -> None:
        self.width = 0

    def __call__(self, step: Any) -> None:
        many = step.stage in ("what_if", "grid")
        if step.done and not many:   # (what-ifs run in processes of their own report only when done)
            return
        what = {"read": "reading the snapshot", "replay": "replaying the recorded run", "oom": "explaining the OOM"}
        if many:
            kind = "what-if" if step.stage == "what_if" else "suggestion: setting"
            text = (f"{kind} {step.index + 1} of {step.count}{' done' if step.done else ''}: "
                    f"{step.settings or 'defaults'}")
        else:
            text = what.get(step.stage, step.stage)
        line = f"doctor: {text}"[:100]
        sys.stderr.write("\r" + line.ljust(self.width))
        sys.stderr.flush()
        self.width = len(line)

    def clear(self) -> None:
        if self.width:
            sys.stderr.write("\r" + " " * self.width + "\r")
            sys.stderr.flush()


def _write_traceback(text: str) -> str:
    """Write a bug's traceback to a file; say where (or why not)."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = os.path.join(tempfile.gettempdir(), f"memlab-doctor-bug-{stamp}-{os.getpid()}.txt")
    try:
        with open(path, "w") as f:
            f.write(f"python -m experiments doctor {' '.join(sys.argv[1:])}\n\n")
            f.write(text)
    except OSError as err:
        return f"Its traceback could not be written ({err}); please report the command that failed."
    return f"Its traceback is in {path}; please report it with that file."


def main(argv: list[str] | None = None) -> int:
    """``python -m experiments.doctor``: the same command without the rest of the package."""
    p = OneLineParser(prog="python -m experiments.doctor", description=DESCRIPTION,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    _arguments(p)
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    return run_cli(args)


__all__ = ["Outcome", "add_parser", "main", "outcome", "run_cli"]
