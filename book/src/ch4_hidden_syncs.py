# %% [markdown]
# # Hidden host↔device syncs
#
# In eager PyTorch your Python program is a *producer*: every operation on a CUDA tensor
# queues a kernel and returns at once, and the GPU, the *consumer*, works through the
# queue. A healthy training loop keeps the host several milliseconds ahead, and that lead
# is what makes slow Python harmless. A **sync** is any point where the host stops and
# waits for the GPU to catch up. This chapter measures what a sync really costs, where
# syncs hide (including the less known host-to-device ones), and gives you a detector to
# keep them out of your own code.
#
# It follows the PyTorch DevLog post
# [*Host-to-device syncs are bad too*](https://docs.pytorch.org/devlogs/eager/2026-08-11-hidden-h2d-sync/)
# (Edward Yang, 2026) and checks each of its claims on a GPU.
#
# **What you will learn**
#
# - why the cost of a sync is the GPU's idle time *after* it (the bubble), not the
#   host's wait;
# - which everyday operations sync: device-to-host ones (`.item()`, `print`, boolean
#   masks, `nonzero`) and host-to-device ones (`torch.tensor(list, device="cuda")`,
#   indexing with lists, tuples, NumPy arrays or CPU tensors, copies from pageable memory);
# - how to tell a sync from its timing, from `torch.cuda.set_sync_debug_mode`, and from
#   CUDA-graph capture, and what each of them misses;
# - when even a `non_blocking=True` copy makes the host wait;
# - how to find and remove a hidden sync in a training step, and what that buys;
# - how to keep your code sync-free with a detector and a pytest fixture.

# %%
import experiments as ex
from experiments import syncs

ex.status()

# %% [markdown]
# (ch4-runahead)=

# %% [markdown]
# ## Run-ahead, and what one sync costs
#
# A kernel launch returns as soon as the kernel is queued. While the host computes the
# next step's Python (argument parsing, dispatch, your own bookkeeping), the GPU executes
# what was queued before, so the host's overhead costs nothing as long as the queue is not
# empty. A sync breaks this in two parts:
#
# 1. **The wait.** The host blocks until the queue has drained. Profilers show this as a
#    long bar on the host, but the GPU was busy the whole time: nothing is lost yet.
# 2. **The bubble.** When the wait ends the queue is empty. Every microsecond of Python
#    until the next launch is now GPU idle time, and the host has to rebuild its lead from
#    scratch. This is the real cost, and profilers charge it to no one.
#
# The experiment below makes both visible. A loop of 8 steps does `host_ms` of host work
# (a busy loop standing in for Python overhead), then queues `gpu_ms` of GPU work (a
# calibrated sleep kernel and a tiny add into a 0-dim `loss` tensor). It runs three times:
# without a sync, with `loss.item()` once (after the fourth step), and with `loss.item()`
# after every step. Host timestamps come from `time.perf_counter()`, GPU timestamps from
# CUDA events; the two clocks are aligned through one event recorded on an idle GPU, to
# within a few tens of microseconds (each variant records the bound, `align_uncertainty_ms`).
#
# ```{exercise} Predict the loop's end time
# :label: ex-syncs-runahead
#
# Each step does 1.5 ms of host work and then queues 2 ms of GPU work; there are 8 steps.
# When does the GPU finish the last step (ms after the loop starts)?
#
# 1. without any sync, and
# 2. with `loss.item()` after every step?
#
# Write down both numbers *before* you run the experiment, then check them.
# ```

# %%
# Your two predictions in ms: replace each None with a number, then run the cell.
no_sync_ms = None
every_step_ms = None
syncs.check_run_ahead_prediction(no_sync_ms, every_step_ms)

# %% [markdown]
# ```{solution} ex-syncs-runahead
# :class: dropdown
#
# Without a sync, the first kernel starts after 1.5 ms of host work. From then on the
# host queues each step faster (1.5 ms) than the GPU runs it (2 ms), so the GPU never
# waits: 1.5 + 8 × 2 = **17.5 ms**. With a sync every step nothing overlaps: the host works
# 1.5 ms, the GPU works 2 ms while the host waits, and so on: 8 × (1.5 + 2) = **28 ms**.
# The host waited 2 ms per step, yet the loop lost 1.5 ms per step: the Python time that no
# longer hides behind GPU work.
# ```

