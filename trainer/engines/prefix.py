"""The KV cache of an episode kept across its turns: a finished reply's keys and values, found
again by the next turn's prompt.

A multi-turn episode's next prompt is its last prompt, the reply and the env's answer, token for
token (the rollout never re-tokenizes), so all but the new tokens were already through the
model. Without this, every turn prefills the whole history again: on a CPU, with a 600-token
board game history, prefill is most of the rollout's time. :class:`PrefixCache` holds the KV of
rows that finished, keyed by the exact tokens they hold, and hands it to the first prompt that
starts with those tokens (then forgets it: the episode has moved on, and its next state is
stored when that turn finishes). It is bounded in bytes (least recently stored dropped first)
and cleared at every weight load: KV computed under other weights would be another policy's.

What is cached is only ever a prefix the model computed itself from exactly those tokens and
positions, so a hit changes nothing but float rounding (a prompt's suffix attends to the same
keys and values, computed in a different kernel shape).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

__all__ = ["PrefixCache", "PrefixStats"]


@dataclass
class PrefixStats:
    """Counters: ``hits`` (prompts that found a prefix), ``misses``, ``reused_tokens`` (prompt
    tokens not prefilled again), ``evicted`` (entries dropped for the byte bound)."""

    hits: int = 0
    misses: int = 0
    reused_tokens: int = 0
    evicted: int = 0


class PrefixCache:
    """Finished rows' KV by their tokens: ``put(tokens, kv, nbytes)``, ``take(prompt)`` the
    longest stored prefix of ``prompt`` that leaves at least one token to feed (the next
    logits need one), ``clear()``. ``max_bytes`` 0 stores nothing. ``kv`` is opaque here.
    Equal token sequences are separate entries (a group's episodes that played alike), each
    handed out once."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max(0, int(max_bytes))
        self.stats = PrefixStats()
        self._entries: OrderedDict[int, tuple[tuple[int, ...], Any, int]] = OrderedDict()  # oldest first
        self._by_tokens: dict[tuple[int, ...], list[int]] = {}  # tokens -> serials of their entries
        self._serial = 0
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def put(self, tokens: list[int], kv: Any, nbytes: int) -> None:
        key = tuple(tokens)
        if not self.max_bytes or not key or nbytes > self.max_bytes:
            return
        self._serial += 1
        self._entries[self._serial] = (key, kv, nbytes)
        self._by_tokens.setdefault(key, []).append(self._serial)
        self._bytes += nbytes
        while self._bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))
            self.stats.evicted += 1

    def take(self, prompt: list[int]) -> tuple[int, Any] | None:
        """``(n, kv)`` of the longest entry that is ``prompt[:n]`` with ``n < len(prompt)``,
        removed from the cache; None (a miss) when there is none."""
        best = None
        for key in self._by_tokens:
            n = len(key)
            if n < len(prompt) and (best is None or n > len(best)) and prompt[n - 1] == key[-1] \
                    and tuple(prompt[:n]) == key:
                best = key
        if best is None:
            self.stats.misses += 1
            return None
        serial = self._by_tokens[best][0]
        kv = self._entries[serial][1]
        self._drop(serial)
        self.stats.hits += 1
        self.stats.reused_tokens += len(best)
        return len(best), kv

    def clear(self) -> None:
        self._entries.clear()
        self._by_tokens.clear()
        self._bytes = 0

    def _drop(self, serial: int) -> None:
        key, _, nbytes = self._entries.pop(serial)
        self._bytes -= nbytes
        same = self._by_tokens[key]
        same.remove(serial)
        if not same:
            del self._by_tokens[key]
