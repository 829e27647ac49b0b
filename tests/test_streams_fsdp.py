"""Chapter 2's FSDP section: the trace analysis and the shared fresh process on the CPU, the
fallback where FSDP's process group cannot start (tried for real: this machine's torch has no
NCCL), the lab GPU's recordings (figures, tables, claims, the doctor's replays), and GPU tests
(``-m gpu``) that run FSDP's own code live.

Expectations come from the allocator's rules (a free that another stream's use deferred is
completed only when a later allocation finds its event done), from FSDP's code (world size 1
makes FSDP1 run NO_SHARD), and from the GPU's own counters recorded beside each snapshot.
"""
from __future__ import annotations

import copy
import time

import pytest
from matplotlib.figure import Figure

import experiments as ex
from experiments import doctor, streams
from experiments.core import claims, registry, store
from experiments.core.runner import FreshResult
from experiments.streams import fsdp as F
from experiments.streams.fsdp_gpu import GROUPS, VERSIONS
from experiments.streams.fsdp_trace import stream_usage

MiB = 2**20
FSDP_CLAIMS = ("streams.fsdp2_flat", "streams.fsdp1_follows_runahead", "streams.fsdp1_limit_bounds",
               "streams.fsdp2_allgather_bounded")


def recorded(exp_id: str, **params) -> registry.Result:
    r = ex.run(exp_id, mode="recorded", **params)
    return registry.Result(r.experiment, dict(r.params), copy.deepcopy(r.data), r.provenance, r.mode, r.elapsed_s)


@pytest.fixture(autouse=True)
def _fresh_state():
    F._forget_shared()
    F._unavailable.clear()
    yield
    F._forget_shared()
    F._unavailable.clear()


# ================================================================ registration and parameters

def test_experiments_claims_and_exercise_are_registered():
    ids = {e.id for e in registry.all_experiments(2)}
    assert {"streams.fsdp_runahead", "streams.fsdp_step"} <= ids
    got = {c.id: c for c in claims.all_claims(2)}
    for cid in FSDP_CLAIMS:
        c = got[cid]
        exp = registry.get(c.experiment)
        assert store.params_key(exp.complete(c.params)) in {store.params_key(g) for g in exp.grid}
    from experiments.core.checks import EXERCISES

    assert EXERCISES["ex-streams-fsdp-limit"].section == "FSDP's own code on one GPU"


def test_the_page_steps_and_both_groups_are_recorded_points():
    step, sweep = registry.get("streams.fsdp_step"), registry.get("streams.fsdp_runahead")
    grid = {store.params_key(g) for g in step.grid}
    for s in F.PAGE_STEPS:
        assert store.params_key(step.complete(s)) in grid
    assert {g["group"] for g in sweep.grid} == set(GROUPS)
    for g in GROUPS:   # every version and both reshard settings, in both groups, for the explorer
        for v in VERSIONS:
            for reshard in (True, False):
                assert store.params_key(step.complete({"group": g, "version": v,
                                                       "reshard_after_forward": reshard})) in grid


@pytest.mark.parametrize("exp_id, params, words", [
    ("streams.fsdp_step", {"version": "fsdp3"}, ["version", "'fsdp2'"]),
    ("streams.fsdp_step", {"group": "gloo"}, ["group", "'nccl'"]),
    ("streams.fsdp_step", {"gpu_ms": -1.0}, ["gpu_ms", "[0, 20]"]),
    ("streams.fsdp_step", {"layers": 64}, ["layers", "[2, 32]"]),
    ("streams.fsdp_step", {"layer_mib": 32}, ["layer_mib", "64"]),
    ("streams.fsdp_runahead", {"repeats": 0}, ["repeats", "[1, 5]"]),
    ("streams.fsdp_runahead", {"layers": 2}, ["layers", "[4, 32]"]),
])
def test_bad_parameters_are_rejected_before_anything_starts(exp_id, params, words, monkeypatch):
    monkeypatch.setattr(F, "run_fresh", lambda *a, **k: pytest.fail("a process was started"))
    with pytest.raises(ValueError) as err:
        ex.run(exp_id, mode="live", **params)
    for w in words:
        assert w in str(err.value)


