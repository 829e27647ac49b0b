"""Chapter 4 (hidden host-device syncs): CPU tests of everything that needs no GPU,
recorded-mode tests that read the lab's recordings in experiments/recorded/ (plots,
tables, checks and claims are exercised on those real values), and GPU tests
(``-m gpu``) that run the experiments live and assert the chapter's claims and key
behaviours.

No test writes or invents a recording. Where a test needs data the recording does not
hold (a claim that must fail, a driver that never drains), it edits a copy of the
recorded data; the case study's data assembly is tested on the CPU with its timing
functions replaced by stand-ins.
"""
from __future__ import annotations

import copy
import itertools
import json
import math
import re
from pathlib import Path

import pytest
from matplotlib.figure import Figure

import experiments as ex
from experiments.core import claims, registry, store
from experiments import syncs
from experiments.syncs import measurements as syncs_meas, model as syncs_model
from experiments.syncs import case as syncs_case, ops as syncs_ops

from .booktools import hidden_output_cells

ROOT = Path(__file__).resolve().parent.parent
SYNCS_IDS = ("syncs.run_ahead", "syncs.catalogue", "syncs.queue_probe", "syncs.pageable_threshold",
             "syncs.case_study", "syncs.blind_spots")
CLAIM_IDS = ("syncs.catalogue", "syncs.pageable_htod_blocks", "syncs.debug_mode_blind_spot",
             "syncs.case_study_speedup")
# The operations the issue names; each must be a row of the catalogue.
ISSUE_OPS = ("item", "print", "if_tensor", "mask_index", "nonzero", "unique", "masked_select", "repeat_interleave",
             "tensor_list", "to_cuda_pageable", "to_cuda_pageable_nb", "to_cuda_pinned_nb", "index_list",
             "index_tuple", "index_numpy", "index_cpu_tensor", "masked_fill", "where_3arg", "full", "index_cuda")


def recorded(exp_id: str, **params) -> registry.Result:
    """The lab's recording of one point (the default point unless ``params`` say otherwise)."""
    return ex.run(exp_id, mode="recorded", **params)


def edited(result: registry.Result, data: dict) -> registry.Result:
    """A copy of a recorded result with other data (for a test of how code reacts to it)."""
    return registry.Result(result.experiment, result.params, data, result.provenance, result.mode,
                           result.elapsed_s)


def _simulate_queue(variant: str, h: float, g: float, steps: int, k: int) -> float:
    """When the GPU finishes the run-ahead loop, from a step-by-step queue simulation (ms)."""
    t_host, gpu_free = 0.0, 0.0
    for i in range(steps):
        t_host += h
        gpu_free = max(t_host, gpu_free) + g
        if variant == "every_step" or (variant == "once" and i == k):
            t_host = gpu_free
    return gpu_free


# ================================================================ registry, params, budget

def test_experiments_and_claims_are_registered():
    assert sorted(e.id for e in registry.all_experiments(4)) == sorted(SYNCS_IDS)
    assert [c.id for c in claims.all_claims(4)] == list(CLAIM_IDS)
    for c in claims.all_claims(4):
        assert c.source == syncs.POST
        exp = registry.get(c.experiment)
        point = exp.complete(c.params)
        assert store.params_key(point) in {store.params_key(g) for g in exp.grid}, f"{c.id} is evaluated off-grid"


def _estimated_seconds(exp_id: str, pt: dict) -> float:
    """GPU-time model of one grid point: queued sleeps, timed calls and fixed overheads (s)."""
    n_ops = len(syncs_ops.OPS)
    if exp_id == "syncs.run_ahead":
        return 4 * 8 * (pt["host_ms"] + pt["gpu_ms"]) / 1e3 + 0.05  # a warm-up pass, then three variants
    if exp_id == "syncs.catalogue":
        return n_ops * (4 * (pt["work_ms"] + 0.5) + 40) / 1e3 + 0.5
    if exp_id == "syncs.queue_probe":
        return (4 * sum(syncs.QUEUED_MS) + 80) / 1e3  # 4 calls per queue depth, two builds of the inputs
    if exp_id == "syncs.pageable_threshold":
        return len(syncs.COPY_SIZES_KIB) * 3 * 4 * (pt["work_ms"] + 2) / 1e3 + 0.2
    if exp_id == "syncs.case_study":
        # Batch search (up to 9 doublings, 3 runs each behind a 3-step lead), then two
        # variants; on the lab GPU a step takes about (1 + balance) x 15 ms of host time.
        step_ms = (1 + pt["balance"]) * 15
        return (9 * 3 * (45 + 1.5 * step_ms) + 2 * (pt["steps"] + 6) * step_ms) / 1e3 + 1.0
    if exp_id == "syncs.blind_spots":
        return len(syncs.BLIND_SPOT_CASES) * 4 * 21 / 1e3
    raise KeyError(exp_id)


def test_whole_grid_fits_the_time_budget():
    total = sum(_estimated_seconds(e.id, pt) for e in registry.all_experiments(4) for pt in e.grid)
    total += 8.0  # the CUDA-graph probes: one fresh process (import torch, start CUDA, 37 captures)
    assert total < 75, f"chapter 4's grid is estimated at {total:.0f} s of GPU time; the budget is 60-90 s"


@pytest.mark.parametrize("exp_id, params, words", [
    ("syncs.run_ahead", {"host_ms": -1.0}, ["host_ms", "0.5"]),
    ("syncs.run_ahead", {"gpu_ms": 0.0}, ["gpu_ms", "4.0"]),
    ("syncs.catalogue", {"numel": 0}, ["numel", "4096"]),
    ("syncs.catalogue", {"numel": 10**12}, ["numel"]),
    ("syncs.catalogue", {"work_ms": 1000.0}, ["work_ms"]),
    ("syncs.queue_probe", {"op": "matmul"}, ["op", "'item'"]),
    ("syncs.pageable_threshold", {"work_ms": -5.0}, ["work_ms", "30.0"]),
    ("syncs.case_study", {"balance": 0.0}, ["balance", "1.0"]),
    ("syncs.case_study", {"steps": 0}, ["steps", "[10, 200]"]),
    ("syncs.case_study", {"steps": 1000}, ["steps", "[10, 200]"]),
    ("syncs.blind_spots", {"work_ms": 20.0}, ["work_ms", "parameters are"]),
    ("syncs.catalogue", {"size": 4096}, ["size", "parameters are"]),
])
def test_bad_parameters_are_rejected_before_any_gpu_work(exp_id, params, words):
    with pytest.raises(ValueError) as err:
        ex.run(exp_id, mode="recorded", **params)
    for w in words:
        assert w in str(err.value), f"{err.value!r} should mention {w!r}"


