"""The real programs the doctor's lab records (:mod:`experiments.doctor.lab.cases`), one per
class of snapshot readers record: a side-stream producer handing batches over with
``record_stream``, a KV cache grown on two streams, training under a memory cap with requests
that may fail, a loader under a cap, CUDA graphs captured into one shared pool,
``torch.compile`` with CUDA graphs, a ``torch.cuda.MemPool`` used for a phase, a long eager
loop; and our own: FSDP-style prefetch whose buffers fill expandable pages exactly, two
streams under a cap, garbage collection by age, graph pools of every kind, two MemPools at
once, compiled inference.

Each program takes a :class:`~experiments.doctor.lab.recorder.Recorder` and marks its phases.
The programs are written so that the GPU's run is a function of the allocator setting alone:

* work on the streams is long (calibrated ``torch.cuda._sleep``) against the host's issue
  time, and the host synchronizes at fixed points, so a ``record_stream`` free completes at
  the same point of the program in every run;
* a request that may fail under a cap is a probe: it is allocated and freed at once, made on
  a stream of its own so that its cached segments are no room for the rest of the program
  (which always fits), and an out-of-memory error is caught and the program goes on, so what
  the program does next does not depend on whether the probe fitted.

torch is imported inside the functions: the module imports without a GPU.
Sources: ``torch/cuda/memory.py`` (``_record_memory_history``, ``_snapshot``, ``MemPool``,
``use_mem_pool``), ``torch/cuda/graphs.py`` (``graph``, ``graph_pool_handle``),
``torch/_inductor/cudagraph_trees.py`` (``mode="reduce-overhead"``).
"""
from __future__ import annotations

import gc
import random
from typing import Any, Callable

from ...core.units import GiB, MiB
from .recorder import Recorder, empty, probe, sleep_ms, warm_streams


def _c_handoff(rec: Recorder) -> None:
    """Chapter 2's pattern: a side stream produces ragged batches, the default stream consumes
    them; each batch is handed over with ``record_stream`` and dropped while the consumer is
    still behind (run-ahead), then the host waits at the end of each window."""
    import torch

    rng = random.Random(5)
    side, main = torch.cuda.Stream(), torch.cuda.current_stream()
    w = torch.randn(1024, 1024, device="cuda")
    rec.mark("weights")
    for window in range(12):
        for _ in range(6):
            rows = rng.choice((96, 160, 224, 288, 352, 512, 700)) * rng.randint(1, 4)
            with torch.cuda.stream(side):
                sleep_ms(0.2)
                batch = torch.empty(rows, 1024, device="cuda").normal_()
            main.wait_stream(side)
            batch.record_stream(main)
            sleep_ms(3.0)                     # the consumer is slow: the host runs ahead
            act = torch.relu(batch @ w)
            del batch
            total = act.sum()
            del act, total
        torch.cuda.synchronize()
        if window % 4 == 3:
            rec.mark(f"window{window + 1}")
    torch.cuda.empty_cache()
    rec.mark("end")


