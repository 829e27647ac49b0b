"""Chapter 1 on CPU: snapshot and OOM-message parsing, the experiments' data assembly (with the
allocator model standing in for the GPU), claims, figures, tables, checks, and the recorded
results the book renders."""
import copy
import math
import pickle
import re
import time

import jsonschema
import pytest
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from experiments.core import alloc_conf, claims, registry, store

from experiments import allocator
from experiments.allocator import fresh as alloc_fresh, measurements as alloc_meas, predict as alloc_predict

from experiments.allocator import gpu as allocator_gpu
from experiments.allocator.model import AllocatorConfig, MiB
from experiments.allocator.model import simulate
from experiments.allocator.snapshot import (
    PoolIdsMissingError, format_figure, fragmentation_index, layout_summary, load_snapshot, oom_rows,
    parse_oom_message, parse_segments,
)
from experiments.core.registry import Result

# An out-of-memory message as torch 2.11 printed it on the lab H200 (experiments/doctor/RULES.md §I.4).
LAB_OOM = """CUDA out of memory. Tried to allocate 1.40 GiB. GPU 0 has a total capacity of
139.80 GiB of which 136.53 GiB is free. Including non-PyTorch memory, this
process has 3.26 GiB memory in use. 2.80 GiB allowed; Of the allocated memory
423.00 MiB is allocated by PyTorch, and 2.34 GiB is reserved by PyTorch but
unallocated. If reserved but unallocated memory is large try setting
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See
documentation for Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)"""


def option_values(control):
    """The values a widget offers (its options may be (label, value) pairs)."""
    return [o[1] if isinstance(o, tuple) else o for o in control.options]


def oom_message(figures, cap):
    """A message in torch's wording for the model's out-of-memory figures."""
    return (f"CUDA out of memory. Tried to allocate {format_figure(figures['alloc_size_bytes'])}. GPU 0 has a total "
            f"capacity of 14.56 GiB of which 13.90 GiB is free. Process 4242 has 612.00 MiB memory in use. "
            f"{format_figure(cap)} allowed; Of the allocated memory {format_figure(figures['allocated_bytes'])} is "
            f"allocated by PyTorch, and {format_figure(figures['reserved_unallocated_bytes'])} is reserved by PyTorch "
            "but unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")


def model_run(ops, settings=None, cap_mib=None):
    """What allocator_gpu.run_ops returns, produced by the model (a CPU stand-in for the GPU)."""
    cfg = AllocatorConfig.from_settings(settings)
    cap = None if cap_mib is None else int(cap_mib * MiB)
    r = simulate(ops, cfg, cap_bytes=cap)
    r["expandable_in_effect"] = cfg.expandable_segments
    if r["oom"]:
        r["oom"]["message"] = oom_message(r["oom"], cap)
    return r


def model_graph_pools(settings, hidden, batch_sizes, dtype, autograd=True, **_):
    """What allocator_gpu.graph_pools_worker returns, with the model's pool sizes (nothing
    outside the pool)."""
    expandable = AllocatorConfig.from_settings(settings).expandable_segments
    pred = allocator.predict_graph_pools({"hidden": hidden, "batch_sizes": batch_sizes, "dtype": dtype}, expandable)

    def order(values, name):
        seg = {"total_size": values[-1], "pool": "large", "is_expandable": expandable,
               "blocks": [{"size": values[-1], "state": "inactive"}]}
        return {"capture_order": sorted(batch_sizes, reverse=name == "decreasing"), "growth_after_each_bytes": values,
                "pool_after_each_bytes": values, "reserved_growth_bytes": values[-1], "pool_reserved_bytes": values[-1],
                "pool_segments": [seg], "replayed": True, "left_after_release_bytes": 0}

    out = {"hidden": hidden, "dtype": dtype, "batch_sizes": list(batch_sizes), "_alloc_conf": ""}
    out.update({o: order(v, o) for o, v in pred["no_grad"].items()})
    if autograd:
        out["autograd"] = {o: order(v, o) for o, v in pred["autograd"].items()}
    return out


class FakeFreshProcesses:
    """Stands in for experiments.runner.run_fresh: the allocator model plays the GPU, and
    every call (one fresh process on a GPU) is counted."""

    def __init__(self):
        self.calls = []
        self.spans = []              # (settings, start, end) of each call, time.monotonic()
        self.failing_jobs = set()
        self.seconds = 0.0           # each process takes at least this long
        self.failing_starts = []     # settings whose next process fails to start (then popped)

    def __call__(self, target, kwargs=None, *, alloc_conf_settings=None, memory_cap_mib=None, memory_fraction=None,
                 timeout_s=120.0, env=None):
        from experiments.core.runner import FreshResult

        settings = alloc_conf_settings
        self.calls.append((target.rpartition(":")[2], settings, memory_cap_mib))
        start = time.monotonic()
        time.sleep(self.seconds)
        if settings in self.failing_starts:
            self.failing_starts.remove(settings)
            raise RuntimeError("the fresh process exited with status 1 before it ran: CUDA driver initialization failed")
        kwargs = kwargs or {}
        if target.endswith(":sequences_worker"):
            value = {n: model_run(ops, settings, memory_cap_mib) for n, ops in kwargs["sequences"].items()}
        elif target.endswith(":shared_worker"):
            value = {}
            for name, job in kwargs["jobs"].items():
                if name in self.failing_jobs:
                    value[name] = {"ok": False, "error": "RuntimeError: CUDA error: an illegal memory access"}
                elif "graph_pools" in job:
                    value[name] = {"ok": True, "value": model_graph_pools(settings, **job["graph_pools"])}
                else:
                    value[name] = {"ok": True, "value": {n: model_run(ops, settings, job.get("cap_mib"))
                                                         for n, ops in job["sequences"].items()}}
        else:
            raise AssertionError(f"unexpected fresh-process target {target}")
        self.spans.append((settings, start, time.monotonic()))
        return FreshResult(True, value=store.to_jsonable(value), alloc_conf=str(settings or ""))


def fake_layouts(groups):
    return [simulate([("alloc", f"t{i}", n) for i, n in enumerate(g)] + [("snapshot", "s")])["snapshots"]["s"]
            for g in groups], "mempool"


