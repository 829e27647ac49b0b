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


# ----------------------------------------------------------------------------- torch on first use

def _fresh(code: str) -> dict:
    """Run ``code`` in a fresh interpreter (torch not yet imported); it prints one JSON line."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_without_gpu_device_files_has_cuda_says_no_without_importing_torch(tmp_path):
    """On Linux a CUDA (or ROCm) GPU is reached through a device file; with none of them there
    is no GPU to find and torch is not imported to say so. With one (here a stand-in file),
    torch is imported and asked, as before."""
    import sys

    if sys.platform != "linux":
        pytest.skip("the device files are Linux's")
    there = tmp_path / "nvidiactl"
    there.write_text("")
    probe = ("import json, sys\nfrom experiments.core import device\n"
             "device.GPU_DEVICE_FILES = {files!r}\n"
             "print(json.dumps([device.has_cuda(), 'torch' in sys.modules]))")
    assert _fresh(probe.format(files=(str(tmp_path / "none-here"),))) == [False, False]
    has, loaded = _fresh(probe.format(files=(str(tmp_path / "none-here"), str(there))))
    assert loaded is True
    import torch

    assert has == torch.cuda.is_available()


def test_once_torch_is_imported_has_cuda_asks_it(monkeypatch):
    """A test (or a reader) that patched torch is heard, whatever the device files say."""
    import torch

    monkeypatch.setattr(device, "GPU_DEVICE_FILES", ())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert device.has_cuda() is True


def test_the_chapters_import_and_show_recorded_results_without_torch():
    """What a graded notebook does without a GPU: import the four chapters, show the status and
    a recorded result. None of it needs torch; the first use of torch imports it, and every
    module of the package that held the stand-in then holds torch itself."""
    import os

    if any(os.path.exists(f) for f in device.GPU_DEVICE_FILES):
        pytest.skip("a GPU's device file is here: status() asks torch")
    got = _fresh(
        "import json, sys, io, contextlib\nimport experiments as ex\n"
        "from experiments import allocator, streams, pinned, syncs\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n    ex.status()\n"
        "allocator.request_table_html(ex.run('alloc.request_table'))\n"
        "before = 'torch' in sys.modules\n"
        "from experiments.core import device, lazy_torch, measure\nfrom experiments.syncs import case\n"
        "stand_in = [type(m.torch).__name__ for m in (device, measure, case)]\n"
        "version = device.torch_version()\n"
        "import torch\n"
        "print(json.dumps([before, stand_in, [m.torch is torch for m in (device, measure, case, lazy_torch)],"
        " list(version), lazy_torch.load() is torch, repr(lazy_torch._STAND_IN) == repr(torch)]))")
    before, stand_in, bound, version, loaded, same_repr = got
    assert before is False
    assert stand_in == ["_TorchOnFirstUse"] * 3
    assert bound == [True] * 4
    import torch

    assert tuple(version) == tuple(int(x) for x in torch.__version__.split(".")[:2])
    assert loaded and same_repr


def test_a_patch_set_through_the_stand_in_lands_on_torch():
    got = _fresh(
        "import json\nfrom experiments.core.lazy_torch import torch as stand_in\n"
        "stand_in.memlab_marker = 7\nimport torch\nok = torch.memlab_marker == 7\n"
        "del stand_in.memlab_marker\nprint(json.dumps([ok, hasattr(torch, 'memlab_marker')]))")
    assert got == [True, False]
