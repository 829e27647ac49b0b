"""More real programs for the allocator doctor, our own, one per class of issue 17, and the
helpers every doctor case uses (allocation, probes, calibrated GPU work, the history).

Each program takes a :class:`~experiments.allocator.doctor_gpu._Recorder`, marks its phases
and follows the rules of :mod:`experiments.allocator.doctor_cases`: the GPU's run is a
function of the allocator setting alone (long GPU work against the host's issue time, syncs
at fixed points; requests that may not fit are probes, freed at once, made on a stream of
their own so that their cached segments are no room for the rest of the program, which
always fits). torch is imported inside the functions.
"""
from __future__ import annotations

import gc
import random
from typing import Any

from .doctor_gpu import _Recorder

MiB = 1024**2
GiB = 1024**3

_SLEEP_CYCLES_PER_MS = 2_000_000   # the lab H200 runs _sleep at about 1.98 GHz; only "long" matters


def _start_history(frames: bool) -> None:
    import torch

    torch.cuda.memory._record_memory_history(enabled="all", context="all" if frames else None,
                                             stacks="python", max_entries=3_000_000)


def _empty(nbytes: int) -> Any:
    import torch

    return torch.empty(nbytes, dtype=torch.uint8, device="cuda")


def _probe(nbytes: int) -> bool:
    """Allocate ``nbytes`` and free it at once; False when it does not fit (the OOM is caught)."""
    import torch

    try:
        t = _empty(nbytes)
    except torch.OutOfMemoryError:
        return False
    del t
    return True


def _sleep_ms(ms: float) -> None:
    import torch

    torch.cuda._sleep(int(ms * _SLEEP_CYCLES_PER_MS))


def _warm_streams(*streams: Any) -> None:
    """Load the sleep kernel and make each stream's first event before the program's first
    phase, so that a slow first launch cannot let the GPU catch up with the host later on."""
    import torch

    for st in streams:
        with torch.cuda.stream(st):
            _sleep_ms(0.1)
            torch.cuda.Event().record(st)
    torch.cuda.synchronize()


# ----------------------------------------------------------------------------- the programs

