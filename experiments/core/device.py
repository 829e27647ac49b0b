"""The GPU this process sees, and the provenance record attached to every result.

A provenance record says where a number was measured: GPU name, compute capability,
total memory, driver, CUDA and torch versions, Python, date and git commit. Recorded
results carry the record of the run that produced them; live results carry the
reader's own.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import functools
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from .lazy_torch import torch
from .units import memory_fraction

COLAB_SWITCH_HINT = (
    "In Colab: Runtime > Change runtime type > Hardware accelerator: a GPU (T4 is free), "
    "then Runtime > Restart session and run the page again."
)


class NoGPUError(RuntimeError):
    """Raised when live work needs a CUDA GPU and none is visible."""


# A CUDA GPU (or a ROCm one, which torch.cuda also drives) is reached on Linux through one of
# these device files: NVIDIA's control device, WSL 2's GPU paravirtualisation, AMD's compute driver.
GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/dxg", "/dev/kfd")


def has_cuda() -> bool:
    """True when torch sees at least one CUDA device (never initialises CUDA otherwise).

    On Linux with none of :data:`GPU_DEVICE_FILES`, the answer is no without importing torch
    (about 2 s of CPU that a page of recorded results or a graded notebook need not pay);
    once torch is imported, torch is asked (so a test that patches it is heard).
    """
    if "torch" not in sys.modules and sys.platform.startswith("linux") and not any(
            os.path.exists(f) for f in GPU_DEVICE_FILES):
        return False
    try:
        return bool(torch.cuda.is_available())
    except Exception:  # a broken driver install must read as "no GPU", not crash a page
        return False


def in_colab() -> bool:
    """True inside a Google Colab runtime."""
    return "COLAB_RELEASE_TAG" in os.environ or "COLAB_GPU" in os.environ


def require_cuda(what: str = "this experiment") -> None:
    """Raise :class:`NoGPUError` with instructions when no CUDA GPU is visible.

    Args:
        what: what needs the GPU, for the message.
    """
    if has_cuda():
        return
    hint = COLAB_SWITCH_HINT if in_colab() else (
        "Run it on a machine with an NVIDIA GPU and a CUDA build of torch, or read the "
        "results recorded on the lab GPU (the default without a GPU)."
    )
    raise NoGPUError(f"{what} needs a CUDA GPU and torch sees none. {hint}")


def total_memory_bytes(device: int = 0) -> int:
    """Total memory of CUDA device ``device`` in bytes. Raises :class:`NoGPUError`."""
    require_cuda("reading the device's memory size")
    return int(torch.cuda.get_device_properties(device).total_memory)


def cap_memory(cap_bytes: float) -> int:
    """Cap this process's caching allocator at ``cap_bytes`` of the current device
    (``torch.cuda.set_per_process_memory_fraction`` of :func:`~experiments.core.units.memory_fraction`;
    call it with nothing reserved). Returns the cap the allocator enforces, in bytes
    (the fraction times the device's memory, as it computes it)."""
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    fraction = memory_fraction(cap_bytes, total)
    torch.cuda.set_per_process_memory_fraction(fraction)
    return int(fraction * total)


def check_fits(name: str, nbytes: int, *, fraction: float = 0.8, device: int = 0) -> None:
    """Reject a size that the device cannot hold.

    Args:
        name: the parameter's name, used in the message.
        nbytes: bytes the experiment will keep live at once.
        fraction: share of the device's total memory the experiment may use.

    Raises:
        ValueError: naming ``name`` and the allowed range in MiB.
    """
    if nbytes < 0:
        raise ValueError(f"{name} must be >= 0 bytes, got {nbytes}")
    total = total_memory_bytes(device)
    allowed = int(total * fraction)
    if nbytes > allowed:
        raise ValueError(
            f"{name} needs {nbytes / 2**20:.0f} MiB but this GPU allows at most "
            f"{allowed / 2**20:.0f} MiB ({fraction:.0%} of {total / 2**30:.1f} GiB); "
            f"choose a smaller {name}"
        )


@functools.lru_cache(maxsize=1)
def _driver_version() -> str:
    """NVIDIA driver version via NVML, else nvidia-smi, else 'unknown' (read once per process)."""
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:
        pass
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run(
                [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=20, check=True,
            ).stdout.strip().splitlines()
            if out:
                return out[0].strip()
        except Exception:
            pass
    return "unknown"


def git_commit() -> str:
    """The commit the code came from.

    ``CUDA_MEMLAB_GIT_COMMIT`` wins (the device copy of the tree has no ``.git``);
    else ``git rev-parse HEAD`` next to the package, marked ``-dirty`` when the tree
    has changes; else 'unknown'.
    """
    env = os.environ.get("CUDA_MEMLAB_GIT_COMMIT")
    if env:
        return env
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists() or not shutil.which("git"):
        return "unknown"
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"],
                              capture_output=True, text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "experiments"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
        return head + ("-dirty" if dirty else "")
    except Exception:
        return "unknown"


@dataclasses.dataclass(frozen=True)
class Provenance:
    """Where and when a result was measured.

    ``total_memory_bytes`` is in bytes; ``date`` is ISO 8601 UTC.
    """

    gpu_name: str
    compute_capability: str
    total_memory_bytes: int
    driver: str
    cuda: str
    torch: str
    python: str
    date: str
    git_commit: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Provenance":
        names = {f.name for f in dataclasses.fields(cls)}
        missing = names - set(d)
        if missing:
            raise ValueError(f"provenance lacks {sorted(missing)}")
        return cls(**{k: d[k] for k in names})

    @property
    def gpu_slug(self) -> str:
        """File-name form of the GPU name, e.g. 'nvidia-h200'."""
        return gpu_slug(self.gpu_name)

    @property
    def day(self) -> str:
        return self.date[:10]

    def summary(self) -> str:
        """One line: GPU, memory, driver, CUDA, torch, date, commit."""
        commit = self.git_commit[:10] if self.git_commit != "unknown" else "unknown"
        return (
            f"{self.gpu_name} (sm_{self.compute_capability.replace('.', '')}, "
            f"{self.total_memory_bytes / 2**30:.1f} GiB), driver {self.driver}, "
            f"CUDA {self.cuda}, torch {self.torch}, Python {self.python}, "
            f"{self.day}, commit {commit}"
        )


def gpu_slug(name: str) -> str:
    """'NVIDIA H200' -> 'nvidia-h200'; 'Tesla T4' -> 'tesla-t4'."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return slug or "unknown-gpu"


def collect_provenance(device: int = 0) -> Provenance:
    """The provenance of this process's GPU. Raises :class:`NoGPUError` without one."""
    require_cuda("collecting GPU provenance")
    props = torch.cuda.get_device_properties(device)
    return Provenance(
        gpu_name=str(props.name),
        compute_capability=f"{props.major}.{props.minor}",
        total_memory_bytes=int(props.total_memory),
        driver=_driver_version(),
        cuda=str(torch.version.cuda),
        torch=str(torch.__version__),
        python=platform.python_version(),
        date=_dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        git_commit=git_commit(),
    )


def torch_version() -> tuple[int, int]:
    """(major, minor) of the installed torch, e.g. (2, 11)."""
    m = re.match(r"(\d+)\.(\d+)", torch.__version__)
    if not m:
        raise RuntimeError(f"cannot parse torch version {torch.__version__!r}")
    return int(m.group(1)), int(m.group(2))
