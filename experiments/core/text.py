"""'Did you mean' for messages that reject a name. Numbers and sizes: :mod:`.units`."""
from __future__ import annotations

import difflib
from typing import Iterable




def close_names(name: str, known: Iterable[str]) -> str:
    """" (did you mean 'x'?)" when ``name`` is a near miss of one of ``known``, else ''."""
    match = difflib.get_close_matches(name, list(known), n=1, cutoff=0.75)
    return f" (did you mean {match[0]!r}?)" if match else ""
