"""Inside a fresh sandbox: run one function answer through its exercise's harness
(``python -m experiments.grading.harness``), the harness in this process and the student's
function in a child of its own.

The request (JSON on stdin): the exercise's label, the function's record (its source and
the globals it uses, :func:`.capture.function_record`), the limits and a nonce. This
process (the grader's code only, non-dumpable) starts the child first
(:class:`.remote.Answer`: no descriptor of this process's, its standard streams on
``/dev/null``), loads the installed package, has the child rebuild the function from its
source, and then runs ``exercise.harness(fn)`` here, with a stand-in for ``fn`` that calls the
child. For the exercises that run on the GPU, the child's torch calls run here too, so every
measurement the harness makes (syncs, time, memory, data on the device) is of this
process's own work.

This process alone writes the one line the grader reads: the nonce it was given, whether it
saw a GPU itself, and what happened (``kind``): ``report`` (the harness's plain data, which
the exercise's judge turns into the verdict in the grader's process), ``rebuild`` (the source
does not define the function), ``raised`` (the student's code raised outside what the harness
records), ``ended`` (the child ended during a call), ``protocol`` (the child wrote something
that is not the wire), or ``bug`` (this harness failed: only its exception's type is sent).
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any


def _name(value: Any) -> str:
    return "".join(ch for ch in str(value) if ch.isalnum() or ch in "._")[:60] or "Exception"


def main() -> int:
    from .sandbox import apply_limits, nondumpable

    nondumpable()
    request = json.loads(sys.stdin.buffer.read())
    apply_limits(request["limits"])
    os.makedirs(os.path.join(os.environ["HOME"], "tmp"), exist_ok=True)
    out = os.fdopen(os.dup(1), "w")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)

    from .remote import Answer, AnswerEnded, AnswerProtocolError, AnswerRaised, Rebuild
    from .wire import NotPlain, to_plain

    answer = None
    gpu = False
    t0 = time.monotonic()
    try:
        # the child starts, and rebuilds the function, while this process loads the chapters
        answer = Answer(remote_torch=bool(request.get("gpu_exercise")))
        answer.begin_load(request["function"])
        from ..core import registry
        from ..core.checks import EXERCISES
        from ..core.device import has_cuda

        registry.load_chapters()
        ex = EXERCISES[request["label"]]
        gpu = bool(has_cuda())
        fn = answer.end_load()
        result: dict[str, Any] = {"kind": "report", "report": to_plain(ex.harness(fn))}
    except Rebuild as e:
        result = {"kind": "rebuild", "why": str(e)[:200]}
    except AnswerRaised as e:   # raised by the student's code outside what the harness records
        result = {"kind": "raised", "why": _name(type(e).__name__)}
    except AnswerEnded as e:
        result = {"kind": "ended", "status": e.status if isinstance(e.status, int) else None}
    except AnswerProtocolError:
        result = {"kind": "protocol"}
    except NotPlain:
        result = {"kind": "bug", "why": "NotPlain"}
    except Exception as e:  # this harness's own failure: its type only (its text may hold the student's)
        import traceback

        traceback.print_exc(limit=8)
        result = {"kind": "bug", "why": _name(type(e).__name__)}
    finally:
        if answer is not None:
            answer.close()
    line = {"event": "result", "nonce": request.get("nonce"), "gpu": gpu, "seconds": time.monotonic() - t0, **result}
    out.write(json.dumps(line, allow_nan=True) + "\n")
    out.flush()
    os._exit(0)  # no interpreter shutdown: nothing of the answer's runs at exit here


if __name__ == "__main__":
    sys.exit(main())
