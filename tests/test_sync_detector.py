"""The sync detector (experiments.sync_detector) and its pytest plugin.

CPU tests stand a fake in for ``torch.cuda.get/set_sync_debug_mode`` and emit the
warning PyTorch emits, so that arming, recording, locating, restoring, nesting and
failing are all tested without a GPU; they also check the no-GPU behaviour. GPU tests
(``-m gpu``) check that known syncing operations are caught and known non-syncing ones
are not, on the real runtime.
"""
from __future__ import annotations

import threading
import time
import warnings

import pytest
import torch

from experiments.syncs import detector as sd
from experiments.core.device import NoGPUError, has_cuda

pytest_plugins = ["pytester"]

SYNC_TEXT = "called a synchronizing CUDA operation (Triggered internally at CUDAFunctions.cpp:123.)"


class FakeSwitch:
    """Stands in for torch.cuda.get/set_sync_debug_mode; remembers every mode set."""

    def __init__(self, mode: int = 0) -> None:
        self.mode = mode
        self.history: list[int] = []

    def get(self) -> int:
        return self.mode

    def set(self, mode: int) -> None:
        self.mode = mode
        self.history.append(mode)


@pytest.fixture
def fake_gpu(monkeypatch):
    """The detector believes a GPU is present; the debug mode is a fake."""
    switch = FakeSwitch()
    monkeypatch.setattr(sd, "_switch", switch)
    monkeypatch.setattr(sd, "has_cuda", lambda: True)
    return switch


def torch_reports_a_sync() -> None:
    """What PyTorch does in "warn" mode at a synchronizing call site."""
    warnings.warn(SYNC_TEXT, UserWarning)


def _originals():
    return (torch.cuda.synchronize, torch.cuda.Event.__dict__["synchronize"], torch.cuda.Stream.__dict__["synchronize"],
            "to" in torch.Tensor.__dict__, "copy_" in torch.Tensor.__dict__, "cuda" in torch.Tensor.__dict__)


# ================================================================ without a GPU

def test_no_gpu_raises_a_clear_error(monkeypatch):
    monkeypatch.setattr(sd, "has_cuda", lambda: False)
    with pytest.raises(NoGPUError) as err:
        with sd.no_syncs():
            pass
    text = str(err.value)
    assert "needs a CUDA GPU" in text and "require_gpu=False" in text


def test_no_gpu_in_colab_says_how_to_switch(monkeypatch):
    monkeypatch.setattr(sd, "has_cuda", lambda: False)
    monkeypatch.setenv("COLAB_RELEASE_TAG", "x")
    assert "Change runtime type" in sd.no_gpu_message()


def test_no_gpu_unchecked_mode_runs_the_block(monkeypatch):
    monkeypatch.setattr(sd, "has_cuda", lambda: False)
    ran = []
    with sd.no_syncs(require_gpu=False) as det:
        ran.append(1)
    assert ran and not det.active and det.count == 0
    assert det.report().startswith("Not checked: no CUDA GPU")
    assert not sd._HUB.armed


@pytest.mark.skipif(has_cuda(), reason="checks the real CPU-only behaviour")
def test_real_cpu_torch_gives_the_message_not_a_torch_assertion():
    with pytest.raises(NoGPUError, match="needs a CUDA GPU"):
        with sd.SyncDetector():
            pass


@pytest.mark.parametrize("kwargs, words", [
    ({"mode": "warn"}, ["mode", "'error', 'report'"]),
    ({"threads": "main"}, ["threads", "'all', 'current'"]),
    ({"pageable_threshold_bytes": -1}, ["pageable_threshold_bytes", ">= 0"]),
    ({"max_syncs": True}, ["max_syncs"]),
    ({"max_syncs": 1.5}, ["max_syncs"]),
])
def test_bad_options_are_rejected(kwargs, words):
    mode = kwargs.pop("mode", "error")
    with pytest.raises(ValueError) as err:
        sd.SyncDetector(mode, **kwargs)
    for w in words:
        assert w in str(err.value)


# ================================================================ the detector's logic (fake debug mode)

def test_records_a_reported_sync_with_the_callers_line(fake_gpu):
    with sd.no_syncs(mode="report") as det:
        torch_reports_a_sync()
    assert det.count == 1
    e = det.events[0]
    assert e.kind == "debug_mode" and e.filename.endswith("test_sync_detector.py")
    assert e.function == "torch_reports_a_sync" and "warnings.warn(SYNC_TEXT" in e.code
    assert "test_sync_detector.py:" in det.report()


