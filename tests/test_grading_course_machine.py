"""Hostile submissions on a machine set up as a course machine usually is (issue 27): grading
from a course folder under a home, a login session with a keyring, other clones of the
repository and last year's grades on disk, two grading runs at once, archives from a learning
platform with any bytes in their file names. Each test below is one attack of the issue, tried
against the grader first (each failed before its fix), then kept.

Everything planted is a harmless marker in a temporary folder (or, as root, in a folder of its
own under /opt and /var/lib that the test removes); every sandbox and folder name is unique, so
the tests can run in parallel with each other and with other grading runs.

Expectations come from the issue's rules, never from the grader: a forged report scores nothing
and is never shown as a grader bug; nothing outside the allowlist is visible in a sandbox; a
link is refused and its target never quoted; no keyring is reachable and no user namespace can
be made, in every mode; one sandbox's processes cannot starve or out-allocate another's, and two
runs never share a user id; a pathological cell costs its notebook only, in bounded time; any
file name gives a safe, readable row; a notebook is graded on its own chapter only.
"""
from __future__ import annotations

import concurrent.futures
import csv
import ctypes
import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import nbformat
import pytest

from experiments.grading import grader as grading
from experiments.grading import notebooks, wire
from experiments.grading.allowlist import SYSTEM
from experiments.grading.sandbox import Limits, Sandbox

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
ROOT_USER = os.geteuid() == 0
MARK = f"memlab-course-{uuid.uuid4().hex[:10]}"   # in every planted secret of this run


def _probe(sb: Sandbox, code: str, *, seconds: float = 60, limits: Limits = Limits()) -> dict:
    """Run ``code`` (Python) in the sandbox; returns the last JSON object it printed (or
    ``{"no result": stderr tail}``)."""
    out = sb.run(["-c", textwrap.dedent(code)], b"", seconds=seconds, limits=limits, module=None)
    lines = [ln for ln in out.lines if ln.startswith(b"{")]
    return json.loads(lines[-1]) if lines else {"no result": out.stderr_tail[-1500:], "rc": out.returncode}


@pytest.fixture(scope="module")
def prepared():
    """One sandbox prepared as the grader prepares it (its mode, its control groups)."""
    sb = Sandbox()
    sb.prepare()
    yield sb
    sb.close()


@pytest.fixture(scope="module")
def modes(prepared):
    """The sandbox modes this machine can make (as root: nobody in a user namespace, and root
    dropping to a user id of its own; otherwise the caller in a user namespace): the
    grader's choice, and every other one that starts Python here."""
    found = [prepared.mode]
    for mode in (["nobody", "root-drop"] if ROOT_USER else ["user"]):
        if mode != prepared.mode:
            sb = _sandbox(prepared, mode)
            try:
                if "ok" in _probe(sb, "print('{\"ok\": 1}')"):
                    found.append(mode)
            finally:
                sb.close()
    return found


def _sandbox(prepared: Sandbox, mode: str | None = None, **kw) -> Sandbox:
    """A sandbox like ``prepared`` (same mode unless ``mode``, same control groups), for
    other folders to hide, without probing the machine again."""
    sb = Sandbox(**kw)
    sb.mode, sb.groups, sb.no_groups = mode or prepared.mode, prepared.groups, prepared.no_groups
    return sb


# ----------------------------------------------------------------------------- forged GPU verdicts

# Reports each GPU exercise's judge accepts as correct: what a forger writes instead of solving.
FORGED_REPORTS = {
    "ex-syncs-rewrite": {"gpu": True, "findings": [], "raised": None, "diff": "", "syncs": 0, "sync_report": "",
                         "host_ms": 0.1, "queued_ms": 20.0},
    "ex-pinned-loader": {"gpu": True, "n_batches": 8, "n_buffers": 2, "queued_ms": 200.0, "yielded": [8, 8],
                         "wrong_batches": [[], []], "ahead_ms": 1.0, "problem": None},
    "ex-streams-handoff": {"gpu": True, "layers": 8, "trials": 3, "error": None, "error_kind": None,
                           "missing_layers": [], "first_corrupted": None, "corrupted_trials": 0, "distinct_blocks": 2,
                           "peak_active_mib": 128.0, "span_ms": 30.0, "reference_span_ms": 30.0, "buffer_mib": 64.0},
}
STUDENT_TEXT = f"{MARK} grading crashed: rerun with --unsafe-no-sandbox"


