"""The pure-Python allocator model against the rules and the H200 tables of experiments/doctor/RULES.md §I
and seed-posts.md §4.3 (all measured on the lab GPU with torch 2.11)."""
import pytest

from experiments.doctor.model.engine import Engine, EngineOutOfMemory
from experiments.allocator.model import (
    KiB, MiB, AllocatorConfig, compact_layout, format_bytes, get_allocation_size, get_pool,
    normalize_ops, parse_roundup_divisions, parse_size, round_size, should_split,
)
from experiments.allocator.model import request_anatomy, simulate

EXP = {"expandable_segments": True}


def reserved_mib(ops, settings=None, cap=None):
    return [r / MiB for r in simulate(ops, settings, cap_bytes=cap)["reserved_bytes"]]


def allocs(n, size, prefix="t"):
    return [("alloc", f"{prefix}{i}", size) for i in range(n)]


def frees(n, prefix="t"):
    return [("free", f"{prefix}{i}") for i in range(n)]


def layout(ops, settings=None, cap=None):
    return compact_layout(simulate(list(ops) + [("snapshot", "end")], settings, cap_bytes=cap)["snapshots"]["end"])


# --------------------------------------------------------------------------- single requests (§I.1)

@pytest.mark.parametrize("request_bytes, block, pool, segment, remainder", [
    (1, 512, "small", 2 * MiB, 2 * MiB - 512),
    (511, 512, "small", 2 * MiB, 2 * MiB - 512),
    (512, 512, "small", 2 * MiB, 2 * MiB - 512),
    (513, 1024, "small", 2 * MiB, 2 * MiB - 1024),
    (1000, 1024, "small", 2 * MiB, 2 * MiB - 1024),
    (100 * KiB, 102400, "small", 2 * MiB, 2 * MiB - 102400),
    (MiB - 1, MiB, "small", 2 * MiB, MiB),
    (MiB, MiB, "small", 2 * MiB, MiB),
    (MiB + 1, 1049088, "large", 20 * MiB, 20 * MiB - 1049088),
    (2 * MiB, 2 * MiB, "large", 20 * MiB, 18 * MiB),
    (5 * MiB, 5 * MiB, "large", 20 * MiB, 15 * MiB),
    (10 * MiB - 1, 10 * MiB, "large", 10 * MiB, 0),
    (10 * MiB, 10 * MiB, "large", 10 * MiB, 0),
    (10 * MiB + 1, 10486272, "large", 12 * MiB, 2096640),
    (11 * MiB, 12 * MiB, "large", 12 * MiB, 0),                 # 1 MiB tail is not split off
    (19 * MiB + MiB // 2, 20 * MiB, "large", 20 * MiB, 0),      # 0.5 MiB tail is not split off
    (20 * MiB, 20 * MiB, "large", 20 * MiB, 0),
    (21 * MiB + 1, 22 * MiB, "large", 22 * MiB, 0),
    (100 * MiB + 3, 104858112, "large", 102 * MiB, 2096640),
])
def test_request_anatomy_matches_the_h200_table(request_bytes, block, pool, segment, remainder):
    a = request_anatomy(request_bytes)
    assert (a["block_bytes"], a["pool"], a["segment_bytes"], a["remainder_bytes"]) == (block, pool, segment, remainder)
    assert a["split"] == (remainder > 0)


def test_rules_one_by_one():
    assert [get_pool(round_size(n)) for n in (MiB, MiB + 1)] == ["small", "large"]
    assert [get_allocation_size(round_size(n)) for n in (1, MiB + 1, 9 * MiB, 10 * MiB, 33 * MiB + 1)] == \
        [2 * MiB, 20 * MiB, 20 * MiB, 10 * MiB, 34 * MiB]
    assert should_split(20 * MiB, 18 * MiB, "large") and not should_split(20 * MiB, 19 * MiB, "large")
    assert should_split(2 * MiB, 2 * MiB - 512, "small") and not should_split(1024, 1024, "small")
    assert should_split(20 * MiB, 19 * MiB + MiB // 2, "large", AllocatorConfig(expandable_segments=True))
    assert not should_split(200 * MiB, 64 * MiB, "large", AllocatorConfig(max_split_size=64 * MiB))
    with pytest.raises(ValueError, match="cannot serve"):
        should_split(MiB, 2 * MiB, "large")


@pytest.mark.parametrize("bad", [0, -5, 1.5, True, "1 MiB"])
def test_round_size_rejects_non_sizes(bad):
    with pytest.raises(ValueError, match="nbytes"):
        round_size(bad)


# --------------------------------------------------------------------------- rounding options (§A.2, §I.2)

def test_roundup_power2_divisions_4():
    cfg = AllocatorConfig.from_settings("roundup_power2_divisions:4")
    got = [round_size(n, cfg) for n in (1200, 2048, 2049, 5000, 102401, 3 * MiB + 1, 33 * MiB + 1, 129 * MiB)]
    assert got == [1536, 2048, 2560, 5120, 114688, 3 * MiB + MiB // 2, 40 * MiB, 160 * MiB]


def test_roundup_list_follows_the_2_11_parser():
    cfg = AllocatorConfig.from_settings("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]")
    got = [round_size(n, cfg) for n in (3 * MiB + 1, 300 * MiB + 1, 600 * MiB + 1, 1100 * MiB + 1)]
    assert got == [3 * MiB + 512, 300 * MiB + 512, 768 * MiB, 1280 * MiB]
    table = parse_roundup_divisions("[256:1,512:2,1024:4,>:8]")
    assert table[:9] == (1,) * 9 and table[9:11] == (2, 4) and table[11:] == (8,) * 5


@pytest.mark.parametrize("bad, match", [(3, "power of two"), ("[3:2]", "power of two in MiB"), ("[256:3]", "power of two"),
                                        ("[256]", "SIZE_MB:N"), ([1, 2], "16 entries"), (True, "number or a list")])
def test_roundup_divisions_reject_bad_values(bad, match):
    with pytest.raises(ValueError, match=match):
        parse_roundup_divisions(bad)


@pytest.mark.parametrize("settings, match", [
    # torch's parser: max_split_size_mb below large_segment_size_mb (20 MiB by default) is refused
    ({"max_split_size_mb": 8}, r">= 20 \(MiB"),
    ({"max_split_size_mb": 40, "large_segment_size_mb": 64}, r">= 64 \(MiB"),
    ({"backend": "cudaMallocAsync"}, "native caching allocator"),
    ({"per_process_memory_fraction": 1.5}, r"per_process_memory_fraction must be in \[0, 1\]"),
    ({"expandable_segment": True}, "unknown allocator option"),
    ({"garbage_collection_threshold": 1.5}, r"\(0, 1\)"),
    ({"expandable_segments": "yes"}, "True or False"),
])
def test_config_rejects_bad_settings(settings, match):
    with pytest.raises(ValueError, match=match):
        AllocatorConfig.from_settings(settings)


def test_config_takes_torchs_lowest_max_split_and_a_memory_fraction():
    # CUDAAllocatorConfig: max_split_size_mb >= large_segment_size_mb, so 20 MiB itself is allowed;
    # per_process_memory_fraction is a cap of that fraction of the device's memory.
    assert AllocatorConfig.from_settings({"max_split_size_mb": 20}).max_split_size == 20 * MiB
    assert AllocatorConfig.from_settings({"per_process_memory_fraction": 0.5}).memory_fraction == 0.5


def test_config_from_string_and_dict_agree():
    a = AllocatorConfig.from_settings("expandable_segments:True,max_split_size_mb:64,large_segment_size_mb:40")
    b = AllocatorConfig.from_settings({"expandable_segments": True, "max_split_size_mb": 64, "large_segment_size_mb": 40})
    assert a == b and a.max_split_size == 64 * MiB and a.large_segment_size == 40 * MiB
    assert AllocatorConfig.from_settings("pinned_use_background_threads:True") == AllocatorConfig()


# --------------------------------------------------------------------------- placement, split, merge (§I.1)

def test_small_pool_packing_and_best_fit():
    ops = [("alloc", "a", 100 * KiB), ("alloc", "b", 200 * KiB), ("alloc", "c", 300 * KiB), ("free", "b"),
           ("alloc", "d", 150 * KiB), ("snapshot", "s1"), ("alloc", "e", MiB), ("alloc", "f", MiB), ("snapshot", "s2")]
    r = simulate(ops)
    first = r["snapshots"]["s1"][0]["blocks"]
    assert [(b["size"], b["state"]) for b in first] == [
        (102400, "active_allocated"), (153600, "active_allocated"), (51200, "inactive"),
        (307200, "active_allocated"), (1482752, "inactive")]
    assert sorted(compact_layout(r["snapshots"]["s2"]))[1] == "small:2M[1A 1f]"  # the second 1 MiB opened a segment


def test_a_large_remainder_of_one_mib_or_less_goes_with_the_block():
    r = simulate([("alloc", "a", "3 MiB"), ("alloc", "b", "4 MiB"), ("alloc", "c", "12 MiB"), ("snapshot", "s")])
    assert compact_layout(r["snapshots"]["s"]) == ["large:20M[3A 4A 13A]"]
    assert r["allocated_bytes"][-1] == 20 * MiB


def test_free_blocks_merge_back_into_the_whole_segment():
    ops = allocs(3, 2 * MiB + 512) + [("free", "t1"), ("free", "t0"), ("free", "t2")]
    assert layout(ops) == ["large:20M[20f]"]


def test_empty_cache_returns_only_entirely_free_segments():
    ops = allocs(2, 16 * MiB) + [("alloc", "s", "5 MiB"), ("alloc", "u", "5 MiB"), ("free", "t0"), ("free", "s"),
                                 ("empty_cache",)]
    assert reserved_mib(ops)[-1] == 36   # the free 16 MiB segment went back; the 20 MiB one still holds u
    assert sorted(layout(ops)) == ["large:16M[16A]", "large:20M[5f 5A 10f]"]


# --------------------------------------------------------------------------- the post's labs (seed-posts.md §4.3)

POST_LABS = [
    # name, ops, classic reserved MiB, expandable reserved MiB
    ("small then large", allocs(8, 16 * MiB) + frees(8) + allocs(4, 32 * MiB, "L"), 256, 140),
    ("large then small", allocs(4, 32 * MiB, "L") + frees(4, "L") + allocs(8, 16 * MiB), 128, 140),
    ("4x16, free 0 and 2, 32", allocs(4, 16 * MiB) + [("free", "t0"), ("free", "t2"), ("alloc", "y", 32 * MiB)], 96, 100),
    ("2 MiB then 0.5 MiB", [("alloc", "a", 2 * MiB), ("free", "a"), ("alloc", "b", MiB // 2)], 22, 22),
    ("2 MiB then 2 MiB", [("alloc", "a", 2 * MiB), ("free", "a"), ("alloc", "b", 2 * MiB)], 20, 20),
    ("1 MiB then 1.01 MiB", [("alloc", "a", MiB), ("alloc", "b", "1.01 MiB")], 22, 22),
    ("8x4 MiB", allocs(8, 4 * MiB), 40, 40),
    ("6x9 MiB", allocs(6, 9 * MiB), 60, 60),
    ("8x0.25 MiB", allocs(8, MiB // 4), 2, 2),
    ("3x10 MiB", allocs(3, 10 * MiB), 30, 40),
    ("3x11 MiB", allocs(3, 11 * MiB), 36, 40),
]


@pytest.mark.parametrize("name, ops, classic, expandable", POST_LABS, ids=[p[0] for p in POST_LABS])
def test_post_labs_reserve_what_the_h200_reserved(name, ops, classic, expandable):
    assert reserved_mib(ops)[-1] == classic
    assert reserved_mib(ops, EXP)[-1] == expandable


def test_post_lab_layouts():
    assert sorted(layout(POST_LABS[0][1])) == ["large:16M[16f]"] * 8 + ["large:32M[32A]"] * 4
    assert layout(POST_LABS[1][1]) == ["large:32M[16A 16A]"] * 4
    assert layout(POST_LABS[2][1], EXP) == ["large:100M[16f 16A 16f 16A 32A 4f]"]
    assert sorted(layout(POST_LABS[3][1])) == ["large:20M[20f]", "small:2M[0.5A 1.5f]"]
    assert layout(POST_LABS[10][1]) == ["large:12M[12A]"] * 3
    assert layout(POST_LABS[10][1], EXP) == ["large:40M[11A 11A 11A 7f]"]


def test_expandable_page_trace_of_eight_16_mib_tensors():
    assert reserved_mib(allocs(8, 16 * MiB), EXP) == [20, 40, 60, 80, 80, 100, 120, 140]
    assert reserved_mib(allocs(8, 16 * MiB)) == [16, 32, 48, 64, 80, 96, 112, 128]


def test_expandable_maps_pages_on_demand_and_unmaps_only_whole_free_pages():
    ops = [("alloc", "a", "3 MiB"), ("alloc", "b", "25 MiB"), ("alloc", "c", "50 MiB")]
    assert reserved_mib(ops, EXP) == [20, 40, 80]
    held = ops + [("free", "b"), ("empty_cache",)]
    assert reserved_mib(held, EXP)[-1] == 80           # no page lies wholly inside a free block
    assert layout(held, EXP) == ["large:80M[3A 25f 50A 2f]"]
    gone = ops + [("free", "a"), ("free", "b"), ("free", "c"), ("empty_cache",)]
    assert reserved_mib(gone, EXP)[-1] == 0 and layout(gone, EXP) == []


def test_expandable_segments_fix_the_n_to_n_plus_one_pattern():
    ops = allocs(5, 12 * MiB) + frees(5) + allocs(5, 12 * MiB + MiB // 2, "n")
    assert reserved_mib(ops)[-1] == 130
    assert reserved_mib(ops, EXP)[-1] == 80


# --------------------------------------------------------------------------- knobs (§I.2)

def test_max_split_size_keeps_large_cached_blocks_whole():
    ops = [("alloc", "a", 100 * MiB), ("free", "a"), ("alloc", "b", 50 * MiB), ("alloc", "c", 90 * MiB),
           ("alloc", "d", 65 * MiB)]
    r = simulate(ops, {"max_split_size_mb": 64})
    assert [x / MiB for x in r["reserved_bytes"]] == [100, 100, 150, 150, 216]
    assert r["allocated_bytes"][3] == 150 * MiB          # 90 MiB served by the whole 100 MiB block
    r = simulate([("alloc", "a", 200 * MiB), ("free", "a"), ("alloc", "b", 120 * MiB), ("snapshot", "s")],
                 {"max_split_size_mb": 64, "max_non_split_rounding_mb": 100})
    assert compact_layout(r["snapshots"]["s"]) == ["large:200M[200A]"]


def test_garbage_collection_releases_every_block_of_average_age():
    from experiments.core import store

    h200 = store.load("alloc.knobs", "nvidia-h200").provenance.total_memory_bytes
    cap = int(0.02 * h200)  # the lab's fraction 0.02 of the H200 (experiments/doctor/RULES.md §I.2)
    ops = allocs(57, 30 * MiB) + frees(57) + [("alloc", "big", 40 * MiB)]
    r = reserved_mib(ops, {"garbage_collection_threshold": 0.5}, cap)
    assert r[56] == 1710 and r[-1] == 40
    assert reserved_mib(ops, None, cap)[-1] == 1750


# --------------------------------------------------------------------------- memory cap and OOM

def test_a_capped_model_releases_cached_segments_then_raises():
    m = Engine(AllocatorConfig(), cap_bytes=100 * MiB)

    def free(block):
        m.free_requested(block)
        m.free_completed(block)

    a, b = m.malloc(40 * MiB), m.malloc(40 * MiB)
    free(a)
    c = m.malloc(50 * MiB)            # 80 + 50 > 100: release the free 40 MiB segment, retry
    assert (m.reserved_bytes, m.num_alloc_retries) == (90 * MiB, 1)
    with pytest.raises(EngineOutOfMemory) as err:
        m.malloc(20 * MiB)
    assert err.value.figures["alloc_size_bytes"] == 20 * MiB and err.value.figures["reserved_bytes"] == 90 * MiB
    assert m.num_ooms == 1 and "20 MiB" in str(err.value)
    free(b)
    free(c)
    with pytest.raises(ValueError, match="not allocated"):
        free(c)


def test_simulate_stops_at_the_first_oom_with_a_snapshot():
    r = simulate(allocs(3, 32 * MiB) + [("alloc", "big", 64 * MiB), ("alloc", "after", 1)], cap_bytes=128 * MiB)
    assert r["oom"]["step"] == 3 and r["labels"][-1].endswith("OOM")
    assert len(r["labels"]) == 4 and "oom" in r["snapshots"]
    assert r["oom"]["reserved_unallocated_bytes"] == 0


@pytest.mark.parametrize("expandable", [False, True])
def test_each_cap_of_the_fragmentation_experiment_is_clear_of_a_threshold(expandable):
    """alloc.fragmentation_oom sets its cap as a fraction of the GPU's memory; the model must predict the same
    outcome (which operation fails, if any) a few MiB either side of each cap it offers."""
    from experiments.allocator.workloads import OOM_CAP_CHOICES, OOM_PATTERNS, oom_ops

    def outcomes(cap_bytes):
        runs = {p: simulate(oom_ops(p), EXP if expandable else None, cap_bytes=cap_bytes) for p in OOM_PATTERNS}
        return {p: r["oom"] and r["oom"]["step"] for p, r in runs.items()}

    for cap in OOM_CAP_CHOICES:
        expected = outcomes(cap * MiB)
        for delta in (-4 * MiB, -1, 1, 4 * MiB):
            assert outcomes(cap * MiB + delta) == expected, (cap, delta)


def test_the_fragmentation_caps_cover_three_outcomes():
    """Below the first phase every pattern fails there; at the default cap the fragmented patterns fail on the
    64 MiB request and 'grouped' fits; at the largest cap everything fits."""
    from experiments.allocator.workloads import (
        OOM_CAP_CHOICES, OOM_CAP_MIB, OOM_FILL_COUNT, OOM_PATTERNS, OOM_REQUEST_MIB, oom_ops,
    )

    request_step = {p: sum(op[0] != "snapshot" for op in oom_ops(p)) - 1 for p in OOM_PATTERNS}
    for settings in (None, EXP):
        failed = {cap: {p: (r["oom"] or {}).get("step") for p in OOM_PATTERNS
                        for r in [simulate(oom_ops(p), settings, cap_bytes=cap * MiB)]} for cap in OOM_CAP_CHOICES}
        assert failed[min(OOM_CAP_CHOICES)] == dict.fromkeys(OOM_PATTERNS, OOM_FILL_COUNT - 1), settings
        assert failed[OOM_CAP_MIB]["interleave"] == request_step["interleave"] and failed[OOM_CAP_MIB]["grouped"] is None
        assert failed[max(OOM_CAP_CHOICES)] == dict.fromkeys(OOM_PATTERNS), settings
    shrink = simulate(oom_ops("shrink"), cap_bytes=OOM_CAP_MIB * MiB)["oom"]
    assert shrink["request_bytes"] == OOM_REQUEST_MIB * MiB and shrink["reserved_unallocated_bytes"] == 88 * MiB


# --------------------------------------------------------------------------- operations and sizes

@pytest.mark.parametrize("text, nbytes", [("16 MiB", 16 * MiB), ("1.5MiB", 3 * MiB // 2), ("512 KiB", 512 * KiB),
                                          ("1 MiB + 1", MiB + 1), ("1000 B", 1000), (1000, 1000), ("2 GiB", 2 << 30)])
def test_parse_size(text, nbytes):
    assert parse_size(text) == nbytes


@pytest.mark.parametrize("bad", ["sixteen MiB", "-3 MiB", 0, "0.1 B", None, True])
def test_parse_size_rejects_bad_sizes(bad):
    with pytest.raises(ValueError):
        parse_size(bad)


@pytest.mark.parametrize("ops, match", [
    ([("alloc", "a")], "operation 0: alloc takes"),
    ([("alloc", "a", "1 MiB"), ("alloc", "a", "1 MiB")], "operation 1: 'a' is already allocated"),
    ([("free", "x")], "operation 0: free needs"),
    ([("grow", "x")], "unknown operation 'grow'"),
    ([("alloc", "a", -5)], "operation 0: a size must be at least 1 byte"),
    ([("empty_cache", 1)], "takes no arguments"),
    (["alloc"], "expected a tuple"),
])
def test_normalize_ops_rejects_malformed_sequences(ops, match):
    with pytest.raises(ValueError, match=match):
        normalize_ops(ops)


def test_normalize_ops_canonical_form():
    assert normalize_ops([("alloc", "a", "1 KiB"), ("snapshot", "s"), ("free", "a"), ("empty_cache",)]) == \
        [["alloc", "a", 1024], ["snapshot", "s"], ["free", "a"], ["empty_cache"]]


@pytest.mark.parametrize("nbytes, text", [(1000, "1000 B"), (MiB - 1, "1 MiB − 1 B"), (MiB + 1, "1 MiB + 1 B"),
                                          (2 * MiB - 512, "2 MiB − 512 B"), (100 * KiB, "100 KiB"),
                                          (19 * MiB + MiB // 2, "19.5 MiB"), (3 << 30, "3 GiB")])
def test_format_bytes_is_exact_near_boundaries(nbytes, text):
    assert format_bytes(nbytes) == text
