# %% [markdown]
# # Cross-stream memory: the race, `record_stream`, and the event handoff
#
# Every trick that overlaps data movement with compute works the same way. FSDP2 gathers
# the next layer's parameters on a side stream. Activation offloading copies tensors on
# dedicated copy streams. A data loader prefetches batches. In each case a buffer is
# **written on one CUDA stream and read on another**. PyTorch's caching allocator
# tracks only one stream per block of memory, so the programmer decides when such a
# buffer can be given back. Get it wrong and the consumer reads data that a later
# producer has already written over: no error, no warning, just wrong numbers.
#
# This chapter follows Wei Feng's DevLog post
# [*Cross-stream memory management: wait_event instead of record_stream*](https://docs.pytorch.org/devlogs/eager/2026-09-29-cross-stream-memory-without-record-stream/).
# It reproduces the bug on purpose, fixes it three ways, and measures what each fix
# costs.
#
# **What you will learn**
#
# - why a buffer read on a second stream can be overwritten after `del`, and how to make
#   that race reproducible enough to count;
# - four ways to release such a buffer, and what each costs in correctness, memory and
#   overlap;
# - why the memory used by `record_stream` depends on how far the CPU runs ahead of the
#   GPU, and why `torch.cuda.max_memory_allocated()` does not show it;
# - the host stall that `record_stream` causes inside an ordinary allocation once memory
#   is tight;
# - how to write the event handoff, with a number of buffers in flight that you choose;
# - what FSDP2 and FSDP1 themselves do with these buffers, measured on their own code.

# %%
import experiments as ex
from experiments import streams

ex.status()

# %% [markdown]
# ## The one rule that matters here
#
# The caching allocator ([chapter 1](ch1_caching_allocator.ipynb)) keeps freed blocks
# and hands them out again without asking the driver. Each block remembers the stream
# that was current when it was allocated, and a freed block goes back to **that
# stream's** free list only. The next request of a fitting size on that stream gets it
# at once, even if the GPU has not yet run the kernels that used it.
#
# On a single stream this is safe, and it is the reason the allocator is fast. Kernels on
# one stream run in the order they were queued. Every kernel that touched the old tensor
# was queued before the `del`, and every kernel that will touch the new one is queued
# after it, so stream order keeps them apart. The argument says nothing about *other*
# streams. A read of the block queued on a second stream is invisible to the allocator.
# The header comment and `free`/`get_free_block` of
# [`c10/cuda/CUDACachingAllocator.cpp`](https://github.com/pytorch/pytorch/blob/main/c10/cuda/CUDACachingAllocator.cpp)
# state this rule directly.

# %% [markdown]
# ## A pipeline, and four ways to let go of a buffer
#
# The experiments use a toy version of FSDP2's forward pass on one GPU. For each layer
# *k* = 1, 2, …, a **producer** stream (standing in for the all-gather) allocates the
# layer's buffer and fills it with the value *k*. A **consumer** stream (the compute
# stream) waits for the fill, computes for a while, then reads the buffer. The host
# drops its Python reference as soon as the work is queued:
#
# ```python
# for k in range(1, layers + 1):
#     with torch.cuda.stream(producer):
#         gpu_sleep(producer_ms)                   # the collective takes time
#         buf = torch.empty(n, device="cuda")      # the block belongs to `producer`
#         buf.fill_(k)
#     consumer.wait_event(producer.record_event()) # do not read before the fill
#     with torch.cuda.stream(consumer):
#         gpu_sleep(consumer_ms)                   # the layer's compute
#         torch.sum(buf.view(-1, 1024), dim=1, out=out[k - 1])  # 1024·k per row if intact
#         done = consumer.record_event()
#     release(buf, done)                           # one of the four strategies
# ```
#
# The "compute" is a calibrated `torch.cuda._sleep` (see
# [How this book measures](measuring.ipynb)), so the race depends on milliseconds, not
# on how fast a particular GPU multiplies matrices. Each read writes its row sums into
# a preallocated output, so reading allocates nothing. Row sums are exact in fp32, and a
# later layer always writes a larger value, so a layer read the right data exactly when
# every row sums to 1024 · *k*.
#
# The four strategies differ only in `release`:
#
# unprotected
# : `del buf`. The block goes straight back to the producer's free list.
#
# stall
# : `done.synchronize(); del buf`. The host waits until the consumer has read the
#   buffer, then frees it. Always correct, but the host can no longer run ahead.
#
# `record_stream`
# : `buf.record_stream(consumer); del buf`. This tells the allocator that the consumer
#   stream used the block, so at `del` the allocator records an event on the consumer
#   and parks the block until that event has completed
#   ([docs](https://docs.pytorch.org/docs/stable/generated/torch.Tensor.record_stream.html)).
#
# event handoff
# : Keep `(buf, done)` in a queue. When the queue holds more than *N* buffers ("buffers
#   in flight"), take the oldest, enqueue `producer.wait_event(its_done)`, and only then
#   drop it. The producer stream, the only stream whose allocations can receive the
#   block, now waits for the consumer before it reuses it. With *N* = 1 the next
#   all-gather gets a second block and starts at once.
#
# ```{exercise} Predict the blocks
# :label: ex-streams-blocks
#
# Take 4 layers of 64 MiB, a producer that needs 0.5 ms per layer and a consumer that
# needs 2 ms per layer. The host queues a layer in a fraction of the time the GPU needs
# for it. How many **distinct memory blocks** (different `data_ptr()` values) does each
# strategy use in one run? The event handoff keeps *N* = 1 buffer in flight.
#
# Write your four numbers into the next cell *before* you run the measurement below.
# The check reads the measurement (or runs it on your GPU).
# ```

