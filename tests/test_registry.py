import pytest

from experiments.core import registry, store
from experiments.core.device import Provenance, has_cuda
from experiments.core.registry import Param

from .test_device import PROV


@pytest.fixture
def toy_experiment():
    """A throw-away experiment registered for one test, removed afterwards."""
    calls = []

    @registry.experiment("test.toy", chapter=1, title="toy",
                         params=[Param("size_mib", 64, min=1, max=1024, unit="MiB"),
                                 Param("strategy", "event", choices=("event", "record_stream"))],
                         grid={"size_mib": [16, 64], "strategy": ["event", "record_stream"]},
                         data_schema={"type": "object", "required": ["peak_mib"]})
    def toy(size_mib=64, strategy="event"):
        calls.append((size_mib, strategy))
        return {"peak_mib": size_mib * (2 if strategy == "event" else 32)}

    yield registry.get("test.toy")
    registry._REGISTRY.pop("test.toy", None)


@pytest.mark.parametrize("param, value, match", [
    (Param("layers", 32, min=1, max=64, unit="layers"), 0, r"layers must be an integer in \[1, 64\] layers, got 0"),
    (Param("layers", 32, min=1, max=64), 2.5, "layers must be an integer"),
    (Param("layers", 32, min=1, max=64), True, "layers must be an integer"),
    (Param("layers", 32, min=1, max=64), "8", "layers must be an integer"),
    (Param("buffer_mib", 64.0, min=0.5, max=4096, unit="MiB"), -1, r"buffer_mib must be a number in \[0.5, 4096\] MiB"),
    (Param("buffer_mib", 64.0, min=0.5), float("nan"), "buffer_mib"),
    (Param("order", "increasing", choices=("increasing", "decreasing")), "random", "one of 'increasing', 'decreasing'"),
    (Param("expandable", False), 1, "True or False"),
])
def test_param_rejects_bad_values_naming_parameter_and_range(param, value, match):
    with pytest.raises(ValueError, match=match):
        param.validate(value)


def test_param_accepts_and_normalises_good_values():
    assert Param("layers", 32, min=1, max=64).validate(8.0) == 8
    assert isinstance(Param("ms", 1.0, min=0).validate(3), float)
    assert Param("flag", False).validate(True) is True
    assert Param("n", 1, choices=(1, 2)).kind == "choice"
    with pytest.raises(ValueError):
        Param("n", 1, choices=(1, 2)).validate(True)


def test_param_default_must_be_valid():
    with pytest.raises(ValueError, match="layers"):
        Param("layers", 0, min=1, max=4)
    with pytest.raises(TypeError):
        Param("x", 1, choices=(1, 2), min=0)


def test_grid_expands_and_always_holds_the_default(toy_experiment):
    assert len(toy_experiment.grid) == 4
    assert toy_experiment.defaults in toy_experiment.grid

    @registry.experiment("test.partial", chapter=1, title="partial", params=[Param("n", 3, min=1, max=9)],
                         grid=[{"n": 1}, {"n": 9}])
    def partial(n=3):
        return {}

    try:
        assert [p["n"] for p in registry.get("test.partial").grid] == [3, 1, 9]
    finally:
        registry._REGISTRY.pop("test.partial")


def test_grid_points_outside_the_range_are_refused():
    with pytest.raises(ValueError, match="n must be"):
        @registry.experiment("test.badgrid", chapter=1, title="bad", params=[Param("n", 3, min=1, max=9)],
                             grid={"n": [3, 10]})
        def bad(n=3):
            return {}
    assert "test.badgrid" not in registry._REGISTRY


def test_complete_fills_defaults_and_rejects_unknown_names(toy_experiment):
    assert toy_experiment.complete({"size_mib": 16}) == {"size_mib": 16, "strategy": "event"}
    with pytest.raises(ValueError, match="has no parameter 'size'.*size_mib"):
        toy_experiment.complete({"size": 16})


def test_unknown_experiment_lists_known_ids():
    with pytest.raises(ValueError, match="core.sleep_clock"):
        registry.get("core.nope")


def test_resolve_mode(monkeypatch):
    monkeypatch.delenv("CUDA_MEMLAB_MODE", raising=False)
    assert registry.resolve_mode() == ("live" if has_cuda() else "recorded")
    assert registry.resolve_mode("recorded") == "recorded"
    monkeypatch.setenv("CUDA_MEMLAB_MODE", "recorded")
    assert registry.resolve_mode() == "recorded"
    with pytest.raises(ValueError, match="mode must be one of"):
        registry.resolve_mode("gpu")