# %%
loop = ex.run("syncs.run_ahead", host_ms=1.5, gpu_ms=2.0)
syncs.plot_run_ahead(loop)

# %%
syncs.run_ahead_table(loop)

# %% [markdown]
# In the top panel the host (orange) finishes queueing long before the GPU (blue) is done:
# that gap is the run-ahead. In the middle panel the host waits in `.item()` (red), but
# the GPU lane stays solid during the wait; the only idle time is the grey sliver *after*
# it, while the host does the next step's Python. In the bottom panel every step pays that
# bubble, and the loop takes the sum of host and GPU time instead of the larger of the
# two. The table puts the measurements next to a simple queue model
# (`syncs.predicted_run_ahead_ms`).
#
# ```{exercise} What did the sync cost?
# :label: ex-syncs-bubble
#
# In the middle panel the host spent several milliseconds inside `loss.item()`, and the
# GPU finished the loop later than in the top panel. Which of these is the cost of that
# one sync to the loop?
#
# - `"a"`: the time the host waited inside `.item()`
# - `"b"`: the extra time the GPU needed to finish, the bubble after the sync
# - `"c"`: the wait plus the bubble
# - `"d"`: nothing, the GPU was busy all along
# ```

# %%
bubble_answer = None  # "a", "b", "c" or "d"
syncs.check_bubble_cost(bubble_answer)

# %% [markdown]
# ```{solution} ex-syncs-bubble
# :class: dropdown
#
# `"b"`. During the wait the GPU ran work that was queued anyway, so no GPU time was lost.
# After the wait the queue was empty, and the GPU idled until the host queued the next
# kernel: that bubble, about one step of host work here, is what the loop lost.
# ```
#
# The one sync of the middle panel, in numbers:

# %%
once, none = loop["variants"]["once"], loop["variants"]["none"]
print(f"the host waited in .item():  {once['host_blocked_ms']:.1f} ms")
print(f"the loop ended later by:     {once['end_ms'] - none['end_ms']:.1f} ms")
print(f"one step of host work:       {loop.params['host_ms']:g} ms")

# %% [markdown]
# The wait is longer than what the loop lost, and the loss is about one step of host work.
#
# Change the balance between host and GPU work. With `host_ms` above `gpu_ms` the host is
# the bottleneck even without syncs and has no lead to lose: a sync then costs one step's
# GPU time, the kernel the host now waits for instead of overlapping it with its own work.
# In general one sync costs about the smaller of the two per-step times, and a sync in
# every step turns "the larger of host and GPU time" into their sum.

# %%
ex.panel("syncs.run_ahead", syncs.plot_run_ahead)

# %% [markdown]
# (ch4-catalogue)=

# %% [markdown]
# ## Where syncs hide: the catalogue
#
# The host has to wait for the GPU whenever it needs something that only the end of the
# queue can produce. That happens in two directions.
#
# **Device to host.** The host needs a *value*: `.item()`, `if loss > 0:` (Python's `if`
# calls `bool`, an implicit `.item()`), `print(x)`, `.cpu()`. Or it needs a *size*: the
# output of `nonzero`, `x[mask]`, `masked_select`, `unique` or `repeat_interleave(counts)`
# depends on data on the GPU, and PyTorch must know the size before it can allocate the
# result. Shape-static alternatives (`masked_fill`, three-argument `torch.where`,
# `repeat_interleave(..., output_size=n)`) never ask.
#
# **Host to device.** Data reaches a kernel in one of two ways. Small values travel
# *inside the launch*, as kernel arguments: `torch.full((3,), 1.0, device="cuda")` and
# `x + 1.0` copy nothing, and neither does `x + torch.tensor(1.0)`, because PyTorch reads a
# 0-dim CPU tensor on the host and passes it as an argument. Anything else must be *copied*
# into GPU memory. PyTorch copies from pageable host memory with a blocking copy followed by
# a stream synchronize, so `torch.tensor([0., 1., 2.], device="cuda")` empties the whole
# queue to move 12 bytes. The same happens in advanced indexing: `x2[:, 1:3]` is a view
# (no kernel at all), but in `x2[:, (1, 3)]` PyTorch turns the tuple into a CPU index tensor
# and copies it, as it does with a list, a NumPy array or a CPU tensor. The call sites look
# alike; only one of them drains the queue.
#
# The catalogue below was generated by running each operation four ways:
#
# - **debug mode**: the number of warnings from `torch.cuda.set_sync_debug_mode("warn")`
#   ([docs](https://docs.pytorch.org/docs/stable/generated/torch.cuda.set_sync_debug_mode.html)),
#   PyTorch's own report of the call sites it knows to synchronize;
# - **the book's detector** ({ref}`ch4-detector`), which adds what the debug mode misses;
# - **host wait**: 20 ms of GPU work is queued first, then only the call is timed on the
#   host. About 20 ms means it waited for the queue; a fraction of a millisecond means it
#   did not.
#   This is the ground truth, and it needs no instrumentation;
# - **CUDA graph**: can the call be captured in a CUDA graph on a side stream? A graph
#   cannot contain a host wait, and capture rejects copies from pageable memory, so capture
#   is a strict sync detector. The probes run in a separate process, started afresh when a
#   failed capture leaves CUDA unusable, so that one failure cannot disturb the other rows.
#
# ```{exercise} Which of these sync?
# :label: ex-syncs-classify
#
# `x` is a float32 CUDA tensor, `x2 = x.view(-1, 8)`, `mask = x > 0`, `loss = x.sum()`,
# `idx_cuda` a CUDA index tensor and `src_pinned` a pinned CPU tensor. For each operation
# in the cell below, predict whether the host waits for the GPU (`True`) or not (`False`),
# then run the check. The check compares your answers with the catalogue measured on the
# GPU (yours, or the lab's).
# ```

