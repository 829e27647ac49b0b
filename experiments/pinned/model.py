"""Chapter 3 helpers that need no GPU: host-memory sizing, the torch-version differences of
the pinned (host) caching allocator, a model of its block sizes, and the PCIe link's peak.

Everything here is plain Python so that it can be tested on a CPU-only machine; the
experiments in :mod:`experiments.pinned` call it before and after their GPU work.

Sources: the host allocator's rules, ``aten/src/ATen/core/CachingHostAllocator.h``
("Note [HostAllocator design]") and ``aten/src/ATen/cuda/CachingHostAllocator.cpp``;
the post "Pinned memory: what it is for, and why nobody gives it back",
https://docs.pytorch.org/devlogs/eager/2026-08-09-pinned-memory-allocator/ ;
``torch.cuda.host_memory_stats``,
https://docs.pytorch.org/docs/stable/generated/torch.cuda.memory.host_memory_stats.html
"""
from __future__ import annotations

import dataclasses
import shutil
import subprocess
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..core.lazy_torch import torch
from ..core.alloc_conf import KNOWN_OPTIONS
from ..core.units import MiB  # noqa: F401  (re-exported for the chapter)
from ..core.device import torch_version


POST_URL = "https://docs.pytorch.org/devlogs/eager/2026-08-09-pinned-memory-allocator/"
HOST_STATS_DOC = "https://docs.pytorch.org/docs/stable/generated/torch.cuda.memory.host_memory_stats.html"
TUTORIAL_URL = "https://docs.pytorch.org/tutorials/intermediate/pinmem_nonblock.html"


# ---------------------------------------------------------------- host memory

def parse_meminfo(text: str) -> dict[str, int]:
    """``/proc/meminfo`` text to {field: bytes}. Lines without a number are skipped.

    Values given in kB (all memory fields) are converted to bytes; counters without a
    unit (HugePages_Total ...) are kept as they are.
    """
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, sep, rest = line.partition(":")
        parts = rest.split()
        if not sep or not parts:
            continue
        try:
            value = int(parts[0])
        except ValueError:
            continue
        unit = parts[1].lower() if len(parts) > 1 else ""
        out[name.strip()] = value * 1024 if unit == "kb" else value
    return out


def host_available_bytes(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """Host memory available to new allocations without swapping (``MemAvailable``), in bytes.

    Returns None where ``/proc/meminfo`` is missing or has no ``MemAvailable`` (macOS,
    Windows, very old kernels): the callers then cannot check and go ahead.
    """
    try:
        return parse_meminfo(meminfo.read_text()).get("MemAvailable")
    except OSError:
        return None


def check_host_fits(name: str, nbytes: int, *, fraction: float = 0.5, available: int | None = None) -> None:
    """Reject a host-memory footprint that would crowd the machine.

    Pinned pages cannot be swapped out, and on a shared host they take memory from every
    other process, so experiments stay within ``fraction`` of what is available now.

    Args:
        name: the parameter that sets the size, for the message.
        nbytes: host bytes the experiment keeps at once (pageable plus pinned).
        fraction: share of ``MemAvailable`` that may be used, in (0, 1].
        available: bytes available (default: read ``/proc/meminfo``; None there: no check).

    Raises:
        ValueError: ``nbytes`` is negative or larger than allowed, naming ``name``.
    """
    if nbytes < 0:
        raise ValueError(f"{name} must give a non-negative size, got {nbytes} bytes")
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    avail = host_available_bytes() if available is None else available
    if avail is None:
        return
    allowed = int(avail * fraction)
    if nbytes > allowed:
        raise ValueError(
            f"{name} needs {nbytes / MiB:.0f} MiB of host memory, but this machine has "
            f"{avail / MiB:.0f} MiB available and experiments use at most {fraction:.0%} of it "
            f"({allowed / MiB:.0f} MiB); choose a smaller {name}"
        )


# ---------------------------------------------------------------- sizes

def next_pow2(nbytes: int) -> int:
    """The block size the host caching allocator uses for a request of ``nbytes``.

    Requests are rounded up to the next power of two (0 stays 0: no block). Raises
    ValueError for a negative size.
    """
    if isinstance(nbytes, bool) or not isinstance(nbytes, int):
        raise ValueError(f"nbytes must be an integer number of bytes, got {nbytes!r}")
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    if nbytes == 0:
        return 0
    return 1 << (nbytes - 1).bit_length()


# The usable rate of one PCIe lane in one direction, GB/s (1e9 B), after line encoding:
# 8b/10b for generations 1-2, 128b/130b for 3-5, FLIT mode for 6.
PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}


