"""What a sandbox sees of the machine: an allowlist of the file system, bound read-only by
bubblewrap into an otherwise empty root (:class:`View`, used by :class:`.sandbox.Sandbox`).

Shown: the system's programs and libraries (:data:`SYSTEM`), what programs need of ``/etc``
(:data:`ETC`, plus the sandbox's own ``passwd``, ``group``, ``hosts`` and ``hostname``),
``/sys``, a fresh ``/dev`` and ``/proc``, Python (its installation and the virtual
environment), the folders of installed packages and the package folder ``experiments/``.
Nothing else of the machine exists inside: no home, no ``/tmp``, ``/opt``, ``/srv`` or
``/var``, not the folder grading started from, not the repository around the package (its
``book/`` holds the solutions), not the submissions or the grades.

Hidden (:meth:`View.hidden`): :data:`HIDDEN`, the grader's home and working folder, the
repository around the package, the submissions' and the output's folders. A folder of
``sys.path``, ``PYTHONPATH`` or ``LD_LIBRARY_PATH`` is shown only when it lies outside every
hidden place and holds none of them (so never the folder ``python -m`` started from, nor a
``PYTHONPATH`` entry under a home); a hidden place inside something shown is covered by an
empty folder.

Only the standard library is imported: nothing here needs the package.
"""
from __future__ import annotations

import glob
import os
import site
import sys
import sysconfig
from pathlib import Path
from typing import Sequence

# Places never shown in a sandbox, and that nothing shown may contain: homes, temporary and
# runtime folders, mounts, served files.
HIDDEN = ("/home", "/root", "/tmp", "/var/tmp", "/run", "/mnt", "/media", "/srv")
# The system's programs and libraries (symbolic links where /usr is merged).
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# What of /etc programs need to start (the dynamic loader, time, fonts, Python's own folders
# on Debian, the GPU driver's profiles); whatever of these exists is shown.
ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "ld.so.preload", "alternatives", "localtime", "timezone",
       "nsswitch.conf", "host.conf", "gai.conf", "fonts", "mime.types", "os-release", "lsb-release",
       "debian_version", "nvidia", "matplotlibrc", "python3*")


def real(p: str | os.PathLike[str]) -> str:
    """``p`` with every link resolved."""
    return os.path.realpath(os.fspath(p))


def inside(path: str, folder: str) -> bool:
    """Whether ``path`` is ``folder`` or lies under it (both real paths)."""
    return path == folder or folder == "/" or path.startswith(folder.rstrip("/") + "/")


def system_folders() -> list[str]:
    """The folders of :data:`SYSTEM` that exist here as folders (not as links)."""
    return [s for s in SYSTEM if os.path.isdir(s) and not os.path.islink(s)]


