"""Terminals: processes on a pseudo-terminal, forked by pid 1 like every session shell, so
they run in the sandbox's namespaces and cgroup, under its capability set and syscall
filter (installed on pid 1 before it serves, inherited by every child).

Requests (``protocol/frames.py`` names the limits): ``pty_open`` {pty, argv or command,
rows, cols, env, cwd, idle_timeout} answers {pty, pid} (the host numbers its terminals: its
reader knows where output goes before the first byte comes); ``pty_write`` (the payload is the keys),
``pty_resize`` {rows, cols}, ``pty_signal`` {signal} (to the terminal's foreground
process group, as a terminal driver sends Ctrl-C's SIGINT), ``pty_close``. The guest
sends, unasked, ``pty_out`` {pty} frames (the payload is output) and one ``pty_exit``
{pty, exit_code} at the end.

Flow control: at most ``PTY_WINDOW`` bytes of output are sent and not yet acknowledged
(``pty_ack`` {pty, n}, sent by the host as its reader consumes them); past it the guest
stops reading the terminal, the kernel's pty buffer fills and the writer blocks, as on a
real terminal whose reader is slow. So a ``yes`` flood costs the host at most the window.
A terminal nobody touches (no write, ack, resize or signal) for ``idle_timeout`` seconds is
closed; a sandbox holds at most ``MAX_TERMINALS``.
"""

from __future__ import annotations

import fcntl
import os
import selectors
import signal
import struct
import termios
import time

from ..protocol.frames import MAX_TERMINALS, PTY_INPUT_MAX, PTY_WINDOW
from .syscalls import kill_session


_RESETTABLE = tuple(s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP) and s < 32)


def _winsize(rows: int, cols: int) -> bytes:
    return struct.pack("HHHH", rows, cols, 0, 0)


def _exit_code(status: int) -> int:
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


class TerminalError(Exception):
    """A terminal request the guest refuses (the host raises ``TerminalError``)."""


class Terminal:
    """One process on a pseudo-terminal: its master fd, the output not yet acknowledged,
    the keys not yet written (the program is not reading)."""

    def __init__(self, guest, tid: int, req: dict):
        self.guest, self.id = guest, tid
        rows, cols = int(req.get("rows") or 24), int(req.get("cols") or 80)
        command = req.get("command")  # a string: the sandbox's shell runs it
        argv = list(req.get("argv") or ([guest.shell, "-c", command] if command else [guest.shell]))
        env = {**guest.env, "TERM": "xterm-256color", **(req.get("env") or {})}
        cwd = req.get("cwd") or guest.workdir
        master, slave = os.openpty()
        fcntl.ioctl(master, termios.TIOCSWINSZ, _winsize(rows, cols))
        pid = os.fork()
        if pid == 0:
            try:
                # A terminal's programs start with every signal at its default and none
                # blocked, as a login's do: an ignored or blocked signal survives exec, and the
                # guest's ancestors may have had some (Python ignores SIGPIPE and SIGXFSZ; a
                # shell's background job ignores SIGINT; a Ray worker blocks it).
                for sig in _RESETTABLE:
                    signal.signal(sig, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_SETMASK, ())
                os.setsid()
                fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
                for fd in (0, 1, 2):
                    os.dup2(slave, fd)
                os.closerange(3, 65536)
                try:
                    with open("/proc/self/oom_score_adj", "w") as f:
                        f.write("0")  # pid 1's -1000 is inherited: the OOM killer should pick these
                except OSError:
                    pass
                os.chdir(cwd)
                os.execvpe(argv[0], argv, env)
            except OSError as e:
                os.write(2, f"cannot start {argv[0]}: {e.strerror}\r\n".encode())
            finally:
                os._exit(127)
        os.close(slave)
        os.set_blocking(master, False)
        self.master, self.pid = master, pid
        self.unacked = 0
        self.inbuf = bytearray()
        self.events = 0
        self.exit_status: int | None = None
        self.eof = False
        self.idle_timeout = float(req.get("idle_timeout") or 0) or None
        self.touched = time.monotonic()
        self._watch()

    # --- the selector: read while the window has room, write while keys wait
    def _watch(self) -> None:
        events = (selectors.EVENT_READ if not self.eof and self.unacked < PTY_WINDOW else 0) | \
                 (selectors.EVENT_WRITE if self.inbuf else 0)
        if events == self.events:
            return
        sel = self.guest.sel
        if not events:
            sel.unregister(self.master)
        elif not self.events:
            sel.register(self.master, events, (self.on_ready, None))
        else:
            sel.modify(self.master, events, (self.on_ready, None))
        self.events = events

    def on_ready(self, _arg) -> None:
        if self.inbuf:
            self._write_pending()
        if not self.eof and self.unacked < PTY_WINDOW:
            self._read(min(1 << 16, PTY_WINDOW - self.unacked))
        if self.master >= 0:
            self._watch()

    def _read(self, size: int) -> bool:
        """Read and send up to ``size`` bytes; False when nothing was there (or at EOF)."""
        try:
            data = os.read(self.master, size)
        except BlockingIOError:
            return False
        except OSError:  # EIO: every process holding the terminal closed it
            data = b""
        if not data:
            self.eof = True
            self._maybe_done()
            return False
        self.unacked += len(data)
        self.guest.reply({"op": "pty_out", "pty": self.id}, data)
        return True

    def _write_pending(self) -> None:
        try:
            n = os.write(self.master, self.inbuf)
        except BlockingIOError:
            return
        except OSError:
            self.inbuf.clear()
            return
        del self.inbuf[:n]

    # --- requests
    def write(self, data: bytes) -> None:
        self.touch()
        if len(self.inbuf) + len(data) > PTY_INPUT_MAX:
            raise TerminalError(f"terminal {self.id}: {len(self.inbuf)} bytes of input are waiting "
                                "for the program to read them")
        self.inbuf += data
        self._write_pending()
        self._watch()

    def ack(self, n: int) -> None:
        self.touch()
        self.unacked = max(0, self.unacked - n)
        self._watch()

    def resize(self, rows: int, cols: int) -> None:
        self.touch()
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, _winsize(rows, cols))  # the kernel sends SIGWINCH

    def signal(self, sig: int) -> None:
        self.touch()
        try:
            group = os.tcgetpgrp(self.master)
        except OSError:
            group = self.pid
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            pass

    def touch(self) -> None:
        self.touched = time.monotonic()

    def deadline(self) -> float | None:
        return self.touched + self.idle_timeout if self.idle_timeout else None

    # --- the end
    def on_exit(self, status: int) -> None:
        """The terminal's first process exited: take what it printed last, end the rest of
        its session (background jobs holding the terminal) and report."""
        self.exit_status = status
        for _ in range(4):  # past the window by at most what the kernel's pty buffer held
            if self.eof or not self._read(1 << 16):
                break
        kill_session(self.pid)
        if self.master >= 0:
            self.eof = True
            self._maybe_done()

    def _maybe_done(self) -> None:
        if self.exit_status is None:
            self._watch()  # EOF first: the exit follows (reaped by pid 1)
            return
        self._release()
        self.guest.reply({"op": "pty_exit", "pty": self.id, "exit_code": _exit_code(self.exit_status)})

    def close(self) -> None:
        kill_session(self.pid)
        self._release()

    def _release(self) -> None:
        if self.events:
            self.guest.sel.unregister(self.master)
            self.events = 0
        if self.master >= 0:
            os.close(self.master)
            self.master = -1
        self.guest.terminals.items.pop(self.id, None)
        self.guest.terminals.by_pid.pop(self.pid, None)


