"""The instructors' grader: ``python -m experiments grade SUBMISSION... --out grades.csv``.

A tool package beside the chapters: it imports their exercise declarations
(:data:`experiments.core.checks.EXERCISES`, filled when the registry loads the chapters);
nothing in ``core`` or in a chapter imports it.

- :mod:`.notebooks`: finding submissions (never through a link) and their tagged check
  cells, within size and time limits; safe names;
- :mod:`.sandbox`: the bubblewrap sandbox and the limits every submission runs under;
  :mod:`.allowlist` (what of the file system it shows), :mod:`.seccomp` (its filter: no
  keyring, no new user namespace) and :mod:`.cgroups` (a control group per sandbox, where
  the machine allows);
- :mod:`.runner` (in the sandbox): runs a notebook with a capture cell after each check cell;
- :mod:`.capture` (in the student's kernel): answers as plain data;
- :mod:`.harness` (in a fresh sandbox): runs an answer that is a function through its
  exercise's harness, which measures; :mod:`.remote` and :mod:`.answer`: the function in a
  child process with nothing of the harness's, its torch calls run by the harness;
- :mod:`.wire`: the plain-data format, checked on the way out of a sandbox;
- :mod:`.grader`: scoring (the installed checks, in the grader's own process), rows, CSV, JSON;
- :mod:`.cli`: the ``grade`` command.
"""
from .grader import COLUMNS, STATUSES, TOTAL, Grader, Row, grade, grade_notebook, rows_to_csv, rows_to_json, write_atomic
from .notebooks import (GradeInputError, Unreadable, exercise_table, exercises, find_check_call, find_notebooks,
                        tag_exercise_cells)
from .sandbox import Limits, Sandbox, SandboxUnavailable

__all__ = ["COLUMNS", "STATUSES", "TOTAL", "Grader", "Row", "grade", "grade_notebook", "rows_to_csv", "rows_to_json",
           "write_atomic", "GradeInputError", "Unreadable", "exercise_table", "exercises", "find_check_call",
           "find_notebooks", "tag_exercise_cells", "Limits", "Sandbox", "SandboxUnavailable"]
