"""Tool-call parsers: a model's raw text -> (content, OpenAI ``tool_calls``).

A parser is a pure function ``text -> (content | None, [tool_call, ...])``; ``PARSERS``
names them so a service picks one by name (``ModelService(tool_parser="hermes")``) and a
new model family adds its own without touching the server.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Callable

ToolParser = Callable[[str], "tuple[str | None, list[dict]]"]

_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def tool_call(name: str, arguments, index: int, text: str) -> dict:
    """One OpenAI tool call. Its id is derived from the text, so a replay gives the same id."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    digest = hashlib.sha256(f"{index}:{text}".encode()).hexdigest()[:24]
    return {"id": f"call_{digest}", "type": "function", "function": {"name": name, "arguments": args}}


def parse_hermes(text: str) -> tuple[str | None, list[dict]]:
    """Qwen/Hermes format: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
    blocks anywhere in the text. A block that is not such JSON stays in the content (the
    agent sees what the model wrote instead of losing it)."""
    calls, kept, last = [], [], 0
    for m in _HERMES.finditer(text):
        try:
            obj = json.loads(m.group(1))
        except ValueError:
            continue
        if not (isinstance(obj, dict) and isinstance(obj.get("name"), str) and obj["name"]):
            continue
        kept.append(text[last:m.start()])
        last = m.end()
        calls.append(tool_call(obj["name"], obj.get("arguments", {}), len(calls), m.group(0)))
    if not calls:
        return text, []
    kept.append(text[last:])
    content = "".join(kept).strip()
    return (content or None), calls


def parse_none(text: str) -> tuple[str | None, list[dict]]:
    """No tool calls: the text is the content."""
    return text, []


PARSERS: dict[str, ToolParser] = {"hermes": parse_hermes, "qwen": parse_hermes, "none": parse_none}
