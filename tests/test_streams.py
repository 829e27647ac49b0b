"""Chapter 2 (cross-stream memory): CPU tests of everything that needs no GPU, recorded-mode
tests against the lab GPU's files in experiments/recorded/, and GPU tests (``-m gpu``) that
assert the claims live.

CPU tests that need data (plots, checks, claim predicates) read the real recordings;
tests of a predicate's failing side change a copy of them. No test writes a recording.
"""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
from matplotlib.figure import Figure

import experiments as ex
from experiments.core import claims, registry, store
from experiments import streams
from experiments.streams import measurements as streams_meas
from experiments.streams import checks as streams_checks
from experiments.streams.workloads import (STRATEGIES, block_ids, buffer_numel, max_live_buffers, overlap_ms,
                                          union_intervals)

from .booktools import hidden_output_cells

MiB = 2**20
ROOT = Path(__file__).resolve().parent.parent
STREAMS_IDS = ("streams.strategies", "streams.pipeline", "streams.runahead", "streams.memory_cap", "streams.timeline",
               "streams.fsdp_runahead", "streams.fsdp_step")
CLAIM_IDS = ("streams.race", "streams.fixes_correct", "streams.record_stream_runahead", "streams.event_bounded",
             "streams.allocated_misses_parked", "streams.fsdp2_flat", "streams.fsdp1_follows_runahead",
             "streams.fsdp1_limit_bounds", "streams.fsdp2_allgather_bounded")


def recorded(exp_id: str, **params) -> registry.Result:
    """The lab GPU's recorded result at one point, as a copy that a test may change."""
    r = ex.run(exp_id, mode="recorded", **params)
    return registry.Result(r.experiment, dict(r.params), copy.deepcopy(r.data), r.provenance, r.mode, r.elapsed_s)


# ================================================================ registry, params, sizes

def test_experiments_and_claims_are_registered():
    ids = [e.id for e in registry.all_experiments(2)]
    assert sorted(ids) == sorted(STREAMS_IDS)
    assert [c.id for c in claims.all_claims(2)] == list(CLAIM_IDS)
    for c in claims.all_claims(2):
        assert c.experiment in STREAMS_IDS and c.source == streams.POST_URL
        exp = registry.get(c.experiment)
        point = exp.complete(c.params)
        assert store.params_key(point) in {store.params_key(g) for g in exp.grid}, f"{c.id} is evaluated off-grid"


def test_runahead_claim_point_has_32_layers():
    assert registry.get("streams.runahead").defaults["layers"] == 32


def _estimated_seconds(exp_id: str, pt: dict) -> float:
    """GPU-time model of one grid point (ms of sleeps, plus per-run overhead)."""
    if exp_id == "streams.strategies":
        p, c, L = pt["producer_ms"], pt["consumer_ms"], pt["layers"]
        per_trial = 3 * (p + L * max(p, c)) + L * (p + c) + 4 * 5
        return pt["trials"] * per_trial / 1e3
    if exp_id == "streams.pipeline":
        return (pt["layers"] * (pt["consumer_ms"] + pt["host_delay_ms"]) + 100) / 1e3
    if exp_id == "streams.runahead":
        return pt["repeats"] * 2 * sum(pt["layers"] * max(c, h) + 10 for c, h in streams.RUNAHEAD_POINTS) / 1e3
    if exp_id == "streams.memory_cap":
        return 10.0  # a fresh process: import torch, start CUDA, two short runs
    if exp_id == "streams.fsdp_runahead":
        # its process (shared with the page's steps): torch, CUDA and the group start (8 s); per
        # version a build and warm-up (1 s), then every point and repeat: forward and backward
        sweep = sum(2 * pt["layers"] * max(c, h) for c, h in streams.FSDP_POINTS) / 1e3
        return 8.0 + 3 * (1.0 + pt["repeats"] * (sweep + 0.4))
    if exp_id == "streams.fsdp_step":
        # the grid's own process (8 s, counted once over the grid's 18 points), then a build, a warm-up,
        # three marks and the measured step
        return 8.0 / 18 + 1.0 + 2 * pt["layers"] * max(pt["gpu_ms"], pt["host_delay_ms"]) / 1e3
    return 0.3