@pytest.fixture
def fake_gpu(monkeypatch):
    """The allocator model in place of the GPU, at the fresh-process boundary (data assembly only)."""
    from experiments.core import runner

    fresh = FakeFreshProcesses()
    monkeypatch.setattr(runner, "run_fresh", fresh)
    monkeypatch.setattr(alloc_meas, "require_cuda", lambda *a, **k: None)
    monkeypatch.setattr(alloc_fresh, "require_cuda", lambda *a, **k: None)
    monkeypatch.setattr(alloc_meas, "check_fits", lambda *a, **k: None)
    monkeypatch.setattr(allocator_gpu, "measure_layouts", fake_layouts)
    alloc_fresh._forget_shared()
    yield fresh
    alloc_fresh._forget_shared()


@pytest.fixture
def lab(monkeypatch):
    """The lab H200's recording in experiments/recorded/ (never a stand-in): lab(exp_id, **params) -> Result."""
    monkeypatch.delenv("CUDA_MEMLAB_RECORDED_DIR", raising=False)
    monkeypatch.setenv("CUDA_MEMLAB_MODE", "recorded")

    def get(exp_id, **params):
        r = registry.run(exp_id, mode="recorded", **params)
        assert r.provenance.gpu_name == "NVIDIA H200"
        return r
    return get


def validated(exp_id, data):
    data = store.to_jsonable(data)
    jsonschema.validate(data, registry.get(exp_id).data_schema)
    return data


# --------------------------------------------------------------------------- snapshots

def snap_block(addr, size, state, requested=0):
    return {"address": addr, "size": size, "requested_size": requested, "state": state, "frames": []}


SNAPSHOT = {
    "segments": [
        {"device": 0, "address": 0x7F0000400000, "total_size": 20 * MiB, "allocated_size": 5 * MiB,
         "active_size": 5 * MiB, "requested_size": 5 * MiB, "stream": 0, "segment_type": "large",
         "segment_pool_id": (0, 3), "is_expandable": False, "frames": [],
         "blocks": [snap_block(0x7F0000900000, 15 * MiB, "inactive"),
                    snap_block(0x7F0000400000, 5 * MiB, "active_allocated", 5 * MiB)]},
        {"device": 0, "address": 0x7F0000000000, "total_size": 2 * MiB, "allocated_size": 1024,
         "active_size": 1024, "requested_size": 1000, "stream": 0, "segment_type": "small",
         "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
         "blocks": [snap_block(0x7F0000000000, 1024, "active_allocated", 1000),
                    snap_block(0x7F0000000400, 2 * MiB - 1024, "inactive")]},
        {"device": 1, "address": 0x7E0000000000, "total_size": 20 * MiB, "allocated_size": 0, "active_size": 0,
         "requested_size": 0, "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": True,
         "frames": [], "blocks": [snap_block(0x7E0000000000, 20 * MiB, "inactive")]},
    ],
    "device_traces": [[], []],
    "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1},
    "external_annotations": [],
}


def test_parse_segments_sorts_and_filters():
    segs = parse_segments(SNAPSHOT, device=0)
    assert [s["pool"] for s in segs] == ["small", "large"]            # by address
    assert [b["size"] for b in segs[1]["blocks"]] == [5 * MiB, 15 * MiB]  # blocks by address
    assert segs[1]["pool_id"] == [0, 3] and segs[0]["blocks"][0]["requested_size"] == 1000
    assert [s["total_size"] for s in parse_segments(SNAPSHOT, pool_id=(0, 3))] == [20 * MiB]
    assert len(parse_segments(SNAPSHOT)) == 3
    assert parse_segments(SNAPSHOT["segments"], device=1)[0]["is_expandable"] is True


def test_parse_segments_rejects_what_is_not_a_snapshot():
    with pytest.raises(ValueError, match="'segments'"):
        parse_segments({"device_traces": []})
    broken = {"segments": [dict(SNAPSHOT["segments"][0], total_size=21 * MiB)]}
    with pytest.raises(ValueError, match="add up"):
        parse_segments(broken)
    old = {"segments": [{k: v for k, v in SNAPSHOT["segments"][0].items() if k != "segment_pool_id"}]}
    assert len(parse_segments(old)) == 1
    with pytest.raises(PoolIdsMissingError):
        parse_segments(old, pool_id=(0, 3))


def test_load_snapshot_reads_a_dumped_pickle(tmp_path):
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(SNAPSHOT))
    assert parse_segments(load_snapshot(path)) == parse_segments(SNAPSHOT)
    (tmp_path / "bad.pickle").write_bytes(pickle.dumps(42))
    with pytest.raises(ValueError, match="is not a memory snapshot"):
        load_snapshot(tmp_path / "bad.pickle")


def test_layout_summary_and_fragmentation_index():
    segs = parse_segments(SNAPSHOT, device=0)
    s = layout_summary(segs)
    assert s["reserved_bytes"] == 22 * MiB and s["allocated_bytes"] == 5 * MiB + 1024
    assert s["largest_free_bytes"] == 15 * MiB and s["free_blocks"] == 2
    assert s["fragmentation"] == pytest.approx(1 - 15 * MiB / (17 * MiB - 1024))
    two = [{"total_size": 48, "pool": "large", "blocks": [{"size": 16, "state": "inactive"},
                                                           {"size": 16, "state": "active_allocated"},
                                                           {"size": 16, "state": "inactive"}]}]
    assert fragmentation_index(two) == 0.5
    assert fragmentation_index([{"total_size": 8, "pool": "large", "blocks": [{"size": 8, "state": "active_allocated"}]}]) == 0


# --------------------------------------------------------------------------- OOM messages

def test_parse_the_lab_oom_message():
    f = parse_oom_message(LAB_OOM)
    GiB = 1 << 30
    assert f["format"] == "new" and f["device"] == 0
    assert f["tried_to_allocate_bytes"] == round(1.40 * GiB)
    assert f["allowed_bytes"] == round(2.80 * GiB) and f["process_in_use_bytes"] == round(3.26 * GiB)
    assert f["allocated_by_pytorch_bytes"] == 423 * MiB
    assert f["reserved_unallocated_bytes"] == round(2.34 * GiB)
    assert f["reserved_bytes"] == 423 * MiB + round(2.34 * GiB)
    assert f["private_pools_bytes"] is None
    rows = dict((k, v) for k, v in oom_rows(f))
    assert rows["reserved by PyTorch but unallocated (cached)"] == "2.34 GiB"