def _c_prefetch_pages(rec: _Recorder) -> None:
    """FSDP2's pattern, by hand: a communication stream fills each layer's unsharded
    parameters ahead of the compute stream, which takes them over with ``record_stream`` and
    drops them while its work is still queued; in the backward the gradients go on to a reduce
    stream the same way. Parameter sizes are whole multiples of the 20 MiB expandable page
    (a freed block then ends exactly where the mapped memory ends) and ragged ones, with small
    buffers (biases) that fill 2 MiB pages exactly. The host runs ahead until each step's end."""
    import torch

    rng = random.Random(71)
    comm, reduce_ = torch.cuda.Stream(), torch.cuda.Stream()
    main = torch.cuda.current_stream()
    layers = (20, 40, 13, 20, 60, 7, 40, 2)        # MiB of unsharded parameters per layer
    _warm_streams(comm, reduce_, main)
    rec.mark("start")
    shards: dict[int, Any] = {}
    for step in range(6):
        acts = []
        for li, mib in enumerate(layers):
            with torch.cuda.stream(comm):
                _sleep_ms(0.2)
                full = _empty(mib * MiB + (rng.randrange(0, 4) * 256 * 1024 if li % 3 == 2 else 0))
                bias = _empty(rng.choice((512, 1024)) * 1024)
            main.wait_stream(comm)
            full.record_stream(main)
            bias.record_stream(main)
            _sleep_ms(5.0)                          # the layer's compute: the host runs ahead
            acts.append(_empty(rng.choice((3, 6, 11, 20)) * MiB))
            del full, bias
        for li in reversed(range(len(layers))):
            with torch.cuda.stream(comm):
                _sleep_ms(0.2)
                full = _empty(layers[li] * MiB)
            main.wait_stream(comm)
            full.record_stream(main)
            _sleep_ms(5.0)
            grad = _empty(layers[li] * MiB)
            acts.pop()
            del full
            reduce_.wait_stream(main)
            grad.record_stream(reduce_)
            with torch.cuda.stream(reduce_):
                _sleep_ms(1.0)
                shards[li] = _empty(layers[li] * MiB // 4)   # the old shard goes at once (same stream)
            del grad
        torch.cuda.synchronize()
        if step % 2 == 1:
            rec.mark(f"step{step + 1}")
    shards.clear()
    torch.cuda.empty_cache()
    rec.mark("end")


def _c_cap_two_streams(rec: _Recorder) -> None:
    """Two streams under a 1 GiB cap, each with a ragged working set (3-47 MiB tensors, at most
    six alive, so it always fits) that turns over; after each round a ladder of buffers near
    what is left is asked for on a third stream (probes, freed at once, their cached segments
    apart from the working set's), so that some fit under one setting and not under another."""
    import torch

    rng = random.Random(59)
    streams = [torch.cuda.current_stream(), torch.cuda.Stream()]
    probe_stream = torch.cuda.Stream()
    live: list[list[Any]] = [[], []]
    rec.mark("start")
    for rnd in range(6):
        for i, st in enumerate(streams):
            with torch.cuda.stream(st):
                for _ in range(10):
                    if len(live[i]) > 5 or (live[i] and rng.random() < 0.4):
                        live[i].pop(rng.randrange(len(live[i])))
                    live[i].append(_empty(rng.choice((3, 9, 14, 22, 31, 47)) * MiB + rng.randrange(1, 16) * 64 * 1024))
        torch.cuda.synchronize()
        with torch.cuda.stream(probe_stream):
            for n in range(300, 720, 60):
                _probe(n * MiB + rnd * 3 * MiB)
        rec.mark(f"round{rnd + 1}")
    live.clear()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    rec.mark("end")


def _c_gc_ages(rec: _Recorder) -> None:
    """Batches whose size class changes every six steps under a 1.25 GiB cap, one step in five
    on a second stream, a few tensors kept across steps on a third: the cached segments of old
    classes grow stale, so ``garbage_collection_threshold`` frees them by age before a
    ``cudaMalloc``; a probe (on a stream of its own) at the end of each class. Everything but
    the probes always fits."""
    import torch

    rng = random.Random(83)
    main, side, keep_stream, probe_stream = (torch.cuda.current_stream(), torch.cuda.Stream(), torch.cuda.Stream(),
                                             torch.cuda.Stream())
    classes = ((24, 40), (50, 70), (12, 30), (90, 120), (30, 60), (8, 16))
    keep: list[Any] = []
    rec.mark("start")
    for step in range(36):
        lo, hi = classes[step // 6]
        with torch.cuda.stream(side if step % 5 == 4 else main):
            batch = [_empty(rng.randint(lo, hi) * MiB + rng.randrange(4096)) for _ in range(rng.randint(3, 6))]
        if step % 4 == 0:
            with torch.cuda.stream(keep_stream):
                keep.append(_empty(rng.choice((6, 18, 33)) * MiB))
            if len(keep) > 5:
                keep.pop(0)
        del batch
        if step % 6 == 5:
            torch.cuda.synchronize()
            with torch.cuda.stream(probe_stream):
                _probe(rng.choice((400, 520, 640, 760)) * MiB)
            rec.mark(f"class{step // 6 + 1}")
    keep.clear()
    torch.cuda.empty_cache()
    rec.mark("end")


def _c_graph_pools_mixed(rec: _Recorder) -> None:
    """CUDA graphs captured by hand into private pools of every kind: one graph in a pool of
    its own (id (n, 0)), a second sharing it through ``g.pool()``, two more captured on a side
    stream into a ``graph_pool_handle()`` pool (id (0, n)); graphs deleted while their
    outputs live on, the cache emptied in between, eager work in the default pool."""
    import torch
    from torch import nn

    torch.manual_seed(1)
    m1 = nn.Sequential(nn.Linear(768, 3072), nn.GELU(), nn.Linear(3072, 768)).cuda().eval()
    m2 = nn.Sequential(nn.Linear(768, 1536), nn.ReLU(), nn.Linear(1536, 2304)).cuda().eval()
    cur, warm_s, cap_s = torch.cuda.current_stream(), torch.cuda.Stream(), torch.cuda.Stream()

    def warm(m: Any, x: Any, st: Any) -> None:
        st.wait_stream(cur)
        with torch.cuda.stream(st):
            for _ in range(2):
                m(x)
        cur.wait_stream(st)

    def capture(m: Any, x: Any, pool: Any = None, stream: Any = None) -> tuple[Any, Any]:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool, stream=stream):
            out = m(x)
        return g, out

    rec.mark("model")
    with torch.no_grad():
        x1 = torch.randn(48, 768, device="cuda")
        warm(m1, x1, warm_s)
        g1, o1 = capture(m1, x1)
        x2 = torch.randn(160, 768, device="cuda")
        warm(m1, x2, warm_s)
        g2, o2 = capture(m1, x2, pool=g1.pool())
        handle = torch.cuda.graph_pool_handle()
        x3 = torch.randn(64, 768, device="cuda")
        warm(m2, x3, cap_s)
        g3, o3 = capture(m2, x3, pool=handle, stream=cap_s)
        x4 = torch.randn(400, 768, device="cuda")
        warm(m2, x4, cap_s)
        g4, o4 = capture(m2, x4, pool=handle, stream=cap_s)
        for g in (g1, g2, g3, g4):
            g.replay()
        del g                                   # the loop variable would keep g4 alive
        torch.cuda.synchronize()
        rec.mark("captured")
        eager = m1(torch.randn(256, 768, device="cuda"))
        del g1
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        rec.mark("g1_deleted")
        del g2, o1
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        rec.mark("g2_deleted")
        del o2
        gc.collect()
        torch.cuda.empty_cache()
        g3.replay()
        g4.replay()
        del g3, o3
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        rec.mark("g3_deleted")
        del g4, o4, eager, x1, x2, x3, x4
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    rec.mark("end")


def _mempools_two_program(rec: _Recorder, probes: tuple[int, ...]) -> None:
    import torch

    rng = random.Random(97)
    side = torch.cuda.Stream()
    p1, p2 = torch.cuda.MemPool(), torch.cuda.MemPool()
    a: list[Any] = []
    b: list[Any] = []
    base = [_empty(n * MiB) for n in (40, 8)]
    rec.mark("base")
    for i in range(40):
        with torch.cuda.use_mem_pool(p1):
            if a and rng.random() < 0.4:
                a.pop(rng.randrange(len(a)))
            a.append(_empty(rng.choice((2, 5, 16, 33)) * MiB + rng.randrange(8192)))
        with torch.cuda.stream(side), torch.cuda.use_mem_pool(p2):
            if b and rng.random() < 0.4:
                b.pop(rng.randrange(len(b)))
            b.append(_empty(rng.choice((1, 4, 12, 24)) * MiB + rng.randrange(8192)))
        if i % 10 == 9:
            base.append(_empty(rng.choice((6, 26)) * MiB))   # the default pool meanwhile
    torch.cuda.synchronize()
    rec.mark("phase")
    survivor = a[-1]
    a.clear()
    del p1
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    rec.mark("p1_deleted")
    b.clear()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()          # p2 is alive: its free segments stay
    rec.mark("p2_cleared")
    del survivor
    torch.cuda.empty_cache()          # p1's last segment goes now
    rec.mark("survivor_gone")
    for n in probes:
        _probe(n * MiB)
    del p2
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    rec.mark("p2_deleted")
    base.clear()
    torch.cuda.empty_cache()
    rec.mark("end")


def _c_mempools_two(rec: _Recorder) -> None:
    """Two ``torch.cuda.MemPool`` alive at once, one on the default stream and one on a side
    stream; the first deleted while one of its tensors lives on, the cache emptied around."""
    _mempools_two_program(rec, (256, 1024))


def _c_mempools_two_capped(rec: _Recorder) -> None:
    """The two-pool program under a 1.5 GiB cap, with probes near what the live pools leave."""
    _mempools_two_program(rec, (500, 700, 850, 1000, 1150))


def _c_compiled_infer(rec: _Recorder) -> None:
    """Inference under ``torch.compile(mode="reduce-overhead")`` (CUDA-graph trees) at three
    batch sizes; outputs are cloned and kept (the tree overwrites its own on the next call)."""
    import torch
    from torch import nn

    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(384, 1536), nn.GELU(), nn.Linear(1536, 384), nn.LayerNorm(384)).cuda().eval()
    compiled = torch.compile(model, mode="reduce-overhead", dynamic=False)
    outs: list[Any] = []
    rec.mark("model")
    with torch.no_grad():
        for bs in (32, 96, 256):
            for _ in range(5):
                x = torch.randn(bs, 384, device="cuda")
                y = compiled(x)
                outs.append(y.clone())
                del x, y
            torch.cuda.synchronize()
            rec.mark(f"batch{bs}")
    outs.clear()
    torch.cuda.empty_cache()
    rec.mark("end")


PROGRAMS = {
    "prefetch_pages": _c_prefetch_pages, "cap_two_streams": _c_cap_two_streams, "gc_ages": _c_gc_ages,
    "graph_pools_mixed": _c_graph_pools_mixed, "mempools_two": _c_mempools_two,
    "mempools_two_capped": _c_mempools_two_capped, "compiled_infer": _c_compiled_infer,
}
