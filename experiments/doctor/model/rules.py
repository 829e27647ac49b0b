"""The rules of PyTorch's CUDA caching allocator, as pure functions: settings, sizes, splits.

Each rule is written once here and named after the C++ function of
``c10/cuda/CUDACachingAllocator.cpp`` (torch 2.11) it follows, as written down in the
rules file that ships beside this module (``experiments/doctor/RULES.md``; ``§A.2`` etc.
below are its sections): requests are rounded to 512 B (or to power-of-two divisions),
requests of at most 1 MiB use the small pool, a new segment is 2 MiB, 20 MiB or the request
rounded to 2 MiB, a block is split when the remainder is worth keeping, and with
``expandable_segments`` 2 MiB (small) or 20 MiB (large) pages are mapped on demand.

The one allocator that applies them is :class:`experiments.doctor.model.engine.Engine`. This
module imports neither torch, numpy nor matplotlib. Sizes are in bytes throughout.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from ...core.units import MiB


MIN_BLOCK_SIZE = 512            # every request is rounded up to a multiple of this
SMALL_SIZE = 1 * MiB            # rounded requests up to and including this use the small pool
SMALL_BUFFER = 2 * MiB          # size of a small-pool segment, and its expandable page
MIN_LARGE_ALLOC = 10 * MiB      # large requests below this get a whole large buffer
LARGE_BUFFER = 20 * MiB         # that buffer; also the default large expandable page
ROUND_LARGE = 2 * MiB           # larger requests get a segment rounded up to this
ROUNDUP_INTERVALS = 16          # roundup_power2_divisions has one entry per power of two from 1 MiB

STATE_ALLOCATED = "active_allocated"
STATE_FREE = "inactive"
DEFAULT_POOL = (0, 0)           # the pool id of the default pools (private pools: MemPools, CUDA graphs)
H200_TOTAL_MEMORY = 150_109_880_320   # totalGlobalMem of the lab H200 (RULES.md §I): the default device


# ----------------------------------------------------------------------------- settings

def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def parse_roundup_divisions(value: int | str | Sequence[int]) -> tuple[int, ...]:
    """The 16-entry table behind ``roundup_power2_divisions``.

    Args:
        value: one number N (0, 1 or a power of two) for every size; a string such as
            '[256:1,512:2,1024:4,>:8]' (keys are powers of two in MiB, '>' covers every
            interval after the last listed one; the first entry also covers every
            smaller size); or an explicit sequence of 16 numbers.

    Entry i applies to rounded sizes in [2**(20+i), 2**(21+i)) bytes; entry 0 also covers
    everything below 2 MiB and entry 15 everything above 32 GiB. This follows the parser of
    torch 2.11 (RULES.md §A.2); older releases let '>' overwrite the last entry.
    A list that starts with '>' leaves entry 0 (sizes below 2 MiB) unset.

    Raises:
        ValueError: a division that is not 0 or a power of two, a key that is not a power
            of two, or a malformed string.
    """
    def division(v: Any, where: str) -> int:
        try:
            d = int(v)
        except (TypeError, ValueError):
            raise ValueError(f"roundup_power2_divisions: {where} must be an integer, got {v!r}") from None
        if d < 0 or (d > 1 and not _is_power_of_two(d)):
            raise ValueError(f"roundup_power2_divisions: {where} must be 0, 1 or a power of two, got {d}")
        return d

    if isinstance(value, bool):
        raise ValueError(f"roundup_power2_divisions must be a number or a list, got {value!r}")
    if isinstance(value, int):
        return (division(value, "the division"),) * ROUNDUP_INTERVALS
    if isinstance(value, str):
        text = value.strip()
        if not (text.startswith("[") and text.endswith("]")):
            return (division(text, "the division"),) * ROUNDUP_INTERVALS
        table = [0] * ROUNDUP_INTERVALS
        # '>' fills the intervals after the last listed one; with nothing listed before it,
        # "the last one" is interval 0, which stays unset: under '[>:2]' a 2,100 B request
        # still rounds to 2,560 B (torch 2.11 on the lab H200; c10/core/AllocatorConfig.cpp
        # parseRoundUpPower2Divisions starts its last index at 0 and fills from last + 1).
        first, last = True, 0
        for entry in filter(None, (e.strip() for e in text[1:-1].split(","))):
            key, sep, raw = entry.partition(":")
            if not sep:
                raise ValueError(f"roundup_power2_divisions: entry {entry!r} must look like SIZE_MB:N or >:N")
            d = division(raw.strip(), f"entry {entry!r}")
            key = key.strip()
            if key == ">":
                for i in range(last + 1, ROUNDUP_INTERVALS):
                    table[i] = d
                continue
            try:
                mb = int(key)
            except ValueError:
                raise ValueError(f"roundup_power2_divisions: size {key!r} must be a power of two in MiB") from None
            if not _is_power_of_two(mb):
                raise ValueError(f"roundup_power2_divisions: size {key!r} must be a power of two in MiB")
            index = min(mb.bit_length() - 1, ROUNDUP_INTERVALS - 1)
            if first:
                for i in range(index):
                    table[i] = d
                first = False
            table[index] = d
            last = index
        return tuple(table)
    table = tuple(division(v, f"entry {i}") for i, v in enumerate(value))
    if len(table) != ROUNDUP_INTERVALS:
        raise ValueError(f"roundup_power2_divisions needs {ROUNDUP_INTERVALS} entries, got {len(table)}")
    return table


# Recorded options that do not change where device blocks go: accepted, and named in a warning
# line (pinned-memory options, the lock around cudaMalloc, graph-capture reuse of record_stream
# blocks: RULES.md §F; the option tables of the 2.11-2.14 wheels).
NOT_PLACEMENT = frozenset({
    "release_lock_on_cudamalloc", "release_lock_on_hipmalloc", "pinned_use_cuda_host_register",
    "pinned_use_hip_host_register", "pinned_num_register_threads", "pinned_use_background_threads",
    "pinned_reserve_segment_size_mb", "pinned_max_round_threshold_mb", "pinned_max_cached_size_mb",
    "pinned_free_catch_all", "graph_capture_record_stream_reuse"})


@dataclasses.dataclass(frozen=True)
class AllocatorConfig:
    """The allocator settings the model follows (``PYTORCH_CUDA_ALLOC_CONF``), in bytes.

    Attributes:
        expandable_segments: one growing virtual range per pool instead of one
            ``cudaMalloc`` per segment.
        max_split_size: blocks at least this large are never split, and requests below it
            never take them; None means no limit (the default).
        max_non_split_rounding: how much larger than a request (>= max_split_size) an
            unsplit cached block may be; None (the default) follows ``large_segment_size``,
            as torch >= 2.11 does (its parser sets it from large_segment_size_mb).
        roundup_divisions: the 16-entry table of :func:`parse_roundup_divisions`.
        garbage_collection_threshold: fraction (0-1) of the memory cap above which old
            cached blocks are released before a new segment is made; 0 disables it.
        large_segment_size: segment for 1-10 MiB requests, and the large expandable page.
        throw_on_cudamalloc_oom: torch 2.12+: with a memory fraction, a segment the cap
            refuses is an out-of-memory error at once (no release of cached blocks, no retry).
        memory_fraction: ``per_process_memory_fraction`` (a cap of that fraction of the device's
            memory, which the doctor is told separately), or None.

    Bounds are torch's own (``AcceleratorAllocatorConfig`` of 2.11-2.14): large_segment_size
    above 10 MiB; max_split_size and max_non_split_rounding at least large_segment_size.
    """

    expandable_segments: bool = False
    max_split_size: int | None = None
    max_non_split_rounding: int | None = None
    roundup_divisions: tuple[int, ...] = (0,) * ROUNDUP_INTERVALS
    garbage_collection_threshold: float = 0.0
    large_segment_size: int = LARGE_BUFFER
    throw_on_cudamalloc_oom: bool = False
    memory_fraction: float | None = None

    def __post_init__(self) -> None:
        if self.large_segment_size <= MIN_LARGE_ALLOC:
            raise ValueError(f"large_segment_size_mb must be > 10 (MiB), got {self.large_segment_size / MiB:g} MiB")
        if self.max_split_size is not None and self.max_split_size < self.large_segment_size:
            raise ValueError(f"max_split_size_mb must be >= {self.large_segment_size // MiB} (MiB, large_segment_size_mb), "
                             f"got {self.max_split_size / MiB:g}")
        if self.max_non_split_rounding is None:
            object.__setattr__(self, "max_non_split_rounding", self.large_segment_size)
        elif self.max_non_split_rounding < self.large_segment_size:
            raise ValueError(f"max_non_split_rounding_mb must be >= {self.large_segment_size // MiB} (MiB, "
                             f"large_segment_size_mb), got {self.max_non_split_rounding / MiB:g}")
        if not 0 <= self.garbage_collection_threshold < 1:
            raise ValueError(f"garbage_collection_threshold must be in [0, 1), got {self.garbage_collection_threshold}")
        if self.memory_fraction is not None and not 0 <= self.memory_fraction <= 1:
            raise ValueError(f"per_process_memory_fraction must be in [0, 1], got {self.memory_fraction}")
        object.__setattr__(self, "roundup_divisions", parse_roundup_divisions(self.roundup_divisions))

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any] | str | None, *, lenient: bool = False) -> "AllocatorConfig":
        """Build from allocator settings as a dict or a ``PYTORCH_CUDA_ALLOC_CONF`` string.

        Options that do not change device block placement (:data:`NOT_PLACEMENT`) are
        accepted and ignored (:func:`unmodelled_options` names them). ``lenient``: options the
        doctor does not know at all are ignored too (a recorded snapshot: torch accepted them,
        so they are newer than the doctor, or another build's); otherwise they are an error.

        Raises:
            ValueError: an unknown option (not lenient), a bad value or one out of torch's
                bounds, or ``backend:cudaMallocAsync`` (a different allocator, which places
                blocks otherwise and is not modelled).
        """
        from ...core.alloc_conf import KNOWN_OPTIONS, _convert, _split_top_level

        if settings is None:
            return cls()
        if isinstance(settings, Mapping) and "PYTORCH_CUDA_ALLOC_CONF" in settings:
            # a snapshot's allocator_settings: the string it holds is what the allocator parsed
            # (experiments.doctor.reading.trace.config_from_snapshot also reads the parsed values)
            settings = str(settings["PYTORCH_CUDA_ALLOC_CONF"] or "")
            if not settings:
                return cls()
        if isinstance(settings, str):
            items: dict[str, Any] = {}
            for part in _split_top_level(settings):
                name, sep, raw = part.partition(":")
                if not sep:
                    raise ValueError(f"allocator setting {part!r} must look like name:value")
                name = name.strip()
                opt = KNOWN_OPTIONS.get(name)
                if opt is None:
                    if not lenient:
                        from ...core.alloc_conf import parse
                        parse(part)                 # the error that names the known options
                    continue
                items[name] = _convert(opt, raw.strip())
        else:
            items = dict(settings)
        kw: dict[str, Any] = {}
        for name, value in items.items():
            if name not in KNOWN_OPTIONS:
                if lenient:
                    continue
                raise ValueError(f"unknown allocator option {name!r}; known options: {sorted(KNOWN_OPTIONS)}")
            if name == "expandable_segments":
                if not isinstance(value, bool):
                    raise ValueError(f"expandable_segments must be True or False, got {value!r}")
                kw["expandable_segments"] = value
            elif name == "max_split_size_mb":
                kw["max_split_size"] = _mib_option(name, value) * MiB
            elif name == "max_non_split_rounding_mb":
                kw["max_non_split_rounding"] = _mib_option(name, value) * MiB
            elif name == "large_segment_size_mb":
                kw["large_segment_size"] = _mib_option(name, value) * MiB
            elif name == "roundup_power2_divisions":
                kw["roundup_divisions"] = parse_roundup_divisions(value)
            elif name == "garbage_collection_threshold":
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
                    raise ValueError(f"garbage_collection_threshold must be in (0, 1), got {value!r}")
                kw["garbage_collection_threshold"] = float(value)
            elif name == "throw_on_cudamalloc_oom":
                if not isinstance(value, bool):
                    raise ValueError(f"throw_on_cudamalloc_oom must be True or False, got {value!r}")
                kw["throw_on_cudamalloc_oom"] = value
            elif name == "per_process_memory_fraction":
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
                    raise ValueError(f"per_process_memory_fraction must be in [0, 1], got {value!r}")
                kw["memory_fraction"] = float(value)
            elif name == "backend":
                if value != "native":
                    raise ValueError("backend:cudaMallocAsync is another allocator (CUDA's own pool), which places "
                                     "blocks otherwise; the doctor models the native caching allocator only")
        return cls(**kw)


def unmodelled_options(settings: str) -> list[str]:
    """The option names of a settings string the doctor accepts but does not model: those that
    do not change where device blocks go (:data:`NOT_PLACEMENT`), and names it does not know
    (torch accepted them when it recorded: a newer release's, or another build's)."""
    from ...core.alloc_conf import KNOWN_OPTIONS, _split_top_level

    out = []
    for part in _split_top_level(settings or ""):
        name = part.partition(":")[0].strip()
        if name in NOT_PLACEMENT or name not in KNOWN_OPTIONS:
            out.append(name)
    return out


def _mib_option(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative whole number of MiB, got {value!r}")
    return value


DEFAULT = AllocatorConfig()


# ----------------------------------------------------------------------------- the rules
#
# One function per C++ function of c10/cuda/CUDACachingAllocator.cpp (torch 2.11), named after
# it. The rules that act on the allocator's state (get_free_block, alloc_found_block,
# free_block, try_merge_blocks, garbage_collect_cached_blocks, release_*_cached_blocks, the
# expandable-segment map/unmap) are methods of experiments.doctor.model.engine.Engine, also named
# after their C++ functions, and call these.

def round_size(nbytes: int, config: AllocatorConfig = DEFAULT) -> int:
    """The block size a request of ``nbytes`` asks the pools for (bytes).

    Up to 512 B becomes 512; otherwise the next multiple of 512, unless
    ``roundup_power2_divisions`` gives the request's power-of-two interval d > 1
    divisions and the request exceeds 512·d, in which case it rounds up to the next
    1/d step of that interval. C++ ``CUDACachingAllocator::round_size`` (RULES.md §A.2);
    the per-interval table is parsed as torch 2.11 does (:func:`parse_roundup_divisions`).

    Raises:
        ValueError: ``nbytes`` < 1 (a zero-byte tensor never reaches the allocator).
    """
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 1:
        raise ValueError(f"nbytes must be a whole number of bytes >= 1, got {nbytes!r}")
    if nbytes < MIN_BLOCK_SIZE:
        return MIN_BLOCK_SIZE
    index = min(max(nbytes.bit_length() - 1 - 20, 0), ROUNDUP_INTERVALS - 1)
    d = config.roundup_divisions[index]
    if d > 1 and nbytes > MIN_BLOCK_SIZE * d:
        if _is_power_of_two(nbytes):
            return nbytes
        floor = 1 << (nbytes.bit_length() - 1)
        step = floor // d
        if step == 0:
            return floor * 2
        return -(-nbytes // step) * step
    return -(-nbytes // MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE


def get_pool(rounded: int) -> str:
    """'small' for rounded sizes up to and including 1 MiB, else 'large': the half of the
    (default or private) pool a request goes to. C++ ``get_pool`` (RULES.md §A.3; which
    private pool, if any, is the caller's: the request's MemPool or capture, §D)."""
    return "small" if rounded <= SMALL_SIZE else "large"


def get_allocation_size(rounded: int, config: AllocatorConfig = DEFAULT) -> int:
    """Size of the segment a new ``cudaMalloc`` makes for a rounded request (bytes).

    2 MiB up to 1 MiB; 20 MiB (``large_segment_size``, torch 2.11+; the constant
    ``kLargeBuffer`` before) below 10 MiB; else the request rounded up to 2 MiB.
    With expandable segments this size is only used for the memory-cap check; pages are
    mapped instead (:func:`expandable_segment_size`). C++ ``get_allocation_size`` (RULES.md §A.4).
    """
    if rounded <= SMALL_SIZE:
        return SMALL_BUFFER
    if rounded < MIN_LARGE_ALLOC:
        return config.large_segment_size
    return -(-rounded // ROUND_LARGE) * ROUND_LARGE


def expandable_segment_size(pool: str, config: AllocatorConfig = DEFAULT) -> int:
    """The page an expandable segment maps at a time: 2 MiB (small pool) or
    ``large_segment_size`` (large; 20 MiB by default). C++ ``find_expandable_block``'s
    ``segment_size`` for the new ``ExpandableSegment`` (RULES.md §C.1).

    Raises:
        ValueError: ``pool`` is not 'small' or 'large'.
    """
    if pool not in ("small", "large"):
        raise ValueError(f"pool must be 'small' or 'large', got {pool!r}")
    return SMALL_BUFFER if pool == "small" else config.large_segment_size


def expandable_range_size(small: bool, total_memory: int, config: AllocatorConfig = DEFAULT) -> int:
    """Virtual range one expandable segment reserves: the page times
    ceil((total + total/8) / page) bytes, 1⅛ of the device. C++ ``ExpandableSegment``'s
    constructor (``numSegments(totalGlobalMem + totalGlobalMem / 8)``, RULES.md §C.1)."""
    page = expandable_segment_size("small" if small else "large", config)
    return page * (-(-(total_memory + total_memory // 8) // page))


def should_split(block_size: int, rounded: int, pool: str, config: AllocatorConfig = DEFAULT) -> bool:
    """Whether a free block of ``block_size`` serving ``rounded`` bytes keeps its tail free.

    Small pool, or expandable segments on: when the remainder is at least 512 B. Large pool
    otherwise: only when the remainder is more than 1 MiB and the request is below
    ``max_split_size``. C++ ``should_split`` (RULES.md §A.7, §A.13): before torch 2.9 it
    read the global ``expandable_segments()`` flag, from then ``is_expandable_segments_active``
    (the flag, unless the pool is a MemPool with an allocator of its own, which the doctor
    does not model: the same rule here); 2.11's ``MemPool(no_split=True)`` never splits
    (not modelled).

    Raises:
        ValueError: ``block_size`` smaller than ``rounded``.
    """
    remaining = block_size - rounded
    if remaining < 0:
        raise ValueError(f"a {block_size}-byte block cannot serve {rounded} bytes")
    if pool == "small" or config.expandable_segments:
        return remaining >= MIN_BLOCK_SIZE
    limit = config.max_split_size
    return remaining > SMALL_SIZE and (limit is None or rounded < limit)