# %%
my_blocks = {"unprotected": None, "stall": None, "record_stream": None, "event": None}
streams.check_block_predictions(my_blocks)

# %% [markdown]
# ```{solution} ex-streams-blocks
# :class: dropdown
#
# Unprotected: **1**. Each freed block goes back to the producer's free list, and the
# next `torch.empty` on the producer takes it. One block serves every layer, which is
# the bug.
#
# Stall: **1**. The block is freed only after the consumer is done with it, and the next
# allocation reuses it safely.
#
# `record_stream`: **4**. A parked block comes back only when a *later allocation* polls
# its event and finds it complete. The first consumer cannot finish before 0.5 + 2 ms
# into the run, and the host has made all four allocations by then, so every layer gets
# a new block.
#
# Event handoff: **2**. The kept buffer plus the one being filled. The same two blocks
# alternate.
# ```

# %% [markdown]
# ## The race, measured
#
# Each strategy runs ten times, the strategies taking turns. For every run the figure
# counts whether any layer read the wrong values. It shows three peaks of the
# allocator's counters above the start of the run, read after the pipeline and before
# the correctness check (whose own temporaries would otherwise dominate). It also shows
# the GPU time, and how long the producer and consumer streams ran at the same time.

# %%
race = ex.run("streams.strategies")
streams.plot_strategies(race)

# %% [markdown]
# The same measurement as a table, with the value each layer's consumer read (layer *k*
# should read *k*):

# %%
streams.strategies_table(race)

# %% [markdown]
# Without protection, the first consumer is still computing when the producer has
# already filled later layers into *the same block*, so it reads a later layer's values.
# The post reports the same failure on an H100, in 50 of 50 trials. The three fixes
# read the right values every time, and they pay for it in different currencies:
#
# - the **stall** uses one block, but the producer can no longer prepare the next layer
#   while the consumer computes. Its overlap is zero, and its GPU span reaches the
#   dashed line, the time with no overlap at all (on the lab GPU a little beyond it: the
#   GPU also idles while the host wakes up from each wait). It loses the producer work
#   that the other strategies hide behind the consumer, all but the first layer's;
# - **`record_stream`** keeps the overlap but uses one block per layer. Look at its
#   bars: the *active* and *reserved* peaks hold every layer's buffer, while the
#   *allocated* peak shows just one;
# - the **event handoff** keeps the overlap with exactly two blocks.

# %%
stall, event = race["results"]["stall"], race["results"]["event"]
extra_ms = stall["span_ms"] - event["span_ms"]
hidden_ms = (race["layers"] - 1) * race.params["producer_ms"]
print(f"the stall needs {extra_ms:.1f} ms more GPU time than the event handoff;\n"
      f"the producer work that the others hide: {hidden_ms:g} ms")

# %% [markdown]
# The race depends on timing. Change the consumer's compute time and watch the first
# panel. In recorded mode the controls offer the points measured on the lab GPU; on
# your own GPU you can set any value and press *Run*.

# %%
ex.panel("streams.strategies", streams.plot_strategies, params=["consumer_ms", "layers"])

# %% [markdown]
# The unprotected strategy at the three recorded compute times (4 layers):

