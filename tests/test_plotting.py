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


# ----------------------------------------------------------------------------- issue 19: layouts, collisions

def test_the_narrow_layout_stacks_side_by_side_panels_at_the_phone_width():
    with plotting.narrow():
        fig, (left, right) = plotting.new_figure(1, 2, width=10.0, height=3.0, gridspec_kw={"width_ratios": [3, 2]})
    assert tuple(fig.get_size_inches()) == (plotting.NARROW_WIDTH, 6.0)
    assert fig.dpi == plotting.NARROW_DPI
    fig.draw_without_rendering()
    a, b = left.get_position(), right.get_position()
    assert b.y1 <= a.y0 and abs(a.x0 - b.x0) < 0.05  # one column: the second panel under the first
    wide, _ = plotting.new_figure(1, 2, width=10.0, height=3.0)
    assert tuple(wide.get_size_inches()) == (plotting.MAX_WIDTH, 3.0) and wide.dpi == plotting.WIDE_DPI


def test_a_figure_function_redraws_its_figure_in_the_other_layout():
    calls = []

    @plotting.figure_function
    def draw(n, *, title):
        calls.append(plotting.is_narrow())
        fig, ax = plotting.new_figure()
        ax.set_title(title)
        ax.plot(range(n))
        return fig

    fig = draw(3, title="t")
    small = plotting.redraw(fig, narrow_layout=True)
    assert calls == [False, True]
    assert small.get_size_inches()[0] == plotting.NARROW_WIDTH and small.axes[0].get_title() == "t"
    assert plotting.redraw(plotting.new_figure()[0], narrow_layout=True) is None  # no recorded call


def test_text_collisions_find_overlapping_texts_and_a_legend_over_a_title():
    fig, ax = plotting.new_figure(width=4.0, height=2.0)
    ax.text(0.5, 0.5, "first label")
    ax.text(0.52, 0.5, "second label")
    assert any("overlaps" in p for p in plotting.text_collisions(fig))
    # the doctor figure's defect: a legend placed above the axes, where its title is
    fig, ax = plotting.new_figure(width=4.0, height=2.0)
    ax.plot([0, 1], [0, 1], label="a line with a long name")
    ax.set_title("the panel's title")
    ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0))
    assert "the legend covers text \"the panel's title\"" in plotting.text_collisions(fig)


def test_text_collisions_find_a_label_across_bars_and_a_line_through_a_legend():
    # the ring-buffer figure's defect: a line's label printed on the bars
    fig, ax = plotting.new_figure(width=4.0, height=2.0)
    ax.bar(["a", "b"], [3.0, 3.0])
    ax.axhline(2.9, linestyle=":")
    ax.annotate("mean GPU work per batch", (0.5, 2.9), xycoords=("axes fraction", "data"), ha="center", va="top")
    assert plotting.text_collisions(fig) == ["text 'mean GPU work per batch' is printed across a bar"]
    # a bar's own label inside it is fine
    fig, ax = plotting.new_figure(width=4.0, height=2.0)
    ax.barh([0], [10.0])
    ax.text(5.0, 0, "10 MiB", ha="center", va="center")
    assert plotting.text_collisions(fig) == []
    fig, ax = plotting.new_figure(width=4.0, height=2.0)
    ax.plot([0, 1], [1, 0], label="falling")
    ax.legend(loc="upper left")
    assert plotting.text_collisions(fig) == ["a data line 'falling' runs through the legend's text"]


def test_rotated_tick_labels_are_compared_as_rotated_boxes():
    fig, ax = plotting.new_figure(width=4.0, height=2.5)
    ax.set_yticks([])
    ax.set_xticks(range(6))
    ax.set_xticklabels([f"a long tick label {k}" for k in range(6)], rotation=45, ha="right")
    assert plotting.text_collisions(fig) == []  # their upright boxes overlap, the labels do not
    ax.set_xticklabels([f"a long tick label {k}" for k in range(6)], rotation=10, ha="right")
    assert any("overlaps" in p for p in plotting.text_collisions(fig))