def test_whole_grid_fits_the_time_budget():
    # experiments on a budget of their own (streams.fsdp_step's snapshots) are recorded apart
    total = sum(_estimated_seconds(e.id, pt) for e in registry.all_experiments(2) if not e.own_budget
                for pt in e.grid)
    assert total < 85, f"chapter 2's grid is estimated at {total:.0f} s of GPU time; the budget is 90 s"


@pytest.mark.parametrize("exp_id, params, words", [
    ("streams.pipeline", {"layers": 0}, ["layers", "[1, 64]"]),
    ("streams.pipeline", {"buffer_mib": -64}, ["buffer_mib", "[1, 1024]"]),
    ("streams.pipeline", {"strategy": "wait_stream"}, ["strategy", "'event'"]),
    ("streams.pipeline", {"consumer_ms": -1.0}, ["consumer_ms"]),
    ("streams.pipeline", {"in_flight": 9}, ["in_flight", "[0, 8]"]),
    ("streams.pipeline", {"bogus": 1}, ["bogus", "parameters are"]),
    ("streams.strategies", {"layers": 1}, ["layers", "[2, 32]"]),
    ("streams.strategies", {"trials": 0}, ["trials"]),
    ("streams.runahead", {"repeats": 0}, ["repeats"]),
    ("streams.memory_cap", {"cap_mib": 100}, ["cap_mib", "[256, 16,384]"]),
    ("streams.timeline", {"layers": 9}, ["layers", "[2, 8]"]),
])
def test_bad_parameters_are_rejected_before_any_gpu_work(exp_id, params, words):
    with pytest.raises(ValueError) as err:
        ex.run(exp_id, mode="live", **params)
    for w in words:
        assert w in str(err.value)


@pytest.mark.parametrize("func, kwargs", [
    (streams.pipeline, {"layers": 0}),
    (streams.strategies, {"buffer_mib": 0}),
    (streams.runahead, {"layers": 2}),
    (streams.timeline, {"strategy": "nope"}),
    (streams.memory_cap, {"layers": 4}),
])
def test_direct_calls_validate_too(func, kwargs):
    with pytest.raises(ValueError):
        func(**kwargs)


def test_validate_cap_messages():
    streams.validate_cap(48, 64, 1024, 1)
    with pytest.raises(ValueError, match=r"cap_mib must be at least .* = 192 MiB"):
        streams.validate_cap(48, 64, 150, 1)
    with pytest.raises(ValueError, match=r"layers × buffer_mib must be at least 1.5 × cap_mib"):
        streams.validate_cap(10, 64, 1024, 1)
    with pytest.raises(ValueError, match="cap_mib"):
        streams.memory_cap(cap_mib=256, buffer_mib=128, in_flight=1)


def test_sizes_beyond_the_device_are_rejected(monkeypatch):
    import experiments.core.device as device

    monkeypatch.setattr(device, "total_memory_bytes", lambda device=0: 16 * 2**30)
    with pytest.raises(ValueError, match=r"layers × buffer_mib needs 65536 MiB"):
        streams.pipeline(strategy="record_stream", layers=64, buffer_mib=1024)
    # the event handoff holds (in_flight + 1) buffers only, so the same layers fit
    streams_meas._size_check("event", 64, 1024, 1)
    with pytest.raises(ValueError, match="cap_mib"):
        streams.memory_cap(cap_mib=16000, layers=128, buffer_mib=256)


# ================================================================ pure helpers

def test_buffer_numel_is_whole_rows_and_rejects_small_sizes():
    assert buffer_numel(64) == 64 * MiB // 4
    assert buffer_numel(1) % 1024 == 0
    with pytest.raises(ValueError, match="buffer_mib"):
        buffer_numel(0.5)


def test_max_live_buffers():
    assert max_live_buffers("record_stream", 32, 1) == 32
    assert max_live_buffers("event", 32, 1) == 2
    assert max_live_buffers("event", 2, 4) == 2
    assert max_live_buffers("stall", 32, 1) == max_live_buffers("unprotected", 32, 3) == 1
    with pytest.raises(ValueError, match="strategy"):
        max_live_buffers("wait_stream", 4, 1)


def test_union_and_overlap():
    assert union_intervals([(3, 4), (0, 1), (0.5, 2)]) == [(0.0, 2.0), (3.0, 4.0)]
    assert overlap_ms([(0, 10)], [(2, 3), (5, 7)]) == pytest.approx(3.0)
    assert overlap_ms([(0, 1), (2, 3)], [(1, 2)]) == 0.0
    assert overlap_ms([], [(0, 1)]) == 0.0
    # a pipelined run: producer i+1 beside consumer i
    prod = [(i * 0.5, i * 0.5 + 0.5) for i in range(4)]
    cons = [(0.5 + 2 * i, 2.5 + 2 * i) for i in range(4)]
    assert overlap_ms(prod, cons) == pytest.approx(1.5)