# %%
lines = []
for consumer_ms in (0.0, 0.5, 2.0):
    u = ex.run("streams.strategies", consumer_ms=consumer_ms)["results"]["unprotected"]
    bad, read = u["corrupted_trials"], ", ".join(f"{v:g}" for v in u["read_mean"])
    lines.append(f"consumer {consumer_ms:>3g} ms: {bad:2d} of {u['trials']} trials "
                 f"corrupted, layers read {read}")
print("\n".join(lines))

# %% [markdown]
# With no compute on the consumer, each read runs right after its fill, long before the
# producer's next fill 0.5 ms later, and every layer reads its own values. At 0.5 ms the
# consumer needs exactly as long as the producer, which looks like a coin toss. On the
# lab GPU the producer won every trial, and each layer but the last read the *next*
# layer's values. The likely reason: the producer starts its next step the moment the
# fill ends, on its own stream, while the consumer starts only once it has seen the
# fill's event, microseconds later. With 2 ms of compute the producer is far ahead, and
# the first layer reads the last one's values.
#
# The code is equally wrong at all three points; the timing alone decides whether it
# shows. That is why a passing test proves little. Public bug reports tell the same
# story: a stream race in TensorRT-LLM that went away under `CUDA_LAUNCH_BLOCKING=1`
# ([NVIDIA/TensorRT-LLM#15265](https://github.com/NVIDIA/TensorRT-LLM/pull/15265)), and
# one in SGLang that its report saw in 0 of 40 runs with the default allocator settings
# but in 19 of 20 with `expandable_segments:True`
# ([sgl-project/sglang#34076](https://github.com/sgl-project/sglang/pull/34076)).

# %% [markdown]
# ## Watching the streams
#
# CUDA events recorded around every step give each layer's interval on each stream,
# measured from one reference event. The host lane shows when the host queued each
# layer, and the triangles mark its `del`. Boxes are colored by the memory block
# their buffer received, so **the same color on both streams at the same time is the
# race**: the producer writes a block that the consumer is still reading.

# %%
streams.plot_timeline(ex.run("streams.timeline", strategy="unprotected"))

# %% [markdown]
# Every producer box has block A's color, and the producer fills layers 2, 3 and 4
# into it while the consumer's first box, also block A, is still running. Compare the
# event handoff: two colors alternate, and a producer box never starts before the
# consumer box of the same color has ended.

# %%
streams.plot_timeline(ex.run("streams.timeline", strategy="event"))

# %% [markdown]
# Switch between all four strategies:

# %%
ex.panel("streams.timeline", streams.plot_timeline, params=["strategy"])

# %% [markdown]
# - *stall*: the host lane grows long boxes, because the host sits in
#   `Event.synchronize()` each layer. The producer's work now comes after the
#   consumer's instead of beside it;
# - *record_stream*: every layer has its own color, with one block per layer, and
#   the streams overlap as in the event handoff.

# %% [markdown]
# (ch2-runahead)=

# %% [markdown]
# ## `record_stream` ties memory to CPU run-ahead
#
# What does `record_stream` do inside the allocator? It adds the consumer stream to the
# block's set of users. At `del`, the allocator records one event per user stream and
# keeps the block out of the free list. The block counts as *active* but no longer as
# *allocated*. Nothing frees it when the event completes. The allocator checks its
# pending events only **at the start of a later allocation**, and releases the blocks
# whose events have completed. So a block comes back only when both of these hold:
#
# 1. the GPU has passed the consumer's event, and
# 2. the host asks for memory after that.
#
# A healthy training loop keeps the host ahead of the GPU, so at each allocation most
# events are still pending and each layer gets a fresh block. How many blocks pile up
# depends on how far the host is ahead. That distance is the **run-ahead**: GPU time
# per layer minus host time per layer, summed over the layers.
#
# The experiment below runs 32 layers of 64 MiB and varies both sides. In the first panel,
# the GPU work per layer grows while the host does nothing else. In the second, the GPU
# work stays at 10 ms and the host spends a growing delay on each layer, as a slow
# data pipeline or a logging call would.
#
# ```{exercise} Predict record_stream's peak
# :label: ex-streams-peak
#
# 32 layers × 64 MiB, `record_stream`, 10 ms of GPU work per layer, and a host that
# spends 5 ms on each layer. What is the peak of active memory above the start, in MiB?
# Reason about how many consumers have finished when the host allocates the last
# buffer. Then run the next cells.
# ```

