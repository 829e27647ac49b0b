"""Exercise checks for chapter 2 (cross-stream memory). Each returns a
:class:`~experiments.core.checks.Feedback`; ``None`` as the answer means "not answered yet".

Checks that compare with a measurement use the ``streams.*`` result passed in, or run
(on a GPU) or read (recorded, without one) the experiment's default point.
:func:`check_event_handoff` runs the reader's code and therefore needs a GPU.
"""
from __future__ import annotations

import statistics
from typing import Any, Callable, Mapping, Sequence

from ..core import registry
from ..core.checks import Feedback, ReportError, check_choice, check_number, exercise, unanswered
from ..core.device import check_fits, has_cuda
from ..core.registry import Result
from ..core.units import MiB
from .workloads import STRATEGIES, buffer_numel, reference_handoff, run_handoff, warm_up

def _result(exp_id: str, result: Result | None, **params: Any) -> Result:
    return result if result is not None else registry.run(exp_id, cache=True, **params)


def _point_index(d: Mapping[str, Any], consumer_ms: float, host_delay_ms: float) -> int:
    for k, pt in enumerate(d["points"]):
        if pt["consumer_ms"] == consumer_ms and pt["host_delay_ms"] == host_delay_ms:
            return k
    raise LookupError(f"the run-ahead sweep has no point with consumer_ms={consumer_ms}, "
                      f"host_delay_ms={host_delay_ms}")


_BLOCK_WHY = {
    "unprotected": "Unprotected: the freed block goes straight back to the producer stream's pool, and the next "
                   "all-gather on that stream takes it, so one block serves every layer. That reuse is the bug.",
    "stall": "Stall: the host waits for the consumer before it frees, so the next allocation reuses the same, "
             "now idle, block: one block.",
    "record_stream": "record_stream: a parked block comes back only when a later allocation polls its event and "
                     "finds it complete. The host queues a layer much faster than the GPU runs one, so it makes "
                     "every allocation before the first consumer has finished, and each layer gets a new block.",
    "event": "Event handoff: the kept consumed buffer(s) plus the one being filled; the oldest is released only "
             "after the producer stream waits on its event, and the next all-gather reuses it.",
}


# Wrong-answer hints: the mechanism, never the count.
_BLOCK_HINT = {
    "unprotected": "Unprotected: where does the freed block go, and which allocation asks next on that stream?",
    "stall": "Stall: the host waits for the consumer before it frees; is the block idle when the next "
             "all-gather allocates?",
    "record_stream": "record_stream: a parked block comes back only when a later allocation polls its event and "
                     "finds it complete. How far ahead of the GPU is the host when it allocates?",
    "event": "Event handoff: count the consumed buffer(s) kept alive, plus the one being filled.",
}


@exercise("ex-streams-blocks", chapter=2, points=2, section="The race, measured",
          objective="Say which stream's free list a block returns to, and predict the blocks each way of "
                    "releasing a cross-stream buffer uses.")
def check_block_predictions(answer: Mapping[str, int] | None, result: Result | None = None) -> Feedback:
    """Exercise: predict the distinct buffer blocks per trial for each strategy.

    Args:
        answer: {'unprotected': n, 'stall': n, 'record_stream': n, 'event': n}, or None.
        result: a ``streams.strategies`` result; default: run (or read) the default point.

    Exact answers are required, except for ``record_stream``, which may be off by one
    (it depends on timing). A wrong answer is told how many of the four are right, not
    which: naming them would let a student change only those.
    """
    if answer is None:
        return unanswered("my_blocks (the dict in the cell, with your four numbers filled in)")
    if not isinstance(answer, Mapping) or set(answer) != set(STRATEGIES):
        return Feedback(False, f"Give a dict with exactly the keys {list(STRATEGIES)}, one whole number each.",
                        {"wrong_parts": ["the keys of the dict"]})
    if any(v is None for v in answer.values()):
        missing = ", ".join(s for s in STRATEGIES if answer[s] is None)
        return unanswered(f"a whole number of blocks for each strategy in my_blocks (still None: {missing})")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in answer.values()):
        return Feedback(False, "Each prediction should be a whole number of blocks.",
                        {"wrong_parts": [s for s in STRATEGIES if not isinstance(answer[s], int)
                                         or isinstance(answer[s], bool)]})
    d = _result("streams.strategies", result).data
    measured = {s: d["results"][s]["distinct_blocks"] for s in STRATEGIES}
    wrong = [s for s in STRATEGIES
             if abs(answer[s] - measured[s]) > (1 if s == "record_stream" else 0)]
    details: dict[str, Any] = {"answer": dict(answer)}
    table = ", ".join(f"{s} {measured[s]}" for s in STRATEGIES)
    if not wrong:
        return Feedback(True, f"All four right (measured: {table}). {_BLOCK_WHY['record_stream']}", details)
    details["wrong_parts"] = ["my_blocks"]
    why = " ".join(_BLOCK_HINT[s] for s in STRATEGIES)
    return Feedback(False, f"{len(STRATEGIES) - len(wrong)} of {len(STRATEGIES)} right. Go through the four "
                           f"mechanisms again. {why}", details)


