"""The lab GPU's recordings as the oracle of the CPU models.

Each test replays, on the CPU, the workload an experiment ran on the lab H200 and compares
what the chapter's model computes *now* with what the GPU *measured* (never with the
prediction the recording stores beside it, which is only the model of the day it was
recorded). The workloads come from the chapters' own workload definitions, so a change to
a model or to a workload that the GPU did not see fails here until the experiment is
re-recorded (`python -m experiments record --experiment ID` on a GPU).

Tolerances, and why:
- Chapter 1, the caching allocator model: exact, byte for byte. The model follows the
  rules of ``CUDACachingAllocator.cpp``, and the GPU's figures are integer counters and
  snapshot sizes that no timing can change.
- Chapter 3, the host-cache model: exact. ``host_memory_stats()`` counts bytes and driver
  calls; the lifecycle and rounding scripts make no copies, so no event keeps a block busy.
- Chapter 4, the queue models: timing, so a band. See each test for its bounds.
"""
from __future__ import annotations

import functools

import pytest

from experiments import allocator as al
from experiments import syncs
from experiments.core import registry, store
from experiments.pinned.model import LIFECYCLE_STEPS, HostCacheModel, simulate_lifecycle, step_label

LAB_GPU = "nvidia-h200"
MiB = 2**20


@functools.lru_cache(maxsize=None)
def _recording(exp_id: str) -> store.RecordedFile:
    return store.load(exp_id, LAB_GPU, data_schema=registry.get(exp_id).data_schema)


@pytest.fixture(autouse=True)
def _lab_files(monkeypatch):
    """The lab's files in experiments/recorded/, whatever the environment points at."""
    monkeypatch.delenv("CUDA_MEMLAB_RECORDED_DIR", raising=False)


def points(exp_id: str) -> list[tuple[dict, dict]]:
    """(params, measured data) of every recorded point of ``exp_id``; fails when there is none."""
    rec = _recording(exp_id)
    assert rec.points, f"{exp_id}: no recorded point"
    assert rec.provenance.gpu_name == "NVIDIA H200"
    return [(dict(p.params), p.data) for p in rec.points]


def layout(segments) -> list[str]:
    """A layout without addresses or segment order (what the model and the GPU can share)."""
    return sorted(al.compact_layout(segments))


def config(expandable: bool) -> al.AllocatorConfig:
    return al.AllocatorConfig(expandable_segments=expandable)


# ================================================================ chapter 1: the caching allocator model

def test_allocator_model_gives_each_probe_the_block_and_segment_the_gpu_gave():
    probes = points("alloc.request_table")[0][1]["probes"]
    assert [p["request_bytes"] for p in probes] == list(al.PROBE_SIZES), "re-record alloc.request_table"
    for p in probes:
        model = al.request_anatomy(p["request_bytes"])
        for key in ("block_bytes", "pool", "segment_bytes", "remainder_bytes", "split"):
            assert model[key] == p[key], (p["request_bytes"], key, model[key], p[key])
        ops = [("alloc", "t", p["request_bytes"]), ("snapshot", "end")]
        assert layout(al.simulate(ops)["snapshots"]["end"]) == layout(p["segments"]), p["request_bytes"]


def test_allocator_model_lays_out_each_anatomy_request_as_the_gpu_did():
    for params, d in points("alloc.anatomy"):
        ops = [("alloc", f"t{i}", d["request_bytes"]) for i in range(d["count"])] + [("snapshot", "end")]
        assert layout(al.simulate(ops)["snapshots"]["end"]) == layout(d["segments"]), params


def test_allocator_model_follows_each_timeline_step_by_step():
    for params, d in points("alloc.timeline"):
        for order, o in d["orders"].items():
            model = al.simulate(al.timeline_ops(order, params["small_mib"]), config(params["expandable"]))
            where = (params, order)
            assert o["expandable_in_effect"] is params["expandable"], where   # the setting took
            assert model["labels"] == o["labels"], where   # the GPU ran this very workload
            assert model["reserved_bytes"] == o["reserved_bytes"], where
            assert model["allocated_bytes"] == o["allocated_bytes"], where
            assert layout(model["snapshots"]["phase2"]) == layout(o["segments_phase2"]), where