# %%
my_peak_mib = None
streams.check_peak_prediction(my_peak_mib)

# %% [markdown]
# ```{solution} ex-streams-peak
# :class: dropdown
#
# The host allocates a layer every 5 ms. The GPU finishes a layer every 10 ms. When
# the host allocates layer *i*, about *i*/2 consumers have finished, and their blocks
# are reused. The other *i*/2 are parked. At the last layer that is about 16 blocks,
# **≈ 1024 MiB**: half of what the host running freely costs (2048 MiB), and eight times
# the event handoff's 128 MiB.
# ```

# %%
sweep = ex.run("streams.runahead")
streams.plot_runahead(sweep)

# %%
streams.runahead_table(sweep)

# %% [markdown]
# With `record_stream`, blocks pile up as soon as the GPU needs longer per layer than
# the host. A quarter of a millisecond of GPU work per layer already parks a large
# share of the layers, because the host queues a layer in less time than that; with
# 10 ms per layer every layer's buffer is parked. In the second panel the peak falls back as
# the host slows down. Once the host spends longer per layer than the GPU (20 ms against
# 10), every event has completed by the next allocation and one block is reused. There
# `record_stream` even needs less memory than the event handoff, whose second buffer
# pays for an overlap that a loop held back by its host cannot use. **The program is
# the same at every point. Only the relative speed of CPU and GPU changes.** The event
# handoff's line stays flat at two buffers everywhere, because its memory is set by the
# code, not by a race between the host and the GPU.
#
# Measuring the same thing in a real job is hard: CPU speed, logging, a data loader
# thread, or removing a hidden synchronization ([chapter 4](ch4_hidden_syncs.ipynb)) all
# change the run-ahead, and with it `record_stream`'s peak. The post points out that
# FSDP1 frees its gathered parameters with `record_stream`, and therefore needs
# `limit_all_gathers=True`: a host-side throttle that blocks the CPU so that the
# gathered parameters of at most two FSDP units exist at once.
#
# Explore a single run. Choose the strategy, the GPU work per layer and the host delay; on
# your own GPU you can also change the number of layers, the buffer size and the buffers
# kept in flight (the recording has the chapter's 32 layers of 64 MiB):

# %% memlab={"reveals": "ex-streams-allocated", "points": [{"strategy": "record_stream", "consumer_ms": 10.0, "host_delay_ms": 0.0}]}
ex.panel("streams.pipeline", streams.plot_pipeline,
         params=["strategy", "consumer_ms", "host_delay_ms", "layers", "buffer_mib", "in_flight"])

# %% [markdown]
# ## What `max_memory_allocated()` does not see
#
# `torch.cuda.max_memory_allocated()` is the number most people look at, and it misses
# all of this. The allocator lowers its *allocated* counter at `del`, even when the block
# goes to the event queue instead of the free list. The block stays in the *active*
# counter until it is really free, and the memory behind it stays *reserved*. Read
# `torch.cuda.memory_stats()["active_bytes.all.peak"]` or the reserved peak instead. In a
# memory snapshot, such blocks have the state `active_pending_free`.
#
# ```{exercise} The number max_memory_allocated() reports
# :label: ex-streams-allocated
#
# At the largest run-ahead (10 ms of GPU work per layer, no host delay), `record_stream`
# parked a block for every layer. What does `max_memory_allocated()` report for that run,
# in MiB above the start?
# ```

# %%
my_allocated_mib = None
streams.check_allocated_peak(my_allocated_mib)

# %% [markdown]
# ```{solution} ex-streams-allocated
# :class: dropdown
#
# About **one buffer (64 MiB)**. Each buffer leaves the allocated counter at its `del`,
# before the next one is allocated, so only one is ever counted. The active and reserved
# peaks show all 32.
# ```

# %% tags=["hide-output"] memlab={"reveals": "ex-streams-allocated"}
streams.plot_counters(sweep)

# %% [markdown]
# ## Under a memory cap: a stall hidden in an allocation
#
# Parked blocks cannot be reused, so `record_stream` exhausts the cache sooner. What
# happens then? The next experiment runs 48 layers of 64 MiB in a fresh process whose
# allocator is capped at 1 GiB (`torch.cuda.set_per_process_memory_fraction`). It times
# every `torch.empty` on the host and reads the allocator's retry counter,
# `num_alloc_retries`.

