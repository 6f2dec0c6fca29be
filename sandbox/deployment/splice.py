"""Zero-copy forwarding for the gateway (``gateway.py``): once what a connection carries next
needs no reading (a decided TCP or TLS stream, the body of an HTTP response of known length, a
tunnel), its bytes go from one socket to the other through a pipe with ``splice(2)``, in the
kernel, instead of through Python's buffers: the relay's throughput is then the sockets', not
the interpreter's.

It runs on the gateway's own asyncio loop (readiness through ``add_reader`` / ``add_writer``,
on duplicates of the sockets' descriptors, which the loop's transports own). A transport
handed over stops reading (``take_over``: what its stream reader had read and not given out
comes back, to go first) and writes nothing meanwhile (``flushed``); each byte that reaches
the far side is counted as it does (``forward``'s ``moved``), so the gateway's counts and
egress records stay exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import socket
from typing import Callable

CHUNK = 1 << 20  # bytes a splice moves at most, and the pipe's size where the kernel allows it
MIN = 1 << 16  # fewer bytes ahead than this are copied as before: a splice's set-up costs more
_FLAGS = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


def plain(*ends) -> bool:
    """Whether every one of ``ends`` (stream readers and writers) is asyncio's own over a
    TCP socket: TLS the gateway terminates (``tlsinspect.TLSStream``) must pass through Python."""
    for end in ends:
        if not isinstance(end, (asyncio.StreamReader, asyncio.StreamWriter)):
            return False
        if isinstance(end, asyncio.StreamWriter) and end.get_extra_info("socket") is None:
            return False
    return True


async def take_over(reader: asyncio.StreamReader, transport: asyncio.Transport) -> tuple[bytes, bool]:
    """Stop ``transport`` reading into ``reader``; what ``reader`` had read and not yet
    given out, and whether its stream had ended. ``transport.resume_reading()`` gives it back."""
    held = bytearray()
    while True:
        transport.pause_reading()  # again: a read that empties a full reader resumes its transport
        # A read returns at once what the reader holds, or waits for more, which a paused
        # transport never brings: a step of the loop tells which (the task runs before us).
        task = asyncio.ensure_future(reader.read(CHUNK))
        await asyncio.sleep(0)
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            transport.pause_reading()
            return bytes(held), False
        data = task.result()
        if not data:
            return bytes(held), True
        held += data


async def flushed(writer: asyncio.StreamWriter) -> None:
    """Until every byte written to ``writer`` has gone to its socket (``drain`` waits only
    above the high-water mark)."""
    transport = writer.transport
    transport.set_write_buffer_limits(high=0)
    try:
        await writer.drain()
    finally:
        transport.set_write_buffer_limits()


async def _when_ready(add: Callable, remove: Callable, fd: int, op: Callable[[], int]) -> int:
    while True:
        try:
            return op()
        except BlockingIOError:
            pass
        ready = asyncio.get_running_loop().create_future()
        add(fd, lambda: ready.done() or ready.set_result(None))
        try:
            await ready
        finally:
            remove(fd)


async def forward(src: socket.socket, dst: socket.socket, limit: float,
                  moved: Callable[[int], None]) -> bool:
    """Move up to ``limit`` bytes (``math.inf``: to the end) from ``src`` to ``dst``;
    ``moved(n)`` for each ``n`` that reached ``dst``. True once ``src`` has ended."""
    loop = asyncio.get_running_loop()
    src_fd, dst_fd = os.dup(src.fileno()), os.dup(dst.fileno())
    pipe_r, pipe_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        with contextlib.suppress(OSError):  # over the user's pipe allowance: the default 64 KiB
            fcntl.fcntl(pipe_w, _F_SETPIPE_SZ, CHUNK)
        left = limit
        while left > 0:
            want = int(min(CHUNK, left))
            n = await _when_ready(loop.add_reader, loop.remove_reader, src_fd,
                                  lambda: os.splice(src_fd, pipe_w, want, flags=_FLAGS))
            if n == 0:
                return True
            while n:
                m = await _when_ready(loop.add_writer, loop.remove_writer, dst_fd,
                                      lambda: os.splice(pipe_r, dst_fd, n, flags=_FLAGS))
                n -= m
                left -= m
                moved(m)
        return False
    finally:
        for fd in (src_fd, dst_fd, pipe_r, pipe_w):
            os.close(fd)
