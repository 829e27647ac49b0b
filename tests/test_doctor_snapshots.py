"""The allocator doctor against the snapshots recorded on the lab H200 (alloc.doctor_snapshots).

Expectations come from the recorded GPU data (the trace's own segment events and the
memory_stats counters the GPU reported after each phase) or from PyTorch's rules, never
from the doctor's output.
"""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.doctor.answers.report import doctor
from experiments.doctor.model.engine import Engine
from experiments.allocator.model import GiB, MiB, AllocatorConfig, round_size
from experiments.doctor.answers.whatif import WhatIf, what_if
from experiments.doctor.replaying.replay import replay
from tests.snapshot_forms import torch_form
from experiments.doctor.errors import SnapshotError
from experiments.doctor.reading.loader import load
from experiments.doctor.reading.rows import ALLOC, FREE_REQ
from experiments.doctor.reading.trace import config_from_snapshot, read

RECORDED = Path(__file__).resolve().parent.parent / "experiments" / "recorded" / "alloc.doctor_snapshots" / "nvidia-h200.json"
DOC = json.loads(RECORDED.read_text())
RUNS = {(p["params"]["workload"], r["settings"]): r for p in DOC["points"] for r in p["data"]["runs"]}
# Recordings the doctor cannot replay (none at present; a reason would be asserted below).
NOT_REPLAYABLE: set[tuple[str, str]] = set()


def _id(key):
    return f"{key[0]}[{key[1] or 'default'}]"


@pytest.fixture(scope="module")
def replays():
    return {k: (read(r), replay(read(r))) for k, r in RUNS.items()}


def test_every_mechanism_was_recorded():
    """Each workload is there under more than one setting (streams, pools, cap, knobs, late start, model)."""
    workloads = {w for w, _ in RUNS}
    assert workloads == {"mixed", "streams", "pools", "cap", "late_start", "expandable_range", "training"}
    for w in workloads:
        assert sum(1 for k in RUNS if k[0] == w) >= 2
    assert RECORDED.stat().st_size < 1_000_000


@pytest.mark.parametrize("key", sorted(RUNS), ids=_id)
def test_recorded_snapshot_replays_exactly(replays, key):
    trace, run = replays[key]
    if key in NOT_REPLAYABLE:
        assert run.matches_trace is False and "expandable" in run.first_mismatch["reason"]
        return
    assert run.matches_trace, run.first_mismatch
    final = RUNS[key]["final"]
    assert run.final_reserved_bytes == final["reserved_bytes.all.current"]
    assert run.oom_events == final["num_ooms"]


@pytest.mark.parametrize("key", sorted(set(RUNS) - NOT_REPLAYABLE), ids=_id)
def test_replay_counters_equal_the_gpus_after_every_phase(replays, key):
    """At each phase the GPU reported memory_stats; the phase's _snapshot() is a trace entry."""
    _, run = replays[key]
    marks = {i: (a, r) for i, a, r in run.marks}
    checked = 0
    for ph in RUNS[key]["phases"]:
        if ph["trace_index"] == 0:
            continue
        # the mark's own 'snapshot' entry sits at trace_index - 1 or trace_index (whether the
        # length torch returned counted it depends on when the entry was appended)
        i = ph["trace_index"] - 1 if ph["trace_index"] - 1 in marks else ph["trace_index"]
        got = marks[i]
        assert got == (ph["allocated_bytes.all.current"], ph["reserved_bytes.all.current"]), ph["phase"]
        checked += 1
    assert checked >= 2


def _requests(key):
    return [(e[0], e[2]) for e in read(RUNS[key]).events if e[0] in (ALLOC, FREE_REQ)]


