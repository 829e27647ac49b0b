"""The sandbox every submission runs in (experiments/grading/sandbox.py), tested directly with
small Python programs instead of notebooks (a fraction of a second each).

What is expected comes from the issue's list: no network; a read-only system; no view of
$HOME, the repository (its solutions), other submissions or the grader's output; a private
writable scratch folder; a clean environment; limits on memory, processes, file size, CPU
time and output; every process killed when its time is up. A GPU-marked test checks that
CUDA works in the live sandbox under its memory limit.
"""
from __future__ import annotations

import json
import os
import socket
import textwrap
import time
from pathlib import Path

import pytest

from experiments.grading.sandbox import Limits, Sandbox, rlimits

ROOT = Path(__file__).resolve().parent.parent
SECRET = "sandbox-secret-3c81"


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    """A prepared sandbox that hides a planted home and a planted class folder."""
    tmp = tmp_path_factory.mktemp("sandbox")
    home, klass = tmp / "home", tmp / "class"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text(SECRET)
    klass.mkdir()
    (klass / "classmate.ipynb").write_text(SECRET)
    saved = os.environ.get("HOME")
    os.environ["HOME"] = str(home)
    os.environ["MEMLAB_SANDBOX_SECRET"] = SECRET
    sb = Sandbox(hide=[klass])
    try:
        sb.prepare()
        yield sb, {"home": home, "class": klass}
    finally:
        sb.close()
        os.environ.pop("MEMLAB_SANDBOX_SECRET", None)
        if saved is None:
            os.environ.pop("HOME", None)
        else:
            os.environ["HOME"] = saved


def _run(sandbox, code: str, *, seconds: float = 60, limits: Limits = Limits(), live: bool = False,
         cpu_seconds: float | None = None) -> dict:
    """Run ``code`` in the sandbox after the limits a runner sets; returns the JSON it prints last."""
    spec = json.dumps(rlimits(limits, live=live, seconds=cpu_seconds or seconds))
    prog = (f"import json, sys\nfrom experiments.grading.sandbox import apply_limits\napply_limits(json.loads({spec!r}))\n"
            + textwrap.dedent(code))
    out = sandbox.run(["-c", prog], b"", seconds=seconds, limits=limits, module=None)
    lines = [ln for ln in out.lines if ln.startswith(b"{")]
    return {"result": json.loads(lines[-1]) if lines else None, "outcome": out}


def test_a_user_who_is_not_root_with_no_network_and_a_clean_environment(sandbox):
    sb, _ = sandbox
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    got = _run(sb, f"""
        import os, socket
        try:
            socket.create_connection(("127.0.0.1", {port}), timeout=2)
            net = "connected"
        except OSError as e:
            net = type(e).__name__
        print(json.dumps({{"uid": os.getuid(), "net": net, "env": sorted(os.environ),
                           "secret": "{SECRET}" in repr(dict(os.environ))}}))
    """)["result"]
    listener.close()
    assert got["uid"] != 0
    assert got["net"] in ("ConnectionRefusedError", "OSError", "TimeoutError"), got
    assert not got["secret"] and "MEMLAB_SANDBOX_SECRET" not in got["env"]
    assert set(got["env"]) <= {"PATH", "HOME", "TMPDIR", "USER", "LOGNAME", "LANG", "LC_ALL", "PYTHONPATH",
                               "PYTHONNOUSERSITE", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED", "CUDA_MEMLAB_MODE",
                               "MPLBACKEND", "MPLCONFIGDIR", "IPYTHONDIR", "JUPYTER_RUNTIME_DIR", "JUPYTER_DATA_DIR",
                               "JUPYTER_CONFIG_DIR", "JUPYTER_PLATFORM_DIRS", "XDG_CACHE_HOME", "XDG_CONFIG_HOME",
                               "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MALLOC_ARENA_MAX",
                               "PIP_NO_INPUT", "PIP_DISABLE_PIP_VERSION_CHECK", "PIP_NO_INDEX", "LD_LIBRARY_PATH",
                               "CUDA_VISIBLE_DEVICES", "LC_CTYPE", "PWD"}, got["env"]


def test_only_the_package_is_seen_and_only_the_scratch_folder_written(sandbox, tmp_path):
    sb, where = sandbox
    outside = tmp_path / "grades.csv"
    outside.write_text("the grader's output")
    probes = {"home key": str(where["home"] / ".ssh" / "id_rsa"), "classmate": str(where["class"] / "classmate.ipynb"),
              "solutions": str(ROOT / "book" / "src" / "ch1_caching_allocator.py"), "output": str(outside),
              "package": str(ROOT / "experiments" / "core" / "checks.py"), "root key": "/root/.ssh/id_rsa",
              "etc": "/etc/hostname"}
    got = _run(sb, f"""
        import os, site, sysconfig
        seen = {{}}
        for name, path in {probes!r}.items():
            try:
                with open(path) as f:
                    seen[name] = "{SECRET}" in f.read() or "read"
            except OSError as e:
                seen[name] = type(e).__name__
        wrote = {{}}
        for name, path in {{"scratch": "work.txt", "tmp": "/tmp/x", "home": "{where['home']}/x",
                           "site-packages": sysconfig.get_paths()["purelib"] + "/evil.pth",
                           "package": "{ROOT / 'experiments' / 'evil.py'}", "output": "{outside}",
                           "etc": "/etc/evil"}}.items():
            try:
                with open(path, "w") as f:
                    f.write("x")
                wrote[name] = "written"
            except OSError as e:
                wrote[name] = type(e).__name__
        print(json.dumps({{"seen": seen, "wrote": wrote, "cwd": os.getcwd()}}))
    """)["result"]
    seen, wrote = got["seen"], got["wrote"]
    assert seen["package"] == "read" and seen["etc"] == "read"
    for name in ("home key", "classmate", "solutions", "output", "root key"):
        assert seen[name] in ("FileNotFoundError", "PermissionError"), (name, seen)
    assert wrote["scratch"] == "written" and got["cwd"] == "/tmp/work"
    for name in ("tmp", "home", "site-packages", "package", "output", "etc"):
        assert wrote[name] in ("OSError", "PermissionError", "FileNotFoundError"), (name, wrote)
    assert outside.read_text() == "the grader's output" and not (ROOT / "experiments" / "evil.py").exists()


