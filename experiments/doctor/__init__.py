"""The allocator doctor: replay a PyTorch memory snapshot exactly and answer "what would my run
have done under other allocator settings?".

A tool package of its own, beside the chapters: it imports neither torch, numpy nor matplotlib
(the figure imports matplotlib when it is drawn), so it runs on a laptop, in CI and in the
browser. Chapter 1 imports it; it imports no chapter. Its modules, in the order data flows:

* :mod:`.rules` — the caching allocator's rules, one function per C++ function they follow;
  the rules file they cite ships beside them (``RULES.md``);
* :mod:`.engine` — the allocator of one device built on those rules (streams, private pools,
  a cap and the out-of-memory path, expandable segments);
* :mod:`.trace` — reading a snapshot (``_dump_snapshot`` pickle or the compact JSON form)
  into a normalised trace, with a restricted loader that runs no code;
* :mod:`.replay` — the exact replay, checked event by event against the trace;
* :mod:`.whatif` — the same requests under other settings or a cap;
* :mod:`.report` — :func:`doctor` and its :class:`Report`; :mod:`.figure` draws it;
* :mod:`.cli` — ``python -m experiments doctor``.
"""
from .rules import AllocatorConfig, round_size  # noqa: F401
from .engine import Engine, EngineOutOfMemory  # noqa: F401
from .trace import SnapshotError, Trace, compact_snapshot, load, read  # noqa: F401
from .replay import Run, replay  # noqa: F401
from .whatif import what_if  # noqa: F401
from .report import Report, doctor  # noqa: F401

__all__ = ["AllocatorConfig", "Engine", "EngineOutOfMemory", "Report", "Run", "SnapshotError", "Trace",
           "compact_snapshot", "doctor", "load", "read", "replay", "round_size", "what_if"]
