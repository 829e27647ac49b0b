"""The static book's panels: every recorded point pre-rendered behind native, labelled controls."""
import json
import re

import pytest

import experiments as ex
from experiments import pinned, syncs
from experiments.core import store
from experiments.core.registry import get
from tests.booktools import executed_html


@pytest.fixture
def static(monkeypatch, recorded_mode):
    monkeypatch.setenv("CUDA_MEMLAB_STATIC", "1")


def _views(page_html):
    return [json.loads(html_unescape(m)) for m in re.findall(r'data-point="([^"]*)"', page_html)]


def html_unescape(s):
    import html

    return html.unescape(s)


@pytest.mark.slow
def test_static_panel_renders_each_recorded_point_once(built_book):
    # Chapter 4 makes this very call, and the book build (static explorers, recorded mode, as
    # `make book`) executed it: its output is read, not rendered a second time (every point,
    # two widths: 145 s of the run on a loaded 2-core machine).
    page = executed_html(built_book, "ch4_hidden_syncs", 'ex.panel("syncs.run_ahead", syncs.plot_run_ahead)')
    recorded = store.load("syncs.run_ahead", data_schema=get("syncs.run_ahead").data_schema)
    expected = sorted(json.dumps({"host_ms": p.params["host_ms"], "gpu_ms": p.params["gpu_ms"]}, sort_keys=True)
                      for p in recorded.points)
    assert sorted(json.dumps(v, sort_keys=True) for v in _views(page)) == expected
    # every view: the default figure, and a narrow one for phones chosen by the browser
    assert len(re.findall(r'<img (?:data-)?src="data:image/png;base64,', page)) == len(recorded.points)
    assert len(re.findall(r'<source media="\(max-width: [0-9.]+px\)" (?:data-)?srcset="data:image/png;base64,',
                          page)) == len(recorded.points)
    # exactly one view is visible at first: the default point; the hidden ones load when shown
    assert len(re.findall(r'class="memlab-view" data-point="[^"]*">', page)) == 1
    assert page.count('<img src="data:') == 1 and page.count('<img data-src="data:') == len(recorded.points) - 1
    assert not re.search(r"(src|href)=\"https?:", page) and "<script" not in page


