"""The allocator doctor against real programs recorded on the lab H200 (alloc.doctor_cases).

Every case is a real program of a class readers record (record_stream hand-overs, memory caps
with expandable segments or garbage collection, private pools of every kind, torch.compile's
CUDA-graph trees, a long eager loop), run on the GPU once per setting. Expectations come from
the GPU: the trace's own events, the counters it reported after each phase, and its own run
under each what-if setting; never from the doctor's output.
"""
from __future__ import annotations

import threading
import time

import pytest

from experiments.allocator import doctor_cases


def test_recording_runs_each_setting_in_a_fresh_process_several_at_once(monkeypatch, tmp_path):
    """Settings are read once per process: one fresh process per setting, up to five at once, the
    runs in the order of CASES, the raw snapshot written for the default run only."""
    from experiments.core import device, runner

    calls, running, most = [], [0], [0]
    lock = threading.Lock()

    class Done:
        ok, elapsed_s = True, 1.25

        def __init__(self, value):
            self.value = value

        def unwrap(self):
            return self.value

    def fake_run_fresh(target, kwargs, alloc_conf_settings=None, timeout_s=0):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
            calls.append((target, kwargs["case"], alloc_conf_settings or "", kwargs["pickle_path"]))
        time.sleep(0.05)
        with lock:
            running[0] -= 1
        return Done({"snapshot": {}, "phases": [], "final": {}, "device_total_bytes": 1})

    monkeypatch.setattr(runner, "run_fresh", fake_run_fresh)
    monkeypatch.setattr(device, "require_cuda", lambda *a, **k: None)
    monkeypatch.setenv("MEMLAB_DOCTOR_PICKLES", str(tmp_path))
    out = doctor_cases.doctor_cases(case="capped_training")
    settings = doctor_cases.CASES["capped_training"][1]
    assert [r["settings"] for r in out["runs"]] == list(settings) and len(settings) == 5
    assert out["cap_bytes"] == 1536 * 2**20 and out["case"] == "capped_training"
    assert sorted(c[2] for c in calls) == sorted(settings)
    assert {c[0] for c in calls} == {"experiments.allocator.doctor_cases:case_worker"}
    assert [c[3] for c in calls if c[2] == ""] == [str(tmp_path / "capped_training.pickle.gz")]
    assert [c[3] for c in calls if c[2]] == [None] * 4
    assert most[0] > 1, "the settings ran one after the other"
    with pytest.raises(ValueError, match="case"):
        doctor_cases.doctor_cases(case="resnet")


def test_every_case_has_a_program_the_defaults_first_and_a_setting_to_compare():
    assert set(doctor_cases.CASES) == set(doctor_cases.PROGRAMS)
    for case, (cap, settings) in doctor_cases.CASES.items():
        assert settings[0] == "" and len(settings) >= 2 and len(set(settings)) == len(settings), case
        assert cap is None or cap >= 512 * 2**20, case


def test_record_skips_the_on_demand_oracles_unless_named(monkeypatch, capsys):
    from experiments.core import cli, registry

    seen = []
    monkeypatch.setattr(registry, "record", lambda exps, **kw: (seen.append([e.id for e in exps]), ([], {}))[1])
    assert cli.main(["record", "--chapter", "1"]) == 0
    assert "alloc.doctor_cases" not in seen[-1] and "alloc.doctor_snapshots" in seen[-1]
    assert "skipped alloc.doctor_cases" in capsys.readouterr().out
    assert cli.main(["record", "--experiment", "alloc.doctor_cases"]) == 0
    assert seen[-1] == ["alloc.doctor_cases"]