@exercise("ex-streams-peak", chapter=2, points=1, section="`record_stream` ties memory to CPU run-ahead",
          objective="Explain how record_stream ties peak memory to how far the host runs ahead of the GPU.")
def check_peak_prediction(answer_mib: float | None, result: Result | None = None) -> Feedback:
    """Exercise: predict record_stream's peak active memory (MiB above the start) with
    32 layers of 64 MiB, 10 ms of GPU work and 5 ms of host work per layer.

    Correct within 25 % of the measured value (``streams.runahead``, default point).
    """
    if answer_mib is None:
        return unanswered("your predicted peak in MiB (a number)")
    d = _result("streams.runahead", result).data
    k = _point_index(d, 10.0, 5.0)
    buf = d["buffer_bytes"] / MiB
    expected = d["record_stream"]["peak_active_bytes"][k] / MiB
    every = d["layers"] * buf
    return check_number(
        answer_mib, expected, name="record_stream's peak active memory", unit="MiB", rel_tol=0.25,
        hints=[(every, "That is every layer's buffer, which needs the host to finish before the GPU completes "
                       "any layer. Here the host issues a layer every 5 ms and the GPU finishes one every 10 ms: "
                       "how many consumers are done by the last allocation?"),
               (buf, "One buffer is what you get when the host is slower than the GPU (compare the 20 ms point)."),
               ((d["in_flight"] + 1) * buf, "That is the event handoff's fixed bound, not record_stream's.")],
        explanation=f"The GPU falls behind by 5 ms per layer, so about half of the {d['layers']} blocks are still "
                    f"parked when the last one is allocated.")


@exercise("ex-streams-allocated", chapter=2, points=1, section="What `max_memory_allocated()` does not see",
          objective="Tell allocated from active memory, and say what max_memory_allocated() cannot see.")
def check_allocated_peak(answer_mib: float | None, result: Result | None = None) -> Feedback:
    """Exercise: what does ``max_memory_allocated()`` report (MiB above the start) for
    record_stream at the largest run-ahead (10 ms of GPU work, no host delay)?

    Correct within 10 % (or 2 MiB) of the measured allocated peak.
    """
    if answer_mib is None:
        return unanswered("the peak you expect max_memory_allocated() to report, in MiB")
    d = _result("streams.runahead", result).data
    k = _point_index(d, 10.0, 0.0)
    buf = d["buffer_bytes"] / MiB
    expected = d["record_stream"]["peak_allocated_bytes"][k] / MiB
    active = d["record_stream"]["peak_active_bytes"][k] / MiB
    return check_number(
        answer_mib, expected, name="the allocated peak", unit="MiB", rel_tol=0.1, abs_tol=2.0,
        hints=[(active, "That is the active peak. A block freed after record_stream leaves 'allocated' at once "
                        "and stays 'active' until its event is seen complete."),
               (d["layers"] * buf, "That is every layer's buffer: it shows in active and reserved bytes, "
                                   "not in allocated bytes.")],
        explanation=f"Only the buffer being filled is allocated at any moment; the active peak was {active:.0f} "
                    f"MiB. max_memory_allocated() cannot see blocks parked on events.")