def test_parse_other_oom_wordings():
    with_pools = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 1 has a total capacity "
                  "of 15.77 GiB of which 4.12 MiB is free. Process 1234 has 15.76 GiB memory in use. Of the allocated "
                  "memory 14.00 GiB is allocated by PyTorch, with 1.50 GiB allocated in private pools (e.g., CUDA "
                  "Graphs), and 512.00 KiB is reserved by PyTorch but unallocated.")
    f = parse_oom_message(with_pools)
    assert (f["device"], f["allowed_bytes"], f["private_pools_bytes"]) == (1, None, round(1.5 * (1 << 30)))
    assert f["reserved_unallocated_bytes"] == 512 * 1024 and f["process_in_use_bytes"] == round(15.76 * (1 << 30))
    old = ("CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; 14.20 GiB already "
           "allocated; 19.75 MiB free; 14.45 GiB reserved in total by PyTorch)")
    f = parse_oom_message(old)
    assert f["format"] == "old" and f["reserved_unallocated_bytes"] == round(14.45 * (1 << 30)) - round(14.20 * (1 << 30))


@pytest.mark.parametrize("text, match", [("RuntimeError: CUDA error: an illegal memory access", "not a CUDA out-of-memory"),
                                         ("CUDA out of memory.", "Tried to allocate"),
                                         ("CUDA out of memory. Tried to allocate 2.00 GiB.", "device figures"),
                                         (None, "not a CUDA out-of-memory")])
def test_parse_oom_rejects_other_errors(text, match):
    with pytest.raises(ValueError, match=match):
        parse_oom_message(text)


# --------------------------------------------------------------------------- experiments, with the model as the GPU

def test_parameters_are_validated_before_any_gpu_work():
    with pytest.raises(ValueError, match=r"size_bytes must be a number in \[1, "):
        registry.run("alloc.anatomy", size_bytes=0.0)
    with pytest.raises(ValueError, match="size_bytes"):
        registry.run("alloc.anatomy", size_bytes=-5.0)
    with pytest.raises(ValueError, match="size_bytes"):
        registry.run("alloc.anatomy", size_bytes=1e12)
    with pytest.raises(ValueError, match=r"count must be an integer in \[1, 8\]"):
        registry.run("alloc.anatomy", count=0)
    with pytest.raises(ValueError, match="small_mib must be one of 8, 16"):
        registry.run("alloc.timeline", small_mib=12)
    with pytest.raises(ValueError, match="expandable must be True or False"):
        registry.run("alloc.graph_pools", expandable="yes")
    allowed = ", ".join(str(c) for c in allocator.OOM_CAP_CHOICES)
    with pytest.raises(ValueError, match=f"cap_mib must be one of {allowed}, got 320"):
        registry.run("alloc.fragmentation_oom", cap_mib=320)
    with pytest.raises(ValueError, match=f"cap_mib must be one of {allowed}, got 1024"):
        allocator.fragmentation_oom(cap_mib=1024)          # called directly: still before any GPU work
    with pytest.raises(ValueError, match="cap_mib must be one of"):
        allocator.predict_oom(cap_mib=300)
    with pytest.raises(ValueError, match="pattern must be one of"):
        allocator.oom_ops("scatter")
    with pytest.raises(ValueError, match="order must be one of"):
        allocator.timeline_ops("random", 16)
    with pytest.raises(ValueError, match="order must be one of"):
        allocator.graph_capture_ops([256], order="random")
    with pytest.raises(ValueError, match="setting must be one of"):
        allocator.shared_jobs("max_split_size_mb")


def test_every_grid_fits_the_time_budget_shape():
    grids = {e.id: len(e.grid) for e in registry.all_experiments(1)}
    assert grids == {"alloc.request_table": 1, "alloc.anatomy": 16, "alloc.timeline": 4, "alloc.fragmentation_oom": 6,
                     "alloc.graph_pools": 2, "alloc.pool_boundary": 2, "alloc.knobs": 1,
                     # the doctor's snapshots: 7 workloads x 2-5 settings, ~140 s on the H200
                     "alloc.doctor_snapshots": 7,
                     # the doctor's test oracles: 16 real programs x 2-5 settings, on demand, ~4 min
                     "alloc.doctor_cases": 16,
                     # programs held back from the doctor's design: 6 x 3-4 settings, 75 s on the H200
                     "alloc.doctor_heldout": 6}


def test_a_shared_result_is_handed_out_once_and_not_for_long(fake_gpu, monkeypatch):
    allocator.timeline(small_mib=16, expandable=False)   # the default process, the expandable one alongside
    assert len(fake_gpu.calls) == 2 and ("default", "pool_boundary") in alloc_fresh._kept
    allocator.pool_boundary(expandable=False)          # kept for it: no new process
    allocator.pool_boundary(expandable=True)           # measured alongside: no new process
    assert len(fake_gpu.calls) == 2
    allocator.pool_boundary(expandable=False)          # asked again: measured again (expandable still kept)
    assert len(fake_gpu.calls) == 3
    monkeypatch.setattr(alloc_fresh, "SHARE_WINDOW_S", -1.0)
    allocator.fragmentation_oom(expandable=False)      # kept, but too old (and so is expandable's)
    assert len(fake_gpu.calls) == 5


def test_the_other_settings_process_runs_alongside(fake_gpu):
    """The chapter asks for both settings; their processes overlap in time, each under its own setting."""
    fake_gpu.seconds = 0.3
    small = allocator.timeline(small_mib=16, expandable=False)
    expandable = allocator.timeline(small_mib=16, expandable=True)
    (s1, a1, b1), (s2, a2, b2) = fake_gpu.spans
    assert {str(s1), str(s2)} == {"None", "{'expandable_segments': True}"}
    assert a1 < b2 and a2 < b1, "the two settings' processes ran one after the other"
    # each answer comes from its own setting: the model's reserved bytes differ between the two
    in_effect = [r["orders"]["small_first"]["expandable_in_effect"] for r in (small, expandable)]
    assert in_effect == [False, True]


def test_a_process_that_failed_alongside_is_started_again_when_asked_for(fake_gpu):
    fake_gpu.failing_starts.append({"expandable_segments": True})
    allocator.graph_pools(expandable=False)
    assert allocator.graph_pools(expandable=True)["expandable_in_effect"] is True
    assert [str(c[1]) for c in fake_gpu.calls].count("{'expandable_segments': True}") == 2


