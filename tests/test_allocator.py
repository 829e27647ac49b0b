"""Chapter 1 on CPU: snapshot and OOM-message parsing, the experiments' data assembly (with the
allocator model standing in for the GPU), claims, figures, tables, checks, and the recorded
results the book renders."""
import math
import pickle

import jsonschema
import pytest
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from experiments import alloc_conf, allocator, allocator_gpu, claims, registry, store
from experiments.allocator_model import AllocatorConfig, MiB, simulate
from experiments.allocator_snapshot import (
    PoolIdsMissingError, format_figure, fragmentation_index, layout_summary, load_snapshot, oom_rows,
    parse_oom_message, parse_segments,
)
from experiments.device import Provenance
from experiments.registry import Result

PROV = Provenance("NVIDIA H200", "9.0", 150109880320, "580.159.04", "13.0", "2.11.0+cu130", "3.12.3",
                  "2026-11-30T09:11:53+00:00", "0123456789")

# An out-of-memory message as torch 2.11 printed it on the lab H200 (allocator-rules.md §I.4).
LAB_OOM = """CUDA out of memory. Tried to allocate 1.40 GiB. GPU 0 has a total capacity of
139.80 GiB of which 136.53 GiB is free. Including non-PyTorch memory, this
process has 3.26 GiB memory in use. 2.80 GiB allowed; Of the allocated memory
423.00 MiB is allocated by PyTorch, and 2.34 GiB is reserved by PyTorch but
unallocated. If reserved but unallocated memory is large try setting
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See
documentation for Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)"""


def oom_message(figures, cap):
    """A message in torch's wording for the model's out-of-memory figures."""
    return (f"CUDA out of memory. Tried to allocate {format_figure(figures['alloc_size_bytes'])}. GPU 0 has a total "
            f"capacity of 14.56 GiB of which 13.90 GiB is free. Process 4242 has 612.00 MiB memory in use. "
            f"{format_figure(cap)} allowed; Of the allocated memory {format_figure(figures['allocated_bytes'])} is "
            f"allocated by PyTorch, and {format_figure(figures['reserved_unallocated_bytes'])} is reserved by PyTorch "
            "but unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")


def fake_sequences(sequences, *, settings=None, cap_mib=None, timeout_s=0):
    """The GPU worker's output, produced by the model (same structure as allocator_gpu.run_ops)."""
    cfg = AllocatorConfig.from_settings(settings)
    cap = None if cap_mib is None else int(cap_mib * MiB)
    out = {}
    for name, ops in sequences.items():
        r = simulate(ops, cfg, cap_bytes=cap)
        r["expandable_in_effect"] = cfg.expandable_segments
        if r["oom"]:
            r["oom"]["message"] = oom_message(r["oom"], cap)
        out[name] = r
    return out


def fake_layouts(groups):
    return [simulate([("alloc", f"t{i}", n) for i, n in enumerate(g)] + [("snapshot", "s")])["snapshots"]["s"]
            for g in groups], "mempool"


def graph_data(increasing_mib, decreasing_mib, expandable=False):
    def order(total):
        steps = [round(total * (i + 1) / 8) for i in range(8)]
        seg = {"total_size": total * MiB, "pool": "large", "is_expandable": expandable,
               "blocks": [{"size": total * MiB, "state": "inactive"}]}
        return {"capture_order": [], "growth_after_each_bytes": [s * MiB for s in steps],
                "reserved_growth_bytes": total * MiB, "pool_reserved_bytes": total * MiB, "pool_segments": [seg],
                "replayed": True, "left_after_release_bytes": 0}
    return {"hidden": 4096, "dtype": "float16", "batch_sizes": list(allocator.GRAPH_BATCH_SIZES),
            "increasing": order(increasing_mib), "decreasing": order(decreasing_mib), "expandable_in_effect": expandable}


@pytest.fixture
def fake_gpu(monkeypatch):
    monkeypatch.setattr(allocator, "_fresh_sequences", fake_sequences)
    monkeypatch.setattr(allocator, "require_cuda", lambda *a, **k: None)
    monkeypatch.setattr(allocator, "check_fits", lambda *a, **k: None)
    monkeypatch.setattr(allocator_gpu, "measure_layouts", fake_layouts)


