"""The syscall filter of every sandbox: one table (``PROFILE``), compiled two ways.

- ``bpf_program()``: a classic BPF program (the bytes of a ``struct sock_filter`` array)
  that the in-sandbox guest installs on itself with ``prctl(PR_SET_SECCOMP)`` once its
  setup (namespaces, mounts, ``pivot_root``, capabilities) is done, so it and every
  process of the sandbox run under it (``Seccomp: 2``, ``NoNewPrivs: 1``). Both the
  local and the docker backend run that guest, so both get the filter this way.
- ``docker_profile()``: the same rows in Docker's JSON form, for the container itself
  (``security_opt=["seccomp=<json>"]``), which covers its keep-alive and ``docker exec``.

Why our own compiler and not libseccomp: the guest runs inside the sandbox, standard
library only, so the filter is built on the host and shipped as bytes in the guest's
config frame; a program of ~150 instructions needs ~60 lines of Python, while the
bindings (``python3-seccomp`` / ``pyseccomp``) would add a C library that every host and
``make test`` must install. The program is checked by an interpreter in the tests and
by the real kernel in the attack suite.

A deny list, like Docker's rules for a container without ``CAP_SYS_ADMIN`` and the other
capabilities we drop: every implemented call that Docker's default profile refuses to
such a container is refused here (EPERM), plus ``io_uring``, ``adjtimex`` and
``name_to_handle_at``, which it allows. Calls that came after its list, up to Linux 6.17
(``fchmodat2``, the futex2 calls, ``statmount``/``listmount``, ``mseal``, the ``*xattrat``
family, ...), are allowed, except ``open_tree_attr``. Syscalls newer than this table (numbers above ``NEWEST_REVIEWED``, the same on both
architectures) get ENOSYS, as an allow list would give them, so a new kernel opens
nothing until a row says so; ENOSYS, not EPERM, because that is what makes libc fall
back to an older call.

Architecture: the program knows x86_64 and aarch64. Any other ABI a process can reach
(i386 through ``int 0x80``, x32 through bit 30 of the number) is killed: none of the
rows would match its numbering.

``ptrace`` stays allowed, as in Docker on kernels >= 4.8 (debuggers, ``strace`` and
``py-spy`` are tools an agent uses): the pid namespace hides every process outside the
sandbox, and since 4.8 seccomp re-checks a syscall a tracer rewrote, so tracing cannot
get around this filter. The guest marks itself non-dumpable, so commands cannot attach
to it (or read its memory) either. On an older kernel the row denies it.
"""

from __future__ import annotations

import functools
import json
import os
import struct
from dataclasses import dataclass

EPERM, ENOSYS = 1, 38
CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x02000000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
NEW_NAMESPACES = (CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER
                  | CLONE_NEWPID | CLONE_NEWNET)
PER_LINUX32, UNAME26 = 0x0008, 0x0020000  # the personality bits Docker allows (32-bit uname, old version)
AF_VSOCK, TIOCSTI = 40, 0x5412
NEWEST_REVIEWED = 469  # file_setattr (Linux 6.17)


@dataclass(frozen=True)
class Rule:
    """Deny ``names`` with ``errno``; with ``arg``, only when that argument's low 32 bits
    have one of ``any_bits`` set (or, with ``equals``, equal it). ``before_kernel``: the
    row applies only on kernels older than that (major, minor)."""

    names: tuple[str, ...]
    reason: str
    errno: int = EPERM
    arg: int | None = None
    any_bits: int = 0
    equals: int | None = None
    before_kernel: tuple[int, int] | None = None