def test_block_ids():
    assert block_ids([7, 9, 7, 11, 9]) == [0, 1, 0, 2, 1]
    assert block_ids([]) == []


# ================================================================ claims

def test_claim_predicates_report_the_recorded_figures():
    race, sweep = recorded("streams.strategies"), recorded("streams.runahead")
    u = race["results"]["unprotected"]
    holds, m = claims.get_claim("streams.race").predicate(race.data)
    assert holds and (m["corrupted trials"], m["trials"]) == (u["corrupted_trials"], u["trials"])
    holds, m = claims.get_claim("streams.fixes_correct").predicate(race.data)
    assert holds and m["record_stream: corrupted trials"] == race["results"]["record_stream"]["corrupted_trials"]
    lo, hi = streams_meas._extreme_points(sweep.data)
    act, alloc = sweep["record_stream"]["peak_active_bytes"], sweep["record_stream"]["peak_allocated_bytes"]
    holds, m = claims.get_claim("streams.record_stream_runahead").predicate(sweep.data)
    assert holds and m["ratio"] == pytest.approx(act[hi] / act[lo])
    assert m["peak active MiB, largest run-ahead"] == pytest.approx(act[hi] / MiB)
    assert m["largest run-ahead"] == "10 ms GPU / 0 ms host"
    assert m["smallest run-ahead"] == "10 ms GPU / 20 ms host"
    holds, m = claims.get_claim("streams.event_bounded").predicate(sweep.data)
    assert holds and m["highest peak active MiB"] == pytest.approx(max(sweep["event"]["peak_active_bytes"]) / MiB)
    assert m["bound MiB"] == (sweep["in_flight"] + 1) * sweep["buffer_bytes"] / MiB
    holds, m = claims.get_claim("streams.allocated_misses_parked").predicate(sweep.data)
    assert holds and m["peak allocated MiB"] == pytest.approx(alloc[hi] / MiB)
    # whole MiB show without a decimal point in the claims table
    assert claims.format_measured(m).startswith(f"peak allocated MiB = {alloc[hi] // MiB};")


def test_claims_fail_when_the_data_says_so():
    race = recorded("streams.strategies").data
    no_race = copy.deepcopy(race)
    no_race["results"]["unprotected"]["corrupted_trials"] = 0
    assert not claims.get_claim("streams.race").predicate(no_race)[0]
    broken_fix = copy.deepcopy(race)
    broken_fix["results"]["record_stream"]["corrupted_trials"] = 1
    holds, measured = claims.get_claim("streams.fixes_correct").predicate(broken_fix)
    assert not holds and measured["record_stream: corrupted trials"] == 1

    sweep = recorded("streams.runahead").data
    flat = copy.deepcopy(sweep)
    flat["record_stream"]["peak_active_bytes"] = [4 * sweep["buffer_bytes"]] * len(sweep["points"])
    holds, measured = claims.get_claim("streams.record_stream_runahead").predicate(flat)
    assert not holds and measured["ratio"] == pytest.approx(1.0)
    leaky = copy.deepcopy(sweep)
    leaky["event"]["peak_active_bytes"][3] = 3 * sweep["buffer_bytes"]
    holds, measured = claims.get_claim("streams.event_bounded").predicate(leaky)
    assert not holds and measured["bound MiB"] == 2 * sweep["buffer_bytes"] / MiB
    # within the 1 MiB slack still holds; beyond it does not
    leaky["event"]["peak_active_bytes"][3] = 2 * sweep["buffer_bytes"] + MiB // 2
    assert claims.get_claim("streams.event_bounded").predicate(leaky)[0]
    visible = copy.deepcopy(sweep)
    visible["record_stream"]["peak_allocated_bytes"] = list(sweep["record_stream"]["peak_active_bytes"])
    assert not claims.get_claim("streams.allocated_misses_parked").predicate(visible)[0]