def test_arms_warn_and_restores_the_previous_mode(fake_gpu):
    fake_gpu.mode = 2
    with sd.no_syncs(mode="report"):
        assert fake_gpu.mode == 1
    assert fake_gpu.mode == 2 and fake_gpu.history == [1, 2]


def test_error_mode_raises_on_exit_with_the_report(fake_gpu):
    with pytest.raises(sd.SyncError) as err:
        with sd.no_syncs():
            torch_reports_a_sync()
            torch_reports_a_sync()
    assert "2 host-device syncs" in str(err.value) and "torch_reports_a_sync" in str(err.value)
    assert isinstance(err.value, AssertionError)


def test_max_syncs_tolerates_that_many(fake_gpu):
    with sd.no_syncs(max_syncs=1):
        torch_reports_a_sync()
    with pytest.raises(sd.SyncError):
        with sd.no_syncs(max_syncs=1):
            torch_reports_a_sync()
            torch_reports_a_sync()


def test_an_exception_in_the_block_wins_and_everything_is_restored(fake_gpu):
    before = _originals()
    with pytest.raises(KeyError):
        with sd.no_syncs():
            torch_reports_a_sync()
            raise KeyError("the block's own error")
    assert _originals() == before
    assert fake_gpu.mode == 0 and not sd._HUB.armed


def test_wrappers_are_installed_inside_and_removed_after(fake_gpu):
    before = _originals()
    with sd.no_syncs(mode="report"):
        assert torch.cuda.synchronize is not before[0]
        assert "to" in torch.Tensor.__dict__ and "copy_" in torch.Tensor.__dict__
        x = torch.arange(4.0)
        assert torch.equal(x.to(torch.float64), x.double())       # wrappers pass results through
        assert torch.equal(torch.empty(4).copy_(x), x)
    assert _originals() == before
    assert "to" not in torch.Tensor.__dict__, "Tensor.to lives on TensorBase: the wrapper must be deleted, not kept"


def test_a_name_bound_before_the_block_keeps_the_unwrapped_function(fake_gpu):
    """The documented blind spot (the book's warning): ``from torch.cuda import synchronize``
    binds the original; only a lookup inside the block reaches the wrapper."""
    early = torch.cuda.synchronize
    with sd.no_syncs(mode="report"):
        assert torch.cuda.synchronize is not early
        assert torch.cuda.synchronize.__memlab_original__ is early
    assert torch.cuda.synchronize is early


def test_explicit_synchronize_is_recorded_even_if_the_real_call_fails(fake_gpu):
    with sd.no_syncs(mode="report") as det:
        if not has_cuda():
            with pytest.raises(Exception):  # CPU torch: the real synchronize refuses after the event
                torch.cuda.synchronize()
        else:
            torch.cuda.synchronize()
    assert [e.kind for e in det.events] == ["device_synchronize"]
    assert det.events[0].detail == "torch.cuda.synchronize()"


def test_a_wait_the_debug_mode_reported_is_not_counted_twice(fake_gpu, monkeypatch):
    def stream_sync_that_warns(self):  # what Stream.synchronize does in "warn" mode
        torch_reports_a_sync()

    monkeypatch.setattr(torch.cuda.Stream, "synchronize", stream_sync_that_warns)
    monkeypatch.setattr(torch.cuda.Event, "synchronize", lambda self: None)
    with sd.no_syncs(mode="report") as det:
        torch.cuda.Stream.synchronize(object())
        torch.cuda.Event.synchronize(object())
    assert [e.kind for e in det.events] == ["debug_mode", "event_synchronize"]


def test_explicit_syncs_can_be_excluded(fake_gpu):
    with sd.no_syncs(mode="report", explicit=False) as det:
        sd._HUB.dispatch(sd.SyncEvent("event_synchronize", "Event.synchronize()", "f.py", 1, "g"))
        torch_reports_a_sync()
    assert [e.kind for e in det.events] == ["debug_mode"]


def test_pageable_copies_respect_the_threshold_and_the_switch(fake_gpu):
    def copy_event(nbytes: int, kind: str = "pageable_htod") -> sd.SyncEvent:
        return sd.SyncEvent(kind, "copy", "f.py", 1, "g", nbytes=nbytes)

    with sd.no_syncs(mode="report", pageable_threshold_bytes=1 << 20) as det:
        sd._HUB.dispatch(copy_event(4096))
        sd._HUB.dispatch(copy_event(2 << 20))
        sd._HUB.dispatch(copy_event(16, "pageable_dtoh"))
    assert [(e.kind, e.nbytes) for e in det.events] == [("pageable_htod", 2 << 20), ("pageable_dtoh", 16)]
    with sd.no_syncs(mode="report", copies=False) as det:
        sd._HUB.dispatch(copy_event(2 << 20))
    assert det.count == 0


