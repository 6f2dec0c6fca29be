"""The guest's request loop: frames in on stdin, replies out on stdout, each echoing its
request's ``id``, so many requests (commands in different sessions) are in flight at once.
Commands go to their session (``sessions.py``), file operations to ``files.py``, the model
channel's frames to ``model.py``; a bad request gets an error reply, never kills the guest."""

from __future__ import annotations

import os
import selectors
import shlex
import signal
import time

from ..protocol.frames import PROTOCOL_VERSION, FrameReader, GuestConfig, encode_frame
from . import files
from .model import ModelChannel
from .rootfs import STATE_DIR
from .sessions import SESSION_SCRIPTS, Session
from .syscalls import reap_children
from .terminals import Terminals


class Guest:
    """pid 1 of a sandbox once its root is built: its sessions, its model channel, the
    protocol's replies (buffered: stdout is non-blocking)."""

    def __init__(self, cfg: GuestConfig):
        self.cfg = cfg
        self.workdir = cfg.workdir
        bash = os.path.exists("/bin/bash")
        self.shell = "/bin/bash" if bash else "/bin/sh"
        self.shell_args = ["--noprofile", "--norc"] if bash else []
        self.env = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root", "USER": "root", "LANG": "C.UTF-8", "TERM": "dumb",
            "HOSTNAME": cfg.hostname,
        }
        self.env.update(cfg.env)
        model_env = cfg.model.env if cfg.model else {}
        self.env.update(model_env)
        # The model variables are this sandbox's own: they win over a restored session's
        # exports (a snapshot of another sandbox carries that sandbox's key).
        self.forced_exports = "".join(f"export {k}={shlex.quote(v)}\n"
                                      for k, v in model_env.items())
        self.shell_name = "bash" if bash else "sh"
        with open(f"{STATE_DIR}/{self.shell_name}", "w") as f:
            f.write(SESSION_SCRIPTS[self.shell_name])
        self.sel = selectors.DefaultSelector()
        self.sessions: dict[str, Session] = {}
        self.session_states: dict[str, str] = dict(cfg.sessions)
        self.counter = 0
        self.reader = FrameReader()
        self.out_buf = bytearray()
        self.writing = False
        self.running = True
        self.model = ModelChannel(self, cfg.model.port) if cfg.model else None
        self.terminals = Terminals(self)

    def reply(self, header: dict, payload: bytes = b"") -> None:
        self.out_buf += encode_frame(header, payload)
        self.flush()

    def flush(self) -> None:
        while self.out_buf:
            try:
                n = os.write(1, self.out_buf)
            except BlockingIOError:
                break
            del self.out_buf[:n]
        # Watch stdout for room only while a reply is waiting to go out.
        if self.out_buf and not self.writing:
            self.sel.register(1, selectors.EVENT_WRITE, (self.on_stdout, None))
            self.writing = True
        elif not self.out_buf and self.writing:
            self.sel.unregister(1)
            self.writing = False

    def on_stdout(self, _arg) -> None:
        self.flush()

    def session(self, name: str) -> Session:
        s = self.sessions.get(name)
        if s is None or s.dead:
            self.counter += 1
            state = self.session_states.pop(name, None)
            if state and self.forced_exports:
                state += "\n" + self.forced_exports
            s = Session(self, name, self.counter, state)
            self.sessions[name] = s
        return s

    def on_stdin(self, _arg) -> None:
        try:
            data = os.read(0, 1 << 20)
        except BlockingIOError:
            return
        if not data:  # the host is gone: take the whole sandbox down with us
            self.running = False
            return
        self.reader.feed(data)
        for header, payload in self.reader.frames():
            self.handle(header, payload)

    def handle(self, req: dict, payload: bytes) -> None:
        op = req.get("op")
        if op in ("mc_data", "mc_close"):
            if self.model is not None:
                self.model.on_host(req, payload)
            return
        if op == "pty_ack":  # flow control: no reply
            self.terminals.on_ack(req)
            return
        try:
            if op in ("run", "dump"):
                self.session(req.get("session") or "default").submit(req)
                return
            handler = files.OPS.get(op) or self.terminals.ops.get(op) or getattr(self, "op_" + str(op), None)
            if handler is None:
                raise ValueError(f"unknown op {op!r}")
            result = handler(req, payload)
            header, body = result if isinstance(result, tuple) else (result, b"")
            self.reply({"id": req.get("id"), "ok": True, **header}, body)
        except OSError as e:
            self.reply({"id": req.get("id"), "ok": False, "error": "SandboxFileError",
                        "errno": e.errno, "message": f"{e.strerror or e}: {req.get('path', '')}"})
        except Exception as e:  # noqa: BLE001 - report, never die on a bad request
            self.reply({"id": req.get("id"), "ok": False, "error": type(e).__name__, "message": str(e)})

    # --- simple operations
    def op_ping(self, req, payload):
        return {"pid": os.getpid(), "version": PROTOCOL_VERSION, "sessions": sorted(self.sessions)}

    def op_cancel(self, req, payload):
        # The host's caller stopped waiting for a run (an SSE client disconnected, a task was
        # cancelled): its process group dies now instead of running on unwatched.
        return {"cancelled": any(s.cancel(req["target"]) for s in list(self.sessions.values()))}

    def op_close_session(self, req, payload):
        s = self.sessions.get(req["session"])
        if s:
            s.close()
        return {}

    def op_shutdown(self, req, payload):
        self.running = False
        return {}

    # --- main loop
    def serve(self) -> None:
        os.set_blocking(0, False)
        os.set_blocking(1, False)
        self.sel.register(0, selectors.EVENT_READ, (self.on_stdin, None))
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        while self.running:
            now = time.monotonic()
            deadlines = [d for s in list(self.sessions.values()) if (d := s.check_deadline(now))]
            if (d := self.terminals.check_deadlines(now)) is not None:
                deadlines.append(d)
            timeout = max(0.0, min(deadlines) - now) if deadlines else 1.0
            for key, _ in self.sel.select(min(timeout, 1.0)):
                callback, arg = key.data
                callback(arg)
            self.reap()

    def reap(self) -> None:
        # pid 1 inherits every orphan in the sandbox: none may stay a zombie
        for pid, status in reap_children():
            self.terminals.on_reaped(pid, status)
