"""Inside a fresh sandbox: run one function answer through its exercise's harness
(``python -m experiments.grading.harness``).

The request (JSON on stdin): the exercise's label, the function's record (its source and
the globals it uses, :func:`.capture.function_record`) and the limits. This process loads
the installed package first, then rebuilds the student's function from its source and calls
``exercise.harness(fn)``, which calls it on the check's own inputs and returns what happened
as plain data. That data is the one line this process writes; the verdict is the grader's
(``exercise.judge``, in its own process).

The student's function runs in this process, so it could write a line of its own or end
the process early: it then gets an error, or the verdict on whatever plain data it wrote
(its own outputs, which is what it answers anyway). Output the function prints goes nowhere.
"""
from __future__ import annotations

import builtins
import importlib
import json
import linecache
import os
import sys
import types
from typing import Any, Callable


class RebuildError(ValueError):
    """The submitted function cannot be rebuilt from its source (the student's code)."""


def rebuild(record: dict[str, Any], ns: dict[str, Any] | None = None) -> Callable[..., Any]:
    """The function a record describes, compiled from its source with its globals.

    Raises:
        RebuildError: its source does not compile or run, or defines no function.
    """
    space = ns if ns is not None else {"__name__": "__answer__", "__builtins__": builtins}
    for name, entry in record["globals"].items():
        (kind, value), = entry.items()
        try:
            if kind == "module":
                space[name] = importlib.import_module(value)
            elif kind == "import":
                obj: Any = importlib.import_module(value[0])
                for part in value[1].split("."):
                    obj = getattr(obj, part)
                space[name] = obj
            elif kind == "function":
                space[name] = rebuild(value, space)
            else:
                space[name] = value
        except RebuildError:
            raise
        except Exception as e:  # a module or name that does not exist here: the function may not need it
            space.pop(name, None)
            sys.stderr.write(f"global {name}: {type(e).__name__}\n")
    filename = f"<answer {record['name']}>"
    source = record["source"]
    # inspect.getsource must find it (the sync-free check scans the source)
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    before = {k: id(v) for k, v in space.items()}
    try:
        exec(compile(source, filename, "exec"), space)  # noqa: S102 - the sandbox is the point
    except Exception as e:
        raise RebuildError(f"its source raised {type(e).__name__} when defined") from None
    fn = space.get(record["name"])
    if record["name"] != "<lambda>" and isinstance(fn, types.FunctionType):
        return fn
    new = [v for k, v in space.items() if isinstance(v, types.FunctionType) and before.get(k) != id(v)]
    if not new:
        raise RebuildError(f"its source defines no function {record['name']!r}")
    return new[-1]


def main() -> int:
    from .sandbox import apply_limits
    from .wire import NotPlain, to_plain

    request = json.loads(sys.stdin.buffer.read())
    apply_limits(request["limits"])
    os.makedirs(os.path.join(os.environ["HOME"], "tmp"), exist_ok=True)
    out = os.fdopen(os.dup(1), "w")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)  # what the student's function prints goes nowhere

    from ..core import registry
    from ..core.checks import EXERCISES

    registry.load_chapters()
    ex = EXERCISES[request["label"]]
    try:
        fn = rebuild(request["function"])
        report = to_plain(ex.harness(fn))
        line = {"event": "report", "report": report}
    except RebuildError as e:
        line = {"event": "rebuild", "why": str(e)[:200]}
    except NotPlain as e:
        line = {"event": "bug", "why": f"the harness returned data that is not plain ({e})"}
    except Exception as e:  # raised around the student's code, outside what the harness catches
        line = {"event": "raised", "why": type(e).__name__}
    out.write(json.dumps(line, allow_nan=True) + "\n")
    out.flush()
    os._exit(0)  # no interpreter shutdown: the student's objects' finalizers do not run


if __name__ == "__main__":
    sys.exit(main())