def _record_toy(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_MEMLAB_RECORDED_DIR", str(tmp_path))
    points = [store.RecordedPoint(pt, {"peak_mib": pt["size_mib"] * 2.0}, 0.25)
              for pt in registry.get("test.toy").grid]
    store.save("test.toy", 1, Provenance.from_dict(PROV), points, root=tmp_path)


def test_run_in_recorded_mode_returns_the_recorded_point(toy_experiment, tmp_path, monkeypatch):
    _record_toy(tmp_path, monkeypatch)
    r = registry.run("test.toy", mode="recorded", size_mib=16)
    assert r.recorded and r.mode == "recorded"
    assert r["peak_mib"] == 32.0
    assert r.params == {"size_mib": 16, "strategy": "event"}
    assert r.caption().startswith("Recorded on NVIDIA H200")
    assert "Recorded on NVIDIA H200" in r._repr_html_()


def test_run_in_recorded_mode_lists_recorded_values_for_a_missing_point(toy_experiment, tmp_path, monkeypatch):
    _record_toy(tmp_path, monkeypatch)
    with pytest.raises(store.NotRecordedError, match=r"size_mib: \[16, 64\]"):
        registry.run("test.toy", mode="recorded", size_mib=32)


def test_run_validates_before_anything_else(toy_experiment):
    with pytest.raises(ValueError, match="size_mib must be"):
        registry.run("test.toy", mode="recorded", size_mib=-5)


@pytest.mark.skipif(has_cuda(), reason="checks the no-GPU path")
def test_live_mode_without_gpu_says_so(toy_experiment):
    from experiments.core.device import NoGPUError

    with pytest.raises(NoGPUError, match="test.toy"):
        registry.run("test.toy", mode="live")


@pytest.mark.skipif(has_cuda(), reason="checks the no-GPU path")
def test_status_text_without_gpu(monkeypatch):
    monkeypatch.delenv("CUDA_MEMLAB_MODE", raising=False)
    monkeypatch.delenv("COLAB_RELEASE_TAG", raising=False)
    assert registry.status_text().startswith("Recorded mode")
    monkeypatch.setenv("COLAB_RELEASE_TAG", "x")
    assert "Change runtime type" in registry.status_text()


def test_every_chapter_module_registers_experiments():
    chapters = {e.chapter for e in registry.all_experiments()}
    assert 0 in chapters
    for e in registry.all_experiments():
        assert e.id.split(".")[0] in {"core", "alloc", "streams", "pinned", "syncs"}, e.id
        assert e.doc, f"{e.id} needs a docstring with units"


@pytest.mark.gpu
def test_run_live_on_gpu_has_live_provenance():
    r = registry.run("core.three_clocks", mode="live", work_ms=5.0, repeats=3)
    assert r.mode == "live" and r.caption().startswith("Measured live on")
    assert r["cuda_events_ms"]["median"] == pytest.approx(5.0, rel=0.2)
    assert r["host_no_sync_ms"]["median"] < 1.0


def test_messages_suggest_near_misses_and_read_well():
    from experiments.core.text import close_names
    from experiments.core.units import number

    assert close_names("streams.pipelin", ["streams.pipeline", "streams.runahead"]) == " (did you mean 'streams.pipeline'?)"
    assert close_names("zzz", ["streams.pipeline"]) == ""
    assert [number(x) for x in (1024, 536870912.0, 0.5, 20.0)] == ["1024", "536,870,912", "0.5", "20"]
    with pytest.raises(ValueError, match=r"did you mean 'core.sleep_clock'"):
        registry.get("core.sleep_clok")
    with pytest.raises(ValueError, match=r"\[1, 536,870,912\] B"):
        Param("size_bytes", 1024, min=1, max=2**29, unit="B").validate(-1)


def _out_of_range(p):
    """A value the parameter's own rules reject: outside the choices, below min or above max."""
    if p.choices is not None:
        return "not-a-choice" if all(isinstance(c, str) for c in p.choices) else -12345
    if p.kind == "bool":
        return "yes"
    if p.min is not None:
        return p.min - 1
    return p.max + 1


@pytest.mark.parametrize("exp", [e for e in registry.all_experiments() if e.params], ids=lambda e: e.id)
def test_direct_calls_validate_like_run(exp):
    import sys

    func = getattr(sys.modules[exp.func.__module__], exp.func.__name__)
    p = next(q for q in exp.params if q.choices is not None or q.min is not None or q.max is not None or q.kind == "bool")
    with pytest.raises(ValueError, match=p.name):
        func(**{p.name: _out_of_range(p)})
    with pytest.raises(ValueError, match="has no parameter 'nonsense'"):
        func(nonsense=1)