@pytest.fixture(scope="module")
def async_copy_page():
    """Chapter 3's async-copy explorer as the static book renders it, made once for the tests
    that read it (six points, each at two widths)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUDA_MEMLAB_MODE", "recorded")
        mp.setenv("CUDA_MEMLAB_STATIC", "1")
        return ex.panel("pinned.async_copy", pinned.plot_async_copy, params=["size_kib", "direction"])._repr_html_()


def test_controls_are_native_and_labelled(static, async_copy_page):
    page = async_copy_page
    # size_kib: numbers -> a range over the recorded values, with a <label for=...>
    rid = re.search(r'<input type="range" id="([^"]+)"', page).group(1)
    assert f'<label for="{rid}"' in page
    values = json.loads(html_unescape(re.search(r'data-values="([^"]*)"', page).group(1)))
    recorded = store.load("pinned.async_copy", data_schema=get("pinned.async_copy").data_schema)
    assert values == recorded.param_values()["size_kib"]
    # direction: two choices -> radio buttons in a fieldset with a legend
    assert "<fieldset" in page and "<legend" in page and page.count('type="radio"') == 2


@pytest.mark.slow
def test_fixed_parameters_filter_the_points(built_book):
    # chapter 2 makes this very call: its output in the book build is read, not rendered again
    page = executed_html(built_book, "ch2_cross_stream",
                         'ex.panel("streams.pipeline", streams.plot_pipeline, params=["in_flight"], strategy="event")')
    recorded = store.load("streams.pipeline", data_schema=get("streams.pipeline").data_schema)
    exp = get("streams.pipeline")
    n = sum(1 for p in recorded.points if p.params == exp.complete({"strategy": "event", "in_flight": p.params["in_flight"]}))
    assert len(_views(page)) == n and n >= 2
    assert json.loads(html_unescape(re.search(r'data-fixed="([^"]*)"', page).group(1))) == {"strategy": "event"}


def test_without_the_static_flag_the_panel_is_ipywidgets(recorded_mode, monkeypatch):
    monkeypatch.delenv("CUDA_MEMLAB_STATIC", raising=False)
    import ipywidgets

    assert isinstance(ex.panel("syncs.run_ahead", syncs.plot_run_ahead), ipywidgets.VBox)


def _controls(page):
    return list(dict.fromkeys(re.findall(r'data-param="([^"]+)"', page)))


def test_a_parameter_recorded_at_one_value_is_held_not_offered(static):
    """Issue 19: the pipeline explorer offered layers and buffer_mib with one value each."""
    params = ["strategy", "consumer_ms", "host_delay_ms", "layers", "buffer_mib", "in_flight"]
    # what each view shows does not matter here: text is cheaper to render than figures
    page = ex.panel("streams.pipeline", lambda r: f"{r.params}", params=params)._repr_html_()
    recorded = store.load("streams.pipeline", data_schema=get("streams.pipeline").data_schema).param_values()
    single = [n for n in params if len(recorded[n]) == 1]
    assert single == ["layers", "buffer_mib"]  # what the lab recorded; the test needs such a parameter
    assert _controls(page) == [n for n in params if n not in single]
    fixed = json.loads(html_unescape(re.search(r'data-fixed="([^"]*)"', page).group(1)))
    assert {n: fixed[n] for n in single} == {n: recorded[n][0] for n in single}
    note = html_unescape(re.search(r'<p class="memlab-explorer-title">(.*?)</p>', page).group(1))
    for n in single:
        assert f"{n} = {recorded[n][0]:,}" in note


def test_every_view_has_alt_text_naming_its_figure_and_parameters(static, async_copy_page):
    page = async_copy_page
    title = get("pinned.async_copy").title
    views = re.findall(r'<figure class="memlab-view" data-point="([^"]*)"[^>]*>(.*?)</figure>', page, re.S)
    assert len(views) == 6
    for point, body in views:
        alt = html_unescape(re.search(r'<img [^>]*alt="([^"]*)"', body).group(1))
        assert alt.startswith(f"Figure of {title} (") and "data:" not in alt and ".png" not in alt
        for name, value in json.loads(html_unescape(point)).items():
            shown = f"{int(value):,}" if isinstance(value, (int, float)) and float(value).is_integer() else str(value)
            assert f"{name} = {shown}" in alt, (alt, name)
        assert "host to device" in alt or "device to host" in alt  # the figure's own title


def test_each_variant_carries_what_the_browser_test_measures(recorded_mode):
    from experiments.core import explorer, plotting

    fig = syncs.plot_queue_probe(ex.run("syncs.queue_probe"))
    out = explorer.figure_html(fig)
    source = re.search(r"<source ([^>]*)>", out).group(1)
    img = re.search(r"<img ([^>]*)>", out).group(1)
    for attrs, dpi, width_in in ((source, plotting.NARROW_DPI, plotting.NARROW_WIDTH), (img, plotting.WIDE_DPI, 6.0)):
        a = dict(re.findall(r'([\w-]+)="([^"]*)"', attrs))
        assert float(a["data-dpi"]) == dpi
        assert float(a["data-font-pt"]) >= plotting.MIN_FONT_PT
        assert json.loads(html_unescape(a["data-collisions"])) == []
        # bbox_inches="tight" trims or pads the figure by a fraction of an inch at most
        assert abs(int(a["width"]) - width_in * dpi) < 0.35 * dpi
    assert 'loading="lazy"' in img and html_unescape(re.search(r'alt="([^"]*)"', img).group(1)).startswith(
        "Figure of ")


def test_book_figures_survive_the_inline_backend_resetting_the_formatters(static):
    """While the book is built, a cell's Figure is shown as <picture> (text/html). The inline
    backend, when it starts or is set again, drops every Figure formatter but its PNG one:
    the book's must be back before the next cell runs."""
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.core.pylabtools import select_figure_formats
    from matplotlib.figure import Figure

    from experiments.core import explorer

    shell = InteractiveShell.instance()
    try:
        assert explorer.install_book_figures()
        html_formatter = shell.display_formatter.formatters["text/html"]
        assert html_formatter.type_printers.get(Figure) is explorer.figure_html
        select_figure_formats(shell, {"png"})  # what the inline backend does
        assert Figure not in html_formatter.type_printers
        shell.events.trigger("pre_run_cell", None)
        assert html_formatter.type_printers.get(Figure) is explorer.figure_html
    finally:
        InteractiveShell.clear_instance()
