"""The allocator doctor: replay a PyTorch memory snapshot exactly and answer "what would my run
have done under other allocator settings?".

A tool package of its own, beside the chapters: it imports neither torch, numpy nor matplotlib
(the figure imports matplotlib when it is drawn), so it runs on a laptop, in CI and in the
browser. Chapter 1 imports it; it imports no chapter. Its parts, in the order data flows, each
importing only the parts before it:

* :mod:`.errors` — what it raises for bad input (:class:`InputError` and its kinds);
* :mod:`.model` — the one model of the caching allocator: the size rules
  (:mod:`.model.rules`, citing the rules file ``RULES.md`` that ships beside them) and the
  allocator of one device (:mod:`.model.engine`), whose state only it touches;
* :mod:`.reading` — a file becomes a :class:`Trace`: the one restricted, bounded loader of
  snapshots (``_dump_snapshot`` pickles of protocols 0-5, gzip'd or not, JSON, the compact
  form), no code runs, every limit checked before the memory is spent;
* :mod:`.replaying` — a Trace becomes a :class:`Run`: the exact replay, checked event by event,
  with the state before the recording and the pool attribution as its collaborators, and the
  request log the what-ifs run again;
* :mod:`.answers` — a Run becomes what the reader reads: the what-ifs (exact, or a range),
  ``--suggest``, the OOM explanation, :func:`doctor` and its :class:`Report` (with a progress
  hook), the figure;
* :mod:`.cli` — ``python -m experiments doctor``;
* :mod:`.lab` — the GPU programs that hold the doctor to what the GPU did: the only part that
  imports torch, never imported by the rest and never shipped to the browser.
"""
from .model.rules import AllocatorConfig, round_size  # noqa: F401
from .model.engine import Engine, EngineOutOfMemory  # noqa: F401
from .errors import InputError, SnapshotError  # noqa: F401
from .reading.loader import Limits, load  # noqa: F401
from .reading.trace import Trace, compact_snapshot, read  # noqa: F401
from .replaying.run import Run  # noqa: F401
from .replaying.replay import replay  # noqa: F401
from .answers.whatif import WhatIf, what_if  # noqa: F401
from .answers.progress import Step  # noqa: F401
from .answers.report import Report, doctor  # noqa: F401

__all__ = ["AllocatorConfig", "Engine", "EngineOutOfMemory", "InputError", "Limits", "Report", "Run", "SnapshotError",
           "Step", "Trace", "WhatIf", "compact_snapshot", "doctor", "load", "read", "replay", "round_size", "what_if"]