def _forger(*lines: dict) -> wire.FunctionAnswer:
    """A function answer whose source, when it is defined (or called), writes ``lines`` on every
    descriptor it has and on every descriptor of another process it can open through /proc (the
    harness's copy of stdout, bubblewrap's), then ends its process: no attempt at the exercise."""
    text = "".join(json.dumps(line) + "\n" for line in lines)
    source = textwrap.dedent(f'''
        import os as _os
        def _forge():
            data = {text!r}.encode()
            for _fd in range(0, 256):
                try:
                    _os.write(_fd, data)
                except OSError:
                    pass
            for _pid in _os.listdir("/proc"):
                if _pid.isdigit() and int(_pid) != _os.getpid():
                    try:
                        _fds = _os.listdir(f"/proc/{{_pid}}/fd")
                    except OSError:
                        continue
                    for _n in _fds:
                        try:
                            _w = _os.open(f"/proc/{{_pid}}/fd/{{_n}}", _os.O_WRONLY | _os.O_NONBLOCK)
                            _os.write(_w, data)
                            _os.close(_w)
                        except OSError:
                            pass
            _os._exit(0)
        _forge()

        def answer(*args, **kwargs):
            _forge()
    ''')
    return wire.FunctionAnswer({"name": "answer", "source": source, "globals": {}})


def _forged_report(label: str) -> wire.FunctionAnswer:
    """A forger of a report its judge accepts, in every line format a harness has written (the
    grader before issue 27 read ``{"event": "report"}``; now a ``result`` line)."""
    report = FORGED_REPORTS[label]
    return _forger({"event": "report", "report": report},
                   {"event": "result", "kind": "report", "gpu": True, "report": report})


# Lines a forger writes to be shown as a failure of the grader: one in the format the grader
# read before issue 27 (one line: more would be refused as several results), and a result line
# of each kind whose text a row shows.
STUDENT_LINES = [{"event": "bug", "why": STUDENT_TEXT}] + \
    [{"event": "result", "kind": kind, "gpu": True, "why": STUDENT_TEXT} for kind in ("bug", "raised", "rebuild")]


def _graders(prepared: Sandbox) -> tuple[grading.Grader, grading.Grader]:
    """A --live and a recorded grader that use ``prepared``'s way to sandbox (no second probe)."""
    out = []
    for live in (True, False):
        g = grading.Grader(live=live)
        g.sandbox.mode, g.sandbox.groups, g.sandbox.no_groups = prepared.mode, prepared.groups, prepared.no_groups
        out.append(g)
    return out[0], out[1]


@pytest.fixture(scope="module")
def graders(prepared):
    live, recorded = _graders(prepared)
    yield {"live": live, "recorded": recorded}
    live.close()
    recorded.close()


@pytest.fixture(scope="module")
def forged(graders):
    """Every forger's run, two at a time (each a sandbox of its own): {label: (status, graded
    feedback, full feedback)}; the GPU exercises graded --live (this machine has no GPU: a
    report that says it has one is a lie), and a student's text as a grader bug (recorded)."""
    from experiments.core.checks import EXERCISES

    notebooks.exercises()
    runs = {label: (graders["live"], _forged_report(label)) for label in FORGED_REPORTS}
    runs["student text"] = (graders["recorded"], _forger(*STUDENT_LINES))
    label_of = {"student text": "ex-alloc-frag-index"}

    def one(key):
        g, answer = runs[key]
        return key, g._function(EXERCISES[label_of.get(key, key)], answer, time.monotonic() + 300)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        return dict(pool.map(one, runs))


@pytest.mark.parametrize("label", sorted(FORGED_REPORTS))
def test_a_function_answer_cannot_write_its_own_gpu_report(forged, label):
    """Issue: the function found the harness's copy of stdout, wrote a report its judge accepts
    (a GPU, no sync, every batch on time) and exited: full marks with no attempt, and the judge
    took the report's word that a GPU was there."""
    status, text, full = forged[label]
    assert status == "error", (status, text, full)
    assert "bug in the grader" not in text + full


def test_student_text_is_never_shown_as_a_grader_bug(forged):
    """Issue: the same path let student text appear as 'a bug in the grader, please report it'
    and nudge the instructor toward --unsafe-no-sandbox."""
    status, text, full = forged["student text"]
    assert status == "error", (status, text, full)
    assert "bug in the grader" not in text + full and MARK not in text + full and "unsafe" not in text + full


# ----------------------------------------------------------------------------- what a sandbox can see

@pytest.fixture
def course(tmp_path, monkeypatch):
    """An instructor's course folder under a home, grading started from it (sys.path[0]), and a
    PYTHONPATH entry with a secret beside it."""
    home = tmp_path / "home" / "teacher"
    folder = home / "course"
    (folder / "submissions").mkdir(parents=True)
    secrets = {folder / ".env": f"API_TOKEN={MARK}-env", folder / "solutions.py": f"# {MARK}-solutions",
               folder / "grades-2025.csv": f"alice,{MARK}-grades", folder / "submissions" / "bob.ipynb": f"{MARK}-bob"}
    extra = tmp_path / "pythonpath"
    extra.mkdir()
    secrets[extra / "notes.txt"] = f"{MARK}-pythonpath"
    for path, text in secrets.items():
        path.write_text(text)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(folder)
    monkeypatch.setattr(sys, "path", [str(folder), *sys.path])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(extra), os.environ.get("PYTHONPATH")])))
    return {"folder": folder, "secrets": secrets}