def pcie_peak_gbps(gen: int, width: int) -> float:
    """Peak one-direction bandwidth of a PCIe link in GB/s (e.g. Gen5 x16 -> 63.0).

    Real copies reach about 80-90 % of it (packet headers, DMA set-up).

    Raises:
        ValueError: an unknown generation or a width that is not 1, 2, 4, 8 or 16.
    """
    if gen not in PCIE_LANE_GBPS:
        raise ValueError(f"gen must be one of {sorted(PCIE_LANE_GBPS)}, got {gen!r}")
    if width not in (1, 2, 4, 8, 16):
        raise ValueError(f"width must be 1, 2, 4, 8 or 16 lanes, got {width!r}")
    return round(PCIE_LANE_GBPS[gen] * width, 1)


def query_pcie_link(timeout_s: float = 10.0) -> dict[str, Any] | None:
    """The GPU's PCIe link as ``nvidia-smi`` reports it, or None where it cannot be read.

    Uses ``pcie.link.gen.max`` and ``pcie.link.width.max`` (the best link this GPU and
    this machine support; the *current* generation drops while the GPU idles). With
    several GPUs the first one is reported.
    """
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=pcie.link.gen.max,pcie.link.width.max", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=timeout_s, check=True,
        ).stdout.strip().splitlines()
        gen, width = (int(x) for x in out[0].split(","))
        return {"kind": "PCIe", "gen": gen, "width": width, "peak_gbps": pcie_peak_gbps(gen, width)}
    except Exception:  # no permission, an unexpected format, a non-PCIe GPU: the plot simply has no peak line
        return None


# ---------------------------------------------------------------- torch-version differences

@dataclasses.dataclass(frozen=True)
class HostCacheCall:
    """How this torch empties the pinned host cache.

    Attributes:
        name: the call as the reader would type it, or None when there is none.
        call: the function, or None.
        note: what the call is (public or private, which releases) or why there is none.
    """

    name: str | None
    call: Callable[[], Any] | None
    note: str


def find_empty_host_cache(torch_module: Any = torch) -> HostCacheCall:
    """Detect the call that returns cached pinned blocks to the driver.

    ``torch.accelerator.empty_host_cache()`` is public and device-generic (torch 2.12+);
    ``torch._C._host_emptyCache()`` is private and CUDA-only (torch 2.5 to today).
    ``torch.cuda.empty_cache()`` is *not* one of them: it releases device memory only.
    """
    acc = getattr(torch_module, "accelerator", None)
    public = getattr(acc, "empty_host_cache", None) if acc is not None else None
    if callable(public):
        return HostCacheCall("torch.accelerator.empty_host_cache()", public,
                             "public, device-generic (torch 2.12 and newer)")
    private = getattr(getattr(torch_module, "_C", None), "_host_emptyCache", None)
    if callable(private):
        return HostCacheCall("torch._C._host_emptyCache()", private,
                             "private and CUDA-only (torch 2.5 to 2.11; "
                             "torch.accelerator.empty_host_cache() replaces it from 2.12)")
    version = getattr(torch_module, "__version__", "?")
    return HostCacheCall(None, None,
                         f"torch {version} has no call that empties the pinned host cache "
                         "(torch._C._host_emptyCache arrived in 2.5, torch.accelerator.empty_host_cache "
                         "in 2.12): cached pinned blocks stay until the process exits")


def empty_host_cache(torch_module: Any = torch) -> str:
    """Release every cached (free, event-complete) pinned block; return the call used.

    Blocks still held by tensors, or waiting on a copy's event, are left alone.

    Raises:
        RuntimeError: this torch has no such call (the message says which versions do).
    """
    found = find_empty_host_cache(torch_module)
    if found.call is None:
        raise RuntimeError(found.note)
    found.call()
    return str(found.name)


