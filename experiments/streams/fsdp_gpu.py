"""Real FSDP on one GPU, in a fresh process: the side of chapter 2's FSDP section that runs torch.

A stack of ``layers`` square linear layers is trained by FSDP's own code, FSDP2
(``torch.distributed.fsdp.fully_shard``, with ``MixedPrecisionPolicy``) or FSDP1
(``FullyShardedDataParallel`` with ``MixedPrecision``, ``limit_all_gathers`` on or off), in a
process group of its own: NCCL with one rank (``init_process_group("nccl", world_size=1,
rank=0)``, ``MASTER_ADDR``/``MASTER_PORT`` on a free local port) or torch's fake process
group of world size 2 (``torch.testing._internal.distributed.fake_pg``: FSDP shards for two
ranks and runs its all-gather code path, but the collective itself does nothing). Each layer
keeps the GPU busy for ``gpu_ms`` (a calibrated ``torch.cuda._sleep``) and the host for
``host_delay_ms`` (a spin), in forward and in backward, so the CPU runs ahead of the GPU by
about their difference per layer, as in the chapter's own pipeline
(:mod:`experiments.streams.workloads`).

What is measured comes from the allocator itself: ``memory_stats`` counters, and the memory
trace (``torch.cuda.memory._record_memory_history``), whose ``alloc``, ``free_requested`` and
``free_completed`` entries say which stream each block belongs to and which frees were held
back by ``record_stream`` events. Streams are named by reading them off FSDP's own objects.

Sources: ``torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py`` (``unshard``,
``wait_for_unshard``: the world-size-1 path copies on the compute stream, PR #160135),
``_fsdp_collectives.py`` (``foreach_reduce``), ``torch/distributed/fsdp/_flat_param.py``
(``_free_low_precision_sharded_param``, ``_free_unsharded_flat_param``: ``record_stream``),
``_runtime_utils.py`` (``_unshard``: the ``limit_all_gathers`` rate limiter), ``_init_utils.py``
(world size 1 switches FSDP1 to ``NO_SHARD``); the post,
https://docs.pytorch.org/devlogs/eager/2026-09-29-cross-stream-memory-without-record-stream/.

Importing this module needs torch but no GPU; everything that runs needs CUDA.
"""
from __future__ import annotations

import gc
import os
import socket
import time
from typing import Any, Mapping, Sequence

from ..core.lazy_torch import torch
from ..core.measure import calibrate_sleep, gpu_sleep, host_spin
from .fsdp import GROUPS, LAYER_HIDDEN, VERSIONS
from .fsdp_trace import stream_usage

TOKENS = 256                 # rows of the batch each layer multiplies
VERSION_LABELS = {"fsdp2": "FSDP2", "fsdp1": "FSDP1", "fsdp1_nolimit": "FSDP1, limit_all_gathers=False"}
HISTORY_ENTRIES = 500_000


class ProcessGroupError(RuntimeError):
    """``init_process_group`` failed in the fresh process (no NCCL, no fake group, no port)."""


# ------------------------------------------------------------------ process group

def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_process_group(group: str) -> int:
    """Start the default process group of this process; return its world size.

    'nccl': NCCL with one rank, its store on a free port of 127.0.0.1 (``MASTER_ADDR``,
    ``MASTER_PORT``; another port is tried if that one is taken meanwhile). 'fake': torch's
    fake process group with two ranks (this process is rank 0; collectives return at once
    and move no data).

    Raises:
        ValueError: an unknown group.
        ProcessGroupError: the group cannot start here (the message says why).
    """
    import torch.distributed as dist

    if group not in GROUPS:
        raise ValueError(f"group must be one of {list(GROUPS)}, got {group!r}")
    if not dist.is_available():
        raise ProcessGroupError("this torch build has no torch.distributed")
    if dist.is_initialized():
        return dist.get_world_size()
    if group == "fake":
        try:
            from torch.testing._internal.distributed.fake_pg import FakeStore
            dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
        except Exception as e:
            raise ProcessGroupError(f"torch's fake process group did not start: {type(e).__name__}: {e}") from e
        return 2
    last: Exception | None = None
    for _ in range(3):
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(_free_port())
        try:
            dist.init_process_group("nccl", rank=0, world_size=1)
            return 1
        except Exception as e:  # a port taken between the probe and the bind: try another
            last = e
            if "address already in use" not in str(e).lower():
                break
    raise ProcessGroupError(f"init_process_group('nccl', world_size=1) failed: {type(last).__name__}: {last}")