class Terminals:
    """The sandbox's terminals and their requests (``ops``, looked up by ``serve.Guest``)."""

    def __init__(self, guest):
        self.guest = guest
        self.items: dict[int, Terminal] = {}
        self.by_pid: dict[int, Terminal] = {}
        self.ops = {"pty_open": self.op_open, "pty_write": self.op_write, "pty_resize": self.op_resize,
                    "pty_signal": self.op_signal, "pty_close": self.op_close}

    def get(self, req: dict) -> Terminal:
        t = self.items.get(req.get("pty"))
        if t is None:
            raise TerminalError(f"no terminal {req.get('pty')!r} (closed or exited)")
        return t

    def op_open(self, req, payload):
        if len(self.items) >= MAX_TERMINALS:
            raise TerminalError(f"this sandbox has {MAX_TERMINALS} terminals open, the most it may")
        tid = req.get("pty")
        if not isinstance(tid, int) or tid in self.items:
            raise TerminalError(f"terminal id {tid!r} is not a new integer")
        try:
            t = Terminal(self.guest, tid, req)
        except OSError as e:  # no pty device, no pids left in the cgroup
            raise TerminalError(f"cannot open a terminal: {e}") from None
        self.items[t.id] = t
        self.by_pid[t.pid] = t
        return {"pty": t.id, "pid": t.pid}

    def op_write(self, req, payload):
        self.get(req).write(payload)
        return {}

    def op_resize(self, req, payload):
        self.get(req).resize(int(req["rows"]), int(req["cols"]))
        return {}

    def op_signal(self, req, payload):
        self.get(req).signal(int(req["signal"]))
        return {}

    def op_close(self, req, payload):
        t = self.items.get(req.get("pty"))
        if t is not None:
            t.close()
        return {}

    def on_ack(self, req: dict) -> None:
        t = self.items.get(req.get("pty"))
        if t is not None:
            t.ack(int(req.get("n") or 0))

    def on_reaped(self, pid: int, status: int) -> None:
        t = self.by_pid.pop(pid, None)
        if t is not None:
            t.on_exit(status)

    def check_deadlines(self, now: float) -> float | None:
        """Close the idle ones; the next deadline, if any."""
        nearest = None
        for t in list(self.items.values()):
            d = t.deadline()
            if d is None:
                continue
            if now >= d:
                t.close()
                self.guest.reply({"op": "pty_exit", "pty": t.id, "exit_code": None, "idle": True})
            else:
                nearest = d if nearest is None else min(nearest, d)
        return nearest
