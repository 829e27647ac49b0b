"""Chapter 4 exercises: check functions with feedback specific to the usual mistakes.

Each check takes the reader's answer (``None`` = not answered yet) and, where the
answer is compared with a measurement, an optional result; by default the result is the
chapter's experiment, live on a GPU or recorded on the lab GPU otherwise.
"""
from __future__ import annotations

import ast
import inspect
import math
import textwrap
import time
from typing import Any, Callable, Mapping

from ..core.lazy_torch import torch
from ..core.checks import Feedback, ReportError, check_choice, combine, exercise, unanswered
from ..core.device import NoGPUError, has_cuda
from ..core.registry import Result, run
from ..core.store import NotRecordedError, RecordedFileError
from .detector import SyncDetector
from .case import reduce_grad_stats
from .ops import OPS_BY_ID

# ----------------------------------------------------------------- helpers


def _result_or_feedback(exp_id: str, result: Result | None, **params: Any) -> Result | Feedback:
    if result is not None:
        return result
    try:
        return run(exp_id, cache=True, **params)  # live: reuse this session's measurement
    except (NotRecordedError, RecordedFileError, NoGPUError) as e:
        return Feedback(None, f"There is no {exp_id} result to compare with yet: {e}")


# ----------------------------------------------------------------- run-ahead prediction

RUN_AHEAD_EXERCISE = {"host_ms": 1.5, "gpu_ms": 2.0}


def _ms(value: float) -> str:
    """A time for feedback: at most two decimals, no trailing zeros ('17.5', '28', '16.25')."""
    return f"{round(value, 2):g}"


def _end_time_feedback(answer: Any, *, measured: float, model: float, tol: float, name: str,
                       hints: list[tuple[float, str]], explanation: str) -> Feedback:
    """One predicted end time against the measurement and the queue model (ms).

    Correct within ``tol`` of either: the model is what the exercise asks for, the
    measurement adds the few tenths of a millisecond a real GPU spends on launches and
    syncs. ``hints`` are typical wrong answers, matched within ``tol``.
    """
    if isinstance(answer, bool) or not isinstance(answer, (int, float)) or not math.isfinite(answer):
        return Feedback(False, f"{name[0].upper()}{name[1:]} should be a number of ms, got {answer!r}.",
                        {"wrong_parts": [name]})
    details: dict[str, Any] = {"answer": answer}
    if abs(answer - model) <= tol or abs(answer - measured) <= tol:
        return Feedback(True, f"Right: {name} was {measured:.1f} ms (the model says {_ms(model)} ms). "
                              f"{explanation}", details)
    details["wrong_parts"] = [name]
    for value, message in hints:
        if abs(answer - value) <= tol:
            return Feedback(False, f"{_ms(answer)} ms is not it for {name}. {message}", details)
    direction = "high" if answer > measured else "low"
    return Feedback(False, f"{_ms(answer)} ms is too {direction} for {name}.", details)


@exercise("ex-syncs-runahead", chapter=4, points=2, section="Run-ahead, and what one sync costs",
          objective="Predict when the GPU finishes a loop that runs ahead, with and without a sync each step.")
def check_run_ahead_prediction(no_sync_ms: float | None, every_step_ms: float | None, *,
                               result: Result | None = None) -> Feedback:
    """Predict when the GPU finishes the run-ahead loop (8 steps, 1.5 ms host and 2 ms GPU
    work each): without a sync, and with ``loss.item()`` after every step.

    Compared with ``syncs.run_ahead`` at that point and with the queue model
    (:func:`~experiments.syncs.predicted_run_ahead_ms`): an answer within 0.4 × the
    shorter per-step time (0.6 ms here) of either is right. The tolerance is absolute
    because the typical wrong answers lie one step's host time away: 16 ms, the GPU
    time alone, against 17.5 ms without a sync.
    """
    if no_sync_ms is None or every_step_ms is None:
        return unanswered("a number of ms in no_sync_ms and in every_step_ms")
    r = _result_or_feedback("syncs.run_ahead", result, **RUN_AHEAD_EXERCISE)
    if isinstance(r, Feedback):
        return r
    from .model import predicted_run_ahead_ms

    h, g, n = r.params["host_ms"], r.params["gpu_ms"], r.data["steps"]
    model = predicted_run_ahead_ms(h, g, n)
    # Different answers differ by at least one step's host or GPU time: stay well inside that.
    tol = 0.4 * min(h, g)
    first = _end_time_feedback(
        no_sync_ms, measured=r.data["variants"]["none"]["end_ms"], model=model["none"], tol=tol,
        name="the end time without a sync",
        hints=[(n * g, f"That is the GPU's work alone ({n} x {g:g} ms). But the GPU cannot start before the "
                       f"host has queued the first step: it idles through that step's Python work."),
               (n * (h + g), "That is the loop with a sync every step. Without syncs the host's Python work "
                             "overlaps the GPU's kernels: the slower side sets the pace."),
               (n * h, "That is when the host finishes queueing; the GPU is still busy with the queue.")],
        explanation=f"The GPU starts after {h:g} ms of Python work and then never waits: {h:g} + {n} x {g:g} ms.")
    second = _end_time_feedback(
        every_step_ms, measured=r.data["variants"]["every_step"]["end_ms"], model=model["every_step"], tol=tol,
        name="the end time with a sync every step",
        hints=[(n * g, "Only the GPU time: but after each sync the queue is empty, and the GPU idles while the "
                       "host does the next step's Python work."),
               (model["none"], "That is the time without syncs: a sync every step stops all overlap.")],
        explanation=f"Nothing overlaps any more: {n} x ({h:g} + {g:g}) ms. The host's wait is not the loss; "
                    "the Python time that no longer hides behind GPU work is.")
    return combine([first, second])