def test_shared_jobs_cover_every_setting_free_measurement():
    jobs = allocator.shared_jobs("default")
    other_caps = [c for c in allocator.OOM_CAP_CHOICES if c != allocator.OOM_CAP_MIB]
    assert set(jobs) == {"timeline_8", "timeline_16", "pool_boundary", "fragmentation_oom", "knobs", "graph_pools",
                         *(f"fragmentation_oom_{c}" for c in other_caps)}
    assert jobs["fragmentation_oom"]["cap_mib"] == allocator.OOM_CAP_MIB and jobs["knobs"]["cap_mib"] == allocator.KNOB_CAP_MIB
    assert [allocator.oom_job(c) for c in allocator.OOM_CAP_CHOICES] == [
        "fragmentation_oom" if c == allocator.OOM_CAP_MIB else f"fragmentation_oom_{c}" for c in allocator.OOM_CAP_CHOICES]
    for c in other_caps:   # the same patterns, only the cap differs
        assert jobs[allocator.oom_job(c)] == {**jobs["fragmentation_oom"], "cap_mib": c}
    assert "cap_mib" not in jobs["timeline_16"] and jobs["graph_pools"]["graph_pools"]["autograd"] is True
    assert jobs["timeline_16"]["sequences"]["small_first"] == allocator.normalize_ops(allocator.timeline_ops("small_first", 16))
    assert allocator.shared_jobs("expandable") == jobs   # the same work; the setting is the process's


def test_a_failed_job_fails_only_its_experiment(fake_gpu):
    fake_gpu.failing_jobs.add("graph_pools")
    with pytest.raises(RuntimeError, match="graph_pools .default settings. failed in its fresh process: RuntimeError: "
                                           "CUDA error"):
        allocator.graph_pools(expandable=False)
    assert allocator.timeline(small_mib=8)["orders"]["small_first"]["reserved_bytes"][-1] == 0
    assert [c[1] for c in fake_gpu.calls].count(None) == 1   # the default process, once


def test_request_table_data_and_claim(fake_gpu):
    data = validated("alloc.request_table", allocator.request_table())
    assert len(data["probes"]) == len(allocator.PROBE_SIZES)
    eleven = next(p for p in data["probes"] if p["request_bytes"] == 11 * MiB)
    assert (eleven["block_bytes"], eleven["segment_bytes"], eleven["split"]) == (12 * MiB, 12 * MiB, False)
    holds, measured = alloc_meas._claim_rounding(data)
    assert holds and measured["probes"] == 19
    data["probes"][3]["block_bytes"] += 512           # a block the rule does not predict
    data["probes"][9]["segment_bytes"] = 4 * MiB      # a segment of the wrong size
    holds, measured = alloc_meas._claim_rounding(data)
    assert not holds and measured["mismatched sizes (B)"] == [513, 2 * MiB]


def test_anatomy_data(fake_gpu):
    data = validated("alloc.anatomy", allocator.anatomy(size_bytes=5 * MiB + 0.4, count=3))
    assert data["request_bytes"] == 5 * MiB and data["matches_model"]
    assert data["reserved_bytes"] == 20 * MiB and data["allocated_bytes"] == 15 * MiB