def result(exp_id, data, **params):
    exp = registry.get(exp_id)
    return Result(exp_id, exp.complete(params), store.to_jsonable(data), PROV, "recorded", 1.0)


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
    with pytest.raises(ValueError, match="does not hold a memory snapshot"):
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
    with pytest.raises(ValueError, match="has no parameter 'cap_mib'"):
        registry.run("alloc.fragmentation_oom", cap_mib=512)
    with pytest.raises(ValueError, match="pattern must be one of"):
        allocator.oom_ops("scatter")
    with pytest.raises(ValueError, match="order must be one of"):
        allocator.timeline_ops("random", 16)


def test_every_grid_fits_the_time_budget_shape():
    grids = {e.id: len(e.grid) for e in registry.all_experiments(1)}
    assert grids == {"alloc.request_table": 1, "alloc.anatomy": 16, "alloc.timeline": 4, "alloc.fragmentation_oom": 2,
                     "alloc.graph_pools": 2, "alloc.pool_boundary": 2, "alloc.knobs": 1}


def test_request_table_data_and_claim(fake_gpu):
    data = validated("alloc.request_table", allocator.request_table())
    assert len(data["probes"]) == len(allocator.PROBE_SIZES)
    eleven = next(p for p in data["probes"] if p["request_bytes"] == 11 * MiB)
    assert (eleven["block_bytes"], eleven["segment_bytes"], eleven["split"]) == (12 * MiB, 12 * MiB, False)
    holds, measured = allocator._claim_rounding(data)
    assert holds and measured["probes"] == 19
    data["probes"][3]["block_bytes"] += 512           # a block the rule does not predict
    data["probes"][9]["segment_bytes"] = 4 * MiB      # a segment of the wrong size
    holds, measured = allocator._claim_rounding(data)
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
    holds, measured = allocator._claim_fragmentation_oom(data)
    assert holds and measured["figures from"] == "OOM message" and measured["reserved but unallocated MiB"] == 176
    inter["figures"] = None                       # an unparsable message: the counters decide
    assert allocator._claim_fragmentation_oom(data)[1]["figures from"] == "memory_stats"
    inter["oom"] = False
    assert not allocator._claim_fragmentation_oom(data)[0]
    exp = validated("alloc.fragmentation_oom", allocator.fragmentation_oom(expandable=True))
    assert {k: p["oom"] for k, p in exp["patterns"].items()} == {"shrink": False, "interleave": True, "grouped": False}


def test_oom_message_that_cannot_be_parsed_is_kept(fake_gpu, monkeypatch):
    def garbled(*args, **kwargs):
        out = fake_sequences(*args, **kwargs)
        for r in out.values():
            if r["oom"]:
                r["oom"]["message"] = "CUDA out of memory. (a future wording)"
        return out

    monkeypatch.setattr(allocator, "_fresh_sequences", garbled)
    p = allocator.fragmentation_oom()["patterns"]["interleave"]
    assert p["figures"] is None and "Tried to allocate" in p["parse_error"] and p["oom"]


