"""The syscall filter's compiler (``deployment/seccomp.py``), checked two ways: its BPF
program run by a small interpreter written here from the kernel's definitions (both
architectures, any kernel), and installed in a real process, where every denied call
made with harmless arguments gets EPERM (clone3: ENOSYS) while the same call without
the filter gets the kernel's own answer. The attacks from inside sandboxes, on both
backends, are in test_security.py."""

import json
import os
import signal
import struct
import subprocess
import sys
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rockroll.sandbox.deployment import seccomp
from rockroll.sandbox.deployment.seccomp import NUMBERS, PROFILE, bpf_program, docker_profile

# linux/audit.h, linux/seccomp.h
AUDIT_X86_64, AUDIT_AARCH64, AUDIT_I386 = 0xC000003E, 0xC00000B7, 0x40000003
ALLOW, KILL_PROCESS = 0x7FFF0000, 0x80000000
EPERM, ENOSYS = 0x00050000 | 1, 0x00050000 | 38
ARCH_INDEX = {AUDIT_X86_64: 0, AUDIT_AARCH64: 1}


def run_filter(program: bytes, nr: int, arch: int, args=(0,) * 6) -> int:
    """What the kernel's classic BPF would return for this ``struct seccomp_data``."""
    args = [a & (1 << 64) - 1 for a in args] + [0] * (6 - len(args))
    data = struct.pack("<iIQ6Q", nr, arch, 0, *args)
    code = [struct.unpack_from("=HBBI", program, i) for i in range(0, len(program), 8)]
    pc, acc = 0, 0
    for _ in range(len(code)):  # no loops in classic BPF: each instruction runs once at most
        op, jt, jf, k = code[pc]
        pc += 1
        if op == 0x20:  # BPF_LD | BPF_W | BPF_ABS
            acc = struct.unpack_from("<I", data, k)[0]
        elif op == 0x05:  # BPF_JMP | BPF_JA
            pc += k
        elif op in (0x15, 0x25, 0x35, 0x45):  # JEQ, JGT, JGE, JSET with a constant
            taken = {0x15: acc == k, 0x25: acc > k, 0x35: acc >= k, 0x45: acc & k != 0}[op]
            pc += jt if taken else jf
        elif op == 0x06:  # BPF_RET | BPF_K
            return k
        else:
            raise AssertionError(f"unexpected opcode {op:#x} at {pc - 1}")
    raise AssertionError("ran off the end")


def expected(name: str, args, kernel=(6, 1)) -> int:
    """The table's verdict for ``name(args)``, read directly off PROFILE."""
    for rule in PROFILE:
        if name not in rule.names or (rule.before_kernel and kernel >= rule.before_kernel):
            continue
        if rule.arg is None:
            return 0x00050000 | rule.errno
        low = args[rule.arg] & 0xFFFFFFFF
        if (rule.any_bits and low & rule.any_bits) or (rule.equals is not None and low == rule.equals):
            return 0x00050000 | rule.errno
    return ALLOW


def test_hand_checked_verdicts_on_both_architectures():
    prog = bpf_program((6, 1))
    for arch, (clone, clone3, unshare, mount, personality, read, ptrace) in {
            AUDIT_X86_64: (56, 435, 272, 165, 135, 0, 101), AUDIT_AARCH64: (220, 435, 97, 40, 92, 63, 117)}.items():
        assert run_filter(prog, clone, arch, (0x10000000 | 17,)) == EPERM  # CLONE_NEWUSER
        assert run_filter(prog, clone, arch, (0x40000000 | 17,)) == EPERM  # CLONE_NEWNET
        assert run_filter(prog, clone, arch, (0x01200011,)) == ALLOW  # what fork() passes
        assert run_filter(prog, clone, arch, (0x003D0F00,)) == ALLOW  # what pthread_create passes
        assert run_filter(prog, clone3, arch) == ENOSYS
        assert run_filter(prog, unshare, arch) == EPERM
        assert run_filter(prog, mount, arch) == EPERM
        assert run_filter(prog, personality, arch, (0x0008,)) == ALLOW
        assert run_filter(prog, personality, arch, (0x0040000,)) == EPERM  # ADDR_NO_RANDOMIZE
        assert run_filter(prog, read, arch) == ALLOW
        assert run_filter(prog, ptrace, arch) == ALLOW
        assert run_filter(bpf_program((4, 4)), ptrace, arch) == EPERM  # before 4.8: denied
        assert run_filter(prog, 470, arch) == ENOSYS  # newer than the table
    assert run_filter(prog, 0x40000000 | 39, AUDIT_X86_64) == KILL_PROCESS  # x32 getpid
    assert run_filter(prog, 20, AUDIT_I386) == KILL_PROCESS  # int 0x80 getpid


