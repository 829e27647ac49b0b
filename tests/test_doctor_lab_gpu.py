"""The allocator doctor on a GPU: live snapshots replayed, and compared with the live counters.

Each workload of ``alloc.doctor_snapshots`` runs in a fresh process (its settings are read
when CUDA starts), returns its snapshot and the GPU's memory_stats after each phase; the
doctor must replay the snapshot exactly and reach the same allocated and reserved bytes at
every phase. One more test records inside this process, after other tests have left
tensors and cached segments behind (a late start).
"""
import pytest

from experiments.doctor.answers.report import doctor
from experiments.doctor.lab.snapshots import SETTINGS
from experiments.doctor.reading.trace import compact_snapshot
from experiments.doctor.replaying.replay import replay
from experiments.doctor.reading.trace import read
from experiments.core.runner import run_fresh

pytestmark = pytest.mark.gpu

CASES = [(w, s) for w, settings in SETTINGS.items() for s in settings[:2]]


@pytest.mark.parametrize("workload,settings", CASES, ids=[f"{w}[{s or 'default'}]" for w, s in CASES])
def test_live_snapshot_replays_and_matches_the_counters(workload, settings):
    value = run_fresh("experiments.doctor.lab.snapshots:snapshot_worker", {"workload": workload},
                      alloc_conf_settings=settings or None, timeout_s=300).unwrap()
    run = replay(read(value))
    assert run.matches_trace, run.first_mismatch
    marks = {i: (a, r) for i, a, r in run.marks}
    for ph in value["phases"]:
        if ph["trace_index"] == 0:
            continue
        i = ph["trace_index"] - 1 if ph["trace_index"] - 1 in marks else ph["trace_index"]
        assert marks[i] == (ph["allocated_bytes.all.current"], ph["reserved_bytes.all.current"]), ph["phase"]
    assert run.final_reserved_bytes == value["final"]["reserved_bytes.all.current"]


def test_snapshot_of_this_process_started_late():
    import torch

    keep = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in (3 << 20, 700 << 10, 25 << 20)]
    torch.cuda.memory._record_memory_history(context=None, max_entries=100_000)
    try:
        more = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in (5 << 20, 300 << 10, 40 << 20)]
        del keep[1], more[0]
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    reserved, allocated = torch.cuda.memory_reserved(), torch.cuda.memory_allocated()
    rep = doctor(compact_snapshot(snap, device=torch.cuda.current_device()), what_if=["expandable_segments:True"])
    assert rep.replay.matches_trace, rep.replay.first_mismatch
    assert rep.replay.final_reserved_bytes == reserved
    assert rep.replay.final_allocated_bytes == allocated
    del keep, more


def test_own_snapshot_is_one_fresh_process_of_a_few_seconds_and_replays_exactly():
    """Chapter 1's live doctor section records one snapshot of the reader's GPU (the section
    took 77 s when it recorded the lab's 21 settings live: a live page has 60 s)."""
    import time

    from experiments.doctor.lab.snapshots import own_snapshot

    t0 = time.perf_counter()
    mine = own_snapshot(mode="live")
    elapsed = time.perf_counter() - t0
    assert mine["source"].startswith("live on ") and mine["settings"] == ""
    rep = doctor(mine, what_if=["expandable_segments:True"], suggest=True)
    assert rep.replay.matches_trace, rep.replay.first_mismatch
    assert rep.replay.final_reserved_bytes == mine["final"]["reserved_bytes.all.current"]
    print(f"own_snapshot: {elapsed:.1f} s")
    assert elapsed < 20, f"recording one snapshot took {elapsed:.1f} s"


def test_chapter_1_runs_live_in_60_seconds():
    """The whole chapter 1 notebook, live on this GPU, in at most 60 s (a live page's budget).
    Needs nbclient, nbformat and ipykernel (carry them to the GPU machine)."""
    import time

    from tests.booktools import ROOT, execute_notebook

    pytest.importorskip("nbformat")
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    t0 = time.perf_counter()
    nb = execute_notebook(ROOT / "book" / "ch1_caching_allocator.ipynb", "live", timeout=300)
    elapsed = time.perf_counter() - t0
    print(f"chapter 1 live: {elapsed:.1f} s; slowest cells:")
    from datetime import datetime

    def seconds(cell):  # nbclient stamps each cell's start and end (record_timing)
        t = cell.get("metadata", {}).get("execution", {})
        if "iopub.execute_input" not in t or "shell.execute_reply" not in t:
            return 0.0
        stamp = [datetime.fromisoformat(t[k].replace("Z", "+00:00")) for k in ("iopub.execute_input", "shell.execute_reply")]
        return (stamp[1] - stamp[0]).total_seconds()

    for cell in sorted(nb.cells, key=seconds, reverse=True)[:8]:
        print(f"  {seconds(cell):5.1f} s  {cell.source.splitlines()[0][:80] if cell.source else ''}")
    assert elapsed <= 60, f"chapter 1 took {elapsed:.1f} s live (goal 60 s)"
