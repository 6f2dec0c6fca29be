"""Call records: one JSON line per answered (or refused-by-the-mode) call.

The schema (``docs/modelservice.md`` documents each field) is what ``ReplayMode`` reads
back and what a trainer reads to learn from exactly the tokens it generated.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import threading
import time
from pathlib import Path
from typing import Any

from .modes import Answer, Call, Caller

SCHEMA = 1


def record_of(call: Call, answer: Answer | None, finished: list, latency_s: float, mode: str,
              error: str | None = None) -> dict[str, Any]:
    """The record of one call (``finished``: each choice's (content, tool_calls, finish_reason))."""
    choices = []
    for choice, (content, calls, reason) in zip(answer.choices if answer else [], finished):
        choices.append({"text": choice.text, "content": content, "tool_calls": calls, "finish_reason": reason,
                        "completion_ids": choice.completion_ids, "logprobs": choice.logprobs,
                        "tokens": choice.tokens})
    first = choices[0] if choices else {}
    return {
        "schema": SCHEMA, "time": time.time(), "mode": mode,
        "episode": call.caller.episode, "sandbox_id": call.caller.sandbox_id, "call_index": call.index,
        "kind": call.kind, "model": call.model, "messages": call.messages, "prompt": call.prompt,
        "tools": call.tools, "tool_choice": call.tool_choice, "sampling": dataclasses.asdict(call.sampling),
        "prompt_ids": answer.prompt_ids if answer else None,
        "completion_ids": first.get("completion_ids"), "logprobs": first.get("logprobs"),
        "finish_reason": first.get("finish_reason"), "choices": choices,
        "version": answer.version if answer else None, "latency_s": latency_s, "error": error,
        "request": call.request, "response": answer.response if answer else None,
    }


class Recorder:
    """Appends records to a JSONL file (one line per call, written whole under a lock, so
    concurrent calls never interleave), and keeps the last ones in memory."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path else None
        self._lock = threading.Lock()
        self.records: collections.deque[dict] = collections.deque(maxlen=10_000)

    def write(self, record: dict, caller: Caller | None = None) -> None:
        """Record to the service's file and to the caller's own (``caller.records``), unless
        the caller has ``ended``."""
        line = json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n"
        with self._lock:
            self.records.append(record)
            also = caller.records if caller is not None and not caller.ended.is_set() else None
            for path in dict.fromkeys(p for p in (self.path, also) if p is not None):
                with open(path, "a") as f:
                    f.write(line)

    def end(self, caller: Caller) -> None:
        """Nothing more goes to ``caller``'s own file, from the moment this returns (under
        the write lock: a write that began before has ended)."""
        with self._lock:
            caller.ended.set()
