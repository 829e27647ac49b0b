# %% [markdown]
# # Pinned memory: asynchrony, lifetime, and why nobody gives it back
#
# Every tensor that reaches a GPU from the host starts in host memory, and most ML code
# treats the kind of host memory as a detail: sprinkle `pin_memory=True` on the
# `DataLoader`, add `non_blocking=True` to `.to("cuda")`, move on. This chapter takes the
# detail seriously. Page-locked ("pinned") host memory is what makes a copy fast and truly
# asynchronous, and that asynchrony has a price: once a copy is queued, its host buffer
# belongs to the GPU until the copy has actually run, long after the Python line returned.
#
# The chapter follows the PyTorch DevLog post
# [*Pinned memory: what it is for, and why nobody gives it back*](https://docs.pytorch.org/devlogs/eager/2026-08-09-pinned-memory-allocator/)
# (Edward Yang, 2026) and checks each of its claims on a GPU. The PyTorch tutorial
# [*A guide on good usage of `non_blocking` and `pin_memory()`*](https://docs.pytorch.org/tutorials/intermediate/pinmem_nonblock.html)
# is a good companion.
#
# **What you will learn**
#
# - why a copy from pinned memory is faster than one from ordinary (pageable) memory, and
#   how much faster on your link;
# - when `copy_(..., non_blocking=True)` really returns at once, and when it quietly waits;
# - the *overwrite race*: writing into a pinned buffer whose copy has not run yet, and what
#   each way of preventing it costs;
# - why `del` on the source of a pending copy is safe: the host caching allocator parks the
#   block behind a CUDA event;
# - how that allocator rounds requests to powers of two, caches every block, and gives memory
#   back only when asked, with a call that differs between torch versions;
# - why a CUDA graph fixes the host address of every copy it captured, and the staging-buffer
#   pattern that works with it;
# - how a ring of pinned staging buffers with events keeps a data loader both fast and correct.

# %%
import experiments as ex
from experiments import pinned

ex.status()

# %% [markdown]
# (ch3-bandwidth)=
# ## What pinning buys: bandwidth
#
# A GPU copies host memory with its DMA (direct memory access) engines, which read physical
# pages over PCIe or NVLink without the CPU's help. Ordinary host memory is **pageable**: the
# operating system may move a page, or write it to swap, whenever it likes. The DMA engine
# cannot chase a page that moves, so for a pageable source the CUDA driver first copies the
# data, chunk by chunk, into its own small page-locked staging buffers, and the DMA engine
# reads from there. **Pinned** (page-locked) memory is guaranteed to stay resident at the same
# physical address, so the DMA engine reads it directly: one copy instead of two, and no CPU
# memcpy in the way.
#
# **Predict** before you run the next cell: for a 1 GiB host-to-device (HtoD) copy, how many
# times faster is pinned memory than pageable memory on this GPU? The post says "usually 2-3x
# on PCIe". And at 4 KiB?
#
# The experiment copies sizes from 4 KiB to 1 GiB, each timed with CUDA events (median of
# five copies). Bandwidth is in GB/s with 1 GB = 10<sup>9</sup> bytes, the unit link
# speeds are quoted in; the dashed line is the peak of the GPU's PCIe link as `nvidia-smi`
# reports it. The cell after the figure prints the numbers for both directions.

# %%
bw = ex.run("pinned.bandwidth")
pinned.plot_bandwidth(bw)

# %%
bw_dtoh = ex.run("pinned.bandwidth", direction="dtoh")
print(pinned.bandwidth_summary(bw))
print(pinned.bandwidth_summary(bw_dtoh))

# %% [markdown]
# Three things to read off the figure and the lines above. For large copies pinned memory
# runs close to the link's peak; packet headers and DMA set-up take the rest. Pageable memory
# stays far below it, at the pace of the driver's extra CPU memcpy through its staging
# buffers, and on the lab's H200 the gap is wider than the post's "2-3x": compare the ratio
# printed above. Because that memcpy runs on the host, pageable bandwidth depends on the
# machine's CPU and memory, and it varies more between machines and runs than pinned
# bandwidth, which the link sets; measure yours. For small copies neither kind comes close to
# the link: a copy of a few KiB is dominated by the fixed cost of issuing it (microseconds),
# so batching many small transfers into one large one pays off whatever memory you use.
#
# Device-to-host (DtoH) copies show the same picture (second line), with a smaller gap in the
# lab's run because pageable DtoH was faster than pageable HtoD. Pick the direction here:

# %%
ex.panel("pinned.bandwidth", pinned.plot_bandwidth, params=["direction"])

# %% [markdown]
# The post's first claim, checked against the measurement (the table says whether it was
# measured live or read from the lab's recording):

# %%
ex.show_claim("pinned.bandwidth")

# %% [markdown]
# (ch3-async)=
# ## Asynchrony: how long does the host wait?
#
# Bandwidth is the smaller half of the story. `dst.copy_(src, non_blocking=True)` asks PyTorch
# to *queue* the copy on the current CUDA stream and return. Whether the call really returns
# at once depends on the host memory involved:
#
# - **pinned, `non_blocking=True`**: the copy is queued like a kernel; the call returns within
#   a fraction of a millisecond and the DMA runs when the stream gets to it.
# - **pageable, `non_blocking=True`**: the driver must stage the data through its own buffers.
#   It can copy a small source into a staging buffer right away, but a large one needs the
#   stream to drain first, so the call waits for all the GPU work queued ahead of it. Where
#   "small" ends depends on the driver: the
#   [post on hidden syncs](https://docs.pytorch.org/devlogs/eager/2026-08-11-hidden-h2d-sync/)
#   found it at 64 KB on a GB200; on the lab's H200 it lies higher (see below), and
#   [chapter 4](ch4_hidden_syncs.ipynb) sweeps the size to find it on your GPU.
# - **`non_blocking=False`** (the default): PyTorch synchronizes with the stream after the copy,
#   so the host waits for everything queued ahead, pinned or not.
# - **DtoH into pageable memory** always waits: the data must have arrived before the call
#   can return it into memory the GPU cannot write directly.
#
# The experiment keeps the GPU busy (a calibrated `torch.cuda._sleep`, see
# [How this book measures](measuring.ipynb)), then times only the copy *call* on the host.
#
# **Predict**: with 30 ms of GPU work queued, how long does each of the four calls block for a
# 64 MiB HtoD copy?

# %%
cp = ex.run("pinned.async_copy")
pinned.plot_async_copy(cp)

# %% [markdown]
# Only the pinned, `non_blocking=True` copy left the host free. Every other variant kept the
# host waiting for the whole queue of GPU work, and the two pageable ones longer still: the
# host also waited for their slow staged copy. That is the real reason to pin: a program
# whose host is blocked cannot launch the next kernels, prepare the next batch or run ahead
# of the GPU ([chapter 4](ch4_hidden_syncs.ipynb) is about exactly this). Forgetting to pin
# does not raise an error; it silently turns an overlapped pipeline into a serial one.
#
# Smaller pageable copies can behave differently. The same experiment at three sizes, again
# with 30 ms of GPU work queued:

# %%
for kib in (64, 2048, 65536):
    r = ex.run("pinned.async_copy", size_kib=kib)
    ms = pinned.host_blocked_ms(r, "pageable", True)
    print(f"{kib:>5} KiB, pageable, non_blocking=True: host blocked {ms:6.2f} ms")

# %% [markdown]
# In the lab's run, up to 2 MiB the driver staged the pageable source at once and the call
# returned early even without pinning; at 64 MiB it waited for the queue. This is why code
# that "works fine" in a small test can stall at production sizes. The panel shows every
# recorded size, in both directions (a DtoH copy into pageable memory waited at every size):

# %%
ex.panel("pinned.async_copy", pinned.plot_async_copy, params=["size_kib", "direction"])

# %%
ex.show_claim("pinned.async_returns")

# %% [markdown]
# (ch3-race)=
# ## The buffer is not yours yet: the overwrite race
#
# A `non_blocking` copy from pinned memory returns before the DMA engine has read a single
# byte. Until the stream reaches the copy, the host buffer is still part of a pending
# operation, and nothing stops the host from writing into it. If it does, the GPU copies
# whatever the memory holds *when the copy runs*: the new values, or a mix. No error is
# raised, no warning printed. This is a classic bug in loaders that reuse one staging buffer.
# [pytorch#126946](https://github.com/pytorch/pytorch/issues/126946) reports it for a single
# host write right after the copy call; the maintainers' answer was that with `non_blocking`
# the caller must keep the source unmodified until the copy has completed.
#
# The experiment fills a pinned buffer with 1.0, queues the copy behind 30 ms of GPU work,
# queues another 30 ms (the program goes on with its next step), then writes 2.0 into the
# source. It counts device elements that are not 1.0. Four ways to make the write safe are
# measured, each with the time it blocks the host:
#
# | guard | what it waits for |
# |---|---|
# | pageable source | the driver staged the data during the call (for large copies, after draining the stream) |
# | `torch.cuda.synchronize()` | all work queued on all streams, including the next step |
# | event recorded after the copy, `.synchronize()` | the stream up to the copy, nothing queued behind it |
# | write a fresh pinned buffer | nothing: the old buffer is dropped and the allocator keeps it until the copy ran ({ref}`ch3-del`) |
#
# **Predict** which rows have wrong elements, and rank the four guards by cost.

