"""Terminals: a process on a pseudo-terminal inside a sandbox (``bash`` by default), driven
by keys, read as its screen output comes, resized, signalled, closed; with an
``expect``-style wait for a pattern, as pexpect offers.

``AsyncTerminal`` is the one abstract class; each backend's client (``runtime/``) gives it
the transport (``_recv``, ``write``, ``resize``, ``signal``, ``_close``) and
``AsyncSandbox.open_terminal`` opens one. What does not depend on the transport lives here
once: decoding, ``read``, ``expect`` with its bounded search buffer, ``wait``, the context
manager. ``sync.Terminal`` is the blocking twin.

Bounds: the guest sends at most ``PTY_WINDOW`` bytes a terminal that the host has not
consumed (``guest/terminals.py``), and ``expect`` keeps at most ``SEARCH_WINDOW``
characters of output it has not matched, so neither a flood nor a pattern that never comes
grows the host's memory.
"""

from __future__ import annotations

import abc
import asyncio
import codecs
import dataclasses
import re
import signal as signals
import time
from typing import Pattern, Sequence

from .errors import ExpectTimeout, TerminalError

SEARCH_WINDOW = 1 << 20  # characters of unmatched output ``expect`` keeps (the newest)


@dataclasses.dataclass
class ExpectMatch:
    """What ``expect`` found: ``index`` into its patterns, the ``re.Match``, and the output
    ``before`` it (what came since the previous ``expect`` or ``read``)."""

    index: int
    match: re.Match
    before: str

    @property
    def text(self) -> str:
        return self.match.group(0)


class AsyncTerminal(abc.ABC):
    """A process on a pseudo-terminal in a sandbox (async API; ``sync.Terminal`` is the
    blocking twin). Open with ``await sandbox.open_terminal(...)``, as a context manager.

    Output is text (UTF-8, undecodable bytes replaced) exactly as the terminal shows it:
    echoed keys, ``\\r\\n`` line ends, escape sequences. ``exit_code`` is set once the
    process ended (None while it runs; None also when the terminal was closed for
    idleness). Every method raises ``TerminalError`` on a terminal that was closed."""

    def __init__(self, sandbox_id: str):
        self.sandbox_id = sandbox_id
        self.exit_code: int | None = None
        self.exited = False  # the process ended (or the terminal was closed): no more output
        self._closed = False
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""  # output received and not yet returned by read() or expect()

    # ----------------------------------------------------------------- transport
    @abc.abstractmethod
    async def _recv(self) -> bytes | None:
        """The next chunk of output (waits for it); None once the process ended, with
        ``exit_code`` set. Consuming a chunk is what lets the guest send more."""

    @abc.abstractmethod
    async def write(self, data: str | bytes) -> None:
        """Type ``data`` (a ``str`` is sent as UTF-8): ``"ls\\n"``, ``"\\x03"`` for Ctrl-C,
        ``"\\x1b[A"`` for the up arrow."""

    @abc.abstractmethod
    async def resize(self, rows: int, cols: int) -> None:
        """Change the terminal's size; its programs get SIGWINCH."""

    @abc.abstractmethod
    async def signal(self, sig: int = signals.SIGINT) -> None:
        """Send ``sig`` to the terminal's foreground process group (what the terminal
        driver does for Ctrl-C), whether or not the program reads its keys."""

    @abc.abstractmethod
    async def _close(self) -> None:
        """End the terminal's processes and release it (idempotent)."""

    # ----------------------------------------------------------------- shared
    def _ensure_open(self) -> None:
        if self._closed:
            raise TerminalError("terminal is closed", sandbox_id=self.sandbox_id)

    async def _more(self, timeout: float | None) -> bool:
        """Append the next chunk to the pending text; False at the end or on timeout."""
        if self.exited:
            return False
        try:
            data = await asyncio.wait_for(self._recv(), timeout)
        except asyncio.TimeoutError:
            return False
        if data is None:
            self.exited = True
            self._pending += self._decoder.decode(b"", final=True)
            return False
        self._pending += self._decoder.decode(data)
        return True

    async def read(self, timeout: float | None = None) -> str:
        """Output that came since the last ``read`` or ``expect``: what is already here, or
        the next chunk (waiting at most ``timeout`` seconds). ``""`` on timeout and at the
        end (``exited``)."""
        self._ensure_open()
        if not self._pending:
            await self._more(timeout)
        out, self._pending = self._pending, ""
        return out

    async def read_bytes(self, timeout: float | None = None) -> bytes | None:
        """The next chunk of output as the terminal sent it (waiting at most ``timeout``
        seconds: ``b""`` then); None at the end. For a relay (the service's WebSocket):
        do not mix with ``read``/``expect``, which decode."""
        self._ensure_open()
        if self.exited:
            return None
        try:
            data = await asyncio.wait_for(self._recv(), timeout)
        except asyncio.TimeoutError:
            return b""
        if data is None:
            self.exited = True
        return data

    async def expect(self, patterns: str | Pattern | Sequence[str | Pattern], timeout: float = 30.0
                     ) -> ExpectMatch:
        """Wait until the output matches one of ``patterns`` (regular expressions) and
        consume it up to the end of the match; the earliest match wins (the first pattern
        on a tie). Raises ``ExpectTimeout`` (its ``before`` is the output searched) after
        ``timeout`` seconds, ``TerminalError`` if the process ends first."""
        self._ensure_open()
        if isinstance(patterns, (str, re.Pattern)):
            patterns = [patterns]
        compiled = [re.compile(p) if isinstance(p, str) else p for p in patterns]
        deadline = time.monotonic() + timeout
        while True:
            found = [(m.start(), i, m) for i, p in enumerate(compiled) if (m := p.search(self._pending))]
            if found:
                _, index, match = min(found, key=lambda f: (f[0], f[1]))
                before = self._pending[:match.start()]
                self._pending = self._pending[match.end():]
                return ExpectMatch(index, match, before)
            if len(self._pending) > SEARCH_WINDOW:
                self._pending = self._pending[-SEARCH_WINDOW:]
            left = deadline - time.monotonic()
            if self.exited:
                raise TerminalError(f"the terminal's process ended (exit code {self.exit_code}) before "
                                    f"{[p.pattern for p in compiled]!r} appeared", sandbox_id=self.sandbox_id)
            if left <= 0 or not await self._more(left) and not self.exited:
                raise ExpectTimeout(f"none of {[p.pattern for p in compiled]!r} appeared in {timeout:g} s",
                                    self._pending, sandbox_id=self.sandbox_id)

    async def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the process to end (its output is discarded) and return ``exit_code``;
        raises ``ExpectTimeout`` after ``timeout`` seconds."""
        self._ensure_open()
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.exited:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0 or not await self._more(left) and not self.exited:
                raise ExpectTimeout(f"the terminal's process still runs after {timeout:g} s", self._pending,
                                    sandbox_id=self.sandbox_id)
            self._pending = self._pending[-SEARCH_WINDOW:]
        return self.exit_code

    async def close(self) -> None:
        """End the terminal's processes (its whole session) and release it. Idempotent."""
        if self._closed:
            return
        self._closed = True
        await self._close()

    @property
    def closed(self) -> bool:
        return self._closed

    async def __aenter__(self) -> "AsyncTerminal":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