def test_allocator_model_fails_each_fragmentation_pattern_where_the_gpu_failed():
    for params, d in points("alloc.fragmentation_oom"):
        assert d["cap_bytes"] == params["cap_mib"] * MiB
        for name, p in d["patterns"].items():
            where = (params, name)
            assert p["expandable_in_effect"] is params["expandable"], where
            model = al.simulate(al.oom_ops(name), config(params["expandable"]), cap_bytes=d["cap_bytes"])
            assert model["reserved_bytes"] == p["reserved_bytes"], where
            assert model["allocated_bytes"] == p["allocated_bytes"], where
            assert (model["oom"] is not None) is p["oom"], where
            assert (model["oom"] or {}).get("step") == p["oom_step"], where
            assert ("before_request" in model["snapshots"]) is p["reached_request"], where
            if p["oom"]:
                assert model["labels"][model["oom"]["step"]] == p["failed_label"], where
                assert model["oom"]["request_bytes"] == p["failed_request_bytes"], where
                assert model["oom"]["reserved_unallocated_bytes"] == p["reserved_unallocated_at_failure_bytes"], where
            after = model["snapshots"].get("oom") or model["snapshots"].get("after_request") or []
            assert layout(after) == layout(p["segments_after"]), where
            assert (model["num_alloc_retries"], model["num_ooms"]) == (p["num_alloc_retries"], p["num_ooms"]), where


def test_allocator_model_keeps_the_pools_apart_as_the_gpu_did():
    seqs = al.boundary_sequences()
    for params, d in points("alloc.pool_boundary"):
        cfg = config(params["expandable"])
        assert d["expandable_in_effect"] is params["expandable"], params
        sw = d["sweep"]
        assert sw["sizes_bytes"] == list(al.BOUNDARY_SIZES), "re-record alloc.pool_boundary"
        for n, first, reserved, segments in zip(sw["sizes_bytes"], sw["first_reserved_bytes"], sw["reserved_bytes"],
                                                sw["segments"]):
            model = al.simulate(seqs[f"sweep_{n}"], cfg)
            assert (model["reserved_bytes"][0], model["reserved_bytes"][-1]) == (first, reserved), (params, n)
            assert layout(model["snapshots"]["end"]) == layout(segments), (params, n)
        s = d["small_to_large"]
        model = al.simulate(seqs["small_to_large"], cfg)
        freed_at = 2 * s["small_count"] - 1      # the last of the small tensors' frees
        assert model["reserved_bytes"][freed_at] == s["reserved_before_bytes"], params
        assert model["reserved_bytes"][-1] == s["reserved_after_bytes"], params
        assert layout(model["snapshots"]["freed"]) == layout(s["segments_freed"]), params
        assert layout(model["snapshots"]["after"]) == layout(s["segments_after"]), params


def test_allocator_model_follows_each_knob_as_the_gpu_did():
    (_, d), = points("alloc.knobs")
    assert set(d["knobs"]) == set(al.KNOBS), "re-record alloc.knobs"
    for name, k in d["knobs"].items():
        settings = {"default": None, "knob": al.KNOBS[name]["setting"], "expandable": {"expandable_segments": True}}
        for run, setting in settings.items():
            if k[run] is None:          # a knob the recording's torch did not know
                continue
            model = al.simulate(al.KNOBS[name]["ops"], setting, cap_bytes=d["cap_bytes"])
            assert model["reserved_bytes"] == k[run]["reserved_bytes"], (name, run)
            assert model["allocated_bytes"] == k[run]["allocated_bytes"], (name, run)
            assert model["num_alloc_retries"] == k[run]["num_alloc_retries"], (name, run)


def test_allocator_model_fills_the_graph_pool_capture_by_capture_as_the_gpu_did():
    """A CUDA graph's private pool is an allocator of its own: the model, which knows nothing
    of graphs, replays the captures' requests. Exact inside the pool. The growth of reserved
    memory around it also counts what lies outside the pool (cuBLAS's workspace, the
    graphs' own bookkeeping): one constant amount, at most 4 MiB, never growing."""
    for params, d in points("alloc.graph_pools"):
        assert d["expandable_in_effect"] is params["expandable"], params
        variants = {"no_grad": (False, d), "autograd": (True, d["autograd"])}
        for variant, (autograd, orders) in variants.items():
            for order in al.GRAPH_ORDERS:
                o, where = orders[order], (params, variant, order)
                ops, ends = al.graph_capture_ops(d["batch_sizes"], d["hidden"], order=order, autograd=autograd,
                                                 dtype=d["dtype"])
                model = al.simulate(ops + [("snapshot", "end")], config(params["expandable"]))
                pool = [model["reserved_bytes"][e] for e in ends]
                assert o["pool_after_each_bytes"] == pool, where
                assert o["pool_reserved_bytes"] == pool[-1], where
                assert layout(o["pool_segments"]) == layout(model["snapshots"]["end"]), where
                outside = {g - p for g, p in zip(o["growth_after_each_bytes"], pool)}
                assert len(outside) == 1 and 0 <= outside.pop() <= 4 * MiB, where


