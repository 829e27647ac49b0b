"""Errors said in one line, as the command lines print them: ``error: ...`` on stderr.

:class:`OneLineParser` is argparse with usage errors as one line and exit status 2 (argparse
prints the whole usage first); :func:`one_line` is an exception's message on one line. The
package's command line, the doctor's and the doctor page's worker all use them (the worker
turns the line into its answer instead of exiting: :meth:`OneLineParser.fail`). Imports
nothing heavy: the doctor runs where torch does not exist.
"""
from __future__ import annotations

import argparse
import sys
from typing import NoReturn


class OneLineParser(argparse.ArgumentParser):
    """An ``argparse.ArgumentParser`` whose usage errors are one line, ``error: PROG: message``,
    on stderr, with exit status 2."""

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        self.fail(f"error: {self.prog}: {message}")

    def fail(self, line: str) -> NoReturn:
        """Say ``line`` and stop (print it to stderr and exit 2; a subclass may raise instead)."""
        print(line, file=sys.stderr)
        raise SystemExit(2)


def one_line(e: BaseException) -> str:
    """The message of ``e`` with its white space folded onto one line (its type's name if empty)."""
    return " ".join(str(e).split()) or type(e).__name__


__all__ = ["OneLineParser", "one_line"]
