"""The model channel (``GuestConfig.model``, see ``runtime/model_channel.py`` for the design): the
guest listens on ``127.0.0.1:<port>`` in the sandbox's own network namespace and carries
every accepted connection's bytes as ``mc_open`` / ``mc_data`` / ``mc_close`` frames (key
``conn``) over this same stdin/stdout; the host pipes them to the model service. No
network device is added: the sandbox reaches nothing else."""

from __future__ import annotations

import selectors
import socket

MODEL_MAX_CONNS = 256


class ModelChannel:
    """The in-sandbox end of the model endpoint: a loopback listener whose connections
    travel as frames to the host (no network namespace is opened for them). ``guest``: the
    ``serve.Guest`` whose selector and replies it uses (untyped here: serve imports this)."""

    def __init__(self, guest, port: int):
        self.guest = guest
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", port))
        self.listener.listen(128)
        self.listener.setblocking(False)
        self.conns: dict[int, socket.socket] = {}
        self.pending: dict[int, bytearray] = {}   # bytes for a connection that could not take them yet
        self.closing: set[int] = set()            # the host closed: close once pending is written
        self.counter = 0
        guest.sel.register(self.listener, selectors.EVENT_READ, (self.on_accept, None))

    def on_accept(self, _arg) -> None:
        try:
            conn, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        if len(self.conns) >= MODEL_MAX_CONNS:  # each is a host socket too: bounded per sandbox
            conn.close()
            return
        conn.setblocking(False)
        # The service's answer arrives in pieces (headers, then body) and is written as it
        # comes: with Nagle's algorithm on, the body would wait for the client's delayed ACK
        # of the headers (40 ms per call on a keep-alive connection). Servers set this too.
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.counter += 1
        cid = self.counter
        self.conns[cid] = conn
        self.guest.sel.register(conn, selectors.EVENT_READ, (self.on_read, cid))
        self.guest.reply({"op": "mc_open", "conn": cid})

    def on_read(self, cid: int) -> None:
        conn = self.conns.get(cid)
        if conn is None:
            return
        try:
            data = conn.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if data:
            self.guest.reply({"op": "mc_data", "conn": cid}, data)
        else:
            self.drop(cid)
            self.guest.reply({"op": "mc_close", "conn": cid})

    def on_host(self, req: dict, payload: bytes) -> None:
        """A frame from the host for connection ``conn``: data to write, or close."""
        cid = req.get("conn")
        if cid not in self.conns:
            return
        if req["op"] == "mc_data":
            self.pending.setdefault(cid, bytearray()).extend(payload)
        else:
            self.closing.add(cid)
        self.on_write(cid)

    def on_write(self, cid: int) -> None:
        conn, buf = self.conns.get(cid), self.pending.get(cid)
        if conn is None:
            return
        while buf:
            try:
                n = conn.send(buf)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self.drop(cid)
                self.guest.reply({"op": "mc_close", "conn": cid})
                return
            del buf[:n]
        if buf:  # watch for room as well as for data
            self.guest.sel.modify(conn, selectors.EVENT_READ | selectors.EVENT_WRITE, (self.on_event, cid))
        elif cid in self.closing:
            self.drop(cid)
        else:
            self.guest.sel.modify(conn, selectors.EVENT_READ, (self.on_read, cid))

    def on_event(self, cid: int) -> None:
        self.on_write(cid)
        if cid in self.conns:
            self.on_read(cid)

    def drop(self, cid: int) -> None:
        conn = self.conns.pop(cid, None)
        self.pending.pop(cid, None)
        self.closing.discard(cid)
        if conn is not None:
            self.guest.sel.unregister(conn)
            conn.close()