@pytest.mark.parametrize("func, kwargs, word", [
    (syncs.run_ahead, {"host_ms": -1.0}, "host_ms"),
    (syncs.catalogue, {"numel": -4096}, "numel"),
    (syncs.queue_probe, {"op": "bogus"}, "op"),
    (syncs.pageable_threshold, {"work_ms": 0.0}, "work_ms"),
    (syncs.case_study, {"steps": 0}, "steps"),
    (syncs.case_study, {"balance": 3.0}, "balance"),
])
def test_direct_calls_validate_too(func, kwargs, word):
    with pytest.raises(ValueError, match=word):
        func(**kwargs)


def test_get_op_rejects_unknown_ids():
    with pytest.raises(ValueError, match="op must be one of"):
        syncs_ops.get_op("matmul")


# ================================================================ the operations

def test_catalogue_covers_every_operation_the_issue_names():
    assert len(set(syncs.OP_IDS)) == len(syncs.OPS)
    missing = [i for i in ISSUE_OPS if i not in syncs.OP_IDS]
    assert not missing, f"operations named by the issue but absent from the catalogue: {missing}"
    assert {op.group for op in syncs.OPS} == set(syncs_ops.GROUPS)
    for op in syncs.OPS:
        assert callable(op.build) and op.code and op.why


def test_expected_partition_matches_the_lab_report():
    """Field report #14's partition on torch 2.11: these sync, these do not."""
    flagged = {"item", "mask_index", "nonzero", "where_1arg", "masked_select", "unique", "if_tensor",
               "repeat_interleave", "to_cuda_pageable", "cpu", "print", "tensor_list", "tensor_scalar"}
    quiet = {"mask_assign", "where_3arg", "masked_fill", "full", "any", "repeat_interleave_size",
             "to_cuda_pinned_nb", "fill_device_scalar", "index_cuda", "slice", "add_cpu_scalar"}
    by_id = syncs_ops.OPS_BY_ID
    assert all(by_id[i].expected_sync is True for i in flagged)
    assert all(by_id[i].expected_sync is False for i in quiet)
    assert by_id["to_cuda_pageable_nb"].expected_sync is None


def test_claim_rows_exist():
    for op_id in syncs.CATALOGUE_SYNCING + syncs.CATALOGUE_QUIET:
        assert op_id in syncs.OP_IDS
    assert {c[1] for c in syncs.BLIND_SPOT_CASES} <= set(syncs.OP_IDS)


# ================================================================ models and helpers

def test_run_ahead_queue_model():
    m = syncs.predicted_run_ahead_ms(1.5, 2.0)
    assert m == {"none": pytest.approx(17.5), "once": pytest.approx(19.0), "every_step": pytest.approx(28.0)}
    host_bound = syncs.predicted_run_ahead_ms(3.0, 1.0)
    assert host_bound["none"] == pytest.approx(3 + 1 + 7 * 3) and host_bound["once"] == pytest.approx(26.0)


@pytest.mark.parametrize("variant", ["none", "once", "every_step"])
def test_queue_model_agrees_with_a_simulated_queue(variant):
    for h, g in [(0.5, 2.0), (1.5, 2.0), (3.0, 1.0), (2.0, 2.0)]:
        sim = _simulate_queue(variant, h, g, 8, 3)
        assert sim == pytest.approx(syncs.predicted_run_ahead_ms(h, g)[variant]), (h, g)


def test_copy_threshold():
    sizes = [1, 2, 3, 4, 5]
    assert syncs.copy_threshold(sizes, [0.1, 0.1, 20.0, 25.0, 30.0], 20.0) == (3, 2)
    assert syncs.copy_threshold(sizes, [0.1] * 5, 20.0) == (None, 5)
    assert syncs.copy_threshold(sizes, [20.0] * 5, 20.0) == (1, None)
    with pytest.raises(ValueError, match="sizes"):
        syncs.copy_threshold(sizes, [1.0], 20.0)


def test_slope_fit():
    assert syncs_model._slope([0, 5, 10], [0.1, 5.1, 10.1]) == pytest.approx(1.0)
    assert syncs_model._slope([0, 5, 10], [0.03] * 3) == pytest.approx(0.0)
    assert syncs_model._slope([5, 5], [1.0, 2.0]) == 0.0


def test_reduce_grad_stats_on_cpu():
    import torch

    local = torch.arange(32, dtype=torch.float32).view(4, 8)
    sums, gmax = syncs.reduce_grad_stats(local)
    assert sums.tolist() == [48.0, 56.0, 60.0, 64.0, 68.0, 72.0, 76.0]
    assert float(gmax) == 25.0
    s2, g2 = syncs.reduce_grad_stats_fixed(local)
    assert torch.equal(s2, sums) and torch.equal(g2, gmax)


def test_group_stats_columns():
    import torch

    from experiments.syncs.case import group_stats

    g = [torch.tensor([[0.0, -2.0], [0.5, 3.0]]), torch.tensor([float("inf")])]
    row = group_stats(g)
    assert row.shape == (8,)
    assert row[1].item() == math.inf and row[4].item() == 1 and row[5].item() == 1 and row[7].item() == 5


def test_training_step_groups_on_cpu():
    import torch

    from experiments.syncs.case import TrainingStep, reduce_grad_stats_fixed

    ts = TrainingStep(device=torch.device("cpu"), width=16, layers=4, batch=8)
    assert [len(g["params"]) for g in ts.opt.param_groups] == [2, 3, 5, 8]
    assert ts.opt.defaults["foreach"] is False, "the update must go one tensor at a time (many small kernels)"
    ts.step(reduce_grad_stats_fixed)  # a complete step runs on CPU tensors too
    assert float(ts.stat_sums[-1]) == sum(p.numel() for p in ts.params)