def test_sizes_beyond_the_device_are_rejected(monkeypatch):
    import experiments.core.device as device

    monkeypatch.setattr(device, "total_memory_bytes", lambda device=0: 4 * 2**30)
    monkeypatch.setattr(F, "run_fresh", lambda *a, **k: pytest.fail("a process was started"))
    with pytest.raises(ValueError, match="layers × layer_mib"):
        streams.fsdp_step(layers=32, layer_mib=256)


def test_fsdp_run_refuses_other_experiments():
    with pytest.raises(ValueError, match="exp_id"):
        streams.fsdp_run("streams.pipeline")


# ================================================================ the trace, by stream

def _trace(*rows):
    return [{"action": a, "addr": addr, "size": size, "stream": st, "time_us": t} for a, addr, size, st, t in rows]


def test_a_deferred_free_parks_its_block_until_free_completed():
    # block 2 on the side stream is freed while the compute stream still uses it: free_requested
    # now, free_completed only at a later allocation; block 3 is freed at once
    e = _trace(("alloc", 1, 100, 0, 0), ("snapshot", 0, 0, 0, 1), ("alloc", 2, 10, 7, 10),
               ("free_requested", 2, 10, 7, 20), ("alloc", 3, 10, 7, 30), ("free_requested", 3, 10, 7, 40),
               ("free_completed", 3, 10, 7, 40), ("alloc", 4, 5, 0, 45), ("free_completed", 2, 10, 7, 45))
    r = stream_usage(e, {0: "compute", 7: "side"}, start=2, t0_us=10, t1_us=60, bins=5)
    side = r["streams"]["side"]
    assert side == {"allocs": 2, "alloc_bytes": 20, "deferred_frees": 1, "max_blocks": 2, "max_bytes": 20,
                    "max_parked_blocks": 1, "max_parked_bytes": 10}
    assert r["deferred_frees"] == 1 and r["max_parked_bytes"] == 10
    # compute held 100 bytes before the range: counts include it, the timeline is above it
    assert r["streams"]["compute"]["max_bytes"] == 105 and r["streams"]["compute"]["allocs"] == 1
    assert r["timeline"]["bin_ms"] == pytest.approx(0.01)


def test_timeline_bins_hold_the_state_carried_in_and_the_most_inside():
    big = 4 * MiB
    e = _trace(("alloc", 1, big, 7, 0), ("free_requested", 1, big, 7, 5), ("alloc", 2, big, 7, 25),
               ("free_completed", 1, big, 7, 36))
    r = stream_usage(e, {7: "side"}, t0_us=0, t1_us=40, bins=4)
    s = r["timeline"]["streams"]["side"]
    assert s["mib"] == [4.0, 4.0, 8.0, 8.0]        # bin 3 starts with both blocks, one freed inside
    assert s["parked_mib"] == [4.0, 4.0, 4.0, 4.0]
    assert r["streams"]["side"]["max_parked_blocks"] == 1


def test_stream_usage_rejects_a_bad_range():
    e = _trace(("alloc", 1, 10, 0, 0))
    with pytest.raises(ValueError, match="start and end"):
        stream_usage(e, {}, start=2)
    with pytest.raises(ValueError, match="bins"):
        stream_usage(e, {}, bins=0)
    assert stream_usage(e, {})["streams"]["stream 0"]["allocs"] == 1   # unnamed streams keep their handle


# ================================================================ the shared fresh process