# %%
capped = ex.run("streams.memory_cap")
streams.plot_memory_cap(capped)

# %%
streams.memory_cap_table(capped)

# %% [markdown]
# ```{exercise} Where does the stall come from?
# :label: ex-streams-cap
#
# With `record_stream`, a few allocations block the host for tens of milliseconds.
# With the event handoff under the same cap, none does. Which explanation fits?
#
# - **a** `cudaMalloc` is slow for 64 MiB.
# - **b** Before retrying, the allocator waits for every outstanding `record_stream`
#   event, so the host waits until the GPU catches up.
# - **c** Python's garbage collector runs.
# - **d** The driver pages device memory out to the host.
# ```

# %%
streams.check_cap_stall(None)  # replace None with "a", "b", "c" or "d"

# %% [markdown]
# ```{solution} ex-streams-cap
# :class: dropdown
#
# **b**. When nothing cached fits and the cap forbids a new `cudaMalloc`, the allocator
# frees its whole cache and tries once more. To free parked blocks it must first
# wait (`cudaEventSynchronize`) on every pending event. The host therefore waits for the
# GPU to finish all queued consumer work, inside what looks like an ordinary
# `torch.empty`. `num_alloc_retries` counts these episodes. A profiler shows them as a
# long gap on the CPU thread with no synchronizing call in your code.
#
# The estimate printed above the exercise fits this explanation: each stall lasts about
# as long as the consumer work queued behind the blocks that fill the cap. The GPU span
# hardly changes, because the GPU had that work to do anyway. The host is what loses
# the time: in a real loop it would have been preparing the next step.
# ```

# %% [markdown]
# (ch2-handoff)=

# %% [markdown]
# ## Writing the event handoff
#
# The post's recipe, in our words:
#
# 1. **Find the allocation stream.** Only later allocations on that stream can receive
#    the block, so it is the only stream that needs a dependency.
# 2. After the consumer's last use, **record an event on the consumer** stream.
# 3. **Keep a Python reference** for as long as the producer should stay ahead.
# 4. **Enqueue `allocation_stream.wait_event(event)` first, drop the reference second.**
#    In the other order, any allocation in between (a hook, another module) could
#    receive the block with nothing ordering it after the consumer.
# 5. **Choose the number of buffers in flight**: 0 serializes the streams, 1 is double
#    buffering, *N* is a queue. Memory is then (*N* + 1) buffers, by construction.
#
# With *N* = 1 the loop is short:
#
# ```python
# kept = None                               # (buffer, event) of the previous layer
# for layer in range(layers):
#     buf = all_gather(layer)               # gets a new block: the old one is still held
#     done = forward(buf, layer)            # an event recorded on the consumer after the read
#     if kept is not None:
#         producer.wait_event(kept[1])      # the wait goes in first ...
#     kept = (buf, done)                    # ... then the older buffer is dropped
# ```
#
# Set the number of buffers in flight and compare the blocks and peaks:

# %%
ex.panel("streams.pipeline", streams.plot_pipeline, params=["in_flight"], strategy="event")

# %% [markdown]
# ```{exercise} Write the handoff
# :label: ex-streams-handoff
#
# Complete `my_handoff` below. For every layer it must call `buf = all_gather(layer)`,
# which allocates and fills the buffer on `producer`, and `done = forward(buf, layer)`,
# where the consumer reads it and `done` is an event recorded after the read. Release
# each buffer safely **without** `record_stream`.
#
# The check runs your loop on your GPU (8 layers of 64 MiB, a producer that needs 1.5 ms
# per layer, a consumer that needs 2 ms). It passes when no trial reads a wrong value,
# at most two buffers exist at once, and the GPU time is within 1.3× of a reference
# loop. The last condition rules out a stall. On a machine without a GPU the check says
# that it cannot run.
# ```

# %%
def my_handoff(all_gather, forward, layers, producer, consumer):
    for layer in range(layers):
        buf = all_gather(layer)
        done = forward(buf, layer)
        # your code: keep `buf` and `done`, make `producer` wait on an event, then release
        del buf


streams.check_event_handoff(None)  # replace None with my_handoff