class _Collectives:
    """Counts the collectives FSDP issues, by kind, wrapping ``torch.distributed``'s functions
    (FSDP calls them as ``dist.<name>``); a call made inside another counts once."""

    KINDS = {"all_gather_single": "all_gather", "all_gather_into_tensor": "all_gather",
             "_all_gather_base": "all_gather", "all_gather": "all_gather",
             "reduce_scatter_single": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
             "_reduce_scatter_base": "reduce_scatter", "all_reduce": "all_reduce"}

    def __init__(self) -> None:
        import torch.distributed as dist

        self.counts = {"all_gather": 0, "reduce_scatter": 0, "all_reduce": 0}
        self._depth = 0
        self._saved: dict[str, Any] = {}
        for name, kind in self.KINDS.items():
            fn = getattr(dist, name, None)
            if fn is not None:
                self._saved[name] = fn
                setattr(dist, name, self._wrap(fn, kind))

    def _wrap(self, fn: Any, kind: str) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            if self._depth == 0:
                self.counts[kind] += 1
            self._depth += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth -= 1
        return counted

    def reset(self) -> None:
        self.counts = {k: 0 for k in self.counts}

    def restore(self) -> None:
        """Put torch.distributed's own functions back."""
        import torch.distributed as dist

        for name, fn in self._saved.items():
            setattr(dist, name, fn)
        self._saved = {}


# ------------------------------------------------------------------ the model

class _Pace:
    """GPU work and host delay per layer (ms), read by every layer at each call."""

    def __init__(self) -> None:
        self.gpu_ms = 0.0
        self.host_ms = 0.0


class _Work(torch.autograd.Function):
    """The layer's time: host delay, then GPU work, in forward and again in backward (which
    the autograd engine's thread issues, so the host runs ahead there as well). Returns its
    input as a view: it allocates nothing."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, pace: _Pace) -> torch.Tensor:  # type: ignore[override]
        ctx.pace = pace
        host_spin(pace.host_ms)
        gpu_sleep(pace.gpu_ms)
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        host_spin(ctx.pace.host_ms)
        gpu_sleep(ctx.pace.gpu_ms)
        return grad, None


class Layer(torch.nn.Module):
    """One FSDP unit: a bias-free ``hidden × hidden`` linear layer and its paced work."""

    def __init__(self, hidden: int, pace: _Pace) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(hidden, hidden, bias=False)
        self.pace = pace

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the work goes on the input: the module's output stays the linear's own tensor, not a
        # view (FSDP2 hooks its pre-backward on the output)
        return self.lin(_Work.apply(x, self.pace))


class Stack(torch.nn.Module):
    def __init__(self, layers: int, hidden: int, pace: _Pace) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(Layer(hidden, pace) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def low_precision_dtype() -> torch.dtype:
    """bf16 where the GPU has it natively, else fp16 (a T4): two bytes either way."""
    try:
        ok = torch.cuda.is_bf16_supported(including_emulation=False)
    except TypeError:  # older torch: no emulation argument
        ok = torch.cuda.is_bf16_supported()
    return torch.bfloat16 if ok else torch.float16


def _fully_shard() -> tuple[Any, Any]:
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:  # torch < 2.6
        from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard
    return fully_shard, MixedPrecisionPolicy


def build(version: str, *, layers: int, layer_mib: int, reshard_after_forward: bool, mixed_precision: bool,
          world_size: int, pace: _Pace) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The model wrapped by ``version`` ('fsdp2', 'fsdp1' or 'fsdp1_nolimit'), on cuda:0.

    FSDP2: ``fully_shard`` on each layer and on the stack, ``reshard_after_forward`` as given.
    FSDP1: one ``FullyShardedDataParallel`` unit per layer (``ModuleWrapPolicy``),
    ``FULL_SHARD`` (``reshard_after_forward``) or ``SHARD_GRAD_OP``, ``limit_all_gathers`` on
    for 'fsdp1' and off for 'fsdp1_nolimit'. Parameters in the low-precision dtype
    (:func:`low_precision_dtype`) with ``mixed_precision``, gradients reduced in fp32.

    Returns:
        (model, facts): facts has ``sharding`` (FSDP1: the strategy it actually runs,
        ``NO_SHARD`` at world size 1) and ``param_dtype``.
    """
    hidden = LAYER_HIDDEN[layer_mib]
    lowp = low_precision_dtype()
    with torch.device("cuda"):   # initialised on the GPU: the CPU's random numbers would cost seconds
        model = Stack(layers, hidden, pace)
    facts: dict[str, Any] = {"param_dtype": str(lowp if mixed_precision else torch.float32).replace("torch.", "")}
    if version == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh

        fully_shard, Policy = _fully_shard()
        mesh = init_device_mesh("cuda", (world_size,))
        mp = Policy(param_dtype=lowp, reduce_dtype=torch.float32) if mixed_precision else Policy()
        for layer in model.layers:
            fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=mp)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=mp)
        facts["sharding"] = "FSDP2 (per-parameter)"
        return model, facts
    if version not in ("fsdp1", "fsdp1_nolimit"):
        raise ValueError(f"version must be one of {list(VERSIONS)}, got {version!r}")
    import warnings

    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    strategy = ShardingStrategy.FULL_SHARD if reshard_after_forward else ShardingStrategy.SHARD_GRAD_OP
    mp = MixedPrecision(param_dtype=lowp, reduce_dtype=torch.float32, buffer_dtype=lowp) if mixed_precision else None
    with warnings.catch_warnings(record=True) as caught:   # "switching to NO_SHARD" at world size 1
        warnings.simplefilter("always")
        model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Layer}), sharding_strategy=strategy,
                     mixed_precision=mp, limit_all_gathers=(version == "fsdp1"),
                     device_id=torch.cuda.current_device())
    facts["sharding"] = model.sharding_strategy.name
    facts["fsdp1_warnings"] = sorted({str(w.message)[:160] for w in caught if "NO_SHARD" in str(w.message)})
    return model, facts