# ----------------------------------------------------------------- what did the sync cost?

BUBBLE_OPTIONS = {
    "a": "the time the host waited inside .item()",
    "b": "the extra time the GPU needed to finish: the bubble after the sync",
    "c": "the wait plus the bubble",
    "d": "nothing: the GPU was busy all along",
}


@exercise("ex-syncs-bubble", chapter=4, points=1, section="Run-ahead, and what one sync costs",
          objective="Explain why the cost of a sync is the bubble after it, not the wait.")
def check_bubble_cost(answer: str | None) -> Feedback:
    """Multiple choice: what a single sync in a run-ahead loop costs (see :data:`BUBBLE_OPTIONS`)."""
    if answer is None:
        return unanswered('the letter of your option: "a", "b", "c" or "d"')
    return check_choice(answer, "b", name="your option", explanations={
        "a": "No: while the host waited, the GPU was busy with work queued earlier. The wait is what profilers "
             "draw in red, but no GPU time was lost during it.",
        "b": "Yes: after the sync the queue is empty, so the GPU idles while the host does its next Python "
             "work. That bubble is what the step loses, and no profiler charges it to the sync.",
        "c": "No: during the wait the GPU was busy with work that had to run anyway.",
        "d": "No: the GPU finished later than without the sync.",
    })


# ----------------------------------------------------------------- classify operations

QUIZ_OPS = ("item", "full", "index_tuple", "slice", "tensor_scalar", "add_cpu_scalar", "mask_index", "masked_fill",
            "to_cuda_pinned_blocking", "to_cuda_pinned_nb", "index_cuda", "any")


def classification_template() -> dict[str, None]:
    """{operation code: None} for the classification exercise; replace each None with True (syncs) or False."""
    return {OPS_BY_ID[i].code: None for i in QUIZ_OPS}


@exercise("ex-syncs-classify", chapter=4, points=2, section="Where syncs hide: the catalogue",
          objective="Find the operations that make the host wait for the GPU, including indexing with CPU data "
                    "and copies from pageable memory.")