def test_runahead_extremes_are_found_by_runahead_not_position():
    sweep = recorded("streams.runahead").data
    lo, hi = streams_meas._extreme_points(sweep)
    assert sweep["points"][lo] == {"consumer_ms": 10.0, "host_delay_ms": 20.0, "runahead_ms": -10.0}
    assert sweep["points"][hi]["runahead_ms"] == max(c - h for c, h in streams.RUNAHEAD_POINTS)


# ================================================================ exercise checks

def test_check_block_predictions():
    r = recorded("streams.strategies")
    right = {s: r["results"][s]["distinct_blocks"] for s in STRATEGIES}
    assert streams.check_block_predictions(None).correct is None
    assert streams.check_block_predictions(right, r).correct is True
    off_by_one = {**right, "record_stream": right["record_stream"] - 1}
    assert streams.check_block_predictions(off_by_one, r).correct is True
    wrong = {**right, "record_stream": 2, "unprotected": 4}
    fb = streams.check_block_predictions(wrong, r)
    assert fb.correct is False and "polls its event" in fb.message and "asks next on that stream" in fb.message
    assert streams.check_block_predictions({"unprotected": 1}, r).correct is False
    assert streams.check_block_predictions([1, 1, 4, 2], r).correct is False
    assert streams.check_block_predictions({**right, "stall": "1"}, r).correct is False


def test_check_block_predictions_takes_the_notebooks_unfilled_dict_as_no_answer():
    r = recorded("streams.strategies")
    fb = streams.check_block_predictions({s: None for s in STRATEGIES}, r)
    assert fb.correct is None and "my_blocks" in fb.message and "record_stream" in fb.message
    fb = streams.check_block_predictions({s: (None if s == "event" else 1) for s in STRATEGIES}, r)
    assert fb.correct is None and "still None: event)" in fb.message


def test_check_peak_prediction():
    r = recorded("streams.runahead")
    k = streams_checks._point_index(r.data, 10.0, 5.0)
    expected = r["record_stream"]["peak_active_bytes"][k] / MiB
    assert streams.check_peak_prediction(None).correct is None
    assert streams.check_peak_prediction(expected * 1.1, r).correct is True
    fb = streams.check_peak_prediction(32 * 64, r)
    assert fb.correct is False and "every layer" in fb.message
    fb = streams.check_peak_prediction(128, r)
    assert fb.correct is False and "event handoff" in fb.message
    assert streams.check_peak_prediction("lots", r).correct is False
    assert streams.check_peak_prediction([1024], r).correct is False


def test_check_allocated_peak():
    r = recorded("streams.runahead")
    k = streams_checks._point_index(r.data, 10.0, 0.0)
    assert streams.check_allocated_peak(None).correct is None
    assert streams.check_allocated_peak(r["record_stream"]["peak_allocated_bytes"][k] / MiB, r).correct is True
    fb = streams.check_allocated_peak(r["record_stream"]["peak_active_bytes"][k] / MiB, r)
    assert fb.correct is False and "active" in fb.message
    assert streams.check_allocated_peak([64], r).correct is False


def test_point_index_missing():
    with pytest.raises(LookupError, match="consumer_ms=3"):
        streams_checks._point_index(recorded("streams.runahead").data, 3.0, 0.0)


@pytest.mark.parametrize("check, right", [(streams.check_allocation_stream, "c"), (streams.check_cap_stall, "b")])
def test_choice_checks(check, right):
    assert check(None).correct is None
    assert check(right).correct is True
    for other in "abcd":
        if other != right:
            fb = check(other)
            assert fb.correct is False and fb.message
    assert check("e").correct is False
    assert check(right.upper()).correct is True
    for not_a_letter in ([right], {right: True}, 3):
        fb = check(not_a_letter)
        assert fb.correct is False and "one letter" in fb.message


def test_allocation_stream_check_says_what_its_verdict_says():
    fb = streams.check_allocation_stream("d")
    assert fb.correct is False
    assert not fb.message.startswith(("Correct", "Right")) and "Not quite" in fb.message
    # it must not name the right option (copy_in alone) in a wrong answer's feedback
    assert "more than needed" in fb.message and "only copy_in" not in fb.message.lower()


def test_unanswered_messages_read_as_sentences():
    for fb in (streams.check_block_predictions(None), streams.check_peak_prediction(None),
               streams.check_allocated_peak(None), streams.check_allocation_stream(None),
               streams.check_cap_stall(None), streams.check_event_handoff(None)):
        assert fb.correct is None
        assert fb.message.startswith("Replace None with ") and fb.message.endswith("then run the cell again.")
        assert "None with None" not in fb.message and "your value for" not in fb.message


