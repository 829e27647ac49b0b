"""Chapter 3 (pinned memory): helpers, models, claims, figures and exercise checks on the CPU;
the experiments themselves, their claims and the loader check live on a GPU (``-m gpu``)."""
from __future__ import annotations

import math
import re
import types
from pathlib import Path

import jsonschema
import pytest
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

import experiments as ex
from experiments.core import claims, registry

from experiments import pinned
from experiments.pinned import measurements as pinned_meas, model as sup
from experiments.core.device import Provenance
from experiments.core.registry import Result

from .test_device import PROV
from .booktools import hidden_output_cells

ROOT = Path(__file__).resolve().parent.parent

MiB, KiB, GiB = 2**20, 2**10, 2**30
CLAIM_IDS = ["pinned.bandwidth", "pinned.async_returns", "pinned.overwrite_race", "pinned.del_is_safe",
             "pinned.pow2_rounding", "pinned.graph_reads_captured_address"]


def option_values(control):
    """The values a widget offers (its options may be (label, value) pairs)."""
    return [o[1] if isinstance(o, tuple) else o for o in control.options]


# ================================================================ stand-in data
# Dicts shaped like each experiment's output, with round made-up values. They are passed to
# claim predicates, figures and summaries at the function boundary, to test both branches of
# a predicate and how a figure is assembled; nothing here is written as a recording. What the
# lab GPU measured is tested against experiments/recorded/ at the end of this file.

def _st(m, spread=0.05):
    return {"median": m, "p10": m * (1 - spread), "p90": m * (1 + spread), "n": 5}


def bandwidth_data(direction="htod", pageable_peak=10.0, pinned_peak=50.0, link=True):
    sizes = list(pinned.BANDWIDTH_SIZES)
    # bandwidth saturates with size: launch overhead dominates small copies
    pg = [pageable_peak * s / (s + 2 * MiB) for s in sizes]
    pn = [pinned_peak * s / (s + 0.25 * MiB) for s in sizes]
    return {"direction": direction, "sizes_bytes": sizes, "pageable_gbps": pg, "pinned_gbps": pn,
            "pageable_ms": [_st(s / (g * 1e9) * 1e3) for s, g in zip(sizes, pg)],
            "pinned_ms": [_st(s / (g * 1e9) * 1e3) for s, g in zip(sizes, pn)],
            "link": {"kind": "PCIe", "gen": 5, "width": 16, "peak_gbps": 63.0} if link else None}


def async_data(pageable_nb_ms=37.6, pinned_nb_ms=0.06, queued=30.0):
    rows = []
    for host, nb in pinned.ASYNC_VARIANTS:
        blocked = {("pageable", True): pageable_nb_ms, ("pageable", False): 31.0, ("pinned", True): pinned_nb_ms,
                   ("pinned", False): 30.4}[(host, nb)]
        rows.append({"host": host, "non_blocking": nb, "host_blocked_ms": _st(blocked), "queued_gpu_ms": queued,
                     "copy_gpu_ms": 1.3 if host == "pinned" else 7.5})
    return {"variants": rows, "work_ms": queued}


def race_data(n=4 * MiB, race_wrong=4 * MiB, overwrite_after_ms=0.0):
    if overwrite_after_ms > 30.0:  # the write comes after the copy ran
        race_wrong = 0
    wrong = {"race": race_wrong, "pageable": 0, "synchronize": 0, "event": 0, "fresh_buffer": 0}
    cost = {"race": 0.05, "pageable": 31.0, "synchronize": 60.5, "event": 30.3, "fresh_buffer": 0.08}
    return {"n_elements": n, "work_ms": 30.0, "strategies": [
        {"name": s, "label": pinned.RACE_LABELS[s], "wrong_elements": [wrong[s]] * 3, "host_blocked_ms": _st(cost[s])}
        for s in pinned.RACE_STRATEGIES]}


def del_data(wrong=0, pending=True, reused_pending=False, reused_after=True, emptied="torch._C._host_emptyCache()"):
    return {"n_elements": 4 * MiB, "wrong_elements": wrong, "copy_pending_at_realloc": pending,
            "reused_while_pending": reused_pending, "reused_after_completion": reused_after,
            "cache_emptied_first": emptied, "gpu": {"sleep_end_ms": 50.1, "copy_end_ms": 50.45},
            "host": {"copy_call_ms": 0.07, "realloc_ms": 5.6, "fill_ms": 7.9, "sync_ms": 50.6,
                     "realloc_after_ms": 50.65}}


def pow2_data(owned=None):
    reqs = list(pinned.POW2_REQUESTS)
    exp = [sup.next_pow2(r) for r in reqs]
    return {"requests_bytes": reqs, "owned_bytes": list(owned or exp), "new_blocks": [1] * len(reqs),
            "expected_bytes": exp, "stats_naming": "owned=allocated_bytes"}


def lifecycle_data(unit_mib=1):
    model = sup.simulate_lifecycle(unit_bytes=unit_mib * MiB)
    return {"steps": [sup.step_label(s, unit_mib) for s in sup.LIFECYCLE_STEPS],
            "owned_bytes": [m["owned_bytes"] for m in model], "num_host_alloc": [m["num_host_alloc"] for m in model],
            "num_host_free": [m["num_host_free"] for m in model],
            "step_ms": [1.0, 1.0, 2.0, 0.01, 0.8, 0.05, 0.01, 0.02, 1.5],
            "model_owned_bytes": [m["owned_bytes"] for m in model],
            "model_num_host_alloc": [m["num_host_alloc"] for m in model],
            "empty_host_cache_call": "torch._C._host_emptyCache()", "stats_naming": "owned=allocated_bytes"}


def pin_cost_data():
    sizes = [s * MiB for s in pinned.PIN_SIZES_MIB]
    return {"sizes_bytes": sizes, "fresh_ms": [_st(0.35 * s / MiB + 0.6) for s in sizes],
            "cached_ms": [_st(0.05) for _ in sizes], "pin_memory_ms": [_st(0.1 * s / MiB + 0.05) for s in sizes],
            "fresh_ms_per_mib": 0.35}


