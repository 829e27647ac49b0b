"""Self-checking exercises of chapter 1, and ``try_sequence`` for your own allocation patterns
(imported into :mod:`experiments.allocator`).

Each ``check_*`` function returns :class:`experiments.checks.Feedback`; ``None`` answers
mean "not answered yet". Expected values come from the lab GPU's recorded result (or
your GPU's, in live mode) where the exercise is about a measurement, and from the
allocator model (:mod:`experiments.allocator.model`, itself checked against the GPU)
where it is about the rules, so every check works without a GPU.
"""
from __future__ import annotations

import math
import random
from typing import Any, Callable, Mapping, Sequence

from ..core.units import MiB
from .model import AllocatorConfig, normalize_ops, simulate
from ..core.checks import Feedback, check_choice, check_number, combine, exercise, unanswered


def _recorded_or_live(exp_id: str, **params: Any) -> Any:
    """The experiment's result in the page's mode, or None when it cannot be had here."""
    from ..core.device import NoGPUError
    from ..core.registry import run
    from ..core.store import NotRecordedError, RecordedFileError

    try:
        return run(exp_id, **params)
    except (NotRecordedError, RecordedFileError, NoGPUError, RuntimeError):
        return None


# ----------------------------------------------------------------------------- exercise: predict, then run

def _phase2_reserved_mib(result: Any, small_mib: int) -> tuple[dict[str, float], str]:
    from .workloads import ORDERS, timeline_ops

    if result is not None:
        if result.experiment != "alloc.timeline" or result.params.get("small_mib") != small_mib \
                or result.params.get("expandable"):
            raise ValueError(f"pass the result of ex.run('alloc.timeline', small_mib={small_mib}, expandable=False)")
        orders = result.data["orders"]
        caption = result.caption()
        return ({o: orders[o]["reserved_bytes"][orders[o]["phase_ends"][2]] / MiB for o in ORDERS},
                "the run " + caption[0].lower() + caption[1:])
    out = {}
    for o in ORDERS:
        sim = simulate(timeline_ops(o, small_mib))
        phase_end = [i for i, lab in enumerate(sim["labels"]) if lab.startswith("alloc")][-1]
        out[o] = sim["reserved_bytes"][phase_end] / MiB
    return out, "the allocator model (no measurement available here)"


@exercise("ex-alloc-predict-timeline", chapter=1, points=2, section="Allocated versus reserved",
          objective="Predict the segment each request gets (20 MiB for 1-10 MiB requests, splitting of cached "
                    "blocks) and so the reserved memory of an allocation sequence.")
def check_timeline_prediction(small_first_mib: float | None, large_first_mib: float | None, *,
                              result: Any = None) -> Feedback:
    """Predict-then-run: reserved MiB at the end of phase 2 of ``alloc.timeline`` with
    ``small_mib=8`` (8 × 8 MiB and 4 × 16 MiB tensors), default settings.

    Args:
        small_first_mib: your prediction when the 8 MiB tensors come first.
        large_first_mib: your prediction when the 16 MiB tensors come first.
        result: the experiment's result, if you ran it; else it is looked up (recorded,
            or live on a GPU), falling back to the model.
    """
    if small_first_mib is None or large_first_mib is None:
        return unanswered("your two predictions in MiB (small first, large first)")
    if result is None:
        result = _recorded_or_live("alloc.timeline", small_mib=8, expandable=False)
    expected, source = _phase2_reserved_mib(result, 8)
    small = check_number(
        small_first_mib, expected["small_first"], name="reserved with the 8 MiB tensors first", unit="MiB",
        abs_tol=0.5,
        hints=[(128, "An 8 MiB request does not get an 8 MiB segment: requests between 1 and 10 MiB get 20 MiB "
                     "segments, and two 8 MiB tensors share one."),
               (160, "Two 8 MiB tensors fit in one 20 MiB segment (the 12 MiB tail is split off and reused)."),
               (144, "A 16 MiB tensor fits in a freed 20 MiB segment: the block is split and a 4 MiB tail stays free, "
                     "so phase 2 needs no new segment."),
               (64, "That is the tensors' own size; phase 1 already reserved more: think about the segment "
                    "size for 8 MiB requests.")],
        explanation="Four 20 MiB segments hold the eight 8 MiB tensors; the four 16 MiB tensors then split them.")
    large = check_number(
        large_first_mib, expected["large_first"], name="reserved with the 16 MiB tensors first", unit="MiB",
        abs_tol=0.5,
        hints=[(80, "A 16 MiB request is at least 10 MiB, so its segment is the request rounded up to 2 MiB: "
                    "16 MiB, not 20."),
               (128, "The freed 16 MiB segments are split in two by the 8 MiB requests: nothing new is reserved."),
               (144, "The 8 MiB tensors reuse the cached 16 MiB segments: each is split into two 8 MiB blocks.")],
        explanation="Four exact 16 MiB segments, each split into two 8 MiB blocks in phase 2.")
    fb = combine([small, large])
    return Feedback(fb.correct, f"{fb.message} (Compared with {source}.)",
                    {**fb.details, "expected": expected,
                     "answer": {"small_first": small_first_mib, "large_first": large_first_mib}})


