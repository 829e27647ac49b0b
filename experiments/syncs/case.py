"""Chapter 4 case study: a training step whose metrics helper hides a host-to-device sync.

The step is small but complete: an MLP forward and backward, per-parameter-group
gradient statistics reduced by a metrics helper, gradient clipping, AdamW, and an
exponential moving average (EMA) of the weights. Clipping, AdamW and the EMA update one
parameter tensor at a time (``foreach=False`` and a Python loop), as research code and
hand-written optimizers often do: after the backward pass the host issues several hundred
small kernels. The helper is the post's ``reduce_grad_stats``: it indexes a ``[groups, 8]``
CUDA tensor with a *tuple* of columns, which PyTorch turns into a CPU index tensor and a
blocking copy, a full stream sync right after the backward pass was queued. Source:
"Host-to-device syncs are bad too",
https://docs.pytorch.org/devlogs/eager/2026-08-11-hidden-h2d-sync/ (case study).

Why the step is built this way: a sync costs the GPU idle time after it, which is about
the host time of the work that follows the sync minus the GPU time of that work. Here
that is the clipping, optimizer and EMA loops (host-heavy, GPU-light). The batch is sized
at run time so that the GPU time of a whole step is a chosen multiple (``balance``) of its
host time: at about 1 the sync-free step keeps both sides busy and the sync costs most,
on a T4 as on an H200.
"""
from __future__ import annotations

import functools
import statistics
import time
from typing import Any, Callable

from ..core.device import check_fits
from ..core.lazy_torch import torch
from ..core.measure import gpu_sleep, summarize
from .detector import SyncDetector

SUM_COLS = (0, 2, 3, 4, 5, 6, 7)
STAT_COLUMNS = ("sum of squares", "max |g|", "sum |g|", "sum g", "zeros", "non-finite", "|g| > 1", "numel")
WIDTH = 512
LAYERS = 16
FIRST_BATCH = 256
MAX_BATCH = 131072
MAX_GRAD_NORM = 1.0
# Host-side phases of a step, between the marks "start", "backward", "metrics" and "end".
PHASES = ("forward + backward", "metrics", "clip, optimizer, EMA")
_MARKS = ("start", "backward", "metrics", "end")


