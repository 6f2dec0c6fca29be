"""The lifecycle of a generation loop, written once for every engine that batches continuously
(:class:`~.scheduler.ContinuousBatcher` over a torch KV cache, :class:`~.generation.VLLMEngine`
over vLLM's engine): a thread of its own that steps the running batch while requests arrive,
weight loads between two steps, and a close that fails whoever still waits.

- Requests are queued (:meth:`GenerationLoop._put`) from any thread; the first one starts the
  loop thread, a later one after :meth:`close` starts it again.
- The loop waits until there is work (rows in flight, or queued requests while no load drains
  the batch), then runs one :meth:`_step` holding the step lock.
- :meth:`_load` runs a weight load between two steps: with ``drain``, admission stops and the
  load waits for the rows in flight to finish on the old weights. A load that waits for the
  step lock holds the loop before its next step (``_loads``): a lock alone is not fair, a busy
  loop could take it again and again, and a load that does not drain would wait out the batch.
- An error in the loop, or :meth:`close`, fails every request still waiting or running.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections import deque
from typing import Any, Callable

__all__ = ["GenerationLoop"]

CLOSED = "the generation engine is closed"


class GenerationLoop:
    """The base of a continuously batching generation loop; a subclass says what a step is
    (:meth:`_step`), what is in flight (:meth:`_in_flight`), which requests a step takes from
    the queue (:meth:`_take`), and whose futures fail when the loop ends (:meth:`_pending`)."""

    thread_name = "rockroll-generation"

    def __init__(self) -> None:
        self._queue: deque = deque()
        self._cv = threading.Condition()
        self._step_lock = threading.Lock()  # held for one step; weights load between steps
        self._loading = False  # a draining weight load is waiting for the batch: admit nothing
        self._loads = 0  # loads waiting for the step lock: the loop starts no step while one waits
        self._stop = False
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ what a subclass says
    def _in_flight(self) -> bool:
        """Whether rows are running (called under ``_cv``)."""
        raise NotImplementedError

    def _take(self) -> Any:
        """Under ``_cv``, before a step: what the step takes from the queue (default: nothing,
        the step reads the queue itself)."""
        return None

    def _step(self, taken: Any) -> Any:
        """One step of the batch, under the step lock; its result goes to :meth:`_after`."""
        raise NotImplementedError

    def _after(self, result: Any) -> None:
        """After a step, outside the step lock (default: nothing)."""

    def _pending(self) -> list[concurrent.futures.Future]:
        """Under ``_cv``, when the loop ends: the futures of every request still waiting or
        running, taken off the queue and the batch."""
        raise NotImplementedError

    def _closed(self) -> None:
        """In :meth:`close`, once the loop thread is gone (default: nothing)."""

    # ------------------------------------------------------------------ the lifecycle
    def _put(self, requests: list) -> None:
        """Queue requests for the next step, starting the loop if it is not running."""
        with self._cv:
            if self._stop:
                raise RuntimeError(CLOSED)
            self._queue.extend(requests)
            if self._thread is None:
                self._thread = threading.Thread(target=self._main, name=self.thread_name, daemon=True)
                self._thread.start()
            self._cv.notify_all()

    def _load(self, load: Callable[[], None], *, drain: bool) -> None:
        """Run ``load`` (a weight load) between two steps; with ``drain`` once the rows in
        flight finished (and none joined meanwhile)."""
        with self._cv:
            if drain:
                self._loading = True
                self._cv.wait_for(lambda: not self._in_flight() or self._stop)
            self._loads += 1
        try:
            with self._step_lock:
                load()
        finally:
            with self._cv:
                self._loads -= 1
                self._loading = False
                self._cv.notify_all()

    def close(self) -> None:
        """Stop the loop (requests still waiting fail); a later request starts it again."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout=30)
        self._closed()
        with self._cv:
            self._stop, self._thread = False, None

    def _main(self) -> None:
        try:
            while True:
                with self._cv:
                    self._cv.wait_for(lambda: self._stop or not self._loads and (
                        self._in_flight() or (self._queue and not self._loading)))
                    if self._stop:
                        break
                    taken = self._take()
                with self._step_lock:
                    result = self._step(taken)
                self._after(result)
        except BaseException as e:  # noqa: BLE001  (fail every waiting caller, not only the loop)
            self._fail(e)
            raise
        self._fail(RuntimeError(CLOSED))

    def _fail(self, e: BaseException) -> None:
        with self._cv:
            futures = self._pending()
            self._stop = True
            self._cv.notify_all()
        for f in futures:
            if not f.done():
                f.set_exception(e)