class FakeWorker:
    """Stands in for run_fresh: answers each job from a recorded result, counts processes."""

    def __init__(self, fail_group: str | None = None, session_error: str | None = None):
        self.calls: list[list[tuple[str, list[str]]]] = []
        self.fail_group, self.session_error = fail_group, session_error
        self.sweeps = {g: recorded("streams.fsdp_runahead", group=g).data for g in GROUPS}
        self.steps = {(p.params["group"], p.params["version"]): p.data for p in store.load("streams.fsdp_step").points
                      if p.params["gpu_ms"] == 10 and p.params["host_delay_ms"] == 0}

    def __call__(self, target, kwargs, **kw):
        assert target == "experiments.streams.fsdp_gpu:fsdp_worker"
        self.calls.append([(s["group"], [j["key"] for j in s["jobs"]]) for s in kwargs["groups"]])
        out = {}
        for spec in kwargs["groups"]:
            g = spec["group"]
            if g == self.fail_group:
                out[g] = {"process_group_error": "init_process_group('nccl', world_size=1) failed: no NCCL"}
                continue
            if g == self.session_error:
                out[g] = {"session_error": "RuntimeError: no CUDA"}
                continue
            res = {}
            for job in spec["jobs"]:
                res[job["key"]] = self._answer(g, job)
            out[g] = {"world_size": 1 if g == "nccl" else 2, "results": res, "errors": {}, "elapsed_s": 1.0}
        return FreshResult(True, {"groups": out})

    def _answer(self, g, job):
        if job["kind"] == "step":
            c = job["config"]
            d = self.steps[(g, c["version"])]
            return {k: v for k, v in d.items() if k not in ("version", "group", "gpu_ms", "host_delay_ms")}
        if job["kind"] == "pipeline":
            p = self.sweeps[g]["program"]
            runs = [[{s: {k: p[s][k][i] for k in p[s]} | {"host_ms": 1.0, "wall_ms": 1.0} for s in p}]
                    for i in range(len(F.FSDP_POINTS))]
            return {"runs": runs * 1}
        v = self.sweeps[g]["versions"][job["config"]["version"]]
        keys = ("peak_active_bytes", "peak_allocated_bytes", "peak_reserved_bytes", "max_parked_bytes", "host_ms",
                "wall_ms", "deferred_frees")
        runs = [[{**{k: v[k][i] for k in keys}, "streams": {s: {"max_blocks": v["param_buffers"][i]}
                                                           for s in F.PARAM_STREAMS[job["config"]["version"]]}}]
                for i in range(len(F.FSDP_POINTS))]
        return {"sharding": v["sharding"], "param_dtype": v["param_dtype"], "collectives": v["collectives"],
                "runs": runs}


def _live(monkeypatch, worker):
    monkeypatch.setattr(F, "run_fresh", worker)
    monkeypatch.setattr(F, "check_fits", lambda *a, **k: None)


def test_the_page_runs_in_one_process_and_each_result_is_handed_out_once(recorded_mode, monkeypatch):
    w = FakeWorker()
    _live(monkeypatch, w)
    first = streams.fsdp_runahead()
    assert len(w.calls) == 1
    groups = dict(w.calls[0])
    assert list(groups) == ["nccl", "fake"]             # the request's group first
    assert sum(k.endswith("sweep:fsdp2") for k in groups["nccl"] + groups["fake"]) == 2
    assert sum(k.endswith("/step") for k in groups["nccl"] + groups["fake"]) == len(F.PAGE_STEPS)
    assert first["versions"]["fsdp2"]["sharding"] == w.sweeps["nccl"]["versions"]["fsdp2"]["sharding"]
    streams.fsdp_runahead(group="fake")
    for s in F.PAGE_STEPS:
        streams.fsdp_step(**s)
    assert len(w.calls) == 1, "the page's other runs came from the shared process"
    time.sleep(F.GRID_WALK_S + 0.1)   # a reader's later click: measured again, alone
    streams.fsdp_step()
    assert len(w.calls) == 2 and [len(k) for _, k in w.calls[1]] == [1]


def test_a_walk_over_the_grid_brings_the_rest_of_it(recorded_mode, monkeypatch):
    w = FakeWorker()
    _live(monkeypatch, w)
    grid = registry.get("streams.fsdp_step").grid
    streams.fsdp_runahead()
    for pt in grid:
        streams.fsdp_step(**pt)
    assert len(w.calls) == 2, [len(c) for c in w.calls]
    steps = sum(len(keys) for _, keys in w.calls[1])
    assert steps == len(grid) - len(F.PAGE_STEPS)