def test_check_event_handoff_without_answer_or_gpu(monkeypatch):
    assert streams.check_event_handoff(None).correct is None
    assert streams.check_event_handoff("my_handoff").correct is False
    with pytest.raises(ValueError, match="layers"):
        streams.check_event_handoff(streams.reference_handoff, layers=1)
    with pytest.raises(ValueError, match="buffer_mib"):
        streams.check_event_handoff(streams.reference_handoff, buffer_mib=0)
    monkeypatch.setattr(streams_checks, "has_cuda", lambda: False)
    fb = streams.check_event_handoff(streams.reference_handoff)
    assert fb.correct is None and "GPU" in fb.message
    # the student edition has no solutions: the message points at the recipe instead
    assert "solution" not in fb.message and "Writing the event handoff" in fb.message


# ================================================================ plots

def _footer(fig: Figure) -> str:
    return " ".join(t.get_text() for t in fig.texts)


def test_plot_strategies():
    r = recorded("streams.strategies")
    fig = streams.plot_strategies(r)
    assert isinstance(fig, Figure) and len(fig.axes) == 3
    by_title = {ax.get_title().split(" ")[0]: ax for ax in fig.axes}
    a0, a1, a2 = by_title["Did"], by_title["Memory"], by_title["Time"]
    assert len(a0.patches) == 4
    colors = [p.get_facecolor() for p in a0.patches]
    assert colors[0] != colors[1]  # corrupted (unprotected) against correct (stall)
    assert len(a1.patches) == 12  # allocated, active, reserved per strategy
    assert "MiB" in a1.get_ylabel() and "ms" in a2.get_ylabel()
    assert "one buffer (64 MiB)" in [t.get_text() for t in a1.get_legend().get_texts()]
    # span and overlap are written on their bars, so the stall's zero overlap is visible
    written = [t.get_text() for t in a2.texts]
    assert f"{r['results']['stall']['span_ms']:.1f}" in written and "0.0" in written
    assert f"Recorded on {r.provenance.gpu_name}" in _footer(fig)


def test_plot_pipeline():
    r = recorded("streams.pipeline", strategy="unprotected", consumer_ms=10.0)
    fig = streams.plot_pipeline(r)
    assert len(fig.axes) == 2
    assert f"{r['corrupted_layers']} of 32" in fig.axes[0].get_title()
    assert fig.axes[1].get_title() == "1 block used"
    assert len(fig.axes[1].patches) == 3
    event = recorded("streams.pipeline", strategy="event", in_flight=4)
    fig = streams.plot_pipeline(event)
    assert "event, 4 in flight" in fig._suptitle.get_text()
    assert fig.axes[1].get_title() == f"{event['distinct_blocks']} blocks used"


def test_plot_runahead_and_counters():
    r = recorded("streams.runahead")
    fig = streams.plot_runahead(r)
    assert len(fig.axes) == 2
    left, right = fig.axes
    labelled = [ln for ln in left.get_lines() if not ln.get_label().startswith("_")]
    assert len(labelled) == 3
    assert len(left.get_xticks()) == sum(1 for _, h in streams.RUNAHEAD_POINTS if h == 0)
    fig = streams.plot_counters(r)
    assert len(fig.axes[0].patches) == 6
    with pytest.raises(ValueError, match="point"):
        streams.plot_counters(r, point=99)


def test_plot_memory_cap():
    r = recorded("streams.memory_cap")
    fig = streams.plot_memory_cap(r)
    assert fig.axes[0].get_yscale() == "log"
    assert len([ln for ln in fig.axes[0].get_lines() if len(ln.get_xdata())]) == 2
    assert len(fig.axes[1].patches) == 2
    ticks = fig.axes[1].get_yticks()
    assert all(t == int(t) for t in ticks), f"retries are counts, ticks {ticks}"
    oom = recorded("streams.memory_cap")
    oom.data["strategies"]["record_stream"].update(oom=True, alloc_host_ms=[])
    assert isinstance(streams.plot_memory_cap(oom), Figure)


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_plot_timeline(strategy):
    r = recorded("streams.timeline", strategy=strategy)
    fig = streams.plot_timeline(r)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["host", "producer stream", "consumer stream"]
    assert len(ax.patches) == 3 * r["layers"]
    markers = [ln for ln in ax.get_lines() if ln.get_marker() == "v" and len(ln.get_xdata())]
    assert len(markers[0].get_xdata()) == r["layers"]