@pytest.mark.parametrize("arch", [AUDIT_X86_64, AUDIT_AARCH64])
def test_every_row_of_the_table_is_in_the_program(arch):
    prog = bpf_program((6, 1))
    checked = 0
    for rule in PROFILE:
        for name in rule.names:
            nr = NUMBERS[name][ARCH_INDEX[arch]]
            if nr is None:
                continue
            if rule.arg is None:
                cases = [(0,) * 6]
            else:  # the condition's values, and values beside them, with noise in the high word
                values = [1 << b for b in range(32) if rule.any_bits >> b & 1] or [rule.equals, rule.equals + 1]
                cases = [tuple(v | hi if i == rule.arg else 0 for i in range(6))
                         for v in [0, *values] for hi in (0, 1 << 40)]
            for args in cases:
                assert run_filter(prog, nr, arch, args) == expected(name, args), (name, args)
                checked += 1
    assert checked > 60


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([AUDIT_X86_64, AUDIT_AARCH64]), st.integers(0, seccomp.NEWEST_REVIEWED),
       st.lists(st.integers(0, (1 << 64) - 1), min_size=6, max_size=6))
def test_any_call_gets_the_tables_verdict(arch, nr, args):
    names = [n for n, nums in NUMBERS.items() if nums[ARCH_INDEX[arch]] == nr]
    want = expected(names[0], args) if names else ALLOW
    assert run_filter(bpf_program((6, 1)), nr, arch, args) == want


def json_verdict(profile: dict, name: str, args) -> int:
    """libseccomp's reading of Docker's JSON: the first entry (all its args matching) wins."""
    for entry in profile["syscalls"]:
        if name in entry["names"] and all(args[a["index"]] & a["value"] == a["valueTwo"]
                                          for a in entry.get("args", [])):
            assert entry["action"] == "SCMP_ACT_ERRNO"
            return 0x00050000 | entry["errnoRet"]
    assert profile["defaultAction"] == "SCMP_ACT_ALLOW"
    return ALLOW


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(NUMBERS)), st.lists(st.integers(0, (1 << 32) - 1), min_size=6, max_size=6))
def test_docker_profile_says_what_the_program_says(name, args):
    """Both come from the table: for any call of a listed name (32-bit arguments, as the
    kernel reads them), the container's JSON and the agent's BPF agree."""
    nr = NUMBERS[name][0]
    assert json_verdict(docker_profile((6, 1)), name, args) == run_filter(bpf_program((6, 1)), nr, AUDIT_X86_64, args)


def test_docker_profile_is_never_unconfined():
    opt = seccomp.docker_security_opt()
    assert opt.startswith("seccomp=")
    profile = json.loads(opt.removeprefix("seccomp="))
    assert profile == docker_profile()
    denied = {n for e in profile["syscalls"] if "args" not in e for n in e["names"]}
    assert {"unshare", "setns", "mount", "bpf", "keyctl", "userfaultfd", "io_uring_setup"} <= denied


# --------------------------------------------------------------------------- a real kernel