# %%
race = ex.run("pinned.overwrite_race")
pinned.plot_overwrite_race(race)

# %%
print(pinned.guard_costs_text(race))

# %% [markdown]
# Without a guard, every element arrived with the new value: the host's write landed before
# the DMA engine read the buffer. Every guard prevented that, at very different prices:
#
# - the **event** waited only for the GPU work queued ahead of the copy;
# - **`torch.cuda.synchronize()`** also waited for the next step's work queued behind it,
#   twice as long here because as much work was queued after the copy as before it;
# - the **pageable source** cost as much as the event, or a little more: at 16 MiB the driver
#   drained the stream and then staged the copy (a 1 MiB source it stages at once; try it in
#   the panel below);
# - writing into a **fresh pinned buffer** cost about as little as no guard at all, because the
#   waiting moved from the host to the allocator, which keeps the old block until its copy has
#   run. Its p90 tells the other half of the story: once, no cached block of that size was
#   free, and the allocator pinned new memory, which costs milliseconds ({ref}`ch3-costs`).
#
# *When the host overwrites* decides the outcome. Here is the unguarded copy again, with the
# host's write coming later and later:

# %%
late = [ex.run("pinned.overwrite_race", overwrite_after_ms=ms) for ms in (0.0, 10.0, 60.0)]
print(pinned.race_timing_text(late))

# %% [markdown]
# A write 60 ms after the call came after the copy had run, and even the unguarded version
# delivered the old data: the race is a matter of timing, which is what makes it so hard to
# find in testing.

# %%
ex.panel("pinned.overwrite_race", pinned.plot_overwrite_race,
         params=["size_mib", "overwrite_after_ms"])

# %%
ex.show_claim("pinned.overwrite_race")

# %% [markdown]
# ```{exercise} Guarding a reused staging buffer
# :label: ex-pinned-guard
#
# A loop keeps one pinned buffer `buf`. Each step it fills `buf`, calls
# `dev.copy_(buf, non_blocking=True)`, queues the step's compute, and goes on to fill `buf`
# again. Which call, placed before the next fill, makes the fill safe while blocking the host
# the least? Answer with the letter of an option printed by the next cell.
# ```

# %%
for letter, option in pinned.OVERWRITE_OPTIONS.items():
    print(f"{letter}) {option}")
answer = None  # your letter, e.g. "a"
pinned.check_overwrite_guard(answer)

# %% [markdown]
# ```{solution} ex-pinned-guard
# :class: dropdown
#
# **c**: record an event right after the copy (`done = torch.cuda.Event(); done.record()`)
# and call `done.synchronize()` before the next fill. The event completes when the stream
# reaches the point just after the copy, so the host waits for the copy and the work queued
# ahead of it, but not for the compute queued behind it. `torch.cuda.synchronize()` is also
# safe but waits for everything; `empty_cache()` and `del` protect nothing here; and a pinned
# source is read when the copy *runs*, not when it is called. Even better than waiting on
# every step: use two or more buffers and alternate ({ref}`ch3-ring`), so that the host waits
# less often.
# ```

