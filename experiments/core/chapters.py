"""The book's chapters, declared once: the registry imports their modules, the command line
offers their numbers, and the recorded-file schema accepts exactly these chapter numbers."""
from __future__ import annotations

import dataclasses
import importlib


@dataclasses.dataclass(frozen=True)
class Chapter:
    """One chapter: its number in the book, its package (under ``experiments``), the prefix of
    its experiment and claim ids, and its title."""

    number: int
    module: str
    prefix: str
    title: str


CHAPTERS: tuple[Chapter, ...] = (
    Chapter(0, "calibration", "core", "How this book measures"),
    Chapter(1, "allocator", "alloc", "The caching allocator and fragmentation"),
    Chapter(2, "streams", "streams", "Cross-stream memory"),
    Chapter(3, "pinned", "pinned", "Pinned memory"),
    Chapter(4, "syncs", "syncs", "Hidden host-device syncs"),
)

NUMBERS: tuple[int, ...] = tuple(c.number for c in CHAPTERS)


@dataclasses.dataclass(frozen=True)
class Command:
    """A command-line subcommand that a chapter or a tool package provides: ``experiments.<module>``
    has ``add_parser(subparsers)``, imported only when the command is used (core imports no
    chapter)."""

    name: str
    module: str
    help: str


COMMANDS: tuple[Command, ...] = (
    Command("doctor", "doctor.cli", "replay a memory snapshot exactly and compare allocator settings"),
)


class ChapterImportError(ImportError):
    """A chapter module failed to import; the message names the chapter and the reason."""


def by_number(number: int) -> Chapter:
    """The chapter numbered ``number``. Raises ValueError naming the allowed numbers."""
    for c in CHAPTERS:
        if c.number == number:
            return c
    raise ValueError(f"chapter must be one of {list(NUMBERS)}, got {number!r}")


def load_all() -> None:
    """Import every chapter module, so that its experiments and claims are registered.

    Raises:
        ChapterImportError: a chapter's module (or something it imports) failed to import;
            a broken chapter is an error, not a chapter silently missing from the book.
    """
    for c in CHAPTERS:
        try:
            importlib.import_module(f"experiments.{c.module}")
        except Exception as e:  # any failure: the reader must see which chapter and why
            raise ChapterImportError(
                f"chapter {c.number} ({c.title}) failed to import: experiments.{c.module}: "
                f"{type(e).__name__}: {e}") from e