# Raw x86_64 numbers, written out here (from asm/unistd_64.h) rather than read from the
# module, so a wrong number in its table cannot hide here. Arguments are harmless: each
# fails on its own (bad pointer, fd -1, invalid flag) or only touches the probing process.
PROBES = {  # name: (number, args, the filter's errno)
    "clone": (56, (0x10000000 | 0x200,), 1),  # NEWUSER|FS: EINVAL from the kernel
    "clone3": (435, (0, 0), 38), "unshare": (272, (1,), 1), "setns": (308, (-1, 0), 1),
    "mount": (165, (0, 0, 0, 0, 0), 1), "umount2": (166, (0, 0), 1), "pivot_root": (155, (0, 0), 1),
    "fsopen": (430, (0, 0), 1), "fsconfig": (431, (-1, 0, 0, 0, 0), 1), "fsmount": (432, (-1, 0, 0), 1),
    "fspick": (433, (-1, 0, 0), 1), "move_mount": (429, (-1, 0, -1, 0, 0), 1),
    "open_tree": (428, (-1, 0, 0), 1), "mount_setattr": (442, (-1, 0, 0, 0, 0), 1),
    "bpf": (321, (-1, 0, 0), 1), "perf_event_open": (298, (0, 0, -1, -1, 0), 1),
    "add_key": (248, (0, 0, 0, 0, 0), 1), "request_key": (249, (0, 0, 0, 0), 1), "keyctl": (250, (-1,), 1),
    "kexec_load": (246, (0, 0, 0, 0xFFFFFFFF), 1), "kexec_file_load": (320, (-1, -1, 0, 0, 0xFFFFFFFF), 1),
    "reboot": (169, (0, 0, 0, 0), 1), "init_module": (175, (0, 0, 0), 1), "finit_module": (313, (-1, 0, 0), 1),
    "delete_module": (176, (0, 0), 1), "open_by_handle_at": (304, (-1, 0, 0), 1),
    "name_to_handle_at": (303, (-1, 0, 0, 0, 0), 1), "userfaultfd": (323, (0xFFFFFFFF,), 1),
    "io_uring_setup": (425, (0, 0), 1), "io_uring_enter": (426, (-1, 0, 0, 0, 0, 0), 1),
    "io_uring_register": (427, (-1, 0, 0, 0), 1), "kcmp": (312, (0, 0, -1, 0, 0), 1),
    "pidfd_getfd": (438, (-1, -1, 0), 1), "process_madvise": (440, (-1, 0, 0, 0, 0), 1),
    "personality": (135, (0x0040000,), 1), "swapon": (167, (0, 0), 1), "swapoff": (168, (0,), 1),
    "acct": (163, (1,), 1), "quotactl": (179, (0, 0, 0, 0), 1), "quotactl_fd": (443, (-1, 0, 0, 0), 1),
    "syslog": (103, (-1, 0, 0), 1), "vhangup": (153, (), 1), "lookup_dcookie": (212, (0, 0, 0), 1),
    "settimeofday": (164, (1, 0), 1), "clock_settime": (227, (100, 0), 1), "clock_adjtime": (305, (100, 0), 1),
    "adjtimex": (159, (0,), 1), "iopl": (172, (4,), 1), "ioperm": (173, (0xFFFFFFFF, 1, 1), 1),
    "sethostname": (170, (0, 100000), 1), "setdomainname": (171, (0, 100000), 1),
    "fanotify_init": (300, (0xFFFFFFFF, 0), 1), "get_mempolicy": (239, (0, 0, 0, 0, 0), 1),
    "set_mempolicy": (238, (-1, 0, 0), 1), "mbind": (237, (0, 0, -1, 0, 0, 0), 1),
    "migrate_pages": (256, (0x7FFFFFFF, 0, 0, 0), 1), "move_pages": (279, (0, 0, 0, 0, 0, -1), 1),
    "socket": (41, (40, 1, 0), 1), "ioctl": (16, (-1, 0x5412, 0), 1),
    "sysfs": (139, (1, 0), 1), "ustat": (136, (0, 0), 1),
}
# Where the host itself may refuse even root (sysctls such as kernel.io_uring_disabled,
# kernel.modules_disabled): the filter's EPERM cannot be told from the kernel's there.
HOST_MAY_REFUSE = {"kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
                   "io_uring_setup", "bpf", "perf_event_open", "userfaultfd", "syslog"}

