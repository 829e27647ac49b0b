"""Numbers in the prose are never measurements typed by hand (issue #19).

A page's prose matched the lab H200's recording ("28.6 ms predicted against 26.9 ms
measured", "within about 7 %") and contradicted the reader's own table on the same page as
soon as they ran it live in Colab. Measured numbers now reach the reader only through
output the page computes from its result (the recording, or the reader's live run); the
prose points to that output.

This test reads every quantity with a unit in a page's prose (sizes, times, rates,
percentages, ratios; inline code and fenced code are code, not prose) and accepts it only if
it is

- a parameter of an experiment the page runs (``30 ms of GPU work``, ``64 MiB`` buffers):
  an input, the same on every GPU;
- in an exercise's statement: the exercise's inputs (its check computes the answer);
- listed below for the page, with the reason it cannot depend on the GPU: a rule of the
  allocator or an arithmetic consequence of rules and inputs, a figure quoted from a
  source (a post, the lab notes), a torch version.

A measurement typed into the prose is none of these, and fails the test with its line.
"""
from __future__ import annotations

import re

import pytest

from experiments.core.registry import get

from . import snippets as S

# Units of quantities a measurement could produce, normalized.
UNITS = {"B": "B", "bytes": "B", "byte": "B", "KiB": "KiB", "MiB": "MiB", "GiB": "GiB", "KB": "KB", "MB": "MB",
         "GB": "GB", "GB/s": "GB/s", "ms": "ms", "µs": "µs", "s": "s", "%": "%", "x": "x", "×": "x", "times": "x"}
QUANTITY = re.compile(r"(?<![\w.\-/=#])(\d+(?:[.,]\d+)*)(?:\s|&nbsp;)?(GB/s|bytes?|KiB|MiB|GiB|KB|MB|GB|ms|µs|s|B|%|x|×|times)"
                      r"(?![\w/])")

# What the allocator's rules fix, whatever the GPU (allocator-rules.md; CUDACachingAllocator.cpp).
RULES = {("B", 512), ("MiB", 1), ("MiB", 2), ("MiB", 10), ("MiB", 20), ("x", 1.125)}

# Per page: quantities that cannot depend on the GPU, with the reason.
ALLOWED: dict[str, dict[tuple[str, float], str]] = {
    "ch1_caching_allocator": {
        **{("MiB", v): "an allocation of the chapter's rule examples, or its rounding"
           for v in (0.5, 0.75, 1.5, 3, 5, 11, 12, 16, 19, 22, 24, 32, 100, 102, 128, 150, 160, 256)},
        ("KiB", 100): "a rule example", ("B", 1): "10 MiB - 1 B: the rounding rule", ("B", 3): "100 MiB + 3 B",
        ("B", 2): "the element size of bfloat16 and float16",
        ("MiB", 8): "the tail a 24 MiB tensor leaves in a 32 MiB segment (rules)",
        ("MiB", 80): "exercise 1.1's answer: four 20 MiB segments (rules)",
        ("MiB", 4): "the free tail of a 20 MiB segment after two 8 MiB tensors (rules)",
        ("MiB", 64): "the request of the out-of-memory experiment, 2 x 32 MiB activations",
        ("MiB", 352): "eleven 32 MiB segments (rules)", ("MiB", 416): "352 MiB cached + a 64 MiB segment (rules)",
        ("MiB", 176): "eleven free 16 MiB blocks (rules; the message quotes it)",
        ("MiB", 40): "10 x 4 MiB freed, or 33-39 MiB rounded to quarter steps (rules)",
        ("MiB", 39): "the knob's example (33 to 39 MiB)", ("MiB", 30): "the knob's example",
        **{("MiB", v): "the post's expandable-segments trace (rules)" for v in (100, 140)},
        **{("MiB", v): "the lab notes' bfloat16 figures, quoted once (seed-posts.md)" for v in (574, 194, 202)},
        ("GiB", 1): "the cap of alloc.doctor_snapshots' 'cap' program (experiments.doctor.lab.snapshots.CAP_BYTES)",
        ("MiB", 700): "the request of the 'cap' program that cannot fit (experiments.doctor.lab.snapshots._w_cap)",
        ("MiB", 650): "what the 'cap' program holds then: 15 x 30 MiB + 200 MiB (experiments.doctor.lab.snapshots._w_cap)",
    },
    "ch2_cross_stream": {
        ("MiB", 1024): "exercise 2.2's answer: 16 parked 64 MiB blocks (the queue model)",
        ("MiB", 2048): "32 parked 64 MiB blocks", ("MiB", 128): "two 64 MiB buffers",
        ("GiB", 1): "the memory cap of streams.memory_cap (1024 MiB)",
        ("x", 1.3): "the check's tolerance for the GPU time",
    },
    "ch3_pinned_memory": {
        ("GB", 1): "the unit's definition", ("KB", 64): "the post's GB200 threshold",
        ("MiB", 129.5): "the rounding example", ("MiB", 256): "129.5 MiB rounded to a power of two (rules)",
        ("GiB", 100): "the post's KV-cache example", ("GiB", 128): "the post's KV-cache example",
        ("GiB", 2.08): "exercise 3.2's input", ("GiB", 4): "2.08 GiB rounded to a power of two (rules)",
        **{("MiB", v): "exercise 3.3's script, sizes rounded to powers of two (rules)" for v in (2, 4, 8, 16, 18, 20)},
        ("GiB", 1): "the largest copy size of pinned.bandwidth and pin_cost", ("KiB", 4): "the smallest copy size",
        ("ms", 12): "the bursty GPU work: every fourth batch, 4 x 3 ms",
        ("MiB", 16): "the staging size of the loader check", ("ms", 200): "the loader check's queued work",
    },
    "ch4_hidden_syncs": {
        ("ms", 17.5): "exercise 4.1's answer: 1.5 + 8 x 2 ms (the queue model)",
        ("ms", 28): "exercise 4.1's answer: 8 x (1.5 + 2) ms (the queue model)",
        ("B", 12): "three float32 values", ("KB", 64): "the post's GB200 threshold",
        ("KiB", 32): "the size of a quick check described, not a figure measured",
        ("KiB", 64): "the smallest size of the sweep, and the detector's default threshold",
        ("MiB", 64): "the largest size of the sweep", ("MiB", 16): "the catalogue's larger tensor (4194304 x 4 B)",
    },
}


