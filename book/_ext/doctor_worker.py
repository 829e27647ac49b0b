"""The Python half of the page "Check your own snapshot": it runs inside Pyodide, in the page's
Web Worker (``book/_static/doctor-worker.mjs``), and turns a dropped file into what the page shows.

It runs the doctor's own command line (:func:`experiments.doctor.cli.outcome`): the arguments
are the ones ``python -m experiments doctor FILE --what-if ... --json`` would get, parsed by the
same parser, and the JSON is what that command prints, byte for byte; a bad file or setting
gives the command's one-line ``error: ...``. The doctor tells its progress hook each step
(:mod:`experiments.doctor.answers.progress`): the worker says how far it got and times the
replay, each what-if and each setting of the grid. Beside the JSON it returns what the page
draws: the report's text, reserved and allocated bytes over the requests (bucket maxima, so
that no peak is lost), and the segments at the recorded run's peak.

The first answer comes before the grid: when the doctor reports the replay and the reader's
what-ifs done (its ``report`` step), the worker hands the page that answer (the figures, the
figure and, after them, the report's text and the segments), then each setting of the grid as
it finishes, so that the page shows them while the grid runs and can stop it there.

The build ships this file in the same zip as the doctor's package (``book/_ext/doctor_page.py``);
it also runs in CPython, where the tests compare it with the command line.
"""
from __future__ import annotations

import argparse
import json
import time
import traceback
from typing import Any, Callable, Sequence

from experiments.core.oneline import OneLineParser

PROG = "python -m experiments"   # the command line's prog: usage errors read the same
POINTS = 600                     # points per line of the figure: more than a phone's width in px
SEGMENTS_SHOWN = 12              # rows of the segment map, as in the notebook's figure


class UsageError(Exception):
    """argparse refused the arguments (the message is the command line's one line)."""


class _Parser(OneLineParser):
    # The command line prints its one-line usage error and exits; the page shows that line.
    def fail(self, line: str) -> Any:
        raise UsageError(line)


def argv(path: str, what_if: Sequence[str] = (), *, cap_bytes: int | None = None,
         cap_fraction: float | None = None, suggest: bool = False, total_memory: int | None = None) -> list[str]:
    """The command line's arguments for these settings (after ``python -m experiments``).

    Args:
        path: the snapshot file (in the worker: its copy in Pyodide's in-memory file system).
        what_if: settings strings in ``PYTORCH_CUDA_ALLOC_CONF`` syntax, in the order given.
        cap_bytes / cap_fraction: the what-ifs' memory cap (at most one).
        suggest: ask for the ranked settings (only where the command line has ``--suggest``).
        total_memory: the device's memory in bytes (``--total-memory``), which no snapshot records.
    """
    out = ["doctor", path]
    for s in what_if:
        out += ["--what-if", s]
    if cap_bytes is not None:
        out += ["--cap", str(cap_bytes)]
    if cap_fraction is not None:
        out += ["--cap-fraction", repr(float(cap_fraction))]
    if total_memory is not None:
        out += ["--total-memory", str(total_memory)]
    if suggest:
        out.append("--suggest")
    return out + ["--json"]


def _parser() -> argparse.ArgumentParser:
    from experiments.doctor import cli

    parser = _Parser(prog=PROG)
    cli.add_parser(parser.add_subparsers(dest="command", required=True))
    return parser


def options() -> dict[str, Any]:
    """What the command line offers, for the page's controls: ``{"suggest": bool}``."""
    flags = {a for action in _doctor_subparser()._actions for a in action.option_strings}
    return {"suggest": "--suggest" in flags}


def warm_up() -> None:
    """Import everything a run needs (lazy imports included) by running the doctor once on an
    empty snapshot with a what-if: the page's worker does this before the reader's file is read,
    and the build does it before it takes Pyodide's memory snapshot (doctor_snapshot.mjs)."""
    import os
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "empty.json")
        with open(path, "w") as f:
            json.dump({"segments": [], "device_traces": [[]]}, f)
        res = run(path, ["expandable_segments:True,max_split_size_mb:64"], cap_bytes=1 << 30)
    if not res["ok"]:
        raise RuntimeError(f"the doctor failed on an empty snapshot: {res}")
    details(res["report"])


def _doctor_subparser() -> argparse.ArgumentParser:
    parser = _parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["doctor"]