def _c_kv_two_streams(rec: Recorder) -> None:
    """Two request streams each grow a per-layer KV cache by concatenation; stream 1 also
    reads stream 0's cache (a shared prefix), so stream 0's old caches are handed over with
    ``record_stream`` and free only when stream 1 gets there. Requests end and restart."""
    import torch

    rng = random.Random(17)
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    layers, width = 4, 2 * 8 * 128
    caches: list[list[Any]] = [[None] * layers for _ in streams]
    rec.mark("start")
    for step in range(48):
        for i, st in enumerate(streams):
            with torch.cuda.stream(st):
                sleep_ms(0.5)
                tokens = rng.choice((1, 1, 1, 16, 64)) if step % 12 else rng.choice((128, 512, 1000))
                for layer in range(layers):
                    new = torch.empty(tokens, width, dtype=torch.bfloat16, device="cuda").normal_()
                    old = caches[i][layer]
                    caches[i][layer] = new if old is None else torch.cat([old, new])
                    del old, new
        with torch.cuda.stream(streams[1]):
            sleep_ms(1.5)
            for layer in range(layers):
                prefix = caches[0][layer]
                prefix.record_stream(streams[1])
                _ = prefix[:1].float().sum()
                del prefix, _
        if step % 12 == 11:
            torch.cuda.synchronize()
            caches[step // 12 % 2] = [None] * layers     # a request ends: its cache goes
            rec.mark(f"step{step + 1}")
    torch.cuda.synchronize()
    caches.clear()
    torch.cuda.empty_cache()
    rec.mark("end")


def _c_capped_training(rec: Recorder) -> None:
    """An MLP trained with AdamW on ragged batches under a memory cap; after each step the
    program asks for a large workspace (a probe) that fits or not depending on the setting."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    rng = random.Random(23)
    model = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(2048, 2048), nn.GELU())]).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rec.mark("model")
    for step in range(20):
        bs = rng.choice((256, 384, 640, 1024, 1536, 2048, 3072))
        x = torch.randn(bs, 2048, device="cuda")
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del x, loss
        probe(rng.choice((300, 420, 560, 700, 820)) * MiB)
        if step % 5 == 4:
            rec.mark(f"step{step + 1}")
    del model, opt
    gc.collect()
    for n in (900, 1100, 1300, 1450):
        probe(n * MiB)
    rec.mark("end")


def _c_loader_capped(rec: Recorder) -> None:
    """A data loader under a memory cap: pinned host images copied on a side stream
    (``non_blocking``), handed to the default stream with ``record_stream``, decoded into
    ragged crops; a probe for a large buffer after each window."""
    import torch

    rng = random.Random(31)
    side, main = torch.cuda.Stream(), torch.cuda.current_stream()
    host = [torch.empty(n * MiB, dtype=torch.uint8).pin_memory() for n in (6, 10, 14, 24)]
    rec.mark("pinned")
    for window in range(8):
        for _ in range(8):
            src = rng.choice(host)
            with torch.cuda.stream(side):
                img = src.to("cuda", non_blocking=True)
            main.wait_stream(side)
            img.record_stream(main)
            sleep_ms(2.0)
            crop = img[: rng.randint(1, img.numel())].float()
            del img
            feat = crop * 2
            del crop, feat
        torch.cuda.synchronize()
        probe(rng.choice((180, 260, 340, 420, 500)) * MiB)
        if window % 2 == 1:
            rec.mark(f"window{window + 1}")
    torch.cuda.empty_cache()
    rec.mark("end")


def _c_graph_shared_pool(rec: Recorder) -> None:
    """Inference graphs captured by hand into one shared pool at growing batch sizes, replayed;
    then the small batches' graphs are deleted and the cache emptied."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).cuda().eval()
    pool = torch.cuda.graph_pool_handle()
    graphs: dict[int, tuple[Any, Any, Any]] = {}
    rec.mark("model")
    with torch.no_grad():
        for bs in (8, 32, 96, 256, 640):
            static_in = torch.randn(bs, 1024, device="cuda")
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(2):
                    model(static_in)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                out = model(static_in)
            graphs[bs] = (g, static_in, out)
            g.replay()
            rec.mark(f"captured{bs}")
        for bs in (8, 32):
            del graphs[bs]
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        rec.mark("small_deleted")
        for g, _, _ in graphs.values():
            g.replay()
        x = torch.randn(300, 1024, device="cuda")
        y = model(x)
        del x, y
        rec.mark("eager_after")
        graphs.clear()
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    rec.mark("end")


def _c_compiled_graphs(rec: Recorder) -> None:
    """A small model under ``torch.compile(mode="reduce-overhead")`` (CUDA-graph trees),
    forward and backward, at two batch sizes."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    compiled = torch.compile(model, mode="reduce-overhead", dynamic=False)
    rec.mark("model")
    for bs in (64, 192):
        for _ in range(4):
            x = torch.randn(bs, 512, device="cuda")
            loss = compiled(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            del x, loss
        torch.cuda.synchronize()
        rec.mark(f"batch{bs}")
    torch.cuda.empty_cache()
    rec.mark("end")


def _mempool_program(rec: Recorder, probes: tuple[int, ...]) -> None:
    import torch

    rng = random.Random(41)
    keep = [empty(n * MiB) for n in (64, 96, 128)]
    rec.mark("base")
    pool = torch.cuda.MemPool()
    phase: list[Any] = []
    with torch.cuda.use_mem_pool(pool):
        for _ in range(60):
            if phase and rng.random() < 0.35:
                phase.pop(rng.randrange(len(phase)))
            phase.append(empty(rng.choice((1, 3, 7, 24, 40, 90)) * MiB + rng.randrange(4096)))
    rec.mark("phase")
    outside = [empty(n * MiB) for n in (30, 50)]   # default pool while the private one lives
    phase.clear()
    del pool
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    rec.mark("pool_deleted")
    after = [empty(n * MiB) for n in (2, 12, 48, 160, 12, 48)]
    for n in probes:
        probe(n * MiB)
    rec.mark("after")
    del keep, outside, after
    torch.cuda.empty_cache()
    rec.mark("end")


def _c_mempool_phase(rec: Recorder) -> None:
    """A ``torch.cuda.MemPool`` used for one phase, then deleted and the cache emptied."""
    _mempool_program(rec, (512, 2048))


def _c_mempool_capped(rec: Recorder) -> None:
    """The MemPool program under a 2 GiB cap, with probes near what is left after the phase."""
    _mempool_program(rec, (600, 900, 1100, 1300))


def _c_eager_long(rec: Recorder) -> None:
    """A long eager training loop (hundreds of thousands of trace events): a small transformer,
    AdamW, ragged sequence lengths, gradient clipping, bf16 autocast."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    rng = random.Random(3)
    layer = nn.TransformerEncoderLayer(256, nhead=4, dim_feedforward=1024, batch_first=True, dropout=0.0)
    model = nn.Sequential(nn.TransformerEncoder(layer, num_layers=3, enable_nested_tensor=False),
                          nn.Linear(256, 512)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rec.mark("model")
    # Stop after a fixed number of allocations (about three trace events each: alloc,
    # free_requested, free_completed), the same in every setting.
    target = int(os.environ.get("MEMLAB_EAGER_ALLOCS", "150000"))
    start = torch.cuda.memory_stats()["allocation.all.allocated"]
    step = 0
    while torch.cuda.memory_stats()["allocation.all.allocated"] - start < target:
        seq = rng.choice((48, 64, 80, 96, 128))
        x = torch.randn(16, seq, 256, device="cuda")
        y = torch.randint(0, 512, (16, seq), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(x)
            loss = nn.functional.cross_entropy(out.float().reshape(-1, 512), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        del x, y, out, loss
        step += 1
        if step % 150 == 0:
            rec.mark(f"step{step}")
    torch.cuda.empty_cache()
    rec.mark("end")


def _c_prefetch_pages(rec: Recorder) -> None:
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
    warm_streams(comm, reduce_, main)
    rec.mark("start")
    shards: dict[int, Any] = {}
    for step in range(6):
        acts = []
        for li, mib in enumerate(layers):
            with torch.cuda.stream(comm):
                sleep_ms(0.2)
                full = empty(mib * MiB + (rng.randrange(0, 4) * 256 * 1024 if li % 3 == 2 else 0))
                bias = empty(rng.choice((512, 1024)) * 1024)
            main.wait_stream(comm)
            full.record_stream(main)
            bias.record_stream(main)
            sleep_ms(5.0)                          # the layer's compute: the host runs ahead
            acts.append(empty(rng.choice((3, 6, 11, 20)) * MiB))
            del full, bias
        for li in reversed(range(len(layers))):
            with torch.cuda.stream(comm):
                sleep_ms(0.2)
                full = empty(layers[li] * MiB)
            main.wait_stream(comm)
            full.record_stream(main)
            sleep_ms(5.0)
            grad = empty(layers[li] * MiB)
            acts.pop()
            del full
            reduce_.wait_stream(main)
            grad.record_stream(reduce_)
            with torch.cuda.stream(reduce_):
                sleep_ms(1.0)
                shards[li] = empty(layers[li] * MiB // 4)   # the old shard goes at once (same stream)
            del grad
        torch.cuda.synchronize()
        if step % 2 == 1:
            rec.mark(f"step{step + 1}")
    shards.clear()
    torch.cuda.empty_cache()
    rec.mark("end")


def _c_cap_two_streams(rec: Recorder) -> None:
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
                    live[i].append(empty(rng.choice((3, 9, 14, 22, 31, 47)) * MiB + rng.randrange(1, 16) * 64 * 1024))
        torch.cuda.synchronize()
        with torch.cuda.stream(probe_stream):
            for n in range(300, 720, 60):
                probe(n * MiB + rnd * 3 * MiB)
        rec.mark(f"round{rnd + 1}")
    live.clear()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    rec.mark("end")


def _c_gc_ages(rec: Recorder) -> None:
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
            batch = [empty(rng.randint(lo, hi) * MiB + rng.randrange(4096)) for _ in range(rng.randint(3, 6))]
        if step % 4 == 0:
            with torch.cuda.stream(keep_stream):
                keep.append(empty(rng.choice((6, 18, 33)) * MiB))
            if len(keep) > 5:
                keep.pop(0)
        del batch
        if step % 6 == 5:
            torch.cuda.synchronize()
            with torch.cuda.stream(probe_stream):
                probe(rng.choice((400, 520, 640, 760)) * MiB)
            rec.mark(f"class{step // 6 + 1}")
    keep.clear()
    torch.cuda.empty_cache()
    rec.mark("end")


def _c_graph_pools_mixed(rec: Recorder) -> None:
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


def _mempools_two_program(rec: Recorder, probes: tuple[int, ...]) -> None:
    import torch

    rng = random.Random(97)
    side = torch.cuda.Stream()
    p1, p2 = torch.cuda.MemPool(), torch.cuda.MemPool()
    a: list[Any] = []
    b: list[Any] = []
    base = [empty(n * MiB) for n in (40, 8)]
    rec.mark("base")
    for i in range(40):
        with torch.cuda.use_mem_pool(p1):
            if a and rng.random() < 0.4:
                a.pop(rng.randrange(len(a)))
            a.append(empty(rng.choice((2, 5, 16, 33)) * MiB + rng.randrange(8192)))
        with torch.cuda.stream(side), torch.cuda.use_mem_pool(p2):
            if b and rng.random() < 0.4:
                b.pop(rng.randrange(len(b)))
            b.append(empty(rng.choice((1, 4, 12, 24)) * MiB + rng.randrange(8192)))
        if i % 10 == 9:
            base.append(empty(rng.choice((6, 26)) * MiB))   # the default pool meanwhile
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
        probe(n * MiB)
    del p2
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    rec.mark("p2_deleted")
    base.clear()
    torch.cuda.empty_cache()
    rec.mark("end")


def _c_mempools_two(rec: Recorder) -> None:
    """Two ``torch.cuda.MemPool`` alive at once, one on the default stream and one on a side
    stream; the first deleted while one of its tensors lives on, the cache emptied around."""
    _mempools_two_program(rec, (256, 1024))


def _c_mempools_two_capped(rec: Recorder) -> None:
    """The two-pool program under a 1.5 GiB cap, with probes near what the live pools leave."""
    _mempools_two_program(rec, (500, 700, 850, 1000, 1150))


def _c_compiled_infer(rec: Recorder) -> None:
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


PROGRAMS: dict[str, Callable[[Recorder], None]] = {
    "handoff": _c_handoff, "kv_two_streams": _c_kv_two_streams, "capped_training": _c_capped_training,
    "loader_capped": _c_loader_capped, "graph_shared_pool": _c_graph_shared_pool,
    "compiled_graphs": _c_compiled_graphs, "mempool_phase": _c_mempool_phase,
    "mempool_capped": _c_mempool_capped, "eager_long": _c_eager_long,
    "prefetch_pages": _c_prefetch_pages, "cap_two_streams": _c_cap_two_streams, "gc_ages": _c_gc_ages,
    "graph_pools_mixed": _c_graph_pools_mixed, "mempools_two": _c_mempools_two,
    "mempools_two_capped": _c_mempools_two_capped, "compiled_infer": _c_compiled_infer,
}


__all__ = ["PROGRAMS"]