# %%
answers = {
    "loss.item()": None,
    "torch.full((3,), 1.0, device='cuda')": None,
    "x2[:, (0, 2, 3)]": None,
    "x2[:, 1:3]": None,
    "torch.tensor(3.0, device='cuda')": None,
    "x + torch.tensor(1.0)": None,
    "x[mask]": None,
    "x.masked_fill(mask, 0.0)": None,
    "src_pinned.to('cuda')": None,
    "src_pinned.to('cuda', non_blocking=True)": None,
    "x2[:, idx_cuda]": None,
    "mask.any()": None,
}
syncs.check_classification(answers)

# %% [markdown]
# ```{solution} ex-syncs-classify
# :class: dropdown
#
# Syncing: `loss.item()` (a Python value), `x2[:, (0, 2, 3)]` (the tuple becomes a CPU
# index tensor and a blocking copy), `torch.tensor(3.0, device='cuda')` (pageable buffer,
# blocking copy, even for one number), `x[mask]` (the result's size), and
# `src_pinned.to('cuda')`: pinning alone does not help, because without `non_blocking=True`
# PyTorch still synchronizes after the copy.
#
# Not syncing: `torch.full` (the value is a kernel argument), `x2[:, 1:3]` (a view),
# `x + torch.tensor(1.0)` (a 0-dim CPU tensor becomes a kernel argument),
# `x.masked_fill(mask, 0.0)` (same shape out as in), the pinned `non_blocking` copy (queued
# like a kernel), `x2[:, idx_cuda]` (the index is already on the device), and `mask.any()`
# (its result stays a CUDA tensor until you ask for its value).
# ```

# %%
cat = ex.run("syncs.catalogue", cache=True)  # live: reuses the check's run
syncs.plot_catalogue(cat)

# %% [markdown]
# Reading the figure from the top: every red bar reaches the dashed line of queued work,
# because each of those calls waited for the whole queue; the green ones return within a
# fraction of a millisecond (the axis is logarithmic). The debug mode and the timing agree
# on almost every row:

# %%
rows = cat["rows"]
waited = [r for r in rows if r["blocks"]]
missed = [r["code"] for r in waited if r["debug_mode_syncs"] == 0]
print(f"{len(waited)} of {len(rows)} operations made the host wait; "
      f"the debug mode missed {len(missed)}:")
print(*missed, sep="\n")

# %% [markdown]
# The exceptions are explicit waits, `torch.cuda.synchronize()` and `Event.synchronize()`
# (the debug mode did report `Stream.synchronize()`, see {ref}`ch4-detector`), and copies
# whose wait the CUDA driver decides rather than PyTorch: a `non_blocking` copy *into*
# pageable memory and, above a size threshold, a `non_blocking` copy *from* pageable memory
# ({ref}`ch4-pageable`). Those bars are purple: the host waited and nothing was reported.
# The 'graph' labels show that every operation that syncs also fails CUDA-graph
# capture. Capture is even stricter than a sync check: it also refuses the small pageable
# `non_blocking` copy that did not make the host wait, because PyTorch allows no copy
# between the GPU and unpinned host memory during a capture (the error asks for a pinned
# tensor), whatever its size.
#
# The table below (click to open) gives the same measurements with the reason behind each
# row. The post's first claim, checked on the measurement above, follows it.