def check_classification(answers: Mapping[str, bool | None] | None, *, result: Result | None = None) -> Feedback:
    """Say for each operation of :data:`QUIZ_OPS` whether it makes the host wait for the GPU.

    ``answers`` maps the operation's code (as in :func:`classification_template`) or its
    id to True (syncs) or False. Compared with the catalogue: an operation syncs if the
    debug mode reported it or the host waited for the queued GPU work.
    """
    if answers is None:
        return unanswered("answers (the dict in the cell, with True (syncs) or False for each operation)")
    if not isinstance(answers, Mapping):
        return Feedback(False, f"answers should be a dict of operation -> True/False, got {type(answers).__name__}.")
    by_code = {OPS_BY_ID[i].code: i for i in QUIZ_OPS}
    given: dict[str, Any] = {}
    for key, value in answers.items():
        op_id = by_code.get(key, key if key in QUIZ_OPS else None)
        if op_id is None:
            return Feedback(False, f"{key!r} is not one of the quiz's operations: {list(by_code)}.")
        given[op_id] = value
    missing = [OPS_BY_ID[i].code for i in QUIZ_OPS if given.get(i) is None]
    if len(missing) == len(QUIZ_OPS):
        return unanswered("True (syncs) or False for each operation in answers")
    if missing:
        return unanswered(f"True (syncs) or False for the operations still at None: {', '.join(missing)}")
    bad = [k for k, v in given.items() if not isinstance(v, bool)]
    if bad:
        return Feedback(False, f"Answer with True or False; got {given[bad[0]]!r} for {OPS_BY_ID[bad[0]].code}.")
    r = _result_or_feedback("syncs.catalogue", result)
    if isinstance(r, Feedback):
        return r
    rows = {row["id"]: row for row in r.data["rows"]}
    wrong = [rows[op_id]["code"] for op_id in QUIZ_OPS if given[op_id] != rows[op_id]["syncs"]]
    details: dict[str, Any] = {"wrong": len(wrong), "total": len(QUIZ_OPS)}
    if not wrong:
        return Feedback(True, f"All {len(QUIZ_OPS)} right. The rule behind them: a sync happens when the host "
                              "needs a value, a size or a copy that only the GPU's queue can produce.", details)
    # How many, never which: with the wrong ones named, flipping them is the answer.
    details["wrong_parts"] = ["answers"]
    return Feedback(False, f"{len(QUIZ_OPS) - len(wrong)} of {len(QUIZ_OPS)} right. For each operation, ask "
                           "whether the host needs a value, a size or a copy that only the GPU's queue can "
                           "produce.", details)


# ----------------------------------------------------------------- pageable threshold

@exercise("ex-syncs-threshold", chapter=4, points=1, section="Copies from pageable memory drain the stream",
          objective="Read from a measurement the copy size at which a non_blocking copy from pageable memory "
                    "makes the host wait.")
def check_threshold(answer_mib: float | str | None, *, result: Result | None = None) -> Feedback:
    """The smallest copy size (MiB) at which a ``non_blocking`` copy from pageable memory
    made the host wait, read from ``syncs.pageable_threshold`` (live or recorded).

    Any value between the largest size that did not wait and the first that did is
    accepted (the sweep cannot say more). Answer ``"none"`` (any case) if no size waited.
    Anything else (a string, a list) gets feedback, not an exception.
    """
    if answer_mib is None:
        return unanswered('a size in MiB (a number), or "none" if no size made the host wait')
    says_none = isinstance(answer_mib, str) and answer_mib.strip().lower() == "none"
    is_number = (not isinstance(answer_mib, bool) and isinstance(answer_mib, (int, float))
                 and math.isfinite(answer_mib))
    if not (says_none or is_number):
        return Feedback(False, f'Answer with a number of MiB, or with "none" if no size made the host wait; '
                               f"got {answer_mib!r}.")
    r = _result_or_feedback("syncs.pageable_threshold", result)
    if isinstance(r, Feedback):
        return r
    d = r.data
    t, s = d["threshold_bytes"], d["largest_staged_bytes"]
    nb = dict(zip(d["sizes_bytes"], d["variants"]["pageable_non_blocking"]["median_ms"]))
    largest = d["sizes_bytes"][-1] / 2**20
    if t is None:
        if says_none:
            return Feedback(True, "Right: on this machine no pageable copy in the sweep made the host wait.")
        return Feedback(False, f"{answer_mib:g} MiB is not it. Read the sweep again: look for the size where the "
                               "host's wait jumps up, and if there is none, say so.", {"wrong_parts": ["the size"]})
    if says_none:
        return Feedback(False, f'Not "none": in this sweep (up to {largest:g} MiB) some pageable copies did make '
                               "the host wait for the queued work. Find the size where the red squares jump up, "
                               "and give it in MiB.", {"wrong_parts": ["the size"]})
    a = float(answer_mib)
    lo = (s or 0) / 2**20
    hi = t / 2**20
    details: dict[str, Any] = {"answer": a}
    if lo - 1e-9 <= a <= hi + 1e-9:
        return Feedback(True, f"Right: the copy returned at once up to {lo:g} MiB and waited "
                              f"{nb[t]:.1f} ms at {hi:g} MiB; the driver's limit lies in between.", details)
    details["wrong_parts"] = ["the size"]
    if math.isclose(a, 0.0625, rel_tol=0.05) and hi > 0.0625:
        return Feedback(False, "64 KiB is what the post saw on a GB200. Read your own sweep: the limit "
                               "depends on the driver and the platform.", details)
    if a < lo:
        return Feedback(False, f"At {a:g} MiB the copy did not wait yet: the driver still stages copies of that "
                               "size without draining the stream. Look further up the sweep.", details)
    return Feedback(False, f"Smaller: at {a:g} MiB the copy already made the host wait for the queued work. "
                           "Look for the first size where it did.", details)