# What-ifs from the default run equal the run recorded under the other setting, exactly.
# The others differ: which of two equal free blocks is reused depends on the driver's
# segment addresses (experiments/doctor/RULES.md §I.3), which a what-if knows only while it makes the
# same cudaMalloc/cudaFree calls as the recorded run; and an empty_cache() that released
# nothing leaves no trace entry, so a what-if cannot repeat it ('mixed' calls it often).
EXACT_WHAT_IFS = [("streams", "expandable_segments:True"), ("pools", "expandable_segments:True"),
                  ("cap", "expandable_segments:True"), ("cap", "max_split_size_mb:64"),
                  ("cap", "garbage_collection_threshold:0.6"), ("expandable_range", "expandable_segments:True"),
                  ("training", "expandable_segments:True"), ("training", "max_split_size_mb:64")]


@pytest.mark.parametrize("key", EXACT_WHAT_IFS, ids=_id)
def test_what_if_equals_the_run_recorded_under_that_setting(replays, key):
    base_key = (key[0], "")
    assert _requests(key) == _requests(base_key), "the program's requests must be the same to compare"
    base_trace, base = replays[base_key]
    run, _ = what_if(base, WhatIf.parse(key[1]), cap_bytes=base_trace.cap_bytes,
                     total_memory=base_trace.total_memory)
    gpu = RUNS[key]
    assert run.final_reserved_bytes == gpu["final"]["reserved_bytes.all.current"]
    assert run.peak_reserved_bytes == max(p["reserved_bytes.all.peak"] for p in gpu["phases"])
    assert run.oom_events == gpu["final"]["num_ooms"]


def test_what_if_for_the_real_model_ranks_the_settings_like_the_gpu(replays):
    """Training loop: expandable segments reserve the least, max_split_size_mb:64 the most,
    on the GPU and in the what-if, and every what-if is within 3 % of the GPU's own run."""
    base_trace, base = replays[("training", "")]
    got = {}
    for s in ("expandable_segments:True", "max_split_size_mb:64", "roundup_power2_divisions:4"):
        run, _ = what_if(base, WhatIf.parse(s), total_memory=base_trace.total_memory)
        got[s] = run.final_reserved_bytes
    gpu = {s: RUNS[("training", s)]["final"]["reserved_bytes.all.current"] for s in got}
    assert sorted(got, key=got.get) == sorted(gpu, key=gpu.get)
    for s in got:
        assert abs(got[s] - gpu[s]) <= 0.03 * gpu[s], s


def test_expandable_range_is_one_and_an_eighth_of_the_device():
    """GPU (H200, 2.11): alloc 60 GiB, 1 GiB, 60 GiB; free A, C; empty_cache; alloc 100 GiB - 10 MiB
    leaves 1,040 MiB + 102,400 MiB reserved, the big one in a new range."""
    run = RUNS[("expandable_range", "expandable_segments:True")]
    big = next(p for p in run["phases"] if p["phase"] == "big")
    assert big["reserved_bytes.all.current"] == (1040 + 102400) * MiB
    maps = [e for e in read(run).events if e[0] == 5]
    assert maps[-1][2] == 102400 * MiB
    eng = Engine(AllocatorConfig(expandable_segments=True), total_memory=run["device_total_bytes"])
    a, b, c = (eng.malloc(n) for n in (60 * GiB, 1 * GiB, 60 * GiB))
    for blk in (a, c):
        eng.free_requested(blk)
        eng.free_completed(blk)
    eng.empty_cache()
    eng.malloc(100 * GiB - 10 * MiB)
    assert sorted(s["total_size"] for s in eng.segments()) == [1040 * MiB, 102400 * MiB]


