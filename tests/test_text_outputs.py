"""Text the pages print is wrapped once, by whatever shows it (issue #19).

The web book shows text outputs with ``white-space: pre-wrap`` and Colab and Jupyter wrap
long output lines too. Text that Python had already wrapped at 88 columns was wrapped a
second time there, at the column's width, and came out ragged (the out-of-memory message,
``pinned.features_text()``, ``describe_case_study()``, ``no_gpu_message()``). So paragraphs
leave Python as one line; only a terminal asks for a width. The browser side is in
tests/test_browser_reading.py.
"""
from __future__ import annotations

import re

import pytest

import experiments as ex
from experiments import allocator as al
from experiments import pinned, syncs
from experiments.pinned.model import pinned_features

from .booktools import ROOT


def _sentences_broken(text: str) -> list[str]:
    """Lines that end inside a sentence and whose next line continues it."""
    lines = text.splitlines()
    return [f"{a!r} / {b!r}" for a, b in zip(lines, lines[1:])
            if a.strip() and not re.search(r"[.:;!?)]$", a.rstrip()) and re.match(r"^[a-z(]", b)]


def test_pages_do_not_wrap_what_they_print():
    """No page calls textwrap: what it prints is wrapped by the page or the notebook."""
    used = [f"{p.name}:{n}" for p in sorted((ROOT / "book" / "src").glob("*.py"))
            for n, line in enumerate(p.read_text().splitlines(), 1) if "textwrap" in line]
    assert not used, f"pages that wrap their own output: {used}"


def test_the_oom_message_is_one_paragraph(recorded_mode):
    oom = ex.run("alloc.fragmentation_oom")
    text = al.oom_message(oom, "interleave")
    assert "\n" not in text and text.startswith("CUDA out of memory.") and len(text) > 300
    assert text == " ".join(oom["patterns"]["interleave"]["message"].split())


def test_the_case_study_description_breaks_lines_only_between_sentences(recorded_mode):
    text = syncs.describe_case_study(ex.run("syncs.case_study"))
    lines = text.splitlines()
    assert len(lines) == 4 and all(line.endswith(".") for line in lines), text


def test_the_detector_texts_are_not_wrapped(recorded_mode):
    assert "\n" not in syncs.no_gpu_message()
    report = syncs.find_hidden_syncs()
    head = report.splitlines()[0]
    assert head.startswith("Recorded on") and head.endswith(":") and not _sentences_broken(report), report


def test_features_text_has_one_line_per_feature():
    text = pinned.features_text()
    lines = text.splitlines()
    assert lines[0].startswith("torch ") and all(line.startswith("  [") for line in lines[1:])
    assert len(lines) == 1 + len(pinned_features())
    assert max(map(len, lines)) > 88, "the notes are long: a fixed width would have wrapped them"


@pytest.mark.parametrize("width", [60, 88])
def test_a_terminal_can_still_ask_for_a_width(width, recorded_mode):
    text = al.oom_message(ex.run("alloc.fragmentation_oom"), "interleave", width=width)
    assert max(len(line) for line in text.splitlines() if "https://" not in line) <= width
    assert all(len(line) <= width for line in pinned.features_text(width=width).splitlines())


def test_the_package_wraps_text_only_at_a_width_its_caller_gives():
    """``textwrap.fill``/``wrap`` in the package take the width from their caller (a
    terminal's), never a fixed one, except in figures, whose size is fixed in points."""
    import ast

    fixed = []
    for path in sorted((ROOT / "experiments").rglob("*.py")):
        if path.name == "plotting.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("fill", "wrap")
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "textwrap"):
                width = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "width"), None)
                if width is None or isinstance(width, ast.Constant):
                    fixed.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not fixed, f"text wrapped at a fixed width: {fixed}"
