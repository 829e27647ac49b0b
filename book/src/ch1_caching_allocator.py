# %% [markdown]
# # The caching allocator and fragmentation
#
# Asking the CUDA driver for memory is slow, and giving it back with `cudaFree` waits for
# the whole device to go idle. PyTorch therefore almost never does either in the middle
# of a program. Its **caching allocator** takes memory from the driver in large pieces,
# cuts them up for tensors, and keeps what tensors give back for the next request. That
# makes allocation nearly free, and it also explains two of the most confusing numbers in
# GPU programming: the gap between the memory your tensors use and the memory PyTorch
# holds, and the out-of-memory error that arrives while gigabytes are "reserved but
# unallocated".
#
# This chapter follows Edward Yang's DevLog post
# [*When does fragmentation occur in the CUDA caching allocator?*](https://docs.pytorch.org/devlogs/eager/2026-06-01-cuda-caching-allocator/)
# and measures each of its claims on a GPU.
#
# **What you will learn**
#
# - how a tensor request becomes a *block* inside a *segment*, and which of the two
#   *pools* it comes from;
# - why reserved memory stays high after tensors are freed, and what `empty_cache()`
#   can and cannot give back;
# - how memory that is free can still be useless: an out-of-memory error with the free
#   space in plain sight, and how to read its message;
# - what expandable segments change, where they help (CUDA graphs sharing one memory
#   pool) and where they do not (live tensors between free ones, the 1 MiB line);
# - what `max_split_size_mb`, `roundup_power2_divisions` and
#   `garbage_collection_threshold` do, and how to look at your own program's memory.
#
# Every experiment runs live on your GPU when there is one, and shows the result
# recorded on the lab GPU otherwise. Each also carries the prediction of a small Python
# model of the allocator's rules (`experiments.allocator.model`), so you can test your
# understanding without a GPU.

# %%
import experiments as ex
from experiments import allocator as al

ex.status()

# %% [markdown]
# (ch1-blocks)=
# ## Blocks, segments and pools
#
# The allocator works on two levels. A **segment** is one piece of memory obtained from
# the driver: one `cudaMalloc`. A **block** is a contiguous piece of a segment; every
# tensor's storage is one block. When a request comes in, the allocator
#
# 1. **rounds** the size up to a multiple of 512 bytes;
# 2. picks a **pool**: requests of at most 1 MiB use the *small* pool, larger ones the
#    *large* pool, and the two never lend each other memory;
# 3. looks for the **smallest free block** in that pool (of the same CUDA stream) that is
#    big enough;
# 4. if there is none, makes a **new segment**: 2 MiB in the small pool, 20 MiB for
#    requests between 1 and 10 MiB, and for anything larger the request itself rounded up
#    to a multiple of 2 MiB (sizes are compared after the rounding of step 1, so a request
#    of 10 MiB − 1 B already counts as 10 MiB);
# 5. **splits** the block it found: the front serves the tensor, the rest stays free for
#    later. In the large pool the rest is split off only when it is more than 1 MiB;
#    otherwise the tensor simply gets the whole block.
#
# When a tensor dies its block is free again and **merges** with free neighbours in the
# same segment. Blocks in different segments never merge, even when the segments happen to
# sit next to each other in memory: each `cudaMalloc` result is its own allocation.
# The rules are in the CUDA semantics notes,
# [Memory management](https://docs.pytorch.org/docs/stable/notes/cuda.html#memory-management),
# and in the source, `c10/cuda/CUDACachingAllocator.cpp`.
#
# **Predict before you run.** What block and what segment does an 11 MiB tensor get? A
# 1000-byte one? One of 10 MiB + 1 byte?
#
# The next experiment allocates one tensor at a time into an empty private memory pool
# (`torch.cuda.MemPool`, so nothing else in the process gets in the way) and reads the
# layout from `torch.cuda.memory._snapshot()`.

# %%
table = ex.run("alloc.request_table")
al.request_table_html(table)

# %%
al.plot_request_table(table)

# %% [markdown]
# Read the table from the top. Anything up to 512 bytes costs 512 bytes, and every small
# request shares a 2 MiB segment with its neighbours. At 1 MiB + 1 byte the request moves
# to the large pool and the first segment jumps to 20 MiB; the almost 19 MiB behind it
# stays free for the next tensors of that size class. From 10 MiB up a tensor gets a segment of its
# own, and here the split rule shows: 11 MiB needs a 12 MiB segment, and the 1 MiB left
# over is too small to split off, so the tensor's block *is* 12 MiB. Up to 1 MiB per
# large tensor can be lost this way; PyTorch counts it as allocated.
#
# The right-hand column compares each row with `al.request_anatomy(n)`, the model's
# answer. You can ask the model directly:

# %%
al.request_anatomy(11 * al.MiB)

# %% [markdown]
# ### Several tensors at once
#
# The figure below is a **segment map**: one bar per segment, blocks in address order,
# allocated blocks dark and free ones light. Three 5 MiB tensors share one 20 MiB segment
# and leave 5 MiB free at its end.

# %%
al.plot_anatomy(ex.run("alloc.anatomy", size_bytes=5242880.0, count=3))

# %% [markdown]
# Choose other sizes and counts. Three 100 KiB tensors sit side by side in one 2 MiB
# segment. Three tensors of 100 MiB + 3 bytes get a 102 MiB segment each, with just under
# 2 MiB split off the end of each. Three 11 MiB tensors get three 12 MiB segments with
# nothing split off.

# %%
ex.panel("alloc.anatomy", al.plot_anatomy)

# %% [markdown]
# (ch1-reserved)=
# ## Allocated versus reserved
#
# `torch.cuda.memory_allocated()` counts the blocks that tensors own.
# `torch.cuda.memory_reserved()` counts every segment the allocator holds, used or not;
# it is the memory no other process can have, and the number that decides whether the
# next `cudaMalloc` fits. Freeing a tensor lowers the first number at once and leaves the
# second alone. Short of an out-of-memory error ({ref}`ch1-oom`), only
# `torch.cuda.empty_cache()` returns segments to the driver, and only segments that are
# **entirely free**.
#
# The post's experiment on allocation order uses the same tensors in two orders: eight 16 MiB tensors,
# all freed, then four 32 MiB tensors; and the reverse. **Predict** the reserved memory at
# the end of each before you look. (Hint: a 16 MiB request is at least 10 MiB, so its
# segment is exactly 16 MiB.)

# %%
timeline = ex.run("alloc.timeline")
al.plot_timeline(timeline)

# %% [markdown]
# With the small tensors first, each 16 MiB tensor gets its own 16 MiB segment. Once they
# are freed, eight free 16 MiB blocks sit in eight separate segments. None of them can
# hold 32 MiB, and they cannot merge across segment boundaries, so each 32 MiB tensor
# needs a new segment: the post counts 256 MiB reserved for at most 128 MiB of tensors,
# and the titles above show what the GPU reserved. With the large tensors first, the
# freed 32 MiB segments are simply split in two by the 16 MiB requests and nothing new is
# reserved. The final `empty_cache()` brings both back to zero because by then every
# segment is entirely free. The dotted line is the model, step by step.
#
# The explorer of this experiment comes after the next exercise's check cell: one of its
# settings is the exercise's answer.

# %% [markdown]
# ```{exercise} Predict, then run: 8 MiB and 16 MiB tensors
# :label: ex-alloc-predict-timeline
#
# Repeat the experiment with `small_mib=8`: eight 8 MiB tensors and four 16 MiB ones,
# default settings. Predict the reserved memory in MiB at the end of the second
# allocation phase, once with the 8 MiB tensors first and once with the 16 MiB tensors
# first. Put your two numbers in the check below. The explorer after it offers
# `small_mib=8` (8 MiB and 16 MiB tensors) and `expandable` (expandable segments,
# {ref}`ch1-expandable`); its `small_mib=8` figures show once you have opened the answer
# or the solution below.
# ```

# %%
al.check_timeline_prediction(None, None)  # (small first, large first), in MiB

# %% memlab={"reveals": "ex-alloc-predict-timeline", "points": [{"small_mib": 8}]}
ex.panel("alloc.timeline", al.plot_timeline)

# %% tags=["hide-output"] mystnb={"code_prompt_show": "Show the answer", "code_prompt_hide": "Hide the answer"} memlab={"reveals": "ex-alloc-predict-timeline"}
al.plot_timeline(ex.run("alloc.timeline", small_mib=8))

# %% [markdown]
# ```{solution} ex-alloc-predict-timeline
# :class: dropdown
#
# **80 MiB and 64 MiB.** An 8 MiB request is between 1 and 10 MiB, so a new segment for
# it is 20 MiB, and two 8 MiB tensors fit in one (the 12 MiB tail after the first is
# split off and serves the second; the last 4 MiB stay free). Eight tensors need four
# segments: 80 MiB. When they are freed, each 20 MiB segment merges back into one free
# block, and a 16 MiB tensor fits in it (the 4 MiB tail is split off), so the second
# phase reserves nothing new.
#
# With the 16 MiB tensors first, each gets an exact 16 MiB segment: 64 MiB. After the
# free, each 8 MiB request splits one of them in two, and all eight fit. This time the
# large-first order wins by less, because the small tensors' 20 MiB segments were roomy
# enough for the large ones.
# ```