def test_a_group_that_cannot_start_raises_process_group_unavailable(recorded_mode, monkeypatch):
    _live(monkeypatch, FakeWorker(fail_group="nccl"))
    with pytest.raises(F.ProcessGroupUnavailable, match="no NCCL"):
        streams.fsdp_runahead()
    with pytest.raises(RuntimeError, match="no CUDA"):
        _live(monkeypatch, FakeWorker(session_error="nccl"))
        F._forget_shared()
        streams.fsdp_runahead()


def test_a_second_group_that_does_not_start_after_the_first_gets_a_process_of_its_own(recorded_mode, monkeypatch):
    w = FakeWorker(fail_group="fake")
    orig = w.__call__

    def call(target, kwargs, **kw):
        if len(kwargs["groups"]) == 1 and kwargs["groups"][0]["group"] == "fake":
            w.fail_group = None
        return orig(target, kwargs, **kw)

    _live(monkeypatch, call)
    streams.fsdp_runahead()
    assert [[g for g, _ in c] for c in w.calls] == [["nccl", "fake"], ["fake"]]
    streams.fsdp_runahead(group="fake")
    assert len(w.calls) == 2


def test_a_failed_run_raises_for_its_request_and_is_not_kept(recorded_mode, monkeypatch):
    w = FakeWorker()

    def failing(target, kwargs, **kw):
        r = w(target, kwargs, **kw)
        for g in r.value["groups"].values():
            for k in list(g["results"]):
                if k.endswith("sweep:fsdp1"):
                    g["errors"][k] = "RuntimeError: boom"
                    del g["results"][k]
        return r

    _live(monkeypatch, failing)
    with pytest.raises(RuntimeError, match="boom"):
        streams.fsdp_runahead()
    assert ("streams.fsdp_runahead", store.params_key(registry.get("streams.fsdp_runahead").complete(
        {"group": "fake"}))) not in F._kept
    assert F._kept, "the runs that worked are kept"


def _nccl_available() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_nccl_available()


@pytest.mark.skipif(_nccl_available(), reason="this torch has NCCL: the group would start (the GPU tests run it)")
def test_where_the_process_group_cannot_start_the_page_falls_back_with_one_line(recorded_mode, monkeypatch, capsys):
    """For real: this machine's torch has no NCCL, so the worker's init_process_group fails in a
    fresh process; the page gets the recording and one line, and its kernel carries on."""
    import experiments.core.registry as reg

    monkeypatch.setattr(reg, "require_cuda", lambda *a, **k: None)
    monkeypatch.setattr(F, "check_fits", lambda *a, **k: None)
    monkeypatch.setenv("CUDA_MEMLAB_MODE", "live")
    r = streams.fsdp_run("streams.fsdp_runahead")
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "did not start" in out[0] and "recording" in out[0], out
    assert r.recorded and r["group"] == "nccl"
    assert streams.fsdp_mode() == "recorded"
    again = streams.fsdp_run("streams.fsdp_step")
    assert again.recorded and capsys.readouterr().out == "", "the line is said once"


def test_a_group_that_does_not_start_falls_back_alone(recorded_mode, monkeypatch, capsys):
    """NCCL starts, the fake group does not (a torch without it): the NCCL runs stay live."""
    import experiments.core.registry as reg

    monkeypatch.setattr(reg, "require_cuda", lambda *a, **k: None)
    monkeypatch.setattr(reg, "collect_provenance", lambda: ex.run("streams.fsdp_runahead", mode="recorded").provenance)
    monkeypatch.setenv("CUDA_MEMLAB_MODE", "live")
    w = FakeWorker(fail_group="fake")
    _live(monkeypatch, w)
    assert not streams.fsdp_run("streams.fsdp_runahead").recorded
    assert streams.fsdp_mode() is None and capsys.readouterr().out == ""
    fake = streams.fsdp_run("streams.fsdp_runahead", group="fake")
    assert fake.recorded and "did not start" in capsys.readouterr().out
    assert streams.fsdp_mode() == "recorded"
    assert not streams.fsdp_run("streams.fsdp_step").recorded, "NCCL's runs stay live"


# ================================================================ the lab GPU's recordings

