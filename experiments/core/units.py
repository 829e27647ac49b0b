"""Units and the one way this package writes sizes and numbers.

Binary prefixes throughout, as PyTorch's allocator and its memory statistics count:
1 KiB = 1024 B, 1 MiB = 1024 KiB, 1 GiB = 1024 MiB. Time is in milliseconds (``_ms``).
"""
from __future__ import annotations

KiB = 2**10
MiB = 2**20
GiB = 2**30

# Within this many bytes of a whole MiB or GiB a size is written as that number plus or
# minus bytes: the allocator's rules (1 MiB small-pool limit, 2 MiB and 20 MiB segment
# sizes, the 10 MiB large-request boundary) hinge on exactly such boundaries.
_EXACT_WITHIN = 4096


def format_bytes(nbytes: float, *, digits: int = 4) -> str:
    """A size for people: '16 MiB', '1.5 MiB', '100 KiB', '1 MiB + 1 B', '2 MiB − 512 B', '1000 B'.

    Args:
        nbytes: a size in bytes (rounded to a whole number of bytes; may be negative).
        digits: significant digits of sizes that are not whole (3 for axis labels).

    Sizes within 4 KiB of a whole number of MiB or GiB are written exactly, as that number
    plus or minus bytes; others with up to ``digits`` significant digits.

    Raises:
        ValueError: ``digits`` below 1.
    """
    if digits < 1:
        raise ValueError(f"digits must be >= 1, got {digits}")
    nbytes = int(nbytes)
    if nbytes < 0:
        return "−" + format_bytes(-nbytes, digits=digits)
    for unit, scale in (("GiB", GiB), ("MiB", MiB)):
        whole = round(nbytes / scale)
        diff = nbytes - whole * scale
        if whole >= 1 and abs(diff) < _EXACT_WITHIN:
            if diff == 0:
                return f"{whole} {unit}"
            return f"{whole} {unit} {'+' if diff > 0 else '−'} {abs(diff)} B"
        if nbytes >= scale:
            value = nbytes / scale
            return f"{value:.{digits}g} {unit}" if value < 10**digits else f"{value:.0f} {unit}"
    if nbytes >= KiB:
        return f"{nbytes // KiB} KiB" if nbytes % KiB == 0 else f"{nbytes / KiB:.{digits}g} KiB"
    return f"{nbytes} B"


def memory_fraction(cap_bytes: float, total_bytes: int) -> float:
    """The share of a device's ``total_bytes`` that caps its allocator at ``cap_bytes``: what
    ``torch.cuda.set_per_process_memory_fraction`` takes, at most 1 (the whole device). The
    allocator then enforces ``int(fraction * total_bytes)`` bytes."""
    return min(1.0, cap_bytes / total_bytes)


def mib(nbytes: float) -> float:
    """Bytes to MiB (a float)."""
    return nbytes / MiB


def mib_figure(nbytes: float) -> float | int:
    """MiB for a table of figures: a whole number without a decimal point, else one decimal."""
    v = nbytes / MiB
    return int(v) if v == int(v) else round(v, 1)


def number(x: float) -> str:
    """A number for messages and labels: 1024 -> '1024', 536870912.0 -> '536,870,912', 0.5 -> '0.5'.

    Whole numbers of five digits or more get thousands separators; others keep up to six
    significant digits (``%g``).
    """
    if float(x).is_integer():
        return f"{int(x):,}" if abs(x) >= 10_000 else str(int(x))
    return f"{x:g}"
