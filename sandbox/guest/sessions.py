"""Sessions: each a persistent shell reading one-word operations from a pipe.

A command runs in a forked subshell with job control on (``set -m``), so it is
its own process group: a timeout kills that group and the session survives. On exit the
subshell writes its exported variables and cwd to a state file that the session shell
sources, which is how ``cd`` and ``export`` persist between calls.

The shell scripts are data files beside this module (``session.bash``, ``session.sh`` for
images without bash), read once at import: before the root changes."""

from __future__ import annotations

import os
import selectors
import shlex
import signal
import time

from .rootfs import STATE_DIR
from .syscalls import kill_tree


# A session runs its script as ``bash bash <dir> <workdir>`` from inside STATE_DIR, and a
# command is read and eval'ed by __rr_run (defined on line 1), never sourced from its file:
# a shell names the script or sourced file a failing command is in, with a line number
# counted from the eval's line, and "/dev/.rr/s1/cmd: line 1: x: command not found" showed
# our path. This way it reads as `bash -c` would say it ("bash: line 3: x: command not
# found"). __rr_run exits the command's subshell itself, so the EXIT trap saves the state
# while the function's scope (a `declare -x` in the command) still holds (session.bash).
#
# The same protocol for images without bash (dash, busybox ash): no $BASHPID (the pid
# comes from /proc/self/stat, read by the subshell itself), no %q (export -p quotes the
# cwd for us), no compgen/mapfile (exported names are parsed from export -p). Without a
# tty these shells turn job control off, so a command is not its own process group: a
# timeout kills its process tree instead (see Session.kill_current).
def _script(name: str) -> str:
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), name)) as f:
        return f.read()


SESSION_SCRIPTS = {"bash": _script("session.bash"), "sh": _script("session.sh")}


class Command:
    """A command in flight in a session."""

    def __init__(self, req_id, max_output: int, timeout: float | None):
        self.req_id = req_id
        self.max_output = max_output
        self.start = time.monotonic()
        self.deadline = self.start + timeout if timeout else None
        self.out, self.err = bytearray(), bytearray()
        self.truncated = False
        self.pgid = None
        self.timed_out = False
        self.cancelled = False  # the host gave up on it (a client went away): kill, as a timeout

    def append(self, buf: bytearray, data: bytes) -> None:
        room = self.max_output - len(buf)
        if len(data) > room:
            self.truncated = True
            data = data[:max(room, 0)]
        buf += data