# ----------------------------------------------------------------- rewrite sync-free

_HOST_METHODS = {"item": "copies one value to the host and waits", "cpu": "a blocking copy to the host",
                 "tolist": "copies to the host and waits", "numpy": "needs the data on the host",
                 "synchronize": "waits for the GPU explicitly"}


def static_sync_findings(fn: Callable[..., Any]) -> list[str]:
    """Lines of ``fn`` that look like a host-device sync (a heuristic scan of its source).

    Finds ``.item()``, ``.cpu()``, ``.tolist()``, ``.numpy()``, ``.synchronize()``,
    ``print(...)``, ``torch.tensor(..., device=...)`` and indexing with a list, a tuple,
    a NumPy array or a global sequence (``x[:, (0, 2, 3)]``, ``x[:, COLS]``). Returns
    [] when the source cannot be read.
    """
    try:
        src = textwrap.dedent(inspect.getsource(fn))
        tree = ast.parse(src)
    except (OSError, TypeError, SyntaxError, IndentationError):
        return []
    scope = dict(getattr(fn, "__globals__", {}))
    code = getattr(fn, "__code__", None)
    if code is not None and getattr(fn, "__closure__", None):
        for name, cell in zip(code.co_freevars, fn.__closure__):
            try:
                scope[name] = cell.cell_contents
            except ValueError:  # an empty cell
                pass
    findings = []

    def is_sequence_index(node: ast.AST) -> bool:
        if isinstance(node, (ast.List, ast.Tuple)) and node.elts and all(
                isinstance(e, ast.Constant) and isinstance(e.value, int) for e in node.elts):
            return True
        if isinstance(node, ast.Name):
            return isinstance(scope.get(node.id), (list, tuple)) and all(
                isinstance(v, int) for v in scope[node.id]) and len(scope[node.id]) > 0
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("array", "asarray"):
            return True
        return False

    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr in _HOST_METHODS:
                findings.append(f"line {line}: .{f.attr}() {_HOST_METHODS[f.attr]}")
            elif isinstance(f, ast.Name) and f.id == "print":
                findings.append(f"line {line}: print() copies the values to the host")
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name == "tensor" and any(k.arg == "device" for k in node.keywords):
                findings.append(f"line {line}: torch.tensor(..., device=...) builds on the host and copies with a "
                                "blocking copy, on every call")
        elif isinstance(node, ast.Subscript):
            parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            if isinstance(node.slice, (ast.List,)) or any(is_sequence_index(p) for p in parts):
                findings.append(f"line {line}: indexing with a Python sequence or array becomes a CPU index "
                                "tensor and a blocking copy")
    return sorted(set(findings), key=lambda s: int(s.split(":")[0].split()[1]))


