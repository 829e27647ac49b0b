"""Recording acceptance tests: the lab GPU's recordings in experiments/recorded/ are complete,
every claim holds on them, every recorded point renders, and they show what the book's prose
says about them.

These tests check data, not code: they are marked ``recorded`` (``pytest -m recorded`` runs
them alone, e.g. after `python -m experiments record` on a GPU). When one fails after a
re-recording, either the GPU disagrees with the text (change the text, or the experiment)
or the recording is broken (record it again). Each "matches the text" test quotes the
sentences it guards; its thresholds are the text's words ("far below", "about twice"), and
every figure it compares with comes from the recording itself, never copied by hand. Where a
CPU model predicts what a recording measured, the comparison lives in test_oracles.py.
"""
from __future__ import annotations

import importlib

import pytest
from matplotlib.figure import Figure

from experiments import pinned, streams, syncs
from experiments.core import chapters, claims, registry, store
from experiments.core.registry import Result

pytestmark = pytest.mark.recorded

LAB_GPU = "nvidia-h200"
MiB, GiB = 2**20, 2**30


@pytest.fixture(autouse=True)
def _lab_recordings(monkeypatch):
    """Recorded mode, reading the lab's files in experiments/recorded/ (never a stand-in)."""
    monkeypatch.delenv("CUDA_MEMLAB_RECORDED_DIR", raising=False)
    monkeypatch.setenv("CUDA_MEMLAB_MODE", "recorded")


def lab(exp_id: str, **params) -> Result:
    """The lab H200's recording of one point (the experiment's default point unless told)."""
    r = registry.run(exp_id, mode="recorded", **params)
    assert r.provenance.gpu_name == "NVIDIA H200"
    return r


EXPERIMENTS = registry.all_experiments()
CLAIMS = claims.all_claims()


# ================================================================ every chapter: complete, claims, figures

def test_the_book_has_experiments_and_claims_in_every_chapter():
    assert {e.chapter for e in EXPERIMENTS} == set(chapters.NUMBERS)
    assert {c.chapter for c in CLAIMS} >= set(chapters.NUMBERS) - {0}


def test_no_stray_files_in_recorded():
    files = [p for p in store.PACKAGE_RECORDED_DIR.rglob("*") if p.is_file()]
    assert files, f"no recording in {store.PACKAGE_RECORDED_DIR}"
    for path in files:
        assert path.suffix == ".json" and not path.name.startswith("."), f"stray file {path}"
        assert path.parent.name in {e.id for e in EXPERIMENTS}, f"no experiment for {path}"


@pytest.mark.parametrize("exp", EXPERIMENTS, ids=lambda e: e.id)
def test_every_experiment_is_recorded_on_the_lab_gpu_over_its_whole_grid(exp):
    rec = store.load(exp.id, LAB_GPU, data_schema=exp.data_schema)
    assert rec.provenance.gpu_name == "NVIDIA H200"
    assert rec.chapter == exp.chapter
    missing = [pt for pt in exp.grid if rec.find(pt) is None]
    assert not missing, f"{exp.id}: grid points not recorded (run `python -m experiments record --experiment {exp.id}` on a GPU): {missing}"
    assert rec.provenance.git_commit != "unknown"


@pytest.mark.parametrize("c", CLAIMS, ids=lambda c: c.id)
def test_every_claim_holds_on_the_recording(c):
    r = claims.evaluate(c, mode="recorded")
    assert r.holds is True, f"{c.id}: {r.error or claims.format_measured(r.measured)}"


def render_function(exp_id: str):
    """The chapter's figure for an experiment: ``plot_<name>`` of the chapter's module for the
    experiment ``<prefix>.<name>`` (the notebooks' panels use the same functions)."""
    prefix, name = exp_id.split(".", 1)
    chapter = next(c for c in chapters.CHAPTERS if c.prefix == prefix)
    module = importlib.import_module(f"experiments.{chapter.module}")
    assert hasattr(module, f"plot_{name}"), f"experiments.{chapter.module} has no plot_{name} for {exp_id}"
    return getattr(module, f"plot_{name}")


RECORDED_POINTS = [(e.id, dict(p.params)) for e in EXPERIMENTS
                   for p in store.load(e.id, LAB_GPU, data_schema=e.data_schema).points]


def test_points_to_render_were_found():
    assert {e for e, _ in RECORDED_POINTS} == {e.id for e in EXPERIMENTS}