def graph_data(n=MiB // 4, in_place=None, old=None, new=0):
    return {"n_elements": n, "after_capture_equal": n,
            "in_place": {"value": 3.0, "device_equal": n if in_place is None else in_place},
            "rebound": {"new_value": 7.0, "device_equal_new": new, "device_equal_old": n if old is None else old},
            "staging": [{"value": v, "min": v, "max": v} for v in pinned.STAGING_VALUES],
            "pageable_capture_error": "Cannot copy between CPU and CUDA tensors during CUDA graph capture unless "
                                      "the CPU tensor is pinned.",
            "host_private_pools": True}


def ring_data(buffers=2, compute="bursty"):
    safe = {1: 5.6, 2: 3.9, 3: 3.3, 4: 3.2}[buffers] if compute == "bursty" else {1: 3.5}.get(buffers, 3.1)
    return {"with_events": {"ms_per_batch": safe, "wrong_batches": 0, "stall_wrong_batches": 0, "host_wait_ms": 40.0,
                            "total_ms": 32 * safe},
            "no_wait": {"ms_per_batch": 3.1, "wrong_batches": 3, "stall_wrong_batches": 2 * buffers,
                        "host_wait_ms": 0.0, "total_ms": 32 * 3.1},
            "host_fill_ms": 0.6, "copy_ms": 0.17, "mean_compute_ms": 3.0, "stall_ms": 2 * buffers * 2.6 + 20}


BUILDERS = {
    "pinned.bandwidth": bandwidth_data, "pinned.async_copy": async_data, "pinned.overwrite_race": race_data,
    "pinned.del_is_safe": del_data, "pinned.pow2_rounding": pow2_data, "pinned.lifecycle": lifecycle_data,
    "pinned.pin_cost": pin_cost_data, "pinned.graph_replay": graph_data, "pinned.double_buffer": ring_data,
}


def result(exp_id, data=None, **params):
    exp = registry.get(exp_id)
    return Result(exp_id, exp.complete(params), data if data is not None else BUILDERS[exp_id](),
                  Provenance.from_dict(PROV), "recorded", 1.0)


def _bars(ax):
    return [p for p in ax.patches if isinstance(p, Rectangle)]


def _footer(fig):
    return " ".join(t.get_text() for t in fig.texts)


# ================================================================ registry and parameters

def test_every_experiment_of_the_chapter_is_registered_with_a_sane_grid():
    exps = {e.id: e for e in registry.all_experiments(3)}
    assert set(exps) == set(BUILDERS)
    assert all(e.chapter == 3 and e.doc for e in exps.values())
    for e in exps.values():
        assert e.defaults in [dict(pt) for pt in e.grid], f"{e.id}: default point not recorded"
    # the grid, not the parameter space, is what recording costs
    assert sum(len(e.grid) for e in exps.values()) <= 40


@pytest.mark.parametrize("exp_id", sorted(BUILDERS))
def test_stand_in_data_matches_the_experiments_schema(exp_id):
    jsonschema.validate(BUILDERS[exp_id](), registry.get(exp_id).data_schema)


@pytest.mark.parametrize("exp_id, params, match", [
    ("pinned.bandwidth", {"max_mib": 2048}, "max_mib must be one of 64, 256, 1024"),
    ("pinned.bandwidth", {"direction": "up"}, "direction must be one of 'htod', 'dtoh'"),
    ("pinned.async_copy", {"size_kib": -64}, "size_kib must be one of"),
    ("pinned.overwrite_race", {"overwrite_after_ms": 5.0}, "overwrite_after_ms must be one of"),
    ("pinned.double_buffer", {"buffers": 0}, r"buffers must be an integer in \[1, 4\]"),
    ("pinned.double_buffer", {"buffers": 9}, r"buffers must be an integer in \[1, 4\]"),
    ("pinned.double_buffer", {"compute": "random"}, "compute must be one of 'steady', 'bursty'"),
    ("pinned.pin_cost", {"repeats": 0}, r"repeats must be an integer in \[1, 10\]"),
    ("pinned.graph_replay", {"size": 1}, "has no parameter 'size'"),
])
def test_bad_parameters_are_rejected_before_any_gpu_work(exp_id, params, match):
    with pytest.raises(ValueError, match=match):
        registry.run(exp_id, mode="live", **params)


def test_compute_schedule_keeps_the_mean_and_rejects_unknown_patterns():
    steady = pinned.compute_schedule("steady", 3.0, 32)
    bursty = pinned.compute_schedule("bursty", 3.0, 32)
    assert steady == [3.0] * 32
    assert bursty[:4] == [12.0, 0.0, 0.0, 0.0]
    assert sum(bursty) == pytest.approx(sum(steady))
    with pytest.raises(ValueError, match="pattern must be"):
        pinned.compute_schedule("random", 3.0, 8)
    with pytest.raises(ValueError, match=">= 0"):
        pinned.compute_schedule("steady", -1.0, 8)


# ================================================================ host memory, sizes, link

MEMINFO = """MemTotal:       131072000 kB
MemFree:         1000000 kB
MemAvailable:   12000000 kB
HugePages_Total:       0
Bogus line
"""


def test_meminfo_is_parsed_to_bytes(tmp_path):
    info = sup.parse_meminfo(MEMINFO)
    assert info["MemAvailable"] == 12_000_000 * 1024
    assert info["HugePages_Total"] == 0
    assert "Bogus line" not in info
    f = tmp_path / "meminfo"
    f.write_text(MEMINFO)
    assert sup.host_available_bytes(f) == 12_000_000 * 1024
    assert sup.host_available_bytes(tmp_path / "missing") is None


def test_host_fit_check_names_the_parameter_and_the_limit():
    sup.check_host_fits("max_mib", 2 * GiB, available=8 * GiB)
    with pytest.raises(ValueError, match=r"max_mib needs 5120 MiB of host memory.*8192 MiB available.*4096 MiB"):
        sup.check_host_fits("max_mib", 5 * GiB, available=8 * GiB)
    with pytest.raises(ValueError, match="non-negative"):
        sup.check_host_fits("size_mib", -1, available=8 * GiB)


def test_host_fit_check_reads_meminfo_and_cannot_check_without_it(monkeypatch):
    monkeypatch.setattr(sup, "host_available_bytes", lambda: 4 * GiB)
    with pytest.raises(ValueError, match="batch_mib needs 3072 MiB"):
        sup.check_host_fits("batch_mib", 3 * GiB)
    monkeypatch.setattr(sup, "host_available_bytes", lambda: None)
    sup.check_host_fits("batch_mib", 10**15)  # no /proc/meminfo (macOS, Windows): nothing to check against


@pytest.mark.parametrize("n, block", [(0, 0), (1, 1), (1000, 1024), (4096, 4096), (5000, 8192), (MiB + 1, 2 * MiB),
                                      (100 * MiB, 128 * MiB), (135_790_592, 256 * MiB), (2_233_382_994, 4 * GiB)])
def test_requests_round_up_to_the_next_power_of_two(n, block):
    assert sup.next_pow2(n) == block


def test_next_pow2_rejects_nonsense():
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError):
            sup.next_pow2(bad)


