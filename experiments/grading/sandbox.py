"""Every submission runs in a sandbox made by bubblewrap (``bwrap``, Debian ``bubblewrap``).

What a sandboxed process gets (:meth:`Sandbox.command` builds it):

- **an allowlist of the file system, read-only** (:mod:`.allowlist`): the system's
  programs and libraries (``/usr`` and the ``/bin``, ``/sbin``, ``/lib*`` beside it), the
  parts of ``/etc`` that programs need to start (the dynamic loader's files, time zone,
  fonts, Python's own folders; ``passwd``, ``group``, ``hosts`` and ``hostname`` are the
  sandbox's own), ``/sys``, Python (its installation and the virtual environment), the
  folders of installed packages, and the package folder ``experiments/``. Nothing else of
  the machine exists inside: no home, no ``/tmp``, ``/opt``, ``/srv`` or ``/var``, not the
  folder grading started from, not the repository around the package (its ``book/`` holds
  the solutions), not the submissions or the grades. A folder of ``sys.path`` or
  ``PYTHONPATH`` is shown only when it lies outside every one of those places and holds
  none of them; a place to hide that lies inside something shown is covered by an empty
  folder;
- **no network**: a network namespace of its own, with only a loopback;
- **a private writable scratch folder** ``/tmp/work``: an empty ``tmpfs`` of its own
  (``scratch_mib``), its ``HOME``, its ``TMPDIR`` and its working folder; and a small
  ``/dev/shm``. Nothing it writes reaches the disk or outlives it;
- **a clean environment**: ``PATH``, ``HOME``, locale, ``PYTHONPATH`` (the package and the
  shown ``PYTHONPATH`` entries), ``LD_LIBRARY_PATH``, ``CUDA_VISIBLE_DEVICES``, the mode,
  thread counts; nothing else of the grader's environment;
- **its own process, IPC and hostname namespaces** and a new session: it sees only its
  own processes and cannot reach the terminal. When the grader kills the sandbox (its
  time is up) or dies, every process in it dies with it (``--die-with-parent``; the
  kernel ends a PID namespace with its first process);
- **a fresh session keyring and a seccomp filter** (:mod:`.seccomp`): the process that
  starts bwrap joins a new, empty session keyring, and everything in the sandbox runs
  under a filter that refuses the keyring calls, new user namespaces, and reading other
  processes' memory, in every mode;
- **a control group** (:mod:`.cgroups`) where the machine allows one: memory for all its
  processes together, a number of processes, and the same CPU weight as every other
  sandbox (:meth:`Sandbox.bounds` says what holds here, :meth:`Sandbox.unbounded` what
  does not);
- **an unprivileged user**: run as root, the grader starts the sandbox as ``nobody`` in a
  user namespace of its own; where that cannot work (the kernel allows no such namespace,
  or Python lies in a folder ``nobody`` cannot read, such as ``/root``), bwrap runs as
  root and a few lines of Python (:data:`DROP`) switch to a user id of the sandbox's own,
  with no capabilities, before anything else starts. That user id is unique on the
  machine while the sandbox runs, across grading runs too (a lock file per id). Run as
  another user, it is that user in a user namespace;
- **limits per process** (:class:`Limits`), set by the first process inside before any
  submitted code runs (:func:`apply_limits`): memory (``RLIMIT_AS`` and ``RLIMIT_DATA``;
  with a GPU, ``RLIMIT_DATA`` only, because CUDA reserves far more address space than it
  uses), processes and threads (``RLIMIT_NPROC``), file size (``RLIMIT_FSIZE``), CPU time
  (``RLIMIT_CPU``), no core files; the scratch folder's size; and, enforced by the
  grader, the wall-clock time and the bytes that come back.

With ``--live``, the GPU's device nodes (``/dev/nvidia*``) are bound into the sandbox, and
nothing else extra.

Requirements: ``bwrap`` (0.8 or newer, for ``--size``) on a Linux kernel that lets bwrap
create the namespaces (as root it always can; as another user it needs unprivileged user
namespaces, Debian's default), on x86-64 or AArch64 (the seccomp filter's processors).
:meth:`Sandbox.prepare` tries each way in turn with a real Python start and says, in one
line, why none works.

This module is also run as a plain file's sibling (the runner imports :func:`apply_limits`
and :func:`nondumpable` without the package), so it imports only the standard library at
its top.
"""
from __future__ import annotations

