"""The sandbox's seccomp deny-list, as a classic-BPF program for ``bwrap --seccomp``.

In the spirit of container runtimes' default profiles (Docker's, runc's): system calls a
sandboxed agent has no business making, and that have been the first step of real escapes, fail
with ``EPERM``; everything else is allowed. The list:

  * namespaces: ``unshare``, ``setns``, and ``clone`` with any ``CLONE_NEW*`` flag (a nested
    user namespace hands back a full capability set over new namespaces); ``clone3`` returns
    ``ENOSYS`` so the C library falls back to ``clone``, whose flags the filter can read;
  * mounts: ``mount``, ``umount2``, ``pivot_root``, ``chroot`` and the new mount API
    (``fsopen``, ``fsconfig``, ``fsmount``, ``fspick``, ``move_mount``, ``open_tree``,
    ``mount_setattr``);
  * kernel keyrings: ``keyctl``, ``add_key``, ``request_key`` (the host's session keyring is
    never reachable, whatever a process inherited);
  * io_uring (``io_uring_setup/enter/register``: a large, often-exploited surface that also
    bypasses this filter for the operations it performs);
  * other processes' memory and tracing: ``ptrace``, ``process_vm_readv/writev``,
    ``pidfd_getfd``, ``perf_event_open``, ``bpf``, ``userfaultfd``;
  * the machine: kernel modules, ``kexec``, ``reboot``, ``swapon/off``, ``acct``, clocks
    (``settimeofday``, ``clock_settime``, ``clock_adjtime``, ``adjtimex``), ``syslog``,
    ``quotactl``, ``iopl``/``ioperm``, ``vhangup``, ``uselib``, NUMA page moves, file handles
    (``open_by_handle_at``, ``name_to_handle_at``), ``lookup_dcookie``, ``fanotify_init``.

Sockets of any family but Unix, IPv4, IPv6 and netlink fail with ``EAFNOSUPPORT``
(``socket``, ``socketpair``): the network namespace isolates IP, but not every family has a
namespace — ``AF_VSOCK`` shares the host's port space and reaches the hypervisor's agents
(Docker's profile denies it too), and packet, Bluetooth or CAN sockets are kernel surface an
agent does not need.

Any other ABI is killed: 32-bit ``int 0x80`` calls from a 64-bit process (a classic way round
a filter written for one table) and the x32 ABI. Only x86-64 is built here; on another
architecture ``program()`` raises and the sandbox refuses to start without the filter.

Written by hand rather than through libseccomp's bindings: the program is ~70 fixed
instructions, the only maintained Python binding is a system package that a virtual
environment does not see, and the attack tests in ``tests/security`` check each entry.
"""

from __future__ import annotations

import errno
import platform
import struct

from rlonce.errors import RlonceError

AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000

SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_ALLOW = 0x7FFF0000

# classic BPF opcodes
LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
JSET_K = 0x45  # BPF_JMP | BPF_JSET | BPF_K
RET_K = 0x06  # BPF_RET | BPF_K

# offsets in struct seccomp_data
NR, ARCH, ARG0_LO = 0, 4, 16

CLONE_NAMESPACE_FLAGS = (0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000
                         | 0x40000000 | 0x00000080)  # NEWNS UTS IPC USER PID NET CGROUP, NEWTIME

X86_64_DENIED: dict[str, int] = {
    "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161,
    "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "move_mount": 429, "open_tree": 428,
    "mount_setattr": 442, "keyctl": 250, "add_key": 248, "request_key": 249, "io_uring_setup": 425,
    "io_uring_enter": 426, "io_uring_register": 427, "ptrace": 101, "process_vm_readv": 310,
    "process_vm_writev": 311, "pidfd_getfd": 438, "perf_event_open": 298, "bpf": 321, "userfaultfd": 323,
    "kexec_load": 246, "kexec_file_load": 320, "init_module": 175, "finit_module": 313, "delete_module": 176,
    "reboot": 169, "swapon": 167, "swapoff": 168, "acct": 163, "settimeofday": 164, "clock_settime": 227,
    "clock_adjtime": 305, "adjtimex": 159, "syslog": 103, "quotactl": 179, "iopl": 172, "ioperm": 173,
    "vhangup": 153, "uselib": 134, "mbind": 237, "move_pages": 279, "migrate_pages": 256,
    "open_by_handle_at": 304, "name_to_handle_at": 303, "lookup_dcookie": 212, "fanotify_init": 300,
}
X86_64_CLONE, X86_64_CLONE3 = 56, 435
X86_64_SOCKET, X86_64_SOCKETPAIR = 41, 53
SOCKET_FAMILIES = {"AF_UNIX": 1, "AF_INET": 2, "AF_INET6": 10, "AF_NETLINK": 16}
"""The socket families a sandbox may open; any other is ``EAFNOSUPPORT``."""


class SeccompUnavailable(RlonceError, RuntimeError):
    pass


def _ins(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def program() -> bytes:
    """The filter as ``struct sock_filter`` bytes, ready for ``bwrap --seccomp FD``."""
    if platform.machine() not in ("x86_64", "AMD64"):
        raise SeccompUnavailable(f"the sandbox's seccomp filter is built for x86-64 only, not {platform.machine()}")
    code: list[tuple[int, int, str | int, str | int]] = []  # jumps name their target, resolved below
    labels: dict[str, int] = {}
    code += [(LD_W_ABS, ARCH, 0, 0), (JEQ_K, AUDIT_ARCH_X86_64, 0, "kill"), (LD_W_ABS, NR, 0, 0),
             (JGE_K, X32_SYSCALL_BIT, "kill", 0), (JEQ_K, X86_64_CLONE3, "enosys", 0),
             (JEQ_K, X86_64_CLONE, "clone", 0), (JEQ_K, X86_64_SOCKET, "socket", 0),
             (JEQ_K, X86_64_SOCKETPAIR, "socket", 0)]
    code += [(JEQ_K, nr, "eperm", 0) for nr in sorted(X86_64_DENIED.values())]
    code.append((RET_K, SECCOMP_RET_ALLOW, 0, 0))
    labels["clone"] = len(code)  # a clone that makes a namespace is refused
    code += [(LD_W_ABS, ARG0_LO, 0, 0), (JSET_K, CLONE_NAMESPACE_FLAGS, "eperm", 0), (RET_K, SECCOMP_RET_ALLOW, 0, 0)]
    labels["socket"] = len(code)  # the family is the first argument
    code.append((LD_W_ABS, ARG0_LO, 0, 0))
    code += [(JEQ_K, family, "allow", 0) for family in SOCKET_FAMILIES.values()]
    code.append((RET_K, SECCOMP_RET_ERRNO | errno.EAFNOSUPPORT, 0, 0))
    for name, ret in (("allow", SECCOMP_RET_ALLOW), ("enosys", SECCOMP_RET_ERRNO | errno.ENOSYS),
                      ("eperm", SECCOMP_RET_ERRNO | errno.EPERM), ("kill", SECCOMP_RET_KILL_PROCESS)):
        labels[name] = len(code)
        code.append((RET_K, ret, 0, 0))

    def offset(here: int, target: str | int) -> int:
        return target if isinstance(target, int) else labels[target] - here - 1  # forward jumps only

    return b"".join(_ins(op, k, offset(i, jt), offset(i, jf)) for i, (op, k, jt, jf) in enumerate(code))