def test_update_clips_the_gradients():
    import torch

    from experiments.syncs.case import TrainingStep

    ts = TrainingStep(device=torch.device("cpu"), width=16, layers=4, batch=8, max_grad_norm=1e-3)
    loss = ts.forward_backward()
    before = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in ts.params]))
    assert before > 1e-3
    ts.update(loss)
    after = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in ts.params]))
    assert after == pytest.approx(1e-3, rel=1e-3)


def test_phases_give_each_phase_its_host_time():
    import torch

    from experiments.syncs.case import PHASES, TrainingStep, _Phases, reduce_grad_stats_fixed

    ts = TrainingStep(device=torch.device("cpu"), width=16, layers=4, batch=8)
    phases = _Phases(events=False)
    for i in range(3):
        ts.step(reduce_grad_stats_fixed, phases, i)
    times = phases.host_ms()
    assert list(times) == list(PHASES)
    assert all(len(v) == 3 and all(t > 0 for t in v) for v in times.values())


def test_step_model():
    fb, met, upd = syncs_case.PHASES
    # Host-bound: the sync hardly matters. Balanced: the update's host time comes on top.
    host = {fb: 4.0, met: 1.0, upd: 5.0}
    assert syncs.predicted_step_ms(host, {fb: 2.0, met: 0.5, upd: 1.0}) == {"sync_free": 10.0, "hidden_sync": 10.0}
    assert syncs.predicted_step_ms(host, {fb: 8.5, met: 0.5, upd: 1.0}) == {"sync_free": 10.0, "hidden_sync": 14.0}
    assert syncs.predicted_step_ms(host, {fb: 19.0, met: 0.5, upd: 1.0}) == {"sync_free": 20.5, "hidden_sync": 24.5}


def _stand_in_variant(step_ms: float, syncs_per_step: int) -> dict:
    """What measure_variant returns, with round numbers: a stand-in for the GPU run."""
    phases = syncs_case.PHASES
    host = [{"phase": ph, "step": i, "start_ms": i * step_ms + j, "end_ms": i * step_ms + j + 1}
            for i in range(3) for j, ph in enumerate(phases)]
    return {"step_ms": {"median": step_ms, "p10": step_ms * 0.98, "p90": step_ms * 1.02, "n": 40},
            "wall_ms_per_step": step_ms, "host_phase_ms": {ph: 1.0 for ph in phases},
            "syncs_per_step": syncs_per_step, "sync_report": ["[debug_mode] x at f.py:1 in g: y"] * syncs_per_step,
            "timeline": {"host": host, "gpu": copy.deepcopy(host)}}


def test_case_study_assembles_its_result(monkeypatch):
    """run_case_study on the CPU, its GPU timing functions replaced by stand-ins: the
    batch target, the phases, the model and the speedup are put together right, and the
    result passes the experiment's schema and renders."""
    import torch

    fb, met, upd = syncs_case.PHASES
    gpu_times = iter([0.5, 1.5])  # metrics, then update
    targets = []

    def choose_batch(ts, target_ms, *, lead_ms):
        targets.append((target_ms, lead_ms))
        return 2048, 8.0

    monkeypatch.setattr(syncs_case, "host_ms_per_step", lambda ts, fn: (10.0, {fb: 4.0, met: 1.0, upd: 5.0}))
    monkeypatch.setattr(syncs_case, "queued_gpu_ms", lambda fn, *, lead_ms: next(gpu_times))
    monkeypatch.setattr(syncs_case, "choose_batch", choose_batch)
    monkeypatch.setattr(syncs_case, "measure_variant",
                        lambda ts, fn, *, steps: _stand_in_variant(14.0 if fn is syncs_case.reduce_grad_stats else 10.5,
                                                                   1 if fn is syncs_case.reduce_grad_stats else 0))
    monkeypatch.setattr(syncs_case, "FIRST_BATCH", 8)  # the real model, a few rows: quick on the CPU
    d = syncs_case.run_case_study(1.0, 40, device=torch.device("cpu"))
    assert targets == [(10.0 - 0.5 - 1.5, 30.0)], "balance x host time, minus the batch-independent GPU phases"
    assert d["gpu_phase_ms"] == {fb: 8.0, met: 0.5, upd: 1.5} and d["gpu_ms_per_step"] == 10.0
    assert d["predicted_ms"] == {"sync_free": 10.0, "hidden_sync": 13.5}
    assert d["speedup"] == pytest.approx(14.0 / 10.5)
    exp = registry.get("syncs.case_study")
    doc = json.loads(next((ROOT / "experiments" / "recorded" / exp.id).glob("*.json")).read_text())
    doc["points"] = [dict(doc["points"][0], data=d)]
    store.validate_document(doc, exp.data_schema)  # in memory: nothing is written
    holds, measured = syncs_meas._claim_case_study(d)
    assert holds and measured["speedup"] == pytest.approx(1.333, abs=1e-3)
    r = edited(recorded("syncs.case_study"), d)
    fig = syncs.plot_case_study(r)
    assert len(fig.axes[0].patches) == 2 and len(fig.axes[0].lines) >= 2, "two bars, host and GPU lines"
    table = syncs.case_study_table(r)
    assert len(table) == 6 and "13.50" in str(table) and "14.00" in str(table)
    text = syncs.describe_case_study(r)
    assert "5.0 ms issuing the update" in text and "1.33x" in text


def test_case_study_leaves_no_tensor_behind(monkeypatch):
    """Live, the case study must leave memory_allocated() where it found it (the GPU side
    is tests/test_memory_left_gpu.py). On the CPU the same defect is a tensor that outlives
    the call: the lab GPU found 65 MiB left after syncs.case_study, and one cause was the
    sync-free helper's device index cached for the life of the process."""
    import gc

    import torch

    monkeypatch.setattr(syncs_case, "host_ms_per_step", lambda ts, fn: (10.0, dict.fromkeys(syncs_case.PHASES, 3.0)))
    monkeypatch.setattr(syncs_case, "queued_gpu_ms", lambda fn, *, lead_ms: (fn(), 1.0)[1])
    monkeypatch.setattr(syncs_case, "choose_batch", lambda ts, target_ms, *, lead_ms: (8, 8.0))
    monkeypatch.setattr(syncs_case, "measure_variant", lambda ts, fn, *, steps: (ts.step(fn), _stand_in_variant(10.0, 0))[1])
    monkeypatch.setattr(syncs_case, "FIRST_BATCH", 8)
    monkeypatch.setattr(syncs_case, "_SUM_INDEX", {})  # as in a fresh process
    gc.collect()
    before = [o for o in gc.get_objects() if issubclass(type(o), torch.Tensor)]  # kept alive: ids stay unique
    seen = {id(o) for o in before}
    syncs_case.run_case_study(1.0, 10, device=torch.device("cpu"))
    gc.collect()
    left = [tuple(o.shape) for o in gc.get_objects() if issubclass(type(o), torch.Tensor) and id(o) not in seen]
    assert not left, f"tensors made by the case study are still alive after it returned: {left}"