def test_strategies_table():
    r = recorded("streams.strategies")
    lines = str(streams.strategies_table(r)).splitlines()
    assert lines[0].split()[:3] == ["strategy", "corrupted", "blocks"]
    for s in STRATEGIES:
        res = r["results"][s]
        row = next(line for line in lines if line.startswith(s + " "))
        assert f"{res['corrupted_trials']} of {res['trials']}" in row
        assert row.endswith(", ".join(f"{v:g}" for v in res["read_mean"]))
    assert lines[-1].endswith(f"{r['serial_ms']:g} ms.")


def test_runahead_table():
    r = recorded("streams.runahead")
    lines = str(streams.runahead_table(r)).splitlines()
    rows = lines[2:2 + len(r["points"])]
    assert len(rows) == len(streams.RUNAHEAD_POINTS)
    for row, k in zip(rows, range(len(rows))):
        cells = row.split()
        assert float(cells[0]) == r["points"][k]["consumer_ms"] and float(cells[1]) == r["points"][k]["host_delay_ms"]
        assert int(cells[2]) == r["record_stream"]["distinct_blocks"][k]
        assert int(cells[3]) == round(r["record_stream"]["peak_active_bytes"][k] / MiB)


def test_memory_cap_table():
    r = recorded("streams.memory_cap")
    text = str(streams.memory_cap_table(r))
    rs = r["strategies"]["record_stream"]
    parked = rs["peak_reserved_bytes"] // r["buffer_bytes"]
    assert f"{parked} buffers fill the cap" in text
    assert f"about {parked * r.params['consumer_ms']:.1f} ms" in text
    assert f"took {rs['worst_alloc_ms']:.1f} ms" in text
    rs.update(oom=True)
    assert "out of memory" in str(streams.memory_cap_table(r)) and "estimated" not in str(streams.memory_cap_table(r))


# ================================================================ widgets and notebook

def test_every_pipeline_panel_combination_is_recorded():
    grid = {store.params_key(pt) for pt in registry.get("streams.pipeline").grid}
    exp = registry.get("streams.pipeline")
    for s in STRATEGIES:
        for c in (0.0, 1.0, 10.0):
            for h in (0.0, 5.0, 20.0):
                assert store.params_key(exp.complete({"strategy": s, "consumer_ms": c, "host_delay_ms": h})) in grid
    for n in (0, 1, 2, 4):
        assert store.params_key(exp.complete({"strategy": "event", "in_flight": n})) in grid


def _notebook_source() -> str:
    return (ROOT / "book" / "src" / "ch2_cross_stream.py").read_text()


def test_notebook_structure():
    import jupytext

    src = _notebook_source()  # title, exercises and solutions: tests/test_notebooks.py, for every chapter
    nb = jupytext.reads(src, fmt="py:percent")
    for check in ("check_block_predictions", "check_peak_prediction", "check_allocated_peak", "check_cap_stall",
                  "check_event_handoff", "check_allocation_stream"):
        assert f"streams.{check}(" in src
    assert "ex.claims_table(chapter=2)" in nb.cells[-1].source
    assert streams.POST_URL in src
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "torch.cuda" not in code, "notebook code must go through ex.run / panels / checks"


def test_results_the_next_paragraph_discusses_are_not_folded():
    """Issue 10: a result that the following paragraph discusses is shown, not folded
    (answers that only a solution discusses stay folded under "Show the answer")."""
    hidden = hidden_output_cells("ch2_cross_stream.ipynb")
    for source in ("streams.plot_strategies(race)", "streams.strategies_table(race)",  # ex 2.1
                   "streams.plot_runahead(sweep)", "streams.runahead_table(sweep)",    # ex 2.2
                   'params=["strategy", "consumer_ms", "host_delay_ms"',               # ex 2.3
                   ):
        assert not any(source in h for h in hidden), f"the cell with {source!r} is folded"
    assert not any("streams.check_" in h for h in hidden), "the check's own feedback stays visible"


# ================================================================ checks and panels on the lab's recordings
# (what the recordings show: tests/test_recording_acceptance.py)