PROFILE: tuple[Rule, ...] = (
    Rule(("clone",), "a new user/mount/net/pid/ipc/uts/cgroup namespace: the door most kernel "
         "escalations came through (Docker: needs CAP_SYS_ADMIN); threads and fork stay allowed",
         arg=0, any_bits=NEW_NAMESPACES),
    Rule(("clone3",), "its flags sit in a struct BPF cannot read: ENOSYS makes libc fall back to "
         "clone, checked above (as Docker does)", errno=ENOSYS),
    Rule(("unshare", "setns"), "creating or joining namespaces (Docker: needs CAP_SYS_ADMIN)"),
    Rule(("mount", "umount2", "pivot_root", "fsopen", "fsconfig", "fsmount", "fspick", "move_mount",
          "open_tree", "open_tree_attr", "mount_setattr"),
         "changing the mount table, old and new mount API (Docker: needs CAP_SYS_ADMIN)"),
    Rule(("bpf",), "eBPF programs and maps: a large kernel attack surface (Docker: CAP_SYS_ADMIN/BPF)"),
    Rule(("perf_event_open",), "kernel profiling: leaks kernel addresses, many CVEs (Docker: CAP_PERFMON)"),
    Rule(("add_key", "request_key", "keyctl"), "the kernel keyring is not namespaced: keys of the host"),
    Rule(("kexec_load", "kexec_file_load", "reboot"), "replacing or restarting the host's kernel"),
    Rule(("init_module", "finit_module", "delete_module", "create_module", "get_kernel_syms",
          "query_module"), "loading or removing kernel modules (Docker: CAP_SYS_MODULE)"),
    Rule(("open_by_handle_at", "name_to_handle_at"), "file handles bypass the mount namespace: the "
         "'shocker' container escape (Docker: CAP_DAC_READ_SEARCH)"),
    Rule(("userfaultfd",), "stalls kernel page faults at will: the usual race widener of exploits"),
    Rule(("io_uring_setup", "io_uring_enter", "io_uring_register"), "a second syscall interface that "
         "seccomp does not see into, with many CVEs (newer Docker and Google deny it)"),
    Rule(("kcmp", "pidfd_getfd", "process_madvise"), "inspecting other processes (Docker: CAP_SYS_PTRACE)"),
    Rule(("ptrace", "process_vm_readv", "process_vm_writev"), "before 4.8 a tracer could rewrite a "
         "syscall after seccomp checked it (Docker allows them from 4.8 on, and so do we)",
         before_kernel=(4, 8)),
    Rule(("personality",), "only Docker's safe personas: no ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC, ...",
         arg=0, any_bits=0xFFFFFFFF & ~(PER_LINUX32 | UNAME26)),
    Rule(("swapon", "swapoff", "acct", "quotactl", "quotactl_fd", "syslog", "vhangup", "lookup_dcookie",
          "nfsservctl", "uselib", "_sysctl", "sysfs", "ustat"),
         "host-wide administration and obsolete interfaces"),
    Rule(("settimeofday", "clock_settime", "clock_adjtime", "adjtimex"),
         "the clock is the host's, shared by every sandbox (Docker: CAP_SYS_TIME)"),
    Rule(("iopl", "ioperm"), "raw port I/O (Docker: CAP_SYS_RAWIO)"),
    Rule(("sethostname", "setdomainname"), "Docker: CAP_SYS_ADMIN; the sandbox's name is set at creation"),
    Rule(("fanotify_init",), "filesystem-wide event monitoring (Docker: CAP_SYS_ADMIN)"),
    Rule(("get_mempolicy", "set_mempolicy", "mbind", "migrate_pages", "move_pages",
          "set_mempolicy_home_node"), "NUMA placement of host memory (Docker: CAP_SYS_NICE)"),
    Rule(("socket",), "AF_VSOCK talks to the hypervisor, not through the network namespace (as Docker)",
         arg=0, equals=AF_VSOCK),
    Rule(("ioctl",), "TIOCSTI types into a terminal: a leaked tty fd would reach the host's shell",
         arg=1, equals=TIOCSTI),
)

# name: (x86_64, aarch64) numbers; None where the architecture lacks the call.
NUMBERS: dict[str, tuple[int | None, int | None]] = {
    "clone": (56, 220), "clone3": (435, 435), "unshare": (272, 97), "setns": (308, 268),
    "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41), "open_tree": (428, 428),
    "move_mount": (429, 429), "fsopen": (430, 430), "fsconfig": (431, 431), "fsmount": (432, 432),
    "fspick": (433, 433), "mount_setattr": (442, 442), "open_tree_attr": (467, 467),
    "bpf": (321, 280), "perf_event_open": (298, 241), "add_key": (248, 217), "request_key": (249, 218),
    "keyctl": (250, 219), "kexec_load": (246, 104), "kexec_file_load": (320, 294), "reboot": (169, 142),
    "init_module": (175, 105), "finit_module": (313, 273), "delete_module": (176, 106),
    "create_module": (174, None), "get_kernel_syms": (177, None), "query_module": (178, None),
    "open_by_handle_at": (304, 265), "name_to_handle_at": (303, 264), "userfaultfd": (323, 282),
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427),
    "kcmp": (312, 272), "pidfd_getfd": (438, 438), "process_madvise": (440, 440), "ptrace": (101, 117),
    "process_vm_readv": (310, 270), "process_vm_writev": (311, 271), "personality": (135, 92),
    "swapon": (167, 224), "swapoff": (168, 225), "acct": (163, 89), "quotactl": (179, 60),
    "quotactl_fd": (443, 443), "syslog": (103, 116), "vhangup": (153, 58), "lookup_dcookie": (212, 18),
    "nfsservctl": (180, 42), "uselib": (134, None), "_sysctl": (156, None), "sysfs": (139, None),
    "ustat": (136, None),
    "settimeofday": (164, 170), "clock_settime": (227, 112), "clock_adjtime": (305, 266),
    "adjtimex": (159, 171), "iopl": (172, None), "ioperm": (173, None), "sethostname": (170, 161),
    "setdomainname": (171, 162), "fanotify_init": (300, 262), "get_mempolicy": (239, 236),
    "set_mempolicy": (238, 237), "mbind": (237, 235), "migrate_pages": (256, 238), "move_pages": (279, 239),
    "set_mempolicy_home_node": (450, 450), "socket": (41, 198), "ioctl": (16, 29),
}

# (name, AUDIT_ARCH_* value, index into NUMBERS, libseccomp's name)
ARCHES = (("x86_64", 0xC000003E, 0, "SCMP_ARCH_X86_64"), ("aarch64", 0xC00000B7, 1, "SCMP_ARCH_AARCH64"))
X32_SYSCALL_BIT = 0x40000000