# ================================================================ claims against edited copies of the recordings

def test_claims_fail_when_the_data_says_so(recorded_mode):
    def data(exp_id, **params):
        return copy.deepcopy(recorded(exp_id, **params).data)

    cat = data("syncs.catalogue")
    assert syncs_meas._claim_catalogue(cat)[0]
    next(r for r in cat["rows"] if r["id"] == "masked_fill")["debug_mode_syncs"] = 1
    assert not syncs_meas._claim_catalogue(cat)[0]
    cat = data("syncs.catalogue")
    next(r for r in cat["rows"] if r["id"] == "tensor_list")["debug_mode_syncs"] = 0
    assert not syncs_meas._claim_catalogue(cat)[0]

    copies = data("syncs.pageable_threshold")
    assert syncs_meas._claim_pageable(copies)[0]
    copies["variants"]["pageable_blocking"]["median_ms"][0] = 0.5 * copies["work_ms"]
    assert not syncs_meas._claim_pageable(copies)[0]
    copies = data("syncs.pageable_threshold")
    copies["variants"]["pageable_non_blocking"]["median_ms"][-1] = 0.1
    assert not syncs_meas._claim_pageable(copies)[0]

    spots = data("syncs.blind_spots")
    assert syncs_meas._claim_blind_spot(spots)[0]
    next(c for c in spots["cases"] if c["op"] == "synchronize")["debug_mode_syncs"] = 1
    assert not syncs_meas._claim_blind_spot(spots)[0]
    spots = data("syncs.blind_spots")
    next(c for c in spots["cases"] if c["op"] == "synchronize")["detector_syncs"] = 0
    assert not syncs_meas._claim_blind_spot(spots)[0]

    case = data("syncs.case_study")
    assert syncs_meas._claim_case_study(case)[0]
    case["speedup"] = 1.10
    assert not syncs_meas._claim_case_study(case)[0]
    case = data("syncs.case_study")
    case["variants"]["sync_free"]["syncs_per_step"] = 1
    assert not syncs_meas._claim_case_study(case)[0], "a 'sync-free' step that syncs does not test the claim"


# ================================================================ checks

def test_run_ahead_prediction_check(recorded_mode):
    from experiments.syncs.checks import RUN_AHEAD_EXERCISE

    r = recorded("syncs.run_ahead", **RUN_AHEAD_EXERCISE)
    assert syncs.check_run_ahead_prediction(None, None, result=r).correct is None
    assert syncs.check_run_ahead_prediction(17.5, None, result=r).correct is None
    right = syncs.check_run_ahead_prediction(17.5, 28.0, result=r)
    assert right.correct is True and "1.5" in right.message
    forgot_bubble = syncs.check_run_ahead_prediction(17.5, 16.0, result=r)
    assert forgot_bubble.correct is False and "idles" in forgot_bubble.message
    swapped = syncs.check_run_ahead_prediction(28.0, 28.0, result=r)
    assert swapped.correct is False and "overlaps" in swapped.message
    assert syncs.check_run_ahead_prediction("x", 28.0, result=r).correct is False
    assert syncs.check_run_ahead_prediction([17.5], 28.0, result=r).correct is False
    assert syncs.check_run_ahead_prediction(17.5, {"ms": 28}, result=r).correct is False


def test_run_ahead_check_separates_the_gpu_only_answer(recorded_mode):
    from experiments.syncs.checks import RUN_AHEAD_EXERCISE

    r = recorded("syncs.run_ahead", **RUN_AHEAD_EXERCISE)
    h, g, n = RUN_AHEAD_EXERCISE["host_ms"], RUN_AHEAD_EXERCISE["gpu_ms"], r["steps"]
    model = syncs.predicted_run_ahead_ms(h, g, n)
    # 16 ms, the GPU's work alone, is the classic mistake: a named wrong answer, not "close enough"
    gpu_only = syncs.check_run_ahead_prediction(n * g, model["every_step"], result=r)
    assert gpu_only.correct is False and "GPU's work alone" in gpu_only.message and "idles" in gpu_only.message
    measured = r["variants"]["none"]["end_ms"]
    assert syncs.check_run_ahead_prediction(measured, model["every_step"], result=r).correct is True
    assert syncs.check_run_ahead_prediction(model["none"] + 0.5, model["every_step"], result=r).correct is True
    assert syncs.check_run_ahead_prediction(model["none"] + 1.0, model["every_step"], result=r).correct is False
    # feedback shows rounded numbers: no "17.5729 ms"
    for fb in (syncs.check_run_ahead_prediction(measured, r["variants"]["every_step"]["end_ms"], result=r),
               syncs.check_run_ahead_prediction(19.123456, 40.98765, result=r), gpu_only):
        assert not re.search(r"\d\.\d{3,}", fb.message), fb.message


def test_run_ahead_check_accepts_the_model_when_a_gpu_measures_more(recorded_mode):
    from experiments.syncs.checks import RUN_AHEAD_EXERCISE

    r = recorded("syncs.run_ahead", **RUN_AHEAD_EXERCISE)
    slow = copy.deepcopy(r.data)
    slow["variants"]["none"]["end_ms"] = 18.4      # a GPU with more launch overhead than the lab's
    slow["variants"]["every_step"]["end_ms"] = 29.1
    fb = syncs.check_run_ahead_prediction(17.5, 28.0, result=edited(r, slow))
    assert fb.correct is True and "18.4 ms" in fb.message
    assert syncs.check_run_ahead_prediction(18.4, 29.1, result=edited(r, slow)).correct is True
    assert syncs.check_run_ahead_prediction(16.0, 28.0, result=edited(r, slow)).correct is False


