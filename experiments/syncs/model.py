"""Chapter 4's models, plain Python: how far the host runs ahead of a queue of GPU work
(and what a sync costs it), where a pageable ``non_blocking`` copy starts to wait, and the
line fits the chapter reads its probes with. Source: the post "The hidden H2D sync",
https://docs.pytorch.org/devlogs/eager/2026-08-11-hidden-h2d-sync/"""
from __future__ import annotations



RUN_AHEAD_STEPS = 8


def predicted_run_ahead_ms(host_ms: float, gpu_ms: float, steps: int = RUN_AHEAD_STEPS) -> dict[str, float]:
    """The queue model's end times (ms) of the three run-ahead variants.

    No sync: the first kernel starts after ``host_ms``; then whichever side is slower
    sets the pace, so the GPU ends at ``host_ms + gpu_ms + (steps - 1) * max(host_ms, gpu_ms)``.
    A sync every step: nothing overlaps, ``steps * (host_ms + gpu_ms)``. One sync: the
    no-sync time plus ``min(host_ms, gpu_ms)`` (the GPU idles while the host does its
    next step's Python work, or the host waits for a kernel it would have overlapped).
    """
    none = host_ms + gpu_ms + (steps - 1) * max(host_ms, gpu_ms)
    return {"none": none, "once": none + min(host_ms, gpu_ms), "every_step": steps * (host_ms + gpu_ms)}


BLOCKED_FRACTION = 0.5  # a call that waits at least half the queued work waited for the queue


def _slope(xs: list[float], ys: list[float]) -> float:
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0


def copy_threshold(sizes: list[int], blocked_ms: list[float], work_ms: float) -> tuple[int | None, int | None]:
    """(smallest size that waited >= half the queued work, largest smaller size that did not).

    Raises:
        ValueError: the lists differ in length.
    """
    if len(sizes) != len(blocked_ms):
        raise ValueError(f"{len(sizes)} sizes for {len(blocked_ms)} timings")
    half = BLOCKED_FRACTION * work_ms
    threshold = next((s for s, b in zip(sizes, blocked_ms) if b >= half), None)
    staged = max((s for s, b in zip(sizes, blocked_ms) if b < half and (threshold is None or s < threshold)),
                 default=None)
    return threshold, staged