def test_memory_processes_file_size_and_scratch_are_limited(sandbox):
    sb, _ = sandbox
    got = _run(sb, """
        import os, subprocess
        out = {}
        try:
            hog = bytearray(4 << 30)
            out["4 GiB"] = "allocated"
        except MemoryError:
            out["4 GiB"] = "MemoryError"
        procs = []
        try:
            for _ in range(400):
                procs.append(subprocess.Popen(["sleep", "60"]))
        except OSError:
            pass
        out["processes"] = len(procs)
        try:
            with open("big", "wb") as f:
                f.write(b"x" * (65 << 20))
            out["65 MiB file"] = "written"
        except OSError as e:
            out["65 MiB file"] = e.errno
        os.remove("big") if os.path.exists("big") else None
        try:
            for i in range(6):
                with open(f"part{i}", "wb") as f:
                    f.write(b"x" * (60 << 20))
            out["360 MiB in scratch"] = "written"
        except OSError as e:
            out["360 MiB in scratch"] = e.errno
        print(json.dumps(out))
    """, limits=Limits(processes=64))["result"]
    import errno

    assert got["4 GiB"] == "MemoryError"
    assert 40 <= got["processes"] < 64, got  # the runner's own threads count too
    assert got["65 MiB file"] == errno.EFBIG
    assert got["360 MiB in scratch"] == errno.ENOSPC


@pytest.mark.slow  # waits out its 12-s wall-clock limit: make test runs it, the developer loop does not
def test_when_time_is_up_every_process_dies(sandbox):
    sb, _ = sandbox
    marker = "memlab-sandbox-timeout-7d2"
    t0 = time.monotonic()
    got = _run(sb, f"""
        import subprocess, time
        subprocess.Popen(["sh", "-c", "sleep 300; : {marker}"], start_new_session=True)
        subprocess.Popen(["sh", "-c", "(sleep 300; : {marker}) &"], start_new_session=True)
        print(json.dumps({{"started": True}}), flush=True)
        while True:  # asleep, not spinning: the wall-clock limit is tested here, CPU time below
            time.sleep(1)
    """, seconds=12)
    took = time.monotonic() - t0
    assert got["result"] == {"started": True} and got["outcome"].timed_out and took < 25
    time.sleep(0.5)
    left = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and marker in (p / "cmdline").read_bytes().decode(errors="replace"):
                left.append(p.name)
        except OSError:
            pass
    assert not left, f"processes of the sandbox outlived it: {left}"


@pytest.mark.slow  # spends its CPU-time limit: make test runs it, the developer loop does not
def test_cpu_time_is_limited(sandbox):
    sb, _ = sandbox
    spec = rlimits(Limits(), live=False, seconds=1)
    assert spec["RLIMIT_CPU"] == [6, 11]
    got = _run(sb, """
        while True:
            pass
    """, seconds=60, cpu_seconds=1)
    out = got["outcome"]
    # SIGXCPU: bwrap reports a child killed by signal N as 128 + N
    assert not out.timed_out and out.seconds < 40 and out.returncode in (-24, 128 + 24), (out.returncode, out.seconds)


def test_output_is_limited(sandbox):
    sb, _ = sandbox
    out = sb.run(["-c", "import sys\nwhile True:\n    sys.stdout.write('x' * 100000 + '\\n')"], b"", seconds=30,
                 limits=Limits(), module=None, max_output=1 << 20)
    assert out.too_much_output and sum(map(len, out.lines)) <= 1 << 20 and out.seconds < 20


@pytest.mark.gpu
def test_cuda_works_in_the_live_sandbox_under_its_memory_limit():
    """On a GPU: the live sandbox binds the GPU's device nodes; CUDA runs under RLIMIT_DATA
    (RLIMIT_AS would break it), and a 4 GiB host allocation still fails."""
    sb = Sandbox(live=True)
    try:
        print(sb.prepare())
        got = _run(sb, """
            import torch
            x = torch.ones(2, device="cuda")
            pinned = torch.empty(16 << 20, pin_memory=True)
            out = {"sum": float(x.sum()), "device": torch.cuda.get_device_name()}
            try:
                hog = bytearray(4 << 30)
                out["4 GiB"] = "allocated"
            except MemoryError:
                out["4 GiB"] = "MemoryError"
            print(json.dumps(out))
        """, live=True, seconds=300)
        assert got["result"] is not None, got["outcome"].stderr_tail[-2000:]
        assert got["result"]["sum"] == 2.0 and got["result"]["4 GiB"] == "MemoryError", got["result"]
    finally:
        sb.close()