# %% [markdown]
# ````{solution} ex-streams-handoff
# :class: dropdown
#
# Keep the previous layer's pair alive for one more layer, and make the producer wait
# on its event before dropping it:
#
# ```python
# def my_handoff(all_gather, forward, layers, producer, consumer):
#     kept = None
#     for layer in range(layers):
#         buf = all_gather(layer)
#         done = forward(buf, layer)
#         if kept is not None:
#             producer.wait_event(kept[1])
#         kept = (buf, done)
#         del buf
#     if kept is not None:
#         producer.wait_event(kept[1])
# ```
#
# Two answers that pass correctness but fail the check: `producer.wait_event(done)` and
# then `del buf` in the same layer (one block, but each all-gather waits for the
# previous layer's consumer, so the streams no longer overlap), and
# `done.synchronize()` before `del buf` (the same stall, on the host).
# ````

# %% [markdown]
# ````{exercise} Which stream waits?
# :label: ex-streams-alloc-stream
#
# ```python
# with torch.cuda.stream(copy_in):
#     flat = torch.empty(n, device="cuda")
#     flat.copy_(pinned_shards, non_blocking=True)
# compute.wait_stream(copy_in)
# offload.wait_stream(copy_in)
# with torch.cuda.stream(compute):
#     y = layer(flat)                                  # reads flat
# with torch.cuda.stream(offload):
#     host_copy.copy_(flat, non_blocking=True)         # reads flat too
# ```
#
# Before the last reference to `flat` is dropped, which stream(s) must `wait_event`?
#
# - **a** `compute`
# - **b** `offload`
# - **c** only `copy_in`, on an event from each reader
# - **d** all three
# ````

# %%
streams.check_allocation_stream(None)  # replace None with "a", "b", "c" or "d"

# %% [markdown]
# ```{solution} ex-streams-alloc-stream
# :class: dropdown
#
# **c**. `flat` was allocated on `copy_in`, so only later `copy_in` allocations can
# receive its block. `copy_in` must wait on an event recorded on `compute` after
# `layer(flat)` and on one recorded on `offload` after the copy, or on a single event
# if the two readers are already ordered. Waits on the other streams order work
# that can never receive the block, and only cost overlap.
# ```

# %% [markdown]
# (ch2-fsdp)=

# %% [markdown]
# ## FSDP's own code on one GPU
#
# Until now the producer and the consumer were loops of our own. The post is about FSDP,
# so this section trains a model with FSDP itself: FSDP2's
# [`fully_shard`](https://docs.pytorch.org/docs/stable/distributed.fsdp.fully_shard.html)
# with a `MixedPrecisionPolicy`, and FSDP1's `FullyShardedDataParallel` with `MixedPrecision`,
# once with `limit_all_gathers=True` (its default) and once with `False`. The model is a stack
# of 16 linear layers with 64 MiB of fp32 weights each, one FSDP unit per layer, computing in
# bf16 (fp16 on a GPU without bf16, such as a T4). Each layer's time is set as in
# {ref}`ch2-runahead`: a calibrated GPU delay per layer, in forward and again in backward, and a
# host delay per layer. FSDP runs in a fresh process, never in your kernel, and the streams in
# the figures are named after FSDP's own stream objects.
#
# **What runs here, and what does not.** There is one GPU, and two process groups:
#
# - **NCCL with one rank** (`init_process_group("nccl", world_size=1, rank=0)`). One GPU, world
#   size 1: FSDP's own streams, events and allocator calls; no network.
# - **torch's fake process group with two ranks** (`torch.testing._internal.distributed.fake_pg`,
#   a testing tool of PyTorch). FSDP shards every parameter in two and runs its whole all-gather
#   path, streams and events included, but the collective itself does nothing: half of every
#   gathered buffer is never written. The values are garbage; the memory is real.
#
# A run on several GPUs adds what neither group can show: the time the all-gathers and
# reduce-scatters take on the network, and how much of it FSDP overlaps with compute. That has
# not been run for this book. Where a process group cannot start (a machine without NCCL), the
# section says so in one line and shows the lab GPU's recording instead.
#
# ```{exercise} What limit_all_gathers bounds
# :label: ex-streams-fsdp-limit
#
# FSDP1 frees each layer's gathered parameters with `record_stream`, and `limit_all_gathers=True`
# makes the CPU wait when too many freed ones are still pending. With NCCL and **one rank**,
# FSDP1 warns that it switches to `NO_SHARD`. What does `limit_all_gathers=True` do there to
# FSDP1's peak memory as the CPU runs further ahead?
#
# - **a** It keeps the peak at about two layers' parameters: the rate limiter blocks the CPU.
# - **b** Nothing. `NO_SHARD` frees no gathered parameters, so the limiter never waits, while
#   `record_stream` still parks each layer's low-precision copy.
# - **c** It lowers the peak, but only with fp32 parameters.
# - **d** It raises the peak: the limiter keeps two extra buffers.
# ```