# %% [markdown]
# (ch3-del)=
# ## `del` is safe: the host caching allocator guards reuse
#
# The race above needed a *live* reference: the host wrote through `buf` while the copy was
# pending. What if the program drops its last reference instead, say a function that pins a
# temporary, launches `x.to("cuda", non_blocking=True)` and returns? Python frees the tensor
# at once. If the pinned block went straight back to a free list, the next `pin_memory()`
# could hand the same memory to someone else, who would fill it before the first copy ran.
#
# PyTorch's **host caching allocator** (`CachingHostAllocator`, which serves every
# `pin_memory()` and `pin_memory=True` allocation) prevents this:
#
# 1. every `non_blocking` copy between a pinned tensor and a CUDA tensor tells the allocator
#    which stream used the block (`record_event` in `aten/src/ATen/native/cuda/Copy.cu`);
# 2. when the block is freed, the allocator records a CUDA event on each of those streams
#    and parks the block in an event queue instead of the free list;
# 3. the next allocation polls the queue, and a block rejoins the free list only once all its
#    events have completed, that is, once its copies have run.
#
# So a block's life has three separate moments: the tensor is released (when its refcount hits
# zero), the block becomes reusable (when its copies have finished), and the memory goes back
# to the operating system (never, unless you ask; see {ref}`ch3-costs`).
#
# The experiment queues a copy from a pinned source behind 50 ms of GPU work, deletes the
# source at once and allocates a pinned tensor of the same size, then synchronizes and
# allocates once more. The figure is a timeline of the GPU stream and the host.

# %%
safe = ex.run("pinned.del_is_safe")
pinned.plot_del_is_safe(safe)

# %%
print(pinned.del_summary(safe))

# %% [markdown]
# While the copy was pending, the allocator handed out a different block, and pinning that new
# block took milliseconds; the device data was intact. Once the copy had run, the dropped
# block came back from the cache, in a small fraction of that time.
#
# The guard covers PyTorch's own copies only. A kernel that reads pinned host memory
# *directly* (zero-copy access through unified addressing, some custom kernels and
# communication libraries) records no event, so dropping its buffer early can hand the memory
# to someone else while the kernel still reads it; such code must keep a reference or record
# the stream itself.

# %%
ex.show_claim("pinned.del_is_safe")

# %% [markdown]
# (ch3-costs)=
# ## What pinning costs, and why the allocator keeps everything
#
# ### Power-of-two blocks
#
# To make freed blocks easy to reuse, the host caching allocator rounds every request up to
# the next power of two and keeps one free list per power of two. It never splits a big block
# to serve a small request, and never merges small ones. A 129.5 MiB request therefore pins
# 256 MiB (the rightmost bars below). For a data loader's repeating batch shapes this hardly
# matters. For very large buffers it does: the post points out that a 100 GiB KV-cache
# offload buffer would lock 128 GiB, which is why vLLM pins such buffers with
# `cudaHostRegister` on an ordinary tensor instead (exact size, no caching).

# %%
p2 = ex.run("pinned.pow2_rounding")
pinned.plot_pow2_rounding(p2)

# %%
ex.show_claim("pinned.pow2_rounding")

# %% [markdown]
# ```{exercise} The price of a 2.08 GiB buffer
# :label: ex-pinned-rounding
#
# A serving system offloads its KV cache into pinned tensors of 2.08 GiB each, allocated with
# `pin_memory=True`. How many GiB of host memory does each one lock?
# ```

# %%
answer_gib = None  # your number of GiB
pinned.check_rounding(answer_gib)

# %% [markdown]
# ```{solution} ex-pinned-rounding
# :class: dropdown
#
# **4 GiB**: 2.08 GiB rounds up to the next power of two, 4 GiB, so almost half of it is
# waste (a real report: [vllm#53042](https://github.com/vllm-project/vllm/issues/53042)).
# Remedies: size buffers at a power of two rather than just above one, pin one large buffer
# and slice it, or register ordinary memory with
# `torch.cuda.cudart().cudaHostRegister(ptr, nbytes, 0)` and manage its lifetime yourself.
# torch 2.14 adds `pinned_max_round_threshold_mb` to switch the rounding off above a size.
# ```

# %% [markdown]
# ### Nothing comes back on its own
#
# When a pinned tensor dies and its copies are done, its block goes to the free list and stays
# **owned** by the allocator: still pinned, still counted, ready for the next request of its
# size. `torch.cuda.empty_cache()` does not touch it; that call releases *device* memory only.
# Only the host allocator's own empty-cache call returns cached blocks to the driver. You can
# watch all this in
# [`torch.cuda.host_memory_stats()`](https://docs.pytorch.org/docs/stable/generated/torch.cuda.memory.host_memory_stats.html):
# `allocated_bytes.current` is what the allocator owns (in use plus cached) and
# `num_host_alloc` / `num_host_free` count the `cudaHostAlloc` / `cudaFreeHost` calls. (Its
# `active_*` counters missed decrements in the lab's tests on torch 2.11, so this chapter
# does not use them.)
#
# ```{exercise} Predict the pinned memory the allocator owns
# :label: ex-pinned-owned
#
# Starting from an empty host cache, a script runs (sizes in MiB, all with `pin_memory=True`):
#
# `a = pin(3)`; `b = pin(3)`; `c = pin(5)`; `del a`; `d = pin(2)`; `e = pin(3)`;
# `del b, c, d, e`; `torch.cuda.empty_cache()`; empty the host cache.
#
# How many MiB does the host allocator own right after `e = pin(3)`, and right after
# `torch.cuda.empty_cache()`? Write your predictions in the next cell, check them, *then* run
# the experiment below it.
# ```