def test_recorded_checks_accept_the_measured_answers(recorded_mode):
    race = ex.run("streams.strategies")
    right = {s: race["results"][s]["distinct_blocks"] for s in STRATEGIES}
    assert streams.check_block_predictions(right).correct is True
    assert streams.check_block_predictions({**right, "event": right["event"] + 3}).correct is False
    sweep = ex.run("streams.runahead")
    k = streams_checks._point_index(sweep.data, 10.0, 5.0)
    assert streams.check_peak_prediction(sweep["record_stream"]["peak_active_bytes"][k] / MiB).correct is True
    k = streams_checks._point_index(sweep.data, 10.0, 0.0)
    assert streams.check_allocated_peak(sweep["record_stream"]["peak_allocated_bytes"][k] / MiB).correct is True


def test_recorded_panels_build(recorded_mode):
    pytest.importorskip("ipywidgets")
    ex.panel("streams.pipeline", streams.plot_pipeline, params=["strategy", "consumer_ms", "host_delay_ms"])
    ex.panel("streams.pipeline", streams.plot_pipeline, params=["in_flight"], strategy="event")
    ex.panel("streams.timeline", streams.plot_timeline, params=["strategy"])
    ex.panel("streams.strategies", streams.plot_strategies, params=["consumer_ms", "layers"])


# ================================================================ GPU: the claims, live

def _mib(x: float) -> str:
    return f"{x / MiB:.0f} MiB"


@pytest.mark.gpu
def test_live_strategies(live_mode):
    r = ex.run("streams.strategies", mode="live")
    res, L, n, buf = r["results"], r["layers"], r["in_flight"], r["buffer_bytes"]
    for cid in ("streams.race", "streams.fixes_correct"):
        holds, measured = claims.get_claim(cid).predicate(r.data)
        assert holds, f"{cid} does not hold: {measured}"
    blocks = {s: res[s]["distinct_blocks"] for s in STRATEGIES}
    assert blocks["unprotected"] == 1 and blocks["stall"] == 1, blocks
    assert blocks["event"] == n + 1, blocks
    assert blocks["record_stream"] >= L - 1, f"record_stream used {blocks['record_stream']} blocks for {L} layers"
    assert res["event"]["peak_active_bytes"] <= (n + 1) * buf + streams.SLACK_BYTES, \
        f"event handoff active peak {_mib(res['event']['peak_active_bytes'])} above {(n + 1)} buffers"
    assert res["record_stream"]["peak_active_bytes"] >= 3 * buf, \
        f"record_stream active peak only {_mib(res['record_stream']['peak_active_bytes'])}"
    assert res["record_stream"]["peak_allocated_bytes"] < res["record_stream"]["peak_active_bytes"]
    # the stall serializes producer and consumer: it loses the overlap the others keep
    assert res["stall"]["span_ms"] > res["event"]["span_ms"] + 0.5, \
        {s: round(res[s]["span_ms"], 2) for s in STRATEGIES}
    assert res["event"]["overlap_ms"] > res["stall"]["overlap_ms"] + 0.5, \
        {s: round(res[s]["overlap_ms"], 2) for s in STRATEGIES}
    assert res["unprotected"]["read_mean"][0] > 1, res["unprotected"]["read_mean"]


@pytest.mark.gpu
def test_live_race_depends_on_timing(live_mode):
    # The same unprotected code: with no consumer compute the read ends long before the
    # next fill reaches the block; with 2 ms it is overwritten first.
    fast = ex.run("streams.strategies", mode="live", consumer_ms=0.0, trials=5)["results"]
    slow = ex.run("streams.strategies", mode="live", consumer_ms=2.0, trials=5)["results"]
    assert fast["unprotected"]["corrupted_trials"] < slow["unprotected"]["corrupted_trials"], \
        (fast["unprotected"], slow["unprotected"])
    assert all(fast[s]["corrupted_trials"] == 0 for s in ("stall", "record_stream", "event"))


@pytest.mark.gpu
def test_live_runahead(live_mode):
    r = ex.run("streams.runahead", mode="live")
    for cid in ("streams.record_stream_runahead", "streams.event_bounded", "streams.allocated_misses_parked"):
        holds, measured = claims.get_claim(cid).predicate(r.data)
        assert holds, f"{cid} does not hold: {measured}"
    lo, hi = streams_meas._extreme_points(r.data)
    rs = r["record_stream"]
    assert rs["distinct_blocks"][hi] >= 0.9 * r["layers"], rs["distinct_blocks"]
    assert rs["distinct_blocks"][lo] <= 2, rs["distinct_blocks"]
    assert all(b == r["in_flight"] + 1 for b in r["event"]["distinct_blocks"]), r["event"]["distinct_blocks"]
    assert not any(rs["corrupted_layers"]) and not any(r["event"]["corrupted_layers"])