def test_run_ahead_check_without_a_recording_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_MEMLAB_RECORDED_DIR", str(tmp_path))
    monkeypatch.setenv("CUDA_MEMLAB_MODE", "recorded")
    fb = syncs.check_run_ahead_prediction(17.5, 28.0)
    assert fb.correct is None and "syncs.run_ahead" in fb.message


def test_bubble_check():
    assert syncs.check_bubble_cost(None).correct is None
    assert syncs.check_bubble_cost("b").correct is True
    wait = syncs.check_bubble_cost("a")
    assert wait.correct is False and "busy" in wait.message
    assert syncs.check_bubble_cost("e").correct is False
    assert syncs.check_bubble_cost(" B ").correct is True
    for not_a_letter in (["b"], {"b": 1}, 2):
        fb = syncs.check_bubble_cost(not_a_letter)
        assert fb.correct is False and "one letter" in fb.message


def test_classification_check(recorded_mode):
    r = recorded("syncs.catalogue")
    template = syncs.classification_template()
    assert syncs.check_classification(None, result=r).correct is None
    assert syncs.check_classification(template, result=r).correct is None
    rows = {row["id"]: row for row in r.data["rows"]}
    right = {syncs_ops.OPS_BY_ID[i].code: rows[i]["syncs"] for i in syncs.QUIZ_OPS}
    fb = syncs.check_classification(right, result=r)
    assert fb.correct is True and fb.details["wrong"] == 0
    by_id = {i: rows[i]["syncs"] for i in syncs.QUIZ_OPS}
    assert syncs.check_classification(by_id, result=r).correct is True
    wrong = dict(right)
    wrong["x2[:, (0, 2, 3)]"] = False
    wrong["x2[:, 1:3]"] = True
    fb = syncs.check_classification(wrong, result=r)
    assert fb.correct is False and fb.details["wrong"] == 2
    # how many are wrong, never which (flipping the named ones would be the answer)
    assert "10 of 12 right" in fb.message and "x2[:, (0, 2, 3)]" not in fb.message and "x2[:, 1:3]" not in fb.message
    assert fb.details["wrong_parts"] == ["answers"]
    assert syncs.check_classification({"t.cumsum(0)": True}, result=r).correct is False
    not_bool = dict(right, **{"loss.item()": "yes"})
    assert syncs.check_classification(not_bool, result=r).correct is False
    assert syncs.check_classification([True], result=r).correct is False


def test_classification_template_matches_the_notebook():
    src = (ROOT / "book" / "src" / "ch4_hidden_syncs.py").read_text()
    for code in syncs.classification_template():
        assert f'    "{code}": None,' in src, f"the notebook's answers dict lacks {code!r}"


def test_threshold_check(recorded_mode):
    r = recorded("syncs.pageable_threshold")
    staged, first = r["largest_staged_bytes"] / 2**20, r["threshold_bytes"] / 2**20
    assert staged < first, "the lab's driver staged small pageable copies and drained for larger ones"
    assert syncs.check_threshold(None, result=r).correct is None
    for ok in (staged, first, (staged + first) / 2):
        assert syncs.check_threshold(ok, result=r).correct is True, ok
    low = syncs.check_threshold(staged / 2, result=r)
    assert low.correct is False and "did not wait" in low.message
    high = syncs.check_threshold(4 * first, result=r)
    assert high.correct is False and "already" in high.message
    if staged > 0.0625:
        post = syncs.check_threshold(0.0625, result=r)
        assert post.correct is False and "GB200" in post.message
    assert syncs.check_threshold("lots", result=r).correct is False
    never = edited(r, dict(copy.deepcopy(r.data), threshold_bytes=None))
    assert syncs.check_threshold("none", result=never).correct is True
    assert syncs.check_threshold(" None ", result=never).correct is True
    assert syncs.check_threshold(first, result=never).correct is False


def test_threshold_check_answers_what_the_exercise_allows(recorded_mode):
    r = recorded("syncs.pageable_threshold")
    # "none" is an answer the exercise allows: wrong here (the lab's driver drained), but not a format error
    fb = syncs.check_threshold("none", result=r)
    assert fb.correct is False and "Give a number" not in fb.message and "red squares" in fb.message
    for wrong_type in ([2], {"MiB": 2}, "2 MiB", True, math.nan, object()):
        fb = syncs.check_threshold(wrong_type, result=r)
        assert fb.correct is False and '"none"' in fb.message, wrong_type
    assert "None with a size in MiB" in syncs.check_threshold(None, result=r).message


def _good_rewrite(local):
    import torch

    totals = local.sum(dim=0)
    return torch.cat((totals[:1], totals[2:])), local[:, 1].max()


def _wrong_rewrite(local):
    return local.sum(dim=0), local[:, 1].max()


def _tuple_rewrite(local):
    return local[:, (0, 2, 3, 4, 5, 6, 7)].sum(dim=0), local[:, 1].max()


def _item_rewrite(local):
    import torch

    return local.sum(dim=0)[[0, 2, 3, 4, 5, 6, 7]], torch.tensor(local[:, 1].max().item())


def _raising_rewrite(local):
    raise NotImplementedError("todo")


def test_static_scan_finds_sync_patterns():
    assert syncs_static(_good_rewrite) == []
    assert any("sequence" in f for f in syncs_static(_tuple_rewrite))
    found = syncs_static(_item_rewrite)
    assert any(".item()" in f for f in found) and any("sequence" in f for f in found)
    assert any("sequence" in f for f in syncs_static(syncs.reduce_grad_stats)), "SUM_COLS is a global tuple"
    assert syncs_static(syncs.reduce_grad_stats_fixed) == [] or all(
        "torch.tensor" in f for f in syncs_static(syncs.reduce_grad_stats_fixed))
    assert syncs_static(len) == []  # a builtin has no source: nothing to scan


def syncs_static(fn):
    from experiments.syncs.checks import static_sync_findings

    return static_sync_findings(fn)


def test_rewrite_check_without_a_gpu(monkeypatch):
    import experiments.syncs.checks as sc

    monkeypatch.setattr(sc, "has_cuda", lambda: False)
    assert syncs.check_sync_free_rewrite(None).correct is None
    assert syncs.check_sync_free_rewrite("def f(): pass").correct is False
    good = syncs.check_sync_free_rewrite(_good_rewrite)
    assert good.correct is None and "GPU" in good.message and good.details["gpu"] is False
    wrong = syncs.check_sync_free_rewrite(_wrong_rewrite)
    assert wrong.correct is False and "shape" in wrong.message
    original = syncs.check_sync_free_rewrite(syncs.reduce_grad_stats)
    assert original.correct is False and "sequence" in original.message
    raising = syncs.check_sync_free_rewrite(_raising_rewrite)
    assert raising.correct is False and "NotImplementedError" in raising.message
    scalar = syncs.check_sync_free_rewrite(lambda local: (_good_rewrite(local)[0], 3.0))
    assert scalar.correct is False and "tensors" in scalar.message