# classic BPF opcodes and seccomp's return values (linux/filter.h, linux/seccomp.h)
LD_ABS, JA, JEQ, JGT, JGE, JSET, RET = 0x20, 0x05, 0x15, 0x25, 0x35, 0x45, 0x06
RET_KILL_PROCESS, RET_ERRNO, RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
OFF_NR, OFF_ARCH, OFF_ARGS = 0, 4, 16  # struct seccomp_data; an argument's low word (little-endian)


def host_kernel() -> tuple[int, int]:
    major, minor = os.uname().release.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def active_rules(kernel: tuple[int, int] | None = None) -> list[Rule]:
    """The rows that apply on ``kernel`` (the host's by default)."""
    kernel = kernel or host_kernel()
    return [r for r in PROFILE if r.before_kernel is None or kernel < r.before_kernel]


def _arch_block(index: int, rules: list[Rule], x32: bool) -> list[tuple[int, int, int, int]]:
    """The instructions for one architecture, entered with nothing loaded."""
    out = [(LD_ABS, 0, 0, OFF_NR)]
    if x32:  # x86_64's x32 ABI: the same arch value, numbers with bit 30 set
        out += [(JGE, 0, 1, X32_SYSCALL_BIT), (RET, 0, 0, RET_KILL_PROCESS)]
    out += [(JGT, 0, 1, NEWEST_REVIEWED), (RET, 0, 0, RET_ERRNO | ENOSYS)]
    for rule in rules:
        deny = (RET, 0, 0, RET_ERRNO | rule.errno)
        for name in rule.names:
            nr = NUMBERS[name][index]
            if nr is None:
                continue
            if rule.arg is None:
                out += [(JEQ, 0, 1, nr), deny]
            else:  # not this call: jump to the reload of nr; this call, but the test fails: the same
                test = (JSET, 0, 1, rule.any_bits) if rule.any_bits else (JEQ, 0, 1, rule.equals)
                out += [(JEQ, 0, 3, nr), (LD_ABS, 0, 0, OFF_ARGS + 8 * rule.arg), test, deny,
                        (LD_ABS, 0, 0, OFF_NR)]
    return out + [(RET, 0, 0, RET_ALLOW)]


def instructions(kernel: tuple[int, int] | None = None) -> list[tuple[int, int, int, int]]:
    """The filter as (code, jt, jf, k) tuples: dispatch on the architecture, then its block."""
    rules = active_rules(kernel)
    blocks = [_arch_block(index, rules, x32=name == "x86_64") for name, _, index, _ in ARCHES]
    head = [(LD_ABS, 0, 0, OFF_ARCH)]
    start = 1 + 2 * len(ARCHES) + 1  # after the dispatch and its final kill
    for (_, audit, _, _), block_start in zip(ARCHES, _starts(start, blocks)):
        here = len(head)  # jeq at here, ja at here + 1
        head += [(JEQ, 0, 1, audit), (JA, 0, 0, block_start - (here + 2))]
    head.append((RET, 0, 0, RET_KILL_PROCESS))  # an ABI no row speaks
    return head + [ins for block in blocks for ins in block]


def _starts(first: int, blocks: list[list]) -> list[int]:
    starts = []
    for block in blocks:
        starts.append(first)
        first += len(block)
    return starts


@functools.lru_cache(maxsize=None)
def bpf_program(kernel: tuple[int, int] | None = None) -> bytes:
    """The filter as the bytes of a ``struct sock_filter`` array, for ``prctl``."""
    return b"".join(struct.pack("=HBBI", *ins) for ins in instructions(kernel))


def docker_profile(kernel: tuple[int, int] | None = None) -> dict:
    """The same rows in Docker's seccomp JSON: default allow, each row an ERRNO entry; a
    bit test becomes one MASKED_EQ entry per bit (entries are or-ed). Docker skips names its
    libseccomp does not know. The ENOSYS for syscalls newer than the table has no name to
    give: the container's own keep-alive does not need it, and commands run under ours."""
    entries = []
    for rule in active_rules(kernel):
        base = {"names": list(rule.names), "action": "SCMP_ACT_ERRNO", "errnoRet": rule.errno}
        if rule.arg is None:
            entries.append(base)
            continue
        if rule.any_bits:
            tests = [(1 << b, 1 << b) for b in range(32) if rule.any_bits >> b & 1]
        else:
            tests = [(0xFFFFFFFF, rule.equals)]  # the low word only, as the kernel reads an int
        entries += [{**base, "args": [{"index": rule.arg, "value": mask, "valueTwo": value,
                                       "op": "SCMP_CMP_MASKED_EQ"}]} for mask, value in tests]
    return {"defaultAction": "SCMP_ACT_ALLOW", "architectures": [a[3] for a in ARCHES], "syscalls": entries}


@functools.lru_cache(maxsize=None)
def docker_security_opt(kernel: tuple[int, int] | None = None) -> str:
    """``security_opt`` entry for a container: the profile inline, as the engine expects it."""
    return "seccomp=" + json.dumps(docker_profile(kernel), separators=(",", ":"))