def test_recorded_sweeps_render(recorded_mode):
    for g in GROUPS:
        r = recorded("streams.fsdp_runahead", group=g)
        fig = streams.plot_fsdp_runahead(r)
        assert isinstance(fig, Figure)
        labels = fig.axes[0].get_legend_handles_labels()[1]
        assert "FSDP2" in labels and ("this chapter's record_stream program" in labels) == (g == "nccl")
        table = str(streams.fsdp_runahead_table(r))
        assert "FSDP1, limit off" in table and "host / wall" in table and "limit: limit_all_gathers" in table


def test_recorded_steps_render_one_panel_per_stream(recorded_mode):
    for s in F.PAGE_STEPS:
        r = recorded("streams.fsdp_step", **s)
        fig = streams.plot_fsdp_step(r)
        titles = [ax.get_title(loc="left") for ax in fig.axes]
        assert len(titles) == len(r["timeline"]["streams"]) >= 2
        assert titles[0].startswith("compute")
        assert str(streams.fsdp_streams_table(r)).count("\n") >= len(r["streams"])


def test_every_recorded_snapshot_replays_exactly_with_the_gpus_counters(recorded_mode):
    """The doctor (through its public face) replays each recorded FSDP step's snapshot event by
    event, deferred frees included, and its counters equal the GPU's at the three marks."""
    rec = store.load("streams.fsdp_step")
    deferred = 0
    for p in rec.points:
        d = p.data
        run = doctor.replay(doctor.read(d["snapshot"]))
        assert run.matches_trace, (p.params, run.first_mismatch)
        marks = {i: (a, r) for i, a, r in run.marks}
        for ph in d["phases"]:
            i = ph["trace_index"] - 1 if ph["trace_index"] - 1 in marks else ph["trace_index"]
            assert marks[i] == (ph["allocated_bytes.all.current"], ph["reserved_bytes.all.current"]), (p.params, ph)
        assert run.peak_reserved_bytes == max(ph["reserved_bytes.all.peak"] for ph in d["phases"]), p.params
        assert run.peak_allocated_bytes == max(ph["allocated_bytes.all.peak"] for ph in d["phases"]), p.params
        deferred += d["deferred_frees"]
    assert deferred > 0, "FSDP1's record_stream frees are among the replayed snapshots"


def test_replay_table_says_so(recorded_mode):
    pairs = [(r, doctor.replay(doctor.read(r["snapshot"])))
             for r in (recorded("streams.fsdp_step", **s) for s in F.PAGE_STEPS)]
    text = str(streams.fsdp_replay_table(pairs))
    assert text.count(" yes ") == len(pairs) and text.count("3 of 3") == len(pairs)
    for result, run in pairs:   # the GPU's peak and the doctor's, side by side, equal
        gpu = max(ph["reserved_bytes.all.peak"] for ph in result["phases"]) / MiB
        assert f"{gpu:.0f} / {run.peak_reserved_bytes / MiB:.0f}" in text and gpu == run.peak_reserved_bytes / MiB


def _page_replays():
    return [(r, doctor.replay(doctor.read(r["snapshot"])))
            for r in (recorded("streams.fsdp_step", group="fake"),
                      recorded("streams.fsdp_step", group="fake", version="fsdp1_nolimit"))]