class View:
    """The file system one sandbox sees.

    Args:
        pkg_dir: the package folder (``experiments/``), real path.
        checkout: the repository around it, if it runs from one (hidden).
        extra_hidden: more folders to hide (the submissions', the output's), real paths.
        meta: a folder with the package's distribution metadata, shown (None: installed).
        etc: {path under /etc: file to bind there}, the sandbox's own files.
        live: bind the GPU's device nodes (``/dev/nvidia*``).
    """

    def __init__(self, *, pkg_dir: str, checkout: str | None, extra_hidden: Sequence[str], meta: str | None,
                 etc: dict[str, str], live: bool) -> None:
        self.pkg_dir, self.checkout, self.extra_hidden = pkg_dir, checkout, list(extra_hidden)
        self.meta, self.etc, self.live = meta, etc, live

    def hidden(self) -> list[str]:
        """The places no sandbox shows, and that nothing shown may contain (real paths):
        homes, temporary and runtime folders, the grader's working folder, the repository
        around the package, the submissions' and output's folders."""
        cands = [*HIDDEN, os.environ.get("HOME", ""), str(Path.home()), os.getcwd(), *self.extra_hidden]
        if self.checkout:
            cands.append(self.checkout)
        return sorted({real(c) for c in cands if c and c != "/"})

    @staticmethod
    def python_paths() -> list[str]:
        """Python's installation, the virtual environment and the folders of installed
        packages, as Python itself reports them (never sys.path[0] or PYTHONPATH)."""
        cands = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                 os.path.dirname(real(sys.executable)), os.path.dirname(os.path.abspath(sys.executable))}
        paths = sysconfig.get_paths()
        cands |= {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
        try:
            cands |= set(site.getsitepackages())
        except AttributeError:  # an old virtualenv's site module
            pass
        return sorted({real(c) for c in cands if c and os.path.isdir(c)})

    def extra_paths(self) -> list[str]:
        """Folders of sys.path, PYTHONPATH and LD_LIBRARY_PATH that may be shown: outside
        every hidden place (a user's home, the working folder, the repository, the
        submissions, /tmp...) and holding none of them."""
        cands = [p for p in sys.path if p]
        cands += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        cands += [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
        hidden = self.hidden()
        out = set()
        for c in cands:
            if not os.path.isabs(c) or not os.path.isdir(c):
                continue
            r = real(c)
            if r == "/" or any(inside(r, h) or inside(h, r) for h in hidden):
                continue
            out.add(r)
        return sorted(out)

    def shown(self) -> list[str]:
        """The folders and files bound read-only into every sandbox, at their own paths
        (outermost only; the system folders and /etc's files are added by :meth:`bwrap_args`)."""
        hidden = self.hidden()
        wanted = set(self.python_paths()) | {self.pkg_dir} | set(self.extra_paths())
        if self.meta:
            wanted.add(self.meta)
        system = system_folders()
        out = set()
        for w in wanted:
            if any(inside(w, s) for s in system):
                continue                      # shown with the system anyway
            if any(inside(h, w) for h in hidden) and w != self.meta:
                continue                      # would show a hidden place: a home, the repository
            out.add(w)
        return sorted(o for o in out if not any(p != o and inside(o, p) for p in out))

    def covered(self, shown: Sequence[str]) -> list[str]:
        """Hidden places that lie inside something shown: covered by an empty folder."""
        return sorted(h for h in self.hidden() if os.path.isdir(h) and any(inside(h, s) and h != s for s in shown))

    def pythonpath(self, shown: Sequence[str]) -> str:
        """The sandbox's PYTHONPATH: the package's folder, then the grader's PYTHONPATH entries
        that a sandbox sees (inside ``shown`` or the system's folders, such as packages
        installed with ``pip --target /usr/local/lib/...``)."""
        entries = [os.path.dirname(self.pkg_dir)]
        if self.meta:
            entries.append(self.meta)
        seen = [*shown, *system_folders()]
        for p in os.environ.get("PYTHONPATH", "").split(os.pathsep):
            if p and os.path.isdir(p) and any(inside(real(p), s) for s in seen):
                entries.append(real(p))
        return ":".join(dict.fromkeys(entries))

    def bwrap_args(self, *, scratch: str, scratch_mib: int, shm_mib: int) -> list[str]:
        """bwrap's arguments for the allowlist: a new, empty root; the binds; a private
        writable ``scratch`` (``scratch_mib``) and ``/dev/shm`` (``shm_mib``); the rest
        read-only."""
        bw: list[str] = []
        dirs: set[str] = set()

        def parents(path: str) -> None:
            # bwrap would make missing mount points 0700: make the folders on the way traversable
            parts = path.strip("/").split("/")[:-1]
            for k in range(1, len(parts) + 1):
                d = "/" + "/".join(parts[:k])
                if d not in dirs:
                    dirs.add(d)
                    bw.extend(["--perms", "0755", "--dir", d])

        for s in SYSTEM:
            if os.path.islink(s):
                bw += ["--symlink", os.readlink(s), s]
            elif os.path.isdir(s):
                bw += ["--ro-bind", s, s]
        bw += ["--perms", "0755", "--dir", "/etc"]
        dirs.add("/etc")
        for pattern in ETC:
            for path in sorted(glob.glob(os.path.join("/etc", pattern))):
                if os.path.lexists(path):
                    bw += ["--ro-bind", path, path] if not os.path.islink(path) else ["--symlink", os.readlink(path), path]
        for dest, src in self.etc.items():
            bw += ["--ro-bind", src, dest]
        bw += ["--dev", "/dev", "--proc", "/proc", "--ro-bind", "/sys", "/sys"]
        bw += ["--size", str(int(shm_mib) << 20), "--perms", "1777", "--tmpfs", "/dev/shm"]
        if self.live:
            for node in sorted(glob.glob("/dev/nvidia*")):
                if os.path.exists(node):
                    bw += ["--dev-bind", node, node]
        shown = self.shown()
        for s in shown:
            parents(s)
            bw += ["--ro-bind", s, s]
        for h in self.covered(shown):
            bw += ["--perms", "0755", "--tmpfs", h, "--remount-ro", h]
        bw += ["--perms", "0755", "--dir", os.path.dirname(scratch)]
        bw += ["--size", str(int(scratch_mib) << 20), "--perms", "1777", "--tmpfs", scratch]
        bw += ["--remount-ro", "/dev", "--remount-ro", "/"]
        return bw
