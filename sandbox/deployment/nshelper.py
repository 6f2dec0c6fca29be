"""The unprivileged network's helper (``usernet.py``): a process of the sandbox's owner that
joins the sandbox's user and network namespaces (their owner has every capability in
them) and serves its owner over a socket pair, one request per message:

- ``{"op": "run", "script": ...}``: run ``sh -ec script`` there (ip, iptables, tc), answer
  ``{"ok", "stdout", "stderr"}``;
- ``{"op": "socket", "family": F, "type": T}``: a new socket *of that namespace*, its fd
  sent back (SCM_RIGHTS). A socket's namespace is fixed when it is made: the owner binds,
  listens and connects with it from its own process, in the sandbox's namespace.

It dies with the thread that started it (PR_SET_PDEATHSIG) and exits on EOF. A script,
run as ``python -S -E nshelper.py PID PARENT FD`` (FD: its end of the socket pair): no
package imports, no environment."""

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys

ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}


def main() -> None:
    pid, parent = int(sys.argv[1]), int(sys.argv[2])
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)
    chan = socket.socket(fileno=int(sys.argv[3]))
    try:
        fds = [os.open(f"/proc/{pid}/ns/{name}", os.O_RDONLY | os.O_CLOEXEC) for name in ("user", "net")]
        for name, fd in zip(("user", "net"), fds):
            if libc.setns(fd, 0) != 0:
                raise OSError(ctypes.get_errno(), f"setns {name}: {os.strerror(ctypes.get_errno())}")
            os.close(fd)
        os.chdir("/")
    except OSError as e:
        chan.send(json.dumps({"ok": False, "error": str(e)}).encode())
        return
    chan.send(b'{"ok": true}')
    while msg := chan.recv(1 << 16):
        req = json.loads(msg)
        if req["op"] == "socket":
            try:
                s = socket.socket(req["family"], req["type"])
            except OSError as e:
                chan.send(json.dumps({"ok": False, "error": str(e)}).encode())
                continue
            socket.send_fds(chan, [b'{"ok": true}'], [s.fileno()])
            s.close()
        else:
            try:
                p = subprocess.run(["sh", "-ec", req["script"]], capture_output=True, text=True, env=ENV,
                                   timeout=30)
                out = {"ok": p.returncode == 0, "stdout": p.stdout, "stderr": p.stderr}
            except (OSError, subprocess.TimeoutExpired) as e:
                out = {"ok": False, "stdout": "", "stderr": str(e)}
            chan.send(json.dumps(out).encode())


if __name__ == "__main__":
    main()