def test_smallest_font_is_measured_on_the_drawn_figure():
    fig, ax = plotting.new_figure()
    ax.set_title("title", fontsize=12)
    ax.set_xticks([0, 1])
    ax.tick_params(labelsize=7.5)
    assert plotting.smallest_font_pt(fig) == 7.5


def test_segment_map_legend_lists_only_the_states_its_blocks_are_in():
    """Issue 19: chapter 1's maps listed 'freed, waiting on an event', a state none of its blocks is in."""
    fig = plotting.segment_map([{"total_size": 4 * MiB, "pool": "large", "blocks": [
        {"size": 2 * MiB, "state": "active_allocated"}, {"size": 2 * MiB, "state": "inactive"}]}])
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["allocated", "free (cached)"]
    assert plotting.text_collisions(fig) == []
    fig = plotting.segment_map(SEGMENTS, title="after the free")
    assert len(fig.axes[0].get_legend().get_texts()) == 3 and plotting.text_collisions(fig) == []


def test_stream_lanes_label_only_boxes_wide_enough_for_their_label():
    fig = plotting.stream_lanes({"GPU": [{"start_ms": 0, "end_ms": 10, "label": "a wide box"},
                                         {"start_ms": 10, "end_ms": 10.2, "label": "a box too narrow for this"}]})
    assert [t.get_text() for t in fig.axes[0].texts] == ["a wide box"]
    assert plotting.text_collisions(fig) == []


def _two_panel_figure() -> Figure:
    fig = Figure(figsize=(6, 2.5), dpi=120, layout="constrained")
    for i, ax in enumerate(fig.subplots(1, 2)):
        ax.plot([0, 1, 2], [i, 2, 1], label="reserved")
        ax.set_title(f"panel {i}")
        ax.legend()
    return fig


def test_the_rgba_save_holds_the_pngs_pixels_and_says_its_size():
    """The static book's figures skip the PNG round trip: ``format="rgba"`` must give the very
    pixels of the PNG (lossless), at the size the tight box gave it. A second save of one figure
    can differ from the first (a tight box is not idempotent), so each save gets a fresh figure."""
    import io

    from PIL import Image

    png, by_png = plotting.save_measured(_two_panel_figure())
    raw, by_raw = plotting.save_measured(_two_panel_figure(), format="rgba")
    decoded = Image.open(io.BytesIO(png))
    assert by_raw["size_px"] == by_png["size_px"] == decoded.size
    width, height = decoded.size
    assert len(raw) == 4 * width * height
    assert Image.frombuffer("RGBA", decoded.size, raw, "raw", "RGBA", 0, 1).tobytes() == decoded.convert("RGBA").tobytes()
    assert by_raw["font_pt"] == by_png["font_pt"] and by_raw["collisions"] == by_png["collisions"]


def test_an_unknown_save_format_is_refused_by_name():
    with pytest.raises(ValueError, match="format must be 'png' or 'rgba', got 'svg'"):
        plotting.save_measured(_two_panel_figure(), format="svg")


def test_a_save_measures_the_figure_once_in_the_draw_it_saves(monkeypatch):
    """A constrained-layout figure is drawn twice per save (laid out with drawing stubbed out,
    then drawn): the text is measured in the second only, at the tight box's size."""
    import io

    from PIL import Image

    from experiments.core import figure_text

    sizes = []
    real = figure_text._collisions

    def counted(fig, renderer):
        sizes.append((int(renderer.width), int(renderer.height)))
        return real(fig, renderer)

    monkeypatch.setattr(figure_text, "_collisions", counted)
    fig = _two_panel_figure()
    full = (round(fig.get_figwidth() * fig.dpi), round(fig.get_figheight() * fig.dpi))
    png, measured = plotting.save_measured(fig)
    assert sizes == [Image.open(io.BytesIO(png)).size] == [measured["size_px"]]
    assert sizes[0] != full      # the tight box, not the figure's own size