class Session:
    """One persistent shell and the commands queued for it. ``guest``: the ``serve.Guest``
    that owns it (its shell, environment, selector and replies; untyped here: serve imports
    this)."""

    def __init__(self, guest, name: str, index: int, init_state: str | None):
        self.guest, self.name = guest, name
        self.dir = f"{STATE_DIR}/s{index}"
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        if init_state:
            with open(f"{self.dir}/init", "w") as f:
                f.write(init_state)
        ctl_r, ctl_w = os.pipe()
        st_r, st_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: wire the fds bash expects and exec
            try:
                # Python ignores SIGPIPE and SIGXFSZ; an ignored signal survives exec, so
                # `yes | head` would print "Broken pipe" instead of dying quietly.
                for sig in (signal.SIGPIPE, signal.SIGXFSZ):
                    signal.signal(sig, signal.SIG_DFL)
                os.setsid()
                null = os.open("/dev/null", os.O_RDWR)
                # Park the sources above the targets first, so no dup2 clobbers one.
                wanted = [(os.dup2(src, 100 + i), dst) for i, (src, dst) in
                          enumerate(((ctl_r, 0), (null, 1), (null, 2), (st_w, 3), (out_w, 5), (err_w, 6)))]
                for src, dst in wanted:
                    os.dup2(src, dst)
                os.close(4)  # may be open or not: closerange below does the rest
            except OSError:
                pass
            try:
                os.closerange(7, 65536)
                os.chdir(STATE_DIR)  # the script's relative name is what a failed command shows
                os.execve(guest.shell, [guest.shell, *guest.shell_args, guest.shell_name, self.dir,
                                        guest.workdir], guest.env)
            finally:
                os._exit(127)
        for fd in (ctl_r, st_w, out_w, err_w):
            os.close(fd)
        self.pid = pid
        self.ctl, self.status, self.outfd, self.errfd = ctl_w, st_r, out_r, err_r
        for fd in (st_r, out_r, err_r):
            os.set_blocking(fd, False)
        self.status_buf = b""
        self.queue: list[tuple[dict, bytes]] = []
        self.current: Command | None = None
        self.waiting_dump = []
        self.dead = False
        sel = guest.sel
        sel.register(st_r, selectors.EVENT_READ, (self.on_status, None))
        sel.register(out_r, selectors.EVENT_READ, (self.on_output, "out"))
        sel.register(err_r, selectors.EVENT_READ, (self.on_output, "err"))

    # --- requests
    def submit(self, req: dict) -> None:
        self.queue.append(req)
        self.pump()

    def pump(self) -> None:
        if self.current is not None or self.dead:
            return
        while self.queue:
            req = self.queue.pop(0)
            if req["op"] == "dump":
                self.waiting_dump.append(req["id"])
                self._send(b"dump\n")
                self.current = Command(req["id"], 0, None)
                self.current.is_dump = True
                self.current.stream = False
                return
            # os.write, not a file object (its buffer and codec cost ~20 us a command)
            fd = os.open(f"{self.dir}/cmd", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                view = memoryview(req["cmd"].encode() + b"\n")
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
            pre = []
            if req.get("cwd"):
                pre.append("cd -- " + shlex.quote(req["cwd"]))
            for k, v in (req.get("env") or {}).items():
                pre.append(f"export {k}={shlex.quote(str(v))}")
            if pre:
                with open(f"{self.dir}/pre", "w") as f:
                    f.write(" &&\n".join(pre) + "\n")
            self.current = Command(req["id"], int(req.get("max_output", 1 << 20)), req.get("timeout"))
            self.current.is_dump = False
            self.current.stream = bool(req.get("stream"))
            self._send(b"runx\n" if pre else b"run\n")
            return

    def _send(self, data: bytes) -> None:
        try:
            os.write(self.ctl, data)
        except OSError:
            self.on_dead()

    # --- events
    def on_output(self, kind: str) -> None:
        fd = self.outfd if kind == "out" else self.errfd
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        if not data:
            self.guest.sel.unregister(fd)
            return
        cmd = self.current
        if cmd is not None and not cmd.is_dump:
            cmd.append(cmd.out if kind == "out" else cmd.err, data)
            if cmd.stream:  # live output for a watcher; the final reply still has it all
                self.guest.reply({"id": cmd.req_id, "chunk": kind}, data)

    def drain(self) -> None:
        for kind, fd in (("out", self.outfd), ("err", self.errfd)):
            while True:
                try:
                    data = os.read(fd, 1 << 16)
                except (BlockingIOError, OSError):
                    break
                if not data:
                    break
                self.current.append(self.current.out if kind == "out" else self.current.err, data)
                if self.current.stream:
                    self.guest.reply({"id": self.current.req_id, "chunk": kind}, data)

    def on_status(self, _arg) -> None:
        try:
            data = os.read(self.status, 4096)
        except BlockingIOError:
            return
        if not data:
            self.on_dead()
            return
        self.status_buf += data
        while b"\n" in self.status_buf:
            line, self.status_buf = self.status_buf.split(b"\n", 1)
            self.on_line(line.decode(errors="replace"))

    def on_line(self, line: str) -> None:
        cmd = self.current
        if cmd is None:
            return
        word, _, arg = line.partition(" ")
        if word == "pid":
            cmd.pgid = int(arg)
            if cmd.timed_out or cmd.cancelled:  # asked before its group existed
                self.kill_current()
        elif word == "done" and not cmd.is_dump:
            self.drain()
            self.current = None
            self.guest.reply({"id": cmd.req_id, "ok": True, "exit_code": int(arg),
                              "timed_out": cmd.timed_out, "truncated": cmd.truncated,
                              "duration_s": time.monotonic() - cmd.start,
                              "nout": len(cmd.out)}, bytes(cmd.out) + bytes(cmd.err))
            self.pump()
        elif word == "dumped" and cmd.is_dump:
            self.current = None
            try:
                state = open(f"{self.dir}/dump").read()
            except OSError:
                state = ""
            self.guest.reply({"id": cmd.req_id, "ok": True, "state": state})
            self.pump()

    def check_deadline(self, now: float) -> float | None:
        cmd = self.current
        if cmd is None or cmd.deadline is None or cmd.timed_out:
            return None
        if now >= cmd.deadline:
            cmd.timed_out = True
            self.kill_current()
            return None
        return cmd.deadline

    def cancel(self, req_id) -> bool:
        """Kill request ``req_id``'s command if it runs here, or drop it if still queued."""
        cmd = self.current
        if cmd is not None and cmd.req_id == req_id and not cmd.is_dump:
            cmd.cancelled = True
            self.kill_current()
            return True
        for req in self.queue:
            if req.get("id") == req_id and req["op"] == "run":
                self.queue.remove(req)
                self.guest.reply({"id": req_id, "ok": False, "error": "SessionError", "message": "cancelled"})
                return True
        return False

    def kill_current(self) -> None:
        cmd = self.current
        if cmd is not None and cmd.pgid:
            try:
                os.killpg(cmd.pgid, signal.SIGKILL)
            except ProcessLookupError:  # sh without job control: the command leads no group
                kill_tree(cmd.pgid)

    def on_dead(self) -> None:
        if self.dead:
            return
        self.dead = True
        for fd in (self.status, self.outfd, self.errfd):
            try:
                self.guest.sel.unregister(fd)
            except (KeyError, ValueError):
                pass
            os.close(fd)
        os.close(self.ctl)
        pending = ([self.current.req_id] if self.current else []) + [r["id"] for r in self.queue]
        for req_id in pending:
            self.guest.reply({"id": req_id, "ok": False, "error": "SessionError",
                              "message": f"session {self.name!r} died"})
        self.current, self.queue = None, []
        self.guest.sessions.pop(self.name, None)

    def close(self) -> None:
        self.kill_current()  # the running command leads a process group of its own
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.on_dead()