def test_pool_boundary_data_and_claim(fake_gpu):
    for expandable in (False, True):
        data = validated("alloc.pool_boundary", allocator.pool_boundary(expandable=expandable))
        sweep = data["sweep"]
        assert [r // MiB for r in sweep["reserved_bytes"]] == [22, 22, 22, 22, 20, 20, 20, 20, 20, 20]
        assert allocator._claim_pool_boundary(data)[0]
    data["small_to_large"]["reserved_after_bytes"] = data["small_to_large"]["reserved_before_bytes"]
    holds, measured = allocator._claim_pool_boundary(data)
    assert not holds and measured["reserved growth MiB"] == 0


def test_knobs_data(fake_gpu):
    data = validated("alloc.knobs", allocator.knobs())
    final = {k: (v["default"]["reserved_bytes"][-1] // MiB, v["knob"]["reserved_bytes"][-1] // MiB,
                 v["expandable"]["reserved_bytes"][-1] // MiB) for k, v in data["knobs"].items()}
    assert final == {"max_split_size_mb": (310, 190, 180), "roundup_power2_divisions": (148, 40, 40),
                     "garbage_collection_threshold": (340, 40, 300)}
    assert data["knobs"]["roundup_power2_divisions"]["setting"] == "roundup_power2_divisions:4"


def test_knobs_skip_a_setting_this_torch_lacks(fake_gpu, monkeypatch):
    monkeypatch.setitem(allocator.KNOBS, "large_segment_size_mb", {
        "setting": {"large_segment_size_mb": 40}, "workload": "a 3 MiB tensor", "ops": [("alloc", "a", 3 * MiB)]})
    monkeypatch.setattr(alloc_conf, "torch_version", lambda: (2, 6))
    k = allocator.knobs()["knobs"]["large_segment_size_mb"]
    assert k["knob"] is None and "needs torch >= 2.10" in k["unsupported"]
    assert "not supported" in " ".join(t.get_text().replace("\n", " ") for ax in allocator.plot_knobs(
        result("alloc.knobs", {"cap_bytes": 384 * MiB, "knobs": {"large_segment_size_mb": k}})).axes for t in ax.texts)


def test_graph_pool_claims():
    holds, m = allocator._claim_order_matters(graph_data(574, 194))
    assert holds and m["ratio"] == pytest.approx(574 / 194)
    assert not allocator._claim_order_matters(graph_data(250, 194))[0]
    holds, m = allocator._claim_expandable_order_free(graph_data(202, 204, True))
    assert holds and m["relative difference"] == pytest.approx(2 / 204)
    assert not allocator._claim_expandable_order_free(graph_data(240, 202, True))[0]


def test_explain_setting_error(monkeypatch):
    assert allocator.explain_setting_error({"expandable_segments": True}) is None
    assert "must be > 20" in allocator.explain_setting_error({"max_split_size_mb": 8})
    monkeypatch.setattr(alloc_conf, "torch_version", lambda: (2, 4))
    assert "needs torch >= 2.10" in allocator.explain_setting_error({"large_segment_size_mb": 40})


# --------------------------------------------------------------------------- figures and tables

def bars(ax):
    return [p for p in ax.patches if isinstance(p, Rectangle)]


def test_figures_have_the_expected_artists(fake_gpu):
    table = result("alloc.request_table", allocator.request_table())
    fig = allocator.plot_request_table(table)
    assert isinstance(fig, Figure) and len(bars(fig.axes[0])) == 2 * len(allocator.PROBE_SIZES)
    assert any("Recorded on NVIDIA H200" in t.get_text() for t in fig.texts)

    fig = allocator.plot_anatomy(result("alloc.anatomy", allocator.anatomy(100 * MiB + 3, 3), size_bytes=104857603.0))
    assert len(bars(fig.axes[0])) == 6 and "model predicts exactly" in fig._suptitle.get_text()

    tl = result("alloc.timeline", allocator.timeline(16, False), small_mib=16)
    fig = allocator.plot_timeline(tl)
    assert len(fig.axes) == 2
    labels = [line.get_label() for line in fig.axes[0].lines if not line.get_label().startswith("_")]
    assert labels == ["allocated", "reserved", "reserved, model"]
    assert "256 MiB reserved" in fig.axes[0].get_title() and "128 MiB reserved" in fig.axes[1].get_title()

    oom = result("alloc.fragmentation_oom", allocator.fragmentation_oom(False))
    fig = allocator.plot_fragmentation_oom(oom, pattern="interleave")
    assert len(bars(fig.axes[0])) == 22 and len(bars(fig.axes[1])) == 6
    assert [t.get_text() for t in fig.axes[1].texts] == ["OOM", "OOM", "fits"]
    with pytest.raises(ValueError, match="pattern must be one of"):
        allocator.plot_fragmentation_oom(oom, pattern="scatter")

    fig = allocator.plot_graph_pools([result("alloc.graph_pools", graph_data(574, 194), expandable=False),
                                      result("alloc.graph_pools", graph_data(202, 202, True), expandable=True)])
    assert len(fig.axes[0].lines) == 4 and len(bars(fig.axes[1])) == 4
    assert [t.get_text() for t in fig.axes[1].texts] == ["574", "194", "202", "202"]

    fig = allocator.plot_pool_boundary(result("alloc.pool_boundary", allocator.pool_boundary(False)))
    assert any(line.get_xdata()[0] == 1.0 for line in fig.axes[0].lines)   # the 1 MiB line
    assert "4 → 24 MiB" in fig._suptitle.get_text()

    fig = allocator.plot_knobs(result("alloc.knobs", allocator.knobs()))
    assert len(fig.axes) == 3 and all(len(bars(ax)) == 3 for ax in fig.axes)
    assert [ax.get_title() for ax in fig.axes][0] == "max_split_size_mb:64"


def test_tables_render_as_text_and_html(fake_gpu):
    oom = result("alloc.fragmentation_oom", allocator.fragmentation_oom(False))
    t = allocator.oom_table(oom)
    assert len(t) == 3 and "out of memory" in str(t) and "<table>" in t._repr_html_()
    figs = allocator.oom_figures_table(oom, "interleave")
    assert "reserved by PyTorch but unallocated (cached)" in str(figs) and "176.00 MiB" in str(figs)
    assert "fitted" in str(allocator.oom_figures_table(oom, "grouped"))
    rt = allocator.request_table_html(result("alloc.request_table", allocator.request_table()))
    assert len(rt) == 19 and "12 MiB (1 MiB unsplit)" in str(rt)
    assert "max_split_size_mb:64" in str(allocator.knobs_table(result("alloc.knobs", allocator.knobs())))


def test_plot_segments_of_an_own_snapshot():
    fig = allocator.plot_segments(parse_segments(SNAPSHOT, device=0), title="mine")
    assert len(bars(fig.axes[0])) == 4 and any(t.get_text() == "your snapshot" for t in fig.texts)
    assert isinstance(allocator.plot_segments([]), Figure)


# --------------------------------------------------------------------------- exercises

def test_check_timeline_prediction(fake_gpu):
    assert allocator.check_timeline_prediction(None, 64).correct is None
    assert allocator.check_timeline_prediction(80, 64).correct is True
    fb = allocator.check_timeline_prediction(128, 80)
    assert fb.correct is False and "20 MiB segments" in fb.message and "16 MiB, not 20" in fb.message
    measured = result("alloc.timeline", allocator.timeline(8, False), small_mib=8)
    fb = allocator.check_timeline_prediction(80, 64, result=measured)
    assert fb.correct and "the run recorded on NVIDIA H200" in fb.message
    with pytest.raises(ValueError, match="small_mib=8"):
        allocator.check_timeline_prediction(80, 64, result=result("alloc.timeline", allocator.timeline(16, False)))


def test_check_reserved_function():
    assert allocator.check_reserved_function(None).correct is None
    assert allocator.check_reserved_function(lambda k, s: 20 * math.ceil(k * s / 20)).correct
    fb = allocator.check_reserved_function(lambda k, s: k * s)
    assert not fb.correct and "pages are mapped whole" in fb.message
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


def test_check_oom_reading(fake_gpu):
    measured = result("alloc.fragmentation_oom", allocator.fragmentation_oom(False))
    assert allocator.check_oom_reading(None, "group").correct is None
    assert allocator.check_oom_reading(176, "group", result=measured).correct
    fb = allocator.check_oom_reading(240, "expandable_segments", result=measured)
    assert not fb.correct and "includes the request" in fb.message and "fails too" in fb.message
    assert "released every whole free segment" in allocator.check_oom_reading(176, "empty_cache", result=measured).message
    assert not allocator.check_oom_reading(176, "max_split_size_mb:64", result=measured).correct


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


# --------------------------------------------------------------------------- recorded mode with a stand-in recording

@pytest.fixture
def stand_in_recording(fake_gpu, tmp_path, monkeypatch):
    """Every chapter-1 grid point produced by the model, saved like `record` saves it."""
    for exp in registry.all_experiments(1):
        points = []
        for pt in exp.grid:
            data = graph_data(574, 194) if exp.id == "alloc.graph_pools" else exp.func(**pt)
            points.append(store.RecordedPoint(pt, store.to_jsonable(data), 0.1))
        store.save(exp.id, 1, PROV, points, data_schema=exp.data_schema, root=tmp_path)
    monkeypatch.setenv("CUDA_MEMLAB_RECORDED_DIR", str(tmp_path))
    monkeypatch.setenv("CUDA_MEMLAB_MODE", "recorded")
    return tmp_path


def test_panels_build_in_recorded_mode(stand_in_recording):
    from experiments import panel

    for exp_id, render in [("alloc.anatomy", allocator.plot_anatomy), ("alloc.timeline", allocator.plot_timeline),
                           ("alloc.pool_boundary", allocator.plot_pool_boundary),
                           ("alloc.fragmentation_oom", allocator.plot_fragmentation_oom)]:
        controls = panel(exp_id, render).children[1].children
        assert [c.description.split(" ")[0] for c in controls] == [p.name for p in registry.get(exp_id).params]
    sizes = panel("alloc.anatomy", allocator.plot_anatomy).children[1].children[0]
    assert list(sizes.options) == sorted(allocator.ANATOMY_SIZES)


def test_claims_table_with_a_stand_in_recording(stand_in_recording):
    table = claims.claims_table(chapter=1)
    assert [r.id for r in table] == ["alloc.rounding", "alloc.fragmentation_oom", "alloc.order_matters",
                                     "alloc.expandable_order_free", "alloc.pool_boundary"]
    verdicts = {r.id: r.holds for r in table}
    assert verdicts["alloc.expandable_order_free"] is False   # the stand-in graph data has no expandable effect
    assert all(v for k, v in verdicts.items() if k != "alloc.expandable_order_free")


# --------------------------------------------------------------------------- the lab recording (after `record`)

RECORDED_POINTS = [(e.id, pt) for e in registry.all_experiments(1) for pt in e.grid]


@pytest.mark.parametrize("exp_id, point", RECORDED_POINTS, ids=[f"{e}-{store.params_key(p)}" for e, p in RECORDED_POINTS])
def test_lab_recording_renders(exp_id, point, monkeypatch):
    monkeypatch.delenv("CUDA_MEMLAB_RECORDED_DIR", raising=False)
    r = registry.run(exp_id, mode="recorded", **point)
    assert r.provenance.gpu_name == "NVIDIA H200"
    plot = {"alloc.request_table": allocator.plot_request_table, "alloc.anatomy": allocator.plot_anatomy,
            "alloc.timeline": allocator.plot_timeline, "alloc.fragmentation_oom": allocator.plot_fragmentation_oom,
            "alloc.graph_pools": allocator.plot_graph_pools, "alloc.pool_boundary": allocator.plot_pool_boundary,
            "alloc.knobs": allocator.plot_knobs}[exp_id]
    fig = plot(r)
    assert isinstance(fig, Figure) and any("Recorded on NVIDIA H200" in t.get_text() for t in fig.texts)


def _lab(exp_id, **params):
    import os

    os.environ.pop("CUDA_MEMLAB_RECORDED_DIR", None)
    return registry.run(exp_id, mode="recorded", **params).data


def test_lab_recording_agrees_with_the_model():
    """The model predicts every recorded allocator number (streams, graphs and drivers aside)."""
    for p in _lab("alloc.request_table")["probes"]:
        assert (p["block_bytes"], p["segment_bytes"], p["pool"]) == (
            p["predicted"]["block_bytes"], p["predicted"]["segment_bytes"], p["predicted"]["pool"]), p["request_bytes"]
    for small_mib in (8, 16):
        for expandable in (False, True):
            for order, o in _lab("alloc.timeline", small_mib=small_mib, expandable=expandable)["orders"].items():
                assert o["reserved_bytes"] == o["predicted_reserved_bytes"], (small_mib, expandable, order)
    for expandable in (False, True):
        for name, p in _lab("alloc.fragmentation_oom", expandable=expandable)["patterns"].items():
            assert p["oom"] == p["predicted_oom"], (expandable, name)
        sw = _lab("alloc.pool_boundary", expandable=expandable)["sweep"]
        assert sw["reserved_bytes"] == sw["predicted_reserved_bytes"], expandable
    for name, k in _lab("alloc.knobs")["knobs"].items():
        assert k["default"]["reserved_bytes"] == k["predicted"]["default"], name
        assert k["knob"]["reserved_bytes"] == k["predicted"]["knob"], name


def test_lab_recording_satisfies_every_claim():
    for c in claims.all_claims(chapter=1):
        r = claims.evaluate(c, mode="recorded")
        assert r.holds is True, f"{c.id}: {r.error or claims.format_measured(r.measured)}"