def host_stats(torch_module: Any = torch) -> dict[str, Any] | None:
    """``torch.cuda.host_memory_stats()`` as a dict, or None where this torch lacks it."""
    fn = getattr(getattr(torch_module, "cuda", None), "host_memory_stats", None)
    return dict(fn()) if callable(fn) else None


def stats_naming(stats: Mapping[str, Any]) -> str:
    """'owned=allocated_bytes' (torch 2.11 and newer) or 'owned=reserved_bytes' (older releases).

    Older releases report the bytes the allocator owns as ``reserved_bytes`` and the bytes
    handed out as ``allocated_bytes``; from 2.11 ``allocated_bytes`` is what it owns
    (handed out plus cached) and ``active_bytes`` what is handed out.
    """
    if "allocations.current" in stats or "reserved_bytes.current" not in stats:
        return "owned=allocated_bytes"
    return "owned=reserved_bytes"


def owned_bytes(stats: Mapping[str, Any]) -> int:
    """Bytes of pinned blocks the host allocator owns (handed out + cached), any naming.

    Raises:
        KeyError: neither naming's key is present.
    """
    key = "allocated_bytes.current" if stats_naming(stats) == "owned=allocated_bytes" else "reserved_bytes.current"
    return int(stats[key])


@dataclasses.dataclass(frozen=True)
class Feature:
    """One version-dependent feature: whether this torch has it, and what to do otherwise."""

    name: str
    available: bool
    note: str


def pinned_features(version: tuple[int, int] | None = None, torch_module: Any = torch) -> list[Feature]:
    """What this torch offers around pinned memory, each with a note for the reader.

    Args:
        version: (major, minor) to judge version-gated items by; default the installed torch.
        torch_module: the module to probe for calls (tests pass a stand-in).
    """
    v = version or torch_version()
    empty = find_empty_host_cache(torch_module)
    has_stats = callable(getattr(getattr(torch_module, "cuda", None), "host_memory_stats", None))
    feats = [
        Feature("empty the pinned host cache", empty.call is not None,
                f"{empty.name}: {empty.note}" if empty.call else empty.note),
        Feature("torch.cuda.host_memory_stats()", has_stats,
                "owned bytes, cudaHostAlloc/cudaFreeHost counts and times" if has_stats else
                "not in this torch: watch the process's memory instead (RSS, /proc/<pid>/status)"),
        Feature("trustworthy active_bytes / active_requests counters", False,
                "on 2.11 they did not drop when a block without pending copies was freed; fixes were "
                "proposed upstream (pytorch PRs #169561, #182404) but are not verified here: read "
                "allocated_bytes and num_host_alloc / num_host_free instead"),
        Feature("host private pools for CUDA graphs", v >= (2, 11),
                "pinned blocks allocated while a graph captures are kept for the graph" if v >= (2, 11) else
                "before 2.11 you must keep every pinned tensor a graph reads alive yourself"),
    ]
    for opt in KNOWN_OPTIONS.values():
        if opt.name.startswith("pinned_"):
            ok = v >= opt.since
            feats.append(Feature(f"PYTORCH_CUDA_ALLOC_CONF={opt.name}", ok,
                                 opt.note if ok else f"{opt.note} (needs torch >= {opt.since[0]}.{opt.since[1]})"))
    return feats


def features_text(version: tuple[int, int] | None = None, torch_module: Any = torch, *,
                  width: int | None = None) -> str:
    """:func:`pinned_features` as text, one line per feature.

    Args:
        width: wrap each feature to this many characters, continuation lines indented (a
            terminal). By default lines are not wrapped: a page or notebook wraps them to
            its own width, and a second wrap at a fixed width leaves ragged lines there.
    """
    import textwrap

    v = version or torch_version()
    lines = [f"torch {v[0]}.{v[1]}:"]
    for f in pinned_features(v, torch_module):
        line = f"[{'yes' if f.available else 'no '}] {f.name}: {f.note}"
        lines.append(textwrap.fill(line, width=width, initial_indent="  ", subsequent_indent="        ")
                     if width else "  " + line)
    return "\n".join(lines)