def test_the_working_folder_and_pythonpath_are_not_shown_again(course, prepared, modes):
    """Issue: sys.path[0] (the folder grading started from) and PYTHONPATH entries were bound
    back into the sandbox although they lie under a hidden home: a student read a classmate's
    notebook, the instructor's .env, a solutions file and last year's grades."""
    paths = [str(p) for p in course["secrets"]]
    for mode in modes:
        sb = _sandbox(prepared, mode, hide=[course["folder"] / "submissions"])
        try:
            got = _probe(sb, f"""
                import json
                seen = {{}}
                for p in {paths!r}:
                    try:
                        seen[p] = open(p).read()
                    except OSError as e:
                        seen[p] = type(e).__name__
                print(json.dumps(seen))
            """)
        finally:
            sb.close()
        assert "no result" not in got, got
        leaked = {p: v for p, v in got.items() if MARK in v}
        assert not leaked, (mode, leaked)


def test_packages_on_pythonpath_outside_hidden_places_are_imported(tmp_path, prepared, monkeypatch):
    """Not an attack: what the allowlist must keep. Packages installed on PYTHONPATH (as the GPU
    machine's are: `pip install --target`) under /opt or /usr/local are imported in the sandbox;
    one under a hidden place (/tmp) is not shown."""
    if not ROOT_USER:
        pytest.skip("planting packages under /opt and /usr/local needs root (CI runs as root)")
    name = MARK.replace("-", "_")
    places = {"opt": Path("/opt") / f"{MARK}-site", "usr": Path("/usr/local/lib") / f"{MARK}-site",
              "tmp": tmp_path / "site"}
    try:
        for where, folder in places.items():
            (folder / f"{name}_{where}").mkdir(parents=True)
            (folder / f"{name}_{where}" / "__init__.py").write_text(f"WHERE = {where!r}\n")
            os.chmod(folder, 0o755)
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(str(f) for f in places.values()))
        sb = _sandbox(prepared)
        try:
            got = _probe(sb, f"""
                import importlib, json
                out = {{}}
                for where in ("opt", "usr", "tmp"):
                    try:
                        out[where] = importlib.import_module("{name}_" + where).WHERE
                    except ImportError as e:
                        out[where] = type(e).__name__
                print(json.dumps(out))
            """)
        finally:
            sb.close()
    finally:
        for folder in places.values():
            shutil.rmtree(folder, ignore_errors=True)
    assert got == {"opt": "opt", "usr": "usr", "tmp": "ModuleNotFoundError"}, got


@pytest.fixture
def other_places():
    """As root: another clone of the repository's solutions under /opt and last year's grades
    under /var/lib, world-readable (a course machine's usual places); removed afterwards."""
    if not ROOT_USER:
        pytest.skip("planting files under /opt and /var/lib needs root (CI runs as root)")
    made = [Path("/opt") / MARK, Path("/var/lib") / MARK]
    (made[0] / "book" / "src").mkdir(parents=True)
    (made[0] / "book" / "src" / "ch1_solutions.py").write_text(f"# {MARK}-clone")
    made[1].mkdir()
    (made[1] / "grades.csv").write_text(f"carol,{MARK}-lastyear")
    for d in made:
        os.chmod(d, 0o755)
    yield made
    for d in made:
        shutil.rmtree(d, ignore_errors=True)


WALK = """
    import json, os, time
    planted = {p: os.path.exists(p) for p in PLANTED}
    found, notebooks, tops, complete = [], [], sorted(os.listdir("/")), True
    t0 = time.monotonic()
    for root, dirs, files in os.walk("/"):
        if time.monotonic() - t0 > 40:   # all of a machine is far more than a sandbox shows
            complete = False
            break
        if root in SKIP:
            dirs[:] = []
            continue
        for f in files:
            path = os.path.join(root, f)
            if f.endswith(".ipynb") or "book/src" in root:
                notebooks.append(path)
            try:
                with open(path, errors="replace") as fh:
                    if MARK in fh.read(1 << 16):
                        found.append(path)
            except OSError:
                pass
    print(json.dumps({"planted": planted, "found": found, "notebooks": notebooks[:20], "tops": tops,
                      "complete": complete}))
"""


def test_nothing_outside_the_allowlist_is_visible(other_places, prepared, modes):
    """Issue: everything world-readable outside a short list was visible: another clone of the
    repository, last year's grades, rosters; a walk of / found notebooks with solutions. Here
    everything a sandbox sees is walked but the system's and Python's own folders: no planted
    file, no notebook, no repository's book/src, and the walk ends (a whole machine would not)."""
    planted = [str(p) for d in other_places for p in [d, *d.rglob("*")]]
    for mode in modes:
        sb = _sandbox(prepared, mode)
        skip = {"/proc", "/sys", "/dev", *SYSTEM, *(p for p in sb.shown() if p != sb.pkg_dir)}
        code = WALK.replace("SKIP", repr(sorted(skip))).replace("MARK", repr(MARK)).replace("PLANTED", repr(planted))
        try:
            got = _probe(sb, code, seconds=90)
        finally:
            sb.close()
        assert "no result" not in got, got
        assert not any(got["planted"].values()) and not got["found"], (mode, got)
        assert not got["notebooks"] and got["complete"], (mode, got)
        assert not {"opt", "srv", "home", "mnt", "media", "var", "run"} & set(got["tops"]), (mode, got["tops"])