# ================================================================ plots and tables

def _texts(fig: Figure) -> str:
    # plotting.fit_text wraps long titles and footers at spaces: read them as one line
    return " ".join(t.get_text().replace("\n", " ") for t in fig.findobj(lambda a: hasattr(a, "get_text")))


def test_plot_run_ahead(recorded_mode):
    r = recorded("syncs.run_ahead", host_ms=1.5, gpu_ms=2.0)
    fig = syncs.plot_run_ahead(r)
    assert isinstance(fig, Figure) and len(fig.axes) == 3
    for ax in fig.axes:
        assert len(ax.patches) >= 8 + 16, "8 GPU kernels and 16 host intervals per variant"
    assert r.caption() in _texts(fig)
    table = syncs.run_ahead_table(r)
    model = syncs.predicted_run_ahead_ms(1.5, 2.0)
    assert len(table) == 3 and f"{model['none']:.1f}" in str(table) and "<table" in table._repr_html_()
    assert f"{r['variants']['every_step']['end_ms']:.1f}" in str(table)


def test_plot_catalogue_and_table(recorded_mode):
    for numel in syncs.NUMEL_CHOICES:
        r = recorded("syncs.catalogue", numel=numel)
        fig = syncs.plot_catalogue(r)
        ax = fig.axes[0]
        assert len(ax.patches) == len(syncs.OPS)
        assert len(ax.get_yticklabels()) == len(syncs.OPS)
        assert r.caption() in _texts(fig)
        colors = {tuple(round(c, 3) for c in p.get_facecolor()[:3]) for p in ax.patches}
        assert len(colors) == 3, "reported, missed-by-debug-mode and quiet rows"
    r = recorded("syncs.catalogue")
    table = syncs.catalogue_table(r)
    assert len(table) == len(syncs.OPS)
    html = table._repr_html_()
    assert html.startswith("<details><summary>") and html.count("colspan") == len(syncs_ops.GROUPS)
    assert "torch.tensor([0., 1., 2.], device=&#x27;cuda&#x27;)" in html and "background" in html
    item = next(row for row in r["rows"] if row["id"] == "item")
    assert f"{item['host_blocked_ms']['median']:.2f}" in html


def test_plot_queue_probe(recorded_mode):
    for op in ("item", "full"):
        r = recorded("syncs.queue_probe", op=op)
        ax = syncs.plot_queue_probe(r).axes[0]
        assert len(ax.lines) >= 2
        assert ("waits for the queue" if r["slope"] > 0.5 else "does not wait") in ax.get_title()
        assert f"slope {r['slope']:.2f}" in ax.get_title()


def test_plot_pageable_threshold(recorded_mode):
    r = recorded("syncs.pageable_threshold")
    ax = syncs.plot_pageable_threshold(r).axes[0]
    assert ax.get_xscale() == "log"
    assert len(ax.get_legend().get_texts()) == 5, "three sources, the queued work, the threshold band"
    assert f"wait from {r['threshold_bytes'] / 2**20:g} MiB" in ax.get_title().replace("\n", " ")


def test_plot_case_study_and_timeline(recorded_mode):
    r = recorded("syncs.case_study")
    fig = syncs.plot_case_study(r)
    ax = fig.axes[0]
    assert len(ax.patches) == 2 and f"{r['speedup']:.2f}x faster" in ax.get_title()
    assert ax.get_ylabel() == "time per training step (ms)"
    tl = syncs.plot_case_study_timeline(r)
    assert len(tl.axes) == 2 and all(len(ax.patches) == 18 for ax in tl.axes)
    assert len(tl.legends[0].get_texts()) == 3, "one legend entry per phase"
    table = syncs.case_study_table(r)
    assert f"{r['variants']['hidden_sync']['step_ms']['median']:.2f}" in str(table)
    assert f"{r['speedup']:.2f}x" in syncs.describe_case_study(r)


def test_plot_blind_spots_and_table(recorded_mode):
    r = recorded("syncs.blind_spots")
    fig = syncs.plot_blind_spots(r)
    assert len(fig.axes[0].patches) == 2 * len(syncs.BLIND_SPOT_CASES)
    table = syncs.blind_spot_table(r)
    assert len(table) == len(syncs.BLIND_SPOT_CASES)
    missed = [c["label"] for c in r["cases"] if c["debug_mode_syncs"] == 0 and c["host_blocked_ms"]["median"]
              >= 0.5 * r["work_ms"]]
    assert [row[0] for row, hi in zip(table.rows, table.highlight) if hi] == missed
    assert {"torch.cuda.synchronize()", "event.synchronize()"} <= set(missed), "the chapter's shaded rows"


# ================================================================ capture probes (logic, no GPU)

def test_capture_probe_resumes_after_a_crash(monkeypatch):
    from experiments.core.runner import FreshResult

    calls = []

    def fake_run_fresh(target, kwargs, **kw):
        calls.append(list(kwargs["op_ids"]))
        ids = kwargs["op_ids"]
        if len(calls) == 1:  # crashes while probing the second op
            return FreshResult(False, error_kind="crash", message="exit -11",
                               stderr_tail=f"probing {ids[0]}\nprobing {ids[1]}")
        if len(calls) == 2:  # poisons the context after the first op it probes
            return FreshResult(True, value={"results": {ids[0]: {"capturable": False, "error": "x"}},
                                            "poisoned_after": ids[0]})
        return FreshResult(True, value={"results": {i: {"capturable": True, "error": ""} for i in ids},
                                        "poisoned_after": None})

    monkeypatch.setattr(syncs_ops, "run_fresh", fake_run_fresh)
    monkeypatch.setattr(syncs_ops, "_CAPTURE_CACHE", {})
    out = syncs_ops.capture_probe(["item", "full", "slice", "any"], numel=64)
    assert out["full"]["capturable"] is None and "crash" in out["full"]["error"]
    assert out["item"]["capturable"] is False
    assert out["slice"]["capturable"] is True and out["any"]["capturable"] is True
    assert calls == [["item", "full", "slice", "any"], ["item", "slice", "any"], ["slice", "any"]]
    assert syncs_ops.capture_probe(["item"], numel=64) == {"item": out["item"]}, "results are cached"
    assert len(calls) == 3