# %%
after_e = None                   # MiB owned right after e = pin(3)
after_device_empty_cache = None  # MiB owned right after torch.cuda.empty_cache()
pinned.check_owned_prediction(after_e, after_device_empty_cache)

# %% [markdown]
# ```{solution} ex-pinned-owned
# :class: dropdown
#
# **18 MiB and 18 MiB.** `a` and `b` get 4 MiB blocks, `c` an 8 MiB block (16 MiB). `del a`
# caches a's block (still 16 MiB owned). `d` needs a 2 MiB block, and no cached block is in
# that bucket (18 MiB). `e` finds a's 4 MiB block in its bucket and reuses it: no new pinning,
# still 18 MiB. Deleting everything caches every block, and `torch.cuda.empty_cache()` only
# releases device memory: 18 MiB. Only the host cache call brings it to 0, with four
# `cudaFreeHost` calls. (Older releases differ. In the torch 2.4 source, which this book read
# but did not run, a request could take any cached block large enough: there `d` would take
# a's 4 MiB block and `e` would need a new one, 20 MiB.)
# ```

# %% [markdown]
# Now run the script on the GPU (or read the lab's run). The dashed line is the model that
# produced the expected answers; the labels count `cudaHostAlloc` / `cudaFreeHost` calls.

# %%
life = ex.run("pinned.lifecycle")
pinned.plot_lifecycle(life)

# %% [markdown]
# The measurement follows the model at every step: `torch.cuda.empty_cache()` left every
# pinned block owned, and only the host cache call gave the memory back, with one
# `cudaFreeHost` per block.
#
# ### Why cache at all: pinning is slow
#
# Pinning fresh memory is not a cheap `malloc`. `cudaHostAlloc` asks the operating system for
# the pages, touches them, locks them and registers them with the driver. Reusing a cached
# block is a look-up in a free list. `tensor.pin_memory()` on an ordinary tensor is a pinned
# allocation plus a copy, so with a warm cache it costs a memcpy. The experiment times all
# three from 1 MiB to 1 GiB, emptying the host cache before each fresh allocation.

# %%
cost = ex.run("pinned.pin_cost")
pinned.plot_pin_cost(cost)

# %%
print(pinned.pin_cost_summary(cost))

# %% [markdown]
# Fresh pinning grows with the size at a roughly fixed price per MiB, while taking a block
# from the cache costs microseconds at any size: for a GiB, the first line above gives the factor.
# This is the post's second argument for never giving pinned memory back: a program with a
# steady state (the same batch shapes every step) that released its pinned buffers would pay
# this price again on the next step, for nothing. The third argument is about CUDA graphs.
#
# ### Giving it back anyway: the call depends on your torch
#
# "Pin once, keep forever" is right for a job that owns its machine. It is wrong for programs
# with phases (training, then evaluation; a trainer and a generator taking turns) whose pinned
# needs change, and for long-running services on shared hosts: pinned memory cannot be swapped,
# so it is taken from every other process on the machine. The calls differ by version:
#
# - torch 2.12 and newer: `torch.accelerator.empty_host_cache()` (public);
# - torch 2.5 to 2.11: `torch._C._host_emptyCache()` (private, CUDA only);
# - older: no call; cached pinned blocks live until the process exits.
#
# Emptying is always safe: it frees only cached blocks whose copies are done. Newer releases
# also bound the cache instead of flushing it (`pinned_max_cached_size_mb` in
# `PYTORCH_CUDA_ALLOC_CONF`, torch 2.14). Here is what the torch in *this kernel* offers.
# It is whatever torch runs the notebook: on the online book that is the CPU build (torch
# 2.13) the pages were built with, not the torch 2.11 that recorded this chapter's results
# on the lab H200; in Colab it is Colab's torch.

# %%
print(pinned.features_text())

