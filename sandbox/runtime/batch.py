"""Calls made together, sent together: the remote SDK's coalescing of creates.

An RL step opens its sandboxes with one ``asyncio.gather`` of creates. Sent one request
each, a burst of 1,000 spends as much CPU on HTTP (the SDK's client, the service's parsing
and routing) as on the sandboxes. ``Coalescer.submit`` queues a call's payload and
returns its own answer; the queue is flushed once the event loop has run the callbacks
that were ready when the first call was queued (``call_soon``), by which time every task
one ``gather`` started has queued its call, and goes out as one ``send(key, batch)``
per key, at most ``limit`` calls a batch. A call made alone is a batch of one.

Each caller still gets its own answer or error. A caller cancelled while its call is in
flight does not leave what the call made behind: the answer goes to ``orphan`` (for a
create, which closes the sandbox) instead of being dropped.
"""

from __future__ import annotations

import asyncio
import weakref
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Hashable


@dataclass
class Pending:
    """One caller's call: its payload and the future its caller awaits."""

    payload: Any
    future: asyncio.Future
    orphan: Callable[[Any], None]

    def resolve(self, value: Any) -> None:
        if self.future.cancelled():
            self.orphan(value)  # its caller left: what it asked for must not be left behind
        elif not self.future.done():
            self.future.set_result(value)

    def fail(self, exc: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exc)

    async def settle(self, call: Awaitable[Any]) -> None:
        """This call's answer from ``call``, sent on its own."""
        try:
            value = await call
        except Exception as e:  # noqa: BLE001 - it is the caller's to raise
            self.fail(e)
        else:
            self.resolve(value)


class Coalescer:
    def __init__(self, send: Callable[[Hashable, list[Pending]], Awaitable[None]], *, limit: int,
                 orphan: Callable[[Hashable, Any], None]):
        """``send(key, batch)`` answers every ``Pending`` of ``batch`` (``resolve`` or
        ``fail``); one it leaves unanswered fails with the error it raised."""
        self._send, self._limit, self._orphan = send, limit, orphan
        self._queues: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Hashable, list[Pending]]] = \
            weakref.WeakKeyDictionary()
        self._sending: set[asyncio.Task] = set()  # the loop keeps only weak references to tasks

    async def submit(self, key: Hashable, payload: Any) -> Any:
        loop = asyncio.get_running_loop()
        queues = self._queues.setdefault(loop, {})
        if not queues:
            loop.call_soon(self._flush, loop, queues)
        future = loop.create_future()
        queues.setdefault(key, []).append(Pending(payload, future, lambda value: self._orphan(key, value)))
        return await future

    def _flush(self, loop: asyncio.AbstractEventLoop, queues: dict[Hashable, list[Pending]]) -> None:
        batches = list(queues.items())
        queues.clear()
        for key, calls in batches:
            for i in range(0, len(calls), self._limit):
                task = loop.create_task(self._run(key, calls[i:i + self._limit]))
                self._sending.add(task)
                task.add_done_callback(self._sending.discard)

    async def _run(self, key: Hashable, batch: list[Pending]) -> None:
        batch = [call for call in batch if not call.future.cancelled()]  # callers gone before it went out
        if not batch:
            return
        try:
            await self._send(key, batch)
        except Exception as e:  # noqa: BLE001 - each caller raises it (one error for the batch)
            for call in batch:
                call.fail(e)
        except BaseException:  # the loop is going away (cancelled): so are the callers
            for call in batch:
                call.future.cancel()
            raise