def test_replay_figure_puts_the_gpus_counters_on_the_doctors_lines(recorded_mode):
    """One panel per run: the doctor's reserved line passes through the GPU's reserved counter
    at each of the three marks, and its highest point is the GPU's peak counter (the GPU's
    values come from the recording's phases, read by torch on the H200)."""
    from experiments.core.plotting import redraw

    pairs = _page_replays()
    fig = streams.plot_fsdp_replay(pairs)
    assert isinstance(fig, Figure) and len(fig.axes) == len(pairs)
    for ax, (result, run) in zip(fig.axes, pairs):
        lines = {ln.get_label(): ln for ln in ax.get_lines()}
        reserved = list(lines["doctor: reserved"].get_ydata())
        assert len(reserved) == len(run.reserved)
        gpu_peak = max(ph["reserved_bytes.all.peak"] for ph in result["phases"]) / MiB
        assert list(lines["GPU: peak reserved"].get_ydata()) == [gpu_peak, gpu_peak]
        assert max(reserved) == gpu_peak
        marks = {c.get_label(): c.get_offsets() for c in ax.collections}
        at = marks["GPU: reserved at a mark"]
        assert [y for _, y in at] == [ph["reserved_bytes.all.current"] / MiB for ph in result["phases"]]
        assert [y for _, y in marks["GPU: allocated at a mark"]] == [
            ph["allocated_bytes.all.current"] / MiB for ph in result["phases"]]
        xs = [int(x) for x, _ in at]
        assert xs == sorted(xs) and xs[-1] == len(reserved) - 1   # the last mark ends the trace
        for (x, y) in at:
            assert reserved[int(x)] == y, (result.params, x, y)
        assert "replays exactly" in [t.get_text() for t in ax.texts] and run.matches_trace
        top = ax.child_axes[0]   # the marks' names
        assert [t.get_text() for t in top.get_xticklabels()] == ["built", "warmed up", "after step"]
    narrow = redraw(fig, narrow_layout=True)
    assert len(narrow.axes) == len(pairs)
    assert narrow.axes[0].get_position().y0 > narrow.axes[1].get_position().y1 - 1e-6, "stacked on a phone"


@pytest.mark.slow   # one replay per mark, on purpose: 11 s of CPU
def test_a_mark_stands_where_a_replay_stopped_at_it_ends(recorded_mode):
    """Run.mark_points (read in one replay) is the series' length of a replay stopped at the
    mark's 'snapshot' entry (the releases before it flushed, as an empty_cache). The figure placed its marks with one replay per mark
    before: 17 s of chapter 2's 60-s live budget went to them on a loaded CPU (7 s on the
    H200 host), and the chapter ran 60.3 s live."""
    from experiments import doctor

    for result, run in _page_replays():
        trace = doctor.read(result["snapshot"])
        assert len(run.mark_points) == len(run.marks) >= 2
        for (i, _, _), k in zip(run.marks, run.mark_points):
            assert k == len(doctor.replay(trace, stop_at=i).allocated), (result.params, i)


def test_replay_figure_rejects_what_it_cannot_draw(recorded_mode):
    with pytest.raises(ValueError, match="pairs"):
        streams.plot_fsdp_replay([])
    r = recorded("streams.fsdp_step", group="fake")
    with pytest.raises(ValueError, match="series"):
        streams.plot_fsdp_replay([(r, doctor.replay(doctor.read(r["snapshot"]), series=False))])


def test_recorded_panel_builds(recorded_mode):
    pytest.importorskip("ipywidgets")
    ex.panel("streams.fsdp_step", streams.plot_fsdp_step,
             params=["version", "group", "gpu_ms", "host_delay_ms", "reshard_after_forward", "layers", "layer_mib"],
             mode=streams.fsdp_mode())


def test_claim_predicates_fail_when_the_data_says_so(recorded_mode):
    r = recorded("streams.fsdp_runahead", group="nccl")
    d = r.data
    lo, hi = F._ends(d)
    flat = claims.get_claim("streams.fsdp2_flat").predicate
    assert flat(d)[0]
    d["versions"]["fsdp2"]["peak_active_bytes"][hi] += 2 * d["param_bytes"]
    assert not flat(d)[0]
    grows = claims.get_claim("streams.fsdp1_follows_runahead").predicate
    d2 = recorded("streams.fsdp_runahead", group="nccl").data
    assert grows(d2)[0]
    d2["versions"]["fsdp1"]["peak_active_bytes"][hi] = d2["versions"]["fsdp1"]["peak_active_bytes"][lo]
    assert not grows(d2)[0]
    limit = claims.get_claim("streams.fsdp1_limit_bounds").predicate
    d3 = recorded("streams.fsdp_runahead", group="fake").data
    assert limit(d3)[0]
    d3["versions"]["fsdp1"]["peak_active_bytes"] = list(d3["versions"]["fsdp1_nolimit"]["peak_active_bytes"])
    assert not limit(d3)[0]
    bounded = claims.get_claim("streams.fsdp2_allgather_bounded").predicate
    d4 = recorded("streams.fsdp_runahead", group="fake").data
    assert bounded(d4)[0]
    d4["versions"]["fsdp2"]["param_buffers"][hi] += 5
    assert not bounded(d4)[0]


