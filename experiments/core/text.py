"""Small text helpers for messages: numbers people can read, and 'did you mean'."""
from __future__ import annotations

import difflib
from typing import Iterable


def number(x: float) -> str:
    """1024 -> '1024', 536870912.0 -> '536,870,912', 0.5 -> '0.5'."""
    if float(x).is_integer():
        return f"{int(x):,}" if abs(x) >= 10_000 else str(int(x))
    return f"{x:g}"


def close_names(name: str, known: Iterable[str]) -> str:
    """" (did you mean 'x'?)" when ``name`` is a near miss of one of ``known``, else ''."""
    match = difflib.get_close_matches(name, list(known), n=1, cutoff=0.75)
    return f" (did you mean {match[0]!r}?)" if match else ""