# %%
syncs.catalogue_table(cat)

# %%
ex.show_claim("syncs.catalogue")

# %% [markdown]
# Switch the tensor size to 16 MiB and watch the pageable `non_blocking` copy change
# color. In the second panel, pick any operation and see how its wait grows with the
# amount of queued work: a slope of 1 is the signature of a sync, and it distinguishes a
# wait from an operation that is merely slow.

# %%
ex.panel("syncs.catalogue", syncs.plot_catalogue, params=["numel"])

# %%
ex.panel("syncs.queue_probe", syncs.plot_queue_probe)

# %% [markdown]
# (ch4-pageable)=

# %% [markdown]
# ## Copies from pageable memory drain the stream
#
# Memory that `malloc` or NumPy gives you is *pageable*: the operating system may move or
# swap its pages, so the GPU's copy engine cannot simply read it by physical address. For a
# host-to-device copy from such memory the driver has two strategies, and the choice is
# not documented (the driver is closed source; what follows is the post's reading of
# experiments on a GB200). Small copies it stages itself, and the host returns at once (in
# a quick check while preparing this chapter, a 32 KiB source overwritten right after the
# call still arrived unchanged: the bytes were taken at call time). Larger ones it performs
# as a DMA that reads the source through the GPU's MMU; before that it **drains the
# destination stream**, because a kernel already in the queue might still be using the
# buffer the copy overwrites. On top of that, a blocking `.to("cuda")` makes PyTorch
# synchronize the stream after every copy, from pageable or pinned memory alike. Only a
# copy from *pinned* (page-locked) memory with `non_blocking=True` is reliably queued like
# a kernel. Chapter 3 covers what pinning costs and how PyTorch's pinned allocator keeps
# such buffers safe.
#
# The experiment copies sizes from 64 KiB to 64 MiB into a preallocated GPU buffer, each
# behind 30 ms of queued GPU work, from three sources. The post reports that on a GB200 the
# driver drained the stream for pageable copies above 64 KB; where your driver starts is
# what the sweep measures (the figure's title names the first size that waited).

# %%
copies = ex.run("syncs.pageable_threshold")
syncs.plot_pageable_threshold(copies)

# %% [markdown]
# The blocking copy (orange) waits for the queue at every size: that is PyTorch's
# synchronize, not the driver. The pinned `non_blocking` copy (green) never waits. The
# pageable `non_blocking` copy (red) returns at once while the driver stages it, then jumps
# to the full queue once the size passes the driver's limit; above that it also pays the
# copy itself, at pageable bandwidth:

# %%
size = copies["sizes_bytes"][-1]
waited = copies["variants"]["pageable_non_blocking"]["median_ms"][-1]
extra_ms = waited - copies["work_ms"]
print(f"{size / 2**20:g} MiB copy: waited {waited:.1f} ms, "
      f"{extra_ms:.1f} ms beyond the queued work")
print(f"about {size / extra_ms / 1e6:.1f} GB/s: compare chapter 3's pageable bandwidth")

# %% [markdown]
# The claim:

# %%
ex.show_claim("syncs.pageable_htod_blocks")

# %%
ex.panel("syncs.pageable_threshold", syncs.plot_pageable_threshold)

# %% [markdown]
# ```{exercise} Find your driver's limit
# :label: ex-syncs-threshold
#
# Read the sweep above (or, on your GPU, run the panel): what is the smallest copy size,
# in MiB, at which a `non_blocking=True` copy from pageable memory made the host wait for
# the queued work? Any value between the largest size that did not wait and the first one
# that did is accepted. If no size waited, answer `"none"`.
# ```

# %%
threshold_mib = None  # a number of MiB, or "none"
syncs.check_threshold(threshold_mib)

# %% [markdown]
# ```{solution} ex-syncs-threshold
# :class: dropdown
#
# Find the red squares' jump: the answer lies between the largest size that returned at
# once and the first size that waited for the queue (the figure's title names that one, and
# the shaded band spans the two). The post's 64 KB is a different platform: treat the limit
# as a property of your driver, and pin anything large that you copy every step.
# ```