def _reference_input(groups: int = 4, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(groups, 8, generator=g)


def _compare(out: Any, ref: tuple[torch.Tensor, torch.Tensor]) -> str:
    """'' if ``out`` matches the reference (sums [7], gmax), else what differs."""
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        return f"return (sums, gmax) like reduce_grad_stats; got {type(out).__name__}"
    sums, gmax = out
    if not isinstance(sums, torch.Tensor) or not isinstance(gmax, torch.Tensor):
        return "both outputs should be tensors (a Python number means a copy to the host happened)"
    sums, gmax = sums.detach().cpu(), gmax.detach().cpu()
    if tuple(sums.shape) != tuple(ref[0].shape):
        return f"sums should have shape {tuple(ref[0].shape)}, got {tuple(sums.shape)}"
    if gmax.numel() != 1:
        return f"gmax should be one value, got shape {tuple(gmax.shape)}"
    if not torch.allclose(sums.float(), ref[0], rtol=1e-5, atol=1e-5):
        return f"sums differ from the reference (max difference {float((sums.float() - ref[0]).abs().max()):.3g})"
    if not torch.allclose(gmax.float().reshape(()), ref[1], rtol=1e-5, atol=1e-5):
        return f"gmax is {float(gmax):.4g}, which differs from the reference function's gmax"
    return ""


def run_sync_free_rewrite(fn: Callable[[torch.Tensor], Any], *, queued_ms: float = 20.0) -> dict[str, Any]:
    """Harness of exercise ``ex-syncs-rewrite``: call the reader's function and report, as
    plain data, whether its values match :func:`~experiments.syncs.case.reduce_grad_stats`
    (``diff``: '' when they do), what the source scan finds and, on a GPU, how many syncs
    the book's detector saw with ``queued_ms`` of GPU work queued."""
    local = _reference_input()
    ref = reduce_grad_stats(local)
    findings = static_sync_findings(fn)
    report: dict[str, Any] = {"gpu": has_cuda(), "findings": findings, "raised": None, "diff": None}
    if not report["gpu"]:
        try:
            out = fn(local.clone())
        except Exception as e:
            report["raised"] = f"{type(e).__name__}: {e}"[:300]
            return report
        report["diff"] = _compare(out, ref)
        return report
    from ..core.measure import gpu_sleep

    dev = local.cuda()
    try:
        fn(dev)
        torch.cuda.synchronize()
        gpu_sleep(queued_ms)
        with SyncDetector("report") as det:
            t0 = time.perf_counter()
            out = fn(dev)
            host_ms = (time.perf_counter() - t0) * 1e3
        torch.cuda.synchronize()
    except Exception as e:
        torch.cuda.synchronize()
        report["raised"] = f"{type(e).__name__}: {e}"[:300]
        return report
    report.update(syncs=int(det.count), sync_report=det.report() if det.count else "", host_ms=float(host_ms),
                  queued_ms=float(queued_ms), diff=_compare(out, ref))
    return report


def judge_sync_free_rewrite(report: Any) -> Feedback:
    """Verdict on :func:`run_sync_free_rewrite`'s report.

    Raises:
        ReportError: a report no harness returns.
    """
    try:
        gpu, findings, raised, diff = bool(report["gpu"]), [str(f) for f in report["findings"]], \
            report["raised"], report["diff"]
        if gpu and raised is None:
            syncs, sync_report = int(report["syncs"]), str(report["sync_report"])
            host_ms, queued_ms = float(report["host_ms"]), float(report["queued_ms"])
    except (KeyError, TypeError, ValueError) as e:
        raise ReportError(f"a rewrite report without a usable {e}") from None
    if not gpu:
        if raised:
            return Feedback(False, f"Your function raised on a CPU tensor: {raised}")
        if diff:
            return Feedback(False, f"Wrong values: {diff}.", {"gpu": False})
        if findings:
            return Feedback(False, "The values are right, but the source still has sync patterns: "
                            + "; ".join(findings) + ".", {"gpu": False, "findings": findings})
        return Feedback(None, "Values match the reference on CPU, and the source has none of the usual sync "
                              "patterns. Whether it is sync-free can only be measured on a CUDA GPU: run this "
                              "check there (in Colab: Runtime > Change runtime type > GPU).",
                        {"gpu": False, "findings": []})
    if raised:
        return Feedback(False, f"Your function raised on a CUDA tensor: {raised}")
    details = {"gpu": True, "syncs": syncs, "host_ms": host_ms, "findings": findings}
    if syncs:
        hint = f" The source scan points at: {'; '.join(findings)}." if findings else ""
        return Feedback(False, f"Still syncs: {sync_report}{hint}", details)
    if diff:
        return Feedback(False, f"No sync, but wrong values: {diff}.", details)
    return Feedback(True, f"Sync-free and correct: no sync detected, and the call returned in {host_ms:.2f} ms "
                          f"with {queued_ms:g} ms of GPU work queued.", details)


@exercise("ex-syncs-rewrite", chapter=4, points=3, section="Case study: the metrics helper", needs_gpu=True,
          objective="Rewrite a function so that it keeps no host-device sync, and show it with the detector.",
          harness=run_sync_free_rewrite, judge=judge_sync_free_rewrite)
def check_sync_free_rewrite(fn: Callable[[torch.Tensor], Any] | None, *, queued_ms: float = 20.0) -> Feedback:
    """Check a sync-free rewrite of :func:`~experiments.syncs.case.reduce_grad_stats`
    (:func:`run_sync_free_rewrite`, then :func:`judge_sync_free_rewrite`).

    On a GPU: one warm-up call (a constant built once may sync there), then a call under
    the book's detector with ``queued_ms`` of GPU work queued; it must report no sync
    and return the reference's values. Without a GPU: the outputs are compared on CPU
    tensors and the source is scanned for the usual sync patterns; whether the function
    is sync-free needs a GPU, and the feedback says so.
    """
    if fn is None:
        return unanswered("reduce_grad_stats_sync_free (the function's name, without calling it)")
    if not callable(fn):
        return Feedback(False, f"Pass the function itself, not {type(fn).__name__}.")
    return judge_sync_free_rewrite(run_sync_free_rewrite(fn, queued_ms=queued_ms))