import dataclasses
import fcntl
import glob
import json
import os
import random
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
BWRAP_ENV = "CUDA_MEMLAB_BWRAP"  # a bwrap binary to use instead of the one on PATH
NOBODY = 65534
FIRST_UID = 2_000_000_000   # the user ids of sandboxes when bwrap runs as root without a user namespace
UID_RANGE = 1_000_000
SHM_MIB = 64
# Inside bwrap run as root: leave root for the sandbox's user id and groups, then run the command.
# bwrap has set no_new_privs and mounts everything nosuid, so nothing can gain privileges back.
DROP = ("import os, sys; uid = int(sys.argv[1]); groups = [int(g) for g in sys.argv[2].split(',') if g]; "
        "os.setgroups(groups); os.setresgid(uid, uid, uid); os.setresuid(uid, uid, uid); "
        "os.execv(sys.argv[3], sys.argv[3:])")
# Before bwrap, with the grader's rights: join the sandbox's control group(s), a fresh session
# keyring, and (as root, for the 'nobody' mode) leave root; then become bwrap.
LAUNCH = """
import ctypes, json, os, sys
spec = json.loads(sys.argv[1])
for path in spec["procs"]:
    with open(path, "w") as f:
        f.write(str(os.getpid()))
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.syscall(spec["keyctl"], 1, b"memlab-sandbox", 0, 0, 0)   # KEYCTL_JOIN_SESSION_KEYRING: a new, empty one
if spec["user"]:
    uid, gid, groups = spec["user"]
    os.setgroups(groups)
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
os.execv(spec["argv"][0], spec["argv"])
"""
KEYCTL = {"x86_64": 250, "aarch64": 219}