# %% [markdown]
# (ch4-case)=

# %% [markdown]
# ## Case study: the metrics helper
#
# The post tells a familiar story. A profile shows the host blocked for tens of
# milliseconds in `loss.item()`; the `.item()` is replaced by an asynchronous copy into
# pinned memory; the red bar disappears from the profile, and the step time does not
# change. The reason is a second sync in a metrics helper that nobody suspected, because
# "a few tiny reductions cannot cost anything":
#
# ```python
# SUM_COLS = (0, 2, 3, 4, 5, 6, 7)
#
# def reduce_grad_stats(local):             # local: [groups, 8] CUDA tensor
#     sums = local[:, SUM_COLS].sum(dim=0)  # a tuple index: CPU index tensor, blocking copy
#     gmax = local[:, 1].max()
#     return sums, gmax
# ```
#
# The reductions are indeed free. The tuple index is not: it syncs right after the
# backward pass was queued, so the host waits for the whole forward and backward. What
# that costs depends on what comes next ({ref}`ch4-runahead`): the GPU idles for roughly
# the host time of the work after the sync, minus the GPU time of that work.
#
# Our step is a 16-block MLP. After the backward pass it computes per-group gradient
# statistics and passes them through the helper, then clips the gradients, runs AdamW
# and updates an exponential moving average (EMA) of the weights. Clipping, AdamW and the
# EMA go through the parameters one tensor at a time (`foreach=False` and a Python loop),
# as hand-written optimizers and many research training loops do: several hundred small
# kernels, cheap for the GPU but milliseconds of host time. Each GPU gets its own batch
# size, chosen so that a whole step takes about as long on the GPU as on the host, where a
# sync costs most. Step time is the median period between the starts of consecutive
# steps, measured with CUDA events.

# %%
case = ex.run("syncs.case_study")
syncs.plot_case_study(case)

# %% [markdown]
# The horizontal lines are the step's two budgets, measured separately: the host time of
# a sync-free step with the GPU drained first (dashed), and the GPU time of its kernels
# queued back to back (dotted). The table splits them by phase and puts the measured step times next to a queue
# model (`syncs.predicted_step_ms`): sync-free, the slower side sets the pace; with the
# sync, the GPU's forward and backward are followed by the host's update loops. The model
# is an approximation, not a fit: the last line under the table says how far it is from the
# measured step times of the case shown, and the three balances further down print both.
# On the lab GPU it came close wherever the GPU had at least as much work as the host, and
# undershot where the host sets the pace (`balance` 0.5 in the panel below): the host's
# phases, timed one at a time, add up to less than the same work takes inside the running
# loop.

# %%
syncs.case_study_table(case)

# %%
print(syncs.describe_case_study(case))

# %%
syncs.plot_case_study_timeline(case)

# %% [markdown]
# In the upper timeline the host's "metrics" phase (red) is long: it is the wait. The
# update phase (orange) then lasts as long on the GPU as on the host, but the GPU is mostly
# idle there: it runs each small kernel as soon as the host queues it. Without the sync
# (lower timeline) nothing holds the host back: it queues the next step's forward pass
# while the GPU is still busy, the small kernels run in between, and the step takes about
# the longer of host and GPU time instead of GPU time plus the update's host time.
#
# To find such a sync, run one step under the detector from {ref}`ch4-detector`. It names
# the line:

# %%
print(syncs.find_hidden_syncs())

# %% [markdown]
# The fix keeps the column index on the device, built once:
#
# ```python
# SUM_INDEX = torch.tensor(SUM_COLS, device="cuda")   # one copy, at start-up
#
# def reduce_grad_stats_fixed(local):
#     return local.index_select(1, SUM_INDEX).sum(dim=0), local[:, 1].max()
# ```
#
# The post's claim, checked:

# %%
ex.show_claim("syncs.case_study_speedup")

# %% [markdown]
# The gain depends on the balance between GPU and host time. With little GPU work per
# step the host is the bottleneck either way, and the update loops cost the same host time
# with or without the sync. With much more GPU work than host work, the bubble is small
# next to the step. The three recorded balances (on a GPU this cell measures all three):

