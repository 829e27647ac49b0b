"""Inside the sandbox: run one submission's notebook and report, line by line, what its
check cells and the grader's capture cells produced (``python .../grading/runner.py``: run as
a file, it imports only its two standard-library siblings, not the package and its torch).

The request (JSON on stdin, from the grader): the limits, the time budget, the output
budget, a copy of the submission for the scratch folder, and the code cells to run, each
with its role: ``setup`` (the grader's: loads the capture code), ``student``, ``check`` (a
student cell that is an exercise's check cell) or ``capture`` (the grader's, after a check
cell). The cells run top to bottom in one fresh kernel (nbclient); a cell that raises does
not stop the run.

Events (JSON lines, written only by this process on a descriptor the kernel never gets):
``setup``, ``check`` and ``answers`` (with the raw capture payloads, which the grader
checks as plain data), ``stopped`` (time, output or the kernel's death) and ``done``. Only
the outputs the grader reads are kept (errors, and the capture cells' answers): whatever
else the notebook prints is counted against the output budget and dropped.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any


def _error(cell: Any) -> dict[str, str] | None:
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            return {"ename": str(out.get("ename", "Error"))[:100], "evalue": str(out.get("evalue", ""))[:300]}
    return None


def main() -> int:
    if __package__:
        from .sandbox import apply_limits, nondumpable
        from .wire import MIME
    else:  # run as a file (the grader does): the package's __init__, and torch with it, stays unloaded
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from sandbox import apply_limits, nondumpable  # type: ignore[no-redef]
        from wire import MIME  # type: ignore[no-redef]

    nondumpable()
    request = json.loads(sys.stdin.buffer.read())
    apply_limits(request["limits"])
    t0 = time.monotonic()
    deadline = t0 + float(request["seconds"])
    # The events go out on a private copy of stdout; fd 1 and 2 then point nowhere useful for
    # anything this process starts.
    events = os.fdopen(os.dup(1), "w", buffering=1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)

    def emit(**event: Any) -> None:
        events.write(json.dumps(event, allow_nan=True) + "\n")

    for sub in ("tmp", "mpl", "ipython", "runtime", "jupyter", "jupyter-config", "cache", "config"):
        os.makedirs(os.path.join(os.environ["HOME"], sub), exist_ok=True)
    copy = request["copy"]
    with open(copy["name"], "w", encoding="utf-8") as f:
        f.write(copy["text"])

    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionComplete, CellTimeoutError, DeadKernelError

    cells = request["cells"]
    roles = {i: (c["role"], c.get("label")) for i, c in enumerate(cells)}
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c["source"]) for c in cells])
    budget = int(request["max_output_bytes"])

    class Client(NotebookClient):
        output_bytes = 0
        over_budget = False

        def process_message(self, msg: dict[str, Any], cell: Any, cell_index: int) -> Any:
            if msg.get("msg_type") in ("stream", "display_data", "execute_result", "error", "update_display_data") \
                    or str(msg.get("msg_type", "")).startswith("comm"):
                self.output_bytes += len(json.dumps(msg.get("content", {}), default=str))
                if self.output_bytes > budget:
                    self.over_budget = True
                    try:
                        self.km.provisioner.process.kill()  # stops a cell that prints without end
                    except Exception:  # already gone
                        pass
                    raise CellExecutionComplete()
            return super().process_message(msg, cell, cell_index)

        def output(self, outs: list, msg: dict[str, Any], display_id: str | None, cell_index: int) -> Any:
            role = roles.get(cell_index, ("student", None))[0]
            kind = msg["msg_type"]
            keep = kind == "error" or (role == "capture" and kind == "display_data"
                                       and MIME in msg.get("content", {}).get("data", {}))
            return super().output(outs, msg, display_id, cell_index) if keep else None

        def handle_comm_msg(self, outs: list, msg: dict[str, Any], cell_index: int) -> None:
            return None  # widgets: no state kept

    def kernel_status() -> int | None:
        try:
            return client.km.provisioner.process.poll()
        except Exception:
            return None

    client = Client(nb, timeout=60, startup_timeout=int(max(5, min(120, deadline - time.monotonic()))),
                    kernel_name="python3", allow_errors=True, record_timing=False, shutdown_kernel="immediate",
                    resources={"metadata": {"path": os.getcwd()}})
    try:
        client_context = client.setup_kernel(env=dict(os.environ), stdin=subprocess.DEVNULL,
                                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client_context.__enter__()
    except Exception as e:  # no kernel: nothing of the notebook ran
        emit(event="stopped", why="kernel did not start", at=0, detail=f"{type(e).__name__}: {e}"[:200])
        return 0
    emit(event="started")
    try:
        for index, cell in enumerate(nb.cells):
            role, label = roles[index]
            left = deadline - time.monotonic()
            if left < 1:
                emit(event="stopped", why="timeout", at=index)
                break
            client.timeout = max(1, int(left))
            try:
                client.execute_cell(cell, index)
            except CellTimeoutError:
                emit(event="stopped", why="timeout", at=index)
                break
            except DeadKernelError:
                status = kernel_status()
                why = "output limit" if client.over_budget else "kernel died"
                emit(event="stopped", why=why, at=index, signal=-status if status and status < 0 else None)
                break
            if client.over_budget:
                emit(event="stopped", why="output limit", at=index)
                break
            if role == "setup":
                emit(event="setup", error=_error(cell))
            elif role == "check":
                emit(event="check", label=label, error=_error(cell))
            elif role == "capture":
                payloads = [o["data"][MIME] for o in cell.get("outputs", [])
                            if o.get("output_type") == "display_data" and MIME in o.get("data", {})]
                emit(event="answers", label=label, payloads=[p if isinstance(p, str) else json.dumps(p, default=str)
                                                             for p in payloads][:4], error=_error(cell))
    finally:
        emit(event="done")
        try:
            client_context.__exit__(None, None, None)
        except Exception:  # a kernel that died or was killed: nothing to shut down
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
