"""The allocator doctor: replay a PyTorch memory snapshot exactly and answer "what would my run
have done under other allocator settings?".

A tool package of its own, beside the chapters: it imports neither torch, numpy nor matplotlib
(the figure imports matplotlib when it is drawn), so it runs on a laptop, in CI and in the
browser. Chapter 1 imports it; it imports no chapter. Its modules, in the order data flows:

* :mod:`.rules` — the caching allocator's rules, one function per C++ function they follow;
  the rules file they cite ships beside them (``RULES.md``);
* :mod:`.engine` — the allocator of one device built on those rules (streams, private pools,
  a cap and the out-of-memory path, expandable segments);
* :mod:`.loader`, :mod:`.unpickle` and :mod:`.entries` — the one restricted, bounded loader
  of snapshots (``_dump_snapshot`` pickles of protocols 0-5, gzip'd or not, JSON, the compact
  form): no code runs, every limit is checked before the memory is spent, and a trace becomes
  columns (:mod:`.rows`);
* :mod:`.trace` — a loaded snapshot checked and normalised into a trace of columns;
* :mod:`.replay` — the exact replay, checked event by event against the trace, which keeps
  the requests it recovered (:mod:`.requestlog`);
* :mod:`.whatif` — the same requests under other settings or a cap;
* :mod:`.suggest` — ``--suggest``: a grid of settings, ranked; :mod:`.oom` — the OOM explanation;
* :mod:`.report` — :func:`doctor` and its :class:`Report`; :mod:`.figure` draws it;
* :mod:`.cli` — ``python -m experiments doctor``.
"""
from .rules import AllocatorConfig, round_size  # noqa: F401
from .engine import Engine, EngineOutOfMemory  # noqa: F401
from .loader import InputError, Limits, SnapshotError, load  # noqa: F401
from .trace import Trace, compact_snapshot, read  # noqa: F401
from .replay import Run, replay  # noqa: F401
from .whatif import what_if  # noqa: F401
from .report import Report, doctor  # noqa: F401

__all__ = ["AllocatorConfig", "Engine", "EngineOutOfMemory", "InputError", "Limits", "Report", "Run", "SnapshotError", "Trace",
           "compact_snapshot", "doctor", "load", "read", "replay", "round_size", "what_if"]