# %%
lines = []
for balance in (0.5, 1.0, 2.0):
    r = ex.run("syncs.case_study", balance=balance)
    hidden = r["variants"]["hidden_sync"]["step_ms"]["median"]
    free = r["variants"]["sync_free"]["step_ms"]["median"]
    model = r["predicted_ms"]
    lines.append(f"balance {balance:g}: {hidden:5.1f} ms per step with the sync, {free:5.1f} ms without: "
                 f"{r['speedup']:.2f}x (model: {model['hidden_sync']:.1f} and {model['sync_free']:.1f} ms)")
print("\n".join(lines))

# %% [markdown]
# In the panel you can look at each balance's figure:

# %%
ex.panel("syncs.case_study", syncs.plot_case_study, params=["balance"])

# %% [markdown]
# ```{exercise} Make the helper sync-free
# :label: ex-syncs-rewrite
#
# Write `reduce_grad_stats_sync_free(local)` that returns the same `(sums, gmax)` as
# `reduce_grad_stats` (the sum over groups of columns 0 and 2 to 7, and the largest value
# of column 1) without a host-device sync, then pass it to the check. On a GPU the check
# calls it once to warm up, then again under the detector with 20 ms of GPU work queued,
# and compares the values with the original. Without a GPU it compares the values on CPU
# tensors and scans your source for the usual sync patterns, and tells you that the sync
# check itself needs a GPU.
# ```

# %%
def reduce_grad_stats_sync_free(local):
    """local: [groups, 8]. Return (sums of columns 0, 2-7 over groups, max of column 1)."""
    ...  # your code here


syncs.check_sync_free_rewrite(None)  # replace None with reduce_grad_stats_sync_free

# %% [markdown]
# ````{solution} ex-syncs-rewrite
# :class: dropdown
#
# The shortest sync-free version needs no index tensor at all: sum every column, then drop
# column 1 with slices, which are views.
#
# ```python
# import torch
#
# def reduce_grad_stats_sync_free(local):
#     totals = local.sum(dim=0)
#     return torch.cat((totals[:1], totals[2:])), local[:, 1].max()
# ```
#
# A device-resident index built once (as in `syncs.reduce_grad_stats_fixed`) works too, and
# so does the post's suggestion for indices that change: build them in pinned memory and
# copy them with `non_blocking=True`. Building `torch.tensor(SUM_COLS, device=...)` inside
# the function does not: that is a blocking copy on every call.
# ````

# %% [markdown]
# (ch4-detector)=

# %% [markdown]
# ## A detector you can keep
#
# `set_sync_debug_mode("warn")` reports every call site that PyTorch marked as
# synchronizing, which covers most of the catalogue. In the lab's measurements (the
# catalogue above and the blind-spot experiment below, torch 2.11) it reported
# `Stream.synchronize()` but not the explicit waits `torch.cuda.synchronize()` and
# `Event.synchronize()`: PyTorch instruments its stream-level synchronize, which
# `Stream.synchronize()` goes through, and not the device- and event-level ones. Nor can it
# see waits that the CUDA driver decides on, such as the large pageable `non_blocking`
# copies of {ref}`ch4-pageable`. `experiments.sync_detector.no_syncs` combines three
# sources:
#
# 1. it arms the debug mode at `"warn"`, turns each warning into an event with the line of
#    *your* code that caused it, and restores the previous mode on exit (also when the block
#    raises);
# 2. it wraps `torch.cuda.synchronize`, `torch.cuda.Event.synchronize`,
#    `torch.cuda.Stream.synchronize` and `torch.accelerator.synchronize` for the duration of
#    the block (a wait the debug mode already reported is not counted twice);
# 3. it wraps `Tensor.to`, `Tensor.cuda` and `Tensor.copy_`, and reports `non_blocking`
#    copies from pageable memory of 64 KiB or more (configurable), and `non_blocking`
#    copies into pageable memory.
#
# ```python
# from experiments.sync_detector import no_syncs
#
# with no_syncs():                      # raises SyncError on exit if the block synced
#     train_step(model, batch)
#
# with no_syncs(mode="report") as det:  # only records
#     train_step(model, batch)
# print(det.report())                   # one line per sync: kind, file:line, code
# ```
#
# ```{warning}
# The wrappers of point 2 replace `torch.cuda.synchronize` and the other functions only
# while the block runs, so the detector sees a call only if your code looks the function up
# *inside* the block. A name bound earlier still points to the original function: after
# `from torch.cuda import synchronize` at the top of a module, or `wait = event.synchronize`
# before the `with`, a call to `synchronize()` or `wait()` inside the block waits for the
# GPU and neither the detector nor the debug mode reports it. Write
# `torch.cuda.synchronize()` and `event.synchronize()` in full inside checked code. (This
# book's own test of the detector fell into exactly this trap on the lab GPU.)
# ```
#
# Here it is on a few lines (this cell needs a GPU; without one it says so):