def test_other_warnings_are_passed_on_after_the_block(fake_gpu):
    with warnings.catch_warnings(record=True) as outside:
        warnings.simplefilter("always")
        with sd.no_syncs(mode="report") as det:
            warnings.warn("an unrelated deprecation", DeprecationWarning)
            torch_reports_a_sync()
            warnings.warn("Synchronization debug mode is a prototype feature and does not yet detect all", UserWarning)
    assert det.count == 1
    assert [str(w.message) for w in outside] == ["an unrelated deprecation"]
    assert outside[0].category is DeprecationWarning


def test_sync_warnings_are_counted_even_where_warnings_are_errors(fake_gpu):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with sd.no_syncs(mode="report") as det:
            torch_reports_a_sync()
            torch_reports_a_sync()
    assert det.count == 2, "filters that say 'once' or 'error' must not hide syncs"


def test_nested_detectors_each_see_their_syncs(fake_gpu):
    with sd.no_syncs(mode="report") as outer:
        torch_reports_a_sync()
        with sd.no_syncs(mode="report") as inner:
            torch_reports_a_sync()
        assert sd._HUB.armed and fake_gpu.mode == 1, "the inner exit must not disarm the outer detector"
        torch_reports_a_sync()
    assert inner.count == 1 and outer.count == 3
    assert fake_gpu.history == [1, 0]


def test_the_same_detector_cannot_be_entered_twice(fake_gpu):
    det = sd.SyncDetector("report")
    with det:
        with pytest.raises(RuntimeError, match="already active"):
            with det:
                pass
    assert not sd._HUB.armed


def test_decorator_form_checks_each_call(fake_gpu):
    @sd.no_syncs()
    def quiet() -> int:
        return 3

    @sd.no_syncs()
    def noisy() -> None:
        torch_reports_a_sync()

    assert quiet() == 3 and quiet() == 3
    with pytest.raises(sd.SyncError):
        noisy()


def test_threads_option(fake_gpu):
    def worker() -> None:
        torch_reports_a_sync()

    for threads, expected in (("all", 1), ("current", 0)):
        with sd.no_syncs(mode="report", threads=threads) as det:
            t = threading.Thread(target=worker, name="loader")
            t.start()
            t.join()
        assert det.count == expected, threads
        if expected:
            assert det.events[0].thread == "loader"


def test_counts_and_report_limit(fake_gpu):
    with sd.no_syncs(mode="report") as det:
        for _ in range(25):
            torch_reports_a_sync()
        sd._HUB.dispatch(sd.SyncEvent("device_synchronize", "torch.cuda.synchronize()", "f.py", 1, "g"))
    assert det.counts() == {"debug_mode": 25, "device_synchronize": 1}
    text = det.report(limit=5)
    assert "26 host-device syncs" in text and "and 21 more" in text
    assert sd.format_report([]) == "No host-device sync detected in the block."
    assert "done, 26 syncs" in repr(det)


# ================================================================ copy classification

@pytest.mark.parametrize("args, kwargs, expected", [
    ((), {}, False),
    (("cuda",), {}, False),
    (("cuda",), {"non_blocking": True}, True),
    (("cuda", torch.float32, True), {}, True),
    (("cuda", torch.float32, False, True), {}, False),   # copy=True, non_blocking=False
    (("cuda", True), {}, True),
    ((torch.float16, True), {}, True),
    ((torch.float16, False, True), {}, False),
    ((torch.empty(1), True), {}, True),
])
def test_non_blocking_of_to(args, kwargs, expected):
    assert sd.non_blocking_of_to(args, kwargs) is expected


@pytest.mark.parametrize("src, dst, nb, src_pinned, dst_pinned, kind", [
    ("cpu", "cuda", True, False, False, "pageable_htod"),
    ("cpu", "cuda", True, True, False, None),
    ("cpu", "cuda", False, False, False, None),      # blocking: the debug mode reports it
    ("cuda", "cpu", True, False, False, "pageable_dtoh"),
    ("cuda", "cpu", True, False, True, None),
    ("cuda", "cuda", True, False, False, None),
    ("cpu", "cpu", True, False, False, None),
])
def test_classify_copy(src, dst, nb, src_pinned, dst_pinned, kind):
    assert sd.classify_copy(src, dst, non_blocking=nb, src_pinned=src_pinned, dst_pinned=dst_pinned) == kind


