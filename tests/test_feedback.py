"""Feedback that teaches without giving the answer away (issue 12).

For every exercise a sample of wrong answers, as students give them (the typical
mistakes the book names, and some arbitrary ones), tried twice as a reader would: the
feedback must not contain the expected value in any usual formatting, nor the right
option's text, in its message, its details or its repr (issue 16: ``repr()`` showed them);
it names the section with the rule, and after the second try points to the solution (in
the student edition, to the instructor). Expected values come from the solutions, the
lab GPU's recordings and the allocator's rules (the model).
"""
from __future__ import annotations

import math
import re

import pytest

import experiments as ex
from experiments import allocator as al
from experiments import pinned, streams, syncs
from experiments.core import checks as core_checks
from experiments.core import registry
from experiments.core.checks import EXERCISES, graded_feedback

MiB = 2**20


@pytest.fixture(autouse=True)
def _recorded(recorded_mode):
    core_checks._WRONG_TRIES.clear()


def forms(v: float) -> set[str]:
    """The ways a number shows up in text: 64, 64.0, 64.00, 1.6e+03 style cut-offs..."""
    out = {f"{v:g}", f"{v:.1f}", f"{v:.2f}", f"{v:.3g}", f"{v:.4g}"}
    if abs(v - round(v)) < 1e-9:
        out.add(str(int(round(v))))
    if abs(v) >= 10:
        out.add(f"{v:.0f}")
    return out


def leaks(message: str, value: float) -> list[str]:
    found = []
    for f in forms(value):
        if re.search(rf"(?<![\d.]){re.escape(f)}(?!\.?\d)", message):
            found.append(f)
    return found


def assert_teaches(check, args, expected, *, kwargs=None, allowed=()):
    """Try the wrong answer twice; neither message may contain an expected value that is not
    one of the student's own numbers (echoing a student's number gives nothing away)."""
    own = {float(a) for a in _numbers(args)} | set(allowed)
    first = check(*args, **(kwargs or {}))
    second = check(*args, **(kwargs or {}))
    assert first.correct is False and second.correct is False, (args, first)
    for fb in (first, second):
        for text in (fb.message, repr(fb), repr(dict(fb.details))):
            for value in expected:
                if isinstance(value, str):
                    assert value not in text, (args, value, text)
                elif not any(math.isclose(value, o, rel_tol=1e-9) for o in own):
                    echoed = set().union(*(forms(o) for o in own)) if own else set()
                    assert not set(leaks(text, value)) - echoed, (args, value, text)
    label = check.exercise_label
    assert f"'{EXERCISES[label].section}'" in first.message, first.message
    assert "solution" not in first.message.lower() and "exercise's solution" in second.message
    assert graded_feedback(core_checks.Feedback(False, "", first.details)).startswith("wrong")
    core_checks._WRONG_TRIES.clear()
    return first


def _numbers(args):
    for a in args:
        if isinstance(a, bool):
            continue
        if isinstance(a, (int, float)):
            yield a
        elif isinstance(a, dict):
            yield from _numbers(list(a.values()))


def test_every_exercise_is_declared_once_with_its_points_and_objective():
    registry.load_chapters()
    labels = sorted(EXERCISES)
    assert len(labels) == 23
    assert "ex-alloc-doctor" in labels  # exercise 1.6, declared like the others (issue 16)
    for e in EXERCISES.values():
        assert e.points > 0 and len(e.objective) > 30 and e.section and e.answers
        assert e.chapter == int({"alloc": 1, "streams": 2, "pinned": 3, "syncs": 4}[e.label.split("-")[1]])


def test_timeline_prediction():
    # the solution: 80 MiB (small first) and 64 MiB (large first)
    for wrong in [(128, 128), (160, 80), (144, 144), (64, 64), (100, 70), (80, 80), (60, 64)]:
        assert_teaches(al.check_timeline_prediction, wrong, [80, 64])