# %%
if ex.has_cuda():
    import torch

    x = torch.randn(100_000, device="cuda")
    with syncs.no_syncs(mode="report") as det:
        positives = x[x > 0]               # a data-dependent size
        total = x.sum().item()             # a Python number
        clipped = torch.where(x > 0, x, 0.0)  # stays on the device
    print(det.report())
else:
    print(syncs.no_gpu_message())

# %% [markdown]
# The next experiment runs cases the debug mode handles badly through both detectors,
# each behind 20 ms of queued GPU work, so that the host's wait says which ones really
# synchronized.

# %%
spots = ex.run("syncs.blind_spots")
syncs.plot_blind_spots(spots)

# %%
syncs.blind_spot_table(spots)

# %% [markdown]
# Shaded rows are the waits the debug mode did not report: the explicit
# `torch.cuda.synchronize()` and `Event.synchronize()`, and the two pageable copies whose
# wait the driver decides. The detector reports each of them, and nothing for the calls
# that returned at once. The claim for the first row:

# %%
ex.show_claim("syncs.debug_mode_blind_spot")

# %% [markdown]
# **What it still cannot see.** Waits inside C++ code that PyTorch did not instrument
# (custom CUDA extensions, `torch.distributed`, `torch.sparse`, libraries that synchronize
# on their own); waits the driver performs implicitly, such as `cudaFree` when the caching
# allocator gives memory back (`empty_cache`, the retry after an out-of-memory error) or
# pinned-memory allocation; sync functions bound before the block started
# (`from torch.cuda import synchronize`, see the warning above) and the device-generic
# `torch.Event` and `torch.Stream` classes; code compiled by `torch.compile` or replayed
# from a CUDA graph;
# and pageable copies below the threshold, which some drivers stage and others do not. The
# debug mode is process-global, so a sync made by another thread during the block is
# reported too (the event names the thread; `threads="current"` ignores them). For a region
# you can capture, CUDA-graph capture remains the strictest check of all.
#
# **In your test suite.** The package ships a pytest plugin with a fixture and a marker:
#
# ```python
# # conftest.py (the top-level one)
# pytest_plugins = ["experiments.pytest_plugin"]
#
# # test_training.py
# import pytest
#
# def test_train_step_is_sync_free(sync_detector):
#     model, batch = build_model_and_batch()   # set-up may sync: not checked
#     train_step(model, batch)                 # warm-up: constants are built once here
#     with sync_detector():                    # the test fails if this block syncs
#         train_step(model, batch)
#
# @pytest.mark.no_syncs(pageable_threshold_bytes=65536)
# def test_metrics_helper_is_sync_free():      # the whole test body is checked
#     ...
# ```
#
# On a machine without a GPU both are skipped with the reason, so the same suite runs on
# CPU-only CI. The warning above holds in tests too: inside the checked code, call
# `torch.cuda.synchronize()` by its full name, not through a name imported earlier.
#
# ## Applying this to your own code
#
# 1. **Measure step time, not profile bars.** A sync's cost is the bubble after it, and it
#    only shows up when *every* sync in the step is gone.
# 2. **Run one warmed-up step under `no_syncs(mode="report")`** and go through the lines it
#    names. Aim it at metrics, logging and other "cheap" code first: that is where syncs
#    live, because nobody benchmarks it.
# 3. **Replace each sync with its device-side form:** keep values on the device and read
#    them once per logging interval (or copy them into pinned memory with
#    `non_blocking=True` and read after an event); use `masked_fill`/`torch.where` instead of
#    boolean indexing; pass `output_size=` to `repeat_interleave`; build index and constant
#    tensors once, on the device, or use `torch.full` for scalars; copy batches from pinned
#    memory with `non_blocking=True` (`DataLoader(pin_memory=True)`).
# 4. **Keep it fixed** with a `sync_detector` test, and remember that anything you want to
#    capture in a CUDA graph must pass this check anyway.
#
# ## The post's claims, measured

# %%
ex.claims_table(chapter=4)