def test_pcie_peak_per_generation_and_width():
    assert sup.pcie_peak_gbps(5, 16) == 63.0
    assert sup.pcie_peak_gbps(3, 16) == 15.8
    assert sup.pcie_peak_gbps(4, 8) == 15.8
    with pytest.raises(ValueError, match="gen must be one of"):
        sup.pcie_peak_gbps(7, 16)
    with pytest.raises(ValueError, match="width must be"):
        sup.pcie_peak_gbps(5, 12)


# ================================================================ torch-version differences

def _fake_torch(public=False, private=False, stats=None, version="2.11.0"):
    calls = []
    accelerator = types.SimpleNamespace(**({"empty_host_cache": lambda: calls.append("public")} if public else {}))
    c = types.SimpleNamespace(**({"_host_emptyCache": lambda: calls.append("private")} if private else {}))
    cuda = types.SimpleNamespace(**({"host_memory_stats": lambda: dict(stats)} if stats is not None else {}))
    return types.SimpleNamespace(accelerator=accelerator, _C=c, cuda=cuda, __version__=version), calls


def test_the_public_host_cache_call_wins_over_the_private_one():
    fake, calls = _fake_torch(public=True, private=True, version="2.12.0")
    found = sup.find_empty_host_cache(fake)
    assert found.name == "torch.accelerator.empty_host_cache()" and "2.12" in found.note
    assert sup.empty_host_cache(fake) == "torch.accelerator.empty_host_cache()"
    assert calls == ["public"]


def test_the_private_host_cache_call_is_used_on_2_11():
    fake, calls = _fake_torch(private=True)
    assert sup.empty_host_cache(fake) == "torch._C._host_emptyCache()"
    assert calls == ["private"]


def test_no_host_cache_call_is_explained_not_crashed():
    fake, _ = _fake_torch(version="2.4.1")
    found = sup.find_empty_host_cache(fake)
    assert found.call is None and "2.4.1" in found.note and "2.5" in found.note and "2.12" in found.note
    with pytest.raises(RuntimeError, match="cached pinned blocks stay until the process exits"):
        sup.empty_host_cache(fake)


def test_owned_bytes_reads_both_stat_namings():
    new = {"allocations.current": 2, "allocated_bytes.current": 12 * MiB, "active_bytes.current": 4 * MiB,
           "num_host_alloc": 2, "num_host_free": 0}
    old = {"allocation.current": 1, "segment.current": 2, "allocated_bytes.current": 4 * MiB,
           "reserved_bytes.current": 12 * MiB, "num_host_alloc": 2, "num_host_free": 0}
    assert sup.stats_naming(new) == "owned=allocated_bytes" and sup.owned_bytes(new) == 12 * MiB
    assert sup.stats_naming(old) == "owned=reserved_bytes" and sup.owned_bytes(old) == 12 * MiB
    with pytest.raises(KeyError):
        sup.owned_bytes({"num_host_alloc": 0})
    fake, _ = _fake_torch(stats=new)
    assert sup.host_stats(fake) == new
    assert sup.host_stats(_fake_torch()[0]) is None


def test_features_follow_the_torch_version():
    fake, _ = _fake_torch(private=True, stats={})
    old = {f.name: f for f in sup.pinned_features((2, 4), fake)}
    new = {f.name: f for f in sup.pinned_features((2, 14), fake)}
    key = "PYTORCH_CUDA_ALLOC_CONF=pinned_max_round_threshold_mb"
    # added in 2.13 (a string in 2.13.0's libc10.so, absent from 2.12.0's)
    assert not old[key].available and "2.13" in old[key].note
    assert new[key].available
    assert not old["host private pools for CUDA graphs"].available
    assert new["host private pools for CUDA graphs"].available
    assert not new["trustworthy active_bytes / active_requests counters"].available
    text = sup.features_text((2, 11), fake)
    assert text.startswith("torch 2.11:") and "[yes] empty the pinned host cache: torch._C._host_emptyCache()" in text


# ================================================================ the host cache model

