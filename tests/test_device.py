import pytest

from experiments.core import device
from experiments.core.device import NoGPUError, Provenance, gpu_slug

PROV = dict(gpu_name="NVIDIA H200", compute_capability="9.0", total_memory_bytes=150109880320,
            driver="580.159.04", cuda="13.0", torch="2.11.0+cu130", python="3.12.3",
            date="2026-11-30T09:11:53+00:00", git_commit="c6e7a5c1234567")


def test_gpu_slug_names_files_by_gpu():
    assert gpu_slug("NVIDIA H200") == "nvidia-h200"
    assert gpu_slug("Tesla T4") == "tesla-t4"
    assert gpu_slug("NVIDIA A100-SXM4-40GB") == "nvidia-a100-sxm4-40gb"
    assert gpu_slug("  ") == "unknown-gpu"


def test_provenance_round_trip_and_summary():
    p = Provenance.from_dict(PROV)
    assert p.to_dict() == PROV
    assert p.gpu_slug == "nvidia-h200"
    assert p.day == "2026-11-30"
    s = p.summary()
    for part in ("NVIDIA H200", "sm_90", "139.8 GiB", "driver 580.159.04", "CUDA 13.0", "torch 2.11.0+cu130",
                 "2026-11-30", "c6e7a5c123"):
        assert part in s


def test_provenance_rejects_missing_fields():
    bad = dict(PROV)
    del bad["driver"]
    with pytest.raises(ValueError, match="driver"):
        Provenance.from_dict(bad)


@pytest.mark.skipif(device.has_cuda(), reason="checks the no-GPU path")
def test_require_cuda_explains_how_to_get_a_gpu(monkeypatch):
    monkeypatch.delenv("COLAB_RELEASE_TAG", raising=False)
    monkeypatch.delenv("COLAB_GPU", raising=False)
    with pytest.raises(NoGPUError, match="recorded"):
        device.require_cuda("the race")
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab-20261101")
    with pytest.raises(NoGPUError, match="Change runtime type"):
        device.require_cuda("the race")


@pytest.mark.skipif(device.has_cuda(), reason="checks the no-GPU path")
def test_check_fits_needs_a_gpu():
    with pytest.raises(NoGPUError):
        device.check_fits("buffer_mib", 2**20)


def test_git_commit_prefers_the_environment(monkeypatch):
    monkeypatch.setenv("CUDA_MEMLAB_GIT_COMMIT", "abc123")
    assert device.git_commit() == "abc123"
    monkeypatch.delenv("CUDA_MEMLAB_GIT_COMMIT")
    commit = device.git_commit()
    assert commit == "unknown" or len(commit.split("-")[0]) == 40


def test_torch_version_is_major_minor():
    major, minor = device.torch_version()
    assert major >= 2 and minor >= 0


@pytest.mark.gpu
def test_collect_provenance_on_gpu():
    p = device.collect_provenance()
    assert p.total_memory_bytes > 2**30
    assert p.cuda not in ("", "None")
    assert p.driver != ""
    assert "." in p.compute_capability


@pytest.mark.gpu
def test_check_fits_rejects_more_than_the_device():
    with pytest.raises(ValueError, match="buffer_mib"):
        device.check_fits("buffer_mib", device.total_memory_bytes() * 2)
    device.check_fits("buffer_mib", 2**20)