# ================================================================ chapter 3: the host-cache model

def test_host_cache_model_owns_what_the_gpu_host_allocator_owned_at_each_lifecycle_step():
    for params, d in points("pinned.lifecycle"):
        unit = params["unit_mib"]
        assert d["steps"] == [step_label(s, unit) for s in LIFECYCLE_STEPS], "re-record pinned.lifecycle"
        model = simulate_lifecycle(LIFECYCLE_STEPS, unit_bytes=unit * MiB)
        assert [m["owned_bytes"] for m in model] == d["owned_bytes"], params
        assert [m["num_host_alloc"] for m in model] == d["num_host_alloc"], params
        assert [m["num_host_free"] for m in model] == d["num_host_free"], params


def test_host_cache_model_rounds_each_pinned_request_as_the_gpu_host_allocator_did():
    (_, d), = points("pinned.pow2_rounding")
    model = HostCacheModel()
    for i, (request, owned, new) in enumerate(zip(d["requests_bytes"], d["owned_bytes"], d["new_blocks"])):
        before = model.owned
        created = model.pin(f"r{i}", request)     # every request stays alive, as in the experiment
        assert (model.owned - before, int(created)) == (owned, new), request


# ================================================================ chapter 4: the queue models

# The run-ahead model has no launch overhead and no cost for the sync's own round trip, so
# the GPU can only end later than it says. On the lab H200 those costs came to at most
# 0.12 ms per step (a few kernel launches and one event query or wait each); the band
# allows 0.15 ms per step, which still fails a model that forgets the bubble a sync leaves
# (min(host, gpu), 1-4 ms here). Below it, only the host/GPU clock alignment the experiment
# reports for each run.
RUN_AHEAD_OVERHEAD_MS_PER_STEP = 0.15


def test_queue_model_bounds_each_run_ahead_end_time_the_gpu_measured():
    pts = points("syncs.run_ahead")
    assert len(pts) == len(registry.get("syncs.run_ahead").grid)
    for params, d in pts:
        assert d.get("warmed_up"), "recorded before run_ahead warmed up: re-record syncs.run_ahead"
        model = syncs.predicted_run_ahead_ms(params["host_ms"], params["gpu_ms"], d["steps"])
        for name, v in d["variants"].items():
            where = (params, name, round(v["end_ms"], 3), round(model[name], 3))
            assert v["end_ms"] >= model[name] - v["align_uncertainty_ms"], where
            assert v["end_ms"] <= model[name] + d["steps"] * RUN_AHEAD_OVERHEAD_MS_PER_STEP, where


# The step model adds phase times measured one phase at a time. Where the GPU sets the pace
# (balance >= 1) it must come within 10 %: each phase's GPU time is a median of queued
# runs, good to a few percent, and the sync's round trip is a fraction of a ms of a 20-40 ms
# step. Where the host sets the pace, its phases run slower inside the loop than alone
# (a cold cache after the other phases, the allocator's work), so the model is only a
# lower bound there.
CASE_STUDY_REL_TOLERANCE = 0.10


def test_step_model_explains_each_case_study_step_time_the_gpu_measured():
    pts = points("syncs.case_study")
    assert {p["balance"] for p, _ in pts} >= {0.5, 1.0, 2.0}, "a host-bound and two GPU-bound balances"
    for params, d in pts:
        model = syncs.predicted_step_ms(d["host_phase_ms"], d["gpu_phase_ms"])
        for name, v in d["variants"].items():
            measured, where = v["step_ms"]["median"], (params, name)
            if params["balance"] >= 1.0:
                assert measured == pytest.approx(model[name], rel=CASE_STUDY_REL_TOLERANCE), (where, measured, model)
            else:
                assert measured >= model[name], (where, measured, model)