def test_model_reproduces_the_lifecycle_script():
    steps = sup.simulate_lifecycle(unit_bytes=MiB)
    assert [s["owned_bytes"] // MiB for s in steps] == [4, 8, 16, 16, 18, 18, 18, 18, 0]
    assert [s["num_host_alloc"] for s in steps] == [1, 2, 3, 3, 4, 4, 4, 4, 4]
    assert steps[-1]["num_host_free"] == 4


def test_model_best_fit_mode_shows_how_torch_2_4_differed():
    old = sup.simulate_lifecycle(unit_bytes=MiB, exact_buckets=False)
    # d's 2 MiB request takes a's cached 4 MiB block, so e needs a new block
    assert [s["owned_bytes"] // MiB for s in old][3:6] == [16, 16, 20]


def test_model_rejects_bad_steps():
    m = sup.HostCacheModel()
    m.pin("a", 3 * MiB)
    with pytest.raises(ValueError, match="already allocated"):
        m.pin("a", MiB)
    with pytest.raises(ValueError, match="> 0"):
        m.pin("b", 0)
    with pytest.raises(KeyError):
        m.free("zzz")
    with pytest.raises(ValueError, match="unknown lifecycle step"):
        sup.simulate_lifecycle([("pin", "a", 1), ("explode",)])


def test_step_labels():
    assert [sup.step_label(s, 64) for s in sup.LIFECYCLE_STEPS[:4]] == [
        "a = pin 192 MiB", "b = pin 192 MiB", "c = pin 320 MiB", "del a"]
    assert sup.step_label(("empty_device",)) == "torch.cuda.empty_cache()"


# ================================================================ claims

def test_the_chapter_registers_exactly_the_issues_claims():
    assert [c.id for c in claims.all_claims(3)] == CLAIM_IDS
    for c in claims.all_claims(3):
        exp = registry.get(c.experiment)
        exp.complete(c.params)  # the claim's point is a valid point ...
        assert exp.complete(c.params) in [dict(pt) for pt in exp.grid], f"{c.id}: its point is not in the grid"
        assert c.source.startswith("https://docs.pytorch.org/devlogs/eager/2026-08-09-pinned-memory-allocator")


def _holds(claim_id, data):
    holds, measured = claims.get_claim(claim_id).predicate(data)
    assert measured
    return holds


def test_bandwidth_claim():
    assert _holds("pinned.bandwidth", bandwidth_data(pageable_peak=10.0, pinned_peak=50.0))
    assert not _holds("pinned.bandwidth", bandwidth_data(pageable_peak=40.0, pinned_peak=50.0))
    small = bandwidth_data()
    keep = [i for i, s in enumerate(small["sizes_bytes"]) if s < 256 * MiB]
    for k in ("sizes_bytes", "pageable_gbps", "pinned_gbps"):
        small[k] = [small[k][i] for i in keep]
    holds, measured = claims.get_claim("pinned.bandwidth").predicate(small)
    assert not holds and "256 MiB" in measured["note"]


def test_async_claim():
    assert _holds("pinned.async_returns", async_data())
    assert not _holds("pinned.async_returns", async_data(pinned_nb_ms=5.0))   # 5 ms of 30 is not < 10 %
    assert not _holds("pinned.async_returns", async_data(pageable_nb_ms=0.2))  # a staged small pageable copy


def test_overwrite_claim():
    assert _holds("pinned.overwrite_race", race_data())
    assert not _holds("pinned.overwrite_race", race_data(race_wrong=0))


def test_del_claim():
    assert _holds("pinned.del_is_safe", del_data())
    assert not _holds("pinned.del_is_safe", del_data(wrong=12))
    assert not _holds("pinned.del_is_safe", del_data(reused_pending=True))
    assert not _holds("pinned.del_is_safe", del_data(pending=False)), "a copy that already ran proves nothing"
    assert not _holds("pinned.del_is_safe", del_data(reused_after=False))
    assert _holds("pinned.del_is_safe", del_data(reused_after=False, emptied=None))


def test_pow2_claim():
    assert _holds("pinned.pow2_rounding", pow2_data())
    exact = pow2_data(owned=list(pinned.POW2_REQUESTS))
    assert not _holds("pinned.pow2_rounding", exact)
    cached = pow2_data()
    cached["new_blocks"] = [0] * len(cached["new_blocks"])
    assert not _holds("pinned.pow2_rounding", cached), "no fresh block, no evidence"


def test_graph_claim():
    assert _holds("pinned.graph_reads_captured_address", graph_data())
    assert not _holds("pinned.graph_reads_captured_address", graph_data(in_place=0))
    assert not _holds("pinned.graph_reads_captured_address", graph_data(old=0, new=MiB // 4))


# ================================================================ figures

def test_bandwidth_figure_has_both_lines_the_peak_and_provenance():
    fig = pinned.plot_bandwidth(result("pinned.bandwidth"))
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    labels = [line.get_label() for line in ax.get_lines()]
    assert "pageable (blocking copy)" in labels and "pinned (non_blocking=True)" in labels
    assert any(line.get_linestyle() == "--" for line in ax.get_lines()), "no peak line"
    assert "GB/s" in ax.get_ylabel()
    assert "Recorded on NVIDIA H200" in _footer(fig)
    no_link = pinned.plot_bandwidth(result("pinned.bandwidth", bandwidth_data(link=False)))
    assert not any(line.get_linestyle() == "--" for line in no_link.axes[0].get_lines())


def test_async_figure_has_one_bar_per_variant_and_the_queued_work():
    fig = pinned.plot_async_copy(result("pinned.async_copy"))
    ax = fig.axes[0]
    assert len(_bars(ax)) == 4
    assert "(ms)" in ax.get_ylabel()
    # the queued work is named in the legend (a label by its line would cross the bars)
    assert any("30.0 ms" in t.get_text() for t in ax.get_legend().get_texts())


def test_race_figure_shows_the_share_of_wrong_elements_and_the_cost():
    fig = pinned.plot_overwrite_race(result("pinned.overwrite_race"))
    ax1, ax2 = fig.axes
    assert len(_bars(ax1)) == len(pinned.RACE_STRATEGIES) == len(_bars(ax2))
    assert _bars(ax1)[0].get_width() == pytest.approx(100.0)
    assert all(b.get_width() == 0 for b in _bars(ax1)[1:])
    assert "(%)" in ax1.get_xlabel() and "(ms)" in ax2.get_xlabel()


def test_del_figure_is_a_timeline_with_the_two_allocations_marked():
    fig = pinned.plot_del_is_safe(result("pinned.del_is_safe"))
    ax = fig.axes[0]
    texts = " ".join(t.get_text() for t in ax.texts)
    assert "new address" in texts and "old address again" in texts
    assert [t.get_text() for t in ax.get_yticklabels()] == ["GPU stream", "host"]
    assert "0 wrong elements" in ax.get_title()


def test_pow2_figure_has_requested_and_owned_bars():
    fig = pinned.plot_pow2_rounding(result("pinned.pow2_rounding"))
    ax = fig.axes[0]
    assert len(_bars(ax)) == 2 * len(pinned.POW2_REQUESTS)
    assert any(t.get_text() == "x1.98" for t in ax.texts)  # 129.5 MiB -> 256 MiB


def test_lifecycle_figure_has_measured_and_model_lines():
    fig = pinned.plot_lifecycle(result("pinned.lifecycle"))
    ax = fig.axes[0]
    assert len(ax.get_lines()) == 2
    measured = ax.get_lines()[0].get_ydata()
    assert list(measured) == [4, 8, 16, 16, 18, 18, 18, 18, 0]
    assert [t.get_text() for t in ax.get_xticklabels()][-2:] == ["torch.cuda.empty_cache()", "empty host cache"]


def test_pin_cost_figure_is_log_log_with_three_series():
    fig = pinned.plot_pin_cost(result("pinned.pin_cost"))
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert len(ax.get_legend().get_texts()) == 3
    assert "0.35 ms per MiB" in ax.get_title()


def test_graph_figure_compares_the_python_name_with_the_replay():
    fig = pinned.plot_graph_replay(result("pinned.graph_replay"))
    ax1, ax2 = fig.axes
    bars = _bars(ax1)
    assert [b.get_height() for b in bars] == [1.0, 3.0, 7.0, 1.0, 3.0, 3.0]
    assert len(ax2.get_lines()) == 3


def test_ring_figures():
    fig = pinned.plot_double_buffer(result("pinned.double_buffer"))
    assert len(_bars(fig.axes[0])) == 2
    assert "wrong" in " ".join(t.get_text() for t in fig.axes[0].texts)
    runs = [result("pinned.double_buffer", ring_data(n, c), buffers=n, compute=c)
            for n in (1, 2, 3, 4) for c in ("steady", "bursty")]
    sweep = pinned.plot_ring_sweep(runs)
    lines = [line for line in sweep.axes[0].get_lines() if line.get_label().endswith("GPU work")]
    assert len(lines) == 2 and list(lines[0].get_xdata()) == [1, 2, 3, 4]
    bars = _bars(sweep.axes[1])  # bursty first: 4 timed-run bars, then the GPU-behind run stacked on them
    assert [b.get_height() for b in bars[:8]] == [3, 3, 3, 3, 2, 4, 6, 8]
    assert [b.get_y() for b in bars[4:8]] == [3, 3, 3, 3]
    assert len(sweep.axes[1].get_legend().get_texts()) == 4
    assert _footer(sweep).count("Recorded on") == 1
    with pytest.raises(ValueError, match="at least one"):
        pinned.plot_ring_sweep([])


# ================================================================ text summaries (the chapter quotes numbers through them)

def test_host_blocked_ms_reads_a_variant_from_a_result_or_its_data():
    r = result("pinned.async_copy")
    assert pinned.host_blocked_ms(r, "pageable", True) == pytest.approx(37.6)
    assert pinned.host_blocked_ms(r.data, "pinned", True) == pytest.approx(0.06)
    with pytest.raises(KeyError, match="no variant"):
        pinned.host_blocked_ms({"variants": []}, "pinned", True)


def test_bandwidth_summary_quotes_both_ends_and_the_link():
    d = bandwidth_data(pageable_peak=10.0, pinned_peak=50.0)
    text = pinned.bandwidth_summary(result("pinned.bandwidth", d))
    head, big, small, best = text.splitlines()
    ratio = d["pinned_gbps"][-1] / d["pageable_gbps"][-1]
    assert head == "host to device (HtoD):"
    assert big.strip().startswith("1 GiB: pinned") and big.endswith(f": {ratio:.1f}x")
    assert f"({d['pinned_gbps'][-1] / 63.0:.0%} of the link's 63 GB/s)" in big
    assert small.strip().startswith("4 KiB:")
    assert best.endswith("(1 GiB)")  # the stand-in pageable curve only rises
    assert all(len(line) <= 85 for line in text.splitlines()), "lines must fit the page"
    no_link = pinned.bandwidth_summary(result("pinned.bandwidth", bandwidth_data(link=False)))
    assert "link" not in no_link


def test_guard_costs_text_lists_the_cheapest_guard_first():
    lines = pinned.guard_costs_text(result("pinned.overwrite_race")).splitlines()
    assert lines[0].startswith("16 MiB, 30 ms of GPU work")
    body = lines[2:]
    assert [line.split("  ")[0] for line in body][:2] == ["pinned, no guard", "write a fresh pinned buffer"]
    assert body[0].split()[3] == "100%" and body[-1].startswith("torch.cuda.synchronize()")
    assert len(body) == len(pinned.RACE_STRATEGIES)


def test_race_timing_text_is_ordered_by_the_write_time():
    runs = [result("pinned.overwrite_race", race_data(overwrite_after_ms=a), overwrite_after_ms=a)
            for a in (60.0, 0.0)]
    lines = pinned.race_timing_text(runs).splitlines()
    assert "writes  0 ms" in lines[0] and lines[0].endswith(": 100% wrong")
    assert "writes 60 ms" in lines[1] and lines[1].endswith(":   0% wrong")
    assert all(len(line) <= 85 for line in lines), "lines must fit the page"


def test_del_summary_says_which_block_each_allocation_got():
    text = pinned.del_summary(result("pinned.del_is_safe"))
    assert "while the copy was pending: 5.53 ms, a different address" in text
    assert "after synchronize(): 0.05 ms, the dropped block's address" in text
    assert text.endswith("wrong elements on the device: 0")
    bad = pinned.del_summary(result("pinned.del_is_safe", del_data(pending=False, reused_pending=True)))
    assert "already done" in bad and "while the copy was already done: 5.53 ms, the dropped block's address" in bad


def test_pin_cost_summary_quotes_the_largest_size():
    text = pinned.pin_cost_summary(result("pinned.pin_cost"))
    fresh, repin, per_mib = text.splitlines()
    assert fresh == "1 GiB: fresh 359.0 ms, from the cache 50 µs (7,180x faster)"
    assert repin.startswith("1 GiB: pin_memory() of a pageable tensor 102.")
    assert per_mib.endswith("0.35 ms per MiB")


def test_ring_summary_has_a_column_per_ring_size():
    runs = [result("pinned.double_buffer", ring_data(n, c), buffers=n, compute=c)
            for n in (1, 2, 3, 4) for c in ("steady", "bursty")]
    lines = pinned.ring_summary(runs).splitlines()
    assert len(lines) == 13 and lines[0].startswith("bursty") and lines[6] == "" and lines[7].startswith("steady")
    assert lines[1].split()[-4:] == ["5.60", "3.90", "3.30", "3.20"]
    assert lines[3].split()[-4:] == ["3/32"] * 4
    assert lines[4].split()[-4:] == ["2/4", "4/6", "6/8", "8/10"]
    # The figure the prose points to ("the last line of each block says how close"): 5.6 / 3.2 and 3.5 / 3.1.
    assert lines[5] == "  safe, 1 buffer against 4: +75% time per batch"
    assert lines[12] == "  safe, 1 buffer against 4: +13% time per batch"


def test_features_text_wraps_for_the_page():
    fake, _ = _fake_torch(private=True, stats={})
    text = sup.features_text((2, 11), fake, width=70)
    assert all(len(line) <= 70 for line in text.splitlines())
    assert sum(line.lstrip().startswith("[") for line in text.splitlines()) == len(sup.pinned_features((2, 11), fake))


# ================================================================ exercises

def test_owned_prediction_check():
    assert pinned.check_owned_prediction(None, None).correct is None
    assert pinned.check_owned_prediction(18, 18).correct is True
    fb = pinned.check_owned_prediction(13, 18)
    assert fb.correct is False and "sum of the live requests" in fb.message
    fb = pinned.check_owned_prediction(18, 0)
    assert fb.correct is False and "*device* memory only" in fb.message
    assert pinned.check_owned_prediction(22, 18).correct is False
    assert pinned.check_owned_prediction("18", 18).correct is False
    assert pinned.check_owned_prediction([18], 18).correct is False


def test_owned_prediction_check_asks_once_for_what_is_missing():
    for after_e, after_empty in ((None, None), (18, None), (None, 18)):
        fb = pinned.check_owned_prediction(after_e, after_empty)
        assert fb.correct is None
        assert fb.message == ("Replace None with a number of MiB in after_e and in after_device_empty_cache, "
                              "then run the cell again.")


def test_overwrite_guard_check():
    assert pinned.check_overwrite_guard(None).correct is None
    assert pinned.check_overwrite_guard("c").correct is True
    assert "not the cheapest" in pinned.check_overwrite_guard("b").message
    assert pinned.check_overwrite_guard("d").correct is False
    assert pinned.check_overwrite_guard("z").correct is False
    assert pinned.check_overwrite_guard("C").correct is True
    for not_a_letter in (["c"], {"c": 1}, 3):
        fb = pinned.check_overwrite_guard(not_a_letter)
        assert fb.correct is False and "one letter" in fb.message
    assert set(pinned.OVERWRITE_OPTIONS) == {"a", "b", "c", "d", "e"}


def test_rounding_check():
    assert pinned.check_rounding(None).correct is None
    assert pinned.check_rounding(4).correct is True
    assert "That is the request" in pinned.check_rounding(2.08).message
    assert pinned.check_rounding(3).correct is False
    assert pinned.check_rounding("4").correct is False


def test_graph_replay_check():
    assert pinned.check_graph_replay(None).correct is None
    assert pinned.check_graph_replay(3.0).correct is True
    fb = pinned.check_graph_replay(7)
    assert fb.correct is False and "Python names" in fb.message
    assert pinned.check_graph_replay([3.0]).correct is False


def test_unanswered_messages_read_as_sentences():
    for fb in (pinned.check_owned_prediction(None, None), pinned.check_overwrite_guard(None),
               pinned.check_rounding(None), pinned.check_graph_replay(None), pinned.check_loader(None)):
        assert fb.correct is None
        assert fb.message.startswith("Replace None with ") and fb.message.endswith("then run the cell again.")
        assert fb.message.count("Replace None") == 1
        assert not re.search(r"your value for|in MiB in MiB|for value", fb.message), fb.message


def test_claims_show_readable_labels(lab_recordings):
    """The claims' measured figures are read by people: labels, not variable names."""
    for c in claims.all_claims(3):
        _, measured = c.predicate(registry.run(c.experiment, mode="recorded", **c.params).data)
        for key in measured:
            assert not re.search(r"\b[a-z]+_[a-z_]+\b", key), f"{c.id}: {key!r} looks like a variable"


def _report(**kw):
    base = {"n_batches": 8, "n_buffers": 2, "queued_ms": 200.0, "yielded": [8, 8], "wrong_batches": [[], []],
            "ahead_ms": 6.0, "problem": None}
    base.update(kw)
    return base


def test_judge_loader_accepts_intact_data_delivered_ahead_of_the_gpu():
    fb = pinned.judge_loader(_report())
    assert fb.correct is True and "6.0 ms" in fb.message


@pytest.mark.parametrize("kw, text", [
    ({"problem": "your loader raised ZeroDivisionError: boom"}, "ZeroDivisionError"),
    ({"yielded": [7, 8]}, "yielded 7 of the 8"),
    ({"wrong_batches": [[0, 1], []]}, "wait on that buffer's event"),
    ({"wrong_batches": [[], [3]]}, "make the current stream wait"),
    ({"ahead_ms": 201.0}, "waited for the GPU"),
    ({"ahead_ms": None}, "came never"),
])
def test_judge_loader_names_what_went_wrong(kw, text):
    fb = pinned.judge_loader(_report(**kw))
    assert fb.correct is False and text in fb.message


def test_check_loader_without_an_answer_or_a_gpu(monkeypatch):
    assert pinned.check_loader(None).correct is None
    assert pinned.check_loader(42).correct is False
    monkeypatch.setattr("experiments.pinned.checks.has_cuda", lambda: False)
    fb = pinned.check_loader(lambda batches, n: iter(batches))
    assert fb.correct is None and "GPU" in fb.message
    with pytest.raises(ValueError, match="n_buffers must be >= 2"):
        pinned.check_loader(lambda b, n: iter(b), n_buffers=1)


def test_results_the_next_paragraph_discusses_are_not_folded():
    """Issue 10: a result that the following paragraph discusses is shown, not folded
    (answers that only a solution discusses stay folded under "Show the answer")."""
    hidden = hidden_output_cells("ch3_pinned_memory.ipynb")
    for source in ("pinned.plot_lifecycle(life)",                                # ex 3.3
                   "pinned.plot_graph_replay(graph)",                            # ex 3.4
                   'ex.show_claim("pinned.graph_reads_captured_address")',
                   "pinned.plot_bandwidth(bw)", "pinned.plot_async_copy(cp)",    # the **Predict** prompts
                   "pinned.plot_overwrite_race(race)", "pinned.plot_ring_sweep(ring_runs)"):
        assert not any(source in h for h in hidden), f"the cell with {source!r} is folded"
    assert not any("pinned.check_" in h for h in hidden), "the check's own feedback stays visible"


# ================================================================ the lab's recordings (experiments/recorded/pinned.*)

@pytest.fixture
def lab_recordings(monkeypatch, recorded_mode):
    """Recorded mode, reading the lab's files in experiments/recorded/ (never a stand-in)."""
    monkeypatch.delenv("CUDA_MEMLAB_RECORDED_DIR", raising=False)
    return recorded_mode


def test_panels_offer_the_recorded_points(lab_recordings):
    import ipywidgets as w

    import experiments as ex

    box = ex.panel("pinned.double_buffer", pinned.plot_double_buffer, params=["buffers", "compute"])
    assert isinstance(box, w.VBox)
    controls = box.children[1].children
    assert option_values(controls[0]) == [1, 2, 3, 4]
    assert sorted(option_values(controls[1])) == ["bursty", "steady"]
    assert box.children[-1].outputs, "the default point is shown"
    box = ex.panel("pinned.async_copy", pinned.plot_async_copy, params=["size_kib", "direction"])
    assert [option_values(c) for c in box.children[1].children] == [[64, 2048, 65536], ["htod", "dtoh"]]  # the chapter's order of choices
    box = ex.panel("pinned.overwrite_race", pinned.plot_overwrite_race, params=["size_mib", "overwrite_after_ms"])
    assert [option_values(c) for c in box.children[1].children] == [[1, 16], [0.0, 10.0, 60.0]]
    assert box.children[-1].outputs
    box = ex.panel("pinned.bandwidth", pinned.plot_bandwidth, params=["direction"])
    assert sorted(option_values(box.children[1].children[0])) == ["dtoh", "htod"]


def test_claims_table_of_the_chapter_reads_the_lab_recordings(lab_recordings):
    table = claims.claims_table(chapter=3)
    assert [r.id for r in table] == CLAIM_IDS
    one = ex.show_claim("pinned.pow2_rounding")
    assert len(one) == 1 and "holds" in one._repr_html_() and "NVIDIA H200" in one._repr_html_()


# What the chapter's text says about the lab's run, and whether the host-cache model follows
# it: tests/test_recording_acceptance.py and tests/test_oracles.py.


# ================================================================ on the GPU

@pytest.mark.gpu
def test_gpu_bandwidth_pinned_beats_pageable(live_mode):
    d = registry.run("pinned.bandwidth", max_mib=256, repeats=3).data
    ok, measured = claims.get_claim("pinned.bandwidth").predicate(d)
    assert ok, f"pinned/pageable at >= 256 MiB: {measured}"
    assert d["pinned_gbps"][-1] > d["pinned_gbps"][0], "bandwidth should grow with copy size"
    if d["link"]:
        assert d["pinned_gbps"][-1] <= d["link"]["peak_gbps"] * 1.05, (d["pinned_gbps"][-1], d["link"])


@pytest.mark.gpu
@pytest.mark.parametrize("direction", ["htod", "dtoh"])
def test_gpu_pinned_non_blocking_returns_and_blocking_waits(live_mode, direction):
    d = registry.run("pinned.async_copy", size_kib=65536, direction=direction, repeats=3).data
    pin_nb = pinned_meas._variant(d, "pinned", True)
    pin_b = pinned_meas._variant(d, "pinned", False)
    q = pin_nb["queued_gpu_ms"]
    assert pin_nb["host_blocked_ms"]["median"] < 0.1 * q, f"pinned non_blocking blocked: {pin_nb}"
    assert pin_b["host_blocked_ms"]["median"] > 0.8 * q, f"pinned blocking did not wait: {pin_b}"
    page = pinned_meas._variant(d, "pageable", True)
    assert page["host_blocked_ms"]["median"] >= 0.5 * q, f"64 MiB pageable non_blocking returned early: {page}"
    if direction == "htod":
        ok, measured = claims.get_claim("pinned.async_returns").predicate(d)
        assert ok, measured


@pytest.mark.gpu
def test_gpu_overwrite_race_and_its_fixes(live_mode):
    d = registry.run("pinned.overwrite_race", size_mib=16).data
    ok, measured = claims.get_claim("pinned.overwrite_race").predicate(d)
    assert ok, f"no corruption without a guard: {measured}"
    rows = {r["name"]: r for r in d["strategies"]}
    for name in ("pageable", "synchronize", "event", "fresh_buffer"):
        assert max(rows[name]["wrong_elements"]) == 0, f"{name}: {rows[name]}"
    ev, sync = rows["event"]["host_blocked_ms"]["median"], rows["synchronize"]["host_blocked_ms"]["median"]
    assert ev < 0.75 * sync, f"the event should wait only for the copy: event {ev:.1f} ms, synchronize {sync:.1f} ms"
    assert rows["fresh_buffer"]["host_blocked_ms"]["median"] < 0.25 * ev, rows["fresh_buffer"]
    late = registry.run("pinned.overwrite_race", size_mib=16, overwrite_after_ms=60.0).data
    assert max(late["strategies"][0]["wrong_elements"]) == 0, late["strategies"][0]


@pytest.mark.gpu
@pytest.mark.parametrize("size_mib", [1, 16])
def test_gpu_del_is_safe(live_mode, size_mib):
    d = registry.run("pinned.del_is_safe", size_mib=size_mib).data
    ok, measured = claims.get_claim("pinned.del_is_safe").predicate(d)
    assert ok, f"{size_mib} MiB: {measured}; timeline {d['gpu']}, {d['host']}"


@pytest.mark.gpu
def test_gpu_pow2_rounding_and_lifecycle(live_mode):
    d = registry.run("pinned.pow2_rounding").data
    ok, measured = claims.get_claim("pinned.pow2_rounding").predicate(d)
    assert ok, f"owned {d['owned_bytes']} for requests {d['requests_bytes']} (new blocks {d['new_blocks']})"
    life = registry.run("pinned.lifecycle").data
    assert life["owned_bytes"] == life["model_owned_bytes"], list(zip(life["steps"], life["owned_bytes"]))
    assert life["num_host_free"][-2] == 0 and life["num_host_free"][-1] == 4, life["num_host_free"]


@pytest.mark.gpu
def test_gpu_pin_cost_fresh_is_much_slower_than_cached(live_mode):
    d = registry.run("pinned.pin_cost", max_mib=256, repeats=2).data
    fresh, cached = d["fresh_ms"][-1]["median"], d["cached_ms"][-1]["median"]
    assert fresh > 20 * cached, f"256 MiB: fresh {fresh:.2f} ms, cached {cached:.3f} ms"
    assert 0.01 < d["fresh_ms_per_mib"] < 5, d["fresh_ms_per_mib"]


@pytest.mark.gpu
def test_gpu_graph_replay(live_mode):
    d = registry.run("pinned.graph_replay").data
    ok, measured = claims.get_claim("pinned.graph_reads_captured_address").predicate(d)
    assert ok, measured
    assert d["after_capture_equal"] == d["n_elements"]
    assert all(s["min"] == s["max"] == s["value"] for s in d["staging"]), d["staging"]
    assert d["pageable_capture_error"] and "pinned" in d["pageable_capture_error"], d["pageable_capture_error"]


@pytest.mark.gpu
def test_gpu_ring_is_correct_with_events_and_races_without(live_mode):
    one = registry.run("pinned.double_buffer", buffers=1).data
    three = registry.run("pinned.double_buffer", buffers=3).data
    for d in (one, three):
        assert d["with_events"]["wrong_batches"] == d["with_events"]["stall_wrong_batches"] == 0, d["with_events"]
    for d in (one, three):  # the stall pass is sized so that an unguarded ring of any size wraps around
        assert d["no_wait"]["stall_wrong_batches"] > 0, f"an unguarded ring should race: {d['no_wait']}"
    assert three["with_events"]["ms_per_batch"] < 0.85 * one["with_events"]["ms_per_batch"], (
        f"bursty work: ring of 3 {three['with_events']['ms_per_batch']:.2f} ms/batch, "
        f"single buffer {one['with_events']['ms_per_batch']:.2f} ms/batch")


def _ring_loader(batches, n_buffers):
    import torch

    ring, ready = [], [None] * n_buffers
    for k, batch in enumerate(batches):
        slot = k % n_buffers
        if len(ring) <= slot:
            ring.append(torch.empty(batch.shape, dtype=batch.dtype, pin_memory=True))
        if ready[slot] is not None:
            ready[slot].synchronize()
        ring[slot].copy_(batch)
        out = ring[slot].to("cuda", non_blocking=True)
        ready[slot] = torch.cuda.Event()
        ready[slot].record()
        yield out


def _unguarded_loader(batches, n_buffers):
    import torch

    ring = None
    for batch in batches:
        if ring is None:
            ring = torch.empty(batch.shape, dtype=batch.dtype, pin_memory=True)
        ring.copy_(batch)
        yield ring.to("cuda", non_blocking=True)


def _blocking_loader(batches, n_buffers):
    for batch in batches:
        yield batch.to("cuda")


@pytest.mark.gpu
def test_gpu_loader_check_accepts_a_ring_and_rejects_the_usual_mistakes():
    good = pinned.check_loader(_ring_loader)
    assert good.correct is True, good.message
    racy = pinned.check_loader(_unguarded_loader)
    assert racy.correct is False and "wrong data" in racy.message, racy.message
    slow = pinned.check_loader(_blocking_loader)
    assert slow.correct is False and "waited for the GPU" in slow.message, slow.message

    def broken(batches, n_buffers):
        raise ZeroDivisionError("boom")
        yield  # pragma: no cover

    assert "ZeroDivisionError" in pinned.check_loader(broken).message


def test_module_imports_without_cuda():
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", "import experiments.pinned as p; print(len(p.__all__))"],
                       capture_output=True, text=True, env={**__import__("os").environ, "CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 0, r.stderr
    assert int(r.stdout) > 20


def test_helpers_are_documented():
    for name in pinned.__all__:
        obj = getattr(pinned, name)
        if callable(obj):
            assert obj.__doc__ and len(obj.__doc__) > 20, name
    assert math.isclose(sup.pcie_peak_gbps(6, 16), 121.0)