@exercise("ex-streams-alloc-stream", chapter=2, points=1, section="The one rule that matters here",
          objective="Decide which stream must wait before a buffer read on several streams is released.")
def check_allocation_stream(answer: str | None) -> Feedback:
    """Exercise (multiple choice): a buffer allocated under ``torch.cuda.stream(copy_in)``
    is read on the compute stream and on an offload (copy) stream. Which stream must wait,
    before the last reference is dropped?"""
    if answer is None:
        return unanswered('the letter of your choice: "a", "b", "c" or "d"')
    return check_choice(answer, "c", name="your choice", explanations={
        "a": "Not quite. The compute stream reads the buffer, but the allocator never hands this block to a "
             "compute-stream allocation: free blocks are reused only on their allocation stream.",
        "b": "Not quite. The offload stream is a reader too, and for the same reason its allocations never "
             "receive this block.",
        "c": "Right. Only allocations on copy_in can receive the block, so copy_in alone needs a dependency: on an "
             "event from each reader (or one event, if the readers are already ordered).",
        "d": "Not quite. It is safe, because copy_in's waits are among the three, but it is more than needed: "
             "some of these waits order work on streams whose allocations can never receive the block, and "
             "they can cost overlap.",
    })


@exercise("ex-streams-cap", chapter=2, points=1, section="Under a memory cap: a stall hidden in an allocation",
          objective="Explain where a host stall inside an allocation comes from under a memory cap.")
def check_cap_stall(answer: str | None) -> Feedback:
    """Exercise (multiple choice): where does the tens-of-ms host stall inside an ordinary
    allocation come from, under a memory cap with record_stream?"""
    if answer is None:
        return unanswered('the letter of your choice: "a", "b", "c" or "d"')
    return check_choice(answer, "b", name="your choice", explanations={
        "a": "No: the event handoff allocates the same 64 MiB buffers under the same cap and its worst allocation "
             "takes well under a millisecond.",
        "b": "Right. When nothing cached fits and the cap blocks cudaMalloc, the allocator frees its cache and "
             "retries; first it waits (cudaEventSynchronize) on every outstanding record_stream event, so the host "
             "waits for the GPU to catch up. num_alloc_retries counts these.",
        "c": "No: Python frees the tensors by reference counting at `del`; the garbage collector is not involved.",
        "d": "No: the caching allocator never pages device memory to the host.",
    })


def run_event_handoff(handoff: Callable, *, layers: int = 8, buffer_mib: int = 64, trials: int = 3,
                      producer_ms: float = 1.5, consumer_ms: float = 2.0) -> dict[str, Any]:
    """Harness of exercise ``ex-streams-handoff``: run the reader's loop ``trials`` times on
    this GPU, and the reference loop twice, and return what happened as plain data.

    Returns:
        ``{"gpu": False}`` without a GPU; else ``{"gpu": True, "layers", "trials",
        "error", "error_kind", "missing_layers", "corrupted_trials", "first_corrupted",
        "distinct_blocks", "peak_active_mib", "span_ms", "reference_span_ms", "buffer_mib"}``.

    Raises:
        ValueError: layers, buffer_mib or trials out of range, or the buffers do not fit.
    """
    if not 2 <= layers <= 32:
        raise ValueError(f"layers must be an integer in [2, 32], got {layers}")
    if not 1 <= buffer_mib <= 512:
        raise ValueError(f"buffer_mib must be in [1, 512] MiB, got {buffer_mib}")
    if not 1 <= trials <= 20:
        raise ValueError(f"trials must be in [1, 20], got {trials}")
    if not has_cuda():
        return {"gpu": False}
    check_fits("buffer_mib", 3 * buffer_numel(buffer_mib) * 4)
    warm_up()
    kw = dict(layers=layers, buffer_mib=buffer_mib, producer_ms=producer_ms, consumer_ms=consumer_ms)
    ref_span = statistics.median(run_handoff(reference_handoff, **kw)["span_ms"] for _ in range(2))
    report: dict[str, Any] = {"gpu": True, "layers": layers, "trials": trials, "error": None, "error_kind": None,
                              "reference_span_ms": float(ref_span)}
    runs = []
    for _ in range(trials):
        r = run_handoff(handoff, **kw)
        if r["error"]:
            report.update(error=str(r["error"])[:300], error_kind=r["error_kind"])
            return report
        runs.append(r)
    bad = [r for r in runs if r["corrupted_layers"]]
    first = None
    if bad:
        k = bad[0]["first_corrupted_layer"]
        first = {"layer": int(k), "read": float(bad[0]["read_mean"][k - 1])}
    report.update(_handoff_details(runs, ref_span, buffer_mib),
                  missing_layers=sorted(set(range(layers)) - set(runs[0]["consumed"])), first_corrupted=first)
    return report