# ----------------------------------------------------------------------------- exercise: a formula for reserved memory

def _reserved_cases(seed: int = 7) -> list[tuple[int, float]]:
    fixed = [(1, 16.0), (8, 16.0), (3, 10.0), (3, 11.0), (6, 9.0), (8, 4.0), (5, 12.5), (4, 1.5), (2, 30.0),
             (1, 60.0), (7, 2.25), (10, 19.5)]
    rng = random.Random(seed)
    extra = [(rng.randint(1, 10), rng.randint(6, 240) / 4) for _ in range(24)]
    return fixed + extra


def _model_reserved_mib(k: int, s_mib: float, expandable: bool) -> float:
    ops = [("alloc", f"t{i}", int(round(s_mib * MiB))) for i in range(k)]
    return simulate(ops, AllocatorConfig(expandable_segments=expandable))["reserved_bytes"][-1] / MiB


@exercise("ex-alloc-pages", chapter=1, points=3, section="Expandable segments",
          objective="Explain why the order of allocations changes reserved memory and when expandable segments "
                    "remove that dependence, as a formula for reserved memory.")
def check_reserved_function(fn: Callable[[int, float], float] | None, *, expandable: bool = True) -> Feedback:
    """Check ``fn(k, s)``: reserved MiB after allocating k tensors of s MiB (1.5 ≤ s ≤ 60,
    1 ≤ k ≤ 10) into an empty allocator, against the model on 36 cases.

    Args:
        fn: your function (k: int, s: float MiB) -> MiB.
        expandable: check the expandable-segments rule (pages) or the classic one (segments).
    """
    if fn is None:
        return unanswered("your function mapped (or classic): (k, s in MiB) -> reserved MiB")
    if not callable(fn):
        return Feedback(False, f"pass a function of (k, s), got {type(fn).__name__}")
    cases = _reserved_cases()
    for k, s in cases:
        expected = _model_reserved_mib(k, s, expandable)
        try:
            got = fn(k, s)
        except Exception as e:  # the reader's code: report, do not crash the page
            return Feedback(False, f"Your function raised {type(e).__name__}: {e} for k={k}, s={s}.")
        if isinstance(got, bool) or not isinstance(got, (int, float)) or not math.isfinite(got):
            return Feedback(False, f"For k={k}, s={s} your function returned {got!r}; return a number of MiB.")
        if math.isclose(got, expected, abs_tol=1e-6):
            continue
        hint = _reserved_hint(k, s, got, expandable)
        return Feedback(False, f"For k={k} tensors of s={s} MiB you return {got:g} MiB, which is not what the "
                               f"allocator reserves. {hint}", {"k": k, "s": s, "answer": got, "expected": expected})
    return Feedback(True, f"All {len(cases)} cases match the allocator's rules.", {"cases": len(cases)})


def _reserved_hint(k: int, s: float, got: float, expandable: bool) -> str:
    def near(x: float) -> bool:
        return math.isclose(got, x, abs_tol=1e-6)

    pages = 20 * math.ceil(k * s / 20)
    if expandable:
        if near(k * s):
            return "That is the memory the tensors use, but the allocator maps whole pages of the large pool."
        if near(20 * math.ceil(s / 20) * k):
            return ("Pages are not per tensor: all tensors of a pool share one growing segment, so the free end of "
                    "the last page serves the next tensor.")
        return "With expandable segments the tensors sit end to end in one range mapped in 20 MiB pages."
    if near(pages):
        return ("That is the expandable-segments answer. Without them each cudaMalloc is a separate segment, and a "
                "block never spans two segments.")
    if s < 10:
        return ("Below 10 MiB a new segment is 20 MiB and later tensors are carved from its free tail; a tail of "
                "1 MiB or less is not split off but handed out with the block.")
    return "From 10 MiB up each tensor gets its own segment: the request rounded up to a multiple of 2 MiB."