# %%
streams.check_fsdp_limit(None)  # replace None with "a", "b", "c" or "d"

# %% [markdown]
# ```{solution} ex-streams-fsdp-limit
# :class: dropdown
#
# **b**. FSDP1's rate limiter waits on events that it records when it frees an all-gathered
# parameter (`_reshard` in `torch/distributed/fsdp/_runtime_utils.py`). With one rank FSDP1
# runs `NO_SHARD` and frees none, so the limiter has nothing to wait on. FSDP1 still crosses
# streams, though: with `MixedPrecision` it casts each layer's parameters on its pre-unshard
# stream, the compute stream reads the copy, and FSDP1 frees it with `record_stream`. The
# first table below shows FSDP1's two settings side by side.
# ```

# %% [markdown]
# The run-ahead sweep with NCCL and one rank: one training step per point, two runs per point
# (medians). Each of the four middle columns gives the peak of active memory above the step's
# start, at one setting of GPU work / host delay per layer.

# %% memlab={"reveals": "ex-streams-fsdp-limit"}
ws1 = streams.fsdp_run("streams.fsdp_runahead")
streams.fsdp_runahead_table(ws1)

# %% [markdown]
# With one rank neither FSDP gathers anything: the collectives column counts no all-gather.
# FSDP2 copies each layer's parameters on the compute stream
# ([pytorch/pytorch#160135](https://github.com/pytorch/pytorch/pull/160135), in torch 2.9 and
# later). Its only side stream is the reduce-scatter stream, which here just copies the
# gradients. FSDP1 runs `NO_SHARD` and issues one all-reduce per layer. Its low-precision
# copies still cross streams, and they are freed with `record_stream`.

# %%
streams.plot_fsdp_runahead(ws1)

# %% [markdown]
# FSDP2's line is flat, and no free waits on an event. FSDP1's peak follows the run-ahead, as
# the chapter's own `record_stream` program does on buffers of the same size: at 10 ms of GPU
# work per layer and no host delay, most of the low-precision copies it makes in forward and
# backward are parked at once. `limit_all_gathers` makes no difference beyond run-to-run noise,
# for the reason in the exercise above.

# %% [markdown]
# ### The all-gather path, with two ranks
#
# The fake process group lets FSDP shard for two ranks on this one GPU. Now FSDP2 all-gathers
# each layer into a buffer made on its all-gather copy-in stream, and FSDP1 gathers into a
# buffer made on its unshard stream.

# %%
ws2 = streams.fsdp_run("streams.fsdp_runahead", group="fake")
streams.plot_fsdp_runahead(ws2)

# %%
streams.fsdp_runahead_table(ws2)

# %% [markdown]
# This is the post's comparison, on FSDP's own code:
#
# - **FSDP2** holds the same few all-gather buffers at every run-ahead, and nothing is parked.
#   Before a layer's gathered buffer is dropped, the copy-in stream, where the buffer was
#   allocated, waits on the event that FSDP2 recorded after the compute stream copied the
#   parameters out. That is this chapter's event handoff.
# - **FSDP1 without the limit** parks the gathered parameters of almost every layer once the
#   CPU runs ahead: `record_stream`, with nothing to hold the CPU back.
# - **FSDP1 with the limit** stays close to its smallest peak. The price is in the table's last
#   column: at the largest run-ahead its host needs about as long per step as the GPU, because
#   the rate limiter makes the CPU wait for the GPU.
#
# ### Both streams, from the memory snapshot
#
# Each run keeps the allocator's memory trace (`torch.cuda.memory._record_memory_history`).
# Below, one panel per stream shows the bytes of that stream's blocks over the training step,
# against the host time of each allocator call. The red part is parked: freed by Python,
# waiting for `record_stream`'s events to be seen complete. First FSDP2, then FSDP1 without
# the limit, both with two ranks, 10 ms of GPU work per layer and no host delay:

# %%
fsdp2_step = streams.fsdp_run("streams.fsdp_step", group="fake")
streams.plot_fsdp_step(fsdp2_step)

# %%
fsdp1_step = streams.fsdp_run("streams.fsdp_step", group="fake", version="fsdp1_nolimit")
streams.plot_fsdp_step(fsdp1_step)

