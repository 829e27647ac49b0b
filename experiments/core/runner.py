"""Run a function in a fresh Python process with given allocator settings and a memory cap.

Why a fresh process: the caching allocator reads ``PYTORCH_CUDA_ALLOC_CONF`` once,
when CUDA initialises, and an experiment that provokes an out-of-memory error should
not take the reader's kernel (and its cached memory) down with it. The child reports
its return value, or the error, as data: ``FreshResult.error_kind`` is 'oom',
'config', 'timeout', 'error' or 'crash'.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping

from . import alloc_conf

ERROR_KINDS = ("oom", "config", "timeout", "error", "crash")


class FreshProcessError(RuntimeError):
    """A fresh-process run did not return a value."""


@dataclasses.dataclass(frozen=True)
class FreshResult:
    """Outcome of :func:`run_fresh`.

    Attributes:
        ok: the function returned normally.
        value: its return value (JSON-able) when ok.
        error_kind: one of ERROR_KINDS when not ok.
        message: the error message (the OOM message for 'oom').
        alloc_conf: the allocator settings string the child ran with.
        elapsed_s: wall time of the child process in seconds.
        stderr_tail: the last lines the child printed to stderr.
    """

    ok: bool
    value: Any = None
    error_kind: str | None = None
    message: str = ""
    alloc_conf: str = ""
    elapsed_s: float = 0.0
    stderr_tail: str = ""

    def unwrap(self) -> Any:
        """The value, or raise :class:`FreshProcessError` describing what went wrong."""
        if self.ok:
            return self.value
        raise FreshProcessError(f"fresh process failed ({self.error_kind}): {self.message}\n{self.stderr_tail}".rstrip())


def run_fresh(
    target: str,
    kwargs: Mapping[str, Any] | None = None,
    *,
    alloc_conf_settings: Mapping[str, Any] | str | None = None,
    memory_fraction: float | None = None,
    memory_cap_mib: float | None = None,
    timeout_s: float = 120.0,
    env: Mapping[str, str] | None = None,
) -> FreshResult:
    """Call ``module:function(**kwargs)`` in a new Python process and return its outcome.

    Args:
        target: 'package.module:function'; the function returns a JSON-able value.
        kwargs: JSON-able keyword arguments.
        alloc_conf_settings: allocator settings (dict or string), validated against
            the installed torch and passed as ``PYTORCH_CUDA_ALLOC_CONF``.
        memory_fraction: cap for ``torch.cuda.set_per_process_memory_fraction`` in (0, 1].
        memory_cap_mib: cap in MiB instead of a fraction (converted on the device).
        timeout_s: wall-clock limit in seconds; the child is killed past it.
        env: extra environment variables for the child.

    Raises:
        ValueError: bad target, settings, fraction, cap or timeout (nothing is started).
        UnsupportedOptionError: an allocator option the installed torch lacks.
    """
    if ":" not in target or not all(target.partition(":")[::2]):
        raise ValueError(f"target must look like 'package.module:function', got {target!r}")
    if memory_fraction is not None and not 0 < memory_fraction <= 1:
        raise ValueError(f"memory_fraction must be in (0, 1], got {memory_fraction}")
    if memory_cap_mib is not None and memory_cap_mib <= 0:
        raise ValueError(f"memory_cap_mib must be > 0 MiB, got {memory_cap_mib}")
    if memory_fraction is not None and memory_cap_mib is not None:
        raise ValueError("give memory_fraction or memory_cap_mib, not both")
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s}")
    conf = alloc_conf.render(alloc_conf_settings)

    child_env = dict(os.environ)
    child_env.pop("PYTORCH_ALLOC_CONF", None)  # newer name; one source of settings only
    child_env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    package_root = str(Path(__file__).resolve().parents[2])
    child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, child_env.get("PYTHONPATH", "")]))
    if env:
        child_env.update(env)

    with tempfile.TemporaryDirectory(prefix="memlab-fresh-") as tmp:
        req, resp = Path(tmp, "request.json"), Path(tmp, "response.json")
        req.write_text(json.dumps({
            "target": target, "kwargs": dict(kwargs or {}),
            "memory_fraction": memory_fraction, "memory_cap_mib": memory_cap_mib,
        }))
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(
                [sys.executable, "-m", f"{__package__}._child", str(req), str(resp)],
                env=child_env, capture_output=True, text=True, timeout=timeout_s,
            )
        except subprocess.TimeoutExpired as e:
            tail = (e.stderr or b"")
            tail = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
            return FreshResult(False, error_kind="timeout", alloc_conf=conf,
                               message=f"{target} did not finish within {timeout_s:g} s and was killed",
                               elapsed_s=time.perf_counter() - t0, stderr_tail=_tail(tail))
        elapsed = time.perf_counter() - t0
        if not resp.exists():
            return FreshResult(False, error_kind="crash", alloc_conf=conf, elapsed_s=elapsed,
                               message=f"the child process exited with code {proc.returncode} without a result",
                               stderr_tail=_tail(proc.stderr))
        out = json.loads(resp.read_text())
    return FreshResult(ok=out["ok"], value=out.get("value"), error_kind=out.get("error_kind"),
                       message=out.get("message", ""), alloc_conf=conf, elapsed_s=elapsed,
                       stderr_tail=_tail(proc.stderr))


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join((text or "").strip().splitlines()[-lines:])