def test_capture_probe_gives_up_after_max_processes(monkeypatch):
    from experiments.core.runner import FreshResult

    monkeypatch.setattr(syncs_ops, "run_fresh",
                        lambda *a, **k: FreshResult(False, error_kind="timeout", message="killed", stderr_tail=""))
    monkeypatch.setattr(syncs_ops, "_CAPTURE_CACHE", {})
    out = syncs_ops.capture_probe(["item", "full", "slice"], numel=64, max_processes=2)
    assert all(v["capturable"] is None for v in out.values())
    assert "not probed" in out["slice"]["error"]


def test_root_error_prefers_the_body_error():
    try:
        try:
            raise RuntimeError("operation not permitted when stream is capturing\nmore")
        except RuntimeError:
            raise RuntimeError("capture invalidated")
    except RuntimeError as e:
        assert syncs_ops._root_error(e) == "RuntimeError: operation not permitted when stream is capturing"


# ================================================================ widgets and notebook

def test_panels_build_in_recorded_mode(recorded_mode):
    ipywidgets = pytest.importorskip("ipywidgets")
    for exp_id, render, params in [("syncs.run_ahead", syncs.plot_run_ahead, None),
                                   ("syncs.catalogue", syncs.plot_catalogue, ["numel"]),
                                   ("syncs.queue_probe", syncs.plot_queue_probe, None),
                                   ("syncs.pageable_threshold", syncs.plot_pageable_threshold, None),
                                   ("syncs.case_study", syncs.plot_case_study, ["balance"])]:
        box = ex.panel(exp_id, render, params=params)
        assert isinstance(box, ipywidgets.VBox)


def test_every_panel_combination_is_recorded():
    for exp_id, names in [("syncs.run_ahead", ["host_ms", "gpu_ms"]), ("syncs.queue_probe", ["op", "numel"])]:
        exp = registry.get(exp_id)
        grid = {store.params_key(pt) for pt in exp.grid}
        for combo in itertools.product(*(exp.param(n).choices for n in names)):
            assert store.params_key(exp.complete(dict(zip(names, combo)))) in grid, (exp_id, combo)


def test_find_hidden_syncs_reads_the_recording(recorded_mode, monkeypatch):
    monkeypatch.setattr(syncs_meas, "has_cuda", lambda: False)
    text = syncs.find_hidden_syncs()
    r = recorded("syncs.case_study")
    head, *rest = text.splitlines()
    assert head == r.caption() + ":", "the caption is one line: the page wraps it (issue #19)"
    assert "reduce_grad_stats" in text
    assert f"{r['variants']['hidden_sync']['syncs_per_step']} host-device sync" in text
    assert max(len(line) for line in rest) <= 100, "the report's lines of code fit a page without wrapping"


def test_catalogue_claim_labels_its_figures_with_the_code(recorded_mode):
    d = recorded("syncs.catalogue").data
    _, measured = syncs_meas._claim_catalogue(d)
    codes = {syncs_ops.OPS_BY_ID[k].code for k in syncs.CATALOGUE_SYNCING + syncs.CATALOGUE_QUIET}
    assert {k.removesuffix(": debug-mode warnings") for k in measured} == codes
    for c in claims.all_claims(4):
        _, m = c.predicate(registry.run(c.experiment, mode="recorded", **c.params).data)
        assert not any(re.fullmatch(r"[a-z0-9]+(_[a-z0-9]+)+( \(\w+\))?", k) for k in m), (c.id, list(m))


def test_unanswered_messages_read_as_sentences(recorded_mode):
    for fb in (syncs.check_run_ahead_prediction(None, None), syncs.check_bubble_cost(None),
               syncs.check_classification(None), syncs.check_classification(syncs.classification_template()),
               syncs.check_threshold(None), syncs.check_sync_free_rewrite(None)):
        assert fb.correct is None
        assert fb.message.startswith("Replace None with ") and fb.message.endswith("then run the cell again.")
        assert fb.message.count("Replace None") == 1 and "your value for" not in fb.message


def test_show_claim_in_recorded_mode(recorded_mode):
    table = ex.show_claim("syncs.catalogue")
    assert len(table) == 1 and list(table)[0].holds is True


def _notebook_source() -> str:
    return (ROOT / "book" / "src" / "ch4_hidden_syncs.py").read_text()


def test_notebook_structure():
    import jupytext

    src = _notebook_source()  # title, exercises and solutions: tests/test_notebooks.py, for every chapter
    nb = jupytext.reads(src, fmt="py:percent")
    for check in ("check_run_ahead_prediction", "check_bubble_cost", "check_classification", "check_threshold",
                  "check_sync_free_rewrite"):
        assert f"syncs.{check}(" in src
    for claim_id in CLAIM_IDS:
        assert f'ex.show_claim("{claim_id}")' in src
    assert "ex.claims_table(chapter=4)" in nb.cells[-1].source
    assert syncs.POST in src
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "torch.cuda" not in code, "notebook code must go through ex.run / panels / checks"


def test_notebook_cross_references():
    """Sections are referred to by MyST labels (the book numbers them), each target alone
    in the markdown cell right before its heading; no hand-written section numbers."""
    import jupytext

    src = _notebook_source()
    nb = jupytext.reads(src, fmt="py:percent")
    targets = [c.source.strip()[1:-2] for c in nb.cells
               if c.cell_type == "markdown" and re.fullmatch(r"\(ch4-[a-z-]+\)=", c.source.strip())]
    assert len(targets) == len(set(targets)) >= 4
    for i, c in enumerate(nb.cells):
        if c.cell_type == "markdown" and c.source.strip()[1:-2] in targets:
            assert nb.cells[i + 1].source.startswith("## "), f"target {c.source.strip()} is not before a heading"
    refs = set(re.findall(r"\{ref\}`(ch4-[a-z-]+)`", src))
    assert refs and refs <= set(targets), f"references without a target: {refs - set(targets)}"
    assert not re.search(r"\bsection \d", src, re.IGNORECASE), "write {ref}`ch4-...`, not 'section N'"
    assert not re.search(r"^# #+ \d", src, re.MULTILINE), "headings carry no manual numbers"