# %% [markdown]
# (ch3-graphs)=
# ## CUDA graphs fix host addresses for good
#
# A [CUDA graph](https://docs.pytorch.org/docs/stable/notes/cuda.html#cuda-graphs) records a
# sequence of kernels and copies once and replays it with a single launch. Replays reuse
# exactly the addresses seen at capture, device *and host*. A captured copy from a pinned
# buffer therefore reads the same host address on every replay. Three consequences:
#
# - the buffer must be pinned: a copy involving pageable memory synchronizes, and capture
#   forbids that (PyTorch raises);
# - the buffer must stay alive, at that address, as long as the graph may be replayed (from
#   torch 2.11 the host allocator enforces this for pinned blocks allocated *during* capture:
#   it never recycles them);
# - new data must be written *into* the captured buffer; a new tensor under the same Python
#   name is invisible to the graph.
#
# ```{exercise} What does the replay copy?
# :label: ex-pinned-graph
#
# A graph captures `dev.copy_(stage, non_blocking=True)` while the pinned `stage` holds 1.0.
# Then the host runs `stage.fill_(3.0)`, and after that
# `stage = torch.full_like(stage, 7.0).pin_memory()`, keeping the old tensor alive elsewhere.
# Which value does the next `graph.replay()` copy into `dev`? Predict, check, then run the
# experiment.
# ```

# %%
answer_value = None  # the value dev holds after the replay
pinned.check_graph_replay(answer_value)

# %% [markdown]
# ```{solution} ex-pinned-graph
# :class: dropdown
#
# **3.0.** The graph copies from the address it captured. The in-place `fill_(3.0)` wrote into
# that memory, so replays see 3.0; rebinding `stage` to a new tensor changes nothing the graph
# knows about. This is why systems that use graphs allocate their pinned staging buffers once,
# at start-up, and keep them for the life of the program.
# ```

# %%
graph = ex.run("pinned.graph_replay")
pinned.plot_graph_replay(graph)

# %%
error = graph["pageable_capture_error"]
print(f"Capturing a copy from pageable memory raised: {error}")
ex.show_claim("pinned.graph_reads_captured_address")

# %% [markdown]
# The second panel is the pattern that works with graphs: allocate the pinned staging buffer
# once, before capture; each step, wait until the previous replay has read it, copy the new
# data *into* it, replay, and read results through a pinned buffer that the graph writes with
# a captured DtoH copy:
#
# ```python
# stage = torch.empty(shape, pin_memory=True)        # once, before capture
# readback = torch.empty(2, pin_memory=True)
# with torch.cuda.graph(g):
#     dev.copy_(stage, non_blocking=True)
#     out = model(dev)
#     readback.copy_(out.detach().view(-1)[:2], non_blocking=True)
# done = torch.cuda.Event()
# for batch in loader:
#     done.synchronize()          # the last replay has read stage and written readback
#     stage.copy_(batch)          # new data into the captured address
#     g.replay()
#     done.record()
# ```
#
# (ch3-ring)=
# ## Double buffering: a ring of pinned staging buffers
#
# The overwrite race was fixed above by waiting. A loader that waits on every batch keeps the
# host idle while the copy catches up. The standard fix is a **ring** of N pinned staging
# buffers, each with the event of the copy that last read it. The host fills buffer k while
# the copies and compute of earlier batches run, and waits only when it comes back around to
# a buffer whose copy has not run yet. The more buffers, the further the host can work ahead
# before that happens.
#
# The experiment runs such a loader: per batch the host works 2 ms (decoding, augmenting),
# waits on the slot's event, fills the slot; a copy stream copies it to a device buffer; the
# compute stream waits for the copy, runs the batch's GPU work and checks every element (a
# checksum). The GPU work is either *steady* (3 ms each) or *bursty* (every fourth batch
# 12 ms, the others none: the same mean, like a step that sometimes syncs or evaluates).
# An unsafe variant skips the host's wait, and each variant also runs once with the GPU
# starting behind.
#
# **Predict**: how does the time per batch change from 1 to 4 buffers for steady and for
# bursty work? Which variant delivers wrong batches?

# %%
ring_runs = [ex.run("pinned.double_buffer", buffers=n, compute=c)
             for c in ("steady", "bursty") for n in (1, 2, 3, 4)]
pinned.plot_ring_sweep(ring_runs)

# %%
print(pinned.ring_summary(ring_runs))

