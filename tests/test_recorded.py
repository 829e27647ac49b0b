"""The recorded results the book renders: complete, valid, from the lab GPU, and the claims hold."""
import pytest

from experiments.core import claims, registry, store

LAB_GPU = "nvidia-h200"


def test_no_stray_files_in_recorded():
    for path in store.PACKAGE_RECORDED_DIR.rglob("*"):
        if path.is_file():
            assert path.suffix == ".json" and not path.name.startswith("."), f"stray file {path}"
            assert path.parent.name in {e.id for e in registry.all_experiments()}, f"no experiment for {path}"


@pytest.mark.parametrize("exp", registry.all_experiments(), ids=lambda e: e.id)
def test_every_experiment_is_recorded_on_the_lab_gpu_over_its_whole_grid(exp, monkeypatch):
    monkeypatch.delenv("CUDA_MEMLAB_RECORDED_DIR", raising=False)
    rec = store.load(exp.id, LAB_GPU, data_schema=exp.data_schema)
    assert rec.provenance.gpu_name == "NVIDIA H200"
    assert rec.chapter == exp.chapter
    missing = [pt for pt in exp.grid if rec.find(pt) is None]
    assert not missing, f"{exp.id}: grid points not recorded (run `python -m experiments record --experiment {exp.id}` on a GPU): {missing}"
    assert rec.provenance.git_commit != "unknown"


@pytest.mark.parametrize("c", claims.all_claims(), ids=lambda c: c.id)
def test_claims_hold_on_the_lab_recording(c, monkeypatch):
    monkeypatch.delenv("CUDA_MEMLAB_RECORDED_DIR", raising=False)
    r = claims.evaluate(c, mode="recorded")
    assert r.holds is True, f"{c.id}: {r.error or claims.format_measured(r.measured)}"
