"""Every submission runs in a sandbox made by bubblewrap (``bwrap``, Debian ``bubblewrap``).

What a sandboxed process gets (:meth:`Sandbox.command` builds it):

- **no network**: a network namespace of its own, with only a loopback;
- **a read-only view of the system and the package**: ``/`` bound read-only, then the
  places a submission has no business reading hidden under empty read-only folders:
  ``$HOME``, ``/home``, ``/root``, ``/tmp``, ``/var/tmp``, ``/run``, ``/mnt``, ``/media``,
  ``/srv``, the grader's working folder, the repository the package comes from, the
  folders of the submissions and of the grader's output. Only what Python needs is shown
  again inside them, read-only: the Python installation, the virtual environment, the
  ``sys.path`` entries outside the repository, and the package folder ``experiments/``
  alone (the repository's ``book/`` with the solutions stays hidden);
- **a private writable scratch folder** ``/tmp/work``: an empty ``tmpfs`` of its own
  (``scratch_mib``), its ``HOME``, its ``TMPDIR`` and its working folder; and a small
  ``/dev/shm``. Nothing it writes reaches the disk or outlives it;
- **a clean environment**: ``PATH``, ``HOME``, locale, ``PYTHONPATH`` (the package and
  the grader's own ``PYTHONPATH`` entries), ``LD_LIBRARY_PATH``, ``CUDA_VISIBLE_DEVICES``,
  the mode, thread counts; nothing else of the grader's environment;
- **its own process, IPC and hostname namespaces** and a new session: it sees only its
  own processes and cannot reach the terminal. When the grader kills the sandbox (its
  time is up) or dies, every process in it dies with it (``--die-with-parent``; the
  kernel ends a PID namespace with its first process);
- **an unprivileged user**: run as root, the grader starts the sandbox as ``nobody`` in a
  user namespace of its own; where that cannot work (the kernel allows no such namespace,
  or Python lies in a folder ``nobody`` cannot read, such as ``/root``), bwrap runs as
  root and a few lines of Python (:data:`DROP`) switch to a user id of the sandbox's own,
  with no capabilities, before anything else starts. Run as another user, it is that user
  in a user namespace;
- **limits** (:class:`Limits`), set by the first process inside before any submitted code
  runs (:func:`apply_limits`): memory (``RLIMIT_AS`` and ``RLIMIT_DATA``; with a GPU,
  ``RLIMIT_DATA`` only, because CUDA reserves far more address space than it uses),
  processes and threads (``RLIMIT_NPROC``, counted per user namespace; it does not bind a
  process whose user is root outside, which is why the sandbox never runs as root), file
  size (``RLIMIT_FSIZE``), CPU time (``RLIMIT_CPU``), no core files; the scratch folder's
  size; and, enforced by the grader, the wall-clock time and the bytes that come back.

With ``--live``, the GPU's device nodes (``/dev/nvidia*``) are bound into the sandbox, and
nothing else extra.

Requirements: ``bwrap`` (0.8 or newer, for ``--size``) on a Linux kernel that lets bwrap
create the namespaces: run as root it always can; run as another user it needs
unprivileged user namespaces (Debian's default). :meth:`Sandbox.prepare` tries each way in
turn with a real Python start and says, in one line, why none works.
"""
from __future__ import annotations

import dataclasses
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Sequence

SCRATCH = "/tmp/work"
# Folders hidden in every sandbox (when they exist): homes, temporary and runtime folders, mounts.
HIDDEN = ("/home", "/root", "/tmp", "/var/tmp", "/run", "/mnt", "/media", "/srv")
# Never hidden: the system a Python needs (hiding one of these would break the sandbox, not protect).
PROTECTED = {"/", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/var",
             "/sys", "/proc", "/dev", "/boot", "/nix", "/snap"}
BWRAP_ENV = "CUDA_MEMLAB_BWRAP"  # a bwrap binary to use instead of the one on PATH
NOBODY = 65534
FIRST_UID = 2_000_000_000   # the user ids of sandboxes when bwrap runs as root without a user namespace
SHM_BYTES = 64 << 20
# Inside bwrap run as root: leave root for the sandbox's user id and groups, then run the command.
# bwrap has set no_new_privs and mounts everything nosuid, so nothing can gain privileges back.
DROP = ("import os, sys; uid = int(sys.argv[1]); groups = [int(g) for g in sys.argv[2].split(',') if g]; "
        "os.setgroups(groups); os.setresgid(uid, uid, uid); os.setresuid(uid, uid, uid); "
        "os.execv(sys.argv[3], sys.argv[3:])")