def stream_names(model: torch.nn.Module, version: str) -> dict[int, str]:
    """cudaStream_t handle -> name of each stream FSDP created, read off FSDP's own objects;
    the current (compute) stream is 'compute'. Streams that share a handle share the name."""
    found: list[tuple[str, Any]] = [("compute", torch.cuda.current_stream())]
    if version == "fsdp2":
        state = model._get_fsdp_state()  # type: ignore[operator]
        ctx = getattr(state, "_comm_ctx", None)
        for attr, label in (("all_gather_copy_in_stream", "all-gather copy-in"), ("all_gather_stream", "all-gather"),
                            ("reduce_scatter_stream", "reduce-scatter"), ("all_reduce_stream", "all-reduce")):
            found.append((label, getattr(ctx, attr, None)))
    else:
        for attr, label in (("_pre_unshard_stream", "pre-unshard"), ("_unshard_stream", "unshard"),
                            ("_post_backward_stream", "post-backward"), ("_all_reduce_stream", "all-reduce")):
            found.append((label, getattr(model, attr, None)))
    names: dict[int, list[str]] = {}
    for label, s in found:
        if s is not None and hasattr(s, "cuda_stream"):
            names.setdefault(int(s.cuda_stream), []).append(label)
    return {h: " / ".join(dict.fromkeys(ls)) for h, ls in names.items()}


# ------------------------------------------------------------------ one training step