# %% [markdown]
# (ch1-oom)=
# ## From fragmentation to out-of-memory
#
# When no free block fits and a new segment would exceed what the process may use, the
# allocator does not give up at once. It first returns every *entirely free* segment to
# the driver and tries again. Only if that fails does it raise `torch.OutOfMemoryError`.
# So an out-of-memory error with plenty of "reserved but unallocated" memory means one
# thing: the free memory sits in segments that still hold at least one live tensor, and
# no single free block is big enough.
#
# To make this happen on any GPU, the experiment runs in a fresh process whose allocator
# is capped at 384 MiB (`torch.cuda.set_per_process_memory_fraction`). A first phase
# allocates and frees eleven 32 MiB tensors, leaving eleven cached 32 MiB segments. Three
# patterns then use that memory, and each ends with a request for 64 MiB:
#
# shrink
# : eleven 24 MiB tensors that stay alive. Each takes a cached 32 MiB segment and leaves
#   an 8 MiB tail.
#
# interleave
# : twenty-two 16 MiB tensors allocated in pairs, one long-lived and one temporary; then
#   the temporaries are freed.
#
# grouped
# : the same twenty-two tensors, but all the long-lived ones first and the temporaries
#   after them; then the temporaries are freed.
#
# **Predict** which of the three requests fit under the cap.

# %%
oom = ex.run("alloc.fragmentation_oom")
al.oom_table(oom)

# %%
al.plot_fragmentation_oom(oom, pattern="interleave")

# %% [markdown]
# In *interleave*, every segment holds one live 16 MiB tensor and one free 16 MiB block.
# Half the reserved memory is free, far more than 64 MiB, but the largest free block is
# 16 MiB, no segment is entirely free, and the cap leaves no room for a new 64 MiB
# segment. *Grouped* allocates exactly the same tensors: the long-lived ones pack into
# their own segments, the temporaries fill the others, and once the temporaries are gone
# those segments are entirely free. The allocator releases them, retries, and the
# request fits. *Shrink* fails for the same reason as *interleave*: each 8 MiB tail is
# stuck in a segment with a live tensor.
#
# The cap decides when fragmentation turns into an error. In the panel below, change
# `cap_mib` and predict each outcome before you look. At 336 MiB even the first phase
# (eleven 32 MiB segments, 352 MiB) does not fit: the eleventh tensor fails in every
# pattern with nothing reserved but unallocated, a plain out-of-memory error rather than
# fragmentation. At 512 MiB every request fits: the fragmented segments stay, and with
# default settings the allocator simply adds a 64 MiB segment next to them, so reserved
# memory ends at 416 MiB in all three patterns (the black marks), even in *grouped*,
# which under 384 MiB had to release its free segments. Switch `expandable` on too: only
# at 384 MiB does the setting change whether a request fits.

# %%
ex.panel("alloc.fragmentation_oom", al.plot_fragmentation_oom, params=["cap_mib", "expandable"])

# %% [markdown]
# Here is the message PyTorch raised for *interleave*, and the figures in it:

# %%
print(al.oom_message(oom, "interleave"))
al.oom_figures_table(oom, "interleave")

# %% [markdown]
# Two details are worth knowing when you read such a message from your own program.
# "Tried to allocate" is the size of the **segment** the allocator asked for, not the
# size of your tensor: for a 3 MiB tensor it says 20 MiB (`CUDACachingAllocator.cpp`
# prints the allocation size). And "reserved by PyTorch but unallocated" is measured
# *after* the allocator already released every entirely free segment, so all of it is
# trapped in segments with live tensors. The driver also lists the other processes on the
# GPU: in the lab's run, the recording process itself.
# `al.parse_oom_message(str(err))` turns any such message into numbers.
#
# ```{exercise} Read the out-of-memory error
# :label: ex-alloc-oom-reading
#
# From the message above: how many MiB were reserved by PyTorch but unallocated when the
# 64 MiB request failed? And which change makes the *interleave* request succeed? Choose
# a key of `al.OOM_FIXES`: `"expandable_segments"`, `"empty_cache"`, `"group"` or
# `"max_split_size_mb:64"`.
# ```

# %%
for key, fix in al.OOM_FIXES.items():
    print(f"{key!r}: {fix}")
al.check_oom_reading(None, None)  # (MiB, key of al.OOM_FIXES)