PROBE = textwrap.dedent("""
    import ctypes, json, sys
    from rockroll.sandbox.guest.syscalls import install_seccomp
    from rockroll.sandbox.deployment.seccomp import bpf_program
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if sys.argv[1] == "filtered":
        install_seccomp(bpf_program())
    out = {}
    for name, (nr, args, _) in json.loads(sys.argv[2]).items():
        ctypes.set_errno(0)
        ret = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
        out[name] = ctypes.get_errno() if ret < 0 else 0
        if name == "socket" and ret >= 0:
            libc.close(ret)
    print(json.dumps(out))
""")


def probe(mode: str, probes=PROBES) -> dict:
    # a session of its own: no controlling terminal for vhangup to hang up
    out = subprocess.run([sys.executable, "-c", PROBE, mode, json.dumps(probes)], capture_output=True,
                         text=True, timeout=60, start_new_session=True)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="raw x86_64 numbers")
def test_every_denied_call_gets_eperm_from_the_kernel():
    filtered, unfiltered = probe("filtered"), probe("unfiltered")
    assert filtered == {name: errno for name, (_, _, errno) in PROBES.items()}
    if os.geteuid() == 0:  # with every capability, the kernel itself answers something else
        same = {name for name in PROBES if unfiltered[name] == filtered[name]}
        assert same <= HOST_MAY_REFUSE, {n: unfiltered[n] for n in same}


I386_GETPID = bytes.fromhex("b814000000" "cd80" "c3")  # mov eax, 20; int 0x80; ret
FOREIGN_ABI = textwrap.dedent("""
    import ctypes, mmap, sys
    from rockroll.sandbox.guest.syscalls import install_seccomp
    from rockroll.sandbox.deployment.seccomp import bpf_program
    libc = ctypes.CDLL(None, use_errno=True)
    if sys.argv[2] == "filtered":
        install_seccomp(bpf_program())
    if sys.argv[1] == "x32":
        libc.syscall(ctypes.c_long(0x40000000 | 39))  # getpid through the x32 ABI
    else:
        page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        page.write(bytes.fromhex(sys.argv[3]))
        ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))()
    print("survived")
""")


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="x86_64 machine code")
@pytest.mark.parametrize("abi", ["x32", "i386"])
def test_other_abis_are_killed(abi):
    def run(mode):
        return subprocess.run([sys.executable, "-c", FOREIGN_ABI, abi, mode, I386_GETPID.hex()],
                              capture_output=True, text=True, timeout=60)
    out = run("filtered")
    assert out.returncode == -signal.SIGSYS and "survived" not in out.stdout, out
    control = run("unfiltered")  # the call itself is harmless: the kill is the filter's
    assert control.returncode in (0, -signal.SIGSEGV), control  # SEGV: a kernel without ia32 emulation


WORK = textwrap.dedent("""
    import multiprocessing, subprocess, sys, threading
    from rockroll.sandbox.guest.syscalls import install_seccomp
    from rockroll.sandbox.deployment.seccomp import bpf_program
    install_seccomp(bpf_program())
    box = []
    threads = [threading.Thread(target=box.append, args=(i,)) for i in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    with multiprocessing.get_context("fork").Pool(2) as pool:
        squares = pool.map(abs, [-1, -2, -3])
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        spawned = pool.map(abs, [-4])
    echo = subprocess.run(["sh", "-c", "echo $((6 * 7)) | cat"], capture_output=True, text=True).stdout
    print(len(box), squares, spawned, echo.strip(), open("/proc/self/status").read().count("Seccomp:\\t2"))
""")


def test_ordinary_work_runs_under_the_filter():
    """Threads (clone3 -> ENOSYS -> clone), fork and spawn pools, subprocesses."""
    out = subprocess.run([sys.executable, "-c", WORK], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "8 [1, 2, 3] [4] 42 1"