def _prose(page: str) -> list[tuple[int, str, bool]]:
    """(line, text, inside an exercise statement) of a page's prose, code spans and link
    targets removed."""
    path = S.ROOT / "book" / "src" / f"{page}.py"
    _, prose = S._blocks(S._markdown_lines(path))
    out, in_exercise = [], False
    for n, line in prose:
        if re.match(r"^`{3,}\{exercise\}", line):
            in_exercise = True
        elif in_exercise and re.match(r"^`{3,}\s*$", line):
            in_exercise = False
        text = re.sub(r"`[^`]*`", " ", line)
        text = re.sub(r"\]\([^)]*\)|https?://\S+", "]", text)
        out.append((n, text, in_exercise))
    return out


def _parameters(page: str) -> set[tuple[str, float]]:
    """(unit, value) of every parameter value of the experiments the page runs."""
    src = (S.ROOT / "book" / "src" / f"{page}.py").read_text()
    ids = set(re.findall(r"ex\.(?:run|panel)\(\s*\"([\w.]+)\"", src))
    out = set()
    for exp_id in ids:
        exp = get(exp_id)
        for p in exp.params:
            unit = UNITS.get(p.unit)
            if unit is None:
                continue
            values = {p.default, *(p.choices or ()), *(pt[p.name] for pt in exp.grid)}
            values |= {v for v in (p.min, p.max) if v is not None}
            out |= {(unit, float(v)) for v in values if isinstance(v, (int, float))}
            if p.unit == "KiB":
                out |= {("MiB", float(v) / 1024) for v in values if isinstance(v, (int, float))}
            if p.unit == "MiB":
                out |= {("GiB", float(v) / 1024) for v in values if isinstance(v, (int, float))}
    return out


def quantities(page: str) -> list[tuple[int, str, tuple[str, float], bool]]:
    out = []
    for n, text, in_exercise in _prose(page):
        for m in QUANTITY.finditer(text):
            if m.group(2) == "×" and re.match(r"\s*[\d(*]", text[m.end():]):
                continue  # a product (4096 × 8192), not a ratio
            value = float(m.group(1).replace(",", ""))
            out.append((n, m.group(0), (UNITS[m.group(2)], value), in_exercise))
    return out


PAGES = [p.stem for p in S.book_sources()]


@pytest.mark.parametrize("page", PAGES)
def test_no_measured_number_is_typed_into_the_prose(page):
    params, allowed = _parameters(page), ALLOWED.get(page, {})
    typed = [f"book/src/{page}.py:{n}: {text!r}" for n, text, q, in_exercise in quantities(page)
             if not in_exercise and q not in RULES and q not in params and q not in allowed]
    assert not typed, (f"{len(typed)} quantities in {page}'s prose are neither inputs, rules nor quoted sources; "
                       "if one is a measurement, print it from the page's result instead:\n" + "\n".join(typed))


@pytest.mark.parametrize("page", PAGES)
def test_quoted_figures_are_quoted_once(page):
    """A figure quoted from a source ('quoted once' above) appears where it is quoted; said
    again, it stands for the page's own result, which the page prints instead."""
    once = {q for q, why in ALLOWED.get(page, {}).items() if "quoted once" in why}
    lines: dict[tuple[str, float], list[int]] = {}
    for n, _, q, _ in quantities(page):
        if q in once:
            lines.setdefault(q, []).append(n)
    again = {q: ns for q, ns in lines.items() if len(ns) > 1}
    assert not again, f"{page}: quoted figures said more than once (lines): {again}"


@pytest.mark.parametrize("page", PAGES)
def test_every_allowed_quantity_is_still_there(page):
    """The list above stays honest: nothing on it that the page no longer says."""
    said = {q for _, _, q, _ in quantities(page)}
    stale = [f"{q}: {why}" for q, why in ALLOWED.get(page, {}).items() if q not in said]
    assert not stale, f"{page}: allowed but no longer in the prose: {stale}"


def test_the_reader_finds_the_quantities():
    """The scan sees the typed figures issue #19 found (so a broken scan cannot pass)."""
    import textwrap

    text = textwrap.dedent("""\
        comes within about 7 % and errs high (28.6 ms predicted against 26.9 ms measured);
        574 MiB smallest batch first, for a GiB thousands of times less, 2.5 GB/s, 1.32x faster
        """)
    found = [(UNITS[m.group(2)], float(m.group(1))) for m in QUANTITY.finditer(text)]
    assert found == [("%", 7), ("ms", 28.6), ("ms", 26.9), ("MiB", 574), ("GB/s", 2.5), ("x", 1.32)]