def test_roundup_list_starting_with_gt_leaves_small_sizes_alone():
    """The GPU's own parsed table for '[>:2]' has entry '1' (sizes < 2 MiB) at 0: 2,100 B -> 2,560 B."""
    settings = RUNS[("mixed", "roundup_power2_divisions:[>:2]")]["snapshot"]["allocator_settings"]
    assert settings["roundup_power2_divisions"]["1"] == 0
    _, from_gpu = config_from_snapshot(settings)
    parsed = AllocatorConfig.from_settings("roundup_power2_divisions:[>:2]")
    assert parsed.roundup_divisions == from_gpu.roundup_divisions
    assert round_size(2100, parsed) == 2560
    assert AllocatorConfig.from_settings(settings) == parsed
    # and in the GPU's trace: the 2,100 B probe is the first block; the next small one starts 2,560 B on
    events = read(RUNS[("mixed", "roundup_power2_divisions:[>:2]")]).events
    first = next(e for e in events if e[0] == ALLOC)
    assert first[2] == 2100
    after = next(e[1] for e in events if e[0] == ALLOC and first[1] < e[1] < first[1] + 2 * MiB)
    assert after - first[1] == 2560


def test_a_dump_snapshot_pickle_replays(tmp_path):
    rec = RUNS[("training", "")]
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(torch_form(rec["snapshot"])))
    rep = doctor(str(path))
    assert rep.replay.matches_trace
    assert rep.replay.final_reserved_bytes == rec["final"]["reserved_bytes.all.current"]


class _WritesAFile:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_malicious_pickle_runs_nothing(tmp_path):
    target = tmp_path / "pwned.txt"
    blob = pickle.dumps({"segments": [], "device_traces": [[]], "x": _WritesAFile(str(target))})
    assert not target.exists()
    with pytest.raises(SnapshotError, match="refusing to load"):
        load(blob)
    assert not target.exists()


def _cli(*args, cwd=None):
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    return subprocess.run([sys.executable, "-m", "experiments", "doctor", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=120)


@pytest.fixture(scope="module")
def snap_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("doctor") / "cap.json"
    p.write_text(json.dumps(RUNS[("cap", "")]["snapshot"]))
    return p


def test_cli_json_has_the_promised_fields(snap_file):
    out = _cli(str(snap_file), "--json", "--what-if", "expandable_segments:True", "--what-if", "max_split_size_mb:64")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    # the first format's four fields are still there, beside format, device_total_bytes, cap_bytes,
    # cap_source, oom and suggestion (experiments.doctor.answers.report.JSON_FIELDS): none is removed
    assert {"trace_events", "settings", "replay", "what_if"} <= set(doc)
    assert doc["replay"]["matches_trace"] is True and doc["replay"]["first_mismatch"] is None
    assert doc["replay"]["final_reserved_bytes"] == RUNS[("cap", "")]["final"]["reserved_bytes.all.current"]
    assert [w["settings"] for w in doc["what_if"]] == ["expandable_segments:True", "max_split_size_mb:64"]
    gpu = RUNS[("cap", "expandable_segments:True")]["final"]
    assert doc["what_if"][0]["final_reserved_bytes"] == gpu["reserved_bytes.all.current"]
    assert doc["what_if"][0]["oom_events"] == gpu["num_ooms"] == 1


@pytest.mark.parametrize("case", ["not_a_snapshot", "truncated", "unknown_option", "negative_cap", "bad_setting",
                                  "missing_file"])
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, snap_file, case):
    text = tmp_path / "notes.txt"
    text.write_text("hello, not a snapshot\n")
    trunc = tmp_path / "trunc.pickle"
    trunc.write_bytes(pickle.dumps(torch_form(RUNS[("streams", "")]["snapshot"]))[:300])
    args = {"not_a_snapshot": [str(text)], "truncated": [str(trunc)], "unknown_option": [str(snap_file), "--bogus"],
            "negative_cap": [str(snap_file), "--cap", "-5"],
            "bad_setting": [str(snap_file), "--what-if", "max_split_size_mb:abc"],
            "missing_file": [str(tmp_path / "nope.pickle")]}[case]
    out = _cli(*args)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), out.stderr
    assert "Traceback" not in out.stderr


def test_the_report_names_what_pins_the_reserved_memory():
    rep = doctor(RUNS[("training", "")], what_if=["expandable_segments:True"])
    text = rep.text()
    assert "matches the trace exactly" in text and "pinned by live blocks" in text
    assert "expandable_segments:True" in text


