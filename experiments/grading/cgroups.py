"""A control group per sandbox, so that what one submission's processes take together is
bounded, and notebooks graded at once share the machine fairly: memory for all its processes
together, a number of processes, and an equal CPU weight (a sandbox of 200 busy processes
weighs as much as a sandbox of one).

Three ways, tried in this order by :func:`find`:

- **systemd** (``systemd-run --scope``, with ``--user`` when not root): the usual cgroup v2
  machine, where systemd owns the tree and delegates to users. Each sandbox starts inside a
  transient scope with ``MemoryMax``, ``MemorySwapMax``, ``TasksMax`` and ``CPUWeight``;
  used only when a real scope started here shows those limits in its own cgroup files.
- **cgroup v2**, written directly: where the grader's own cgroup already delegates the
  ``cpu``, ``memory`` and ``pids`` controllers to its children and can be written.
- **cgroup v1** (as root): a child group in each of the ``cpu``, ``memory`` and ``pids``
  hierarchies, under the grader's own group in each.

Where none works, :func:`find` says why, and the grader says what it cannot bound.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from typing import Sequence

CONTROLLERS = ("cpu", "memory", "pids")
CPU_WEIGHT = 100            # cgroup v2's default weight: every sandbox the same
CPU_SHARES = 1024           # cgroup v1's default shares


@dataclasses.dataclass(frozen=True)
class Request:
    """What one sandbox may use together: ``memory_bytes`` for all its processes (no swap),
    ``pids`` processes and threads."""

    memory_bytes: int
    pids: int


def _own_paths() -> dict[str, str]:
    """{controller or '' (v2): this process's cgroup path} from /proc/self/cgroup."""
    out = {}
    try:
        lines = open("/proc/self/cgroup").read().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, names, path = parts
        for name in (names.split(",") if names else [""]):
            out[name] = path
    return out


def _mounts() -> list[tuple[str, str, set[str]]]:
    """[(mount point, 'cgroup' or 'cgroup2', super options)] from /proc/self/mountinfo."""
    out = []
    try:
        lines = open("/proc/self/mountinfo").read().splitlines()
    except OSError:
        return out
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, rest = left.split(), right.split()
        if len(fields) >= 5 and len(rest) >= 3 and rest[0] in ("cgroup", "cgroup2"):
            out.append((fields[4], rest[0], set(rest[2].split(","))))
    return out


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


class Group:
    """One sandbox's group(s). The sandbox's first process joins it by writing its own pid
    into each of :attr:`procs` (before it starts bubblewrap); or, with systemd, the command
    is wrapped by :attr:`wrapper`."""

    def __init__(self, dirs: Sequence[str] = (), *, version: int, wrapper: Sequence[str] = ()) -> None:
        self.dirs = list(dirs)
        self.version = version
        self.wrapper = list(wrapper)

    @property
    def procs(self) -> list[str]:
        return [os.path.join(d, "cgroup.procs") for d in self.dirs]

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of the group for its memory limit."""
        for d in self.dirs:
            text = _read(os.path.join(d, "memory.events" if self.version == 2 else "memory.oom_control"))
            for line in text.splitlines():
                name, _, value = line.partition(" ")
                if name == "oom_kill" and value.strip().isdigit() and int(value) > 0:
                    return True
        return False

    def close(self) -> None:
        """Kill whatever is left in the group and remove it (its processes are normally gone
        already: the sandbox's PID namespace ended with its first process)."""
        for d in self.dirs:
            for _ in range(50):
                pids = [int(p) for p in _read(os.path.join(d, "cgroup.procs")).split() if p.isdigit()]
                if not pids:
                    break
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
                time.sleep(0.02)
            for _ in range(50):
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:  # EBUSY while the last processes are reaped
                    time.sleep(0.02)


class Cgroups:
    """Where this machine lets the grader make a group per sandbox (see :func:`find`)."""

    def __init__(self, kind: str, bases: dict[str, str], version: int, *, systemd: Sequence[str] = ()) -> None:
        self.kind = kind            # 'systemd', 'cgroup v2' or 'cgroup v1'
        self.bases = bases          # controller (or '' for v2) -> the folder groups are made in
        self.version = version
        self.systemd = list(systemd)
        self._tag = f"memlab-grade-{os.getpid()}"

    def describe(self) -> str:
        return f"a {self.kind} group per sandbox (memory of all its processes, processes, equal CPU weight)"

    def make(self, request: Request) -> Group:
        """A new group with ``request``'s limits.

        Raises:
            OSError: the group cannot be made or limited.
        """
        if self.kind == "systemd":
            props = [f"MemoryMax={request.memory_bytes}", "MemorySwapMax=0", f"TasksMax={request.pids}",
                     f"CPUWeight={CPU_WEIGHT}"]
            return Group(version=2, wrapper=self.systemd + [a for p in props for a in ("-p", p)] + ["--"])
        name = f"{self._tag}-{uuid.uuid4().hex[:12]}"   # unique without a lock: sandboxes start from several threads
        made: list[str] = []
        try:
            if self.version == 2:
                d = os.path.join(self.bases[""], name)
                os.mkdir(d)
                made.append(d)
                _write(os.path.join(d, "memory.max"), str(request.memory_bytes))
                if os.path.exists(os.path.join(d, "memory.swap.max")):
                    _write(os.path.join(d, "memory.swap.max"), "0")
                _write(os.path.join(d, "pids.max"), str(request.pids))
                _write(os.path.join(d, "cpu.weight"), str(CPU_WEIGHT))
            else:
                for controller in CONTROLLERS:
                    d = os.path.join(self.bases[controller], name)
                    if d in made:           # cpu and cpuacct mounted together, say
                        continue
                    os.mkdir(d)
                    made.append(d)
                    if controller == "memory":
                        _write(os.path.join(d, "memory.limit_in_bytes"), str(request.memory_bytes))
                        if os.path.exists(os.path.join(d, "memory.memsw.limit_in_bytes")):
                            _write(os.path.join(d, "memory.memsw.limit_in_bytes"), str(request.memory_bytes))
                    elif controller == "pids":
                        _write(os.path.join(d, "pids.max"), str(request.pids))
                    else:
                        _write(os.path.join(d, "cpu.shares"), str(CPU_SHARES))
        except OSError:
            Group(made, version=self.version).close()
            raise
        return Group(made, version=self.version)


def _v2(mounts, own) -> tuple[Cgroups | None, str]:
    v2 = [m for m, fs, _ in mounts if fs == "cgroup2"]
    if not v2 or "" not in own:
        return None, "no cgroup v2 hierarchy"
    base = os.path.join(v2[0], own[""].lstrip("/"))
    enabled = set(_read(os.path.join(base, "cgroup.subtree_control")).split())
    if not set(CONTROLLERS) <= enabled:
        return None, f"cgroup v2: the grader's group {own['']} delegates {sorted(enabled) or 'no controller'}"
    probe = os.path.join(base, f"memlab-probe-{uuid.uuid4().hex[:8]}")
    try:
        os.mkdir(probe)
        os.rmdir(probe)
    except OSError as e:
        return None, f"cgroup v2: cannot make a group in {own['']} ({e.strerror})"
    return Cgroups("cgroup v2", {"": base}, 2), ""


def _v1(mounts, own) -> tuple[Cgroups | None, str]:
    bases = {}
    for controller in CONTROLLERS:
        mount = next((m for m, fs, opts in mounts if fs == "cgroup" and controller in opts), None)
        if mount is None or controller not in own:
            return None, f"cgroup v1: no {controller} hierarchy"
        bases[controller] = os.path.join(mount, own[controller].lstrip("/"))
    for controller, base in bases.items():
        probe = os.path.join(base, f"memlab-probe-{uuid.uuid4().hex[:8]}")
        try:
            os.mkdir(probe)
            os.rmdir(probe)
        except OSError as e:
            return None, f"cgroup v1: cannot make a {controller} group ({e.strerror})"
    return Cgroups("cgroup v1", bases, 1), ""


PROBE_MEMORY = 300 << 20


def _systemd() -> tuple[Cgroups | None, str]:
    run = shutil.which("systemd-run")
    if not run:
        return None, "no systemd-run"
    cmd = [run] + ([] if os.geteuid() == 0 else ["--user"]) + ["--scope", "--quiet", "--collect"]
    check = ("import os; p = open('/proc/self/cgroup').read().split('0::', 1)[1].split()[0]; "
             "d = '/sys/fs/cgroup' + p; print(open(d + '/memory.max').read().strip(), "
             "open(d + '/pids.max').read().strip())")
    try:
        r = subprocess.run(cmd + ["-p", f"MemoryMax={PROBE_MEMORY}", "-p", "TasksMax=77", "--",
                                  sys.executable, "-S", "-I", "-c", check],
                           capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"systemd-run: {type(e).__name__}"
    if r.returncode != 0 or r.stdout.split() != [str(PROBE_MEMORY), "77"]:
        why = (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1][:120]
        return None, f"systemd-run: a scope did not get its limits ({why})"
    return Cgroups("systemd", {}, 2, systemd=cmd), ""


def find() -> tuple[Cgroups | None, str]:
    """A way to make a group per sandbox here, or (None, why not, in one line). A way counts
    only once a whole group was made and limited that way (and removed again)."""
    mounts, own = _mounts(), _own_paths()
    why = []
    for attempt in (_systemd, lambda: _v2(mounts, own), lambda: _v1(mounts, own)):
        found, reason = attempt()
        if found and found.kind != "systemd":
            try:
                found.make(Request(memory_bytes=PROBE_MEMORY, pids=77)).close()
            except OSError as e:
                found, reason = None, f"{found.kind}: cannot limit a group ({e.strerror or type(e).__name__})"
        if found:
            return found, ""
        why.append(reason)
    return None, "; ".join(why)
