# %% [markdown]
# # How this book measures
#
# Four tools carry every experiment in the book. This page shows each one working on a
# GPU, so that later chapters can use them without explanation.

# %%
import experiments as ex
from experiments import calibration

ex.status()

# %% [markdown]
# ## GPU work measured in milliseconds, not cycles
#
# Many experiments need the GPU to be busy for a known time: a consumer kernel that is
# still reading a buffer, a queue of work the host has run ahead of. PyTorch has a private
# kernel for exactly this, `torch.cuda._sleep(cycles)`, which spins for a number of GPU
# clock cycles. Clock rates differ between a T4, an A100 and an H200, so the book never
# hard-codes cycles. It times a few cycle counts with CUDA events, fits a straight line,
# and from then on converts milliseconds to cycles on whatever GPU it runs on
# (`experiments.core.measure.gpu_sleep(ms)`).

# %%
clock = ex.run("core.sleep_clock")
calibration.plot_sleep_clock(clock)

# %% [markdown]
# The points lie on a line whose slope is the GPU's clock rate as `_sleep` sees it.
# The intercept is the fixed cost of a launch, a few microseconds. Each point is the
# **median** of repeated runs with a bar from the 10th to the 90th percentile: one timing
# of GPU work is an anecdote, a median with its spread is a measurement.

# %%
print(f"{clock['cycles_per_ms'] / 1e6:.3f} million cycles per ms, launch offset {clock['offset_ms'] * 1e3:.1f} µs")

# %% [markdown]
# ## Timing asynchronous work
#
# A CUDA launch returns as soon as the work is queued. A host timer around a launch
# therefore measures the launch, not the kernel. There are two honest alternatives:
# synchronize before reading the host clock (which measures the host's wait, including
# any work already queued), or record CUDA events on the stream before and after the
# work, which the GPU timestamps as it reaches them. `experiments.core.measure.time_gpu` uses
# events, warms up first, repeats, and returns the median with its spread.
#
# Change the amount of queued work and compare the three clocks. In recorded mode the
# slider offers the values that were recorded on the lab GPU.

# %%
ex.panel("core.three_clocks", calibration.plot_three_clocks, params=["work_ms"])

# %% [markdown]
# ## Three memory counters
#
# The caching allocator keeps memory it has obtained from CUDA and hands it out again
# without asking the driver. Its counters (from `torch.cuda.memory_stats()`) answer three
# different questions, and the chapters pick the one that shows the effect:
#
# allocated bytes
# : memory in blocks that tensors currently own. It drops the moment Python frees a
#   tensor.
#
# active bytes
# : allocated blocks plus blocks that were freed but cannot be reused yet because a
#   CUDA event recorded by `record_stream` has not been seen complete. Chapter 2 needs
#   this counter: `max_memory_allocated()` does not see those parked blocks.
#
# reserved bytes
# : everything the allocator holds from CUDA, in use or cached. This is what other
#   processes cannot have, and what an out-of-memory error is really about (chapter 1).
#
# `experiments.core.measure.track_memory()` resets the peaks, then reports every counter
# relative to the start of the block, so each variant of an experiment starts from zero.
#
# ## A fresh process for every allocator setting
#
# The allocator reads `PYTORCH_CUDA_ALLOC_CONF` once, when CUDA starts. Experiments that
# compare settings, or that run into an out-of-memory error on purpose, therefore run in
# a fresh Python process (`experiments.core.runner.run_fresh`). Your notebook's kernel keeps
# its memory and survives the error; the failure comes back as data. Settings are checked
# before anything starts, with a message that names the option and what it accepts:

# %%
from experiments.core import alloc_conf

print(alloc_conf.render({"expandable_segments": True, "max_split_size_mb": 64}))
for bad in ({"expandable_segment": True}, {"max_split_size_mb": 8}):
    try:
        alloc_conf.render(bad)
    except ValueError as err:
        print("rejected:", err)

# %% [markdown]
# ## Using the tools on your own code
#
# Everything above is ordinary Python you can import:
#
# ```python
# from experiments.core.measure import time_gpu, track_memory, gpu_sleep
#
# print(time_gpu(lambda: model(batch)))          # median (p10, p90) in ms from CUDA events
# with track_memory() as mem:
#     loss = model(batch).sum(); loss.backward()
# print(mem.delta.mib())                         # peaks of allocated, active, reserved in MiB
# ```