# ----------------------------------------------------------------------------- exercise: fragmentation index

def _seg(pool: str, *blocks: tuple[float, str]) -> dict[str, Any]:
    states = {"A": "active_allocated", "f": "inactive", "P": "active_pending_free"}
    bl = [{"size": int(m * MiB), "state": states[s]} for m, s in blocks]
    return {"total_size": sum(b["size"] for b in bl), "pool": pool, "blocks": bl}


def _frag_cases() -> list[tuple[str, list[dict[str, Any]]]]:
    from .workloads import OOM_CAP_MIB, oom_ops

    interleaved = simulate(oom_ops("interleave"), cap_bytes=OOM_CAP_MIB * MiB)["snapshots"]["oom"]
    return [
        ("one free segment", [_seg("large", (20, "f"))]),
        ("two free blocks around a live one", [_seg("large", (16, "f"), (16, "A"), (16, "f"))]),
        ("nothing free", [_seg("large", (32, "A"))]),
        ("free blocks in two segments", [_seg("large", (4, "f"), (4, "A"), (12, "f")), _seg("large", (20, "f"))]),
        ("a block waiting on an event is not free", [_seg("large", (8, "P"), (8, "f"), (4, "A"))]),
        ("the 'interleave' layout at its out-of-memory error", interleaved),
    ]


@exercise("ex-alloc-frag-index", chapter=1, points=3, section="From fragmentation to out-of-memory",
          objective="Measure fragmentation from a memory snapshot: free memory that no single request can use.")
def check_frag_index(fn: Callable[[list[dict[str, Any]]], float] | None) -> Feedback:
    """Check ``fn(segments)`` = 1 − largest free block / total free bytes (0 when nothing is
    free), over all segments, counting only blocks in state 'inactive'."""
    from .snapshot import fragmentation_index

    if fn is None:
        return unanswered("a function frag_index(segments) -> number")
    if not callable(fn):
        return Feedback(False, f"pass a function of a segment list, got {type(fn).__name__}")
    for name, segments in _frag_cases():
        expected = fragmentation_index(segments)
        try:
            got = fn([dict(s, blocks=[dict(b) for b in s["blocks"]]) for s in segments])
        except Exception as e:  # the reader's code: report, do not crash the page
            hint = " When nothing is free there is no fragmentation: return 0." if name == "nothing free" else ""
            return Feedback(False, f"Case '{name}': your function raised {type(e).__name__}: {e}.{hint}")
        if isinstance(got, bool) or not isinstance(got, (int, float)) or not math.isfinite(got):
            return Feedback(False, f"Case '{name}': your function returned {got!r}; return a number in [0, 1].")
        if math.isclose(got, expected, abs_tol=1e-9):
            continue
        free = [b["size"] for s in segments for b in s["blocks"] if b["state"] == "inactive"]
        hint = ""
        if free and math.isclose(got, max(free) / sum(free), abs_tol=1e-9):
            hint = "You returned largest / total; the index is 1 minus that."
        elif "event" in name:
            hint = "Count only blocks whose state is 'inactive': 'active_pending_free' memory is not reusable yet."
        elif "two segments" in name:
            hint = "Take the largest free block and the total free bytes over all segments together."
        return Feedback(False, f"Case '{name}': you return {got:.4g}, which is not its index. {hint}".strip(),
                        {"case": name, "answer": got, "expected": expected})
    return Feedback(True, "Correct on all six layouts, including the one that ran out of memory: most of its free "
                          "memory sits in blocks far smaller than the request.")


# ----------------------------------------------------------------------------- multiple choice

POOL_BOUNDARY_OPTIONS = {
    "a": "The 0.5 MiB request was rounded up to 2 MiB.",
    "b": "The 0.5 MiB request uses the small pool, which cannot take the large pool's free 20 MiB.",
    "c": "The freed 2 MiB block was still in use by a kernel, so it could not be reused yet.",
    "d": "The allocator keeps 2 MiB in reserve for CUDA graphs.",
}


@exercise("ex-alloc-22", chapter=1, points=1, section="Where expandable segments do not help",
          objective="Predict the pool (small or large) a request uses and why pools never share cached blocks.")