def test_cpu_only_copies_never_report(fake_gpu):
    with sd.no_syncs(mode="report") as det:
        x = torch.ones(1 << 20)
        x.to(torch.float64, non_blocking=True)
        torch.empty(1 << 20).copy_(x, non_blocking=True)
    assert det.count == 0


# ================================================================ the pytest plugin

PLUGIN_CONFTEST = 'pytest_plugins = ["experiments.pytest_plugin"]\n'


def test_plugin_registers_its_marker(pytester):
    pytester.makeconftest(PLUGIN_CONFTEST)
    pytester.makepyfile("""
        import pytest

        @pytest.mark.no_syncs(max_syncs=0)
        def test_marked():
            pass
    """)
    result = pytester.runpytest("--strict-markers", "-p", "no:cacheprovider")
    assert result.ret == 0
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(["*no_syncs(**options)*"])


@pytest.mark.skipif(has_cuda(), reason="checks the skip on machines without a GPU")
def test_plugin_skips_without_a_gpu(pytester):
    pytester.makeconftest(PLUGIN_CONFTEST)
    pytester.makepyfile("""
        import pytest

        def test_fixture(sync_detector):
            with sync_detector():
                pass

        @pytest.mark.no_syncs
        def test_marker():
            pass
    """)
    result = pytester.runpytest("-rs")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(["*needs a CUDA GPU*"])


# ================================================================ live on the GPU

def _warm(fn):
    fn()
    torch.cuda.synchronize()
    return fn


def _syncing_ops():
    from experiments.syncs.ops import OPS

    return [op.id for op in OPS if op.expected_sync is True]


def _quiet_ops():
    from experiments.syncs.ops import OPS

    return [op.id for op in OPS if op.expected_sync is False]


@pytest.mark.gpu
@pytest.mark.parametrize("op_id", _syncing_ops())
def test_gpu_known_syncing_operations_are_caught(op_id):
    from experiments.syncs.ops import OPS_BY_ID

    fn = _warm(OPS_BY_ID[op_id].build(4096, torch.device("cuda")))
    with sd.no_syncs(mode="report") as det:
        fn()
    torch.cuda.synchronize()
    assert det.count >= 1, f"{OPS_BY_ID[op_id].code} synced on the lab GPU but the detector saw nothing"


@pytest.mark.gpu
@pytest.mark.parametrize("op_id", _quiet_ops())
def test_gpu_known_non_syncing_operations_pass(op_id):
    from experiments.syncs.ops import OPS_BY_ID

    fn = _warm(OPS_BY_ID[op_id].build(4096, torch.device("cuda")))
    with sd.no_syncs(mode="report") as det:
        fn()
    torch.cuda.synchronize()
    assert det.count == 0, f"{OPS_BY_ID[op_id].code}: {det.report()}"


@pytest.mark.gpu
def test_gpu_device_synchronize_is_caught_where_the_debug_mode_is_silent():
    assert sd.count_debug_mode_syncs(lambda: torch.cuda.synchronize()) == 0, \
        "the debug mode now reports torch.cuda.synchronize(): update the book"
    with sd.no_syncs(mode="report") as det:
        torch.cuda.synchronize()  # looked up inside the block: a name bound earlier is a blind spot
    assert [e.kind for e in det.events] == ["device_synchronize"]


@pytest.mark.gpu
def test_gpu_a_synchronize_bound_before_the_block_goes_unreported():
    """The blind spot the book warns about, on the real runtime: the call waits for the GPU,
    and neither the detector nor the debug mode reports it. If this starts failing, the
    detector has learnt to see such calls: update the warning in the chapter."""
    from torch.cuda import synchronize as bound_early

    from experiments.core.measure import gpu_sleep

    gpu_sleep(1.0)  # calibrates the sleep kernel (which syncs) before the block
    bound_early()
    with sd.no_syncs(mode="report") as det:
        gpu_sleep(20.0)
        t0 = time.perf_counter()
        bound_early()
        waited_ms = (time.perf_counter() - t0) * 1e3
    assert waited_ms > 10.0, f"the call should have waited for the queued 20 ms, waited {waited_ms:.2f} ms"
    assert det.count == 0, det.report()