def test_an_unknown_trace_entry_stops_the_replay_there():
    snap = torch_form(RUNS[("streams", "")]["snapshot"])
    snap["device_traces"][0].insert(10, {"action": "defragment", "addr": 0, "size": 0, "stream": 0})
    run = replay(read(snap))
    assert run.matches_trace is False
    assert run.first_mismatch["event_index"] == 10 and "defragment" in run.first_mismatch["reason"]


def test_recording_takes_one_fresh_process_per_workload_and_setting(monkeypatch):
    """Settings are read once per process: each (workload, setting) gets its own, 21 in all."""
    from experiments.doctor.lab import snapshots as lab_snapshots
    from experiments.core import device, runner

    calls = []

    class Fake:
        def __init__(self, value):
            self.value = value

        def unwrap(self):
            return self.value

    def fake_run_fresh(target, kwargs, alloc_conf_settings=None, timeout_s=0):
        calls.append((kwargs["workload"], alloc_conf_settings or ""))
        return Fake({k: v for k, v in RUNS[(kwargs["workload"], alloc_conf_settings or "")].items() if k != "settings"})

    monkeypatch.setattr(runner, "run_fresh", fake_run_fresh)
    monkeypatch.setattr(device, "require_cuda", lambda *a, **k: None)
    for w in lab_snapshots.WORKLOADS:
        out = lab_snapshots.doctor_snapshots(workload=w)
        assert [r["settings"] for r in out["runs"]] == list(lab_snapshots.SETTINGS[w])
    assert sorted(calls) == sorted(RUNS)
    assert len(calls) == 21
    with pytest.raises(ValueError, match="workload"):
        lab_snapshots.doctor_snapshots(workload="resnet")


def test_the_exercise_answer_comes_from_the_gpus_runs():
    from experiments.allocator.checks import check_doctor_setting

    gpu = {s: RUNS[("training", s)]["final"]["reserved_bytes.all.current"]
           for s in ("", "max_split_size_mb:64", "roundup_power2_divisions:4")}
    assert gpu[""] < gpu["max_split_size_mb:64"] and gpu[""] < gpu["roundup_power2_divisions:4"]  # 'neither'
    assert check_doctor_setting("d").correct and check_doctor_setting(" D ").correct
    assert not check_doctor_setting("c").correct
    assert check_doctor_setting(None).correct is not True


def test_simulate_points_a_snapshot_to_the_doctor():
    from experiments.allocator.model import simulate

    with pytest.raises(ValueError, match="al.doctor"):
        simulate(RUNS[("streams", "")]["snapshot"])


def test_the_doctor_recordings_are_recorded_only_when_named():
    """alloc.doctor_snapshots (21 fresh processes, ~140 s) has a budget of its own: `record` and
    `record --chapter 1` leave it out; `record --experiment alloc.doctor_snapshots` records it."""
    from experiments.core import cli, registry

    assert registry.get("alloc.doctor_snapshots").own_budget
    for chapter in (None, 1):
        ids = [e.id for e in cli._select(chapter, None)]
        assert "alloc.doctor_snapshots" not in ids and "alloc.anatomy" in ids
    assert [e.id for e in cli._select(None, ["alloc.doctor_snapshots"])] == ["alloc.doctor_snapshots"]
    assert "--experiment alloc.doctor_snapshots" in " ".join(
        cli.build_parser(["record"])._subparsers._group_actions[0].choices["record"].description.split())


def test_every_chapter_records_within_its_budget_without_the_doctor_set():
    """From the recorded files' own timings: every experiment but the doctor's validation set
    took under 180 s on the lab H200 (the whole book's recording goal)."""
    from experiments.core import registry, store

    total = 0.0
    for e in registry.all_experiments():
        if e.own_budget:
            continue
        rec = store.load(e.id, data_schema=e.data_schema)
        total += sum(p.elapsed_s or 0 for p in rec.points)
    assert total < 180, f"{total:.0f} s"