def check_pool_boundary_choice(answer: str | None) -> Feedback:
    """Why does '2 MiB tensor, free it, 0.5 MiB tensor' reserve 22 MiB? One of 'a'-'d'
    (``POOL_BOUNDARY_OPTIONS``)."""
    return check_choice(answer, "b", name="your answer", explanations={
        "a": "No: requests round to multiples of 512 B; 0.5 MiB stays 0.5 MiB. The 2 MiB is the size of a "
             "small-pool segment.",
        "b": "Yes: the 2 MiB request went to the large pool (a 20 MiB segment); after the free that segment is "
             "cached in the large pool, which small requests never search. 20 + 2 = 22 MiB.",
        "c": "No: a block freed on the stream it was allocated on is reusable at once (stream order makes it "
             "safe); events only delay reuse after record_stream.",
        "d": "No: nothing is held back for graphs; graphs get private pools of their own when captured.",
    })


OOM_FIXES = {
    "expandable_segments": "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
    "empty_cache": "call torch.cuda.empty_cache() before the 64 MiB request",
    "group": "allocate all the long-lived tensors before the temporaries",
    "max_split_size_mb:64": "set PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:64",
}


@exercise("ex-alloc-oom-reading", chapter=1, points=2, section="From fragmentation to out-of-memory",
          objective="Read an out-of-memory message (allocated against reserved-but-unallocated memory) and choose "
                    "the fix that removes the fragmentation.")
def check_oom_reading(unallocated_mib: float | None, fix: str | None, *, result: Any = None) -> Feedback:
    """The 'interleave' out-of-memory error of ``alloc.fragmentation_oom`` (default cap,
    384 MiB): how many MiB were reserved but unallocated (from its message), and which of
    ``OOM_FIXES`` lets the 64 MiB request succeed.

    Raises:
        ValueError: ``result`` measured under another cap.
    """
    if unallocated_mib is None or fix is None:
        return unanswered("the MiB reserved but unallocated, and one key of OOM_FIXES")
    from .workloads import OOM_CAP_MIB

    if result is None:
        result = _recorded_or_live("alloc.fragmentation_oom", cap_mib=OOM_CAP_MIB, expandable=False)
    elif result.params.get("cap_mib", OOM_CAP_MIB) != OOM_CAP_MIB:
        raise ValueError(f"the exercise reads the error under the {OOM_CAP_MIB} MiB cap: pass the result of "
                         f"ex.run('alloc.fragmentation_oom', cap_mib={OOM_CAP_MIB}), not cap_mib="
                         f"{result.params['cap_mib']}")
    p = result.data["patterns"]["interleave"] if result is not None else None
    if p is not None and p["figures"] is not None:
        caption = result.caption()
        expected, source = (p["figures"]["reserved_unallocated_bytes"] / MiB,
                            "the message of the run " + caption[0].lower() + caption[1:])
    else:
        from .workloads import oom_ops

        oom = simulate(oom_ops("interleave"), cap_bytes=OOM_CAP_MIB * MiB)["oom"]
        expected, source = oom["reserved_unallocated_bytes"] / MiB, "the allocator model"
    number = check_number(unallocated_mib, expected, name="reserved but unallocated", unit="MiB", abs_tol=1.0,
                          hints=[(expected + 64, "That includes the request itself; read the figure from the "
                                                 "message's last sentence.")],
                          explanation=f"(from {source}): more than the 64 MiB asked for, yet the request failed.")
    choice = check_choice(fix, "group", name="your fix", explanations={
        "expandable_segments": "No: every freed 16 MiB block lies between two live ones, so even in one expandable "
                               "segment no free run reaches 64 MiB, and a 20 MiB page never fits inside a 16 MiB "
                               "hole, so only the free run at the segment's end can be unmapped. The expandable run "
                               "of this experiment fails too.",
        "empty_cache": "No: before raising, the allocator already released every whole free segment and retried. "
                       "A segment that holds one live tensor cannot be released.",
        "group": "Yes: with the long-lived tensors packed together, the temporaries fill whole segments; freed, "
                 "those segments are released on the retry and the 64 MiB request fits (the 'grouped' pattern).",
        "max_split_size_mb:64": "No: it only stops cached blocks of 64 MiB or more from being split; the 32 MiB "
                                "segments here are split as before, and no free block of 64 MiB exists to release.",
    })
    return combine([number, choice])


# ----------------------------------------------------------------------------- your own sequence