def test_check_fsdp_limit():
    assert streams.check_fsdp_limit(None).correct is None
    assert streams.check_fsdp_limit("b").correct is True
    for wrong in "acd":
        fb = streams.check_fsdp_limit(wrong)
        assert fb.correct is False
        assert any(w in fb.message for w in ("NO_SHARD", "low-precision", "free events")), fb.message


def test_notebook_section():
    from pathlib import Path

    src = (Path(__file__).resolve().parent.parent / "book" / "src" / "ch2_cross_stream.py").read_text()
    section = src[src.index("(ch2-fsdp)="):src.index("## In your own code")]
    assert "One GPU, world\n#   size 1: FSDP's own streams, events and allocator calls; no network." in section
    assert "has\n# not been run for this book" in section                # what a multi-GPU run adds
    assert 'streams.fsdp_run("streams.fsdp_runahead")' in section and "mode=streams.fsdp_mode()" in section
    assert "from experiments import doctor" in section and "doctor.replay(doctor.read(" in section
    assert "streams.check_fsdp_limit(" in section
    assert "ex.run(" not in section, "the section goes through fsdp_run: the fallback where no group starts"


# ================================================================ GPU: FSDP's own code, live

SECTION_BUDGET_S = 60.0   # the chapter's live budget; the section must fit well inside it
T4_CAP_MIB = 15 * 1024    # a Colab T4's usable memory


def section_cells() -> list[str]:
    """The chapter's import cell and the FSDP section's code cells, from the notebook source
    (percent format, read without jupytext: the lab GPU has no Jupyter packages)."""
    from pathlib import Path

    src = (Path(__file__).resolve().parent.parent / "book" / "src" / "ch2_cross_stream.py").read_text()
    cells, current, is_code = [], [], False
    for line in src.splitlines() + ["# %%"]:
        if line.startswith("# %%"):
            if current:
                cells.append((is_code, "\n".join(current)))
            current, is_code = [], "[markdown]" not in line
        else:
            current.append(line)
    start = next(i for i, (code, text) in enumerate(cells) if "(ch2-fsdp)=" in text)
    end = next(i for i, (code, text) in enumerate(cells) if "## In your own code" in text)
    first = next(text for code, text in cells if code)
    return [first] + [text for code, text in cells[start:end] if code]


