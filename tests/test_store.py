import json
import os

import numpy as np
import pytest
import torch

from experiments.core import store
from experiments.core.device import Provenance
from experiments.core.store import NotRecordedError, RecordedFileError, RecordedPoint

from .test_device import PROV

SCHEMA = {"type": "object", "required": ["peak_mib"], "properties": {"peak_mib": {"type": "number"}}}


def prov(**over):
    return Provenance.from_dict({**PROV, **over})


def test_to_jsonable_reduces_scalars_and_containers():
    out = store.to_jsonable({"a": (1, 2), "b": np.int64(3), "c": np.float32(0.5), "d": torch.tensor(7),
                             "e": float("nan"), "f": np.arange(3), 4: True})
    assert out == {"a": [1, 2], "b": 3, "c": 0.5, "d": 7, "e": None, "f": [0, 1, 2], "4": True}
    assert isinstance(out["b"], int)
    json.dumps(out, allow_nan=False)


def test_to_jsonable_refuses_tensors_and_objects():
    with pytest.raises(TypeError, match="Tensor"):
        store.to_jsonable({"x": torch.ones(3)})
    with pytest.raises(TypeError):
        store.to_jsonable(object())


def test_params_key_is_order_independent():
    assert store.params_key({"a": 1, "b": "x"}) == store.params_key({"b": "x", "a": 1})
    assert store.params_key({"a": 1}) != store.params_key({"a": 2})


def test_save_then_load_round_trips(tmp_path):
    pts = [RecordedPoint({"n": 1}, {"peak_mib": 64.0}, 0.5), RecordedPoint({"n": 2}, {"peak_mib": 128.0}, 0.7)]
    path = store.save("test.thing", 2, prov(), pts, data_schema=SCHEMA, root=tmp_path)
    assert path == tmp_path / "test.thing" / "nvidia-h200.json"
    rec = store.load("test.thing", root=tmp_path, data_schema=SCHEMA)
    assert rec.chapter == 2 and rec.provenance == prov()
    assert rec.find({"n": 2}).data == {"peak_mib": 128.0}
    assert rec.find({"n": 3}) is None
    assert rec.param_values() == {"n": [1, 2]}
    assert [p.name for p in (tmp_path / "test.thing").iterdir()] == ["nvidia-h200.json"]


def test_save_refuses_data_that_breaks_the_schema_and_writes_nothing(tmp_path):
    with pytest.raises(RecordedFileError, match="peak_mib"):
        store.save("test.thing", 2, prov(), [RecordedPoint({}, {"peak": 1}, 0.1)], data_schema=SCHEMA, root=tmp_path)
    assert not (tmp_path / "test.thing" / "nvidia-h200.json").exists()


def test_interrupted_write_leaves_no_file_behind(tmp_path, monkeypatch):
    def fail(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError):
        store.save("test.thing", 1, prov(), [RecordedPoint({}, {"peak_mib": 1}, 0.1)], root=tmp_path)
    assert list((tmp_path / "test.thing").iterdir()) == []


def test_an_old_file_survives_a_failed_rewrite(tmp_path, monkeypatch):
    store.save("test.thing", 1, prov(), [RecordedPoint({}, {"peak_mib": 1}, 0.1)], root=tmp_path)
    monkeypatch.setattr(os, "replace", lambda s, d: (_ for _ in ()).throw(OSError("interrupted")))
    with pytest.raises(OSError):
        store.save("test.thing", 1, prov(), [RecordedPoint({}, {"peak_mib": 2}, 0.1)], root=tmp_path)
    assert store.load("test.thing", root=tmp_path).points[0].data == {"peak_mib": 1}


@pytest.mark.parametrize("corrupt, match", [
    (lambda d: d.pop("provenance"), "provenance"),
    (lambda d: d["provenance"].pop("driver"), "driver"),
    (lambda d: d.update(format=2), "format"),
    (lambda d: d.update(points=[]), "points"),
    (lambda d: d["points"][0].update(elapsed_s=-1), "elapsed_s"),
    (lambda d: d["provenance"].update(date="yesterday"), "date"),
    (lambda d: d["points"][0]["data"].update(peak_mib="a lot"), "peak_mib"),
    (lambda d: d.update(extra=1), "extra"),
])
def test_load_rejects_corrupt_files(tmp_path, corrupt, match):
    path = store.save("test.thing", 1, prov(), [RecordedPoint({}, {"peak_mib": 1.0}, 0.1)], root=tmp_path)
    doc = json.loads(path.read_text())
    corrupt(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(RecordedFileError, match=match):
        store.load("test.thing", root=tmp_path, data_schema=SCHEMA)


def test_load_rejects_broken_json(tmp_path):
    path = tmp_path / "test.thing" / "nvidia-h200.json"
    path.parent.mkdir()
    path.write_text('{"format": 1, "experi')
    with pytest.raises(RecordedFileError, match="not readable JSON"):
        store.load("test.thing", root=tmp_path)


def test_load_prefers_the_lab_gpu_then_the_newest(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_MEMLAB_GPU", raising=False)
    pt = [RecordedPoint({}, {"peak_mib": 1}, 0.1)]
    store.save("test.thing", 1, prov(gpu_name="Tesla T4", date="2026-11-01T00:00:00+00:00"), pt, root=tmp_path)
    store.save("test.thing", 1, prov(gpu_name="NVIDIA L4", date="2026-11-02T00:00:00+00:00"), pt, root=tmp_path)
    assert store.load("test.thing", root=tmp_path).provenance.gpu_name == "NVIDIA L4"
    store.save("test.thing", 1, prov(date="2026-10-01T00:00:00+00:00"), pt, root=tmp_path)
    assert store.load("test.thing", root=tmp_path).provenance.gpu_name == "NVIDIA H200"
    monkeypatch.setenv("CUDA_MEMLAB_GPU", "Tesla T4")
    assert store.load("test.thing", root=tmp_path).provenance.gpu_name == "Tesla T4"
    assert store.recorded_gpus("test.thing", root=tmp_path) == ["nvidia-h200", "nvidia-l4", "tesla-t4"]
    monkeypatch.setenv("CUDA_MEMLAB_GPU", "NVIDIA A100")
    with pytest.raises(NotRecordedError, match="recorded GPUs"):
        store.load("test.thing", root=tmp_path)


def test_missing_experiment_says_how_to_record(tmp_path):
    with pytest.raises(NotRecordedError, match="python -m experiments record --experiment test.none"):
        store.load("test.none", root=tmp_path)


def test_recorded_dir_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_MEMLAB_RECORDED_DIR", str(tmp_path))
    assert store.recorded_dir() == tmp_path
    monkeypatch.delenv("CUDA_MEMLAB_RECORDED_DIR")
    assert store.recorded_dir() == store.PACKAGE_RECORDED_DIR
