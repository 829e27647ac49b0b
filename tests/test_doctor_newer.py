"""The doctor on snapshots of newer torch, other GPUs, settings it does not know, caps below the
need and traces with skipped actions (issue 24, items 1-7).

Expectations come from torch's releases (the 2.12-2.14 wheels' binaries and headers, read in the
notes of issue 24 and RULES.md §G), from the GPU's own recorded runs, or from the small separate
model of tests/doctor_torch_versions.py, never from the doctor's output.
"""
from __future__ import annotations

import copy
import gzip
import json
import pickle
import time
from pathlib import Path

import pytest

from experiments.doctor import AllocatorConfig, Limits, SnapshotError, WhatIf, doctor, read, replay, what_if

from . import doctor_torch_versions as V
from .snapshot_forms import torch_form

ROOT = Path(__file__).resolve().parent.parent
PICKLES = ROOT / "benchmarks" / "data" / "doctor_cases"
CASES = json.loads((ROOT / "experiments" / "recorded" / "alloc.doctor_cases" / "nvidia-h200.json").read_text())
CASE_RUNS = {(p["params"]["case"], r["settings"]): r for p in CASES["points"] for r in p["data"]["runs"]}
MiB, GiB = 1 << 20, 1 << 30
H200 = 150_109_880_320
NOT_ON_GPU = "read from the source, not yet checked on a GPU"


def _raw(name: str) -> dict:
    with gzip.open(PICKLES / f"{name}.pickle.gz") as f:
        return pickle.load(f)   # our own recording: safe to unpickle here