@pytest.fixture(scope="module")
def live_section():
    """The FSDP section's cells run live, top to bottom, as a reader's kernel would, under a
    T4-sized cap: 15 GiB for this process and for every fresh process FSDP runs in. Returns
    the section's namespace and its wall time (s)."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (run on the lab GPU: pytest -m gpu)")
    total = torch.cuda.get_device_properties(0).total_memory
    saved_cap = F.CAP_MIB
    F.CAP_MIB = T4_CAP_MIB
    F._forget_shared()
    registry._LIVE_CACHE.clear()
    torch.cuda.set_per_process_memory_fraction(min(1.0, T4_CAP_MIB * MiB / total))
    ns: dict = {}
    try:
        t0 = time.perf_counter()
        for cell in section_cells():
            t = time.perf_counter()
            exec(compile(cell, "<ch2 fsdp section>", "exec"), ns)
            print(f"  {time.perf_counter() - t:5.1f} s  {cell.strip().splitlines()[-1][:90]}")
        elapsed = time.perf_counter() - t0
        print(f"the FSDP section, live under a {T4_CAP_MIB} MiB cap: {elapsed:.1f} s")
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        F.CAP_MIB = saved_cap
    return ns, elapsed


@pytest.mark.gpu
def test_live_section_runs_under_a_t4_cap_within_the_budget(live_section):
    ns, elapsed = live_section
    assert elapsed < SECTION_BUDGET_S, f"the FSDP section took {elapsed:.1f} s live"
    assert not ns["ws1"].recorded and not ns["fsdp1_step"].recorded, "the section fell back to the recording"
    assert streams.fsdp_mode() is None


@pytest.mark.gpu
def test_live_fsdp_claims_hold(live_section):
    ns, _ = live_section
    for cid in FSDP_CLAIMS:
        r = claims.evaluate(claims.get_claim(cid), mode="live")
        assert r.holds, f"{cid} does not hold live: {r.measured} {r.error}"
    assert ns["ws1"]["group"] == "nccl" and ns["ws2"]["group"] == "fake"


@pytest.mark.gpu
def test_live_world_size_1_gathers_nothing(live_section):
    ns, _ = live_section
    d = ns["ws1"].data
    assert d["world_size"] == 1
    for v in VERSIONS:
        assert d["versions"][v]["collectives"]["all_gather"] == 0, v
    assert d["versions"]["fsdp1"]["sharding"] == "NO_SHARD"
    assert "all-gather copy-in" not in d["versions"]["fsdp2"]["streams"]
    fake = ns["ws2"].data
    assert fake["world_size"] == 2 and fake["versions"]["fsdp2"]["collectives"]["all_gather"] >= 2 * d["layers"]
    assert fake["versions"]["fsdp1"]["sharding"] == "FULL_SHARD"


@pytest.mark.gpu
def test_live_snapshots_replay_exactly(live_section):
    ns, _ = live_section
    for step, run in ns["replays"]:
        assert run.matches_trace, (step.params, run.first_mismatch)
        marks = {i: (a, r) for i, a, r in run.marks}
        for ph in step["phases"]:
            i = ph["trace_index"] - 1 if ph["trace_index"] - 1 in marks else ph["trace_index"]
            assert marks[i] == (ph["allocated_bytes.all.current"], ph["reserved_bytes.all.current"]), ph
    nolimit = ns["fsdp1_step"]
    assert nolimit["deferred_frees"] > 0 and nolimit["streams"]["unshard"]["max_parked_blocks"] >= 4


@pytest.mark.gpu
def test_chapter_2_runs_live_in_60_seconds():
    """The whole chapter 2 notebook, FSDP section included, live on this GPU in at most 60 s,
    a chapter's live budget (CONTRIBUTING). 57.4 s on the H200 before the replay figure (the
    FSDP section 31 s of it): the section is what brings the chapter near its budget. Needs
    nbclient, nbformat and ipykernel (carry them to the GPU machine)."""
    from datetime import datetime

    from tests.booktools import ROOT, execute_notebook

    pytest.importorskip("nbformat")
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    t0 = time.perf_counter()
    nb = execute_notebook(ROOT / "book" / "ch2_cross_stream.ipynb", "live", timeout=300)
    elapsed = time.perf_counter() - t0

    def seconds(cell):  # nbclient's stamps of the cell's start and end
        t = cell.get("metadata", {}).get("execution", {})
        if "iopub.execute_input" not in t or "shell.execute_reply" not in t:
            return 0.0
        a, b = (datetime.fromisoformat(t[k].replace("Z", "+00:00")) for k in ("iopub.execute_input", "shell.execute_reply"))
        return (b - a).total_seconds()

    print(f"chapter 2 live: {elapsed:.1f} s; slowest cells:")
    for cell in sorted(nb.cells, key=seconds, reverse=True)[:6]:
        print(f"  {seconds(cell):5.1f} s  {cell.source.splitlines()[0][:80] if cell.source else ''}")
    fell_back = [o.get("text", "") for c in nb.cells for o in c.get("outputs", []) if "did not start" in o.get("text", "")]
    assert not fell_back, f"the FSDP section fell back to the recording: {fell_back}"
    assert elapsed <= 60, f"chapter 2 took {elapsed:.1f} s live (budget 60 s)"


def test_the_step_snapshots_are_recorded_only_when_named():
    """streams.fsdp_step (18 FSDP steps with their snapshots) is on a budget of its own, like the
    doctor's recordings: `record --chapter 2` leaves it out, `--experiment` records it."""
    from experiments.core import cli

    assert registry.get("streams.fsdp_step").own_budget and not registry.get("streams.fsdp_runahead").own_budget
    ids = [e.id for e in cli._select(2, None)]
    assert "streams.fsdp_step" not in ids and "streams.fsdp_runahead" in ids
