"""The one action parser shared by every GEM env: model text in, :class:`Action` out.

Accepted forms
--------------
Tool actions (``kind="bash"`` or ``"submit"``):

- a fenced block whose info string is ``bash``, ``sh``, ``shell`` or ``console``::

      ```bash
      ls -la
      ```

  Fences follow CommonMark: the block closes at a line holding only backticks, at least as
  many as the opening fence -- so a command that contains a ```` ``` ```` line needs a longer
  fence (````` ```` `````). Plain ```` ``` ```` blocks and other languages (```` ```python ````)
  are treated as prose: models quote code all the time. An unclosed ```` ```bash ```` block is
  invalid (the generation was probably cut off; running half a command is unsafe).
- ``<bash>ls -la</bash>``.
- an OpenAI-style JSON tool call, bare in the text, in a ```` ```json ```` block or inside
  ``<tool_call>...</tool_call>``: ``{"name": "bash", "arguments": {"command": "ls"}}``,
  ``{"type": "function", "function": {"name": "bash", "arguments": "{\\"command\\": \\"ls\\"}"}}``
  (``arguments`` may be a JSON string; ``parameters`` is accepted for ``arguments``), a list of
  one such call, or ``{"tool_calls": [<one call>]}``.
- submit: ``<submit/>``, ``<submit>answer</submit>``, a line that is just ``submit``, or a
  tool call named ``submit`` with an optional ``answer`` argument.

Answers (``kind="answer"``, for Q&A envs such as math and the grid games): ``\\boxed{...}``
(braces balanced) or ``<answer>...</answer>``; when several appear, the *last* one counts
(models revise themselves). Answers are only looked for when there is no tool action.

Ambiguity: one tool action per turn. Two or more (two bash blocks, a bash block and a
submit, a ``tool_calls`` list of two) give ``kind="invalid"`` with an error saying so --
silently running only the first would let the model believe the second ran too.

Fenced blocks, tags and tool calls are found with linear scans (no backtracking regexes),
so megabyte-sized generations parse quickly.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ANSWER_FORMATS",
    "TOOL_FORMATS",
    "Action",
    "format_error_message",
    "parse_action",
]

TOOL_FORMATS = [
    "a bash command in a fenced block: ```bash\\n<command>\\n```",
    "<bash><command></bash>",
    'a JSON tool call: {"name": "bash", "arguments": {"command": "<command>"}}',
    '<submit/> (or <submit>answer</submit>, or {"name": "submit", "arguments": {}}) when you are done',
]
ANSWER_FORMATS = ["\\boxed{...}, e.g. \\boxed{3/4}", "<answer>...</answer>"]

BASH_LANGS = frozenset({"bash", "sh", "shell", "console"})
TOOL_NAMES = ("bash", "submit")
_MAX_JSON_ATTEMPTS = 64

_FENCE_OPEN = re.compile(r"^([ \t]*)(`{3,}|~{3,})[ \t]*([^\s`]*)[^`\n]*$")
_JSON_START = re.compile(r'[{\[]\s*"')
_SUBMIT_LINE = re.compile(r"^[ \t]*submit[ \t]*$", re.IGNORECASE | re.MULTILINE)
_SUBMIT_EMPTY_TAG = re.compile(r"<submit\s*/>|<submit>\s*</submit>", re.IGNORECASE)


@dataclass(frozen=True)
class Action:
    """A parsed action. ``kind`` is ``"bash"``, ``"submit"``, ``"answer"`` or ``"invalid"``.

    ``command`` is set for bash, ``answer`` for answer (and optionally submit), ``error``
    (a message meant for the model) for invalid.
    """

    kind: str
    command: str | None = None
    answer: str | None = None
    error: str | None = None

    @property
    def valid(self) -> bool:
        return self.kind != "invalid"


def _invalid(error: str) -> Action:
    return Action(kind="invalid", error=error)


def format_error_message(accepted: list[str], error: str | None = None) -> str:
    """The observation for a malformed action: what went wrong and every accepted format."""
    head = f"Invalid action: {error}" if error else "Invalid action format."
    lines = "\n".join(f"- {form}" for form in accepted)
    return f"{head}\nAccepted formats:\n{lines}\nReply again with exactly one action in one of these formats."


# ---- tool calls --------------------------------------------------------------------------
def _is_tool_call_like(obj: Any) -> bool:
    """Whether a decoded JSON value was meant as a tool call (not, say, a package.json)."""
    if isinstance(obj, list):
        return len(obj) > 0 and all(_is_tool_call_like(item) for item in obj)
    if not isinstance(obj, dict):
        return False
    if "tool_calls" in obj or isinstance(obj.get("function"), dict):
        return True
    return "name" in obj and ("arguments" in obj or "parameters" in obj)


def _tool_calls_of(obj: Any) -> list[Any]:
    if isinstance(obj, list):
        return [call for item in obj for call in _tool_calls_of(item)]
    if isinstance(obj, dict) and "tool_calls" in obj:
        calls = obj["tool_calls"]
        return list(calls) if isinstance(calls, list) else [calls]
    return [obj]


def _tool_call_action(call: Any) -> Action:
    """One OpenAI-style call (already JSON-decoded) as an Action."""
    if not isinstance(call, dict):
        return _invalid("a tool call must be a JSON object")
    fn = call.get("function") if isinstance(call.get("function"), dict) else call
    name = fn.get("name")
    args = fn.get("arguments", fn.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as exc:
            return _invalid(f"the tool call's arguments are not valid JSON ({exc.msg} at char {exc.pos})")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return _invalid("the tool call's arguments must be a JSON object")
    if name == "bash":
        command = args.get("command")
        if not isinstance(command, str) or not command.strip():
            return _invalid('the bash tool call needs a non-empty string argument "command"')
        return Action(kind="bash", command=command)
    if name == "submit":
        answer = args.get("answer")
        return Action(kind="submit", answer=None if answer is None else str(answer))
    return _invalid(f"unknown tool {name!r}; available tools: {', '.join(TOOL_NAMES)}")


def _actions_from_json(obj: Any) -> list[Action]:
    return [_tool_call_action(call) for call in _tool_calls_of(obj)] or [_invalid("empty tool call list")]


def _scan_json_calls(text: str) -> list[tuple[int, list[Action]]]:
    """Tool calls embedded in prose: decode JSON at plausible starts, skip what decoded."""
    if '"name"' not in text and '"tool_calls"' not in text and '"function"' not in text:
        return []
    decoder = json.JSONDecoder()
    found: list[tuple[int, list[Action]]] = []
    pos, attempts = 0, 0
    while attempts < _MAX_JSON_ATTEMPTS:
        match = _JSON_START.search(text, pos)
        if match is None:
            break
        attempts += 1
        try:
            obj, end = decoder.raw_decode(text, match.start())
        except json.JSONDecodeError:
            pos = match.start() + 1
            continue
        if _is_tool_call_like(obj):
            found.append((match.start(), _actions_from_json(obj)))
        pos = end
    return found


# ---- the scanner -------------------------------------------------------------------------
def _scan_fences(text: str) -> tuple[list[tuple[int, list[Action]]], list[str]]:
    """Tool actions from fenced blocks, and the text outside bash/json blocks (the prose)."""
    actions: list[tuple[int, list[Action]]] = []
    prose: list[str] = []
    lines = text.split("\n")
    i, offset = 0, 0
    while i < len(lines):
        line = lines[i]
        match = _FENCE_OPEN.match(line) if ("`" in line or "~" in line) else None
        if match is None:
            prose.append(line)
            offset += len(line) + 1
            i += 1
            continue
        indent, fence, lang = match.group(1), match.group(2), match.group(3).lower()
        start, j = offset, i + 1
        offset += len(line) + 1
        closer = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        while j < len(lines) and not closer.match(lines[j]):
            j += 1
        body = [b[len(indent) :] if b.startswith(indent) else b for b in lines[i + 1 : j]]
        content = "\n".join(body)
        closed = j < len(lines)
        offset += sum(len(b) + 1 for b in lines[i + 1 : j + 1])
        i = j + 1
        if lang in BASH_LANGS:
            if not closed:
                actions.append(
                    (start, [_invalid(f"unclosed {fence}{lang} block (missing the closing {fence})")])
                )
            elif not content.strip():
                actions.append((start, [_invalid(f"the {fence}{lang} block is empty")]))
            else:
                actions.append((start, [Action(kind="bash", command=content.strip("\n"))]))
            continue
        if lang in ("json", "") and closed:
            try:
                obj = json.loads(content)
            except json.JSONDecodeError:
                obj = None
            if _is_tool_call_like(obj):
                actions.append((start, _actions_from_json(obj)))
                continue
        # Any other block is quoted code: it is neither an action nor searched for one.
        prose.append("")
    return actions, prose


def _cut_tags(text: str, tag: str) -> tuple[list[tuple[int, str | None]], str]:
    """Contents of ``<tag>...</tag>`` (None when unclosed) and the text with them removed."""
    open_tag, close_tag = f"<{tag}>", f"</{tag}>"
    found: list[tuple[int, str | None]] = []
    kept: list[str] = []
    pos = 0
    while True:
        start = text.find(open_tag, pos)
        if start < 0:
            break
        end = text.find(close_tag, start + len(open_tag))
        kept.append(text[pos:start])
        if end < 0:
            found.append((start, None))
            pos = len(text)
            break
        found.append((start, text[start + len(open_tag) : end]))
        pos = end + len(close_tag)
    kept.append(text[pos:])
    return found, "\n".join(kept)


def _last_boxed(text: str) -> tuple[int, str] | None:
    """Position and content of the last brace-balanced ``\\boxed{...}``, in one linear pass."""
    last: tuple[int, str] | None = None
    stack: list[tuple[int, int | None]] = []  # (content start, \boxed position or None)
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "\\" and text.startswith("\\boxed{", i):
            stack.append((i + 7, i))
            i += 7
            continue
        if ch == "{":
            stack.append((i + 1, None))
        elif ch == "}" and stack:
            content_start, boxed_at = stack.pop()
            if boxed_at is not None:
                last = (boxed_at, text[content_start:i])
        i += 1
    return last


def parse_action(text: str) -> Action:
    """Parse one model turn into an :class:`Action` (see the module docstring for the rules)."""
    if not isinstance(text, str):
        return _invalid(f"expected text, got {type(text).__name__}")
    if not text.strip():
        return _invalid("the reply is empty")
    found: list[tuple[int, list[Action]]] = []

    for start, content in _cut_tags(text, "tool_call")[0]:
        if content is None:
            found.append((start, [_invalid("unclosed <tool_call> tag")]))
            continue
        try:
            obj = json.loads(content)
        except json.JSONDecodeError as exc:
            found.append(
                (
                    start,
                    [_invalid(f"the <tool_call> content is not valid JSON ({exc.msg} at char {exc.pos})")],
                )
            )
            continue
        found.append((start, _actions_from_json(obj)))
    rest = _cut_tags(text, "tool_call")[1]

    fence_actions, prose_lines = _scan_fences(rest)
    found += fence_actions
    prose = "\n".join(prose_lines)

    bash_tags, prose = _cut_tags(prose, "bash")
    for start, content in bash_tags:
        if content is None:
            found.append((start, [_invalid("unclosed <bash> tag (missing </bash>)")]))
        elif not content.strip():
            found.append((start, [_invalid("the <bash></bash> tag is empty")]))
        else:
            found.append((start, [Action(kind="bash", command=content.strip())]))

    submit_tags, prose = _cut_tags(prose, "submit")
    for start, content in submit_tags:
        answer = None if content is None or not content.strip() else content.strip()
        found.append((start, [Action(kind="submit", answer=answer)]))
    for match in _SUBMIT_EMPTY_TAG.finditer(prose):
        found.append((match.start(), [Action(kind="submit")]))
    prose = _SUBMIT_EMPTY_TAG.sub("", prose)
    for match in _SUBMIT_LINE.finditer(prose):
        found.append((match.start(), [Action(kind="submit")]))

    found += _scan_json_calls(prose)

    actions = [action for _, group in sorted(found, key=lambda item: item[0]) for action in group]
    if len(actions) == 1:
        return actions[0]
    if len(actions) > 1:
        invalid = [a for a in actions if not a.valid]
        detail = f" ({invalid[0].error})" if invalid else ""
        kinds = ", ".join(a.kind for a in actions)
        return _invalid(f"found {len(actions)} actions ({kinds}){detail}; send exactly one action per turn")

    answers: list[tuple[int, str]] = []
    boxed = _last_boxed(prose)
    if boxed is not None:
        answers.append(boxed)
    answer_tags = [(pos, c) for pos, c in _cut_tags(prose, "answer")[0] if c is not None]
    if answer_tags:
        answers.append(answer_tags[-1])
    if answers:
        answer = max(answers, key=lambda item: item[0])[1].strip()
        if not answer:
            return _invalid("the answer is empty")
        return Action(kind="answer", answer=answer)
    return _invalid("no action found in the reply")