# the two points whose render replays a long trace (7-10 s of CPU each) run in make test only
HEAVY_POINTS = {("alloc.doctor_heldout", '{"case":"paged_kv_mempool"}'), ("alloc.doctor_cases", '{"case":"eager_long"}')}


@pytest.mark.parametrize("exp_id, params", [
    pytest.param(e, p, marks=pytest.mark.slow) if (e, store.params_key(p)) in HEAVY_POINTS else (e, p)
    for e, p in RECORDED_POINTS], ids=[f"{e}-{store.params_key(p)}" for e, p in RECORDED_POINTS])
def test_every_recorded_point_renders(exp_id, params):
    import matplotlib.pyplot as plt

    fig = render_function(exp_id)(lab(exp_id, **params))
    try:
        assert isinstance(fig, Figure)
        assert any("Recorded on NVIDIA H200" in t.get_text() for t in fig.texts), "no provenance footer"
    finally:
        plt.close(fig)


# ================================================================ chapter 1: the caching allocator

def test_lab_recording_shows_the_posts_numbers():
    """The post's own numbers (seed-posts.md §4.2), as the lab GPU measured them."""
    t = lab("alloc.timeline", small_mib=16, expandable=False).data["orders"]
    assert {o: t[o]["reserved_bytes"][t[o]["phase_ends"][2]] // MiB for o in t} == {"small_first": 256,
                                                                                    "large_first": 128}
    e = lab("alloc.timeline", small_mib=16, expandable=True).data["orders"]["small_first"]["reserved_bytes"]
    assert [r // MiB for r in e[:8]] == [20, 40, 60, 80, 80, 100, 120, 140]
    sw = lab("alloc.pool_boundary").data["sweep"]
    reserved = dict(zip(sw["sizes_bytes"], sw["reserved_bytes"]))
    assert (reserved[512 * 1024] // MiB, reserved[2 * MiB] // MiB) == (22, 20)


def test_recorded_graph_pools_give_the_lab_notes_figures():
    """'Add the memory that the captures hold outside the shared pool to the model's
    autograd rows, and compare with the lab notes' figures': 574 and 194 MiB with default
    settings, 202 MiB either way with expandable segments (seed-posts.md, the lab notes'
    CUDA-graph pool experiment, bfloat16). The page prints the sum; it is not typed."""
    from experiments import allocator

    lines = allocator.autograd_pool_totals([lab("alloc.graph_pools", expandable=e) for e in (False, True)])
    assert lines.splitlines() == [
        "default settings: model plus outside the pool, 574 MiB smallest batch first, 194 MiB largest first",
        "expandable segments: model plus outside the pool, 202 MiB smallest batch first, 202 MiB largest first"]


# ================================================================ chapter 2: cross-stream memory

def test_recorded_data_is_consistent():
    race = lab("streams.strategies")
    L, n, buf = race["layers"], race["in_flight"], race["buffer_bytes"]
    res = race["results"]
    assert res["unprotected"]["distinct_blocks"] == 1 and res["stall"]["distinct_blocks"] == 1
    assert res["event"]["distinct_blocks"] == n + 1
    assert res["record_stream"]["distinct_blocks"] >= L - 1
    assert res["event"]["peak_active_bytes"] <= (n + 1) * buf + streams.SLACK_BYTES
    assert res["stall"]["span_ms"] > res["event"]["span_ms"], "the stall should lose the overlap"
    sweep = lab("streams.runahead")
    assert all(b == sweep["in_flight"] + 1 for b in sweep["event"]["distinct_blocks"])
    assert not any(sweep["record_stream"]["corrupted_layers"]) and not any(sweep["event"]["corrupted_layers"])
    cap = lab("streams.memory_cap")["strategies"]
    assert cap["record_stream"]["num_alloc_retries"] >= 1 and cap["event"]["num_alloc_retries"] == 0


def test_recorded_race_follows_the_timing_the_chapter_describes():
    # The chapter's prose, against the lab GPU's files: no compute hides the race; at
    # 0.5 ms (a tie with the producer) the producer won every trial and each layer but
    # the last read the next layer's values; at 2 ms the first layer read a later one's
    # (with 4 layers, the last one's).
    for layers in (4, 8):
        fast = lab("streams.strategies", layers=layers, consumer_ms=0.0)["results"]["unprotected"]
        assert fast["corrupted_trials"] == 0, fast
        assert fast["read_mean"] == [float(k) for k in range(1, layers + 1)]
        tie = lab("streams.strategies", layers=layers, consumer_ms=0.5)["results"]["unprotected"]
        assert tie["corrupted_trials"] == tie["trials"], tie
        assert tie["read_mean"] == [float(k + 1) for k in range(1, layers)] + [float(layers)], tie["read_mean"]
        slow = lab("streams.strategies", layers=layers, consumer_ms=2.0)["results"]["unprotected"]
        assert slow["corrupted_trials"] == slow["trials"] and slow["read_mean"][0] > 1, slow
        assert layers != 4 or slow["read_mean"][0] == 4, slow["read_mean"]


def test_recorded_costs_match_the_chapter():
    race = lab("streams.strategies")
    res, L, buf = race["results"], race["layers"], race["buffer_bytes"]
    # the stall loses all overlap and needs at least the no-overlap time; the others overlap
    assert res["stall"]["overlap_ms"] == 0.0
    assert res["stall"]["span_ms"] >= race["serial_ms"]
    for s in ("unprotected", "record_stream", "event"):
        assert res[s]["overlap_ms"] > 0 and res[s]["span_ms"] < race["serial_ms"], (s, res[s])
    # record_stream: one block per layer, every buffer active and reserved, one allocated
    rs = res["record_stream"]
    assert rs["distinct_blocks"] == L
    assert rs["peak_active_bytes"] == rs["peak_reserved_bytes"] == L * buf and rs["peak_allocated_bytes"] == buf
    assert res["event"]["distinct_blocks"] == 2 and res["event"]["peak_active_bytes"] == 2 * buf

    sweep = lab("streams.runahead")
    pts = [(pt["consumer_ms"], pt["host_delay_ms"]) for pt in sweep["points"]]
    blocks = dict(zip(pts, sweep["record_stream"]["distinct_blocks"]))
    layers = sweep["layers"]
    assert blocks[(10.0, 0.0)] == layers  # every layer parked
    assert blocks[(0.25, 0.0)] >= layers / 4  # "a large share" already at a quarter of a ms
    assert blocks[(10.0, 20.0)] == 1  # the host slower than the GPU: one block
    # ... and there record_stream needs less than the event handoff's two buffers
    k = pts.index((10.0, 20.0))
    assert sweep["record_stream"]["peak_active_bytes"][k] < sweep["event"]["peak_active_bytes"][k]
    # exercise 2.2's reasoning: about half of the layers parked at 5 ms of host delay
    assert abs(blocks[(10.0, 5.0)] - layers / 2) <= layers / 8, blocks

    cap = lab("streams.memory_cap")
    rs, ev = cap["strategies"]["record_stream"], cap["strategies"]["event"]
    assert rs["worst_alloc_ms"] >= 10 and ev["worst_alloc_ms"] < 1, (rs["worst_alloc_ms"], ev["worst_alloc_ms"])
    # a stall lasts about as long as the consumer work behind the buffers that fill the cap
    estimate = rs["peak_reserved_bytes"] // cap["buffer_bytes"] * cap.params["consumer_ms"]
    assert 0.7 * estimate <= rs["worst_alloc_ms"] <= 1.3 * estimate, (estimate, rs["worst_alloc_ms"])
    # the GPU span hardly changes; the host is what waits
    assert abs(rs["span_ms"] - ev["span_ms"]) < 0.1 * ev["span_ms"]


def test_recorded_fsdp_matches_the_text():
    """Chapter 2, 'FSDP's own code on one GPU': 'With one rank neither FSDP gathers anything',
    'FSDP1 runs NO_SHARD and issues one all-reduce per layer', FSDP2's 'only side stream is the
    reduce-scatter stream'; 'most of the low-precision copies it makes in forward and backward
    are parked at once'; 'limit_all_gathers makes no difference beyond run-to-run noise'. With
    two ranks: FSDP1 without the limit 'parks the gathered parameters of almost every layer',
    with it 'its host needs about as long per step as the GPU'. The timelines: 'The host
    finishes enqueueing the forward pass long before the GPU does', FSDP2's copy-in stream
    'never holds more than a few buffers', FSDP1's unshard stream 'piles up one buffer per
    layer'."""
    ws1 = lab("streams.fsdp_runahead", group="nccl").data
    L = ws1["layers"]
    hi = max(range(len(ws1["points"])), key=lambda k: ws1["points"][k]["runahead_ms"])
    for v, s in ws1["versions"].items():
        assert s["collectives"]["all_gather"] == 0, v
    f1, f1n, f2 = (ws1["versions"][v] for v in ("fsdp1", "fsdp1_nolimit", "fsdp2"))
    assert f1["sharding"] == "NO_SHARD" and f1["collectives"]["all_reduce"] == L
    assert set(f2["streams"]) == {"compute", "reduce-scatter"}, f2["streams"]
    assert f1["param_buffers"][hi] >= 0.6 * 2 * L, f1["param_buffers"]
    for a, b in zip(f1["peak_active_bytes"], f1n["peak_active_bytes"]):
        assert abs(a - b) <= 0.15 * max(a, b), (f1["peak_active_bytes"], f1n["peak_active_bytes"])
    ws2 = lab("streams.fsdp_runahead", group="fake").data
    g1, g1n = ws2["versions"]["fsdp1"], ws2["versions"]["fsdp1_nolimit"]
    assert g1n["param_buffers"][hi] >= 0.8 * L, g1n["param_buffers"]
    assert g1["host_ms"][hi] >= 0.7 * g1["wall_ms"][hi], (g1["host_ms"], g1["wall_ms"])
    assert g1n["host_ms"][hi] <= 0.3 * g1n["wall_ms"][hi], (g1n["host_ms"], g1n["wall_ms"])
    fsdp2 = lab("streams.fsdp_step", group="fake").data
    fsdp1 = lab("streams.fsdp_step", group="fake", version="fsdp1_nolimit").data
    for d in (fsdp2, fsdp1):
        assert d["phases_ms"]["backward"] < 0.3 * d["phases_ms"]["done"], d["phases_ms"]
    assert fsdp2["streams"]["all-gather copy-in"]["max_blocks"] <= 4
    assert fsdp1["streams"]["unshard"]["max_blocks"] >= L


def test_recorded_chapter_fits_the_recording_budget():
    total = sum(pt.elapsed_s for e in registry.all_experiments(2) if not e.own_budget
                for pt in store.load(e.id, LAB_GPU, data_schema=e.data_schema).points)
    assert 0 < total < 90, f"chapter 2 took {total:.0f} s to record on the lab GPU; the budget is 90 s"



# ================================================================ chapter 3: pinned memory

def test_recorded_bandwidth_matches_the_text():
    """'pinned runs close to the link's peak; pageable stays far below; the gap is wider than
    the post's 2-3x; DtoH shows the same picture with a smaller gap'."""
    htod, dtoh = (lab("pinned.bandwidth", direction=d).data for d in ("htod", "dtoh"))
    ratios = {}
    for d in (htod, dtoh):
        assert d["sizes_bytes"][-1] == GiB
        assert d["link"] and d["pinned_gbps"][-1] >= 0.75 * d["link"]["peak_gbps"], (d["pinned_gbps"], d["link"])
        assert max(d["pageable_gbps"]) < 0.5 * d["pinned_gbps"][-1], d["pageable_gbps"]
        assert d["pinned_gbps"][0] < 0.05 * d["link"]["peak_gbps"], "a 4 KiB copy should be far from the link"
        ratios[d["direction"]] = d["pinned_gbps"][-1] / d["pageable_gbps"][-1]
    assert ratios["htod"] > 3, ratios
    assert 1.5 < ratios["dtoh"] < ratios["htod"], ratios
    text = pinned.bandwidth_summary(lab("pinned.bandwidth"))
    assert f"1 GiB: pinned {htod['pinned_gbps'][-1]:.1f} GB/s" in text
    assert f"pageable {htod['pageable_gbps'][-1]:.1f} GB/s: {ratios['htod']:.1f}x" in text


def test_recorded_host_waits_match_the_text():
    """'Only the pinned non_blocking copy left the host free ... the pageable ones longer still';
    'up to 2 MiB the driver staged the pageable source at once ... at 64 MiB it waited';
    'a DtoH copy into pageable memory waited at every size'."""
    for size in (64, 2048, 65536):
        for direction in ("htod", "dtoh"):
            r = lab("pinned.async_copy", size_kib=size, direction=direction)
            q = r.data["work_ms"]
            assert pinned.host_blocked_ms(r, "pinned", True) < 1.0, (size, direction)
            assert pinned.host_blocked_ms(r, "pinned", False) >= 0.95 * q, (size, direction)
            assert pinned.host_blocked_ms(r, "pageable", False) >= 0.95 * q, (size, direction)
            staged_at_once = direction == "htod" and size <= 2048
            page_nb = pinned.host_blocked_ms(r, "pageable", True)
            assert (page_nb < 0.1 * q) if staged_at_once else (page_nb >= 0.95 * q), (size, direction, page_nb)
    big = lab("pinned.async_copy")
    for nb in (True, False):
        assert pinned.host_blocked_ms(big, "pageable", nb) > pinned.host_blocked_ms(big, "pinned", False)


def test_recorded_overwrite_race_matches_the_text():
    """The guard bullets: every guard 0 wrong; the event waits for the work ahead, synchronize()
    about twice that; the pageable source as much as the event or more at 16 MiB and almost
    nothing at 1 MiB; a fresh buffer about as little as no guard, its p90 a new pinning; and a
    write 60 ms after the call is harmless, 0 and 10 ms are not."""
    for size in (1, 16):
        for after in (0.0, 10.0, 60.0):
            d = lab("pinned.overwrite_race", size_mib=size, overwrite_after_ms=after).data
            rows = {r["name"]: r for r in d["strategies"]}
            for name in ("pageable", "synchronize", "event", "fresh_buffer"):
                assert max(rows[name]["wrong_elements"]) == 0, (size, after, name)
            race_wrong = min(rows["race"]["wrong_elements"])
            assert (race_wrong == 0) if after > d["work_ms"] else (race_wrong == d["n_elements"]), (size, after)
    rows = {r["name"]: r["host_blocked_ms"] for r in lab("pinned.overwrite_race").data["strategies"]}
    work = lab("pinned.overwrite_race").data["work_ms"]
    assert 0.95 * work <= rows["event"]["median"] < 1.2 * work, rows["event"]
    assert 1.7 < rows["synchronize"]["median"] / rows["event"]["median"] < 2.3, (rows["synchronize"], rows["event"])
    assert 0.95 * rows["event"]["median"] <= rows["pageable"]["median"] < 1.25 * rows["event"]["median"]
    assert rows["fresh_buffer"]["median"] < 2 * rows["race"]["median"] + 0.1, rows["fresh_buffer"]
    assert rows["fresh_buffer"]["p90"] > 10 * rows["fresh_buffer"]["median"], rows["fresh_buffer"]
    small = {r["name"]: r["host_blocked_ms"] for r in lab("pinned.overwrite_race", size_mib=1).data["strategies"]}
    assert small["pageable"]["median"] < 0.05 * work, small["pageable"]
    lines = pinned.race_timing_text([lab("pinned.overwrite_race", overwrite_after_ms=a)
                                     for a in (60.0, 0.0, 10.0)]).splitlines()
    assert [line.split(": ")[-1].strip() for line in lines] == ["100% wrong", "100% wrong", "0% wrong"]


def test_recorded_del_and_host_cache_match_the_text():
    """'pinning that new block took milliseconds ... came back from the cache, in a small
    fraction of that time'; torch.cuda.empty_cache() keeps every pinned block, emptying the host
    cache returns them all. (How the lifecycle follows the host-cache model: test_oracles.py.)"""
    for size in (1, 16, 64):
        d = lab("pinned.del_is_safe", size_mib=size).data
        ok, measured = claims.get_claim("pinned.del_is_safe").predicate(d)
        assert ok, (size, measured)
    default = lab("pinned.del_is_safe")
    h = default.data["host"]
    assert h["realloc_ms"] - h["copy_call_ms"] > 1.0
    assert h["realloc_ms"] - h["copy_call_ms"] > 10 * (h["realloc_after_ms"] - h["sync_ms"]), h
    assert "a different address" in pinned.del_summary(default)
    for unit in (1, 64):
        life = lab("pinned.lifecycle", unit_mib=unit).data
        assert life["owned_bytes"][-2] == life["owned_bytes"][-3] > 0, "empty_cache() must leave pinned blocks owned"
        assert life["owned_bytes"][-1] == 0 and life["num_host_free"][-1] == life["num_host_alloc"][-1]
    graph = lab("pinned.graph_replay").data
    assert all(s["min"] == s["max"] == s["value"] for s in graph["staging"]), graph["staging"]
    assert graph["pageable_capture_error"] and "pinned" in graph["pageable_capture_error"]
    for size in (1, 16):
        ok, measured = claims.get_claim("pinned.graph_reads_captured_address").predicate(
            lab("pinned.graph_replay", size_mib=size).data)
        assert ok, (size, measured)


def test_recorded_pin_cost_matches_the_text():
    """'Fresh pinning grows with the size at a roughly fixed price per MiB, while taking a block
    from the cache costs microseconds at any size: for a GiB, thousands of times less'."""
    cost = lab("pinned.pin_cost")
    d = cost.data
    fresh = [s["median"] for s in d["fresh_ms"]]
    cached = [s["median"] for s in d["cached_ms"]]
    repin = [s["median"] for s in d["pin_memory_ms"]]
    assert fresh[1:] == sorted(fresh[1:]), fresh
    per_mib = [f / (n / MiB) for f, n in zip(fresh, d["sizes_bytes"]) if n >= 16 * MiB]
    assert max(per_mib) < 2 * min(per_mib), per_mib
    assert max(cached) < 0.1, cached  # microseconds
    assert fresh[-1] > 1000 * cached[-1], (fresh[-1], cached[-1])
    assert cached[-1] < repin[-1] < fresh[-1], "pin_memory() with a warm cache is a cached block plus a memcpy"
    assert f"{d['fresh_ms_per_mib']:.2f} ms per MiB" in pinned.pin_cost_summary(cost)


def test_recorded_ring_matches_the_text():
    """'one buffer already comes close to four' (steady; the page prints how close); with bursty work each extra
    buffer helps, the host's total wait shrinks, the time approaches the GPU's mean; without
    the wait, every ring size delivered wrong batches when the GPU started behind, and more
    buffers meant fewer wrong batches in the timed run."""
    runs = {(c, n): lab("pinned.double_buffer", buffers=n, compute=c).data
            for c in ("steady", "bursty") for n in (1, 2, 3, 4)}
    for d in runs.values():
        assert d["with_events"]["wrong_batches"] == d["with_events"]["stall_wrong_batches"] == 0, d["with_events"]
        assert d["no_wait"]["stall_wrong_batches"] > 0, d["no_wait"]
    for c in ("steady", "bursty"):
        waits = [runs[c, n]["with_events"]["host_wait_ms"] for n in (1, 2, 3, 4)]
        wrong = [runs[c, n]["no_wait"]["wrong_batches"] for n in (1, 2, 3, 4)]
        assert waits == sorted(waits, reverse=True), (c, waits)
        assert wrong == sorted(wrong, reverse=True) and wrong[0] > wrong[-1], (c, wrong)
    steady = [runs["steady", n]["with_events"]["ms_per_batch"] for n in (1, 2, 3, 4)]
    bursty = [runs["bursty", n]["with_events"]["ms_per_batch"] for n in (1, 2, 3, 4)]
    assert steady[0] <= 1.1 * steady[-1], steady
    assert bursty == sorted(bursty, reverse=True) and bursty[0] > 1.25 * bursty[-1], bursty
    assert bursty[-1] < 1.1 * runs["bursty", 4]["mean_compute_ms"], bursty



# ================================================================ chapter 4: hidden syncs

def test_recorded_catalogue_is_consistent():
    """Syncing rows waited for the queue, quiet rows returned at once, syncing rows do not capture."""
    for numel in syncs.NUMEL_CHOICES:
        d = lab("syncs.catalogue", numel=numel).data
        for row in d["rows"]:
            waited = row["host_blocked_ms"]["median"]
            if row["expected_sync"] is True:
                assert waited >= 0.5 * d["work_ms"], f"{row['code']} at {numel}: waited {waited:.2f} ms"
                assert row["capturable"] is not True, f"{row['code']} captured although it syncs"
            if row["expected_sync"] is False and row["id"] != "cpu_bool_mask" and numel == 4096:
                assert waited < 0.25 * d["work_ms"], f"{row['code']}: waited {waited:.2f} ms"
            if row["debug_mode_syncs"] > 0:
                assert row["detector_syncs"] >= row["debug_mode_syncs"]
    big = {r["id"]: r for r in lab("syncs.catalogue", numel=4_194_304).data["rows"]}
    assert big["to_cuda_pageable_nb"]["blocks"] and big["to_cuda_pageable_nb"]["debug_mode_syncs"] == 0
    assert "pageable_htod" in big["to_cuda_pageable_nb"]["detector_kinds"]


def test_recorded_run_ahead_shows_the_bubble():
    """'The host waited far longer than the sync cost the loop': where the GPU is the slower
    side, one sync makes the host wait for the whole queue, while the loop ends only about
    one step's host time later. (How the end times follow the queue model: test_oracles.py.)"""
    for params, in [({"host_ms": 0.5, "gpu_ms": 2.0},), ({"host_ms": 1.0, "gpu_ms": 2.0},)]:
        v = lab("syncs.run_ahead", **params).data["variants"]
        assert v["once"]["host_blocked_ms"] > 2 * (v["once"]["end_ms"] - v["none"]["end_ms"]), \
            (params, "the host's wait should be much longer than what the sync cost the loop")


def test_recorded_debug_mode_and_stream_synchronize():
    """What the chapter says about the explicit waits: the debug mode reported
    Stream.synchronize() but neither torch.cuda.synchronize() nor Event.synchronize(),
    and all three made the host wait."""
    cat = {r["id"]: r for r in lab("syncs.catalogue")["rows"]}
    spots = {c["op"]: c for c in lab("syncs.blind_spots")["cases"]}
    for rows in (cat, spots):
        assert rows["stream_synchronize"]["debug_mode_syncs"] >= 1
        assert rows["synchronize"]["debug_mode_syncs"] == 0 and rows["event_synchronize"]["debug_mode_syncs"] == 0
    for rows, work_ms in ((cat, lab("syncs.catalogue")["work_ms"]), (spots, lab("syncs.blind_spots")["work_ms"])):
        for op in ("synchronize", "stream_synchronize", "event_synchronize"):
            assert rows[op]["detector_syncs"] >= 1 and rows[op]["host_blocked_ms"]["median"] >= 0.5 * work_ms, op


def test_recorded_pageable_copies():
    """The chapter's reading of the sweep: blocking copies wait at every size, pinned
    non_blocking ones never, pageable non_blocking ones from the threshold on, and the
    largest also pays for the copy."""
    for pt in registry.get("syncs.pageable_threshold").grid:
        d = lab("syncs.pageable_threshold", **pt).data
        work, v = d["work_ms"], d["variants"]
        assert min(v["pageable_blocking"]["median_ms"]) >= 0.8 * work
        assert max(v["pinned_non_blocking"]["median_ms"]) < 0.1 * work
        nb = dict(zip(d["sizes_bytes"], v["pageable_non_blocking"]["median_ms"]))
        assert all((t >= 0.5 * work) == (n >= d["threshold_bytes"]) for n, t in nb.items())
        assert nb[d["sizes_bytes"][-1]] > work, "the 64 MiB copy waits for the queue, then copies"


def test_recorded_case_study():
    d = lab("syncs.case_study").data
    hidden, free = d["variants"]["hidden_sync"], d["variants"]["sync_free"]
    assert hidden["syncs_per_step"] >= 1 and free["syncs_per_step"] == 0
    assert any("reduce_grad_stats" in line for line in hidden["sync_report"])
    assert hidden["step_ms"]["p10"] > free["step_ms"]["p90"], "the two step-time distributions do not overlap"


def test_recorded_case_study_is_built_as_the_chapter_says():
    """'The update after the sync is host-heavy and GPU-light'; the batch search reaches each
    balance of GPU to host time; 'the sync costs most where host and GPU are balanced'.
    (How the step times follow the step model: test_oracles.py.)"""
    speedups = {}
    upd = syncs.CASE_PHASES[2]
    for pt in registry.get("syncs.case_study").grid:
        d = lab("syncs.case_study", **pt).data
        assert d["host_phase_ms"][upd] > 2 * d["gpu_phase_ms"][upd], "the update should be host-heavy, GPU-light"
        assert d["gpu_to_host"] == pytest.approx(pt["balance"], rel=0.3), "the batch search missed its target"
        speedups[pt["balance"]] = d["speedup"]
    assert speedups[1.0] > speedups[0.5], f"the sync should cost most where host and GPU are balanced: {speedups}"


def test_recorded_queue_probe_slopes():
    assert lab("syncs.queue_probe", op="item")["slope"] == pytest.approx(1.0, abs=0.2)
    assert abs(lab("syncs.queue_probe", op="full")["slope"]) < 0.1