# %% [markdown]
# The host finishes enqueueing the forward pass long before the GPU does. FSDP2's copy-in
# stream never holds more than a few buffers. FSDP1's unshard stream piles up one buffer per
# layer. They stay parked until a later allocation finds their events complete, and once the
# host has enqueued the step no allocation comes: the blocks stay parked while the GPU works
# through the whole step, and after it. The trace behind each
# figure says it entry by entry: every free is a `free_requested` entry, and a free that
# `record_stream` deferred gets its `free_completed` entry only later.
#
# The allocator doctor ([chapter 1](ch1_caching_allocator.ipynb)) replays such a snapshot
# request by request: the model's construction, two warm-up steps, then the measured step
# (shaded). The lines are the doctor's reserved and allocated bytes. The markers are the
# GPU's own counters, read at three marks while the program ran, and the dotted lines are
# the GPU's peak counters:

# %%
from experiments import doctor

replays = [(step, doctor.replay(doctor.read(step["snapshot"]))) for step in (fsdp2_step, fsdp1_step)]
streams.plot_fsdp_replay(replays)

# %% [markdown]
# Both replays match the trace event by event, deferred frees included: the lines meet
# every marker and reach the dotted peaks. To the byte, at each mark and at the peaks:

# %%
streams.fsdp_replay_table(replays)

# %% [markdown]
# Try other settings: the version, the process group, the GPU work and host delay per layer,
# and `reshard_after_forward` (for FSDP1: `FULL_SHARD`, or `SHARD_GRAD_OP` when off). On your
# own GPU you can also change the number of layers and their size. The recording has the
# section's 16 layers of 64 MiB.

# %%
ex.panel("streams.fsdp_step", streams.plot_fsdp_step,
         params=["version", "group", "gpu_ms", "host_delay_ms", "reshard_after_forward", "layers", "layer_mib"],
         mode=streams.fsdp_mode())

# %% [markdown]
# ## In your own code
#
# - **Find the buffers that cross streams.** Look for any tensor created under
#   `torch.cuda.stream(side)` and used outside it, or the other way round: side-stream
#   copies, prefetchers, offloading hooks, hand-written overlap of communication and
#   compute. The [CUDA stream sanitizer](https://docs.pytorch.org/docs/stable/cuda._sanitizer.html)
#   (`TORCH_CUDA_SANITIZER=1`) reports unsynchronized accesses across streams.
# - **Measure the right counter.** Compare `memory_stats()["active_bytes.all.peak"]`
#   with `max_memory_allocated()`. A large gap means blocks parked on events. The
#   helpers of this book do it for you:
#
#   ```python
#   from experiments.core.measure import track_memory
#   with track_memory() as mem:
#       train_step()
#   print(mem.delta.mib())   # allocated, active and reserved peaks in MiB
#   ```
#
# - **Prefer the event handoff on hot paths.** FSDP2
#   ([`fully_shard`](https://docs.pytorch.org/docs/stable/distributed.fsdp.fully_shard.html))
#   never calls `record_stream` on CUDA. It keeps each all-gather result with an event
#   and makes the copy-in and all-gather streams wait before reuse ({ref}`ch2-fsdp`). For the
#   reduce-scatter inputs of the backward pass, the post describes an experimental
#   `set_reduce_scatter_max_input_buffers` that sets the number in flight. In your own
#   loops, follow the recipe of {ref}`ch2-handoff`.
# - **Check what your libraries do.** Collectives in `torch.distributed` used to call
#   `record_stream` on their tensors, and with FSDP2 that showed up as memory stacking
#   up ([pytorch/pytorch#147168](https://github.com/pytorch/pytorch/issues/147168)):
#   the pattern of {ref}`ch2-runahead`. The workaround in that issue,
#   `TORCH_NCCL_AVOID_RECORD_STREAMS=1`, makes ProcessGroupNCCL keep references instead.
#   Newer releases do so by default and warn that the variable is deprecated
#   ([pytorch/torchtitan#1088](https://github.com/pytorch/torchtitan/pull/1088)).
# - **`record_stream` still has uses.** It fits a rare handoff off the hot path, and a
#   library that returns side-stream tensors to callers who should not have to think
#   about streams. There, unpredictable reuse is an acceptable price.

# %% [markdown]
# ## Claims checked in this chapter
#
# Each row applies the claim's test to the measurement named in it: recorded on the
# lab GPU, or live on yours.

# %%
ex.claims_table(chapter=2)