def test_oom_reading():
    r = ex.run("alloc.fragmentation_oom", mode="recorded")
    unallocated = r["patterns"]["interleave"]["figures"]["reserved_unallocated_bytes"] / MiB
    assert unallocated == 176  # the solution's figure
    right_text = "Yes: with the long-lived tensors packed together"
    for wrong in [(240, "group"), (100, "empty_cache"), (176, "expandable_segments"), (300, "max_split_size_mb:64")]:
        assert_teaches(al.check_oom_reading, wrong, [176, right_text])


def _free_sizes(segs):
    return [b["size"] for s in segs for b in s["blocks"] if b["state"] == "inactive"]


def test_frag_index_functions():
    from experiments.allocator.checks import _frag_cases

    def right(segs):  # the solution's index: 1 - largest free block / all free bytes, free = 'inactive'
        free = _free_sizes(segs)
        return 0.0 if not free else 1 - max(free) / sum(free)

    wrong = [lambda segs: 0.5,
             lambda segs: (lambda f: max(f) / sum(f) if f else 0.0)(_free_sizes(segs)),
             lambda segs: (lambda f: 1 - max(f) / sum(f) if f else 0.0)(
                 [b["size"] for s in segs for b in s["blocks"] if b["state"] != "active_allocated"])]
    for fn in wrong:
        fb = al.check_frag_index(fn)
        name = fb.details["case"]
        expected = right(dict(_frag_cases())[name])
        core_checks._WRONG_TRIES.clear()
        assert_teaches(al.check_frag_index, (fn,), [expected], allowed=[fb.details["answer"]])
    assert al.check_frag_index(right).correct is True


def test_reserved_function():
    # the rules (allocator-rules.md): expandable segments map 20 MiB pages for all tensors
    # together; without them, below 10 MiB 20 MiB segments shared from their tails, from
    # 10 MiB up one segment per tensor rounded to 2 MiB
    def classic(k, s):
        if s >= 10:
            return k * 2 * math.ceil(s / 2)
        segs, free = 0, 0.0
        for _ in range(k):
            if free >= s:
                free -= s
                free = 0.0 if free <= 1 else free
            else:
                segs, free = segs + 1, 20 - s
                free = 0.0 if free <= 1 else free
        return 20 * segs

    tensors = lambda k, s: k * s  # noqa: E731
    per_tensor = lambda k, s: 20 * math.ceil(s / 20) * k  # noqa: E731
    pages = lambda k, s: 20 * math.ceil(k * s / 20)  # noqa: E731 (right with expandable segments only)
    for fn, kw, rule in [(tensors, {}, pages), (per_tensor, {}, pages), (pages, {"expandable": False}, classic)]:
        fb = al.check_reserved_function(fn, **kw)
        k, s = fb.details["k"], fb.details["s"]
        core_checks._WRONG_TRIES.clear()
        assert_teaches(al.check_reserved_function, (fn,), [rule(k, s)], kwargs=kw,
                       allowed=[fb.details["answer"], s, k])
    assert al.check_reserved_function(pages).correct is True


@pytest.mark.parametrize("check, right, wrong", [
    (al.check_pool_boundary_choice, "b", "acd"),
    (streams.check_cap_stall, "b", "acd"),
    (streams.check_allocation_stream, "c", "abd"),
    (streams.check_fsdp_limit, "b", "acd"),
    (pinned.check_overwrite_guard, "c", "abde"),
    (syncs.check_bubble_cost, "b", "acd"),
])
def test_multiple_choice_never_gives_the_right_option(check, right, wrong):
    right_text = check(right).message
    for w in wrong:
        fb = assert_teaches(check, (w,), [right_text[:40], f'"{right}"', f"'{right}'", f"({right})"])
        assert f"option {right}" not in fb.message.lower() and f"answer is {right}" not in fb.message.lower()