def try_sequence(ops: Sequence[Sequence[Any]], *, settings: Mapping[str, Any] | str | None = None,
                 cap_mib: float | None = None, mode: str | None = None) -> dict[str, Any]:
    """Predict (and, on a GPU, measure) reserved memory for your own sequence of operations.

    Args:
        ops: operations as in :func:`experiments.allocator.model.normalize_ops`, e.g.
            ``[("alloc", "a", "2 MiB"), ("free", "a"), ("alloc", "b", "512 KiB")]``.
        settings: allocator settings, e.g. ``{"expandable_segments": True}``.
        cap_mib: a memory cap in MiB (runs the measurement under it).
        mode: 'auto' (measure when a GPU is visible), 'live' or 'recorded' (model only).

    Returns:
        dict with ops, settings, predicted (:func:`simulate`), measured (the GPU's run in a
        fresh process, or None), note (what was done, or why something was skipped) and
        source (for figure footers). Draw it with :func:`experiments.allocator.plot_sequence`.

    Raises:
        ValueError: malformed operations or settings, or a cap <= 0.
    """
    from .fresh import _fresh_sequences, explain_setting_error
    from ..core.registry import resolve_mode

    ops = normalize_ops(ops)
    if cap_mib is not None and cap_mib <= 0:
        raise ValueError(f"cap_mib must be > 0 MiB, got {cap_mib}")
    predicted = simulate(ops, settings, cap_bytes=None if cap_mib is None else int(cap_mib * MiB))
    out: dict[str, Any] = {"ops": ops, "settings": settings, "predicted": predicted, "measured": None,
                           "source": "model prediction (no GPU run)"}
    if resolve_mode(mode) != "live":
        out["note"] = "No GPU here: this is the model's prediction. Run the cell on a GPU to measure it as well."
        return out
    problem = explain_setting_error(settings) if settings else None
    if problem:
        out["note"] = problem + " Showing the model's prediction only."
        return out
    measured = _fresh_sequences({"run": ops}, settings=settings if settings else None, cap_mib=cap_mib)["run"]
    from ..core.device import collect_provenance

    out["measured"] = measured
    out["source"] = f"Measured live on {collect_provenance().summary()}; dotted: the model"
    same = measured["reserved_bytes"] == predicted["reserved_bytes"][: len(measured["reserved_bytes"])]
    out["note"] = ("Measured in a fresh process; the model predicted every step." if same
                   else "Measured in a fresh process; the GPU differs from the model at some step (see the figure).")
    return out


DOCTOR_SETTINGS = {
    "a": "both settings reserve less than the defaults",
    "b": "only max_split_size_mb:64 does",
    "c": "only roundup_power2_divisions:4 does",
    "d": "neither does",
}


def check_doctor_setting(answer: str | None, *, result: Any = None) -> Feedback:
    """The transformer's training loop (``alloc.doctor_snapshots``, workload 'training'): which
    of ``max_split_size_mb:64`` and ``roundup_power2_divisions:4`` leaves it with less memory
    reserved than the default settings (one of ``DOCTOR_SETTINGS``)? The right answer is read
    from the GPU's own runs under each setting.

    Args:
        result: a result of ``alloc.doctor_snapshots`` for workload 'training' (default: the
            lab H200's recording, in either mode: recording the four settings live takes four
            fresh processes, more than the chapter's time budget).
    """
    if result is None:
        from ..core.registry import run

        result = run("alloc.doctor_snapshots", mode="recorded", workload="training")
    final = {r["settings"]: r["final"]["reserved_bytes.all.current"] / 2**20 for r in result["runs"]}
    default, split, rounding = final[""], final["max_split_size_mb:64"], final["roundup_power2_divisions:4"]
    best = {(True, True): "a", (True, False): "b", (False, True): "c", (False, False): "d"}[
        (split < default, rounding < default)]
    figures = (f"defaults {default:.0f} MiB, max_split_size_mb:64 {split:.0f} MiB, "
               f"roundup_power2_divisions:4 {rounding:.0f} MiB reserved at the end")
    why = ("max_split_size_mb only changes blocks of 64 MiB or more: it keeps large cached blocks whole, so the "
           "loop's smaller tensors need segments of their own; rounding to quarter steps lets the growing "
           "requests share sizes, but makes every block a little larger.")
    return check_choice(answer, best, name="your answer", explanations={
        k: ("Yes: " if k == best else "No: ") + figures + ". " + why for k in DOCTOR_SETTINGS})