@pytest.mark.gpu
def test_live_pipeline_in_flight(live_mode):
    for n in (0, 2):
        r = ex.run("streams.pipeline", mode="live", strategy="event", in_flight=n, layers=8, consumer_ms=2.0)
        assert r["corrupted_layers"] == 0, r.data
        assert r["distinct_blocks"] == n + 1, f"in_flight={n}: {r['distinct_blocks']} blocks"
        assert r["peak_active_bytes"] <= (n + 1) * r["buffer_bytes"] + streams.SLACK_BYTES, _mib(r["peak_active_bytes"])


@pytest.mark.gpu
def test_live_memory_cap(live_mode):
    r = ex.run("streams.memory_cap", mode="live")
    rs, ev = r["strategies"]["record_stream"], r["strategies"]["event"]
    assert not rs["oom"] and not ev["oom"], (rs["message"], ev["message"])
    assert rs["num_alloc_retries"] >= 1, f"record_stream under the cap: {rs['num_alloc_retries']} retries"
    assert rs["worst_alloc_ms"] >= 5, f"record_stream's worst allocation took only {rs['worst_alloc_ms']:.2f} ms"
    assert ev["num_alloc_retries"] == 0, f"event handoff: {ev['num_alloc_retries']} retries"
    assert ev["worst_alloc_ms"] < rs["worst_alloc_ms"] / 3, (ev["worst_alloc_ms"], rs["worst_alloc_ms"])
    assert rs["corrupted_layers"] == 0 and ev["corrupted_layers"] == 0


@pytest.mark.gpu
def test_live_timeline(live_mode):
    bad = ex.run("streams.timeline", mode="live", strategy="unprotected")
    assert bad["distinct_blocks"] == 1
    # layer 2's fill, into the same block, ends while layer 1's consumer still runs
    assert bad["producer"][1][1] < bad["consumer"][0][1], (bad["producer"][1], bad["consumer"][0])
    good = ex.run("streams.timeline", mode="live", strategy="event")
    n = good.params["in_flight"]
    for i in range(good["layers"] - n - 1):
        j = i + n + 1  # the layer that reuses layer i's block
        assert good["block"][j] == good["block"][i]
        assert good["producer"][j][0] >= good["consumer"][i][1] - 0.01, (i, good["producer"][j], good["consumer"][i])
    stall = ex.run("streams.timeline", mode="live", strategy="stall")
    assert overlap_ms(stall["producer"], stall["consumer"]) < 0.1


def _unprotected_loop(all_gather, forward, layers, producer, consumer):
    for layer in range(layers):
        buf = all_gather(layer)
        forward(buf, layer)
        del buf


def _stall_loop(all_gather, forward, layers, producer, consumer):
    for layer in range(layers):
        buf = all_gather(layer)
        done = forward(buf, layer)
        producer.wait_event(done)
        del buf


def _record_stream_loop(all_gather, forward, layers, producer, consumer):
    for layer in range(layers):
        buf = all_gather(layer)
        forward(buf, layer)
        buf.record_stream(consumer)
        del buf


def _hoarding_loop(all_gather, forward, layers, producer, consumer):
    kept = []
    for layer in range(layers):
        buf = all_gather(layer)
        kept.append((buf, forward(buf, layer)))
    for _, done in kept:
        producer.wait_event(done)


@pytest.mark.gpu
@pytest.mark.parametrize("loop, correct, words", [
    (streams.reference_handoff, True, "Correct in"),
    (_unprotected_loop, False, "wrong values"),
    (_stall_loop, False, "GPU needed"),
    (_record_stream_loop, False, "record_stream"),
    (_hoarding_loop, False, "distinct blocks"),
])
def test_live_check_event_handoff(loop, correct, words):
    fb = streams.check_event_handoff(loop)
    assert fb.correct is correct, f"{loop.__name__}: {fb.message} {dict(fb.details)}"
    assert words in fb.message, fb.message
    import torch

    assert "record_stream" not in torch.Tensor.__dict__, "the record_stream ban was not lifted"