def _stats() -> dict[str, int]:
    s = torch.cuda.memory_stats()
    keys = ("allocated_bytes.all.current", "allocated_bytes.all.peak", "active_bytes.all.current",
            "active_bytes.all.peak", "reserved_bytes.all.current", "reserved_bytes.all.peak",
            "num_alloc_retries", "num_ooms")
    return {k: int(s.get(k, 0)) for k in keys}


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> dict[str, Any]:
    """One forward, backward and optimizer step; host enqueue times per phase (ms after the
    start), GPU span (CUDA events on the compute stream) and wall time until the GPU finished."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    unix0 = time.time()
    t0 = time.perf_counter()
    out = model(x)
    loss = out.float().square().mean()
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    opt.step()
    opt.zero_grad(set_to_none=True)
    t3 = time.perf_counter()
    end.record()
    torch.cuda.synchronize()
    t4 = time.perf_counter()
    ms = lambda t: (t - t0) * 1e3  # noqa: E731
    return {"host_ms": ms(t3), "wall_ms": ms(t4), "span_ms": float(start.elapsed_time(end)),
            "phases_ms": {"forward": 0.0, "backward": ms(t1), "optimizer": ms(t2), "enqueued": ms(t3),
                          "done": ms(t4)},
            "t0_unix_us": unix0 * 1e6}


def _history(on: bool) -> None:
    mem = torch.cuda.memory
    if not on:
        mem._record_memory_history(enabled=None)
        return
    try:
        mem._record_memory_history(enabled="all", context=None, stacks="python", max_entries=HISTORY_ENTRIES,
                                   clear_history=True)
    except TypeError:  # a torch without clear_history: stopping the recording above cleared it
        mem._record_memory_history(enabled="all", context=None, stacks="python", max_entries=HISTORY_ENTRIES)


def _trace() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    snap = torch.cuda.memory._snapshot()
    traces = snap.get("device_traces") or [[]]
    return snap, list(traces[0])


def _clean() -> None:
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def release(model: torch.nn.Module) -> None:
    """Let FSDP1's flat parameters go with the model.

    Each ``FlatParameter`` keeps the modules and views it flattened (``_modules``,
    ``_params``, ...), and those views keep the flat parameter as their base inside autograd's
    C++ objects, where Python's garbage collector cannot see the cycle: without this, every
    FSDP1 model of a process would stay on the GPU until the process ends.
    """
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    if not isinstance(model, FSDP):
        return
    for unit in FSDP.fsdp_modules(model):
        flat = getattr(getattr(unit, "_handle", None), "flat_param", None)
        for attr in ("_modules", "_params", "_shared_params", "_tensors", "_param_infos", "_shared_param_infos"):
            if flat is not None and hasattr(flat, attr):
                setattr(flat, attr, None)


class Session:
    """One process group's FSDP runs: the calibrated delay, a counter of collectives, and
    configurations one after another, each from an emptied cache with its peaks reset."""

    def __init__(self, group: str) -> None:
        self.group = group
        self.world_size = start_process_group(group)   # first: on a machine without NCCL, this says so
        torch.cuda.set_device(0)
        calibrate_sleep()
        self.collectives = _Collectives()
        self.pace = _Pace()

    def _model(self, cfg: Mapping[str, Any]) -> tuple[Any, Any, Any, dict[str, Any]]:
        model, facts = build(cfg["version"], layers=cfg["layers"], layer_mib=cfg["layer_mib"],
                             reshard_after_forward=cfg["reshard_after_forward"],
                             mixed_precision=cfg["mixed_precision"], world_size=self.world_size, pace=self.pace)
        opt = torch.optim.SGD(model.parameters(), lr=1e-4)
        x = torch.randn(TOKENS, LAYER_HIDDEN[cfg["layer_mib"]], device="cuda")
        return model, opt, x, facts

    def _warm(self, model: Any, opt: Any, x: Any) -> dict[str, int]:
        """Two steps with no delays (FSDP's lazy init, NCCL's communicator, kernels), counting
        the collectives of the second; then an emptied cache."""
        self.pace.gpu_ms = self.pace.host_ms = 0.0
        train_step(model, opt, x)
        self.collectives.reset()
        train_step(model, opt, x)
        counts = dict(self.collectives.counts)
        _clean()
        return counts

    def step(self, cfg: Mapping[str, Any], *, snapshot: bool) -> dict[str, Any]:
        """One configuration with the memory trace on from its start: build, warm up (two
        steps without delays), then one measured training step at ``cfg``'s pace.

        Returns the step's peaks above its start (:func:`_peaks`), its times
        (:func:`train_step`), the collectives of a warm step, the streams' use
        (:func:`~experiments.streams.fsdp_trace.stream_usage` over the measured step, host
        time of the allocator calls from the step's start) and, with ``snapshot``, the trace in
        the doctor's compact form with the GPU's counters at three marks (``phases``: built,
        warm, step; each with the trace length at that point).
        """
        _clean()
        _history(False)
        torch.cuda.reset_peak_memory_stats()
        _history(True)
        marks: list[dict[str, Any]] = []
        model, opt, x, facts = self._model(cfg)
        self._mark(marks, "built")
        counts = self._warm(model, opt, x)
        names = stream_names(model, cfg["version"])
        self._mark(marks, "warm")
        torch.cuda.reset_peak_memory_stats()
        base = _stats()
        self.pace.gpu_ms, self.pace.host_ms = cfg["gpu_ms"], cfg["host_delay_ms"]
        timing = train_step(model, opt, x)
        after = _stats()
        warm_index = marks[-1]["trace_index"]
        self._mark(marks, "step")
        snap, entries = _trace()
        _history(False)
        t0 = timing["t0_unix_us"]
        first = next((e.get("time_us") for e in entries[warm_index:] if e.get("action") == "alloc"), None)
        usage = stream_usage(entries, names, start=warm_index, end=marks[-1]["trace_index"],
                             t0_us=t0, t1_us=t0 + timing["wall_ms"] * 1e3)
        out = {**facts, **_peaks(base, after), **timing, "collectives": counts,
               "stream_names": sorted(set(names.values())), **usage, "world_size": self.world_size,
               "first_alloc_after_start_ms": None if first is None else (float(first) - t0) / 1e3}
        if snapshot:
            from ..doctor import compact_snapshot   # the doctor's public face

            compact = compact_snapshot(snap)
            compact["device_total_bytes"] = int(torch.cuda.get_device_properties(0).total_memory)
            out["snapshot"] = compact
            out["phases"] = marks
        release(model)
        del model, opt, x
        _clean()
        return out

    @staticmethod
    def _mark(marks: list[dict[str, Any]], phase: str) -> None:
        """The GPU's counters now, and the trace length (the ``_snapshot()`` entry it adds
        lets the doctor's replay stop at the same point)."""
        torch.cuda.synchronize()
        _, entries = _trace()
        marks.append({"phase": phase, "trace_index": len(entries), **_stats()})

    def sweep(self, cfg: Mapping[str, Any], points: Sequence[Sequence[float]], repeats: int) -> dict[str, Any]:
        """``cfg``'s model built once; one measured step per (gpu_ms, host_delay_ms) point and
        repeat (repeats interleaved over the points), each from an emptied cache with the
        trace on. Returns per point the list of the repeats' measurements."""
        model, opt, x, facts = self._model(cfg)
        counts = self._warm(model, opt, x)
        names = stream_names(model, cfg["version"])
        runs: list[list[dict[str, Any]]] = [[] for _ in points]
        for _ in range(repeats):
            for k, (g, h) in enumerate(points):
                _clean()
                _history(False)
                _history(True)
                torch.cuda.reset_peak_memory_stats()
                base = _stats()
                self.pace.gpu_ms, self.pace.host_ms = g, h
                timing = train_step(model, opt, x)
                after = _stats()
                _, entries = _trace()
                usage = stream_usage(entries, names, bins=1)
                runs[k].append({**_peaks(base, after), "host_ms": timing["host_ms"], "wall_ms": timing["wall_ms"],
                                "span_ms": timing["span_ms"], "max_parked_bytes": usage["max_parked_bytes"],
                                "deferred_frees": usage["deferred_frees"], "streams": usage["streams"]})
        _history(False)
        release(model)
        del model, opt, x
        _clean()
        return {**facts, "collectives": counts, "runs": runs}

    def close(self) -> None:
        import torch.distributed as dist

        self.collectives.restore()
        if dist.is_initialized():
            dist.destroy_process_group()


def _peaks(base: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int]:
    """Peaks of the step above the counters at its start, and the start itself."""
    return {
        "peak_allocated_bytes": after["allocated_bytes.all.peak"] - base["allocated_bytes.all.current"],
        "peak_active_bytes": after["active_bytes.all.peak"] - base["active_bytes.all.current"],
        "peak_reserved_bytes": after["reserved_bytes.all.peak"] - base["reserved_bytes.all.current"],
        "start_allocated_bytes": base["allocated_bytes.all.current"],
        "start_reserved_bytes": base["reserved_bytes.all.current"],
        "num_alloc_retries": after["num_alloc_retries"] - base["num_alloc_retries"],
    }


def _pipeline_job(layers: int, buffer_mib: float, points: Sequence[Sequence[float]], repeats: int) -> dict[str, Any]:
    """The chapter's own record_stream and event programs on FSDP's buffer size, per point
    and repeat (:func:`experiments.streams.workloads.run_pipeline`)."""
    from .workloads import run_pipeline, warm_up

    warm_up()
    runs: list[list[dict[str, Any]]] = [[] for _ in points]
    for _ in range(repeats):
        for k, (g, h) in enumerate(points):
            out = {}
            for strategy in ("record_stream", "event"):
                r = run_pipeline(strategy, layers=layers, buffer_mib=buffer_mib, consumer_ms=g, host_delay_ms=h)
                m = r["memory"]
                out[strategy] = {"peak_active_bytes": m.active_peak, "peak_allocated_bytes": m.allocated_peak,
                                 "peak_reserved_bytes": m.reserved_peak, "distinct_blocks": len(set(r["ptrs"])),
                                 "host_ms": r["host_loop_ms"], "wall_ms": r["wall_ms"]}
            runs[k].append(out)
    return {"runs": runs}


def _run_jobs(session: Session, jobs: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], dict[str, str]]:
    results: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for job in jobs:
        key = str(job["key"])
        t0 = time.perf_counter()
        try:
            if job["kind"] == "step":
                results[key] = session.step(job["config"], snapshot=bool(job.get("snapshot", True)))
            elif job["kind"] == "sweep":
                results[key] = session.sweep(job["config"], job["points"], int(job["repeats"]))
            elif job["kind"] == "pipeline":
                results[key] = _pipeline_job(int(job["layers"]), float(job["buffer_mib"]), job["points"],
                                             int(job["repeats"]))
            else:
                raise ValueError(f"unknown job kind {job['kind']!r}")
            results[key]["job_s"] = time.perf_counter() - t0
        except torch.OutOfMemoryError as e:
            errors[key] = f"OutOfMemoryError: {str(e)[:400]}"
            _clean()
        except Exception as e:   # one failing configuration does not stop the others
            import traceback

            errors[key] = f"{type(e).__name__}: {e}\n{traceback.format_exc()[-1500:]}"
            _clean()
    return results, errors