def test_block_predictions():
    r = ex.run("streams.strategies", mode="recorded")
    measured = {s: r["results"][s]["distinct_blocks"] for s in r["results"] if s in
                ("unprotected", "stall", "record_stream", "event")}
    for wrong in [{"unprotected": 4, "stall": 4, "record_stream": 1, "event": 4},
                  {"unprotected": 2, "stall": 3, "record_stream": 9, "event": 1}]:
        fb = assert_teaches(streams.check_block_predictions, (wrong,), [])
        for s, v in measured.items():
            if wrong[s] != v:
                for pattern in (f"{s} {v}", f"{s}: {v}", f"measured {v}", f"{v} block"):
                    assert pattern not in fb.message, (pattern, fb.message)
        assert graded_feedback(fb).startswith("wrong: ")


def test_peak_and_allocated_predictions():
    sweep = ex.run("streams.runahead", mode="recorded")
    k = [i for i, p in enumerate(sweep["points"]) if p["consumer_ms"] == 10.0 and p["host_delay_ms"] == 5.0][0]
    peak = sweep["record_stream"]["peak_active_bytes"][k] / MiB
    for wrong in [32 * 64, 64, 3 * 64, 100, 5000]:
        assert_teaches(streams.check_peak_prediction, (wrong,), [peak])
    k0 = [i for i, p in enumerate(sweep["points"]) if p["consumer_ms"] == 10.0 and p["host_delay_ms"] == 0.0][0]
    allocated = sweep["record_stream"]["peak_allocated_bytes"][k0] / MiB
    active = sweep["record_stream"]["peak_active_bytes"][k0] / MiB
    for wrong in [active, 32 * 64, 500, 10]:
        assert_teaches(streams.check_allocated_peak, (wrong,), [allocated])


def test_owned_rounding_and_graph():
    # solutions: 18 and 18 MiB owned; a 2.08 GiB tensor pins 4 GiB; the replay delivers 3
    for wrong in [(13, 13), (16, 0), (22, 18), (14, 13), (20, 20), (18, 0)]:
        assert_teaches(pinned.check_owned_prediction, wrong, [18])
    for wrong in [2.08, 2.0, 3.0, 8.0, 5]:
        assert_teaches(pinned.check_rounding, (wrong,), [4])
    for wrong in [7.0, 1.0, 0, 10]:
        assert_teaches(pinned.check_graph_replay, (wrong,), [3])


def test_run_ahead_prediction():
    r = ex.run("syncs.run_ahead", mode="recorded", host_ms=1.5, gpu_ms=2.0)
    measured = [r["variants"]["none"]["end_ms"], r["variants"]["every_step"]["end_ms"]]
    # the model: 1.5 + 8 x 2 = 17.5 ms without syncs, 8 x 3.5 = 28 ms with one every step
    for wrong in [(16, 16), (28, 28), (12, 12), (17.5, 17.5), (40, 10)]:
        assert_teaches(syncs.check_run_ahead_prediction, wrong, [17.5, 28, *measured])


def test_classification_says_how_many_not_which():
    r = ex.run("syncs.catalogue", mode="recorded")
    rows = {row["code"]: row for row in r["rows"]}
    template = syncs.classification_template()
    right = {code: rows[code]["syncs"] for code in template}
    for flip in (list(template), list(template)[:2]):  # all wrong, two wrong
        answer = {code: (not v) if code in flip else v for code, v in right.items()}
        fb = assert_teaches(syncs.check_classification, (answer,), [])
        for text in (fb.message, repr(fb)):
            for code in template:  # naming the wrong ones would be the answer: flip them
                assert code not in text and rows[code]["why"] not in text, (code, text)
        assert f"{len(template) - len(flip)} of {len(template)} right" in fb.message
        assert graded_feedback(fb) == "wrong: answers"


def test_threshold():
    r = ex.run("syncs.pageable_threshold", mode="recorded")
    lo, hi = r["largest_staged_bytes"] / MiB, r["threshold_bytes"] / MiB
    for wrong in [0.0625, 0.001, 10_000, "none"]:
        assert_teaches(syncs.check_threshold, (wrong,), [lo, hi])


