import json
import subprocess
import sys

import pytest

from experiments.core import claims, registry, store, widgets


def test_panel_in_recorded_mode_offers_only_recorded_points(recorded_mode):
    import ipywidgets as w

    box = widgets.panel("core.three_clocks", lambda r: r["cuda_events_ms"]["median"], params=["work_ms"])
    assert isinstance(box, w.VBox)
    controls = box.children[1].children
    assert len(controls) == 1
    recorded = store.load("core.three_clocks").param_values()["work_ms"]
    assert [value for _, value in controls[0].options] == recorded
    assert [label for label, _ in controls[0].options] == ["5", "20", "50"]
    assert controls[0].value == 20.0
    out = box.children[-1]
    assert out.outputs, "the panel shows the default point when it is built"
    assert not any(isinstance(c, w.Button) for c in box.children), "no Run button without a GPU"
    controls[0].value = recorded[0]
    assert "5" in str(out.outputs[-1]["data"]["text/plain"])


def test_recorded_panel_moves_the_other_controls_to_a_recorded_point(recorded_mode):
    """Issue 19: in_flight was recorded for the event handoff only; choosing it with another
    strategy answered 'not recorded'. Now the other controls follow to the nearest recorded point."""
    names = ["strategy", "consumer_ms", "host_delay_ms", "in_flight"]
    box = widgets.panel("streams.pipeline", lambda r: repr(r.params), params=names)
    controls = dict(zip(names, box.children[1].children))
    out = box.children[-1]
    recorded = [p.params for p in store.load("streams.pipeline").points]

    def shown():
        return out.outputs[-1]["data"]["text/plain"]

    assert controls["strategy"].value == "record_stream" and controls["in_flight"].value == 1
    controls["in_flight"].value = 4
    values = {n: controls[n].value for n in names}
    assert values == {"strategy": "event", "consumer_ms": 10.0, "host_delay_ms": 0.0, "in_flight": 4}
    assert any(all(p[n] == v for n, v in values.items()) for p in recorded)
    assert "'in_flight': 4" in shown() and "not recorded" not in shown()
    controls["strategy"].value = "stall"
    assert controls["in_flight"].value == 1 and "'strategy': 'stall'" in shown()
    assert len(out.outputs) == 1


def test_nearest_recorded_point_changes_the_fewest_controls_then_the_least():
    points = [{"a": 1, "b": 1, "c": 1}, {"a": 2, "b": 1, "c": 3}, {"a": 2, "b": 3, "c": 1}, {"a": 2, "b": 3, "c": 3},
              {"a": 3, "b": 1, "c": 5}, {"a": 3, "b": 2, "c": 2}]
    options = {"a": [1, 2, 3], "b": [1, 2, 3], "c": [1, 2, 3, 4, 5]}
    assert widgets.nearest_recorded(points, {"a": 1, "b": 1, "c": 1}, "a", options) == points[0]  # recorded
    # not recorded: the fewest steps along the options ...
    assert widgets.nearest_recorded(points, {"a": 2, "b": 2, "c": 1}, "a", options) == points[2]
    assert widgets.nearest_recorded(points, {"a": 2, "b": 1, "c": 2}, "a", options) == points[1]
    assert widgets.nearest_recorded(points, {"a": 2, "b": 1, "c": 1}, "b", options) == points[0]
    # ... but first the fewest other controls moved: one by four steps, not two by one each
    assert widgets.nearest_recorded(points, {"a": 3, "b": 1, "c": 1}, "a", options) == points[4]
    a_value_never_recorded = {"a": 4, "b": 1, "c": 1}
    assert widgets.nearest_recorded(points, a_value_never_recorded, "a", options) is None


def test_panel_rejects_unknown_parameters(recorded_mode):
    with pytest.raises(ValueError, match="no parameter 'size'"):
        widgets.panel("core.three_clocks", str, params=["size"])