@pytest.mark.gpu
def test_gpu_the_debug_mode_reports_stream_synchronize():
    """The chapter says set_sync_debug_mode reports Stream.synchronize() (it goes through the
    instrumented stream_synchronize), unlike torch.cuda.synchronize() and Event.synchronize()."""
    assert sd.count_debug_mode_syncs(lambda: torch.cuda.current_stream().synchronize()) == 1, \
        "the debug mode no longer reports Stream.synchronize(): update the chapter's detector section"


@pytest.mark.gpu
@pytest.mark.parametrize("call", [lambda: torch.cuda.current_stream().synchronize(),
                                  lambda: torch.cuda.Stream().synchronize()])
def test_gpu_stream_synchronize_is_counted_once(call):
    with sd.no_syncs(mode="report") as det:
        call()
    assert det.count == 1, det.report()
    assert det.events[0].kind in ("debug_mode", "stream_synchronize")


@pytest.mark.gpu
def test_gpu_event_synchronize_is_caught():
    done = torch.cuda.Event()
    done.record()
    assert sd.count_debug_mode_syncs(done.synchronize) == 0, "the debug mode now reports Event.synchronize()"
    with sd.no_syncs(mode="report") as det:
        done.synchronize()
    assert [e.kind for e in det.events] == ["event_synchronize"]


@pytest.mark.gpu
def test_gpu_pageable_copies():
    big, small = torch.ones(1 << 20), torch.ones(1024)  # 4 MiB and 4 KiB of float32
    pinned = torch.ones(1 << 20).pin_memory()
    x = torch.ones(1024, device="cuda")
    host = torch.empty(1024)
    _warm(lambda: (big.to("cuda", non_blocking=True), pinned.cuda(non_blocking=True), host.copy_(x, non_blocking=True)))
    with sd.no_syncs(mode="report") as det:
        big.to("cuda", non_blocking=True)
        small.to("cuda", non_blocking=True)
        pinned.cuda(non_blocking=True)
        torch.empty(1 << 20, device="cuda").copy_(pinned, non_blocking=True)
        host.copy_(x, non_blocking=True)
    torch.cuda.synchronize()
    assert [(e.kind, e.nbytes) for e in det.events] == [("pageable_htod", 4 << 20), ("pageable_dtoh", 4096)], \
        det.report()
    with sd.no_syncs(mode="report", pageable_threshold_bytes=0) as det:
        small.to("cuda", non_blocking=True)
    assert det.count == 1


@pytest.mark.gpu
def test_gpu_error_mode_names_this_line():
    x = torch.randn(1000, device="cuda")
    with pytest.raises(sd.SyncError) as err:
        with sd.no_syncs():
            x[x > 0]
    assert "test_sync_detector.py" in str(err.value) and "x[x > 0]" in str(err.value), str(err.value)


@pytest.mark.gpu
def test_gpu_previous_mode_and_functions_are_restored():
    before = _originals()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(ZeroDivisionError):
            with sd.no_syncs(mode="report") as det:
                torch.ones(2, device="cuda").sum().item()  # "warn" inside: recorded, does not raise
                1 / 0
        assert det.count >= 1
        assert torch.cuda.get_sync_debug_mode() == 2
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert _originals() == before


@pytest.mark.gpu
def test_gpu_syncs_inside_backward_are_caught():
    class ItemInBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            grad.sum().item()  # a sync on autograd's device thread
            return grad * 2

    x = torch.randn(64, device="cuda", requires_grad=True)
    ItemInBackward.apply(x).sum().backward()
    with sd.no_syncs(mode="report") as det:
        ItemInBackward.apply(x).sum().backward()
    assert det.count >= 1, "a .item() inside backward should be reported"


@pytest.mark.gpu
def test_gpu_plugin_fails_a_syncing_test_and_passes_a_clean_one(pytester):
    pytester.makeconftest(PLUGIN_CONFTEST)
    pytester.makepyfile("""
        import pytest
        import torch

        def test_clean(sync_detector):
            x = torch.randn(100, device="cuda")
            torch.where(x > 0, x, 0.0)
            with sync_detector():
                torch.where(x > 0, x, 0.0)

        def test_syncs(sync_detector):
            x = torch.randn(100, device="cuda")
            with sync_detector():
                x.sum().item()

        @pytest.mark.no_syncs
        def test_marked_syncs():
            torch.cuda.synchronize()

        @pytest.mark.no_syncs
        def test_marked_clean():
            torch.full((3,), 1.0, device="cuda")
    """)
    result = pytester.runpytest()
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines(["*SyncError*", "*x.sum().item()*"])
