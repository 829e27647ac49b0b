"""What the doctor raises for bad input: one family, so that the command line (and the page)
can tell the reader's mistake from a bug of the doctor's.

Everything wrong with what the user gave is an :class:`InputError` (a ``ValueError``) whose
message is one line naming what is wrong: a file that is not a snapshot (:class:`SnapshotError`,
:class:`SnapshotNotFoundError`), a trace no allocator can make (:class:`ImpossibleTraceError`),
a bad setting or option. Any other exception out of the doctor is a bug in it.
"""
from __future__ import annotations


class InputError(ValueError):
    """Something wrong with what the user gave the doctor (the message says what, in one line)."""


class SnapshotError(InputError):
    """The input is not a memory snapshot the doctor can read (the message says why)."""


class SnapshotNotFoundError(SnapshotError, FileNotFoundError):
    """The snapshot's path names no file (also a FileNotFoundError, as Python's open raises)."""


class ImpossibleTraceError(SnapshotError):
    """The trace describes something no allocator can do (a free of an address no segment
    holds, a zero-byte request): the message names the trace entry."""


class PickleRefused(ValueError):
    """A pickle names code, is malformed, or exceeds a limit; the message says which (the
    loader turns it into a :class:`SnapshotError` naming the file)."""


__all__ = ["ImpossibleTraceError", "InputError", "PickleRefused", "SnapshotError", "SnapshotNotFoundError"]