@pytest.fixture
def toy_claims(tmp_path, monkeypatch):
    from experiments.core.device import Provenance

    from .test_device import PROV

    @registry.experiment("test.claimed", chapter=2, title="claimed")
    def claimed():
        return {"peak_mib": 128.0}

    @claims.claim("test.bounded", chapter=2, statement="peak stays at two buffers", experiment="test.claimed",
                  source="https://example.invalid/post")
    def bounded(data):
        return data["peak_mib"] <= 128, {"peak_mib": data["peak_mib"]}

    @claims.claim("test.unmeasured", chapter=2, statement="needs a recording", experiment="test.missing",
                  source="https://example.invalid/post")
    def unmeasured(data):
        return True, {}

    monkeypatch.setenv("CUDA_MEMLAB_RECORDED_DIR", str(tmp_path))
    store.save("test.claimed", 2, Provenance.from_dict(PROV), [store.RecordedPoint({}, {"peak_mib": 128.0}, 0.1)],
               root=tmp_path)
    yield
    registry._REGISTRY.pop("test.claimed", None)
    claims._CLAIMS.pop("test.bounded", None)
    claims._CLAIMS.pop("test.unmeasured", None)


def test_claims_are_evaluated_on_recorded_data(toy_claims):
    r = claims.evaluate(claims.get_claim("test.bounded"), mode="recorded")
    assert r.holds is True and r.measured == {"peak_mib": 128.0}
    assert r.provenance["gpu_name"] == "NVIDIA H200" and r.mode == "recorded"
    assert set(r.to_json()) >= {"id", "chapter", "statement", "measured", "holds", "provenance"}
    missing = claims.evaluate(claims.get_claim("test.unmeasured"), mode="recorded")
    assert missing.holds is None and "test.missing" in missing.error
    table = claims.ClaimsTable([r, missing])
    assert "holds" in str(table) and "not measured" in str(table)
    assert "<table" in table._repr_html_() and "example.invalid" in table._repr_html_()


def test_claim_ids_are_unique(toy_claims):
    with pytest.raises(ValueError, match="registered twice"):
        @claims.claim("test.bounded", chapter=2, statement="x", experiment="test.claimed", source="s")
        def other(data):
            return True, {}


def test_cli_claims_json_has_the_documented_keys():
    out = subprocess.run([sys.executable, "-m", "experiments", "claims", "--recorded", "--json"],
                         capture_output=True, text=True, check=True).stdout
    results = json.loads(out)
    assert isinstance(results, list)
    ids = [c.id for c in claims.all_claims()]
    assert [r["id"] for r in results] == ids
    for r in results:
        assert {"id", "chapter", "statement", "measured", "holds", "provenance"} <= set(r)
        assert r["holds"] in (True, False, None)


@pytest.mark.slow  # three fresh CLI processes (6 s): make test runs it, the developer loop does not
def test_cli_list_and_record_without_gpu():
    out = subprocess.run([sys.executable, "-m", "experiments", "list"], capture_output=True, text=True, check=True)
    assert "core.sleep_clock" in out.stdout and "nvidia-h200" in out.stdout
    from experiments.core.device import has_cuda

    if not has_cuda():
        rec = subprocess.run([sys.executable, "-m", "experiments", "record", "--chapter", "0"],
                             capture_output=True, text=True)
        assert rec.returncode == 2 and "needs a CUDA GPU" in rec.stderr
    bad = subprocess.run([sys.executable, "-m", "experiments", "record", "--experiment", "core.nope"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown experiment" in bad.stderr


def test_claims_table_summarises(toy_claims):
    good = claims.evaluate(claims.get_claim("test.bounded"), mode="recorded")
    missing = claims.evaluate(claims.get_claim("test.unmeasured"), mode="recorded")
    table = claims.ClaimsTable([good, missing])
    assert table.summary() == "1 of 2 claims hold; 1 not measured."
    assert str(table).startswith("1 of 2 claims hold")
    assert "recorded · NVIDIA H200 · torch 2.11.0+cu130 · 2026-11-30" in table._repr_html_()