def _cpu(fn, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best


# ----------------------------------------------------------------------------- 1. newer layouts

def _mempools_two_pool(entry: dict) -> tuple[int, int]:
    # the program (doctor_programs._mempools_two_program): the first MemPool on the default
    # stream (sizes off whole MiB), the second on the side stream, whole MiB outside both
    if entry["stream"] != 0:
        return (0, 2)
    return (0, 0) if entry["size"] % MiB == 0 else (0, 1)


@pytest.mark.parametrize("layout", ["2.12", "2.14"])
@pytest.mark.parametrize("proto", [2, 4, 5])
def test_a_newer_layout_reads_as_the_same_trace_with_its_pool_ids(layout, proto):
    raw = _raw("mempools_two")
    old = read(pickle.dumps(raw, protocol=proto))
    snap = V.as_layout(raw, layout, alloc_pool=_mempools_two_pool, forward_every=2)
    new = read(pickle.dumps(snap, protocol=proto))
    assert list(new.events) == list(old.events)
    assert new.segments == old.segments and new.settings == old.settings
    assert old.pool_ids is None and old.layout == "2.11" and new.layout == layout
    # every entry's pool id and forward stack, as pickle.loads reads them (the oracle: our own data)
    want = [e for e in pickle.loads(pickle.dumps(snap, protocol=proto))["device_traces"][0] if e["action"] != "annotate"]
    assert [new.pool_of(i) for i in range(len(new.events))] == [tuple(e["pool_id"]) for e in want]
    assert [new.forward_frames(i) for i in range(len(new.events))] == [
        [(f["filename"], f["line"], f["name"]) for f in e.get("forward_frames", [])] for e in want]
    assert {new.pool_of(i) for i in range(len(new.events))} == {(0, 0), (0, 1), (0, 2)}


def test_the_2_12_layout_reads_at_most_1_5_times_slower_than_2_11():
    raw = _raw("eager_long")
    raw["device_traces"] = [raw["device_traces"][0][:150_000]]
    b11 = pickle.dumps(raw, protocol=4)
    b12 = pickle.dumps(V.as_layout(raw, "2.12", forward_every=3), protocol=4)
    # interleaved, best of 9 each: CPU time on a shared machine is disturbed in bursts (best of 5
    # gave 1.61 once while make test's other worker ran the browser tests; 1.36-1.48 idle)
    t11 = t12 = float("inf")
    for _ in range(9):
        t11, t12 = min(t11, _cpu(lambda: read(b11), 1)), min(t12, _cpu(lambda: read(b12), 1))
    assert t12 <= 1.5 * t11, (t11, t12)


def _million(pool: bool = True) -> bytes:
    """One million trace entries of one 2 MiB-segment program (alloc, free_requested,
    free_completed of 512 B blocks), in the 2.12 layout, as torch writes them: a new frames list
    and a new pool_id tuple per entry, the frame dicts shared."""
    frames = [{"name": "step", "filename": "train.py", "line": 12}]
    entries = [{"action": "segment_alloc", "addr": 1 << 40, "size": 2 * MiB, "stream": 0, "time_us": 0,
                "compile_context": "N/A", "user_metadata": "", "frames": frames, "pool_id": (0, 0)}]
    for k in range(333_333):
        for act in ("alloc", "free_requested", "free_completed"):
            e = {"action": act, "addr": 1 << 40, "size": 512, "stream": 0, "time_us": k,
                 "compile_context": "N/A", "user_metadata": "", "frames": list(frames) if act == "alloc" else []}
            if pool:
                e["pool_id"] = (0, 0)
            entries.append(e)
    seg = {"device": 0, "address": 1 << 40, "total_size": 2 * MiB, "allocated_size": 0, "active_size": 0,
           "requested_size": 0, "stream": 0, "segment_type": "small", "segment_pool_id": (0, 0),
           "is_expandable": False, "frames": [],
           "blocks": [{"address": 1 << 40, "size": 2 * MiB, "requested_size": 0, "state": "inactive", "frames": []}]}
    return pickle.dumps({"segments": [seg], "device_traces": [entries], "allocator_settings": {},
                         "external_annotations": []}, protocol=4)


@pytest.mark.slow
def test_a_million_entry_trace_loads_within_the_default_budget():
    t = read(_million())
    assert len(t.events) == 1_000_000


@pytest.mark.parametrize("field,small", [("budget_bytes", 64 << 10), ("max_events", 500)])
def test_every_budget_message_names_a_control_that_really_changes_it(field, small):
    data = pickle.dumps(V.as_layout(_raw("handoff"), "2.12"), protocol=4)
    with pytest.raises(SnapshotError) as err:
        read(data, limits=Limits(**{field: small}))
    msg = str(err.value)
    flags = {"--max-bytes": "max_bytes", "--max-events": "max_events", "--read-budget": "budget_bytes"}
    named = [f for f in flags if f in msg]
    assert named, msg
    # the control it names, raised, lets the same file load (and only that one changed)
    read(data, limits=Limits(**{field: small, flags[named[0]]: 1 << 30}))


# ----------------------------------------------------------------------------- 2. what newer traces carry

def test_pool_ids_on_the_entries_replace_the_pool_attribution_search():
    raw = _raw("mempools_two")
    old = replay(read(pickle.dumps(raw, protocol=4)))
    assert old.matches_trace and old.alternatives, "the 2.11 layout leaves pools open here"

    snap = V.as_layout(raw, "2.12", alloc_pool=_mempools_two_pool)
    new = replay(read(pickle.dumps(snap, protocol=4)))
    assert new.matches_trace, new.first_mismatch
    assert not new.alternatives and new.pool_choices == 0
    w, _ = what_if(new, WhatIf.parse("expandable_segments:True"))
    assert "pool attribution" not in w.uncertain


def test_forward_frames_give_the_oom_explanation_its_source_line():
    raw = _raw("cap_two_streams")                       # five probes ran out of memory; stacks recorded
    snap = V.as_layout(raw, "2.12", forward_every=1)
    rep = doctor(pickle.dumps(snap, protocol=4), cap_bytes=1024 * MiB)   # the cap it ran under (doctor_cases.CASES)
    assert rep.oom is not None and rep.oom["followed"]
    lines = [f for p in rep.oom["pinned"] for b in p["live_blocks"] for f in b.get("forward_frames", [])]
    assert ["model.py", 40, "forward"] in lines
    assert "backward of model.py:40 forward" in rep.text()


# ----------------------------------------------------------------------------- 3. version-aware rules

@pytest.mark.parametrize("version,layout", [("2.11", "2.11"), ("2.12", "2.12"), ("2.13", "2.13"), ("2.13", "2.14")])
@pytest.mark.parametrize("program", ["ties", "releases"])
def test_each_release_s_order_is_replayed_exactly_and_named(version, layout, program):
    m, marks = getattr(V, program)(version, layout=layout)
    settings = "max_split_size_mb:40" if program == "releases" else ""
    rep = doctor(pickle.dumps(m.snapshot(settings), protocol=4),
                 cap_bytes=m.cap if m.cap is not None else None)
    j = rep.to_json()
    assert j["replay"]["matches_trace"], j["replay"]["first_mismatch"]
    # the releases program cannot tell 2.12 from 2.13 (both release the older segment)
    assert j["allocator_rule"]["version"] == version or (program, version, j["allocator_rule"]["version"]) == (
        "releases", "2.12", "2.13")
    if version != "2.11":
        assert j["allocator_rule"]["note"] == NOT_ON_GPU
        assert NOT_ON_GPU in rep.text()


def test_the_rule_the_layout_suggests_is_confirmed_by_the_replay_and_the_others_tried():
    # 2.12 and 2.13 write the same layout: the replay tells them apart at the first tie
    for version in ("2.12", "2.13"):
        m, _ = V.ties(version)
        j = doctor(pickle.dumps(m.snapshot(), protocol=4)).to_json()
        assert j["replay"]["matches_trace"] and j["allocator_rule"]["version"] == version
        assert set(j["allocator_rule"]["tried"]) >= {version}


def test_what_ifs_of_a_newer_trace_use_its_rule():
    # released under 2.13 order: a what-if from the same trace keeps that order
    m, marks = V.releases("2.13")
    rep = doctor(pickle.dumps(m.snapshot("max_split_size_mb:40"), protocol=4), ["max_split_size_mb:40"],
                 cap_bytes=m.cap)
    w = rep.to_json()["what_if"][0]
    r = rep.to_json()["replay"]
    assert (w["peak_reserved_bytes"], w["final_reserved_bytes"]) == (r["peak_reserved_bytes"], r["final_reserved_bytes"])
    assert w["exact"]


# ----------------------------------------------------------------------------- 4. any GPU

def test_total_memory_sets_the_cap_fraction_and_the_report_says_which_it_assumed():
    raw = torch_form(CASE_RUNS[("capped_training", "")]["snapshot"])
    j = doctor(raw, ["expandable_segments:True"], cap_fraction=0.1, total_memory=16 * GiB).to_json()
    assert j["device_total_bytes"] == 16 * GiB and j["device_total_source"] == "given"
    assert j["cap_bytes"] == int(0.1 * 16 * GiB)
    j = doctor(raw, ["expandable_segments:True"], cap_fraction=0.1).to_json()
    assert j["device_total_source"] == "assumed" and j["device_total_bytes"] == H200
    assert any("device memory" in w for w in j["warnings"])


def test_per_process_memory_fraction_in_the_recorded_settings_is_a_cap_of_that_device():
    m, _ = V.releases("2.11")
    snap = m.snapshot("max_split_size_mb:40,per_process_memory_fraction:0.5")
    j = doctor(pickle.dumps(snap, protocol=4), total_memory=400 * MiB).to_json()
    assert j["cap_bytes"] == 200 * MiB and j["cap_source"] == "settings"
    assert j["replay"]["matches_trace"], j["replay"]["first_mismatch"]
    j = doctor(pickle.dumps(snap, protocol=4)).to_json()     # the device's memory is not known
    assert any("per_process_memory_fraction" in w and "--total-memory" in w for w in j["warnings"])


def test_the_expandable_range_follows_the_device_memory():
    from experiments.doctor import Engine

    cfg = AllocatorConfig.from_settings("expandable_segments:True")
    a100 = 85_089_157_120
    assert Engine(cfg, total_memory=a100).range_size(False) == 20 * MiB * -(-(a100 + a100 // 8) // (20 * MiB))
    j = doctor(torch_form(CASE_RUNS[("prefetch_pages", "")]["snapshot"]), ["expandable_segments:True"],
               total_memory=a100).to_json()
    assert j["device_total_bytes"] == a100


# ----------------------------------------------------------------------------- 5. settings as torch has them

def _with_settings(snap: dict, text: str) -> dict:
    snap = copy.deepcopy(snap)
    snap["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"] = text
    return snap


@pytest.mark.parametrize("option", ["release_lock_on_hipmalloc:True", "pinned_use_hip_host_register:False",
                                    "pinned_free_catch_all:True", "a_future_option_mb:64"])
def test_an_option_the_doctor_does_not_model_warns_and_the_replay_goes_on(option):
    m, _ = V.ties("2.11")
    rep = doctor(pickle.dumps(_with_settings(m.snapshot(), option), protocol=4))
    j = rep.to_json()
    assert j["replay"]["matches_trace"]
    name = option.split(":")[0]
    assert any(name in w for w in j["warnings"]) and name in rep.text()


def test_an_option_that_changes_placement_and_is_not_modelled_is_refused_by_name():
    from experiments.doctor import InputError

    m, _ = V.ties("2.11")
    with pytest.raises(InputError, match="backend"):
        doctor(pickle.dumps(_with_settings(m.snapshot(), "backend:cudaMallocAsync"), protocol=4))


def test_torch_s_own_bounds():
    # max_split_size_mb must be >= large_segment_size_mb (20 by default): 20 is accepted
    assert AllocatorConfig.from_settings("max_split_size_mb:20").max_split_size == 20 * MiB
    with pytest.raises(ValueError, match="max_split_size_mb"):
        AllocatorConfig.from_settings("max_split_size_mb:19")
    with pytest.raises(ValueError, match="max_split_size_mb"):
        AllocatorConfig.from_settings("large_segment_size_mb:40,max_split_size_mb:30")
    # max_non_split_rounding follows large_segment_size_mb unless given, and may not be below it
    assert AllocatorConfig.from_settings("large_segment_size_mb:40").max_non_split_rounding == 40 * MiB
    assert AllocatorConfig.from_settings("").max_non_split_rounding == 20 * MiB
    with pytest.raises(ValueError, match="max_non_split_rounding_mb"):
        AllocatorConfig.from_settings("large_segment_size_mb:40,max_non_split_rounding_mb:30")
    with pytest.raises(ValueError, match="large_segment_size_mb"):
        AllocatorConfig.from_settings("large_segment_size_mb:10")


def test_throw_on_cudamalloc_oom_refuses_before_releasing_cached_blocks():
    # 2.12+: with a cap, a segment the cap refuses is an out-of-memory error at once: no
    # release of cached blocks, no retry (the 2.12 wheel's malloc, NOTES §3)
    m, _ = V.releases("2.11")
    snap = pickle.dumps(m.snapshot("max_split_size_mb:40"), protocol=4)
    j = doctor(snap, ["max_split_size_mb:40", "max_split_size_mb:40,throw_on_cudamalloc_oom:True"],
               cap_bytes=m.cap).to_json()
    plain, throw = j["what_if"]
    assert plain["oom_events"] == 0 and throw["oom_events"] == 1 and throw["exact"]


def test_a_gc_threshold_with_an_unknown_cap_is_stated_not_taken_for_empty_cache():
    run = copy.deepcopy(CASE_RUNS[("gc_ages", "garbage_collection_threshold:0.5")])
    run["snapshot"]["memory_cap_bytes"] = None          # a reader's snapshot does not record it
    rep = doctor(run)
    j = rep.to_json()
    assert j["replay"]["matches_trace"], j["replay"]["first_mismatch"]
    assert not (j["replay"]["first_mismatch"] or {}).get("action", "").startswith("empty_cache")
    assert any("garbage_collection_threshold" in w and "cap" in w for w in j["warnings"])
    assert j["replay"]["final_reserved_bytes"] == run["final"]["reserved_bytes.all.current"]


# ----------------------------------------------------------------------------- 6. skip_actions

def _skip(snap: dict, action: str) -> dict:
    snap = copy.deepcopy(snap)
    snap["device_traces"] = [[e for e in t if e["action"] != action] for t in snap["device_traces"]]
    return snap


@pytest.mark.parametrize("case", ["handoff", "kv_two_streams", "prefetch_pages"])
def test_a_trace_without_free_requested_replays_exactly(case):
    run = CASE_RUNS[(case, "")]
    snap = _skip(torch_form(run["snapshot"]), "free_requested")
    rep = doctor(snap)
    j = rep.to_json()
    assert j["replay"]["matches_trace"], j["replay"]["first_mismatch"]
    assert j["replay"]["peak_reserved_bytes"] == run["final"]["reserved_bytes.all.peak"]
    assert j["replay"]["final_reserved_bytes"] == run["final"]["reserved_bytes.all.current"]
    assert any("free_requested" in w for w in j["warnings"])


@pytest.mark.parametrize("action", ["alloc", "segment_alloc", "free_completed"])
def test_a_trace_that_skipped_what_the_replay_needs_says_so_in_one_line(action):
    snap = _skip(torch_form(CASE_RUNS[("handoff", "")]["snapshot"]), action)
    j = doctor(snap).to_json()
    mm = j["replay"]["first_mismatch"]
    assert not j["replay"]["matches_trace"] and "skip_actions" in mm["reason"] and action in mm["reason"]
    assert "\n" not in mm["reason"]


# ----------------------------------------------------------------------------- 7. partial replays

def test_a_cap_below_the_need_is_never_silent():
    run = CASE_RUNS[("kv_two_streams", "")]
    cap = 40 * MiB                      # the program holds 54 MiB at once: nothing fits it
    rep = doctor(run, ["expandable_segments:True", ""], cap_bytes=cap, suggest=True)
    j = rep.to_json()
    assert j["replay"]["matches_trace"], j["replay"]["first_mismatch"]     # the recording had no cap
    assert j["replay"]["peak_reserved_bytes"] == run["final"]["reserved_bytes.all.peak"]
    assert any("below what the recording reserved" in w for w in j["warnings"])
    for w in j["what_if"]:
        assert not w["finished"] and w["oom_events"] >= 1 and w["stopped_at_request"] is not None
        assert w["peak_reserved_range_bytes"][1] <= cap + 20 * MiB
    text = rep.text()
    assert "runs out of memory at request" in text and "not suggested" in text
    assert j["suggestion"]["best"] is None and j["suggestion"]["alloc_conf"] is None
    assert all(not r["finished"] for r in j["suggestion"]["rows"])