def judge_event_handoff(report: Any) -> Feedback:
    """Verdict on :func:`run_event_handoff`'s report: every layer consumed, no trial read
    wrong values, at most 2 distinct blocks and 2 buffers (+1 MiB) active, and a GPU span
    within 1.3× the reference loop's (which rules out a stall).

    Raises:
        ReportError: a report no harness returns.
    """
    if not isinstance(report, Mapping) or not isinstance(report.get("gpu"), bool):
        raise ReportError("not a handoff report")
    if not report["gpu"]:
        return Feedback(None, "This check runs your code on a GPU and none is visible here, so it cannot judge it. "
                              "Open the page in Colab with a GPU runtime (or any CUDA machine) and run the cell "
                              "again. Until then, compare your loop with the recipe of 'Writing the event "
                              "handoff' above: keep each buffer one layer longer, and enqueue "
                              "producer.wait_event(done) for it before you drop it.")
    try:
        error, kind, trials = report["error"], report["error_kind"], int(report["trials"])
        if error:
            if kind == "record_stream":
                return Feedback(False, "Your loop called record_stream, which this exercise rules out. Keep the "
                                       "buffer referenced instead, and make the producer stream wait on the "
                                       "consumer's event before you drop it.", {"error": str(error)})
            return Feedback(False, f"Your loop raised {error}", {"error": str(error)})
        details = {k: report[k] for k in ("trials", "corrupted_trials", "distinct_blocks", "peak_active_mib",
                                          "span_ms", "reference_span_ms", "buffer_mib")}
        missing, first = list(report["missing_layers"]), report["first_corrupted"]
        blocks, peak, span = int(details["distinct_blocks"]), float(details["peak_active_mib"]), float(details["span_ms"])
        ref_span, buf = float(details["reference_span_ms"]), float(details["buffer_mib"])
        corrupted = int(details["corrupted_trials"])
        if first is not None:
            k, read = int(first["layer"]), float(first["read"])
    except (KeyError, TypeError, ValueError) as e:
        raise ReportError(f"a handoff report without a usable {e}") from None
    if missing:
        return Feedback(False, f"forward() was never called for layer(s) {missing}: call buf = all_gather(layer) "
                               f"and forward(buf, layer) once for every layer.", details)
    if corrupted:
        return Feedback(False, f"{corrupted} of {trials} trials read wrong values (layer {k} read "
                               f"{read:.3g} instead of {k}): a block went to a later all_gather "
                               f"while a consumer still read it. Before the last reference to a buffer goes, "
                               f"enqueue producer.wait_event(done) for it.", details)
    if blocks > 2 or peak > 2 * buf + 1:
        return Feedback(False, f"Correct values, but {blocks} distinct blocks and a peak of "
                               f"{peak:.0f} MiB active: hold at most one consumed buffer "
                               f"(plus the one being filled) and release the older one each layer.", details)
    if span > 1.3 * ref_span:
        return Feedback(False, f"Correct and within two buffers, but the GPU needed {span:.1f} ms "
                               f"against {ref_span:.1f} ms for the reference loop: the producer waits for the "
                               f"consumer of the buffer it just filled, which serializes the streams. Keep the "
                               f"buffer one layer longer and wait on the older event.", details)
    return Feedback(True, f"Correct in {trials} of {trials} trials, {blocks} blocks, peak "
                          f"{peak:.0f} MiB active, {span:.1f} ms of GPU time "
                          f"(reference {ref_span:.1f} ms).", details)