# ----------------------------------------------------------------------------- links and file contents

def test_a_linked_submission_is_refused_and_its_target_never_quoted(tmp_path, graders):
    """Issue: links were read with the grader's rights and the 'unreadable' row quoted the
    target's first bytes (a private key, a .env, /proc/self/environ); a link to a classmate's
    notebook was graded as the linker's."""
    klass = tmp_path / "class"
    klass.mkdir()
    key = tmp_path / "id_rsa"
    key.write_text(f"{MARK}-private-key")
    (tmp_path / "dotenv").write_text(f'{{"{MARK}": "env"}}')
    victim = klass / "alice.ipynb"
    victim.write_text(nbformat.writes(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")])))
    (klass / "bob.ipynb").symlink_to(victim)
    (klass / "carol.ipynb").symlink_to(key)
    (klass / "dave.ipynb").symlink_to(tmp_path / "dotenv")
    (klass / "erin.ipynb").symlink_to("/proc/self/environ")
    (klass / "notjson.ipynb").write_text(f"{MARK} not a notebook at all")
    (klass / "notnb.ipynb").write_text(json.dumps({"nbformat": MARK, "cells": MARK}))
    (klass / "linked-dir").symlink_to(tmp_path, target_is_directory=True)
    found = [str(p.relative_to(klass)) for p in notebooks.find_notebooks([klass])]
    assert not any(f.startswith("linked-dir") for f in found), found
    grader = graders["recorded"]
    for name in ("bob", "carol", "dave", "erin", "notjson", "notnb"):
        rows = grader.grade_notebook(klass / f"{name}.ipynb")
        assert [(r.exercise, r.status) for r in rows] == [("total", "unreadable")], (name, rows)
        assert MARK not in rows[0].feedback and "bug" not in rows[0].feedback, (name, rows[0].feedback)
        # a link is refused as a link (the classmate's notebook is not read as bob's)
        assert ("link" in rows[0].feedback) == (name in ("bob", "carol", "dave", "erin")), (name, rows[0].feedback)
    alice = grader.grade_notebook(victim)
    assert alice[0].status == "unreadable" and "no exercise" in alice[0].feedback  # the real file is read


# ----------------------------------------------------------------------------- keyrings and user namespaces

KEYCTL, ADD_KEY, REQUEST_KEY = {"x86_64": (250, 248, 249), "aarch64": (219, 217, 218)}[os.uname().machine]
KEY_PROBE = f"""
    import ctypes, json, os, subprocess
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    out = {{}}
    kid = libc.syscall({KEYCTL}, 10, ctypes.c_long(-3), b"user", b"{MARK}-grader", 0)  # KEYCTL_SEARCH @s
    out["search"] = [kid, ctypes.get_errno()]
    if kid > 0:
        buf = ctypes.create_string_buffer(200)
        n = libc.syscall({KEYCTL}, 11, ctypes.c_long(kid), buf, 200)  # KEYCTL_READ
        out["read"] = buf.raw[:max(n, 0)].decode(errors="replace")
    left = libc.syscall({KEYCTL}, 10, ctypes.c_long(-4), b"user", b"{MARK}-left", 0)   # left in @u by a classmate?
    out["left"] = [left, ctypes.get_errno()]
    for ring in (-3, -4, -5):  # session, user, user session
        r = libc.syscall({ADD_KEY}, b"user", b"{MARK}-left", b"x", 1, ctypes.c_long(ring))
        out[f"add {{ring}}"] = [r, ctypes.get_errno()]
    r = libc.syscall({REQUEST_KEY}, b"user", b"{MARK}-grader", None, 0)
    out["request"] = [r, ctypes.get_errno()]
    try:
        out["proc_keys"] = open("/proc/keys").read()
    except OSError as e:
        out["proc_keys"] = type(e).__name__
    print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def grader_keyring():
    """The grader's login keyring, as pam_keyinit sets one up, holding a secret (this test
    process joins a session keyring of its own first, so nothing else of the machine's is used)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if libc.syscall(KEYCTL, 1, f"{MARK}-login".encode(), 0, 0, 0) < 0:  # KEYCTL_JOIN_SESSION_KEYRING
        pytest.skip(f"this kernel has no keyrings (errno {ctypes.get_errno()})")
    secret = f"{MARK}-grader-payload".encode()
    assert libc.syscall(ADD_KEY, b"user", f"{MARK}-grader".encode(), secret, len(secret), ctypes.c_long(-3)) > 0
    return secret.decode()


def test_no_keyring_is_reachable_in_any_mode(grader_keyring, prepared, modes):
    """Issue: a sandboxed process read and added keys in the grader's session keyring, and in
    root-drop mode a key left by one student was read by the next."""
    for mode in modes:
        for _ in range(2):  # the second sandbox would find what the first left
            sb = _sandbox(prepared, mode)
            try:
                got = _probe(sb, KEY_PROBE)
            finally:
                sb.close()
            assert "no result" not in got, got
            assert got["search"][0] < 0 and got["left"][0] < 0 and got["request"][0] < 0, (mode, got)
            assert all(v[0] < 0 for k, v in got.items() if k.startswith("add")), (mode, got)
            assert grader_keyring not in json.dumps(got) and f"{MARK}-grader" not in got["proc_keys"], (mode, got)


USERNS_PROBE = """
    import ctypes, json, os, subprocess
    libc = ctypes.CDLL(None, use_errno=True)
    out = {}
    r = subprocess.run(["unshare", "-Urm", "id", "-u"], capture_output=True, text=True)
    out["unshare -Urm"] = [r.returncode, r.stdout.strip()]
    pid = os.fork()
    if pid == 0:
        os._exit(0 if libc.unshare(0x10000000) == 0 else 1)  # CLONE_NEWUSER
    out["unshare(CLONE_NEWUSER)"] = os.waitpid(pid, 0)[1]
    print(json.dumps(out))
"""


def test_no_user_namespace_can_be_made_in_any_mode(prepared, modes):
    """Issue: in root-drop mode user namespaces were allowed (`unshare -Urm` gave a root
    namespace inside)."""
    for mode in modes:
        sb = _sandbox(prepared, mode)
        try:
            got = _probe(sb, USERNS_PROBE)
        finally:
            sb.close()
        assert "no result" not in got, got
        assert got["unshare -Urm"][0] != 0 and got["unshare(CLONE_NEWUSER)"] != 0, (mode, got)


# ----------------------------------------------------------------------------- fair shares

def test_two_grading_runs_never_share_a_sandbox_user(prepared, modes):
    """Issue: two grading runs on one machine gave their sandboxes the same user ids, so one
    student's processes (counted per user) stopped the other run's kernels from starting."""
    if "root-drop" not in modes:
        pytest.skip("sandbox user ids are the grader's own choice only in root-drop mode")
    runs = [_sandbox(prepared, "root-drop"), _sandbox(prepared, "root-drop")]
    got = {}

    def one(i):
        got[i] = _probe(runs[i], "import json, os, time\ntime.sleep(2)\nprint(json.dumps({'uid': os.getuid()}))")

    try:
        threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for sb in runs:
            sb.close()
    assert "uid" in got[0] and "uid" in got[1], got
    assert got[0]["uid"] != got[1]["uid"], got


FLOOD = """
    import json, subprocess, time
    procs = []
    for _ in range(150):  # each starts spinning once all are started
        try:
            procs.append(subprocess.Popen(["sh", "-c", "sleep 2; while :; do :; done"], start_new_session=True))
        except OSError:
            break
    print(json.dumps({"started": len(procs)}), flush=True)
    time.sleep(SECONDS)
"""

MEASURE = """
    import json, time
    time.sleep(5)  # the flood beside it is spinning by then
    t0, c0 = time.monotonic(), time.process_time()
    while time.monotonic() - t0 < 4:
        pass
    print(json.dumps({"share": (time.process_time() - c0) / (time.monotonic() - t0)}))
"""


def test_a_process_flood_does_not_starve_the_notebook_graded_beside_it(prepared, modes):
    """Issue: with --jobs 2, 200 children that each called setsid() starved the classmate graded
    beside them into a timeout. Here a flood of 150 busy processes runs beside a single busy
    loop: the loop must still get a fair part of a core."""
    sb = _sandbox(prepared)
    if not sb.bounds().get("cpu"):
        sb.close()
        pytest.skip(f"no cgroups here: {sb.unbounded()}")
    got = {}

    def run(key, code, seconds):
        got[key] = _probe(sb, code, seconds=seconds)

    try:
        flood = threading.Thread(target=run, args=("flood", FLOOD.replace("SECONDS", "9"), 25))
        flood.start()
        run("measure", MEASURE, 30)
        flood.join()
    finally:
        sb.close()
    started = got["flood"].get("started", 0)
    assert started >= 100, got
    # Without a CPU group each, the loop is one of started + 1 busy processes: about 2 cores / 151
    # = 0.013 of a core on a 2-core machine (0.013 measured before issue 27). With one, the two
    # sandboxes weigh the same, whatever else the machine runs (a loaded test machine: 0.1-0.5).
    unfair = len(os.sched_getaffinity(0)) / (started + 1)
    assert got["measure"]["share"] >= 4 * unfair, (got, unfair)


# Each child holds its 300 MiB until every child has said whether it got them (it waits for its
# stdin to close), and then says it still holds them: those that do held them all at once, however
# slowly they started. (A child that held for a fixed 4 s and was counted when it said "held" could
# end, or be the one the limit killed, before the fifth started: on a loaded machine four or five
# were counted.)
HOG = """
    import json, subprocess, sys
    child = ("import sys; b = bytearray(300 << 20); b[::4096] = b'x' * len(b[::4096]); print('held', flush=True); "
             "sys.stdin.read(); print('still', flush=True)")
    procs = [subprocess.Popen([sys.executable, "-c", child], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
             for _ in range(5)]
    said = [p.stdout.readline() for p in procs]
    for p in procs:
        p.stdin.close()
    held = sum(s.startswith(b"held") and p.stdout.readline().startswith(b"still") for s, p in zip(said, procs))
    for p in procs:
        p.wait()
    print(json.dumps({"held": held}))
"""


def test_all_processes_of_a_sandbox_share_one_memory_limit(prepared, modes):
    """Issue: limits were per process: children together held 7 GiB under a 3 GiB limit. Here
    five children each take 300 MiB under a 512 MiB limit."""
    sb = _sandbox(prepared)
    try:
        if not sb.bounds().get("memory"):
            pytest.skip(f"no cgroups here: {sb.unbounded()}")
        got = _probe(sb, HOG, limits=Limits(memory_mib=512), seconds=60)
    finally:
        sb.close()
    assert "held" in got, got
    assert got["held"] <= 3, got   # the group's limit is the memory limit plus the scratch folders


def test_grade_says_what_it_cannot_bound_where_no_control_group_can_be_made(tmp_path, monkeypatch):
    """Issue: where cgroups are not available, `grade` must say what it cannot bound. Here the
    machine is made to look like one without any (no systemd-run, no cgroup mount): the
    sandbox still starts, and the line `grade` prints names what is left per process."""
    from experiments.grading import cgroups

    monkeypatch.setattr(cgroups, "_systemd", lambda: (None, "no systemd-run"))
    monkeypatch.setattr(cgroups, "_mounts", lambda: [])
    nb = tmp_path / "notes.ipynb"
    nb.write_text(nbformat.writes(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")])))
    lines: list[str] = []
    rows = grading.grade([nb], progress=lines.append)
    assert [r.status for r in rows] == ["unreadable"]
    said = lines[0]
    assert "NOT BOUNDED" in said and "no control group" in said, said
    for what in ("memory is limited per process only", "share the CPU", "processes are counted per user"):
        assert what in said, (what, said)


# ----------------------------------------------------------------------------- parsing

BANGS = "!ls\n" * 16_000   # 64 KiB


PLAN = """
import json, sys, time, nbformat
from experiments.grading import notebooks
notebooks.exercises()
for text in json.loads(sys.stdin.read()):
    nb = nbformat.reads(text, as_version=4)
    c0 = time.process_time()
    try:
        got = {p.ex.label: [p.status, p.expressions] for p in notebooks.plan(nb, notebooks.notebook_exercises(nb))}
    except notebooks.Unreadable:
        got = None
    print(json.dumps([time.process_time() - c0, got]), flush=True)
"""


def _plans(nbs: list[nbformat.NotebookNode], limit: float) -> list:
    """[(CPU seconds the grader's planning of a notebook takes, {label: [status, answer
    expressions]})] in one fresh process; a notebook not planned within ``limit`` wall seconds
    (all of them, with the process's start) is missing from the list."""
    proc = subprocess.Popen([sys.executable, "-c", PLAN], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        out, err = proc.communicate(json.dumps([nbformat.writes(nb) for nb in nbs]), timeout=limit)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return [json.loads(line) for line in out.splitlines() if line.startswith("[")]


def test_a_pathological_cell_is_parsed_in_bounded_time():
    """Issue: a 64 KiB cell of `!` lines cost the grader 150-270 s of its own CPU before any
    sandbox, and the next notebook waited. Now only tagged cells are parsed, each linearly and
    within a size limit: the tagged cell's check call is found; the same lines in an untagged
    cell are not read; a larger check cell is that exercise's error row."""
    def notebook(*cells, tag=None):
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
        if tag is not None:
            nb.cells[tag].metadata["exercise"] = "ex-pinned-rounding"
        nb.metadata["memlab"] = {"chapter": 3}
        return nb

    check = "pinned.check_rounding(4)"
    nbs = [notebook(BANGS + check, tag=0), notebook(BANGS, check), notebook(BANGS + BANGS + check, tag=0)]
    got = _plans(nbs, 120)   # the process's start (torch, the chapters) takes most of that when loaded
    assert len(got) == 3, got
    assert all(cpu < 2 for cpu, _ in got), [cpu for cpu, _ in got]   # CPU seconds, not wall: a loaded machine is fair
    assert got[0][1]["ex-pinned-rounding"] == [None, {"answer_gib": "4"}]
    assert got[1][1]["ex-pinned-rounding"][0] == "missing"
    assert got[2][1]["ex-pinned-rounding"][0] == "error"


# ----------------------------------------------------------------------------- file names

NAMES = {
    "windows zip": b"L\x94sung.ipynb",
    "carriage return": b"ok\r=HYPERLINK(\"http:x.example\",\"click\").ipynb",
    "line feed": b"two\n@SUM(1+1)*cmd|' -C calc'!A0.ipynb",
    "terminal": b"\x1b]2;owned\x07\x1b[31mred.ipynb",
    "formula": b"=1+1.ipynb",
    "upper case": b"Ch1.IPYNB",
}


def test_any_file_name_gives_a_safe_readable_row(tmp_path, graders):
    """Issue: one non-UTF-8 name (a Windows zip's 'Lösung.ipynb') lost the whole class's CSV; a
    carriage return got =HYPERLINK formulas past the CSV guard; terminal escapes were printed
    raw; a notebook named Ch1.IPYNB was refused or skipped. The class is graded as an
    instructor grades it (the CLI, its progress lines); the JSON from the same rows."""
    klass = tmp_path / "class"
    klass.mkdir()
    plain = nbformat.writes(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")]))
    for raw in NAMES.values():
        with open(os.path.join(os.fsencode(klass), raw), "w") as f:
            f.write(plain)
    out = tmp_path / "grades.csv"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "experiments", "grade", str(klass), "--timeout", "60", "--out", str(out)],
                       capture_output=True, env=env, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    for stream in (r.stdout, r.stderr):
        assert b"\x1b" not in stream and b"\x07" not in stream and b"\r" not in stream, stream[-500:]
    progress = r.stderr.decode("utf-8").splitlines()   # UTF-8, one line per notebook
    assert sum(line.startswith("[") for line in progress) == len(NAMES), progress
    text = out.read_bytes().decode("utf-8")   # the CSV exists and is UTF-8
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == len(NAMES), rows
    for row in rows:
        for value in row.values():
            assert value.isprintable(), row
            assert not value.startswith(("=", "+", "-", "@", "\t", "\r")), row
    names = [r["notebook"] for r in rows]
    assert any("Lösung" in n for n in names) and any(n.endswith("Ch1.IPYNB") for n in names), names
    graded = [row for path in notebooks.find_notebooks([klass]) for row in graders["recorded"].grade_notebook(path)]
    data = json.loads(grading.rows_to_json(graded))
    assert len(data) == len(NAMES) and all(d["notebook"].isprintable() for d in data), data
    assert sorted(d["notebook"] for d in data) == sorted(names)


# What a spreadsheet (Excel, LibreOffice, Google Sheets) reads as the start of a formula,
# fullwidth forms included (OWASP's CSV injection note).
SPREADSHEET_FORMULA = ("=", "+", "-", "@", "\t", "\r", "\uff1d", "\uff0b", "\uff0d", "\uff20")
FORMULAS = ["=HYPERLINK(\"http://x.example\",\"click\")", "\r=1+1", "\t=1+1", " =1+1", "+1", "-1+1", "@SUM(A1)",
            "\uff1d1+1", "ok\r\n=1+1", "\x1b[31m=1+1"]


def test_every_csv_cell_is_guarded_against_formulas():
    """Issue: a carriage return got =HYPERLINK(...) past the CSV guard (it looked at the first
    character only). Every cell of every column: no control character, and nothing a
    spreadsheet runs as a formula at a cell's start or a line's start."""
    fields = grading.Row.__dataclass_fields__
    rows = [grading.Row(**{k: v for k, v in dict(notebook=f, chapter=3, exercise=f, score=0.0, max_score=1.0,
                                                   status=f, feedback=f).items() if k in fields}) for f in FORMULAS]
    for row in csv.reader(io.StringIO(grading.rows_to_csv(rows))):
        for cell in row:
            assert cell.isprintable(), row
            assert not cell.lstrip(" ").startswith(SPREADSHEET_FORMULA), row


def test_an_upper_case_notebook_given_by_name_is_graded(tmp_path):
    path = tmp_path / "Ch3.IPYNB"
    path.write_text(nbformat.writes(nbformat.v4.new_notebook()))
    assert notebooks.find_notebooks([path]) == [path]


# ----------------------------------------------------------------------------- chapters

def _check_cell(label: str, call: str) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(call)
    cell.metadata["exercise"] = label
    return cell


def test_a_notebook_is_graded_on_its_own_chapter_only():
    """Issue: a notebook was graded on every chapter it had check cells for, and the CSV had no
    chapter column: the same answers counted in four files."""
    assert "chapter" in grading.COLUMNS
    ch1 = _check_cell("ex-alloc-22", 'al.check_pool_boundary_choice("b")')
    ch3 = _check_cell("ex-pinned-rounding", "pinned.check_rounding(4)")
    both = nbformat.v4.new_notebook(cells=[ch1, ch3])
    with pytest.raises(notebooks.Unreadable, match="chapter"):
        notebooks.notebook_exercises(both)
    own = nbformat.v4.new_notebook(cells=[ch1, ch3])
    own.metadata["memlab"] = {"chapter": 3}
    assert {ex.chapter for ex in notebooks.notebook_exercises(own)} == {3}
    plans = {p.ex.label: p for p in notebooks.plan(own, notebooks.notebook_exercises(own))}
    assert "ex-alloc-22" not in plans and plans["ex-pinned-rounding"].expressions == {"answer_gib": "4"}


# ----------------------------------------------------------------------------- on a GPU: the harness measures

def _record(source: str, name: str) -> wire.FunctionAnswer:
    return wire.FunctionAnswer({"name": name, "source": textwrap.dedent(source),
                                "globals": {"torch": {"module": "torch"}}})


LIVE_CASES = {
    # label: [(what, source, name, expected status, words in the check's message)]
    "ex-pinned-loader": [
        ("the book's double-buffered loader", """
            def my_loader(batches, n_buffers=2):
                ring, copied = [], [None] * n_buffers
                for k, batch in enumerate(batches):
                    slot = k % n_buffers
                    if len(ring) <= slot:
                        ring.append(torch.empty(batch.shape, dtype=batch.dtype, pin_memory=True))
                    if copied[slot] is not None:
                        copied[slot].synchronize()
                    ring[slot].copy_(batch)
                    out = ring[slot].to("cuda", non_blocking=True)
                    copied[slot] = torch.cuda.Event()
                    copied[slot].record()
                    yield out
        """, "my_loader", "correct", ""),
        ("a loader that waits for the GPU", """
            def my_loader(batches, n_buffers=2):
                for batch in batches:
                    out = batch.to("cuda")
                    torch.cuda.synchronize()
                    yield out
        """, "my_loader", "wrong", "waited for the GPU"),
    ],
    "ex-syncs-rewrite": [
        ("the book's rewrite", """
            def reduce_grad_stats_sync_free(local):
                totals = local.sum(dim=0)
                return torch.cat((totals[:1], totals[2:])), local[:, 1].max()
        """, "reduce_grad_stats_sync_free", "correct", ""),
        ("a rewrite that syncs in .item()", """
            def reduce_grad_stats_sync_free(local):
                totals = local.sum(dim=0)
                top = local[:, 1].max().item()
                return torch.cat((totals[:1], totals[2:])), torch.full((), top, device=local.device)
        """, "reduce_grad_stats_sync_free", "wrong", "Still syncs"),
    ],
    "ex-streams-handoff": [
        ("the book's event handoff", """
            def my_handoff(all_gather, forward, layers, producer, consumer):
                kept = None
                for layer in range(layers):
                    buf = all_gather(layer)
                    done = forward(buf, layer)
                    if kept is not None:
                        producer.wait_event(kept[1])
                    kept = (buf, done)
                    del buf
                if kept is not None:
                    producer.wait_event(kept[1])
        """, "my_handoff", "correct", ""),
        ("a handoff with record_stream", """
            def my_handoff(all_gather, forward, layers, producer, consumer):
                for layer in range(layers):
                    buf = all_gather(layer)
                    forward(buf, layer)
                    buf.record_stream(consumer)
        """, "my_handoff", "wrong", "record_stream"),
    ],
}


@pytest.mark.gpu
@pytest.mark.parametrize("label", sorted(LIVE_CASES))
def test_live_the_harness_measures_what_the_function_does(label):
    """On a GPU, graded live: each GPU exercise's function runs in a child without the GPU and
    its torch calls run in the harness, which measures them. The book's solution is correct;
    an answer that waits, syncs or uses record_stream is judged wrong for that, from the
    harness's own measurement; and a forger's report (written on every descriptor) is never
    taken for one."""
    from experiments.core.checks import EXERCISES

    notebooks.exercises()
    g = grading.Grader(live=True)
    print(g.prepare())
    try:
        for what, source, name, status, words in LIVE_CASES[label]:
            t0 = time.monotonic()
            got = g._function(EXERCISES[label], _record(source, name), time.monotonic() + 300)
            print(f"{label}, {what}: {got[0]} in {time.monotonic() - t0:.1f} s: {got[2] or got[1]}")
            assert got[0] == status and words in got[2], (what, got)
        forged = _forger({"event": "result", "kind": "report", "gpu": True, "report": FORGED_REPORTS[label]})
        got = g._function(EXERCISES[label], forged, time.monotonic() + 300)
        assert got[0] != "correct" and "bug in the grader" not in got[1], got
    finally:
        g.close()