def test_timeline_data(fake_gpu):
    data = validated("alloc.timeline", allocator.timeline(small_mib=16, expandable=False))
    small = data["orders"]["small_first"]
    assert small["phase_ends"] == [7, 15, 19, 23, 24] and small["empty_cache_step"] == 24
    assert small["reserved_bytes"][small["phase_ends"][2]] == 256 * MiB and small["reserved_bytes"][-1] == 0
    assert data["orders"]["large_first"]["reserved_bytes"][19] == 128 * MiB
    exp = validated("alloc.timeline", allocator.timeline(small_mib=16, expandable=True))
    assert [r // MiB for r in exp["orders"]["small_first"]["reserved_bytes"][:8]] == [20, 40, 60, 80, 80, 100, 120, 140]


def test_fragmentation_oom_data_and_claim(fake_gpu):
    data = validated("alloc.fragmentation_oom", allocator.fragmentation_oom(expandable=False))
    outcome = {k: p["oom"] for k, p in data["patterns"].items()}
    assert outcome == {"shrink": True, "interleave": True, "grouped": False}
    inter = data["patterns"]["interleave"]
    assert inter["figures"]["reserved_unallocated_bytes"] == 176 * MiB and inter["figures"]["allowed_bytes"] == 384 * MiB
    assert inter["reserved_before_request_bytes"] == 352 * MiB and inter["allocated_before_request_bytes"] == 176 * MiB
    holds, measured = alloc_meas._claim_fragmentation_oom(data)
    assert holds and measured["figures from"] == "OOM message" and measured["reserved but unallocated MiB"] == 176
    inter["figures"] = None                       # an unparsable message: the counters decide
    assert alloc_meas._claim_fragmentation_oom(data)[1]["figures from"] == "memory_stats"
    inter["oom"] = False
    assert not alloc_meas._claim_fragmentation_oom(data)[0]
    exp = validated("alloc.fragmentation_oom", allocator.fragmentation_oom(expandable=True))
    assert {k: p["oom"] for k, p in exp["patterns"].items()} == {"shrink": False, "interleave": True, "grouped": False}
    assert data["cap_mib"] == allocator.OOM_CAP_MIB == 384 and claims.get_claim("alloc.fragmentation_oom").params == {
        "cap_mib": 384, "expandable": False}
    assert all(p["reached_request"] and p["predicted_reached_request"] for p in data["patterns"].values())
    assert inter["failed_request_bytes"] == 64 * MiB and inter["failed_label"] == "alloc request (64 MiB) → OOM"
    early = copy.deepcopy(data)                   # a failure in phase 1 is not the claim's failure
    early["patterns"]["interleave"]["reached_request"] = False
    assert not alloc_meas._claim_fragmentation_oom(early)[0]


def test_the_default_cap_is_the_point_measured_before_caps_were_a_parameter(fake_gpu):
    """cap_mib=384 runs the same job as before (the shared 'fragmentation_oom') and gives the same data."""
    default = validated("alloc.fragmentation_oom", allocator.fragmentation_oom())
    explicit = validated("alloc.fragmentation_oom", allocator.fragmentation_oom(cap_mib=allocator.OOM_CAP_MIB))
    assert default == explicit and default["cap_bytes"] == allocator.OOM_CAP_MIB * MiB
    measured = {n: model_run(allocator.oom_ops(n), cap_mib=allocator.OOM_CAP_MIB) for n in allocator.OOM_PATTERNS}
    assert alloc_predict._oom_data(store.to_jsonable(measured), expandable=False) == default


@pytest.mark.parametrize("expandable", [False, True])
def test_fragmentation_oom_under_each_cap(fake_gpu, expandable):
    """The lesson of the cap: below the first phase's 352 MiB every pattern fails in phase 1 with nothing cached;
    at the default cap the fragmented patterns fail on the request; at the largest cap every request fits."""
    smallest, largest = min(allocator.OOM_CAP_CHOICES), max(allocator.OOM_CAP_CHOICES)
    phase1 = allocator.OOM_FILL_COUNT * allocator.OOM_FILL_MIB
    assert smallest < phase1 < allocator.OOM_CAP_MIB < phase1 + allocator.OOM_REQUEST_MIB <= largest
    outcomes = {}
    for cap in allocator.OOM_CAP_CHOICES:
        d = validated("alloc.fragmentation_oom", allocator.fragmentation_oom(cap_mib=cap, expandable=expandable))
        assert (d["cap_mib"], d["cap_bytes"]) == (cap, cap * MiB)
        for name, p in d["patterns"].items():
            assert (p["oom"], p["oom_step"]) == (p["predicted_oom"], p["predicted_oom_step"]), (cap, name)
            assert p["reached_request"] == p["predicted_reached_request"], (cap, name)
            if p["oom"]:
                assert p["figures"]["allowed_bytes"] == cap * MiB
                assert p["figures"]["tried_to_allocate_bytes"] == p["failed_request_bytes"]
        outcomes[cap] = d
    for name, p in outcomes[smallest]["patterns"].items():
        assert p["oom"] and not p["reached_request"], name
        assert p["failed_request_bytes"] == allocator.OOM_FILL_MIB * MiB and p["failed_label"].startswith("alloc p")
        assert p["reserved_unallocated_at_failure_bytes"] == 0 and p["reserved_before_request_bytes"] is None
        assert p["segments_before_request"] == [] and p["segments_after"], name
    assert not any(p["oom"] for p in outcomes[largest]["patterns"].values())
    at_default = outcomes[allocator.OOM_CAP_MIB]["patterns"]
    assert at_default["interleave"]["oom"] and not at_default["grouped"]["oom"]
    assert at_default["shrink"]["oom"] is not expandable
    if not expandable:   # with room to spare, nothing forces the release of the segments 'grouped' frees
        assert (outcomes[largest]["patterns"]["grouped"]["reserved_after_bytes"]
                > at_default["grouped"]["reserved_after_bytes"])


def test_oom_tables_and_figures_under_each_cap(fake_gpu):
    prov = store.load("alloc.knobs").provenance
    for cap in allocator.OOM_CAP_CHOICES:
        data = validated("alloc.fragmentation_oom", allocator.fragmentation_oom(cap_mib=cap))
        r = Result("alloc.fragmentation_oom", {"cap_mib": cap, "expandable": False}, data, prov, "live", 0.0)
        early = not data["patterns"]["interleave"]["reached_request"]
        fig = allocator.plot_fragmentation_oom(r)
        assert f"cap {cap} MiB" in fig._suptitle.get_text().replace("\n", " ") and ("phase 1" in fig._suptitle.get_text().replace("\n", " ")) is early
        labels = [" ".join(t.get_text().split()) for t in fig.axes[1].texts]  # 'OOM (phase 1)' is on two lines
        assert labels == [("OOM (phase 1)" if not p["reached_request"] else "OOM") if p["oom"] else "fits"
                          for p in (data["patterns"][n] for n in ("shrink", "interleave", "grouped"))]
        assert len(bars(fig.axes[1])) == 6 and len(fig.axes[1].collections) == 1    # bars and the end marks
        assert max(fig.axes[1].get_ylim()) > cap
        table = allocator.oom_table(r)
        assert ("out of memory in phase 1" in str(table)) is early and f"Memory cap {cap} MiB" in table.caption
        assert [row[1] for row in table.rows] == [row[2] for row in table.rows]    # measured as the model says
        if early:
            assert "32.00 MiB" in str(allocator.oom_figures_table(r, "interleave"))
        if cap != allocator.OOM_CAP_MIB:    # the exercise reads the error under the default cap only
            with pytest.raises(ValueError, match=f"cap_mib={allocator.OOM_CAP_MIB}"):
                allocator.check_oom_reading(176, "group", result=r)


def test_oom_message_that_cannot_be_parsed_is_kept():
    garbled = {name: {**r, "oom": r["oom"] and {**r["oom"], "message": "CUDA out of memory. (a future wording)"}}
               for name, r in ((n, model_run(allocator.oom_ops(n), cap_mib=allocator.OOM_CAP_MIB))
                               for n in allocator.OOM_PATTERNS)}
    p = alloc_predict._oom_data(garbled, expandable=False)["patterns"]["interleave"]
    assert p["figures"] is None and "Tried to allocate" in p["parse_error"] and p["oom"]


def test_pool_boundary_data_and_claim(fake_gpu):
    for expandable in (False, True):
        data = validated("alloc.pool_boundary", allocator.pool_boundary(expandable=expandable))
        sweep = data["sweep"]
        assert [r // MiB for r in sweep["reserved_bytes"]] == [22, 22, 22, 22, 20, 20, 20, 20, 20, 20]
        assert alloc_meas._claim_pool_boundary(data)[0]
    data["small_to_large"]["reserved_after_bytes"] = data["small_to_large"]["reserved_before_bytes"]
    holds, measured = alloc_meas._claim_pool_boundary(data)
    assert not holds and measured["reserved growth MiB"] == 0


def test_knobs_data(fake_gpu):
    data = validated("alloc.knobs", allocator.knobs())
    final = {k: (v["default"]["reserved_bytes"][-1] // MiB, v["knob"]["reserved_bytes"][-1] // MiB,
                 v["expandable"]["reserved_bytes"][-1] // MiB) for k, v in data["knobs"].items()}
    assert final == {"max_split_size_mb": (310, 190, 180), "roundup_power2_divisions": (148, 40, 40),
                     "garbage_collection_threshold": (340, 40, 300)}
    assert data["knobs"]["roundup_power2_divisions"]["setting"] == "roundup_power2_divisions:4"


def test_knobs_skip_a_setting_this_torch_lacks(fake_gpu, monkeypatch, lab):
    monkeypatch.setitem(allocator.KNOBS, "large_segment_size_mb", {
        "setting": {"large_segment_size_mb": 40}, "workload": "a 3 MiB tensor", "ops": [("alloc", "a", 3 * MiB)]})
    monkeypatch.setattr(alloc_conf, "torch_version", lambda: (2, 6))
    k = allocator.knobs()["knobs"]["large_segment_size_mb"]
    assert k["knob"] is None and "needs torch >= 2.10" in k["unsupported"]
    real = lab("alloc.knobs")
    one = Result(real.experiment, real.params, {"cap_bytes": 384 * MiB, "knobs": {"large_segment_size_mb": k}},
                 real.provenance, "recorded", 1.0)
    assert "not supported" in " ".join(t.get_text().replace("\n", " ") for ax in allocator.plot_knobs(one).axes
                                       for t in ax.texts)


def test_graph_capture_ops_follow_the_mlp():
    ops, ends = allocator.graph_capture_ops([256, 512], 4096, order="decreasing")
    assert len(ends) == 2 and ends[-1] == len(ops) - 1
    assert ops[0] == ("alloc", "g0_matmul", 512 * 2 * 4096 * 2)     # the 512 batch first: B × 2·hidden × 2 B
    live, peak = 0, 0
    sizes = {}
    for op in ops[: ends[0] + 1]:
        if op[0] == "alloc":
            sizes[op[1]] = op[2]
            live += op[2]
        else:
            live -= sizes[op[1]]
        peak = max(peak, live)
    assert peak == 2 * 512 * 2 * 4096 * 2 and live == 0                # two activations at once, all freed
    ops, _ = allocator.graph_capture_ops([256], 4096, autograd=True)
    alive = [op[1] for op in ops[:5] if op[0] == "alloc"]
    assert alive == ["g0_matmul", "g0_relu", "g0_mul", "g0_add"]         # relu's output is still alive at the add


def test_graph_pools_data_and_the_model(fake_gpu):
    data = validated("alloc.graph_pools", allocator.graph_pools(expandable=False))
    assert data["expandable_in_effect"] is False and "_alloc_conf" not in data
    assert alloc_meas._claim_order_matters(data)[0]
    pred = allocator.predict_graph_pools(data, expandable=False)
    assert {v: (o["increasing"][-1] // MiB, o["decreasing"][-1] // MiB) for v, o in pred.items()} == {
        "no_grad": (384, 128), "autograd": (572, 192)}
    exp = validated("alloc.graph_pools", allocator.graph_pools(expandable=True))
    assert exp["expandable_in_effect"] is True and alloc_meas._claim_expandable_order_free(exp)[0]
    pred = allocator.predict_graph_pools(exp, expandable=True)
    assert {v: (o["increasing"][-1] // MiB, o["decreasing"][-1] // MiB) for v, o in pred.items()} == {
        "no_grad": (140, 140), "autograd": (200, 200)}


def test_explain_setting_error(monkeypatch):
    assert allocator.explain_setting_error({"expandable_segments": True}) is None
    assert "max_split_size_mb must be >= 20" in allocator.explain_setting_error({"max_split_size_mb": 8})
    monkeypatch.setattr(alloc_conf, "torch_version", lambda: (2, 4))
    assert "needs torch >= 2.10" in allocator.explain_setting_error({"large_segment_size_mb": 40})


# --------------------------------------------------------------------------- claims on the lab recording

def test_claim_predicates_reject_data_that_contradicts_them(lab):
    graphs = lab("alloc.graph_pools", expandable=False).data
    holds, m = alloc_meas._claim_order_matters(graphs)
    assert holds and m["ratio"] == pytest.approx(graphs["increasing"]["reserved_growth_bytes"]
                                                 / graphs["decreasing"]["reserved_growth_bytes"])
    flat = copy.deepcopy(graphs)
    flat["increasing"]["reserved_growth_bytes"] = flat["decreasing"]["reserved_growth_bytes"]
    assert not alloc_meas._claim_order_matters(flat)[0]
    expandable = lab("alloc.graph_pools", expandable=True).data
    assert alloc_meas._claim_expandable_order_free(expandable)[0]
    apart = copy.deepcopy(expandable)
    apart["increasing"]["reserved_growth_bytes"] = 2 * apart["decreasing"]["reserved_growth_bytes"]
    assert not alloc_meas._claim_expandable_order_free(apart)[0]
    not_in_effect = dict(expandable, expandable_in_effect=False)     # the setting did not take
    assert not alloc_meas._claim_expandable_order_free(not_in_effect)[0]
    boundary = copy.deepcopy(lab("alloc.pool_boundary").data)
    assert alloc_meas._claim_pool_boundary(boundary)[0]
    keep = [i for i, n in enumerate(boundary["sweep"]["sizes_bytes"]) if n > MiB]   # no request at or below 1 MiB
    for key in ("sizes_bytes", "first_reserved_bytes", "reserved_bytes"):
        boundary["sweep"][key] = [boundary["sweep"][key][i] for i in keep]
    holds, m = alloc_meas._claim_pool_boundary(boundary)
    assert not holds and m["≤ 1 MiB requests after a freed 2 MiB block grew"] is False
    oom = copy.deepcopy(lab("alloc.fragmentation_oom").data)
    assert alloc_meas._claim_fragmentation_oom(oom)[0]
    oom["patterns"]["interleave"]["figures"]["reserved_unallocated_bytes"] = 32 * MiB
    assert not alloc_meas._claim_fragmentation_oom(oom)[0]


def test_claims_table_from_the_lab_recording(lab):
    table = claims.claims_table(chapter=1)
    assert [r.id for r in table] == ["alloc.rounding", "alloc.fragmentation_oom", "alloc.order_matters",
                                     "alloc.expandable_order_free", "alloc.pool_boundary"]
    assert all(r.source == allocator.POST_URL for r in table)   # whether they hold: test_recording_acceptance


# --------------------------------------------------------------------------- figures and tables, of the lab recording

def bars(ax):
    return [p for p in ax.patches if isinstance(p, Rectangle)]


def test_figures_have_the_expected_artists(lab):
    table = lab("alloc.request_table")
    fig = allocator.plot_request_table(table)
    assert isinstance(fig, Figure) and len(bars(fig.axes[0])) == 2 * len(allocator.PROBE_SIZES)
    assert any("Recorded on NVIDIA H200" in t.get_text() for t in fig.texts)

    fig = allocator.plot_anatomy(lab("alloc.anatomy", size_bytes=104857603.0, count=3))
    assert len(bars(fig.axes[0])) == 6 and "model predicts exactly" in fig._suptitle.get_text().replace("\n", " ")

    tl = lab("alloc.timeline", small_mib=16, expandable=False)
    fig = allocator.plot_timeline(tl)
    assert len(fig.axes) == 2
    labels = [line.get_label() for line in fig.axes[0].lines if not line.get_label().startswith("_")]
    assert labels == ["allocated", "reserved", "reserved, model"]
    ends = {o: tl.data["orders"][o]["reserved_bytes"][tl.data["orders"][o]["phase_ends"][2]] // MiB
            for o in ("small_first", "large_first")}
    assert f"{ends['small_first']} MiB reserved" in fig.axes[0].get_title()
    assert f"{ends['large_first']} MiB reserved" in fig.axes[1].get_title()

    oom = lab("alloc.fragmentation_oom", cap_mib=allocator.OOM_CAP_MIB, expandable=False)
    fig = allocator.plot_fragmentation_oom(oom, pattern="interleave")
    segments = oom.data["patterns"]["interleave"]["segments_after"]
    assert len(bars(fig.axes[0])) == sum(len(s["blocks"]) for s in segments) and len(bars(fig.axes[1])) == 6
    assert [t.get_text() for t in fig.axes[1].texts] == ["OOM" if oom.data["patterns"][n]["oom"] else "fits"
                                                        for n in ("shrink", "interleave", "grouped")]
    legend = fig.axes[1].get_legend()
    assert legend.get_bbox_to_anchor().y0 < fig.axes[1].get_window_extent().y0   # below the bars, not on them
    with pytest.raises(ValueError, match="pattern must be one of"):
        allocator.plot_fragmentation_oom(oom, pattern="scatter")

    graphs = [lab("alloc.graph_pools", expandable=False), lab("alloc.graph_pools", expandable=True)]
    fig = allocator.plot_graph_pools(graphs)
    groups = 2 * (1 + ("autograd" in graphs[0].data))
    assert len(fig.axes[0].lines) == 4 and len(bars(fig.axes[1])) == 2 * groups
    totals = [f"{g.data[o]['reserved_growth_bytes'] / MiB:.0f}" for o in ("increasing", "decreasing") for g in graphs]
    assert set(totals) <= {t.get_text() for t in fig.axes[1].texts}

    fig = allocator.plot_pool_boundary(lab("alloc.pool_boundary", expandable=False))
    assert any(line.get_xdata()[0] == 1.0 for line in fig.axes[0].lines)   # the 1 MiB line
    s = lab("alloc.pool_boundary").data["small_to_large"]
    assert f"{s['reserved_before_bytes'] // MiB} → {s['reserved_after_bytes'] // MiB} MiB" in fig._suptitle.get_text().replace("\n", " ")

    fig = allocator.plot_knobs(lab("alloc.knobs"))
    assert len(fig.axes) == 3 and all(len(bars(ax)) == 3 for ax in fig.axes)
    assert [ax.get_title() for ax in fig.axes][0] == "max_split_size_mb:64"


def test_tables_render_as_text_and_html(lab):
    oom = lab("alloc.fragmentation_oom", expandable=False)
    t = allocator.oom_table(oom)
    assert len(t) == 3 and "out of memory" in str(t) and "<table" in t._repr_html_()
    assert "padding" in t._repr_html_()
    figs = str(allocator.oom_figures_table(oom, "interleave"))
    unallocated = oom.data["patterns"]["interleave"]["figures"]["reserved_unallocated_bytes"]
    assert "reserved by PyTorch but unallocated (cached)" in figs and f"{unallocated / MiB:.2f} MiB" in figs
    assert "fitted" in str(allocator.oom_figures_table(oom, "grouped"))
    text = allocator.oom_message(oom, "interleave", width=80)
    assert max(len(line) for line in text.splitlines() if "https://" not in line) <= 80
    assert "https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf" in text
    assert "fitted" in allocator.oom_message(oom, "grouped")
    rt = allocator.request_table_html(lab("alloc.request_table"))
    assert len(rt) == 19 and "12 MiB (1 MiB unsplit)" in str(rt)
    assert "max_split_size_mb:64" in str(allocator.knobs_table(lab("alloc.knobs")))
    graphs = [lab("alloc.graph_pools", expandable=False), lab("alloc.graph_pools", expandable=True)]
    gt = allocator.graph_pools_table(graphs)
    assert len(gt) == 4 and gt.header[2:] == ["default: pool (MiB)", "default: model (MiB)", "expandable: pool (MiB)",
                                              "expandable: model (MiB)"]
    pool = graphs[0].data["increasing"]["pool_reserved_bytes"]
    assert gt.rows[0][2] == f"{pool / MiB:.0f}" and "outside the shared pool" in gt.caption


def test_plot_segments_of_an_own_snapshot():
    fig = allocator.plot_segments(parse_segments(SNAPSHOT, device=0), title="mine")
    assert len(bars(fig.axes[0])) == 4 and any(t.get_text() == "your snapshot" for t in fig.texts)
    assert isinstance(allocator.plot_segments([]), Figure)


def test_panels_build_in_recorded_mode(lab):
    from experiments import panel

    for exp_id, render in [("alloc.anatomy", allocator.plot_anatomy), ("alloc.timeline", allocator.plot_timeline),
                           ("alloc.pool_boundary", allocator.plot_pool_boundary),
                           ("alloc.fragmentation_oom", allocator.plot_fragmentation_oom)]:
        controls = panel(exp_id, render).children[1].children
        assert [c.description.split(" ")[0] for c in controls] == [p.name for p in registry.get(exp_id).params]
    sizes = panel("alloc.anatomy", allocator.plot_anatomy).children[1].children[0]
    assert option_values(sizes) == sorted(allocator.ANATOMY_SIZES)


def test_the_cap_panel_offers_the_recorded_grid(lab):
    """The notebook's panel: every cap and both settings, as recorded on the lab GPU."""
    from experiments import panel

    box = panel("alloc.fragmentation_oom", allocator.plot_fragmentation_oom, params=["cap_mib", "expandable"])
    caps, expandable = box.children[1].children
    assert option_values(caps) == list(allocator.OOM_CAP_CHOICES) and caps.value == allocator.OOM_CAP_MIB
    assert option_values(expandable) == [False, True]
    for cap in allocator.OOM_CAP_CHOICES:
        caps.value = cap
        assert "not recorded" not in str(box.children[-1].outputs), cap


# --------------------------------------------------------------------------- exercises

def test_check_timeline_prediction(lab):
    assert allocator.check_timeline_prediction(None, 64).correct is None
    assert allocator.check_timeline_prediction(80, 64).correct is True
    fb = allocator.check_timeline_prediction(128, 80)
    assert fb.correct is False and "20 MiB segments" in fb.message and "16 MiB, not 20" in fb.message
    measured = lab("alloc.timeline", small_mib=8, expandable=False)
    fb = allocator.check_timeline_prediction(80, 64, result=measured)
    assert fb.correct and "the run recorded on NVIDIA H200" in fb.message
    with pytest.raises(ValueError, match="small_mib=8"):
        allocator.check_timeline_prediction(80, 64, result=lab("alloc.timeline", small_mib=16))


def test_check_reserved_function():
    assert allocator.check_reserved_function(None).correct is None
    assert allocator.check_reserved_function(lambda k, s: 20 * math.ceil(k * s / 20)).correct
    fb = allocator.check_reserved_function(lambda k, s: k * s)
    assert not fb.correct and "maps whole pages" in fb.message
    fb = allocator.check_reserved_function(lambda k, s: 20 * math.ceil(k * s / 20), expandable=False)
    assert not fb.correct and "expandable-segments answer" in fb.message
    assert "raised ZeroDivisionError" in allocator.check_reserved_function(lambda k, s: 1 / 0).message
    assert "return a number" in allocator.check_reserved_function(lambda k, s: "20").message
    assert not allocator.check_reserved_function(42).correct


def test_check_frag_index():
    def right(segments):
        free = [b["size"] for s in segments for b in s["blocks"] if b["state"] == "inactive"]
        return 0.0 if not free else 1 - max(free) / sum(free)

    def inverted(segments):
        free = [b["size"] for s in segments for b in s["blocks"] if b["state"] == "inactive"]
        return max(free) / sum(free)

    def counts_pending(segments):
        free = [b["size"] for s in segments for b in s["blocks"] if b["state"] != "active_allocated"]
        return 0.0 if not free else 1 - max(free) / sum(free)

    def per_segment(segments):
        return max(right([s]) for s in segments)

    assert allocator.check_frag_index(None).correct is None
    assert allocator.check_frag_index(right).correct
    assert "1 minus that" in allocator.check_frag_index(inverted).message
    assert "return 0" in allocator.check_frag_index(lambda segs: inverted(segs) and 1 - inverted(segs)).message
    assert "'inactive'" in allocator.check_frag_index(counts_pending).message
    assert "over all segments" in allocator.check_frag_index(per_segment).message


def test_check_pool_boundary_choice():
    assert allocator.check_pool_boundary_choice(None).correct is None
    assert allocator.check_pool_boundary_choice("b").correct
    assert "512 B" in allocator.check_pool_boundary_choice("a").message
    assert not allocator.check_pool_boundary_choice("e").correct


def test_check_oom_reading(lab):
    measured = lab("alloc.fragmentation_oom", expandable=False)
    unallocated = measured.data["patterns"]["interleave"]["figures"]["reserved_unallocated_bytes"] / MiB
    assert allocator.check_oom_reading(None, "group").correct is None
    assert allocator.check_oom_reading(unallocated, "group", result=measured).correct
    assert allocator.check_oom_reading(unallocated, "group").correct          # the page's own mode
    fb = allocator.check_oom_reading(unallocated + 64, "expandable_segments", result=measured)
    assert not fb.correct and "includes the request" in fb.message and "fails too" in fb.message
    assert "released every whole free segment" in allocator.check_oom_reading(unallocated, "empty_cache",
                                                                               result=measured).message
    assert not allocator.check_oom_reading(unallocated, "max_split_size_mb:64", result=measured).correct


def test_the_max_split_answer_is_wrong_for_the_model_too():
    ops = allocator.oom_ops("interleave")
    assert simulate(ops, {"max_split_size_mb": 64}, cap_bytes=allocator.OOM_CAP_MIB * MiB)["oom"] is not None
    assert simulate(allocator.oom_ops("grouped"), cap_bytes=allocator.OOM_CAP_MIB * MiB)["oom"] is None


def test_try_sequence_without_a_gpu(monkeypatch):
    run = allocator.try_sequence([("alloc", "a", "2 MiB"), ("free", "a"), ("alloc", "b", "512 KiB")], mode="recorded")
    assert run["measured"] is None and "No GPU here" in run["note"]
    assert [r // MiB for r in run["predicted"]["reserved_bytes"]] == [20, 20, 22]
    assert isinstance(allocator.plot_sequence(run), Figure)
    monkeypatch.setattr(alloc_conf, "torch_version", lambda: (2, 6))
    run = allocator.try_sequence([("alloc", "a", "3 MiB")], settings={"large_segment_size_mb": 40}, mode="live")
    assert run["measured"] is None and "needs torch >= 2.10" in run["note"]
    assert run["predicted"]["reserved_bytes"] == [40 * MiB]
    with pytest.raises(ValueError, match="cap_mib"):
        allocator.try_sequence([("alloc", "a", 1)], cap_mib=0)
    with pytest.raises(ValueError, match="unknown operation"):
        allocator.try_sequence([("malloc", "a", 1)])


# --------------------------------------------------------------------------- the OOM parser on the lab's messages
# (the recordings against the model: tests/test_oracles.py; against the text: tests/test_recording_acceptance.py)

def test_lab_oom_message_reads_back(lab):
    for pt in registry.get("alloc.fragmentation_oom").grid:
        d = lab("alloc.fragmentation_oom", **pt).data
        for name, p in d["patterns"].items():
            if not p["oom"]:
                continue
            f = parse_oom_message(p["message"])
            assert f["tried_to_allocate_bytes"] == p["failed_request_bytes"], (pt, name)
            assert abs(f["reserved_unallocated_bytes"] - p["reserved_unallocated_at_failure_bytes"]) <= 64 * 1024, name
            assert abs(f["allowed_bytes"] - pt["cap_mib"] * MiB) <= MiB, (pt, name)
            if "this process has" in p["message"]:
                own = re.search(r"this process has ([\d.]+) MiB", p["message"]).group(1)
                assert f["process_in_use_bytes"] == round(float(own) * MiB), name