class SandboxUnavailable(RuntimeError):
    """No sandbox can be made here; the message says why, in one line."""


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one submission may use. All checked by :meth:`validate`.

    Attributes:
        timeout_s: wall-clock seconds for the whole submission (reading, running, scoring).
        memory_mib: address space (recorded mode) and data (both modes) per process, MiB.
        processes: processes and threads of the sandbox's user.
        file_mib: largest file a process may write, MiB.
        scratch_mib: size of the scratch folder (memory-backed), MiB.
        output_mib: what the notebook's cells may print or display in total, MiB.
        notebook_mib: largest submission file that is read at all, MiB.
    """

    timeout_s: float = 600.0
    memory_mib: int = 3072
    processes: int = 256
    file_mib: int = 64
    scratch_mib: int = 256
    output_mib: int = 16
    notebook_mib: int = 16

    def validate(self) -> "Limits":
        """Returns self. Raises ValueError naming a value out of its range."""
        ranges = {"timeout_s": (1, 86_400), "memory_mib": (512, 1 << 20), "processes": (32, 100_000),
                  "file_mib": (1, 1 << 20), "scratch_mib": (16, 1 << 20), "output_mib": (1, 4096),
                  "notebook_mib": (1, 4096)}
        for name, (lo, hi) in ranges.items():
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
                raise ValueError(f"{name} must be in [{lo}, {hi}], got {v!r}")
        return self


def rlimits(limits: Limits, *, live: bool, seconds: float) -> dict[str, list[int]]:
    """The resource limits for a sandboxed process, as ``{RLIMIT_NAME: [soft, hard]}``."""
    mem = int(limits.memory_mib) << 20
    cpu = int(seconds) + 5
    out = {"RLIMIT_DATA": [mem, mem], "RLIMIT_NPROC": [limits.processes, limits.processes],
           "RLIMIT_FSIZE": [int(limits.file_mib) << 20] * 2, "RLIMIT_CPU": [cpu, cpu + 5],
           "RLIMIT_CORE": [0, 0], "RLIMIT_NOFILE": [4096, 4096]}
    if not live:
        # With CUDA, address space is no measure of memory: the driver reserves terabytes of it.
        out["RLIMIT_AS"] = [mem + (1 << 30), mem + (1 << 30)]
    return out


def apply_limits(spec: dict[str, list[int]]) -> None:
    """Set the limits :func:`rlimits` describes on this process (inherited by its children)."""
    import resource

    for name, (soft, hard) in spec.items():
        resource.setrlimit(getattr(resource, name), (soft, hard))


def nondumpable() -> None:
    """Make this process non-dumpable: others of the same user (the submission's processes)
    can then neither trace it nor open its file descriptors through /proc."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except (OSError, AttributeError):
        pass


@dataclasses.dataclass
class Outcome:
    """What came back from one sandboxed run."""

    lines: list[bytes]
    returncode: int | None
    timed_out: bool
    too_much_output: bool
    stderr_tail: str
    seconds: float

    def last_error_line(self) -> str:
        """The last line of the sandbox's own error output (the grader's code, not the student's)."""
        lines = [ln.strip() for ln in self.stderr_tail.splitlines() if ln.strip()]
        return lines[-1][:200] if lines else ""


def _bwrap() -> str | None:
    given = os.environ.get(BWRAP_ENV)
    if given:
        return given if os.access(given, os.X_OK) else None
    return shutil.which("bwrap")


def _real(p: str | os.PathLike[str]) -> str:
    return os.path.realpath(os.fspath(p))


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


class Sandbox:
    """How submissions are run: in bubblewrap (the default), or unsandboxed where the
    instructor says ``unsafe=True``.

    Args:
        live: bind the GPU's device nodes and keep CUDA-compatible memory limits.
        hide: more folders to hide (the submissions' folders, the output's folder).
        unsafe: run without a sandbox, with the instructor's rights (limits still set).
    """

    def __init__(self, *, live: bool = False, hide: Sequence[str | os.PathLike[str]] = (), unsafe: bool = False):
        self.live, self.unsafe = live, unsafe
        self.pkg_dir = _real(Path(__file__).resolve().parent.parent)  # experiments/
        parent = os.path.dirname(self.pkg_dir)
        self.checkout = parent if any(os.path.exists(os.path.join(parent, m))
                                      for m in ("pyproject.toml", "setup.py", ".git")) else None
        self.extra_hidden = [_real(p) for p in hide]
        self.mode: str | None = None
        self._tmp = tempfile.mkdtemp(prefix="memlab-grade-")
        self._meta = self._distribution_stub()
        self._uids: set[int] = set()
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ layout

    def _distribution_stub(self) -> str | None:
        """Where the package runs from a checkout without being installed (``python -m pytest``
        in the repository), a stub of its distribution's metadata, so that the notebooks'
        set-up cell finds it and does not try to install it from the network."""
        import importlib.metadata

        try:
            importlib.metadata.version("cuda-memory-lab")
            return None
        except importlib.metadata.PackageNotFoundError:
            folder = Path(self._tmp) / "meta"
            info = folder / "cuda_memory_lab-0.0.0.dist-info"
            info.mkdir(parents=True)
            (info / "METADATA").write_text("Metadata-Version: 2.1\nName: cuda-memory-lab\nVersion: 0.0.0\n")
            return str(folder)

    def hidden(self) -> list[str]:
        """The folders hidden in the sandbox (real paths, outermost only)."""
        cands = [*HIDDEN, os.environ.get("HOME", ""), str(Path.home()), os.getcwd(), *self.extra_hidden]
        if self.checkout:
            cands.append(self.checkout)
        real = set()
        for c in cands:
            if not c:
                continue
            r = _real(c)
            if r in PROTECTED or not os.path.isdir(r):
                continue
            real.add(r)
        return sorted(r for r in real if not any(o != r and _inside(r, o) for o in real))

    def shown_again(self, hidden: Sequence[str]) -> list[str]:
        """What Python needs from inside the hidden folders, shown again read-only."""
        wanted = {sys.prefix, sys.base_prefix, sys.exec_prefix, self.pkg_dir}
        wanted |= {p for p in sys.path if p}
        wanted |= {p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p}
        if self._meta:
            wanted.add(self._meta)
        venv = _real(sys.prefix)
        out = set()
        for w in wanted:
            if not os.path.isdir(w):
                continue
            r = _real(w)
            if not any(_inside(r, h) for h in hidden):
                continue                          # visible anyway
            if any(_inside(h, r) for h in hidden):
                continue                          # would show a hidden folder again (the checkout, a home)
            if self.checkout and _inside(r, self.checkout) and not (_inside(r, venv) or r == self.pkg_dir):
                continue                          # from the repository: only the package and the environment
            out.add(r)
        return sorted(out, key=lambda p: (p.count("/"), p))

    def pythonpath(self, hidden: Sequence[str], shown: Sequence[str]) -> str:
        entries = [os.path.dirname(self.pkg_dir)]
        if self._meta:
            entries.append(self._meta)
        for p in os.environ.get("PYTHONPATH", "").split(":"):
            if p and os.path.isdir(p):
                r = _real(p)
                if not any(_inside(r, h) for h in hidden) or any(_inside(r, s) for s in shown):
                    entries.append(r)
        return ":".join(dict.fromkeys(entries))

    def environment(self, *, mode: str, home: str, pythonpath: str) -> dict[str, str]:
        """The whole environment of a sandboxed process: nothing of the grader's but these."""
        env = {
            "PATH": ":".join(dict.fromkeys([os.path.dirname(sys.executable), "/usr/local/bin", "/usr/bin", "/bin"])),
            "HOME": home, "TMPDIR": f"{home}/tmp", "USER": "student", "LOGNAME": "student",
            "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "PYTHONPATH": pythonpath, "PYTHONNOUSERSITE": "1",
            "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1", "CUDA_MEMLAB_MODE": mode,
            "MPLBACKEND": "Agg", "MPLCONFIGDIR": f"{home}/mpl", "IPYTHONDIR": f"{home}/ipython",
            "JUPYTER_RUNTIME_DIR": f"{home}/runtime", "JUPYTER_DATA_DIR": f"{home}/jupyter",
            "JUPYTER_CONFIG_DIR": f"{home}/jupyter-config", "JUPYTER_PLATFORM_DIRS": "1",
            "XDG_CACHE_HOME": f"{home}/cache", "XDG_CONFIG_HOME": f"{home}/config",
            "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2", "OPENBLAS_NUM_THREADS": "2", "MALLOC_ARENA_MAX": "2",
            "PIP_NO_INPUT": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INDEX": "1",
        }
        for name in ("LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES"):
            if os.environ.get(name):
                env[name] = os.environ[name]
        return env

    def command(self, argv: Sequence[str], *, mode: str, scratch_mib: int, uid: int | None = None) -> list[str]:
        """The full command line that runs ``argv`` in the sandbox of the given ``mode``
        ('nobody', 'root-drop' or 'user')."""
        hidden = self.hidden()
        shown = self.shown_again(hidden)
        bw = [_bwrap() or "bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
        for h in hidden:
            bw += ["--tmpfs", h]
        bw += ["--size", str(SHM_BYTES), "--perms", "1777", "--tmpfs", "/dev/shm"]
        if self.live:
            for node in sorted(glob.glob("/dev/nvidia*")):
                if os.path.exists(node):
                    bw += ["--dev-bind", node, node]
        made: set[str] = set()
        for s in shown:
            # bwrap makes missing mount points 0700: make the folders on the way there traversable
            h = next(h for h in hidden if _inside(s, h))
            parts = s[len(h):].strip("/").split("/")[:-1]
            for k in range(1, len(parts) + 1):
                d = h.rstrip("/") + "/" + "/".join(parts[:k])
                if d not in made and not any(_inside(d, o) for o in shown if o != s and _inside(s, o)):
                    made.add(d)
                    bw += ["--perms", "0755", "--dir", d]
            bw += ["--ro-bind", s, s]
        bw += ["--size", str(int(scratch_mib) << 20), "--perms", "1777", "--tmpfs", SCRATCH]
        for h in hidden:
            if not _inside(SCRATCH, h):
                bw += ["--remount-ro", h]
        # /tmp holds the scratch mount: it is made read-only around it
        bw += ["--remount-ro", "/tmp", "--remount-ro", "/dev", "--chdir", SCRATCH, "--hostname", "sandbox",
               "--die-with-parent", "--new-session"]
        if mode == "root-drop":
            bw += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
                   "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--"]
            bw += [sys.executable, "-S", "-c", DROP, str(uid), ",".join(map(str, self.device_groups()))]
        else:
            bw += ["--unshare-all", "--unshare-user", "--disable-userns", "--"]
        return bw + list(argv)

    def device_groups(self) -> list[int]:
        """With ``live``, the groups of GPU device nodes that not everyone may open (kept by the
        sandbox's user, so that CUDA can open them)."""
        if not self.live:
            return []
        out = set()
        for node in glob.glob("/dev/nvidia*"):
            try:
                st = os.stat(node)
            except OSError:
                continue
            if st.st_mode & 0o006 != 0o006:
                out.add(st.st_gid)
        return sorted(out)

    def _modes(self) -> list[str]:
        return ["nobody", "root-drop"] if os.geteuid() == 0 else ["user"]

    # ------------------------------------------------------------------ running

    def prepare(self) -> str:
        """Find a way to sandbox that works here (a real Python start, with the package and
        the notebook tools importable inside). Returns a one-line description.

        Raises:
            SandboxUnavailable: none works; the message says why and what to do.
        """
        if self.unsafe:
            self.mode = "unsafe"
            return "NO SANDBOX (--unsafe-no-sandbox): submissions run with your rights"
        if not _bwrap():
            raise SandboxUnavailable("bubblewrap is not installed (Debian: apt-get install bubblewrap; or name a bwrap "
                                     f"binary in ${BWRAP_ENV})")
        modes = self._modes()
        probe = "import experiments.grading.capture, nbclient, ipykernel; print('memlab-sandbox-ok')"
        why = []
        for mode in modes:
            self.mode = mode
            out = self.run(["-c", probe], b"", seconds=90, limits=Limits(), module=None)
            if out.returncode == 0 and any(b"memlab-sandbox-ok" in ln for ln in out.lines):
                return self.describe()
            why.append(f"{mode}: {out.last_error_line() or f'exit status {out.returncode}'}")
        self.mode = None
        raise SandboxUnavailable("cannot start a bubblewrap sandbox here (" + "; ".join(why) + ")")

    def describe(self) -> str:
        who = {"nobody": "as nobody in a user namespace", "root-drop": "as an unprivileged user id, no user namespace",
               "user": "as you, in a user namespace", "unsafe": "NOT sandboxed"}[self.mode or "unsafe"]
        return f"bubblewrap sandbox {who}, no network{', GPU device nodes bound' if self.live else ''}"

    def _take_uid(self) -> int | None:
        if self.mode != "root-drop":
            return None
        with self._lock:
            uid = next(u for u in range(FIRST_UID, FIRST_UID + 10_000) if u not in self._uids)
            self._uids.add(uid)
            return uid

    def run(self, args: Sequence[str], request: bytes, *, seconds: float, limits: Limits,
            module: str | None, max_output: int = 8 << 20) -> Outcome:
        """Run ``python -m module`` (or ``python ARGS`` when ``module`` is None) in the sandbox,
        feed it ``request`` on stdin, and collect its stdout lines until it exits, ``seconds``
        pass (then everything in the sandbox is killed), or it writes more than ``max_output``
        bytes (killed too)."""
        if self.mode is None:
            raise RuntimeError("Sandbox.prepare() first")
        mode = "live" if self.live else "recorded"
        python = [sys.executable, "-B"] + (["-m", module] if module else []) + list(args)
        uid = self._take_uid()
        scratch = None
        try:
            if self.mode == "unsafe":
                scratch = tempfile.mkdtemp(prefix="memlab-unsafe-")
                env = self.environment(mode=mode, home=scratch,
                                       pythonpath=self.pythonpath([], []))
                cmd, cwd = python, scratch
            else:
                hidden = self.hidden()
                env = self.environment(mode=mode, home=SCRATCH,
                                       pythonpath=self.pythonpath(hidden, self.shown_again(hidden)))
                cmd, cwd = self.command(python, mode=self.mode, scratch_mib=limits.scratch_mib, uid=uid), "/"
            user = dict(user=NOBODY, group=NOBODY, extra_groups=self.device_groups()) if self.mode == "nobody" else {}
            return _run(cmd, env, cwd, request, seconds=seconds, max_output=max_output,
                        group_kill=self.mode == "unsafe", user=user)
        finally:
            if uid is not None:
                with self._lock:
                    self._uids.discard(uid)
            if scratch:
                shutil.rmtree(scratch, ignore_errors=True)

    def close(self) -> None:
        shutil.rmtree(self._tmp, ignore_errors=True)


def _run(cmd: list[str], env: dict[str, str], cwd: str, request: bytes, *, seconds: float, max_output: int,
         group_kill: bool, user: dict[str, Any] | None = None) -> Outcome:
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            cwd=cwd, start_new_session=True, close_fds=True, **(user or {}))
    lines: list[bytes] = []
    tail = bytearray()
    state = {"bytes": 0, "over": False}

    def kill() -> None:
        try:
            if group_kill:
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.kill()  # bwrap: its PID namespace, and everything in it, goes with it
        except (ProcessLookupError, PermissionError):
            pass

    def feed() -> None:
        try:
            proc.stdin.write(request)
        except (BrokenPipeError, OSError):
            pass
        finally:
            try:
                proc.stdin.close()
            except OSError:
                pass

    def read_out() -> None:
        for line in iter(lambda: proc.stdout.readline(4 << 20), b""):
            state["bytes"] += len(line)
            if state["bytes"] > max_output:
                state["over"] = True
                kill()
                return
            lines.append(line)

    def read_err() -> None:
        for chunk in iter(lambda: proc.stderr.read(4096), b""):
            tail.extend(chunk)
            del tail[:-8192]

    threads = [threading.Thread(target=f, daemon=True) for f in (feed, read_out, read_err)]
    for t in threads:
        t.start()
    timed_out = False
    try:
        proc.wait(timeout=max(0.1, seconds))
    except subprocess.TimeoutExpired:
        timed_out = True
        kill()
        proc.wait()
    for t in threads:
        t.join(timeout=2)
    for pipe in (proc.stdout, proc.stderr):
        try:
            pipe.close()
        except OSError:
            pass
    return Outcome(lines, proc.returncode, timed_out, state["over"], tail.decode("utf-8", "replace"),
                   time.monotonic() - t0)


def request_bytes(obj: Any) -> bytes:
    """A request for a sandboxed process, as one JSON document."""
    return json.dumps(obj, allow_nan=True).encode()
