"""Where the host forbids namespaces (a locked-down container), the local backend
refuses clearly and names the docker backend. It never runs without isolation.

The lock-down is real: a seccomp filter, like Docker's default profile, makes
unshare(2) fail with EPERM for the test process and everything it starts.
"""

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import ctypes, struct
    libc = ctypes.CDLL(None, use_errno=True)
    # BPF: load the syscall number; unshare (272 on x86_64) -> ERRNO(EPERM); else allow.
    prog = [(0x20, 0, 0, 0), (0x15, 0, 1, 272), (0x06, 0, 0, 0x00050000 | 1), (0x06, 0, 0, 0x7FFF0000)]
    code = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *ins) for ins in prog))
    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    fprog = Prog(len(prog), ctypes.addressof(code))
    assert libc.prctl(38, 1, 0, 0, 0) == 0                      # PR_SET_NO_NEW_PRIVS
    assert libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) == 0    # PR_SET_SECCOMP, filter
    from rockroll.sandbox import IsolationUnavailable, open_sandbox
    try:
        sb = open_sandbox()
    except IsolationUnavailable as e:
        print("REFUSED:", e)
    else:
        print("RAN WITHOUT ISOLATION:", sb.run("cat /proc/self/status | grep NSpid").stdout)
""")


def test_forbidden_namespaces_give_a_clear_error_naming_docker():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         env=os.environ, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("REFUSED:"), out.stdout
    assert "backend='docker'" in out.stdout and "namespaces" in out.stdout