@exercise("ex-streams-handoff", chapter=2, points=3, section="Writing the event handoff", needs_gpu=True,
          objective="Write the event handoff: release a cross-stream buffer safely without record_stream and "
                    "without a stall.", harness=run_event_handoff, judge=judge_event_handoff)
def check_event_handoff(handoff: Callable | None, *, layers: int = 8, buffer_mib: int = 64, trials: int = 3,
                        producer_ms: float = 1.5, consumer_ms: float = 2.0) -> Feedback:
    """Exercise: run the reader's handoff loop on this GPU and judge it
    (:func:`run_event_handoff`, then :func:`judge_event_handoff`).

    ``handoff(all_gather, forward, layers, producer, consumer)`` must call
    ``buf = all_gather(layer)`` and ``done = forward(buf, layer)`` for every layer and
    release each buffer safely, without ``record_stream`` (calling it raises here).

    Without a GPU the check says so (``Feedback.correct`` is None).

    Raises:
        ValueError: layers, buffer_mib or trials out of range, or the buffers do not fit.
    """
    if handoff is None:
        return unanswered("my_handoff (the function's name, without calling it)")
    if not callable(handoff):
        return Feedback(False, f"Pass the function itself, not {type(handoff).__name__}: check_event_handoff(my_handoff).")
    return judge_event_handoff(run_event_handoff(handoff, layers=layers, buffer_mib=buffer_mib, trials=trials,
                                                 producer_ms=producer_ms, consumer_ms=consumer_ms))


def _handoff_details(runs: Sequence[Mapping[str, Any]], ref_span: float, buffer_mib: float) -> dict[str, Any]:
    return {
        "trials": len(runs),
        "corrupted_trials": sum(1 for r in runs if r["corrupted_layers"]),
        "distinct_blocks": max(len(set(r["ptrs"])) for r in runs),
        "peak_active_mib": max(r["memory"].active_peak for r in runs) / MiB,
        "span_ms": float(statistics.median(r["span_ms"] for r in runs)),
        "reference_span_ms": float(ref_span),
        "buffer_mib": buffer_numel(buffer_mib) * 4 / MiB,
    }


@exercise("ex-streams-fsdp-limit", chapter=2, points=1, section="FSDP's own code on one GPU",
          objective="Say what FSDP1's limit_all_gathers can and cannot bound, from where FSDP frees with "
                    "record_stream.")
def check_fsdp_limit(answer: str | None) -> Feedback:
    """Exercise (multiple choice): with NCCL and one rank, what does ``limit_all_gathers=True``
    do to FSDP1's peak memory as the CPU runs further ahead? (FSDP1 then runs ``NO_SHARD``;
    its rate limiter waits only on the events of freed all-gathered parameters,
    ``torch/distributed/fsdp/_runtime_utils.py``, ``_unshard`` and ``_reshard``.)"""
    if answer is None:
        return unanswered('the letter of your choice: "a", "b", "c" or "d"')
    return check_choice(answer, "b", name="your choice", explanations={
        "a": "Not at world size 1. The rate limiter waits on events that _reshard records when it frees an "
             "all-gathered parameter. With one rank FSDP1 runs NO_SHARD and frees none, so the limiter never "
             "has anything to wait on. Compare FSDP1's two lines in the first figure of the section.",
        "b": "Right. NO_SHARD frees no gathered parameters, so the limiter never blocks the CPU, while each "
             "layer's low-precision copy, made on the pre-unshard stream, is still freed with record_stream and "
             "parked until a later allocation sees its event complete. Sharded over two ranks, the same limiter "
             "does bound the gathered parameters, at the price of a blocked CPU.",
        "c": "No: the parked blocks are the low-precision copies that mixed precision makes. With fp32 "
             "parameters FSDP1 needs no such copy, and the limiter's rule does not depend on the dtype.",
        "d": "No: the limiter keeps no buffers of its own. It holds free events and makes the CPU wait on the "
             "oldest one before the next all-gather.",
    })