def reduce_grad_stats(local: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The post's metrics helper: sum seven columns over groups, and the max of column 1.

    Args:
        local: ``[groups, 8]`` float tensor of per-group gradient statistics
            (columns: :data:`STAT_COLUMNS`).

    Returns:
        (sums ``[7]``, gmax 0-dim). On a CUDA tensor the tuple index makes PyTorch build
        a pageable CPU index tensor and copy it with a blocking copy: a stream sync.
    """
    sums = local[:, SUM_COLS].sum(dim=0)
    gmax = local[:, 1].max()
    return sums, gmax


_SUM_INDEX: dict[torch.device, torch.Tensor] = {}


def reduce_grad_stats_fixed(local: torch.Tensor, index: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`reduce_grad_stats` without the sync: the column index lives on the device.

    Args:
        local: as in :func:`reduce_grad_stats`.
        index: the columns :data:`SUM_COLS` as a tensor on ``local``'s device. Without
            it, the index is copied once per device (one sync, the first time) and kept
            for the life of the process; the experiment passes its own, so that nothing
            it made stays allocated after it returns.
    """
    if index is None:
        index = _SUM_INDEX.get(local.device)
        if index is None:
            index = _SUM_INDEX[local.device] = torch.tensor(SUM_COLS, device=local.device)
    return local.index_select(1, index).sum(dim=0), local[:, 1].max()


def group_stats(grads: list[torch.Tensor]) -> torch.Tensor:
    """``[8]`` statistics of a group's gradients (:data:`STAT_COLUMNS`), computed on the device."""
    g = torch.cat([t.reshape(-1) for t in grads])
    a = g.abs()
    return torch.stack([
        g.square().sum(), a.max(), a.sum(), g.sum(),
        (g == 0).sum().to(g.dtype), (~torch.isfinite(g)).sum().to(g.dtype), (a > 1).sum().to(g.dtype),
        torch.full((), float(g.numel()), device=g.device, dtype=g.dtype),
    ])


@functools.cache
def _block_class() -> type:
    """The model's layer (made on first use: a subclass of ``torch.nn.Module`` needs torch
    imported, and importing the chapter should not)."""
    nn = torch.nn

    class _Block(nn.Module):
        def __init__(self, width: int) -> None:
            super().__init__()
            self.linear = nn.Linear(width, width)
            self.norm = nn.LayerNorm(width)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + nn.functional.gelu(self.norm(self.linear(x)))

    return _Block


class _Phases:
    """Host timestamps (and, with ``events``, CUDA events) at the phase marks of each step."""

    def __init__(self, *, events: bool = True) -> None:
        self.events = events
        self.marks: list[tuple[int, str, float, Any]] = []

    def mark(self, step: int, name: str) -> None:
        ev = None
        if self.events:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
        self.marks.append((step, name, time.perf_counter(), ev))

    def host_ms(self) -> dict[str, list[float]]:
        """Host time (ms) of each phase, per step."""
        out: dict[str, list[float]] = {p: [] for p in PHASES}
        by_step: dict[int, dict[str, float]] = {}
        for step, name, t, _ in self.marks:
            by_step.setdefault(step, {})[name] = t
        for marks in by_step.values():
            for phase, a, b in zip(PHASES, _MARKS, _MARKS[1:]):
                if a in marks and b in marks:
                    out[phase].append((marks[b] - marks[a]) * 1e3)
        return out


class TrainingStep:
    """The case study's model, optimizer and EMA; :meth:`step` runs one training step.

    A step is :meth:`forward_backward`, :meth:`metrics` (per-group gradient statistics
    reduced by ``reduce_fn``; the result stays on the device) and :meth:`update`
    (gradient clipping, AdamW and the EMA, each one parameter tensor at a time).

    Args:
        width, layers: MLP size (``layers`` residual blocks of Linear, LayerNorm, GELU).
        batch: rows per step (change it with :meth:`set_batch`).
        device: a CUDA device (the CPU works too, for tests).
    """

    def __init__(self, *, device: torch.device, width: int = WIDTH, layers: int = LAYERS, batch: int = 64,
                 seed: int = 0, ema_decay: float = 0.999, max_grad_norm: float = MAX_GRAD_NORM) -> None:
        torch.manual_seed(seed)
        self.device, self.width, self.layers, self.seed = device, width, layers, seed
        nn, block = torch.nn, _block_class()
        self.model = nn.Sequential(*[block(width) for _ in range(layers)], nn.Linear(width, 64)).to(device)
        groups: dict[str, list[nn.Parameter]] = {"early weights": [], "late weights": [], "biases": [], "norms": []}
        for name, p in self.model.named_parameters():
            if ".norm." in name:
                groups["norms"].append(p)
            elif name.endswith("bias"):
                groups["biases"].append(p)
            elif int(name.split(".")[0]) < layers // 2:
                groups["early weights"].append(p)
            else:
                groups["late weights"].append(p)
        decay = {"early weights": 0.01, "late weights": 0.01, "biases": 0.0, "norms": 0.0}
        # foreach=False: one parameter at a time, like most hand-written optimizers. Every
        # tensor costs the host a few launches of small kernels: cheap on the GPU, not on the host.
        self.opt = torch.optim.AdamW([{"params": ps, "weight_decay": decay[k]} for k, ps in groups.items()],
                                     lr=1e-4, foreach=False)
        self.params = [p for ps in groups.values() for p in ps]
        self.ema = [p.detach().clone() for p in self.params]
        self.ema_decay = ema_decay
        self.max_grad_norm = max_grad_norm
        self.stat_sums = torch.zeros(len(SUM_COLS), device=device)
        self.stat_max = torch.zeros((), device=device)
        self.loss_sum = torch.zeros((), device=device)
        self.set_batch(batch)

    def set_batch(self, batch: int) -> None:
        """New inputs and targets with ``batch`` rows."""
        g = torch.Generator(device=self.device).manual_seed(self.seed)
        self.batch = batch
        self.x = torch.randn(batch, self.width, device=self.device, generator=g)
        self.y = torch.randn(batch, 64, device=self.device, generator=g)

    def activation_bytes(self, batch: int) -> int:
        """Rough bytes live during forward + backward at ``batch`` rows (float32)."""
        return batch * self.width * 4 * (6 * self.layers + 4)

    def forward_backward(self) -> torch.Tensor:
        self.opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(self.model(self.x), self.y)
        loss.backward()
        return loss

    def metrics(self, reduce_fn: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Per-group gradient statistics, reduced by ``reduce_fn`` and accumulated on the device."""
        local = torch.stack([group_stats([p.grad for p in g["params"]]) for g in self.opt.param_groups])
        sums, gmax = reduce_fn(local)
        self.stat_sums.add_(sums)
        torch.maximum(self.stat_max, gmax, out=self.stat_max)

    def update(self, loss: torch.Tensor) -> None:
        """Gradient clipping, the optimizer step and the EMA, one parameter tensor at a time."""
        torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm, foreach=False)
        self.opt.step()
        with torch.no_grad():
            for e, p in zip(self.ema, self.params):
                e.mul_(self.ema_decay).add_(p, alpha=1 - self.ema_decay)
        self.loss_sum.add_(loss.detach())

    def step(self, reduce_fn: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
             phases: _Phases | None = None, index: int = 0) -> None:
        """One training step; the metrics go through ``reduce_fn`` and stay on the device."""
        if phases:
            phases.mark(index, "start")
        loss = self.forward_backward()
        if phases:
            phases.mark(index, "backward")
        self.metrics(reduce_fn)
        if phases:
            phases.mark(index, "metrics")
        self.update(loss)
        if phases:
            phases.mark(index, "end")


def queued_gpu_ms(fn: Callable[[], Any], *, lead_ms: float, repeats: int = 3) -> float:
    """GPU time of ``fn`` (ms, median) with its launches hidden behind ``lead_ms`` of queued work.

    The start event is queued after a sleep kernel, so by the time the GPU reaches it
    every kernel of ``fn`` is already queued (``lead_ms`` must exceed the host time of
    ``fn``): the interval is GPU execution only, not host launch time.
    """
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        gpu_sleep(lead_ms)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def host_ms_per_step(ts: TrainingStep, reduce_fn: Callable, *, repeats: int = 7) -> tuple[float, dict[str, float]]:
    """Median host time of one step (ms) and of each of its :data:`PHASES`, the GPU drained
    before each step (so no phase includes a wait, whatever ``reduce_fn`` does)."""
    totals = []
    phases = _Phases(events=False)
    for i in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        ts.step(reduce_fn, phases, i)
        totals.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(totals), {k: statistics.median(v) for k, v in phases.host_ms().items()}


def choose_batch(ts: TrainingStep, target_ms: float, *, lead_ms: float) -> tuple[int, float]:
    """The batch whose forward + backward takes about ``target_ms`` of GPU time.

    Doubles from :data:`FIRST_BATCH` rows until the GPU time reaches the target (or
    memory or :data:`MAX_BATCH` stops it), then interpolates. Returns (batch, measured
    GPU ms).
    """
    batch, prev = FIRST_BATCH, None
    while True:
        ts.set_batch(batch)
        g = queued_gpu_ms(ts.forward_backward, lead_ms=lead_ms)
        if g >= target_ms or batch >= MAX_BATCH:
            break
        try:
            check_fits("batch", ts.activation_bytes(batch * 2), fraction=0.5)
        except ValueError:
            break
        prev, batch = (batch, g), batch * 2
    if prev is not None and g > target_ms:
        pb, pg = prev
        guess = pb + (target_ms - pg) * (batch - pb) / max(g - pg, 1e-6)
        guess = int(min(batch, max(pb, round(guess / 64) * 64)))
        if guess != batch:
            batch = guess
            ts.set_batch(batch)
            g = queued_gpu_ms(ts.forward_backward, lead_ms=lead_ms)
    torch.cuda.synchronize()
    return batch, g


def measure_variant(ts: TrainingStep, reduce_fn: Callable, *, steps: int, warmup: int = 5,
                    window: int = 3) -> dict[str, Any]:
    """Step time of ``reduce_fn``'s variant, the syncs in one step, and a timeline.

    ``step_ms`` is the median (p10, p90) of the GPU-side period between the starts of
    consecutive steps, from CUDA events: in steady state, the time per step.
    ``host_phase_ms`` holds the median host time of each phase (ms; with the hidden
    sync, "metrics" includes the wait). The timeline holds host and GPU intervals of
    ``window`` steps from the middle of the run (ms; host and GPU clocks aligned through
    a reference event, see ``run_ahead``).
    """
    for _ in range(warmup):
        ts.step(reduce_fn)
    torch.cuda.synchronize()
    with SyncDetector("report") as det:
        ts.step(reduce_fn)
    torch.cuda.synchronize()

    ref = torch.cuda.Event(enable_timing=True)
    h0 = time.perf_counter()
    ref.record()
    ref.synchronize()
    host_zero = (h0 + time.perf_counter()) / 2
    phases = _Phases()
    t0 = time.perf_counter()
    for i in range(steps):
        ts.step(reduce_fn, phases, i)
    end = torch.cuda.Event(enable_timing=True)
    end.record()
    torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - t0) * 1e3

    starts = [ev for (_, name, _, ev) in phases.marks if name == "start"] + [end]
    per_step = [starts[i].elapsed_time(starts[i + 1]) for i in range(steps)]
    s = summarize(per_step)

    first = max(0, steps // 2 - window // 2)
    chosen = [m for m in phases.marks if first <= m[0] < first + window]
    host, gpu = [], []
    for i in range(first, min(first + window, steps)):
        marks = {name: (h, ev) for (j, name, h, ev) in chosen if j == i}
        for phase, (a, b) in zip(PHASES, zip(_MARKS, _MARKS[1:])):
            host.append({"phase": phase, "step": i, "start_ms": (marks[a][0] - host_zero) * 1e3,
                         "end_ms": (marks[b][0] - host_zero) * 1e3})
            gpu.append({"phase": phase, "step": i, "start_ms": ref.elapsed_time(marks[a][1]),
                        "end_ms": ref.elapsed_time(marks[b][1])})
    offset = min(iv["start_ms"] for iv in host + gpu)
    for iv in host + gpu:
        iv["start_ms"] -= offset
        iv["end_ms"] -= offset
    return {
        "step_ms": s.to_dict(),
        "wall_ms_per_step": wall_ms / steps,
        "host_phase_ms": {k: statistics.median(v) for k, v in phases.host_ms().items()},
        "syncs_per_step": det.count,
        "sync_report": [str(e) for e in det.events[:10]],
        "timeline": {"host": host, "gpu": gpu},
    }


def predicted_step_ms(host_phase_ms: dict[str, float], gpu_phase_ms: dict[str, float]) -> dict[str, float]:
    """The queue model's time per step (ms), sync-free and with the sync after the metrics.

    Sync-free, host and GPU overlap and the slower side sets the pace: the larger of the
    two sums. With the sync, the host waits until the GPU has finished forward, backward
    and metrics (or the GPU waits for the host's launches, whichever is later), and then
    issues the update against an empty queue: the GPU runs each small kernel as it
    arrives, so the update takes its host time.

    Args:
        host_phase_ms, gpu_phase_ms: ms per phase, keyed by :data:`PHASES`.
    """
    fb, met, upd = PHASES
    free = max(sum(host_phase_ms[p] for p in PHASES), sum(gpu_phase_ms[p] for p in PHASES))
    before = max(host_phase_ms[fb] + host_phase_ms[met], gpu_phase_ms[fb] + gpu_phase_ms[met])
    hidden = before + max(host_phase_ms[upd], gpu_phase_ms[upd])
    return {"sync_free": free, "hidden_sync": hidden}


def run_case_study(balance: float, steps: int, *, device: torch.device | None = None) -> dict[str, Any]:
    """The whole case study on the current GPU (see ``syncs.case_study`` for the result).

    ``device`` defaults to the current CUDA device (tests pass the CPU, with the timing
    functions of this module replaced by stand-ins).
    """
    device = device if device is not None else torch.device("cuda", torch.cuda.current_device())
    ts = TrainingStep(device=device, batch=FIRST_BATCH)
    # The sync-free helper with an index of this run's own (freed on return), not the
    # process-wide one that reduce_grad_stats_fixed keeps for readers' calls.
    sync_free = functools.partial(reduce_grad_stats_fixed, index=torch.tensor(SUM_COLS, device=device))
    for _ in range(3):
        ts.step(sync_free)
    host_ms, host_phases = host_ms_per_step(ts, sync_free)
    lead = max(10.0, 3 * host_ms)
    # The GPU time of metrics and update depends on the parameters, not on the batch:
    # measure it once, and size the batch so that the whole step reaches balance x host time.
    loss = ts.forward_backward()
    metrics_ms = queued_gpu_ms(lambda: ts.metrics(sync_free), lead_ms=lead)
    update_ms = queued_gpu_ms(lambda: ts.update(loss), lead_ms=lead)
    del loss
    target = max(0.1 * host_ms, balance * host_ms - metrics_ms - update_ms)
    batch, heavy_ms = choose_batch(ts, target, lead_ms=lead)
    gpu_phases = dict(zip(PHASES, (heavy_ms, metrics_ms, update_ms)))
    variants = {
        "hidden_sync": measure_variant(ts, reduce_grad_stats, steps=steps),
        "sync_free": measure_variant(ts, sync_free, steps=steps),
    }
    del ts
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    gpu_ms = heavy_ms + metrics_ms + update_ms
    return {
        "width": WIDTH, "layers": LAYERS, "batch": batch, "host_ms_per_step": host_ms,
        "host_phase_ms": host_phases, "heavy_gpu_ms": heavy_ms, "gpu_phase_ms": gpu_phases,
        "gpu_ms_per_step": gpu_ms, "gpu_to_host": gpu_ms / host_ms if host_ms > 0 else None,
        "predicted_ms": predicted_step_ms(host_phases, gpu_phases),
        "variants": variants,
        "speedup": variants["hidden_sync"]["step_ms"]["median"] / variants["sync_free"]["step_ms"]["median"],
    }
