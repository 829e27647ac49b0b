"""Every experiment leaves the reader's GPU memory where it found it (issue #19).

A reader runs the experiments in one notebook kernel, next to their own tensors. After
each call ``torch.cuda.memory_allocated()`` must be back where it was before (after a
``gc.collect()``): nothing the experiment made may stay allocated. Experiments that run
in a fresh process are clean by construction; the parent process is checked all the same.

Each experiment is called live through ``ex.run``, as a page calls it, at both ends of
every parameter's range (the first and last choice, both booleans, min and max), the
other parameters at their defaults. Parameters that only repeat the same measurement
(:data:`REPEAT_COUNTS`) take their minimum: their maximum repeats the same allocations
and only costs time. On the lab H200 that is 130 calls; expect about 5 minutes (the
recordings' times at these points add up to about 4, the allocator doctor's training
run alone to 45 s). Run from the repository root, on a GPU:

    python3 -m pytest tests/test_memory_left_gpu.py -m gpu -x -q

Found by this check on the lab GPU before it existed: ``syncs.case_study`` left 65 MiB
allocated, the cuBLAS workspaces of the forward and of autograd's backward thread
(cached by PyTorch per handle and stream) plus the helper's device index; see
:func:`experiments.core.measure.memory_left_as_found`.
"""
from __future__ import annotations

import gc
from typing import Any

import pytest

import experiments as ex
from experiments.core.registry import Experiment, all_experiments

pytestmark = pytest.mark.gpu

REPEAT_COUNTS = ("repeats", "trials", "steps", "batches")


def range_ends(exp: Experiment) -> list[dict[str, Any]]:
    """The points at which ``exp`` is called: each parameter at both ends of its range,
    the others at their defaults (the default point alone when it has no parameter)."""
    points: list[dict[str, Any]] = []
    for p in exp.params:
        if p.choices is not None:
            ends = [p.choices[0], p.choices[-1]]
        elif p.kind == "bool":
            ends = [False, True]
        else:
            ends = [int(v) if p.kind == "int" else float(v) for v in (p.min, p.max) if v is not None]
        if p.name in REPEAT_COUNTS:
            ends = ends[:1]
        for value in ends:
            point = {**exp.defaults, p.name: value}
            if point not in points:
                points.append(point)
    return points or [dict(exp.defaults)]


def _allocated() -> int:
    import torch

    gc.collect()
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated()


@pytest.mark.parametrize("exp_id", [e.id for e in all_experiments()])
def test_experiment_leaves_allocated_memory_as_found(exp_id, live_mode):
    exp = ex.get(exp_id)
    problems = []
    for point in range_ends(exp):
        changed = {k: v for k, v in point.items() if v != exp.defaults[k]} or "defaults"
        before = _allocated()
        try:
            ex.run(exp_id, **point)
        except ValueError as err:
            # A point this GPU cannot hold is refused before any work (check_fits): a valid answer.
            print(f"{exp_id} {changed}: refused: {err}")
        except Exception as err:  # noqa: BLE001  (report every point, then fail)
            problems.append(f"{changed}: raised {type(err).__name__}: {str(err)[:300]}")
        left = _allocated() - before
        if left > 0:
            problems.append(f"{changed}: {left} bytes ({left / 2**20:.2f} MiB) still allocated after it returned")
    assert not problems, f"{exp_id}:\n" + "\n".join(problems)