def _envelope(values: Sequence[int], n: int) -> tuple[list[int], list[int]]:
    """(first request of each bucket, the bucket's largest value): at most ``n`` points, and
    every maximum kept, so the figure's peak is the run's peak."""
    size = len(values)
    step = max(1, -(-size // n))
    xs = list(range(0, size, step))
    return xs, [max(values[i:i + step]) for i in xs]


def _order(seg: dict[str, Any]) -> tuple[int, int]:
    # As the notebook's figure (experiments.doctor.answers.figure): segments that live blocks pin
    # first, most free bytes first, then the largest others.
    live = any(b["state"] != "inactive" for b in seg["blocks"])
    free = sum(b["size"] for b in seg["blocks"] if b["state"] == "inactive")
    return (0 if live and free else 1, -free if live else -seg["total_size"])


def figure_data(report: Any, points: int = POINTS, known: dict[int, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The timeline the page draws: reserved and allocated bytes per setting (recorded run first).

    Returns:
        ``{"requests": int, "runs": [{"label", "recorded", "requests", "x", "reserved", "allocated",
        "peak_reserved_bytes", "ooms": [request index, ...] (at most 200)}]}``; at most
        ``points`` values per line, each the largest of its bucket of requests; bytes are whole
        numbers, x are request indices.
    """
    # the run itself when the doctor kept its series (series=True)
    return _figure([report.series(shown) for shown in [report.replay] + list(report.what_ifs)], points, known)


def _figure(shown: Sequence[Any], points: int = POINTS,
            known: dict[int, dict[str, Any]] | None = None) -> dict[str, Any]:
    """:func:`figure_data` of Runs that kept their series, the recorded run first. ``known``:
    the recorded run's line by ``id(run)``, kept from the page's first answer (:func:`run`):
    its envelope is most of the time from the what-if's end to the answer that shows it."""
    runs = []
    for k, run in enumerate(shown):
        line = known.get(id(run)) if known is not None and k == 0 else None
        if line is None:
            xs, res = _envelope(run.reserved, points)
            _, alloc = _envelope(run.allocated, points)
            line = {"label": ("recorded: " if k == 0 else "") + (run.settings or "defaults"), "recorded": k == 0,
                    "requests": len(run.reserved),
                    "x": xs, "reserved": res, "allocated": alloc, "peak_reserved_bytes": run.peak_reserved_bytes,
                    "ooms": [i for i, _ in run.oom_requests if i >= 0][:200]}
            if known is not None and k == 0:
                known[id(run)] = line
        runs.append(line)
    return {"requests": max((r["requests"] for r in runs), default=0), "runs": runs}


def segment_data(report: Any) -> dict[str, Any]:
    """The segments at the recorded run's peak, pinned ones first (at most 12), for the segment map.

    Returns:
        ``{"segments_total": int, "segments": [{"address", "total_size", "pool", "stream",
        "expandable", "blocks": [{"size", "state"}] in address order}]}``.
    """
    layout = report.peak_layout(report.replay)
    shown = sorted(layout, key=_order)[:SEGMENTS_SHOWN]
    return {"segments_total": len(layout),
            "segments": [{"address": s["address"], "total_size": s["total_size"], "pool": s.get("pool"),
                          "stream": s.get("stream"), "expandable": bool(s.get("is_expandable", False)),
                          "blocks": [{"size": b["size"], "state": b["state"]} for b in s["blocks"]]}
                         for s in shown]}


MEMORY = ("error: the snapshot does not fit in this browser tab's memory; run the doctor on your machine: "
          "pip install cuda-memory-lab, then python -m experiments doctor FILE")


def run(path: str, what_if: Sequence[str] = (), *, cap_bytes: int | None = None, cap_fraction: float | None = None,
        suggest: bool = False, total_memory: int | None = None, progress: Callable[[str], Any] | None = None,
        partial: Callable[[str, str], Any] | None = None) -> dict[str, Any]:
    """Run the doctor's command line on ``path`` and keep its report for the page.

    ``progress`` is told, as text, the step the doctor starts: reading the snapshot, replaying
    the recorded run, each what-if, each setting of the suggestion's grid, writing the result.

    ``partial(kind, json_text)`` is given what is ready before the end, in this order:

    * ``"replay"`` once the recorded run is replayed, when what-ifs follow: :func:`replay_answer`;
    * ``"early"`` once the replay and the what-ifs are done: :func:`early_answer`;
    * ``"details"`` right after: :func:`details` of that report (``ok`` added);
    * ``"grid"`` for each setting of the grid as it finishes: ``{"index", "count" (the settings
      known so far: the combinations are added after the single settings), "settings",
      "seconds", "row": the run's figures as the suggestion's rows give them, before the
      ranking}``.

    An exception ``partial`` raises stops the doctor, as the progress hook's does.

    Returns:
        ``{"ok": True, "argv", "json_text" (the command's stdout), "json" (parsed), "figure",
        "oom_text" (the report's OOM explanation or None), "stopped" (the report's lines on what-ifs
        that run out of memory where the recording did not: Report.stopped_lines),
        "seconds": {"total", "read", "replay", "what_if": [...], "grid": [...]}}``, and the report as
        ``report`` (a Python object, for :func:`details`); or ``{"ok": False, "argv", "error": the
        command's one line}`` for bad input or settings (its exit status 2) and when the tab runs
        out of memory; or ``{"ok": False, "argv", "bug": the command's line and the traceback}``
        for a bug in the doctor (its exit status 1).
    """
    from experiments.doctor import cli

    say = progress or (lambda _msg: None)
    args_list = argv(path, what_if, cap_bytes=cap_bytes, cap_fraction=cap_fraction, suggest=suggest,
                     total_memory=total_memory)
    t0 = time.perf_counter()
    try:
        args = _parser().parse_args(args_list)
    except UsageError as e:
        return {"ok": False, "error": str(e), "argv": args_list}
    timings: dict[str, Any] = {"read": 0.0, "replay": 0.0, "what_if": [], "grid": []}
    base: dict[str, Any] = {}
    lines: dict[int, dict[str, Any]] = {}     # the recorded run's line of the figure, made once

    def step(s: Any) -> None:
        # The doctor's steps (experiments.doctor.answers.progress): say the one that starts,
        # time the ones that end. The series it keeps for the figure change no figure of the JSON.
        if s.done and partial is not None:
            if s.stage == "read":
                base["trace"] = s.result
            elif s.stage == "replay":
                base["run"] = s.result
                if args.what_if and "trace" in base:
                    partial("replay", json.dumps(replay_answer(base["trace"], s.result, args.what_if, s.seconds,
                                                              timings["read"], known=lines)))
            elif s.stage == "report":
                partial("early", json.dumps(early_answer(s.result, args_list, timings,
                                                         grid=_grid_follows(args, s.result), known=lines)))
                say("the report and the segments at the peak")
                partial("details", json.dumps({"ok": True, **details(s.result)}))
            elif s.stage == "grid":
                partial("grid", json.dumps({"index": s.index, "count": s.count, "settings": s.settings,
                                            "seconds": s.seconds, "row": grid_row(s.result, base.get("run"))}))
        if not s.done:
            if s.stage == "read":
                say("reading the snapshot")
            elif s.stage == "replay":
                say("replaying the recorded run")
            elif s.stage == "what_if":
                say(f"what-if {s.index + 1} of {s.count}: {s.settings or 'defaults'}")
            elif s.stage == "grid":
                say(f"the grid: setting {s.index + 1} of {s.count}, {s.settings or 'defaults'}")
        elif s.stage in ("read", "replay"):
            timings[s.stage] = s.seconds
        elif s.stage in ("what_if", "grid"):
            timings[s.stage].append(s.seconds)
        elif s.stage == "done":
            say("writing the result")

    res = cli.outcome(args, progress=step, series=True)
    if res.memory:
        return {"ok": False, "argv": args_list, "error": MEMORY}
    if res.traceback is not None:
        return {"ok": False, "argv": args_list, "bug": res.error + "\n\n" + res.traceback}
    if res.status:
        return {"ok": False, "argv": args_list, "error": res.error}
    rep = res.report
    fig = figure_data(rep)
    timings["total"] = time.perf_counter() - t0
    oom = rep.oom_text() if rep.oom is not None else None
    return {"ok": True, "argv": args_list, "json_text": res.out + "\n", "json": json.loads(res.out), "oom_text": oom,
            "stopped": rep.stopped_lines(), "figure": fig, "seconds": timings, "report": rep}


def _grid_follows(args: argparse.Namespace, report: Any) -> str | None:
    """Why the doctor runs the grid after its ``report`` step: ``"suggest"`` (asked for),
    ``"oom"`` (to say which settings would have fitted under the trace's first out-of-memory
    error: :func:`experiments.doctor.answers.report.doctor` explains it by default), or None."""
    from experiments.doctor.answers.oom import first_oom

    if args.suggest:
        return "suggest"
    return "oom" if first_oom(report.trace) is not None else None


def replay_answer(trace: Any, run: Any, what_if: Sequence[str], seconds: float, read_seconds: float = 0.0,
                  known: dict[int, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The page's very first answer on a long trace: the recorded run replayed, before the
    what-ifs (the doctor's ``replay`` step).

    Returns:
        ``{"ok": True, "replay_only": True, "pending": the what-ifs still to run,
        "json": {"trace_events", "settings", "replay", "what_if": []} (the fields of the
        ``--json`` object known so far, as it writes them), "figure": the recorded run's line,
        "seconds": {"read", "replay", "what_if": []}}``.
    """
    return {"ok": True, "replay_only": True, "pending": list(what_if),
            "json": {"trace_events": len(trace.events), "settings": trace.settings, "replay": run.summary(),
                     "what_if": []},
            "figure": _figure([run], known=known), "seconds": {"read": read_seconds, "replay": seconds, "what_if": []}}


def early_answer(report: Any, args_list: Sequence[str], timings: dict[str, Any], grid: str | None,
                 known: dict[int, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The page's first answer, at the doctor's ``report`` step (the replay and the what-ifs
    done; the suggestion and the OOM explanation, which need the grid, not yet).

    Returns:
        ``{"ok": True, "early": True, "argv", "json_text", "json", "figure", "oom_text": None, "stopped",
        "seconds": {"read", "replay", "what_if": [...]}, "grid": why a grid follows or None}``:
        ``json_text`` is the report's ``--json`` object so far, the command line's answer
        without ``--suggest`` (byte for byte when the trace has no out-of-memory error);
        ``argv`` the command that gives it.
    """
    text = json.dumps(report.to_json()) + "\n"
    return {"ok": True, "early": True, "argv": [a for a in args_list if a != "--suggest"], "json_text": text,
            "json": json.loads(text), "figure": figure_data(report, known=known), "oom_text": None, "stopped": report.stopped_lines(),
            "seconds": {"read": timings["read"], "replay": timings["replay"], "what_if": list(timings["what_if"]),
                        "grid": []}, "grid": grid}


def grid_row(run: Any, base: Any) -> dict[str, Any]:
    """A setting of the grid as the suggestion's rows give it (settings, its figures and
    certainty, ``saved_bytes`` and ``saved_range_bytes`` against the recorded run's peak), from
    its Run as it finishes, before the ranking (which may still replace the recorded setting's
    row with the exact replay's figures)."""
    row = run.summary()
    if base is not None:
        row["saved_bytes"] = base.peak_reserved_bytes - run.peak_reserved_bytes
        lo, hi = run.peak_reserved_range_bytes or (run.peak_reserved_bytes, run.peak_reserved_bytes)
        row["saved_range_bytes"] = [base.peak_reserved_bytes - hi, base.peak_reserved_bytes - lo]
    return row


def details(report: Any) -> dict[str, Any]:
    """The slower half of the page: the report's text (a second pass up to each run's peak) and
    the segments at the recorded run's peak. Returns ``{"text", "segments", "segments_total",
    "seconds"}``."""
    t = time.perf_counter()
    seg = segment_data(report)
    return {"text": report.text(), **seg, "seconds": time.perf_counter() - t}


def run_json(path: str, request_json: str, progress: Callable[[str], Any] | None = None,
             partial: Callable[[str, str], Any] | None = None) -> str:
    """:func:`run` for the worker: the request and the answer as JSON text. The answer holds no
    Python object; the last report is kept for :func:`details_json`. A bug comes back as
    ``{"ok": False, "bug": traceback}``, never as an error of the reader's file."""
    global _last
    req = json.loads(request_json)
    try:
        res = run(path, req.get("what_if", []), cap_bytes=req.get("cap_bytes"), cap_fraction=req.get("cap_fraction"),
                  suggest=bool(req.get("suggest")), total_memory=req.get("total_memory"), progress=progress,
                  partial=partial)
    except Exception:  # noqa: BLE001 -- not the reader's input: shown as a bug of the page
        _last = None
        return json.dumps({"ok": False, "bug": traceback.format_exc()})
    _last = res.pop("report", None)
    return json.dumps(res)


_last: Any = None


def details_json() -> str:
    """:func:`details` of the last successful :func:`run_json`, as JSON text."""
    if _last is None:
        return json.dumps({"ok": False, "bug": "no report to detail"})
    try:
        return json.dumps({"ok": True, **details(_last)})
    except Exception:  # noqa: BLE001
        return json.dumps({"ok": False, "bug": traceback.format_exc()})
