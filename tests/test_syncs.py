"""Chapter 4 (hidden host-device syncs): CPU tests of everything that needs no GPU (with
synthetic data shaped like the lab's measurements), recorded-mode tests against
experiments/recorded/, and GPU tests (``-m gpu``) that run the experiments live and
assert the chapter's claims and key behaviours.

The synthetic data follow the lab's H200 numbers (seed-posts.md §2.3, field reports #14
to #24); they exercise plots, tables, checks, claims and the notebook, never the claims'
verdict on real hardware (the recorded and GPU tests do that).
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest
from matplotlib.figure import Figure

import experiments as ex
from experiments import claims, registry, store, syncs, syncs_ops
from experiments.device import Provenance

ROOT = Path(__file__).resolve().parent.parent
SYNCS_IDS = ("syncs.run_ahead", "syncs.catalogue", "syncs.queue_probe", "syncs.pageable_threshold",
             "syncs.case_study", "syncs.blind_spots")
CLAIM_IDS = ("syncs.catalogue", "syncs.pageable_htod_blocks", "syncs.debug_mode_blind_spot",
             "syncs.case_study_speedup")
PROV = Provenance("NVIDIA H200", "9.0", 150_109_880_320, "580.159.04", "13.0", "2.11.0+cu130", "3.12.3",
                  "2026-11-30T12:00:00+00:00", "synthetic")
# The operations the issue names; each must be a row of the catalogue.
ISSUE_OPS = ("item", "print", "if_tensor", "mask_index", "nonzero", "unique", "masked_select", "repeat_interleave",
             "tensor_list", "to_cuda_pageable", "to_cuda_pageable_nb", "to_cuda_pinned_nb", "index_list",
             "index_tuple", "index_numpy", "index_cpu_tensor", "masked_fill", "where_3arg", "full", "index_cuda")


# ================================================================ synthetic data (lab-shaped)

def _stats(ms: float) -> dict:
    return {"median": ms, "p10": ms * 0.97, "p90": ms * 1.04 + 0.01, "n": 3}


def _op_syncs(op: syncs_ops.Op, numel: int) -> bool:
    if op.expected_sync is None:  # a pageable non_blocking copy: waits above 2-4 MiB on the lab H200
        return numel * 4 >= 4 * 2**20
    return op.expected_sync


def _op_row(op: syncs_ops.Op, numel: int, work: float) -> dict:
    s = _op_syncs(op, numel)
    driver_or_explicit = op.id in ("synchronize", "event_synchronize", "dtoh_pageable_nb", "to_cuda_pageable_nb")
    debug = 0 if (not s or driver_or_explicit) else {"item": 2, "print": 12, "repeat_interleave": 2}.get(op.id, 1)
    extra = 1 if (s and driver_or_explicit) else 0
    kinds = (["debug_mode"] if debug else []) + (
        ["pageable_htod"] if extra and op.id == "to_cuda_pageable_nb" else
        ["pageable_dtoh"] if extra and op.id == "dtoh_pageable_nb" else
        [{"synchronize": "device_synchronize", "event_synchronize": "event_synchronize"}[op.id]] if extra else [])
    blocked = work + 0.06 if s else 0.03
    return {"debug_mode_syncs": debug, "detector_syncs": debug + extra, "detector_kinds": sorted(kinds),
            "host_blocked_ms": _stats(blocked)}


def _run_ahead_variant(variant: str, h: float, g: float, steps: int, k: int) -> dict:
    t_host, gpu_free, host, gpu = 0.0, 0.0, [], []
    for i in range(steps):
        host.append({"kind": "python", "start_ms": t_host, "end_ms": t_host + h})
        t_host += h
        host.append({"kind": "launch", "start_ms": t_host, "end_ms": t_host + 0.02})
        start = max(t_host + 0.01, gpu_free)
        gpu.append({"start_ms": start, "end_ms": start + g})
        gpu_free = start + g
        t_host += 0.02
        if variant == "every_step" or (variant == "once" and i == k):
            host.append({"kind": "sync", "start_ms": t_host, "end_ms": gpu_free + 0.01})
            t_host = gpu_free + 0.01
    busy = sum(iv["end_ms"] - iv["start_ms"] for iv in gpu)
    return {"host": host, "gpu": gpu, "end_ms": gpu[-1]["end_ms"], "gpu_busy_ms": busy,
            "gpu_idle_ms": gpu[-1]["end_ms"] - gpu[0]["start_ms"] - busy,
            "host_blocked_ms": sum(iv["end_ms"] - iv["start_ms"] for iv in host if iv["kind"] == "sync"),
            "align_uncertainty_ms": 0.012}


def _timeline(step_ms: float, hidden: bool) -> dict:
    host, gpu = [], []
    for i in range(3):
        t = i * step_ms
        phases = [("forward + backward", 0.2 * step_ms), ("metrics", (0.5 if hidden else 0.05) * step_ms),
                  ("optimizer + EMA", 0.3 * step_ms)]
        h = t
        for name, dur in phases:
            host.append({"phase": name, "step": 20 + i, "start_ms": h, "end_ms": h + dur})
            gpu.append({"phase": name, "step": 20 + i, "start_ms": h + 0.1, "end_ms": h + dur + 0.1})
            h += dur
    return {"host": host, "gpu": gpu}


def synthetic(exp_id: str, point: dict) -> dict:
    if exp_id == "syncs.run_ahead":
        h, g = point["host_ms"], point["gpu_ms"]
        return {"steps": 8, "sync_step": 3,
                "variants": {v: _run_ahead_variant(v, h, g, 8, 3) for v in ("none", "once", "every_step")}}
    if exp_id == "syncs.catalogue":
        n, w = point["numel"], point["work_ms"]
        rows = []
        for op in syncs_ops.OPS:
            m = _op_row(op, n, w)
            s = _op_syncs(op, n)
            rows.append({"id": op.id, "code": op.code, "group": op.group, "expected_sync": op.expected_sync,
                         "why": op.why, "version_note": op.version_note, **m, "blocks": s,
                         "syncs": bool(m["debug_mode_syncs"] > 0 or s),
                         "capturable": not (s or op.id == "to_cuda_pageable_nb"),
                         "capture_error": "" if not s else "RuntimeError: operation not permitted when stream is capturing"})
        return {"numel": n, "work_ms": w, "capture_numel": 4096, "rows": rows}
    if exp_id == "syncs.queue_probe":
        op = syncs_ops.get_op(point["op"])
        s = _op_syncs(op, point["numel"])
        q = list(syncs.QUEUED_MS)
        return {"op": op.id, "code": op.code, "queued_ms": q,
                "host_blocked_ms": [_stats(x + 0.05 if s else 0.03) for x in q],
                "debug_mode_syncs": _op_row(op, point["numel"], 20.0)["debug_mode_syncs"], "slope": 1.0 if s else 0.0}
    if exp_id == "syncs.pageable_threshold":
        w = point["work_ms"]
        sizes = [k * 1024 for k in syncs.COPY_SIZES_KIB]
        nb = [0.05 + s / 2**20 * 0.02 if s <= 2 * 2**20 else w + s / 2**20 * 0.1 for s in sizes]
        blocking = [w + s / 2**20 * 0.1 + 0.05 for s in sizes]
        pinned = [0.02 for _ in sizes]

        def var(xs):
            return {"median_ms": xs, "p10_ms": [x * 0.97 for x in xs], "p90_ms": [x * 1.05 for x in xs]}

        return {"work_ms": w, "sizes_bytes": sizes,
                "variants": {"pageable_non_blocking": var(nb), "pageable_blocking": var(blocking),
                             "pinned_non_blocking": var(pinned)},
                "threshold_bytes": 3 * 2**20, "largest_staged_bytes": 2 * 2**20}
    if exp_id == "syncs.case_study":
        b = point["balance"]
        host = 3.2
        heavy = b * host
        hidden, free = heavy + 0.65 * host, max(heavy, host) * 1.03
        report = ["[debug_mode] reported by set_sync_debug_mode at syncs_case.py:48 in reduce_grad_stats: "
                  "sums = local[:, SUM_COLS].sum(dim=0)"]
        return {"width": 1024, "layers": 16, "batch": int(512 * b), "host_ms_per_step": host, "heavy_gpu_ms": heavy,
                "gpu_to_host": b,
                "variants": {
                    "hidden_sync": {"step_ms": _stats(hidden), "wall_ms_per_step": hidden, "syncs_per_step": 1,
                                    "sync_report": report, "timeline": _timeline(hidden, True)},
                    "sync_free": {"step_ms": _stats(free), "wall_ms_per_step": free, "syncs_per_step": 0,
                                  "sync_report": [], "timeline": _timeline(free, False)}},
                "speedup": hidden / free}
    if exp_id == "syncs.blind_spots":
        cases = []
        for label, op_id, numel in syncs.BLIND_SPOT_CASES:
            cases.append({"label": label, "op": op_id, "numel": numel,
                          **_op_row(syncs_ops.get_op(op_id), numel, 20.0)})
        return {"work_ms": 20.0, "cases": cases}
    raise KeyError(exp_id)


def fake_result(exp_id: str, **params) -> registry.Result:
    point = registry.get(exp_id).complete(params)
    return registry.Result(exp_id, point, synthetic(exp_id, point), PROV, "recorded", 1.0)


@pytest.fixture
def fake_recording(tmp_path, monkeypatch):
    """Every grid point of every chapter-4 experiment, synthetic, saved through the store
    (so the data schemas are checked), and recorded mode pointing at it."""
    for exp in registry.all_experiments(4):
        points = [store.RecordedPoint(pt, synthetic(exp.id, pt), 0.1) for pt in exp.grid]
        store.save(exp.id, exp.chapter, PROV, points, data_schema=exp.data_schema, root=tmp_path)
    monkeypatch.setenv("CUDA_MEMLAB_RECORDED_DIR", str(tmp_path))
    monkeypatch.setenv("CUDA_MEMLAB_MODE", "recorded")
    return tmp_path


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
        return 3 * 8 * (pt["host_ms"] + pt["gpu_ms"]) / 1e3 + 0.05
    if exp_id == "syncs.catalogue":
        return n_ops * (4 * (pt["work_ms"] + 0.5) + 40) / 1e3 + 0.5
    if exp_id == "syncs.queue_probe":
        return (4 * sum(syncs.QUEUED_MS) + 80) / 1e3  # 4 calls per queue depth, two builds of the inputs
    if exp_id == "syncs.pageable_threshold":
        return len(syncs.COPY_SIZES_KIB) * 3 * 4 * (pt["work_ms"] + 2) / 1e3 + 0.2
    if exp_id == "syncs.case_study":
        return 2 * (pt["steps"] + 6) * 8 / 1e3 + 1.5
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
    for h, g in [(0.5, 2.0), (1.5, 2.0), (3.0, 1.0)]:
        sim = _run_ahead_variant(variant, h, g, 8, 3)["end_ms"]
        assert sim == pytest.approx(syncs.predicted_run_ahead_ms(h, g)[variant], rel=0.03, abs=0.2)


def test_copy_threshold():
    sizes = [1, 2, 3, 4, 5]
    assert syncs.copy_threshold(sizes, [0.1, 0.1, 20.0, 25.0, 30.0], 20.0) == (3, 2)
    assert syncs.copy_threshold(sizes, [0.1] * 5, 20.0) == (None, 5)
    assert syncs.copy_threshold(sizes, [20.0] * 5, 20.0) == (1, None)
    with pytest.raises(ValueError, match="sizes"):
        syncs.copy_threshold(sizes, [1.0], 20.0)


def test_slope_fit():
    assert syncs._slope([0, 5, 10], [0.1, 5.1, 10.1]) == pytest.approx(1.0)
    assert syncs._slope([0, 5, 10], [0.03] * 3) == pytest.approx(0.0)
    assert syncs._slope([5, 5], [1.0, 2.0]) == 0.0


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

    from experiments.syncs_case import group_stats

    g = [torch.tensor([[0.0, -2.0], [0.5, 3.0]]), torch.tensor([float("inf")])]
    row = group_stats(g)
    assert row.shape == (8,)
    assert row[1].item() == math.inf and row[4].item() == 1 and row[5].item() == 1 and row[7].item() == 5


def test_training_step_groups_on_cpu():
    import torch

    from experiments.syncs_case import TrainingStep, reduce_grad_stats_fixed

    ts = TrainingStep(device=torch.device("cpu"), width=16, layers=4, batch=8)
    assert [len(g["params"]) for g in ts.opt.param_groups] == [2, 3, 5, 8]
    ts.step(reduce_grad_stats_fixed)  # a complete step runs on CPU tensors too
    assert float(ts.stat_sums[-1]) == sum(p.numel() for p in ts.params)


# ================================================================ claims on synthetic data

def test_claims_hold_on_lab_shaped_data():
    for c in claims.all_claims(4):
        holds, measured = c.predicate(fake_result(c.experiment, **c.params).data)
        assert holds, f"{c.id}: {measured}"
        assert measured


def test_claims_fail_when_the_data_says_so():
    cat = fake_result("syncs.catalogue").data
    row = next(r for r in cat["rows"] if r["id"] == "masked_fill")
    row["debug_mode_syncs"] = 1
    assert not syncs._claim_catalogue(cat)[0]
    cat = fake_result("syncs.catalogue").data
    next(r for r in cat["rows"] if r["id"] == "tensor_list")["debug_mode_syncs"] = 0
    assert not syncs._claim_catalogue(cat)[0]

    copies = fake_result("syncs.pageable_threshold").data
    copies["variants"]["pageable_blocking"]["median_ms"][0] = 0.5 * copies["work_ms"]
    assert not syncs._claim_pageable(copies)[0]
    copies = fake_result("syncs.pageable_threshold").data
    copies["variants"]["pageable_non_blocking"]["median_ms"][-1] = 0.1
    assert not syncs._claim_pageable(copies)[0]

    spots = fake_result("syncs.blind_spots").data
    next(c for c in spots["cases"] if c["op"] == "synchronize")["debug_mode_syncs"] = 1
    assert not syncs._claim_blind_spot(spots)[0]
    spots = fake_result("syncs.blind_spots").data
    next(c for c in spots["cases"] if c["op"] == "synchronize")["detector_syncs"] = 0
    assert not syncs._claim_blind_spot(spots)[0]

    case = fake_result("syncs.case_study").data
    case["speedup"] = 1.10
    assert not syncs._claim_case_study(case)[0]
    case = fake_result("syncs.case_study").data
    case["variants"]["sync_free"]["syncs_per_step"] = 1
    assert not syncs._claim_case_study(case)[0], "a 'sync-free' step that syncs does not test the claim"


# ================================================================ checks

def test_run_ahead_prediction_check():
    r = fake_result("syncs.run_ahead", host_ms=1.5, gpu_ms=2.0)
    assert syncs.check_run_ahead_prediction(None, None, result=r).correct is None
    assert syncs.check_run_ahead_prediction(17.5, None, result=r).correct is None
    right = syncs.check_run_ahead_prediction(17.5, 28.0, result=r)
    assert right.correct is True and "1.5" in right.message
    forgot_bubble = syncs.check_run_ahead_prediction(17.5, 16.0, result=r)
    assert forgot_bubble.correct is False and "idles" in forgot_bubble.message
    swapped = syncs.check_run_ahead_prediction(28.0, 28.0, result=r)
    assert swapped.correct is False and "overlaps" in swapped.message
    assert syncs.check_run_ahead_prediction("x", 28.0, result=r).correct is False


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


def test_classification_check():
    r = fake_result("syncs.catalogue")
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
    assert "x2[:, (0, 2, 3)] syncs" in fb.message and "view" in fb.message
    assert syncs.check_classification({"t.cumsum(0)": True}, result=r).correct is False
    not_bool = dict(right, **{"loss.item()": "yes"})
    assert syncs.check_classification(not_bool, result=r).correct is False
    assert syncs.check_classification([True], result=r).correct is False


def test_classification_template_matches_the_notebook():
    src = (ROOT / "book" / "src" / "ch4_hidden_syncs.py").read_text()
    for code in syncs.classification_template():
        assert f'    "{code}": None,' in src, f"the notebook's answers dict lacks {code!r}"


def test_threshold_check():
    r = fake_result("syncs.pageable_threshold")
    assert syncs.check_threshold(None, result=r).correct is None
    for ok in (2, 3, 2.5):
        assert syncs.check_threshold(ok, result=r).correct is True, ok
    low = syncs.check_threshold(1, result=r)
    assert low.correct is False and "did not wait" in low.message
    high = syncs.check_threshold(16, result=r)
    assert high.correct is False and "already" in high.message
    post = syncs.check_threshold(0.0625, result=r)
    assert post.correct is False and "GB200" in post.message
    assert syncs.check_threshold("lots", result=r).correct is False
    assert syncs.check_threshold("none", result=r).correct is False
    never = fake_result("syncs.pageable_threshold")
    never.data["threshold_bytes"] = None
    assert syncs.check_threshold("none", result=never).correct is True
    assert syncs.check_threshold(4, result=never).correct is False


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
    from experiments.syncs_checks import static_sync_findings

    return static_sync_findings(fn)


def test_rewrite_check_without_a_gpu(monkeypatch):
    import experiments.syncs_checks as sc

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
    return " ".join(t.get_text() for t in fig.findobj(lambda a: hasattr(a, "get_text")))


def test_plot_run_ahead():
    r = fake_result("syncs.run_ahead", host_ms=1.5, gpu_ms=2.0)
    fig = syncs.plot_run_ahead(r)
    assert isinstance(fig, Figure) and len(fig.axes) == 3
    for ax in fig.axes:
        assert len(ax.patches) >= 8 + 16, "8 GPU kernels and 16 host intervals per variant"
    assert "Recorded on NVIDIA H200" in _texts(fig)
    table = syncs.run_ahead_table(r)
    assert len(table) == 3 and "17.5" in str(table) and "<table>" in table._repr_html_()


def test_plot_catalogue_and_table():
    for numel in syncs.NUMEL_CHOICES:
        r = fake_result("syncs.catalogue", numel=numel)
        fig = syncs.plot_catalogue(r)
        ax = fig.axes[0]
        assert len(ax.patches) == len(syncs.OPS)
        assert len(ax.get_yticklabels()) == len(syncs.OPS)
        assert "Recorded on" in _texts(fig)
        colors = {tuple(round(c, 3) for c in p.get_facecolor()[:3]) for p in ax.patches}
        assert len(colors) == 3, "reported, missed-by-debug-mode and quiet rows"
    table = syncs.catalogue_table(fake_result("syncs.catalogue"))
    assert len(table) == len(syncs.OPS)
    html = table._repr_html_()
    assert "torch.tensor([0., 1., 2.], device=&#x27;cuda&#x27;)" in html and "background" in html


def test_plot_queue_probe():
    for op in ("item", "full"):
        fig = syncs.plot_queue_probe(fake_result("syncs.queue_probe", op=op))
        ax = fig.axes[0]
        assert len(ax.lines) >= 2
        assert ("waits for the queue" if op == "item" else "does not wait") in ax.get_title()


def test_plot_pageable_threshold():
    fig = syncs.plot_pageable_threshold(fake_result("syncs.pageable_threshold"))
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    assert len(ax.get_legend().get_texts()) == 5, "three sources, the queued work, the threshold band"
    assert "3 MiB" in ax.get_title()


def test_plot_case_study_and_timeline():
    r = fake_result("syncs.case_study")
    fig = syncs.plot_case_study(r)
    assert len(fig.axes[0].patches) == 2 and "faster" in fig.axes[0].get_title()
    tl = syncs.plot_case_study_timeline(r)
    assert len(tl.axes) == 2 and all(len(ax.patches) == 18 for ax in tl.axes)


def test_plot_blind_spots_and_table():
    r = fake_result("syncs.blind_spots")
    fig = syncs.plot_blind_spots(r)
    assert len(fig.axes[0].patches) == 2 * len(syncs.BLIND_SPOT_CASES)
    table = syncs.blind_spot_table(r)
    assert len(table) == len(syncs.BLIND_SPOT_CASES)
    assert sum(table.highlight) >= 3, "synchronize, event synchronize and the large pageable copy"


# ================================================================ capture probes (logic, no GPU)

def test_capture_probe_resumes_after_a_crash(monkeypatch):
    from experiments.runner import FreshResult

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
    from experiments.runner import FreshResult

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

def test_panels_build_in_recorded_mode(fake_recording):
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
        import itertools

        for combo in itertools.product(*(exp.param(n).choices for n in names)):
            assert store.params_key(exp.complete(dict(zip(names, combo)))) in grid, (exp_id, combo)


def test_find_hidden_syncs_reads_the_recording(fake_recording, monkeypatch):
    monkeypatch.setattr(syncs, "has_cuda", lambda: False)
    text = syncs.find_hidden_syncs()
    assert "Recorded on NVIDIA H200" in text and "reduce_grad_stats" in text


def test_show_claim_in_recorded_mode(fake_recording):
    table = syncs.show_claim("syncs.catalogue")
    assert len(table) == 1 and list(table)[0].holds is True


def _notebook_source() -> str:
    return (ROOT / "book" / "src" / "ch4_hidden_syncs.py").read_text()


def test_notebook_structure():
    import jupytext

    src = _notebook_source()
    nb = jupytext.reads(src, fmt="py:percent")
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")
    labels = [line.split(":label:")[1].strip() for line in src.splitlines() if ":label:" in line]
    assert len(labels) >= 4
    for label in labels:
        assert f"{{solution}} {label}" in src, f"exercise {label} has no solution"
    assert src.count(":class: dropdown") >= len(labels)
    for check in ("check_run_ahead_prediction", "check_bubble_cost", "check_classification", "check_threshold",
                  "check_sync_free_rewrite"):
        assert f"syncs.{check}(" in src
    for claim_id in CLAIM_IDS:
        assert f'syncs.show_claim("{claim_id}")' in src
    assert "ex.claims_table(chapter=4)" in nb.cells[-1].source
    assert syncs.POST in src
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "torch.cuda" not in code, "notebook code must go through ex.run / panels / checks"


def test_notebook_is_in_sync():
    import importlib.util

    import nbformat

    spec = importlib.util.spec_from_file_location("sync_notebooks", ROOT / "scripts" / "sync_notebooks.py")
    sync = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sync)
    built = nbformat.writes(sync.build(ROOT / "book" / "src" / "ch4_hidden_syncs.py", sync.repo_url()),
                            version=4) + "\n"
    assert (ROOT / "book" / "ch4_hidden_syncs.ipynb").read_text() == built, "run scripts/sync_notebooks.py"


@pytest.mark.slow
def test_notebook_executes_on_cpu_with_lab_shaped_data(fake_recording, monkeypatch):
    import time

    import nbclient
    import nbformat

    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    nb = nbformat.read(ROOT / "book" / "ch4_hidden_syncs.ipynb", as_version=4)
    t0 = time.perf_counter()
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(ROOT)}}).execute()
    assert time.perf_counter() - t0 < 60, "the page must execute in well under a minute on CPU"
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors, errors[0] if errors else ""


# ================================================================ recorded results (written by the lab GPU run)

PLOTS = {"syncs.run_ahead": syncs.plot_run_ahead, "syncs.catalogue": syncs.plot_catalogue,
         "syncs.queue_probe": syncs.plot_queue_probe, "syncs.pageable_threshold": syncs.plot_pageable_threshold,
         "syncs.case_study": syncs.plot_case_study, "syncs.blind_spots": syncs.plot_blind_spots}


@pytest.mark.parametrize("exp_id", SYNCS_IDS)
def test_recorded_grid_is_complete_and_renders(exp_id, recorded_mode):
    exp = registry.get(exp_id)
    rec = store.load(exp_id, data_schema=exp.data_schema)
    missing = [pt for pt in exp.grid if rec.find(pt) is None]
    assert not missing, f"{exp_id}: grid points not recorded: {missing[:3]}"
    r = ex.run(exp_id)
    assert r.recorded
    assert isinstance(PLOTS[exp_id](r), Figure)


def test_recorded_claims_hold(recorded_mode):
    results = claims.evaluate_all(4, mode="recorded")
    assert [r.id for r in results] == list(CLAIM_IDS)
    for r in results:
        assert r.holds is True, f"{r.id}: {r.holds} with {r.measured} {r.error}"


def test_recorded_catalogue_is_consistent(recorded_mode):
    """Syncing rows waited for the queue, quiet rows returned at once, syncing rows do not capture."""
    for numel in syncs.NUMEL_CHOICES:
        d = ex.run("syncs.catalogue", numel=numel).data
        for row in d["rows"]:
            waited = row["host_blocked_ms"]["median"]
            if row["expected_sync"] is True:
                assert waited >= 0.5 * d["work_ms"], f"{row['code']} at {numel}: waited {waited:.2f} ms"
                assert row["capturable"] is not True, f"{row['code']} captured although it syncs"
            if row["expected_sync"] is False and row["id"] != "cpu_bool_mask" and numel == 4096:
                assert waited < 0.25 * d["work_ms"], f"{row['code']}: waited {waited:.2f} ms"
            if row["debug_mode_syncs"] > 0:
                assert row["detector_syncs"] >= row["debug_mode_syncs"]
    big = {r["id"]: r for r in ex.run("syncs.catalogue", numel=4_194_304).data["rows"]}
    assert big["to_cuda_pageable_nb"]["blocks"] and big["to_cuda_pageable_nb"]["debug_mode_syncs"] == 0
    assert "pageable_htod" in big["to_cuda_pageable_nb"]["detector_kinds"]


def test_recorded_run_ahead_shows_the_bubble(recorded_mode):
    for h, g in [(0.5, 2.0), (1.0, 2.0), (1.5, 2.0)]:
        v = ex.run("syncs.run_ahead", host_ms=h, gpu_ms=g).data["variants"]
        model = syncs.predicted_run_ahead_ms(h, g)
        for name in ("none", "every_step"):
            assert v[name]["end_ms"] == pytest.approx(model[name], rel=0.15), (h, g, name)
        if h < 1.5:
            assert v["once"]["host_blocked_ms"] > 2 * (v["once"]["end_ms"] - v["none"]["end_ms"]), \
                "the host's wait should be much longer than what the sync cost the loop"


def test_recorded_queue_probe_slopes(recorded_mode):
    assert ex.run("syncs.queue_probe", op="item")["slope"] == pytest.approx(1.0, abs=0.2)
    assert abs(ex.run("syncs.queue_probe", op="full")["slope"]) < 0.1


# ================================================================ live on the GPU

@pytest.mark.gpu
def test_live_catalogue_partition(live_mode):
    d = ex.run("syncs.catalogue").data
    rows = {r["id"]: r for r in d["rows"]}
    holds, measured = syncs._claim_catalogue(d)
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
    holds, measured = syncs._claim_pageable(d)
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
    holds, measured = syncs._claim_case_study(d)
    assert holds, (f"syncs.case_study_speedup does not hold: {measured}; batch {d['batch']}, host "
                   f"{d['host_ms_per_step']:.2f} ms/step, forward+backward {d['heavy_gpu_ms']:.2f} ms; "
                   f"report: {d['variants']['hidden_sync']['sync_report']} / {d['variants']['sync_free']['sync_report']}")
    assert any("reduce_grad_stats" in line for line in d["variants"]["hidden_sync"]["sync_report"])


@pytest.mark.gpu
def test_live_blind_spots(live_mode):
    d = ex.run("syncs.blind_spots").data
    holds, measured = syncs._claim_blind_spot(d)
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