def fsdp_worker(groups: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Fresh-process target: for each ``{"group": 'nccl' or 'fake', "jobs": [...]}`` in turn,
    start that process group (the previous one destroyed), run its jobs in order.

    A job is ``{"kind": "step", "key", "config", "snapshot"}`` (:meth:`Session.step`),
    ``{"kind": "sweep", "key", "config", "points": [[gpu_ms, host_delay_ms], ...],
    "repeats"}`` (:meth:`Session.sweep`) or ``{"kind": "pipeline", "key", "layers",
    "buffer_mib", "points", "repeats"}`` (:func:`_pipeline_job`).

    Returns:
        ``{"groups": {group: {"process_group_error": message}}`` for a group that could not
        start, ``{"session_error": message}`` for one that started on a machine where CUDA
        then failed (neither ran its jobs), else ``{"world_size", "results": {key: value}, "errors":
        {key: message}, "elapsed_s"}``: a failing job is reported and the others still run.
    """
    out: dict[str, Any] = {}
    for spec in groups:
        group = spec["group"]
        t0 = time.perf_counter()
        try:
            session = Session(group)
        except ProcessGroupError as e:
            out[group] = {"process_group_error": str(e)}
            continue
        except Exception as e:   # the group started but CUDA did not: not this group's fault
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
            out[group] = {"session_error": f"{type(e).__name__}: {e}"}
            continue
        try:
            results, errors = _run_jobs(session, spec["jobs"])
        finally:
            session.close()
        out[group] = {"world_size": session.world_size, "results": results, "errors": errors,
                      "elapsed_s": time.perf_counter() - t0}
    return {"groups": out}