class SandboxUnavailable(RuntimeError):
    """No sandbox can be made here; the message says why, in one line."""


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one submission may use. All checked by :meth:`validate`.

    Attributes:
        timeout_s: wall-clock seconds for the whole submission (reading, running, scoring).
        memory_mib: address space (recorded mode) and data (both modes) per process, MiB.
        processes: processes and threads of the sandbox (per user id, and for the whole
            sandbox where a control group can be made).
        file_mib: largest file a process may write, MiB.
        scratch_mib: size of the scratch folder (memory-backed), MiB.
        output_mib: what the notebook's cells may print or display in total, MiB.
        notebook_mib: largest submission file that is read at all, MiB.
        group_memory_mib: memory of all the sandbox's processes together, MiB, where a
            control group can be made; None: ``memory_mib`` plus the scratch folder and
            ``/dev/shm`` (both are memory) in recorded mode, four times ``memory_mib`` with
            ``--live`` (CUDA's pinned host memory counts there, and the chapters pin GiBs).
    """

    timeout_s: float = 600.0
    memory_mib: int = 3072
    processes: int = 256
    file_mib: int = 64
    scratch_mib: int = 256
    output_mib: int = 16
    notebook_mib: int = 16
    group_memory_mib: int | None = None

    def validate(self) -> "Limits":
        """Returns self. Raises ValueError naming a value out of its range."""
        ranges = {"timeout_s": (1, 86_400), "memory_mib": (512, 1 << 20), "processes": (32, 100_000),
                  "file_mib": (1, 1 << 20), "scratch_mib": (16, 1 << 20), "output_mib": (1, 4096),
                  "notebook_mib": (1, 4096), "group_memory_mib": (512, 1 << 22)}
        for name, (lo, hi) in ranges.items():
            v = getattr(self, name)
            if name == "group_memory_mib" and v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
                raise ValueError(f"{name} must be in [{lo}, {hi}], got {v!r}")
        return self

    def group_mib(self, *, live: bool) -> int:
        """Memory of all of a sandbox's processes together, MiB (see ``group_memory_mib``)."""
        if self.group_memory_mib is not None:
            return int(self.group_memory_mib)
        return int(self.memory_mib) * 4 if live else int(self.memory_mib) + int(self.scratch_mib) + SHM_MIB


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
    """What came back from one sandboxed run. ``group_oom``: the kernel killed one of its
    processes for the memory limit of the whole sandbox."""

    lines: list[bytes]
    returncode: int | None
    timed_out: bool
    too_much_output: bool
    stderr_tail: str
    seconds: float
    group_oom: bool = False

    def last_error_line(self) -> str:
        """The last line of the sandbox's own error output (the grader's code and bwrap's,
        not the student's: their processes' output goes nowhere), printable, bounded."""
        lines = [ln.strip() for ln in self.stderr_tail.splitlines() if ln.strip()]
        return "".join(ch for ch in lines[-1] if ch.isprintable())[:200] if lines else ""


def _bwrap() -> str | None:
    given = os.environ.get(BWRAP_ENV)
    if given:
        return given if os.access(given, os.X_OK) else None
    return shutil.which("bwrap")


class _UidLock:
    """A user id of the sandbox's own while it runs, unique on this machine across grading
    runs: an exclusive lock on a file per id, in a folder only root can write."""

    FOLDER = "/run/lock/memlab-grade" if os.path.isdir("/run/lock") else "/run/memlab-grade"

    def __init__(self) -> None:
        folder = self.FOLDER
        try:
            os.makedirs(folder, mode=0o700, exist_ok=True)
        except OSError:
            folder = os.path.join(tempfile.gettempdir(), f"memlab-grade-uids-{os.geteuid()}")
            os.makedirs(folder, mode=0o700, exist_ok=True)
        start = random.randrange(UID_RANGE)
        for k in range(UID_RANGE):
            uid = FIRST_UID + (start + k) % UID_RANGE
            fd = os.open(os.path.join(folder, str(uid)), os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            self.uid, self._fd = uid, fd
            return
        raise RuntimeError("no free sandbox user id")

    def release(self) -> None:
        os.close(self._fd)


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
        from .allowlist import View, real

        self.pkg_dir = real(Path(__file__).resolve().parent.parent)  # experiments/
        parent = os.path.dirname(self.pkg_dir)
        self.checkout = parent if any(os.path.exists(os.path.join(parent, m))
                                      for m in ("pyproject.toml", "setup.py", ".git")) else None
        self.extra_hidden = [real(p) for p in hide]
        self.mode: str | None = None
        self.groups: Any = None                 # cgroups.Cgroups, or None
        self.no_groups = "not prepared"
        self._tmp = tempfile.mkdtemp(prefix="memlab-grade-")
        self._meta = self._distribution_stub()
        self.view = View(pkg_dir=self.pkg_dir, checkout=self.checkout, extra_hidden=self.extra_hidden, meta=self._meta,
                         etc=self._own_etc(), live=live)

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

    def _own_etc(self) -> dict[str, str]:
        """The sandbox's own /etc/passwd, group, hosts and hostname (the machine's list its
        users), as files to bind."""
        folder = Path(self._tmp) / "etc"
        folder.mkdir()
        texts = {"passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/sh\n",
                 "group": "root:x:0:\nnobody:x:65534:\n",
                 "hosts": "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost\n", "hostname": "sandbox\n"}
        out = {}
        for name, text in texts.items():
            (folder / name).write_text(text)
            out[f"/etc/{name}"] = str(folder / name)
        return out

    def hidden(self) -> list[str]:
        """The places no sandbox shows (:meth:`.allowlist.View.hidden`)."""
        return self.view.hidden()

    def shown(self) -> list[str]:
        """What every sandbox shows, read-only (:meth:`.allowlist.View.shown`)."""
        return self.view.shown()

    def pythonpath(self, shown: Sequence[str]) -> str:
        """The sandbox's PYTHONPATH (:meth:`.allowlist.View.pythonpath`)."""
        return self.view.pythonpath(shown)

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

    def command(self, argv: Sequence[str], *, mode: str, scratch_mib: int, uid: int | None = None,
                seccomp_fd: int | None = None) -> list[str]:
        """The bwrap command line that runs ``argv`` in the sandbox of the given ``mode``
        ('nobody', 'root-drop' or 'user'), with the seccomp filter read from ``seccomp_fd``."""
        fs = self.view.bwrap_args(scratch=SCRATCH, scratch_mib=scratch_mib, shm_mib=SHM_MIB)
        bw = [_bwrap() or "bwrap", *fs, "--chdir", SCRATCH, "--hostname", "sandbox",
              "--die-with-parent", "--new-session"]
        if seccomp_fd is not None:
            bw += ["--seccomp", str(seccomp_fd)]
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

    # ------------------------------------------------------------------ what holds here

    def bounds(self) -> dict[str, bool]:
        """What a sandbox is bounded by here, beyond its per-process limits: ``memory``,
        ``pids`` and ``cpu`` of all its processes together (a control group), ``uid`` (a
        user id of its own, unique on the machine)."""
        grouped = self.groups is not None and self.mode not in (None, "unsafe")
        return {"memory": grouped, "pids": grouped, "cpu": grouped, "uid": self.mode == "root-drop"}

    def unbounded(self) -> str:
        """What cannot be bounded here, in one sentence ('' when everything is)."""
        if self.mode == "unsafe":
            return "nothing is isolated: submissions run with your rights"
        if self.groups is not None:
            return ""
        return (f"no control group can be made here ({self.no_groups}): memory is limited per process only, "
                "notebooks graded at once do not share the CPU fairly (--jobs), and processes are counted per user")

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
        from . import cgroups, seccomp

        try:
            seccomp.program()
        except seccomp.Unsupported as e:
            raise SandboxUnavailable(str(e)) from None
        self.groups, self.no_groups = cgroups.find()
        probe = "import experiments.grading.capture, nbclient, ipykernel; print('memlab-sandbox-ok')"
        why = []
        for _ in range(2):
            for mode in self._modes():
                self.mode = mode
                out = self.run(["-c", probe], b"", seconds=90, limits=Limits(), module=None)
                if out.returncode == 0 and any(b"memlab-sandbox-ok" in ln for ln in out.lines):
                    return self.describe()
                why.append(f"{mode}: {out.last_error_line() or f'exit status {out.returncode}'}")
            if self.groups is None:
                break
            # groups made here that a sandbox cannot start in: try once more without them
            self.no_groups = f"a sandbox could not start in a {self.groups.kind} group"
            self.groups = None
        self.mode = None
        raise SandboxUnavailable("cannot start a bubblewrap sandbox here (" + "; ".join(why) + ")")

    def describe(self) -> str:
        who = {"nobody": "as nobody in a user namespace", "root-drop": "as a user id of its own, no user namespace",
               "user": "as you, in a user namespace", "unsafe": "NOT sandboxed"}[self.mode or "unsafe"]
        text = (f"bubblewrap sandbox {who}, no network, a fresh keyring, seccomp"
                f"{', GPU device nodes bound' if self.live else ''}")
        if self.groups is not None:
            return f"{text}, {self.groups.describe()}"
        return f"{text}; NOT BOUNDED here: {self.unbounded()}"

    # ------------------------------------------------------------------ running

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
        if self.mode == "unsafe":
            scratch = tempfile.mkdtemp(prefix="memlab-unsafe-")
            try:
                env = self.environment(mode=mode, home=scratch, pythonpath=self.pythonpath(["/"]))
                return _run(python, env, scratch, request, seconds=seconds, max_output=max_output, group_kill=True)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
        from . import cgroups, seccomp

        lock = _UidLock() if self.mode == "root-drop" else None
        group = None
        fd = seccomp.memfd()
        try:
            if self.groups is not None:
                group = self.groups.make(cgroups.Request(memory_bytes=limits.group_mib(live=self.live) << 20,
                                                         pids=int(limits.processes)))
            env = self.environment(mode=mode, home=SCRATCH, pythonpath=self.pythonpath(self.shown()))
            bw = self.command(python, mode=self.mode, scratch_mib=limits.scratch_mib,
                              uid=lock.uid if lock else None, seccomp_fd=fd)
            user = [NOBODY, NOBODY, self.device_groups()] if self.mode == "nobody" else None
            arch = os.uname().machine
            spec = {"procs": group.procs if group else [], "keyctl": KEYCTL.get(arch, -1), "user": user, "argv": bw}
            cmd = [*(group.wrapper if group else []), sys.executable, "-S", "-I", "-c", LAUNCH, json.dumps(spec)]
            out = _run(cmd, env, "/", request, seconds=seconds, max_output=max_output, group_kill=False, pass_fds=(fd,))
            if group is not None:
                out.group_oom = group.oom_killed()
            return out
        finally:
            os.close(fd)
            if group is not None:
                group.close()
            if lock is not None:
                lock.release()

    def close(self) -> None:
        shutil.rmtree(self._tmp, ignore_errors=True)


def _run(cmd: list[str], env: dict[str, str], cwd: str, request: bytes, *, seconds: float, max_output: int,
         group_kill: bool, pass_fds: Sequence[int] = ()) -> Outcome:
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            cwd=cwd, start_new_session=True, close_fds=True, pass_fds=tuple(pass_fds))
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
