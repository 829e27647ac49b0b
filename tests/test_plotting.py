import pytest
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from experiments.core import plotting
from experiments.core.units import MiB


def _bars(fig):
    return [p for p in fig.axes[0].patches if isinstance(p, Rectangle)]


SEGMENTS = [
    {"total_size": 20 * MiB, "pool": "large", "blocks": [
        {"size": 4 * MiB, "state": "active_allocated"}, {"size": 4 * MiB, "state": "inactive"},
        {"size": 12 * MiB, "state": "active_pending_free"}]},
    {"total_size": 2 * MiB, "pool": "small", "blocks": [{"size": 2 * MiB, "state": "inactive"}]},
]


def test_segment_map_draws_one_bar_per_block_at_its_offset():
    fig = plotting.segment_map(SEGMENTS, title="after the free")
    assert isinstance(fig, Figure)
    bars = _bars(fig)
    assert len(bars) == 4
    assert [b.get_x() for b in bars[:3]] == [0, 4, 8]
    assert [b.get_width() for b in bars] == [4, 4, 12, 2]
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["large · 20 MiB", "small · 2 MiB"]
    assert ax.get_xlabel() == "offset in segment (MiB)"
    assert {t.get_text() for t in ax.texts} >= {"4 MiB", "12 MiB"}


def test_segment_map_rejects_inconsistent_segments():
    bad = [{"total_size": 20 * MiB, "pool": "large", "blocks": [{"size": 4 * MiB, "state": "active_allocated"}]}]
    with pytest.raises(ValueError, match="add up"):
        plotting.segment_map(bad)
    with pytest.raises(ValueError, match="unknown block state"):
        plotting.segment_map([{"total_size": 1, "pool": "small", "blocks": [{"size": 1, "state": "busy"}]}])


def test_memory_timeline_plots_mib_and_marks():
    fig = plotting.memory_timeline([0, 1, 2], {"allocated": [0, MiB, 0], "reserved": [0, 2 * MiB, 2 * MiB]},
                                   marks=[(2, "empty_cache()")])
    ax = fig.axes[0]
    assert [line.get_label() for line in ax.get_lines()[:2]] == ["allocated", "reserved"]
    assert list(ax.get_lines()[1].get_ydata()) == [0, 2, 2]
    assert ax.get_ylabel() == "memory (MiB)"
    assert any(t.get_text() == "empty_cache()" for t in ax.texts)
    with pytest.raises(ValueError, match="3 steps"):
        plotting.memory_timeline([0, 1, 2], {"x": [1]})


def test_stream_lanes_draws_intervals_per_lane():
    fig = plotting.stream_lanes({"host": [{"start_ms": 0, "end_ms": 0.1, "label": "enqueue"}],
                                 "producer": [{"start_ms": 0.2, "end_ms": 1.0, "label": "AG 1", "color": 1}],
                                 "consumer": [{"start_ms": 1.0, "end_ms": 3.0, "label": "fwd 1", "color": "#000000"}]},
                                marks=[(0.1, "del")])
    bars = _bars(fig)
    assert len(bars) == 3
    assert bars[2].get_x() == 1.0 and bars[2].get_width() == 2.0
    assert fig.axes[0].get_xlabel() == "time (ms)"
    with pytest.raises(ValueError, match="before it starts"):
        plotting.stream_lanes({"x": [{"start_ms": 2, "end_ms": 1}]})


def test_bars_need_a_unit_and_matching_lengths():
    fig = plotting.bars(["a", "b"], [1.0, 3.0], ylabel="peak active (MiB)", errors=[(0.5, 1.5), (2.0, 4.0)])
    assert [b.get_height() for b in _bars(fig)] == [1.0, 3.0]
    with pytest.raises(ValueError, match="unit"):
        plotting.bars(["a"], [1.0], ylabel="peak")
    with pytest.raises(ValueError, match="2 labels for 1 values"):
        plotting.bars(["a", "b"], [1.0], ylabel="x (ms)")


def test_stamp_writes_the_provenance():
    fig, _ = plotting.new_figure()
    plotting.stamp(fig, "Recorded on NVIDIA H200")
    assert fig.texts[-1].get_text() == "Recorded on NVIDIA H200"


def test_size_labels_keep_halves():
    from experiments.core.units import format_bytes

    assert [format_bytes(b, digits=3) for b in (18.5 * MiB, 20 * MiB, 1.5 * MiB, 1.902 * MiB, 100 * 1024, 512)] == [
        "18.5 MiB", "20 MiB", "1.5 MiB", "1.9 MiB", "100 KiB", "512 B"]