def test_rewrite_on_cpu_does_not_give_the_reference_values():
    import torch

    def wrong_gmax(local):
        return syncs.reduce_grad_stats(local)[0], local.max() + 1

    ref = syncs.reduce_grad_stats(torch.randn(4, 8, generator=torch.Generator().manual_seed(0)))
    assert_teaches(syncs.check_sync_free_rewrite, (wrong_gmax,), [float(ref[1])])


def test_graded_mode_says_only_which_part(monkeypatch):
    monkeypatch.setenv("CUDA_MEMLAB_FEEDBACK", "graded")
    fb = pinned.check_owned_prediction(18, 0)
    assert (fb.correct, fb.message) == (False, "wrong: the memory owned after torch.cuda.empty_cache()")
    assert fb.details == {"wrong_parts": ["the memory owned after torch.cuda.empty_cache()"]}
    assert pinned.check_owned_prediction(18, 18.0).message == "correct"
    assert pinned.check_owned_prediction(None, None).message == "unanswered"
    assert al.check_pool_boundary_choice("a").message == "wrong: your answer"


def test_the_doctor_exercise_gives_no_figure_with_a_wrong_answer():
    # exercise 1.6: the lab's runs under each setting decide it; their figures are the answer
    r = ex.run("alloc.doctor_snapshots", mode="recorded", workload="training")
    final = {run["settings"]: run["final"]["reserved_bytes.all.current"] / MiB for run in r["runs"]}
    figures = [final[""], final["max_split_size_mb:64"], final["roundup_power2_divisions:4"]]
    assert figures[0] < figures[1] and figures[0] < figures[2]  # the solution: neither (d)
    right_text = al.check_doctor_setting("d").message
    for wrong in "abc":
        assert_teaches(al.check_doctor_setting, (wrong,), [*figures, right_text[:40], "neither", '"d"'])
    assert al.check_doctor_setting("d").correct is True


def test_the_student_edition_points_to_the_instructor(monkeypatch):
    monkeypatch.setenv("CUDA_MEMLAB_EDITION", "student")
    first = pinned.check_rounding(2.0)
    second = pinned.check_rounding(2.0)
    assert "Ask your instructor" in second.message and "instructor" not in first.message
    assert "solution" not in second.message.lower() and "book" not in second.message.lower()


def test_graded_mode_gives_no_direction(monkeypatch):
    monkeypatch.setenv("CUDA_MEMLAB_FEEDBACK", "graded")
    for check, args in [(pinned.check_rounding, (100,)), (pinned.check_rounding, (0.5,)),
                        (streams.check_peak_prediction, (5000,)), (syncs.check_run_ahead_prediction, (40, 10)),
                        (syncs.check_threshold, (10_000,)), (syncs.check_threshold, (0.001,))]:
        fb = check(*args)
        for text in (fb.message, repr(fb)):
            assert not re.search(r"too (high|low)|smaller|larger|further up|higher|lower", text, re.I), text
        assert fb.message.startswith("wrong")
    # the wrapper keeps no way around the exam wording
    assert not hasattr(pinned.check_rounding, "__wrapped__")


def test_exercise_declaration_refuses_bad_values():
    def check(answer):
        return core_checks.Feedback(None, "")

    for kwargs, words in [(dict(label="alloc-x"), "label must start with 'ex-'"),
                          (dict(chapter=5), "chapter must be 1-4"), (dict(points=0), "points must be > 0")]:
        args = dict(label="ex-test-x", chapter=1, points=1, objective="o", section="s") | kwargs
        with pytest.raises(ValueError, match=words):
            core_checks.exercise(args.pop("label"), **args)(check)
    with pytest.raises(ValueError, match="declared twice"):
        core_checks.exercise("ex-alloc-22", chapter=1, points=1, objective="o", section="s")(check)
    assert "ex-test-x" not in EXERCISES
