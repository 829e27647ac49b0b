"""The seccomp filter every sandbox runs under: a classic BPF program that bubblewrap loads
(``bwrap --seccomp FD``) just before it starts the sandbox's first process.

It refuses, in every sandbox mode:

- the kernel keyring calls ``keyctl``, ``add_key`` and ``request_key`` (a sandbox joins a
  fresh session keyring of its own before bwrap starts, and then cannot touch any keyring:
  not the grader's login keyring, nor the per-user keyring a classmate's sandbox could leave
  a key in);
- new user namespaces: ``unshare`` and ``clone`` with ``CLONE_NEWUSER``, and ``clone3``,
  whose flags a filter cannot read (it answers ``ENOSYS``, so the C library falls back to
  ``clone``, where the flags are checked); ``setns``;
- reading or writing other processes' memory and descriptors: ``ptrace``,
  ``process_vm_readv``/``writev``, ``pidfd_getfd`` (the grader's own processes in a
  sandbox are also non-dumpable);
- every system call of another ABI (32-bit x86, x32), whose numbers differ.

Refused calls fail with ``EPERM``; nothing else changes. The program is written here, not
generated with libseccomp, so that the grader needs nothing beyond bubblewrap; its layout is
the kernel's ``struct sock_filter`` and ``struct seccomp_data`` (linux/filter.h,
linux/seccomp.h), for x86-64 and AArch64 (:data:`SYSCALLS` holds each one's numbers, from
the kernel's syscall tables).
"""
from __future__ import annotations

import errno
import os
import platform
import struct

# linux/audit.h: AUDIT_ARCH_X86_64 = EM_X86_64 | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE
ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
X32_BIT = 0x40000000          # x86-64's x32 ABI: the same numbers with this bit set
CLONE_NEWUSER = 0x10000000

# Numbers from arch/x86/entry/syscalls/syscall_64.tbl and include/uapi/asm-generic/unistd.h.
SYSCALLS = {
    "x86_64": {"keyctl": 250, "add_key": 248, "request_key": 249, "unshare": 272, "clone": 56, "clone3": 435,
               "setns": 308, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "pidfd_getfd": 438},
    "aarch64": {"keyctl": 219, "add_key": 217, "request_key": 218, "unshare": 97, "clone": 220, "clone3": 435,
                "setns": 268, "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "pidfd_getfd": 438},
}
REFUSED = ("keyctl", "add_key", "request_key", "setns", "ptrace", "process_vm_readv", "process_vm_writev",
           "pidfd_getfd")
FLAGS_CHECKED = ("unshare", "clone")     # refused only with CLONE_NEWUSER in their first argument

# linux/bpf_common.h, linux/seccomp.h
LD_W_ABS, JEQ_K, JSET_K, RET_K = 0x20, 0x15, 0x45, 0x06
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
NR_OFFSET, ARCH_OFFSET, ARG0_OFFSET = 0, 4, 16   # struct seccomp_data: nr, arch, ip, args[6]


class Unsupported(RuntimeError):
    """No filter is written for this machine's processor."""


def _ins(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def program(machine: str | None = None) -> bytes:
    """The filter, as the bytes of a ``struct sock_filter`` array (what ``bwrap --seccomp``
    reads from its descriptor).

    Raises:
        Unsupported: a processor other than x86-64 or AArch64.
    """
    machine = machine or platform.machine()
    if machine not in SYSCALLS:
        raise Unsupported(f"no seccomp filter for the processor {machine!r} (x86_64 and aarch64 only)")
    nr = SYSCALLS[machine]
    eperm, enosys = RET_ERRNO | errno.EPERM, RET_ERRNO | errno.ENOSYS
    # The end of the program: the flags check of unshare/clone (args[0], low 32 bits,
    # little-endian, & CLONE_NEWUSER), then the three answers. Every jump is relative to the
    # instruction after it.
    end = [_ins(LD_W_ABS, ARG0_OFFSET), _ins(JSET_K, CLONE_NEWUSER, 1, 0), _ins(RET_K, RET_ALLOW),
           _ins(RET_K, eperm), _ins(RET_K, enosys)]
    FLAGS, DENY, NOSYS = 0, 3, 4                       # indexes in `end` (2: allow)
    checks: list[tuple[int, int]] = [(nr[name], DENY) for name in REFUSED]
    checks += [(nr[name], FLAGS) for name in FLAGS_CHECKED]
    checks.append((nr["clone3"], NOSYS))
    body: list[bytes] = []
    n = len(checks)
    for i, (number, target) in enumerate(checks):
        # instructions after this one before `end`: the remaining checks and the final allow
        to_end = (n - 1 - i) + 1
        body.append(_ins(JEQ_K, number, to_end + target, 0))
    body.append(_ins(RET_K, RET_ALLOW))  # not a listed call: allowed (the `end` block follows)
    head = [_ins(LD_W_ABS, ARCH_OFFSET),
            _ins(JEQ_K, ARCH[machine], 1, 0),
            _ins(RET_K, eperm),                        # another ABI (32-bit x86 on x86-64)
            _ins(LD_W_ABS, NR_OFFSET)]
    if machine == "x86_64":
        head.append(_ins(JSET_K, X32_BIT, 0, 1))       # x32 numbers
        head.append(_ins(RET_K, eperm))
    return b"".join(head + body + end)


def memfd() -> int:
    """A descriptor holding :func:`program`, positioned at its start, for ``bwrap --seccomp``
    (bwrap reads it to the end and closes it). The caller passes it to the sandbox's process.

    Raises:
        Unsupported: see :func:`program`.
        OSError: the descriptor cannot be made.
    """
    data = program()
    fd = os.memfd_create("memlab-seccomp", 0) if hasattr(os, "memfd_create") else None
    if fd is None:
        import tempfile

        fd, path = tempfile.mkstemp(prefix="memlab-seccomp-")
        os.unlink(path)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
