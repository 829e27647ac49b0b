# %% [markdown]
# # CUDA Memory Lab
#
# **How PyTorch really uses GPU memory, measured on real GPUs.**
#
# This book is for ML engineers who have met an out-of-memory error that the numbers did
# not explain, a result that changed when a second CUDA stream joined the program, or a
# training step that was slower than the sum of its kernels. Each chapter takes one post
# of the [PyTorch DevLog](https://docs.pytorch.org/devlogs/) and turns its claims into
# experiments you run on a GPU, change with sliders, and check against the post:
#
# 1. **The caching allocator and fragmentation**: blocks, segments, pools, why the order
#    of allocations changes how much memory is reserved, expandable segments, and CUDA
#    graph memory pools
#    ([post](https://docs.pytorch.org/devlogs/eager/2026-06-01-cuda-caching-allocator/)).
# 2. **Cross-stream memory**: a buffer made on one stream and read on another, the race
#    it invites, and why an event beats `record_stream` when you care about peak memory
#    ([post](https://docs.pytorch.org/devlogs/eager/2026-09-29-cross-stream-memory-without-record-stream/)).
# 3. **Pinned memory**: what page-locked host memory buys, copies that outlive `del`, the
#    host caching allocator, and why real systems pin once and keep it
#    ([post](https://docs.pytorch.org/devlogs/eager/2026-08-09-pinned-memory-allocator/)).
# 4. **Hidden host↔device syncs**: `.item()` and boolean masks, and the quieter
#    host-to-device syncs, with a detector you can keep in your own tests
#    ([post](https://docs.pytorch.org/devlogs/eager/2026-08-11-hidden-h2d-sync/)).
#
# Every chapter ends with its claims checked against measurements and with exercises
# that check themselves. The code behind the pages is a small Python package,
# `experiments`, which you can also use on your own programs.
#
# ## Three ways to run it
#
# **In Colab, on a GPU.** Open a chapter and use the rocket icon at the top of the page
# to launch it in Colab. The notebook asks Colab for a GPU runtime; if yours has none,
# choose *Runtime › Change runtime type › T4 GPU*. The first cell installs the helper
# package and leaves Colab's torch alone.
#
# **On your own GPU.** Clone the repository and run `make book` (it creates a virtual
# environment, installs the pinned requirements and builds this book), or
# `pip install` the repository into an environment that already has a CUDA build of
# torch 2.4 or newer, and open the notebooks under `book/`.
#
# **Without a GPU.** Read the book online, or run the notebooks on a laptop: every
# experiment then shows the result recorded on the lab GPU.
#
# **Your own out-of-memory error.** Drop a memory snapshot of your program on the page
# {ref}`check-snapshot`: chapter 1's allocator doctor replays it in your browser and tells
# you what other allocator settings would have done. The file is sent nowhere.
#
# ## Live and recorded results
#
# Each experiment is one function call, for example `ex.run("core.three_clocks")`.
# With a CUDA GPU the call measures **live**, on your GPU, now. Without one it returns
# the result **recorded** on the lab GPU by `python -m experiments record`, from the same
# code. Every figure says which it is in its footer: "Measured live on …" or
# "Recorded on …", followed by the GPU, driver, CUDA and torch versions, the date and the
# commit of the code. Widgets in recorded mode offer only the parameter values that were
# recorded. Numbers are never typed into the book by hand.
#
# The box below says which mode this page ran in.

# %%
import experiments as ex
from experiments import calibration

ex.status()

# %% [markdown]
# ## A first measurement
#
# The experiment below queues some GPU work and times it three ways: a host timer around
# the launch, a host timer around the launch plus `torch.cuda.synchronize()`, and a pair
# of CUDA events recorded on the stream. The launch returns long before the GPU has done
# the work, so the first timer measures almost nothing. That gap between what the host
# has *asked for* and what the GPU has *done* is the thread that runs through all four
# chapters: it decides when memory can be reused, when a copy may still be reading a
# buffer, and what a synchronization really costs.

# %%
clocks = ex.run("core.three_clocks")
calibration.plot_three_clocks(clocks)

# %% [markdown]
# The next page, [How this book measures](measuring.ipynb), explains the tools every chapter
# uses: calibrated GPU work, CUDA-event timing with medians and spread, and the memory
# counters of the caching allocator.
