"""Command line: python -m experiments {record,list,claims,grade,doctor}

record   run experiments on this GPU and write their recorded results
list     experiments, their chapters, and the GPUs with recorded results
claims   evaluate the posts' claims (live on a GPU, or --recorded) as text or --json
grade    run and score students' notebooks, each in a sandbox, into a CSV (or --json)
doctor   replay a memory snapshot exactly and compare allocator settings (chapter 1)
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

from typing import Any

from . import chapters
from .oneline import OneLineParser
from .tables import Table

# registry, store, claims and device import torch: each command imports what it uses, so that
# a command that needs no torch (doctor) starts in a fraction of a second.


def _select(chapter: int | None, experiment_ids: list[str] | None) -> list[Any]:
    from . import registry

    if experiment_ids:
        return [registry.get(e) for e in experiment_ids]
    # experiments on a budget of their own are recorded only when named (--experiment ID)
    exps = [e for e in registry.all_experiments(chapter) if not e.own_budget]
    if not exps:
        raise SystemExit(f"no experiments in chapter {chapter}")
    return exps


def cmd_record(args: argparse.Namespace) -> int:
    from . import registry

    exps = _select(args.chapter, args.experiment)
    if not args.experiment:
        for e in registry.all_experiments(args.chapter):
            if e.own_budget:
                print(f"skipped {e.id} (on a budget of its own: record --experiment {e.id})")
    paths, failures = registry.record(exps, root=Path(args.out) if args.out else None, progress=not args.quiet)
    for p in paths:
        print(f"wrote {p}")
    for exp_id, err in failures.items():
        print(f"FAILED {exp_id} (nothing written):\n{err}", file=sys.stderr)
    return 1 if failures else 0


def cmd_list(args: argparse.Namespace) -> int:
    from . import registry, store

    rows = []
    for e in registry.all_experiments(args.chapter):
        gpus = store.recorded_gpus(e.id)
        rows.append((str(e.chapter), e.id, str(len(e.grid)), ", ".join(gpus) or "-", e.title))
    print(Table(["ch", "experiment", "points", "recorded on", "title"], rows))
    return 0


def cmd_claims(args: argparse.Namespace) -> int:
    from . import claims as claims_mod
    from .device import has_cuda

    mode = "recorded" if args.recorded else "live"
    if mode == "live" and not has_cuda():
        print("no CUDA GPU visible: evaluating the results recorded on the lab GPU (say --recorded to "
              "ask for them directly)", file=sys.stderr)
        mode = "recorded"
    results = claims_mod.evaluate_all(args.chapter, mode=mode)
    if args.json:
        json.dump([r.to_json() for r in results], sys.stdout, indent=1)
        print()
    else:
        print(claims_mod.ClaimsTable(results))
    return 1 if args.strict and any(r.holds is not True for r in results) else 0


def cmd_probe(args: argparse.Namespace) -> int:
    from . import probe

    report = probe.probe()
    print(probe.report_json(report) if args.json else probe.report_text(report))
    return 0


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m experiments", description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    # Chapter commands (chapters.COMMANDS): the chapter's module is imported only when its
    # command is the one being run; otherwise a placeholder keeps it in --help.
    for cmd in chapters.COMMANDS:
        if argv and argv[0] == cmd.name:
            importlib.import_module(f"experiments.{cmd.module}").add_parser(sub)
        else:
            sub.add_parser(cmd.name, help=cmd.help)

    rec = sub.add_parser("record", help="run experiments on this GPU and write recorded results",
                         description="Run experiments on this GPU and write their recorded results. Without "
                                     "--experiment, every experiment of the chapters except those on a budget of "
                                     "their own (the doctor's: --experiment alloc.doctor_snapshots, --experiment "
                                     "alloc.doctor_cases).")
    rec.add_argument("--chapter", type=int, choices=chapters.NUMBERS,
                     help=f"only this chapter ({chapters.NUMBERS[0]}-{chapters.NUMBERS[-1]})")
    rec.add_argument("--experiment", action="append", help="only this experiment id (repeatable)")
    rec.add_argument("--out", help="directory to write into (default: the package's recorded/)")
    rec.add_argument("--quiet", action="store_true", help="no progress bar")
    rec.set_defaults(func=cmd_record)

    ls = sub.add_parser("list", help="experiments and the GPUs with recorded results")
    ls.add_argument("--chapter", type=int, choices=chapters.NUMBERS)
    ls.set_defaults(func=cmd_list)

    cl = sub.add_parser("claims", help="evaluate the posts' claims")
    cl.add_argument("--recorded", action="store_true",
                    help="use recorded results instead of running live (the default without a GPU)")
    cl.add_argument("--json", action="store_true", help="print a JSON list of claim results")
    cl.add_argument("--chapter", type=int, choices=[n for n in chapters.NUMBERS if n > 0])
    cl.add_argument("--strict", action="store_true", help="exit 1 unless every claim holds")
    cl.set_defaults(func=cmd_claims)

    pr = sub.add_parser("probe", help="what this machine offers the book: GPU, versions, torch features")
    pr.add_argument("--json", action="store_true", help="print the report as JSON")
    pr.set_defaults(func=cmd_probe)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(argv).parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, LookupError, RuntimeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `... | head` closed the pipe: not an error of ours
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