# %% [markdown]
# ```{solution} ex-alloc-oom-reading
# :class: dropdown
#
# The message's last figure: eleven free 16 MiB blocks, each next to a live tensor, make
# **176 MiB**, and that is the figure in the message. The fix is **`"group"`**: allocate
# the long-lived tensors together, so that the temporaries fill whole segments that can
# be released (the *grouped* row of the table). `empty_cache()` cannot help, because the
# allocator already released every entirely free segment before raising.
# `max_split_size_mb:64` only protects cached blocks of 64 MiB or more from being split.
# And expandable segments do not help either: {ref}`ch1-limits` shows the same request
# failing with them, because every free block still lies between two live ones.
# ```
#
# ```{exercise} A fragmentation index
# :label: ex-alloc-frag-index
#
# Write `frag_index(segments)`: one minus the size of the largest free block divided by
# the total free bytes, over all segments (0 when nothing is free). `segments` is a list
# like `oom["patterns"]["interleave"]["segments_after"]`: each segment has a `"blocks"`
# list, each block a `"size"` in bytes and a `"state"`; free blocks have the state
# `"inactive"`. A value near 1 says that the free memory is scattered in small pieces.
# ```

# %%
def frag_index(segments):
    return None  # your code here


al.check_frag_index(None)  # replace None with frag_index

# %% [markdown]
# :::{solution} ex-alloc-frag-index
# :class: dropdown
#
# ```python
# def frag_index(segments):
#     free = [b["size"] for s in segments for b in s["blocks"] if b["state"] == "inactive"]
#     return 0.0 if not free else 1 - max(free) / sum(free)
# ```
#
# For the *interleave* layout this gives 1 − 16/176 ≈ 0.91: plenty of free memory, none
# of it in one piece. Blocks in the state `"active_pending_free"` (freed by Python but
# still awaited by another stream, chapter 2) are not free yet and do not count.
# `al.fragmentation_index` is the book's version.
# :::

# %% [markdown]
# (ch1-expandable)=
# ## Expandable segments
#
# With `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` the allocator stops calling
# `cudaMalloc` for each segment. It uses CUDA's virtual memory API instead: it reserves a
# huge range of *addresses* (about 1.125 times the GPU's memory, which costs nothing; the
# factor is in `CUDACachingAllocator.cpp`), and maps physical memory into it page by page
# as it grows, 2 MiB pages for the small pool and 20 MiB pages for the large pool. There
# is one such growing segment per pool and stream. Because everything lives in one
# address range, freed blocks can always merge with their neighbours, and freeing
# everything leaves one free block covering every mapped page.
#
# The setting is read once, when CUDA starts, so the experiments run it in a fresh
# process. Here is the timeline of {ref}`ch1-reserved` with expandable segments:

# %%
timeline_expandable = ex.run("alloc.timeline", expandable=True)
steps = timeline_expandable["orders"]["small_first"]["reserved_bytes"][:8]
print("reserved after each 16 MiB tensor (MiB):", [s // al.MiB for s in steps])
al.plot_timeline(timeline_expandable)

# %% [markdown]
# Reserved memory now grows in 20 MiB pages, not per tensor. The post traces the same
# steps, 20, 40, 60, 80, 80, 100, 120 and 140 MiB: the fifth tensor fits in the free ends
# of the pages already mapped. After the tensors are freed, the four 32 MiB tensors fit in
# the mapped pages without mapping anything, and the reverse order ends at the same
# total. The order stopped mattering, at the price of up to one page of rounding per pool
# and stream.
#
# The *shrink* pattern of {ref}`ch1-oom`, which ran out of memory with default settings,
# now fits: the 24 MiB tensors are packed end to end in the one segment, and the memory
# they do not use is a single free run at its end instead of eleven 8 MiB tails.

# %%
oom_expandable = ex.run("alloc.fragmentation_oom", expandable=True)
al.plot_fragmentation_oom(oom_expandable, pattern="shrink")

# %% [markdown]
# ```{exercise} How much gets mapped?
# :label: ex-alloc-pages
#
# Write `mapped(k, s)`: the reserved MiB after allocating `k` tensors of `s` MiB each
# (1.5 ≤ `s` ≤ 60, so all in the large pool) into an empty allocator **with** expandable
# segments. For a harder second part, write `classic(k, s)`, the same without expandable
# segments, and check it with `expandable=False`.
# ```

# %%
def mapped(k, s):
    return None  # your code here


al.check_reserved_function(None)  # replace None with mapped
# the harder part: al.check_reserved_function(classic, expandable=False)

# %% [markdown]
# :::{solution} ex-alloc-pages
# :class: dropdown
#
# With expandable segments the tensors sit end to end (each block is the request rounded
# to 512 B) and pages are mapped only when the running total passes the mapped end:
#
# ```python
# import math
#
# def mapped(k, s):
#     return 20 * math.ceil(k * s / 20)
# ```
#
# Without them every segment is separate. From 10 MiB up each tensor gets its own segment,
# the request rounded up to 2 MiB. Below 10 MiB, tensors are carved one after another from
# 20 MiB segments; a tail of more than 1 MiB is split off for the next tensor, a smaller
# tail goes with the block:
#
# ```python
# def classic(k, s):
#     if s >= 10:
#         return k * 2 * math.ceil(s / 2)
#     segments, room = 0, 0.0
#     for _ in range(k):
#         if room < s:
#             segments, room = segments + 1, 20.0
#         room -= s
#         if room <= 1:
#             room = 0.0
#     return 20 * segments
# ```
# :::

# %% [markdown]
# (ch1-graphs)=
# ## Order matters: CUDA graphs in a shared pool
#
# The post's motivating case comes from LLM serving. A server captures one CUDA graph per
# batch size, and every byte those graphs keep reserved is a byte less for the KV cache.
# While a graph is captured, its allocations come from a **private memory pool**, and the
# pool keeps that memory reserved for as long as the graph exists, because replaying the
# graph writes to exactly those addresses. Graphs that never run at the same time can
# share one pool (`torch.cuda.graph(g, pool=torch.cuda.graph_pool_handle())`): a capture
# may reuse memory an earlier capture freed, so the pool only needs to be as large as the
# largest graph. See [CUDA graphs](https://docs.pytorch.org/docs/stable/notes/cuda.html#cuda-graphs)
# in the PyTorch notes.
#
# Whether that works depends on the capture order. The experiment takes the toy model of
# our own lab notes (a first run on the lab's H200 while this book was planned), an MLP
# `(relu(x @ W1) * 0.5 + 1.0) @ W2` with hidden size 4096 (W1 is 4096 × 8192) in float16.
# It captures one graph for each of eight batch sizes from 256 to 4096 into one shared
# pool on one capture stream, freeing each output after its capture: once smallest batch
# first and once largest first, without and with expandable segments. A server captures
# without autograd, so the captures run under `torch.no_grad()`. **Predict** which order
# is the expensive one, and by how much.

# %%
graphs = [ex.run("alloc.graph_pools", expandable=e) for e in (False, True)]
for r in graphs:
    inc, dec = (r[o]["reserved_growth_bytes"] / al.MiB for o in al.GRAPH_ORDERS)
    setting = "expandable segments" if r.params["expandable"] else "default settings"
    print(f"{setting}: reserved memory grew by {inc:.0f} MiB smallest batch first, "
          f"{dec:.0f} MiB largest first")
al.plot_graph_pools(graphs)

# %% [markdown]
# Small batch first, each capture's activations get segments sized for that batch. The
# next, larger batch cannot fit into them and cannot merge them, so it adds bigger
# segments, and the pool ends up holding segments sized for every batch at once. Largest
# batch first, the first capture creates segments big enough for everything, and each
# smaller capture splits blocks inside them. The usual advice, *capture from the largest
# batch size down*, works; it also ties application code to the allocator's internals.
# Expandable segments remove the dependence: everything freed between captures merges
# back into one free run, and the pool's size is set by the largest graph alone, plus at
# most a page of rounding.
#
# **What stays alive during a capture.** Those lab notes report larger pools for the same
# MLP in bfloat16: 574 MiB smallest batch first against 194 MiB largest first, and 202 MiB
# for both orders with expandable segments. The element size is not the reason, since
# bfloat16 and float16 both take 2 bytes. What differs is how many activations are alive
# at once. Under `no_grad`, each operator's output is freed as soon as the next operator
# has read it, so a capture never holds more than two activations of B × 8192 elements:
# 2 × 64 MiB at B = 4096. When the weights require grad (as `nn.Linear`'s do) and grad
# mode is on, autograd keeps relu's output and the input of the last matmul for a
# backward pass, until the output is freed: three activations at once. The experiment
# also captures that way. Fed with the requests of each capture, this chapter's model
# predicts both sets of numbers, and the table puts the pool the GPU measured next to it.
# The table counts the shared pool alone, so its numbers are a little below the growth of
# all reserved memory printed above; its note says what the captures hold outside the pool.

# %%
al.graph_pools_table(graphs)

# %% [markdown]
# Add the memory that the captures hold outside the shared pool (the table's note) to the
# model's autograd rows, and compare with the lab notes' figures quoted above:

# %%
print(al.autograd_pool_totals(graphs))

# %% [markdown]
# Order matters either way; what autograd keeps alive makes every capture larger.
#
# For your own server: capture in decreasing batch order, or set
# `expandable_segments:True` before CUDA starts; capture under `torch.no_grad()`; and
# measure `torch.cuda.memory_reserved()` before and after capturing.

# %% [markdown]
# (ch1-limits)=
# ## Where expandable segments do not help
#
# **Live blocks between free ones.** Expandable segments let free neighbours merge, but a
# live tensor between two free blocks still keeps them apart. The *interleave* pattern
# with expandable segments fails just like before: every free 16 MiB block sits between
# two live tensors, so no free run reaches 64 MiB. The allocator can only unmap pages that
# lie entirely inside a free block, and a 20 MiB page never fits inside a 16 MiB hole
# between two live tensors: only the free run at the end of the segment can go back.

# %%
p = oom_expandable["patterns"]["interleave"]
before, after = p["reserved_before_request_bytes"], p["reserved_after_bytes"]
print(f"reserved before the 64 MiB request: {before / al.MiB:.0f} MiB, "
      f"at the failure: {after / al.MiB:.0f} MiB")
al.plot_fragmentation_oom(oom_expandable, pattern="interleave")

# %% [markdown]
# This is why the post's conclusion has a condition: expandable segments remove this kind
# of fragmentation when all of one phase's memory is freed before the next begins (CUDA
# graphs that never overlap, training steps that free their activations). A pool that
# mixes long-lived and short-lived tensors still fragments.
#
# **The 1 MiB line.** The small and large pools are separate, with or without expandable
# segments. Memory freed by tensors of at most 1 MiB cannot serve a request above 1 MiB,
# and the reverse. The first panel frees a 2 MiB tensor (a 20 MiB large segment) and then
# asks for a second tensor of the size on the x axis; the second frees 4 MiB of
# small tensors and then asks for 1.5 MiB.

# %%
al.plot_pool_boundary(ex.run("alloc.pool_boundary"))

# %% [markdown]
# Switch on `expandable` to see that expandable segments draw the same line: each pool
# has its own segments, and so its own pages.

# %%
ex.panel("alloc.pool_boundary", al.plot_pool_boundary)

# %% [markdown]
# Shrinking a tensor can therefore *raise* reserved memory, when it moves it below the
# line: the post's example is 2 MiB then 0.5 MiB, which costs 22 MiB, while 2 MiB then
# 2 MiB costs 20 (the first panel measures both). As the post points out, this defeats a
# shared graph pool too: a tensor that is 1.5 MiB at one batch size and 0.75 MiB at
# another lands in different pools, and the sharing is lost for it.
#
# ```{exercise} Why 22 MiB?
# :label: ex-alloc-22
#
# A program allocates a 2 MiB tensor, frees it, then allocates a 0.5 MiB tensor. Reserved
# memory is 22 MiB. Which explanation is right? Answer with a key of
# `al.POOL_BOUNDARY_OPTIONS`.
# ```

# %%
for key, text in al.POOL_BOUNDARY_OPTIONS.items():
    print(key, text)
al.check_pool_boundary_choice(None)  # "a", "b", "c" or "d"

# %% [markdown]
# ```{solution} ex-alloc-22
# :class: dropdown
#
# **b.** The 2 MiB tensor is a large-pool request and gets a 20 MiB segment. After the
# free, that segment is cached in the large pool. The 0.5 MiB request belongs to the
# small pool, which never looks at large-pool blocks, so it opens a 2 MiB small segment:
# 20 + 2 = 22 MiB.
# ```

# %% [markdown]
# (ch1-knobs)=
# ## The knobs
#
# `PYTORCH_CUDA_ALLOC_CONF` (from torch 2.9 also `PYTORCH_ALLOC_CONF`) accepts more
# settings than `expandable_segments`. Each is read when CUDA starts, so each setting below
# runs in a fresh process, capped at 384 MiB, with a workload chosen to show what the
# setting changes ([reference](https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)):
#
# `max_split_size_mb:64`
# : cached blocks of 64 MiB or more are never split, and smaller requests never take
#   them. A 160 MiB block freed by one phase is then not cut up by a 30 MiB tensor, and a
#   later 150 MiB request can use it whole.
#
# `roundup_power2_divisions:4`
# : sizes round up to the next quarter of their power-of-two interval, so a tensor that
#   grows from 33 to 39 MiB always asks for 40 MiB and keeps reusing one block, instead
#   of needing a slightly larger segment each time.
#
# `garbage_collection_threshold:0.5`
# : when a memory cap is set and reserved memory exceeds half of it, the allocator
#   releases the cached blocks that have gone unused longest before asking for a new
#   segment, instead of waiting for an out-of-memory retry.

# %%
knobs = ex.run("alloc.knobs")
al.plot_knobs(knobs)

# %%
al.knobs_table(knobs)

# %% [markdown]
# Each knob fixes its own workload, and expandable segments fix two of the three on their
# own: they are what PyTorch's out-of-memory message suggests first. The garbage
# collection case is different in kind (the table's last row). Expandable segments keep
# the ten freed tensors' memory mapped and serve the 40 MiB request from it; the threshold
# returns that memory to the driver, which matters when another process on the same GPU
# needs it. Reach for
# `max_split_size_mb` last: blocks that cannot be split mean more `cudaMalloc` and
# `cudaFree` calls, and `cudaFree` waits for the device, which is why PyTorch stopped
# recommending it first ([pytorch#113481](https://github.com/pytorch/pytorch/pull/113481)).
#
# Settings also change between releases. `large_segment_size_mb` (the 20 MiB segment
# size) is recent: torch 2.11 has it, the 2.9.1 wheel does not, and an older torch refuses
# it. The experiments check each setting against the installed torch first and say so,
# instead of failing:

# %%
print(al.explain_setting_error({"large_segment_size_mb": 40})
      or "large_segment_size_mb: supported by this torch")
print(al.explain_setting_error({"max_split_size_mb": 8}))

# %% [markdown]
# (ch1-own)=
# ## Your own program
#
# **Look at the segments.** PyTorch can record every allocation with a stack trace and
# save a snapshot that its viewer draws:
#
# ```python
# import torch
#
# torch.cuda.memory._record_memory_history(max_entries=100_000)
# run_a_few_steps()                                   # your training or serving loop
# torch.cuda.memory._dump_snapshot("my_snapshot.pickle")
# torch.cuda.memory._record_memory_history(enabled=None)
# ```
#
# Drag the file onto [pytorch.org/memory_viz](https://pytorch.org/memory_viz): the
# *Active Memory Timeline* shows which tensors are alive when, and the *Allocator State
# History* shows the segments and blocks of this chapter, with the line of code that
# allocated each block ([Understanding CUDA memory usage](https://docs.pytorch.org/docs/stable/torch_cuda_memory.html)).
# To draw the same layout here, or to compute its fragmentation index:
#
# ```python
# segments = al.parse_segments(al.load_snapshot("my_snapshot.pickle"))
# # or, inside the running program: al.parse_segments(torch.cuda.memory._snapshot())
# al.plot_segments(segments)
# al.layout_summary(segments)  # reserved, allocated, free, largest free block, fragmentation
# ```
#
# **Read an out-of-memory error.** Catch it and parse it:
# `al.parse_oom_message(str(err))` gives the request, the cap, the allocated and the
# reserved-but-unallocated bytes. If the last is larger than the request, you are looking
# at fragmentation: try expandable segments first, then look for long-lived tensors
# allocated between short-lived ones.
#
# **Try a pattern.** `al.try_sequence` predicts the allocator's reserved memory for a
# sequence of allocations and frees, and on a GPU also measures it in a fresh process.
# Edit the sequence and the settings:

# %%
run = al.try_sequence([("alloc", "a", "2 MiB"), ("free", "a"), ("alloc", "b", "512 KiB")],
                      settings={"expandable_segments": False})
print(run["note"])
al.plot_sequence(run, title="2 MiB, free, then 512 KiB")

# %% [markdown]
# (ch1-doctor)=
# ### The allocator doctor: would another setting have helped?
#
# The viewer shows what happened; it does not say whether `expandable_segments:True` or a
# `max_split_size_mb` would have saved you. The book's doctor replays your snapshot's trace
# through the model of this chapter, and checks it event by event: every segment the GPU
# allocated or released, at the same event and with the same size, and every block where
# the GPU put it. Then it runs the same requests under other settings. Record with the
# trace on (stack frames are optional; `context=None` keeps the file small), then ask:
#
# ```python
# torch.cuda.memory._record_memory_history(context=None, max_entries=1_000_000)
# run_a_few_steps()
# torch.cuda.memory._dump_snapshot("my_snapshot.pickle")
#
# al.doctor("my_snapshot.pickle", what_if=["expandable_segments:True", "max_split_size_mb:64"])
# ```
#
# or, from a shell, with no GPU and no torch needed:
#
# ```bash
# python -m experiments doctor my_snapshot.pickle --what-if expandable_segments:True
# python -m experiments doctor my_snapshot.pickle.gz --suggest   # rank a grid, print the line to use
# ```
#
# The file (a pickle, gzip'd or not) is read by a loader of our own that builds plain data
# only and checks every size before spending the memory, so a snapshot someone sends you
# cannot run code or exhaust your machine. Nothing to install: the page
# {ref}`check-snapshot` runs the same doctor in your browser, on a file you drop on it,
# which it sends nowhere.
#
# Here is the doctor on a real training loop: a 4-layer `torch.nn.TransformerEncoder`
# trained with AdamW at batch sizes 24, 32, 40 and 48 (two steps each), with every batch
# copied in on a side stream. `al.own_snapshot()` records it on your GPU, in a fresh process
# with the default settings (a few seconds); without a GPU it is the lab H200's recording
# of the same program.

# %%
mine = al.own_snapshot()                          # live on your GPU, or the lab's recording
print("snapshot", mine["source"])
report = al.doctor(mine, what_if=["expandable_segments:True"])
print(report.summary())
report.table()

# %% [markdown]
# The first lines are the replay's verdict, then what was reserved but not allocated at
# the peak and which live blocks pinned those segments: segments that a few live tensors
# keep from being released, with the rest of their bytes cached but too small or in the
# wrong place for the next request. The figure puts the settings on one axis (reserved solid, allocated dashed) and
# draws the segments at the peak:

# %%
report.figure()

# %% [markdown]
# The lab's comparison: the same training loop recorded on the lab GPU under four
# settings (`python -m experiments record --experiment alloc.doctor_snapshots`, 21 fresh
# processes in all, so it is read from the recording in both modes).

# %%
training = ex.run("alloc.doctor_snapshots", mode="recorded", workload="training")

# %% [markdown]
# ```{exercise} Do the other knobs help this training loop?
# :label: ex-alloc-doctor
#
# The table above shows what expandable segments save here. What about the
# other two knobs of this chapter, `max_split_size_mb:64` and
# `roundup_power2_divisions:4`? Predict which of them leaves the loop with less memory
# reserved than the defaults (one of `al.DOCTOR_SETTINGS`), then run the cell after the
# check: it replays the snapshot under every setting the lab recorded, and lists the
# doctor's what-ifs next to the GPU's own runs under each setting.
# ```

# %%
for key, text in al.DOCTOR_SETTINGS.items():
    print(key, text)
al.check_doctor_setting(None)  # "a", "b", "c" or "d"

# %% tags=["hide-output"] mystnb={"code_prompt_show": "Show the answer", "code_prompt_hide": "Hide the answer"} memlab={"reveals": "ex-alloc-doctor"}
display(al.lab_comparison_table(al.lab_comparison(training)))
al.plot_doctor_snapshots(training)

# %% [markdown]
# ```{solution} ex-alloc-doctor
# :class: dropdown
#
# **Neither (d).** Each batch size asks for slightly larger activation tensors. With
# ordinary segments the freed activations of the smaller batch stay cached in segments
# that are a little too small, and the bigger batch gets new ones: the "batch N, then
# N + 1" growth of this chapter, which expandable segments avoid by growing one mapped
# range. `max_split_size_mb:64` does nothing for tensors below 64 MiB except keep large
# cached blocks whole, so more segments are needed; rounding to quarter steps makes the
# growing requests share sizes, but every block is a little larger, and here that costs
# more than it saves. The doctor's row for the recorded setting is the exact replay; its
# what-ifs for expandable segments and for `max_split_size_mb` equal the GPU's own runs to
# the byte, and the rounding one differs a little (the table shows by how much): which of
# two equal free blocks is reused depends on the addresses the driver picks, which a
# what-if knows only while it asks the driver for the same segments as the recorded run did.
# ```

# %% [markdown]
# **Which setting?** `suggest=True` (`--suggest` on the command line) replays a grid: the
# defaults, expandable segments, `max_split_size_mb` below the largest segment your run
# made, `roundup_power2_divisions` 2 to 16, `garbage_collection_threshold` under a memory
# cap, and combinations of the best of each, ranks them by out-of-memory errors and then
# peak reserved memory, and prints the `PYTORCH_CUDA_ALLOC_CONF` line to use:

# %%
print(al.doctor(mine, suggest=True).suggestion_text())

# %% [markdown]
# **Why did it run out of memory?** For a trace with an out-of-memory error the report
# explains the first one: the request that failed, what was reserved but unusable after
# the allocator released what it could, which live blocks pinned those segments (with
# the lines of your program that allocated them, when the snapshot has stack frames), and
# which settings of the grid would have served the request. The lab recorded a program
# under a 1 GiB cap that asks for 700 MiB with 650 MiB still in use:

# %%
capped = ex.run("alloc.doctor_snapshots", mode="recorded", workload="cap")["runs"][0]
print(al.doctor(capped).oom_text())

# %% [markdown]
# No setting helps there: the live tensors alone leave too little room under the cap.

# %% [markdown]
# (ch1-claims)=
# ## The post's claims, checked
#
# Each claim below is evaluated on the measurements of this chapter: live on your GPU, or
# from the lab GPU's recording.

# %%
ex.claims_table(chapter=1)
