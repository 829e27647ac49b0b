"""The static book's panels: every recorded point pre-rendered behind native, labelled controls."""
import json
import re

import pytest

import experiments as ex
from experiments import pinned, syncs
from experiments.core import store
from experiments.core.registry import get


@pytest.fixture
def static(monkeypatch, recorded_mode):
    monkeypatch.setenv("CUDA_MEMLAB_STATIC", "1")


def _views(page_html):
    return [json.loads(html_unescape(m)) for m in re.findall(r'data-point="([^"]*)"', page_html)]


def html_unescape(s):
    import html

    return html.unescape(s)


def test_static_panel_renders_each_recorded_point_once(static):
    panel = ex.panel("syncs.run_ahead", syncs.plot_run_ahead)
    page = panel._repr_html_()
    recorded = store.load("syncs.run_ahead", data_schema=get("syncs.run_ahead").data_schema)
    expected = sorted(json.dumps({"host_ms": p.params["host_ms"], "gpu_ms": p.params["gpu_ms"]}, sort_keys=True)
                      for p in recorded.points)
    assert sorted(json.dumps(v, sort_keys=True) for v in _views(page)) == expected
    assert page.count("<img src=\"data:image/png;base64,") == len(recorded.points)
    # exactly one view is visible at first: the default point
    assert len(re.findall(r'class="memlab-view" data-point="[^"]*">', page)) == 1
    assert not re.search(r"(src|href)=\"https?:", page) and "<script" not in page


def test_controls_are_native_and_labelled(static):
    page = ex.panel("pinned.async_copy", pinned.plot_async_copy, params=["size_kib", "direction"])._repr_html_()
    # size_kib: numbers -> a range over the recorded values, with a <label for=...>
    rid = re.search(r'<input type="range" id="([^"]+)"', page).group(1)
    assert f'<label for="{rid}"' in page
    values = json.loads(html_unescape(re.search(r'data-values="([^"]*)"', page).group(1)))
    recorded = store.load("pinned.async_copy", data_schema=get("pinned.async_copy").data_schema)
    assert values == recorded.param_values()["size_kib"]
    # direction: two choices -> radio buttons in a fieldset with a legend
    assert "<fieldset" in page and "<legend" in page and page.count('type="radio"') == 2


def test_fixed_parameters_filter_the_points(static):
    page = ex.panel("streams.pipeline", __import__("experiments").streams.plot_pipeline, params=["in_flight"],
                    strategy="event")._repr_html_()
    recorded = store.load("streams.pipeline", data_schema=get("streams.pipeline").data_schema)
    exp = get("streams.pipeline")
    n = sum(1 for p in recorded.points if p.params == exp.complete({"strategy": "event", "in_flight": p.params["in_flight"]}))
    assert len(_views(page)) == n and n >= 2
    assert json.loads(html_unescape(re.search(r'data-fixed="([^"]*)"', page).group(1))) == {"strategy": "event"}


def test_without_the_static_flag_the_panel_is_ipywidgets(recorded_mode, monkeypatch):
    monkeypatch.delenv("CUDA_MEMLAB_STATIC", raising=False)
    import ipywidgets

    assert isinstance(ex.panel("syncs.run_ahead", syncs.plot_run_ahead), ipywidgets.VBox)
