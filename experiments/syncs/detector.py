"""A detector for host-device synchronizations that readers keep: :func:`no_syncs` and
:class:`SyncDetector`, plus a pytest plugin (:mod:`experiments.pytest_plugin`).

While a ``with no_syncs():`` block runs, the detector watches three things:

1. **PyTorch's own instrumentation.** With ``torch.cuda.set_sync_debug_mode("warn")``
   every call site that PyTorch marked as synchronizing (``memcpy_and_sync``,
   ``stream_synchronize`` in ``c10/cuda/CUDAFunctions.h``: ``.item()``, ``.cpu()``,
   ``nonzero``, blocking copies, ``torch.tensor(..., device="cuda")`` ...) emits the
   warning "called a synchronizing CUDA operation". The detector arms that mode,
   turns each such warning into a :class:`SyncEvent` with the line of *your* code that
   caused it, and restores the previous mode on exit.
2. **Explicit waits.** The flag does not report ``torch.cuda.synchronize()`` or
   ``Event.synchronize()`` (it does report ``Stream.synchronize()``, which goes through
   the instrumented ``stream_synchronize``). ``torch.cuda.synchronize``,
   ``torch.cuda.Event.synchronize``, ``torch.cuda.Stream.synchronize`` (so also
   ``torch.cuda.current_stream().synchronize()``) and ``torch.accelerator.synchronize``
   are wrapped for the duration of the block; a call is recorded as an explicit wait
   unless the debug mode already reported it, so no wait is counted twice.
3. **Copies the driver may turn into a wait although PyTorch queued them
   asynchronously.** ``Tensor.to``, ``Tensor.cuda`` and ``Tensor.copy_`` are wrapped: a
   ``non_blocking=True`` host-to-device copy from pageable (not pinned) memory of at
   least ``pageable_threshold_bytes`` is reported (the driver drains the stream for
   those; 64 KiB on the post's GB200, between 2 and 4 MiB on the lab H200), and so is a
   ``non_blocking=True`` device-to-host copy into pageable memory (the driver completes
   it before returning).

What it still cannot see (also in :data:`BLIND_SPOTS`):

* waits inside C++ code that PyTorch did not instrument: custom CUDA extensions,
  ``torch.distributed`` and ``torch.sparse`` (named in the ``set_sync_debug_mode``
  docs), library kernels that call ``cudaStreamSynchronize`` themselves;
* implicit waits of the CUDA driver: ``cudaFree`` when the caching allocator releases
  memory (``empty_cache``, the retry after an out-of-memory), pinned-memory allocation
  and release;
* entry points bound before the block started (``from torch.cuda import synchronize``),
  the device-generic ``torch.Event``/``torch.Stream`` classes (their methods are C
  types and cannot be wrapped), and code compiled by ``torch.compile`` or replayed from
  a CUDA graph;
* small pageable ``non_blocking`` copies below the threshold, which some drivers still
  stage without a wait and others do not.

Also: ``set_sync_debug_mode`` is process-global, so a sync made by another thread while
the block runs is reported too (the event names the thread; ``threads="current"``
ignores other threads' events, which also ignores wrapped calls made on autograd's
device threads). Python's ``warnings`` machinery is process-global as well: use one
detector per thread at a time. Nested detectors are fine.

Sources: the post https://docs.pytorch.org/devlogs/eager/2026-08-11-hidden-h2d-sync/,
the ``torch.cuda.set_sync_debug_mode`` docs
https://docs.pytorch.org/docs/stable/generated/torch.cuda.set_sync_debug_mode.html,
and vLLM's sync checker, which also arms "warn" and wraps ``Tensor.to``/``copy_``.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import linecache
import os
import sys
import threading
import warnings
from typing import Any, Callable, Iterator

from ..core.lazy_torch import torch
from ..core.units import format_bytes
from ..core.device import COLAB_SWITCH_HINT, NoGPUError, has_cuda, in_colab

__all__ = ['SYNC_WARNING_TEXT', 'MODES', 'THREADS', 'DEFAULT_PAGEABLE_THRESHOLD_BYTES', 'KINDS', 'EXPLICIT_KINDS', 'COPY_KINDS', 'BLIND_SPOTS', 'SyncError', 'SyncEvent', 'non_blocking_of_to', 'classify_copy', 'patched_entry_points', 'SyncDetector', 'format_report', 'no_syncs', 'no_gpu_message', 'count_debug_mode_syncs']

SYNC_WARNING_TEXT = "called a synchronizing CUDA operation"
_PROTOTYPE_NOTICE = "Synchronization debug mode is a prototype"

MODES = ("error", "report")
THREADS = ("all", "current")
DEFAULT_PAGEABLE_THRESHOLD_BYTES = 64 * 1024

KINDS = {
    "debug_mode": "PyTorch reported a synchronizing operation (set_sync_debug_mode)",
    "device_synchronize": "explicit torch.cuda.synchronize()",
    "stream_synchronize": "explicit Stream.synchronize()",
    "event_synchronize": "explicit Event.synchronize()",
    "pageable_htod": "non_blocking host-to-device copy from pageable memory",
    "pageable_dtoh": "non_blocking device-to-host copy into pageable memory",
}
EXPLICIT_KINDS = ("device_synchronize", "stream_synchronize", "event_synchronize")
COPY_KINDS = ("pageable_htod", "pageable_dtoh")

BLIND_SPOTS = (
    "waits inside C++ code PyTorch did not instrument: custom CUDA extensions, torch.distributed, "
    "torch.sparse, library kernels that synchronize on their own",
    "implicit waits of the CUDA driver: cudaFree when the caching allocator gives memory back "
    "(empty_cache, the retry after an out-of-memory error), pinned-memory allocation and release",
    "sync functions bound before the block started (from torch.cuda import synchronize), and the "
    "device-generic torch.Event / torch.Stream classes",
    "code compiled by torch.compile or replayed from a CUDA graph",
    "pageable non_blocking copies smaller than pageable_threshold_bytes (the driver's staging limit "
    "differs between machines)",
)


class SyncError(AssertionError):
    """Raised on exit from a ``no_syncs(mode="error")`` block that synchronized.

    An ``AssertionError`` so that pytest shows it as a test failure, with the report.
    """


@dataclasses.dataclass(frozen=True)
class SyncEvent:
    """One synchronization seen by the detector.

    Attributes:
        kind: a key of :data:`KINDS`.
        detail: what was called, e.g. 'torch.cuda.synchronize()' or '16.0 MiB copy'.
        filename, lineno, function: the first frame outside torch and this module.
        code: that line of source, when available.
        thread: name of the thread that made the call.
        nbytes: bytes copied (copy kinds only).
    """

    kind: str
    detail: str
    filename: str
    lineno: int
    function: str
    code: str = ""
    thread: str = ""
    nbytes: int | None = None
    thread_id: int = 0

    def where(self) -> str:
        """'file.py:42 in step' (the file's base name)."""
        return f"{os.path.basename(self.filename)}:{self.lineno} in {self.function}"

    def __str__(self) -> str:
        code = f": {self.code}" if self.code else ""
        return f"[{self.kind}] {self.detail} at {self.where()}{code}"


# ----------------------------------------------------------------- locating the caller

@functools.cache
def _torch_dir() -> str:
    """torch's folder (read when first needed: importing the chapter does not import torch)."""
    return os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


_THIS_FILE = os.path.abspath(__file__)
_SKIP_BASENAMES = {"warnings.py", "_py_warnings.py", "contextlib.py", "functools.py"}


def _is_internal(filename: str) -> bool:
    path = os.path.abspath(filename) if not filename.startswith("<") else filename
    return (path == _THIS_FILE or path.startswith(_torch_dir())
            or os.path.basename(path) in _SKIP_BASENAMES)


def _user_frame(start: Any = None) -> tuple[str, int, str, str]:
    """(filename, lineno, function, source line) of the innermost frame outside torch,
    the warnings machinery and this module: the line of user code that synchronized."""
    frame = start if start is not None else sys._getframe(1)
    fallback = None
    while frame is not None:
        code = frame.f_code
        if fallback is None:
            fallback = frame
        if not _is_internal(code.co_filename):
            line = linecache.getline(code.co_filename, frame.f_lineno).strip()
            return code.co_filename, frame.f_lineno, code.co_name, line
        frame = frame.f_back
    if fallback is None:
        return "<unknown>", 0, "?", ""
    return fallback.f_code.co_filename, fallback.f_lineno, fallback.f_code.co_name, ""


def _make_event(kind: str, detail: str, nbytes: int | None = None) -> SyncEvent:
    filename, lineno, function, code = _user_frame(sys._getframe(2))
    t = threading.current_thread()
    return SyncEvent(kind, detail, filename, lineno, function, code, t.name, nbytes, threading.get_ident())


# ----------------------------------------------------------------- the debug-mode switch

class _DebugModeSwitch:
    """``torch.cuda.get/set_sync_debug_mode``; a seam so CPU tests can stand in for it."""

    def get(self) -> int:
        return int(torch.cuda.get_sync_debug_mode())

    def set(self, mode: int) -> None:
        torch.cuda.set_sync_debug_mode(mode)


_switch = _DebugModeSwitch()


# ----------------------------------------------------------------- copy classification

def non_blocking_of_to(args: tuple, kwargs: dict) -> bool:
    """The ``non_blocking`` flag of a ``Tensor.to(...)`` call, from its arguments.

    ``to`` has three forms (see ``torch.Tensor.to``): ``to(device, dtype, non_blocking,
    copy)``, ``to(dtype, non_blocking, copy)`` and ``to(other, non_blocking, copy)``.
    """
    if "non_blocking" in kwargs:
        return bool(kwargs["non_blocking"])
    if not args:
        return False
    if isinstance(args[0], (torch.dtype, torch.Tensor)):
        return len(args) > 1 and args[1] is True
    if len(args) > 1 and isinstance(args[1], bool):
        return args[1]
    return len(args) > 2 and args[2] is True


def classify_copy(src_device: str, dst_device: str, *, non_blocking: bool, src_pinned: bool,
                  dst_pinned: bool) -> str | None:
    """The :data:`KINDS` key of a copy the debug mode does not report, or None.

    Blocking copies are left to ``set_sync_debug_mode`` (PyTorch follows them with a
    stream synchronize it reports). Of the ``non_blocking`` ones, a host-to-device copy
    from pageable memory can drain the stream, and a device-to-host copy into pageable
    memory always completes before the call returns.

    Args:
        src_device, dst_device: device types, 'cpu' or 'cuda'.
    """
    if not non_blocking:
        return None
    if src_device == "cpu" and dst_device == "cuda" and not src_pinned:
        return "pageable_htod"
    if src_device == "cuda" and dst_device == "cpu" and not dst_pinned:
        return "pageable_dtoh"
    return None


def _check_copy(src: Any, dst: Any, non_blocking: bool) -> None:
    if not non_blocking or not isinstance(src, torch.Tensor) or not isinstance(dst, torch.Tensor):
        return
    s, d = src.device.type, dst.device.type
    if {s, d} != {"cpu", "cuda"}:
        return
    kind = classify_copy(s, d, non_blocking=True,
                         src_pinned=bool(s == "cpu" and src.is_pinned()),
                         dst_pinned=bool(d == "cpu" and dst.is_pinned()))
    if kind is not None:
        nbytes = src.numel() * src.element_size()
        _HUB.dispatch(_make_event(kind, f"{format_bytes(nbytes)} {KINDS[kind]}", nbytes))




# ----------------------------------------------------------------- wrappers

def _wrap_sync(original: Callable, kind: str, label: str) -> Callable:
    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        before = _HUB.debug_events
        try:
            return original(*args, **kwargs)
        finally:
            # PyTorch's warning reaches Python before the call returns: if it reported
            # this wait already (Stream.synchronize does), do not count it twice.
            if _HUB.debug_events == before:
                _HUB.dispatch(_make_event(kind, label))

    wrapper.__memlab_original__ = original  # type: ignore[attr-defined]
    return wrapper


def _wrap_to(original: Callable) -> Callable:
    @functools.wraps(original)
    def to(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        if out is not self:
            _check_copy(self, out, non_blocking_of_to(args, kwargs))
        return out

    return to


def _wrap_cuda(original: Callable) -> Callable:
    @functools.wraps(original)
    def cuda(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        nb = kwargs.get("non_blocking", args[1] if len(args) > 1 else False)
        if out is not self:
            _check_copy(self, out, bool(nb))
        return out

    return cuda


def _wrap_copy_(original: Callable) -> Callable:
    @functools.wraps(original)
    def copy_(self: Any, src: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, src, *args, **kwargs)
        nb = kwargs.get("non_blocking", args[0] if args else False)
        _check_copy(src, self, bool(nb))
        return out

    return copy_


_MISSING = object()


def _patch_targets() -> list[tuple[Any, str, Callable[[Callable], Callable]]]:
    """(owner, attribute, wrapper factory) for every entry point the detector wraps."""
    targets: list[tuple[Any, str, Callable[[Callable], Callable]]] = [
        (torch.cuda, "synchronize", lambda f: _wrap_sync(f, "device_synchronize", "torch.cuda.synchronize()")),
        (torch.cuda.Event, "synchronize", lambda f: _wrap_sync(f, "event_synchronize", "Event.synchronize()")),
        (torch.cuda.Stream, "synchronize", lambda f: _wrap_sync(f, "stream_synchronize", "Stream.synchronize()")),
        (torch.Tensor, "to", _wrap_to),
        (torch.Tensor, "cuda", _wrap_cuda),
        (torch.Tensor, "copy_", _wrap_copy_),
    ]
    accel = getattr(torch, "accelerator", None)
    if accel is not None and hasattr(accel, "synchronize"):
        targets.append((accel, "synchronize",
                        lambda f: _wrap_sync(f, "device_synchronize", "torch.accelerator.synchronize()")))
    return targets


@contextlib.contextmanager
def patched_entry_points() -> Iterator[list[str]]:
    """Wrap the explicit-sync functions and the copy methods; restore them on exit.

    Yields the names of what was wrapped. Works without CUDA (nothing is called), so
    its restore logic is tested on CPU. A wrapped attribute that lived on a base class
    (``Tensor.to`` is defined on ``torch._C.TensorBase``) is deleted again rather than
    set, so the class is left exactly as it was.
    """
    undo: list[tuple[Any, str, Any]] = []
    names = []
    try:
        for owner, attr, factory in _patch_targets():
            own = owner.__dict__.get(attr, _MISSING) if isinstance(owner, type) else getattr(owner, attr)
            current = getattr(owner, attr)
            try:
                setattr(owner, attr, factory(current))
            except (TypeError, AttributeError):
                continue  # an immutable C type: documented as a blind spot
            undo.append((owner, attr, own))
            names.append(f"{getattr(owner, '__name__', owner)}.{attr}")
        yield names
    finally:
        for owner, attr, own in reversed(undo):
            if own is _MISSING:
                delattr(owner, attr)
            else:
                setattr(owner, attr, own)


# ----------------------------------------------------------------- the hub

class _Hub:
    """Arms the debug mode, the warning hook and the wrappers once for all active detectors.

    The outermost detector arms everything and the last one out restores it; events go
    to every active detector, so nested blocks each see their own syncs.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._active: list["SyncDetector"] = []
        self._stack: contextlib.ExitStack | None = None
        self._deferred: list[tuple] = []
        self.debug_events = 0

    @property
    def armed(self) -> bool:
        return self._stack is not None

    def push(self, det: "SyncDetector") -> None:
        with self._lock:
            if any(d is det for d in self._active):
                raise RuntimeError("this SyncDetector is already active; create a new one for a nested block")
            if not self._active:
                self._arm()
            self._active.append(det)

    def pop(self, det: "SyncDetector") -> None:
        with self._lock:
            self._active = [d for d in self._active if d is not det]
            if not self._active and self._stack is not None:
                self._disarm()

    def dispatch(self, event: SyncEvent) -> None:
        with self._lock:
            targets = list(self._active)
        for det in targets:
            det._record(event)

    def _on_warning(self, message: Any, category: Any, filename: str, lineno: int,
                    file: Any = None, line: Any = None) -> None:
        text = str(message)
        if SYNC_WARNING_TEXT in text:
            self.debug_events += 1
            self.dispatch(_make_event("debug_mode", "reported by set_sync_debug_mode"))
        elif _PROTOTYPE_NOTICE not in text:
            self._deferred.append((message, category, filename, lineno, line))

    def _arm(self) -> None:
        stack = contextlib.ExitStack()
        try:
            stack.enter_context(warnings.catch_warnings())
            # Sync warnings always reach the hook, even where a filter says 'once' or 'error'.
            warnings.filterwarnings("always", message=SYNC_WARNING_TEXT)
            warnings.filterwarnings("always", message=_PROTOTYPE_NOTICE)
            warnings.showwarning = self._on_warning
            previous = _switch.get()
            stack.callback(_switch.set, previous)
            _switch.set(1)
            stack.enter_context(patched_entry_points())
        except BaseException:
            stack.close()
            raise
        self._deferred = []
        self._stack = stack

    def _disarm(self) -> None:
        stack, self._stack = self._stack, None
        deferred, self._deferred = self._deferred, []
        assert stack is not None
        stack.close()
        # Warnings that were not about syncs go to whoever listens outside (pytest, a notebook).
        for message, category, filename, lineno, line in deferred:
            warnings.warn_explicit(message, category, filename, lineno, source=None)


_HUB = _Hub()


# ----------------------------------------------------------------- the detector

class SyncDetector(contextlib.ContextDecorator):
    """Report, or fail on, host-device synchronizations inside a ``with`` block.

    Args:
        mode: 'error' (raise :class:`SyncError` on exit if the block made more than
            ``max_syncs`` syncs) or 'report' (only record them in :attr:`events`).
        explicit: also catch explicit ``synchronize()`` calls (the debug mode does not).
        copies: also catch ``non_blocking`` copies the driver may turn into a wait.
        pageable_threshold_bytes: smallest pageable ``non_blocking`` host-to-device copy
            to report, in bytes (default 64 KiB, where the post's GB200 started draining).
        max_syncs: syncs tolerated before 'error' mode fails (default 0).
        threads: 'all' (default) or 'current' (ignore events from other threads).
        require_gpu: without a CUDA GPU, raise :class:`~experiments.core.device.NoGPUError`
            (default) or, when False, run the block unchecked (:attr:`active` stays False).

    Raises:
        ValueError: an unknown mode or threads option, or a negative threshold/max_syncs.

    Usage::

        with no_syncs():                       # fails if the step syncs
            train_step(batch)
        with no_syncs(mode="report") as det:
            train_step(batch)
        print(det.report())
    """

    def __init__(self, mode: str = "error", *, explicit: bool = True, copies: bool = True,
                 pageable_threshold_bytes: int = DEFAULT_PAGEABLE_THRESHOLD_BYTES, max_syncs: int = 0,
                 threads: str = "all", require_gpu: bool = True) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if threads not in THREADS:
            raise ValueError(f"threads must be one of {THREADS}, got {threads!r}")
        for name, value in (("pageable_threshold_bytes", pageable_threshold_bytes), ("max_syncs", max_syncs)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        self.mode = mode
        self.explicit = explicit
        self.copies = copies
        self.pageable_threshold_bytes = pageable_threshold_bytes
        self.max_syncs = max_syncs
        self.threads = threads
        self.require_gpu = require_gpu
        self.events: list[SyncEvent] = []
        self.active = False
        self.skipped = ""
        self._thread = 0
        self._lock = threading.Lock()

    # -- context manager

    def __enter__(self) -> "SyncDetector":
        self.events = []
        self.skipped = ""
        if not has_cuda():
            if self.require_gpu:
                raise NoGPUError(no_gpu_message())
            self.skipped = "no CUDA GPU is visible, so there is no host-device sync to detect"
            return self
        self._thread = threading.get_ident()
        _HUB.push(self)
        self.active = True
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        if self.active:
            self.active = False
            _HUB.pop(self)
        if self.mode == "error" and exc_type is None and self.count > self.max_syncs:
            raise SyncError(self.report())
        return False

    # -- recording

    def _record(self, event: SyncEvent) -> None:
        if event.kind in EXPLICIT_KINDS and not self.explicit:
            return
        if event.kind in COPY_KINDS and not self.copies:
            return
        if event.kind == "pageable_htod" and (event.nbytes or 0) < self.pageable_threshold_bytes:
            return
        if self.threads == "current" and event.thread_id != self._thread:
            return
        with self._lock:
            self.events.append(event)

    # -- results

    @property
    def count(self) -> int:
        """Number of syncs recorded."""
        return len(self.events)

    def counts(self) -> dict[str, int]:
        """Syncs per kind (keys of :data:`KINDS`), most frequent first."""
        return dict(collections.Counter(e.kind for e in self.events).most_common())

    def report(self, *, limit: int = 20) -> str:
        """A readable list of the syncs, each with the line of code that made it."""
        return format_report(self.events, skipped=self.skipped, limit=limit)

    def __repr__(self) -> str:
        state = "active" if self.active else ("skipped" if self.skipped else "done")
        return f"SyncDetector(mode={self.mode!r}, {state}, {self.count} syncs)"


def format_report(events: list[SyncEvent], *, skipped: str = "", limit: int = 20) -> str:
    """The text of :meth:`SyncDetector.report` for a list of events."""
    if skipped:
        return f"Not checked: {skipped}."
    if not events:
        return "No host-device sync detected in the block."
    n = len(events)
    lines = [f"{n} host-device sync{'s' if n != 1 else ''} detected in the block:"]
    for i, e in enumerate(events[:limit], 1):
        lines.append(f"  {i}. {e}")
    if n > limit:
        lines.append(f"  ... and {n - limit} more")
    return "\n".join(lines)


def no_syncs(mode: str = "error", **options: Any) -> SyncDetector:
    """A :class:`SyncDetector`; ``with no_syncs(): ...`` fails if the block syncs.

    Also usable as a decorator (``@no_syncs()``). ``options`` are those of
    :class:`SyncDetector`.
    """
    return SyncDetector(mode, **options)


def no_gpu_message() -> str:
    """What the detector says on a machine without a CUDA GPU."""
    hint = COLAB_SWITCH_HINT if in_colab() else (
        "Run the block on a machine with an NVIDIA GPU and a CUDA build of torch, or pass "
        "require_gpu=False to run it unchecked.")
    return ("The sync detector needs a CUDA GPU, and torch sees none: without a GPU there is no "
            f"host-device synchronization to detect. {hint}")


def count_debug_mode_syncs(fn: Callable[[], Any]) -> int:
    """How many synchronizing operations ``set_sync_debug_mode("warn")`` reports while ``fn()`` runs.

    Only PyTorch's own instrumentation counts here (no wrappers), which is what the
    debug mode alone would tell you. Raises NoGPUError without a GPU.
    """
    with SyncDetector("report", explicit=False, copies=False) as det:
        fn()
    return det.count