# ---------------------------------------------------------------- a model of the host cache

class HostCacheModel:
    """What the pinned host caching allocator owns, step by step (sizes only, no events).

    Rules (``CachingHostAllocator.h``): a request gets a block of the next power of two;
    a freed block without pending copies goes back to a free list and stays owned; a
    request first takes a cached block (``exact_buckets``: only from its own power-of-two
    bucket, as torch 2.6 and newer do; otherwise the smallest cached block at least as
    large as the *unrounded* request, as torch 2.4 did); blocks are never split or
    merged; only emptying the host cache returns cached blocks to the driver.
    """

    def __init__(self, *, exact_buckets: bool = True) -> None:
        self.exact_buckets = exact_buckets
        self.live: dict[str, int] = {}
        self.cached: list[int] = []
        self.num_host_alloc = 0
        self.num_host_free = 0

    @property
    def owned(self) -> int:
        """Bytes owned: live blocks plus cached blocks."""
        return sum(self.live.values()) + sum(self.cached)

    def pin(self, name: str, nbytes: int) -> bool:
        """Allocate ``nbytes`` under ``name``; return True when a new block was created.

        Raises:
            ValueError: ``name`` is already live, or ``nbytes`` is not positive.
        """
        if name in self.live:
            raise ValueError(f"{name!r} is already allocated")
        if nbytes <= 0:
            raise ValueError(f"nbytes must be > 0, got {nbytes}")
        size = next_pow2(nbytes)
        fits = [b for b in self.cached if b == size] if self.exact_buckets else [b for b in self.cached if b >= nbytes]
        if fits:
            block = min(fits)
            self.cached.remove(block)
            self.live[name] = block
            return False
        self.live[name] = size
        self.num_host_alloc += 1
        return True

    def free(self, name: str) -> None:
        """Drop ``name``: its block is cached, still owned. Raises KeyError for an unknown name."""
        self.cached.append(self.live.pop(name))

    def empty_host_cache(self) -> None:
        """Return every cached block to the driver (live blocks stay)."""
        self.num_host_free += len(self.cached)
        self.cached.clear()


# Steps: ("pin", name, units), ("del", name), ("del_all",), ("empty_device",), ("empty_host",).
LIFECYCLE_STEPS: tuple[tuple[Any, ...], ...] = (
    ("pin", "a", 3), ("pin", "b", 3), ("pin", "c", 5), ("del", "a"), ("pin", "d", 2), ("pin", "e", 3),
    ("del_all",), ("empty_device",), ("empty_host",),
)


def step_label(step: Sequence[Any], unit_mib: int = 1) -> str:
    """Readable label of a lifecycle step, e.g. 'a = pin 3 MiB'."""
    kind = step[0]
    if kind == "pin":
        return f"{step[1]} = pin {step[2] * unit_mib} MiB"
    if kind == "del":
        return f"del {step[1]}"
    return {"del_all": "del all", "empty_device": "torch.cuda.empty_cache()",
            "empty_host": "empty host cache"}[kind]


def simulate_lifecycle(steps: Sequence[Sequence[Any]] = LIFECYCLE_STEPS, *, unit_bytes: int = MiB,
                       exact_buckets: bool = True) -> list[dict[str, int]]:
    """Owned bytes and driver calls after each step, from :class:`HostCacheModel`.

    Returns one dict per step: ``owned_bytes``, ``num_host_alloc``, ``num_host_free``.

    Raises:
        ValueError: an unknown step kind.
    """
    model = HostCacheModel(exact_buckets=exact_buckets)
    out = []
    for step in steps:
        kind = step[0]
        if kind == "pin":
            model.pin(step[1], int(step[2] * unit_bytes))
        elif kind == "del":
            model.free(step[1])
        elif kind == "del_all":
            for name in list(model.live):
                model.free(name)
        elif kind == "empty_device":
            pass  # torch.cuda.empty_cache() releases device blocks only
        elif kind == "empty_host":
            model.empty_host_cache()
        else:
            raise ValueError(f"unknown lifecycle step {kind!r}")
        out.append({"owned_bytes": model.owned, "num_host_alloc": model.num_host_alloc,
                    "num_host_free": model.num_host_free})
    return out