def test_results_the_next_paragraph_discusses_are_not_folded():
    """Issue 10: a result that the following paragraph discusses is shown, not folded
    (answers that only a solution discusses stay folded under "Show the answer")."""
    hidden = hidden_output_cells("ch4_hidden_syncs.ipynb")
    for source in ("syncs.plot_run_ahead(loop)", "syncs.run_ahead_table(loop)",  # ex 4.1
                   "syncs.plot_catalogue(cat)"):                                # ex 4.3 (which of these sync?)
        assert not any(source in h for h in hidden), f"the cell with {source!r} is folded"
    assert not any("syncs.check_" in h for h in hidden), "the check's own feedback stays visible"


# ================================================================ live on the GPU

@pytest.mark.gpu
def test_live_catalogue_partition(live_mode):
    d = ex.run("syncs.catalogue").data
    rows = {r["id"]: r for r in d["rows"]}
    holds, measured = syncs_meas._claim_catalogue(d)
    assert holds, f"syncs.catalogue does not hold: {measured}"
    wrong = [(r["code"], r["debug_mode_syncs"], round(r["host_blocked_ms"]["median"], 2)) for r in d["rows"]
             if r["expected_sync"] is not None and r["syncs"] != r["expected_sync"]]
    assert not wrong, f"rows that differ from the lab's torch 2.11 partition (code, warnings, waited ms): {wrong}"
    assert rows["synchronize"]["debug_mode_syncs"] == 0 and rows["synchronize"]["detector_syncs"] >= 1
    for op_id in ("masked_fill", "where_3arg", "full", "slice"):
        assert rows[op_id]["capturable"] is True, f"{op_id}: {rows[op_id]['capture_error']}"
    for op_id in ("item", "mask_index", "tensor_list", "index_tuple", "to_cuda_pageable"):
        assert rows[op_id]["capturable"] is False, f"{op_id} captured: {rows[op_id]}"


@pytest.mark.gpu
def test_live_pageable_copies(live_mode):
    d = ex.run("syncs.pageable_threshold", work_ms=10.0).data
    holds, measured = syncs_meas._claim_pageable(d)
    assert holds, f"syncs.pageable_htod_blocks does not hold at 10 ms: {measured}"
    pinned = d["variants"]["pinned_non_blocking"]["median_ms"]
    assert max(pinned) < 0.2 * d["work_ms"], f"pinned non_blocking copies waited: {pinned}"
    assert d["threshold_bytes"] is not None and d["threshold_bytes"] <= 64 * 2**20


@pytest.mark.gpu
def test_live_run_ahead(live_mode):
    v = ex.run("syncs.run_ahead", host_ms=1.5, gpu_ms=2.0).data["variants"]
    model = syncs.predicted_run_ahead_ms(1.5, 2.0)
    got = {k: round(v[k]["end_ms"], 2) for k in v}
    for name in ("none", "every_step"):
        assert v[name]["end_ms"] == pytest.approx(model[name], rel=0.15), f"measured {got}, model {model}"
    assert v["every_step"]["gpu_idle_ms"] > v["none"]["gpu_idle_ms"] + 5, got
    assert v["once"]["host_blocked_ms"] > 2.0, f"one .item() should wait for the queued steps: {v['once']}"


@pytest.mark.gpu
def test_live_case_study(live_mode):
    d = ex.run("syncs.case_study").data
    holds, measured = syncs_meas._claim_case_study(d)
    context = (f"batch {d['batch']}, host per phase {d['host_phase_ms']}, GPU per phase {d['gpu_phase_ms']}, "
               f"model {d['predicted_ms']}; reports: {d['variants']['hidden_sync']['sync_report']} / "
               f"{d['variants']['sync_free']['sync_report']}")
    assert holds, f"syncs.case_study_speedup does not hold: {measured}; {context}"
    assert any("reduce_grad_stats" in line for line in d["variants"]["hidden_sync"]["sync_report"])
    upd = syncs_case.PHASES[2]
    assert d["host_phase_ms"][upd] > 2 * d["gpu_phase_ms"][upd], f"the update is not host-heavy here: {context}"
    for name in ("hidden_sync", "sync_free"):
        assert d["variants"][name]["step_ms"]["median"] == pytest.approx(d["predicted_ms"][name], rel=0.25), context


@pytest.mark.gpu
def test_live_blind_spots(live_mode):
    d = ex.run("syncs.blind_spots").data
    holds, measured = syncs_meas._claim_blind_spot(d)
    assert holds, measured
    cases = {c["label"]: c for c in d["cases"]}
    big = cases["pageable to GPU, non_blocking, 16 MiB"]
    assert big["debug_mode_syncs"] == 0 and "pageable_htod" in big["detector_kinds"], big
    assert cases["pageable to GPU, non_blocking, 16 KiB"]["detector_syncs"] == 0
    assert "pageable_dtoh" in cases["GPU to pageable, non_blocking"]["detector_kinds"]
    for label in ("pinned to GPU, non_blocking", "torch.full((3,), 1.0, device='cuda')"):
        assert cases[label]["detector_syncs"] == 0, cases[label]


@pytest.mark.gpu
def test_live_queue_probe(live_mode):
    item = ex.run("syncs.queue_probe", op="item").data
    full = ex.run("syncs.queue_probe", op="full").data
    assert item["slope"] == pytest.approx(1.0, abs=0.2), item["host_blocked_ms"]
    assert abs(full["slope"]) < 0.1, full["host_blocked_ms"]


@pytest.mark.gpu
def test_live_rewrite_check():
    assert syncs.check_sync_free_rewrite(_good_rewrite).correct is True
    still = syncs.check_sync_free_rewrite(_tuple_rewrite)
    assert still.correct is False and "Still syncs" in still.message
    assert syncs.check_sync_free_rewrite(syncs.reduce_grad_stats_fixed).correct is True
    assert syncs.check_sync_free_rewrite(_wrong_rewrite).correct is False


@pytest.mark.gpu
def test_live_find_hidden_syncs():
    text = syncs.find_hidden_syncs()
    assert text.startswith("Live") and "reduce_grad_stats" in text, text
