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
(models revise themselves). Without either, a free-form statement of it: the last line part
after ``answer is``, ``answer:`` or ``answer =`` (``The final answer is 12.``,
``**Answer:** Down``), up to the end of its sentence, with markdown emphasis, ``$`` and a
final full stop taken off -- an instruct model that was never taught a format still states
its answer so. Answers are only looked for when there is no tool action.

Quoting: the reply is read left to right and the construct that starts first -- a fenced
block, a ``<tool_call>``/``<bash>``/``<submit>`` tag, a JSON value -- takes its whole span;
nothing inside a span is read again. So a JSON tool call whose command mentions
``<bash>...</bash>`` or ``<submit/>`` is that one command, a ``<bash>`` command holding JSON
text or a ```` ``` ```` line is that one command, and quoted code (other fences) and JSON that
is not a tool call are neither actions nor searched for one. A JSON value is looked for where
``{"`` or a ``[`` followed by ``"``, ``{`` or ``[`` starts (so an answer such as
``\\boxed{[0, 1]}`` stays prose); a list whose first item is a number, ``true``, ``false``
or ``null`` is therefore not one span, and an object in it is read on its own.

Ambiguity: one tool action per turn. Two or more (two bash blocks, a bash block and a
submit, a ``tool_calls`` list of two) give ``kind="invalid"`` with an error saying so --
silently running only the first would let the model believe the second ran too.

Fenced blocks, tags and tool calls are found in one linear scan (no backtracking regexes,
a bounded number of JSON decode attempts), so megabyte-sized generations parse quickly.
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
_MAX_JSON_FAILURES = 64

_FENCE_OPEN = re.compile(r"^([ \t]*)(`{3,}|~{3,})[ \t]*([^\s`]*)[^`\n]*$")


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


# ---- the scanner -------------------------------------------------------------------------
# Where a construct may start; the earliest match wins and takes its whole span.
_CONSTRUCT = re.compile(
    r"(?P<fence>^[ \t]*(?:`{3,}|~{3,}))"
    r"|(?P<tag><tool_call>|<bash>|<submit>)"
    r"|(?P<empty_submit>(?i:<submit\s*/>|<submit>\s*</submit>))"
    r"|(?P<submit_line>^[ \t]*(?i:submit)[ \t]*$)"
    r'|(?P<json>\{\s*"|\[\s*[\[{"])',  # a list of objects too: its items are not read one by one
    re.MULTILINE,
)
#: A construct's span ``(end, actions)``; no actions for quoted code and JSON data.
_Span = tuple[int, list[Action]]


def _fence(text: str, start: int) -> _Span | None:
    """A fenced block opening on the line at ``start`` (None if the line opens no fence)."""
    line_end = text.find("\n", start)
    line_end = len(text) if line_end < 0 else line_end
    match = _FENCE_OPEN.match(text[start:line_end])
    if match is None:
        return None
    indent, fence, lang = match.group(1), match.group(2), match.group(3).lower()
    closer = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$", re.MULTILINE)
    close = closer.search(text, line_end + 1) if line_end < len(text) else None
    end = close.end() if close else len(text)
    body = text[line_end + 1 : close.start() - 1] if close else text[line_end + 1 :]
    content = "\n".join(b[len(indent) :] if b.startswith(indent) else b for b in body.split("\n"))
    if lang in BASH_LANGS:
        if close is None:
            return end, [_invalid(f"unclosed {fence}{lang} block (missing the closing {fence})")]
        if not content.strip():
            return end, [_invalid(f"the {fence}{lang} block is empty")]
        return end, [Action(kind="bash", command=content.strip("\n"))]
    if lang in ("json", "") and close is not None:
        try:
            obj = json.loads(content)
            if _is_tool_call_like(obj):
                return end, _actions_from_json(obj)
        except (json.JSONDecodeError, RecursionError):  # RecursionError: absurdly deep nesting
            pass
    # Any other block is quoted code: it is neither an action nor searched for one.
    return end, []


def _tag(text: str, start: int, tag: str) -> _Span:
    """``<tag>...</tag>`` at ``start``; an unclosed tag takes the rest of the text."""
    content_start = start + len(tag) + 2
    close = text.find(f"</{tag}>", content_start)
    if close < 0:
        if tag == "submit":  # the answer was cut off, the intent was not
            return len(text), [Action(kind="submit")]
        return len(text), [_invalid(f"unclosed <{tag}> tag" + (" (missing </bash>)" if tag == "bash" else ""))]
    end, content = close + len(tag) + 3, text[content_start:close]
    if tag == "submit":
        return end, [Action(kind="submit", answer=content.strip() or None)]
    if tag == "bash":
        if not content.strip():
            return end, [_invalid("the <bash></bash> tag is empty")]
        return end, [Action(kind="bash", command=content.strip())]
    try:
        return end, _actions_from_json(json.loads(content))
    except json.JSONDecodeError as exc:
        return end, [_invalid(f"the <tool_call> content is not valid JSON ({exc.msg} at char {exc.pos})")]
    except RecursionError:
        return end, [_invalid("the <tool_call> content is nested too deeply")]


def _scan(text: str) -> tuple[list[Action], str]:
    """The tool actions in ``text``, in order, and its prose (the text outside every span).

    Left to right, the construct that starts first takes its whole span -- a fenced block,
    a ``<tool_call>``/``<bash>``/``<submit>`` tag, an empty submit tag, a submit line, a
    JSON value -- and the search goes on after it, so nothing inside a span is read again:
    a ``<bash>`` tag quoted in a JSON command is part of that command, and JSON quoted in a
    ``<bash>`` command is part of it. A candidate that turns out not to be a construct (a
    line of backticks with text after them, JSON that does not decode) is prose.
    """
    decoder = json.JSONDecoder()
    # A failed decode can cost up to the rest of the text, so only so many may fail
    # (megabyte-sized generations of stray braces stay linear); a value that decodes is a span.
    json_failures_left = _MAX_JSON_FAILURES
    actions: list[Action] = []
    prose: list[str] = []
    pos = search_from = 0
    while (match := _CONSTRUCT.search(text, search_from)) is not None:
        kind, start, span = match.lastgroup, match.start(), None
        if kind == "fence":
            span = _fence(text, start)
        elif kind == "tag":
            span = _tag(text, start, match.group()[1:-1])
        elif kind in ("empty_submit", "submit_line"):
            span = match.end(), [Action(kind="submit")]
        elif json_failures_left > 0:
            try:  # JSON that is not a tool call is quoted data, like a code block
                obj, end = decoder.raw_decode(text, start)
                span = end, _actions_from_json(obj) if _is_tool_call_like(obj) else []
            except (json.JSONDecodeError, RecursionError):  # RecursionError: absurdly deep nesting
                json_failures_left -= 1
        if span is None:
            search_from = start + 1
            continue
        prose.append(text[pos:start])
        pos = search_from = span[0]
        actions += span[1]
    prose.append(text[pos:])
    return actions, "\n".join(prose)


def _tag_contents(text: str, tag: str) -> list[tuple[int, str]]:
    """Position and content of each closed ``<tag>...</tag>`` (for answers in prose)."""
    found: list[tuple[int, str]] = []
    pos = 0
    while (start := text.find(f"<{tag}>", pos)) >= 0:
        end = text.find(f"</{tag}>", start)
        if end < 0:
            break
        found.append((start, text[start + len(tag) + 2 : end]))
        pos = end
    return found


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


# "answer is", "answer:", "answer =" (markdown bold around either part), then the rest of the line
_ANSWER_PHRASE = re.compile(r"\banswer\b[*_ \t]*(?:is\b|:|=)[*_ \t:]*([^\n]*)", re.IGNORECASE)
_ANSWER_WORD = re.compile(r"\banswer\b", re.IGNORECASE)
_SENTENCE_END = re.compile(r"[.;,!?](?:\s|$)|\s(?:because|since|which|as)\s", re.IGNORECASE)


def _stated_answer(text: str) -> str | None:
    """The answer of the last ``... answer is X`` statement in ``text`` (module docstring), or None."""
    # from the last "answer" back (a statement's rest of line may hold a later one)
    starts = [m.start() for m in _ANSWER_WORD.finditer(text)]
    last = next((m for i in reversed(starts) if (m := _ANSWER_PHRASE.match(text, i))), None)
    if last is None:
        return None
    value = last.group(1)
    end = _SENTENCE_END.search(value)
    value = (value[: end.start()] if end else value).strip().strip("*_`$ \t").strip()
    if value.startswith("\\(") and value.endswith("\\)"):
        value = value[2:-2].strip()
    return value or None


def parse_action(text: str) -> Action:
    """Parse one model turn into an :class:`Action` (see the module docstring for the rules)."""
    if not isinstance(text, str):
        return _invalid(f"expected text, got {type(text).__name__}")
    if not text.strip():
        return _invalid("the reply is empty")
    actions, prose = _scan(text)
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
    answer_tags = _tag_contents(prose, "answer")
    if answer_tags:
        answers.append(answer_tags[-1])
    if answers:
        answer = max(answers, key=lambda item: item[0])[1].strip()
        if not answer:
            return _invalid("the answer is empty")
        return Action(kind="answer", answer=answer)
    stated = _stated_answer(prose)
    if stated is not None:
        return Action(kind="answer", answer=stated)
    return _invalid("no action found in the reply")