# %% [markdown]
# With steady work the GPU sets the pace (3 ms of work per batch against about 2 ms of host
# work), and one buffer already comes close to four (the last line of each block says how
# close): the host waits a little on every
# batch, but the GPU is seldom left without its next one. Bursty work is where the ring
# pays. With a single buffer the host waits for the copy queued behind every slow batch, and
# the GPU then idles through the three fast ones while the host prepares them one at a time.
# Each extra buffer lets the host work further ahead during the slow batch, its total wait
# shrinks, and the time per batch approaches the GPU's mean.
#
# Without the wait, the ring is only as safe as its timing. When the GPU started behind,
# every ring size delivered wrong batches. In the timed run the host, at about 2 ms per batch,
# slowly pulls ahead of the GPU's 3 ms and comes back around to a buffer whose copy has not
# run: more buffers put that moment off, and fewer batches arrived wrong, but waiting on the
# event is the only thing that makes the ring correct. Explore one configuration:

# %%
ex.panel("pinned.double_buffer", pinned.plot_double_buffer, params=["buffers", "compute"])

# %% [markdown]
# ```{exercise} Build a correct double-buffered loader
# :label: ex-pinned-loader
#
# Write a generator `my_loader(batches, n_buffers)`. It receives an iterator of pageable CPU
# float32 tensors, all of one shape, and must yield each one as a CUDA tensor that is ready to
# use on the current stream, in order. Use `n_buffers` pinned staging buffers in a ring, and
# wait on a buffer's event only before refilling it.
#
# The check (GPU only) feeds it 16 MiB batches while the GPU is busy with 200 ms of earlier
# work, and then again with an idle GPU. It verifies every element on the device, and that
# the first `n_buffers` batches are handed over in well under the 200 ms, that is, without
# waiting for the GPU.
# ```

# %%
import torch  # noqa: E402  (for your loader)

my_loader = None  # replace with your generator function my_loader(batches, n_buffers)
pinned.check_loader(my_loader)

# %% [markdown]
# ````{solution} ex-pinned-loader
# :class: dropdown
#
# ```python
# def my_loader(batches, n_buffers=2):
#     ring, copied = [], [None] * n_buffers
#     for k, batch in enumerate(batches):
#         slot = k % n_buffers
#         if len(ring) <= slot:                          # pin once, reuse forever
#             ring.append(torch.empty(batch.shape, dtype=batch.dtype, pin_memory=True))
#         if copied[slot] is not None:
#             copied[slot].synchronize()                 # the copy that last read this buffer ran
#         ring[slot].copy_(batch)                        # host memcpy into page-locked memory
#         out = ring[slot].to("cuda", non_blocking=True) # queued on the current stream
#         copied[slot] = torch.cuda.Event()
#         copied[slot].record()
#         yield out
# ```
#
# The copy goes on the current stream, so the consumer's kernels are ordered after it without
# an extra wait, and the device tensor is allocated on the stream that uses it. Typical wrong
# answers: one buffer without an event (batches arrive with a later batch's data), a plain
# `batch.to("cuda")` or `torch.cuda.synchronize()` per batch (correct but waits for the GPU),
# and a side copy stream without `torch.cuda.current_stream().wait_event(...)` (data read
# before it arrived).
# ````

# %% [markdown]
# ## Applying this to your own code
#
# - **Pin what you copy, once.** `DataLoader(pin_memory=True)` pins batches in a background
#   thread; for your own staging buffers, allocate them at start-up and reuse them. Check with
#   `t.is_pinned()`.
# - **Pair `non_blocking=True` with pinned memory**, and measure whether a copy call blocks the
#   way this chapter did: time the call with `time.perf_counter()` while the GPU is busy.
# - **Never write into a pinned buffer that a queued copy still reads.** Record an event after
#   the copy and wait on it before refilling, or rotate through a ring of buffers. For DtoH
#   copies, wait on the event before *reading* the host buffer.
# - **Dropping a tensor is safe** for PyTorch's own copies; keeping a reference is not a
#   guard against writes.
# - **Budget pinned memory in powers of two**, and watch `torch.cuda.host_memory_stats()`;
#   release the cache with the call for your torch (`pinned.features_text()` prints it) only at
#   phase changes or on shared hosts.
# - **With CUDA graphs, capture copies from buffers that live as long as the graph**, and write
#   new data into them in place.
#
# ## The post's claims
#
# Every claim of this chapter, evaluated against the measurements on this page:

# %%
ex.claims_table(chapter=3)
