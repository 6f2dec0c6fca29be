"""Properties of the action parser (gem/actions.py), read off its module docstring.

- It never raises, and what it returns is coherent: a bash action has a non-blank command,
  an answer a non-blank answer, an invalid action an error for the model.
- Every accepted form round-trips: any command (any characters) written in any accepted
  form, with any prose around it, parses to exactly that command.
- Never a malformed action: two tool actions are invalid, a cut-off ```bash block or
  <bash> tag never runs, quoted code and JSON data are never actions, an empty command is
  invalid.
"""

from __future__ import annotations

import json
import re

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from rockroll.gem.actions import Action, parse_action

PROPS = settings(max_examples=200, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def bash(cmd: str) -> Action:
    return Action(kind="bash", command=cmd)


# ---- strategies ----------------------------------------------------------------------------
# Fragments of every construct the parser knows, so random soups hit its edges.
FRAGMENTS = ["```bash\n", "```", "````", "~~~sh\n", "~~~", "```json\n", "```python\n", "\n", " ", "x",
             "ls -la", "<bash>", "</bash>", "<submit/>", "<submit>", "</submit>", "<tool_call>",
             "</tool_call>", '{"name": "bash", "arguments": {"command": "ls"}}', '{"name": "submit"',
             '{"tool_calls": [', "{", "}", "[", "]", '"', ":", ",", "\\boxed{", "<answer>", "</answer>",
             "submit", "\nsubmit\n", '"arguments": ', '"command": "pwd"', "\\", "é", "\x00"]
soup = st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=4), max_size=24).map("".join)
# Prose: text that opens no construct (no fence, tag, brace, bracket, backslash, submit line).
prose = st.text(st.characters(blacklist_characters="`~<{[\\", blacklist_categories=("Cs",)), max_size=40).filter(
    lambda s: not re.search(r"^[ \t]*submit[ \t]*$", s, re.IGNORECASE | re.MULTILINE))
commands = st.text(max_size=40) | st.lists(st.sampled_from(FRAGMENTS), max_size=8).map("".join)


def longest_run(text: str, ch: str) -> int:
    runs = re.findall(f"{re.escape(ch)}+", text)
    return max(map(len, runs), default=0)


def fenced(cmd: str, lang: str = "bash") -> str:
    """A fence longer than any backtick run in ``cmd``, as CommonMark needs."""
    fence = "`" * max(3, longest_run(cmd, "`") + 1)
    return f"{fence}{lang}\n{cmd}\n{fence}"


def json_call(cmd: str, shape: int, ascii_only: bool) -> str:
    args = {"command": cmd}
    call = [{"name": "bash", "arguments": args}, {"name": "bash", "parameters": args},
            {"type": "function", "function": {"name": "bash", "arguments": json.dumps(args)}}][shape % 3]
    value = [call, [call], {"tool_calls": [call]}][shape // 3]
    return json.dumps(value, ensure_ascii=ascii_only)


@st.composite
def bash_actions(draw, cmd_strategy=commands):
    """``(text, command)``: one bash tool action in one of the accepted forms."""
    cmd = draw(cmd_strategy)
    form = draw(st.sampled_from(["fence", "tilde", "tag", "json", "tool_call", "json_fence"]))
    if form == "fence":
        return fenced(cmd, draw(st.sampled_from(["bash", "sh", "shell", "console", "BASH"]))), cmd.strip("\n")
    if form == "tilde":
        fence = "~" * max(3, longest_run(cmd, "~") + 1)
        return f"{fence}sh\n{cmd}\n{fence}", cmd.strip("\n")
    if form == "tag":
        assume("</bash>" not in cmd)
        return f"<bash>{cmd}</bash>", cmd.strip()
    text = json_call(cmd, draw(st.integers(0, 8)), draw(st.booleans()))
    if form == "tool_call":
        assume("</tool_call>" not in text)  # tags cannot be escaped: the first closing tag ends it
        return f"<tool_call>\n{text}\n</tool_call>", cmd
    if form == "json_fence":
        return f"```json\n{text}\n```", cmd
    return text, cmd


def check_coherent(action: Action) -> None:
    assert isinstance(action, Action)
    assert action.kind in ("bash", "submit", "answer", "invalid")
    assert action.valid == (action.kind != "invalid")
    if action.kind == "bash":
        assert isinstance(action.command, str) and action.command.strip() and action.error is None
    elif action.kind == "answer":
        assert isinstance(action.answer, str) and action.answer.strip() and action.command is None
    elif action.kind == "submit":
        assert action.command is None and action.error is None
    else:
        assert isinstance(action.error, str) and action.error and action.command is None


# ---- never crashes -------------------------------------------------------------------------
@PROPS
@given(soup | st.text())
def test_any_text_parses_to_a_coherent_action(text):
    action = parse_action(text)
    check_coherent(action)
    if action.kind == "bash":  # a command comes from the text, never from nowhere
        assert all(line in text or json.dumps(line)[1:-1] in text for line in action.command.split("\n"))
    assert parse_action(text) == action  # deterministic


CALL = '{"name": "bash", "arguments": {"command": "ls"}}'


@PROPS
@given(st.integers(1, 5000), st.sampled_from(["[", "{\"a\": ", "[{\"b\": "]),
       st.sampled_from(["{}", "<tool_call>{}</tool_call>", "```json\n{}\n```", "{{\"x\": {}}}", "text {} text"]),
       st.sampled_from([CALL, '"s"', "1", ""]), st.booleans())
def test_deeply_nested_json_is_no_crash(depth, opener, context, inner, closed):
    """Nesting deeper than Python's recursion limit: an answer, never a RecursionError."""
    closer = {"[": "]", '{"a": ': "}", '[{"b": ': "}]"}[opener]
    value = opener * depth + inner + (closer * depth if closed else "")
    check_coherent(parse_action(context.format(value)))


@PROPS
@given(st.none() | st.binary() | st.integers() | st.lists(st.text()) | st.dictionaries(st.text(), st.text()))
def test_non_text_is_invalid_not_an_exception(value):
    check_coherent(action := parse_action(value))
    assert action.kind == "invalid"


# ---- every accepted form round-trips -------------------------------------------------------
@PROPS
@given(bash_actions(), prose, prose)
def test_one_bash_action_in_prose_is_that_command(action, before, after):
    text, cmd = action
    got = parse_action(f"{before}\n{text}\n{after}")
    if cmd.strip():
        assert got == bash(cmd)
    else:  # an empty or blank command is never run
        assert got.kind == "invalid"


@PROPS
@given(prose, st.sampled_from(["<submit/>", "<submit />", "<submit></submit>", "submit", "SUBMIT",
                               '{"name": "submit", "arguments": {}}']), prose)
def test_submit_forms_in_prose(before, form, after):
    assert parse_action(f"{before}\n{form}\n{after}") == Action(kind="submit")


@PROPS
@given(st.text(max_size=30), prose)
def test_submit_answer_is_verbatim(answer, before):
    assume("</submit>" not in answer)
    got = parse_action(f"{before}\n<submit>{answer}</submit>")
    assert got == Action(kind="submit", answer=answer.strip() or None)
    via_json = json.dumps({"name": "submit", "arguments": {"answer": answer}})
    assert parse_action(f"{before}\n{via_json}") == Action(kind="submit", answer=answer)


balanced = st.recursive(st.text(st.characters(blacklist_characters="{}\\`~<[", blacklist_categories=("Cs",)),
                                max_size=8),
                        lambda inner: st.lists(inner, max_size=3).map(lambda xs: "{" + "".join(xs) + "}"),
                        max_leaves=6)


@PROPS
@given(st.lists(st.tuples(prose, balanced, st.booleans()), min_size=1, max_size=4), prose)
def test_the_last_answer_counts(answers, tail):
    text = "".join(f"{p}\\boxed{{{a}}}" if boxed else f"{p}<answer>{a}</answer>" for p, a, boxed in answers)
    last = answers[-1][1].strip()
    got = parse_action(text + tail)
    assert got == Action(kind="answer", answer=last) if last else got.kind == "invalid"


# ---- never a malformed action --------------------------------------------------------------
@PROPS
@given(bash_actions(), st.one_of(bash_actions(), st.sampled_from([("<submit/>", None), ("submit", None)])), prose)
def test_two_tool_actions_are_invalid(first, second, between):
    got = parse_action(f"{first[0]}\n{between}\n{second[0]}")
    assert got.kind == "invalid" and "exactly one action" in got.error


@PROPS
@given(bash_actions(), prose, st.data())
def test_a_cut_off_bash_block_or_tag_never_runs(action, before, data):
    """A generation cut off inside a fenced bash block or a <bash> tag is invalid: running
    half a command is unsafe (the tool-call JSON forms are covered by 'never from nowhere')."""
    text, _ = action
    assume(text.startswith(("```", "~~~", "<bash>")))
    cut = data.draw(st.integers(0, len(text) - 1))
    got = parse_action(f"{before}\n{text[:cut]}")
    assert got.kind == "invalid"


@PROPS
@given(st.lists(bash_actions() | soup.map(lambda s: (s, None)), min_size=1, max_size=3),
       st.sampled_from(["python", "html", "text", "diff", "", "json"]))
def test_quoted_code_is_never_a_tool_action(inside, lang):
    """Anything inside a non-bash fence (long enough to hold it) is quoted code."""
    body = "\n".join(t for t, _ in inside)
    quoted = fenced(body, lang)
    if lang in ("json", ""):  # a json (or plain) block holding a tool call is that call
        try:
            obj = json.loads(body)
        except ValueError:
            obj = None
        assume(obj is None)
    assert parse_action(quoted).kind == "invalid"  # no action, and no answer either: all of it is quoted


TOOLISH = ["name", "arguments", "parameters", "function", "tool_calls", "type", "command", "bash", "submit"]


@PROPS
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=6) | st.sampled_from(TOOLISH),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.sampled_from(TOOLISH) | st.text(max_size=6), inner, max_size=3),
                    max_leaves=8).filter(lambda v: isinstance(v, (dict, list))), prose)
def test_json_data_that_is_not_a_tool_call_is_not_an_action(value, before):
    def tool_like(v):
        if isinstance(v, list):
            return bool(v) and all(tool_like(x) for x in v)
        return isinstance(v, dict) and ("tool_calls" in v or isinstance(v.get("function"), dict)
                                        or ("name" in v and ("arguments" in v or "parameters" in v)))
    assume(not tool_like(value))
    # Known gap: a list whose first item is a number, bool or null is no JSON candidate (so
    # "\boxed{[0, 1]}" stays an answer), and its items are read one by one.
    assume(not (isinstance(value, list) and value and not isinstance(value[0], (dict, list, str))))
    got = parse_action(f"{before} {json.dumps(value)} {before}")
    assert got == Action(kind="invalid", error="no action found in the reply")


@PROPS
@given(st.text(st.sampled_from(" \t\n\r\x0b\x0c\u00a0\u2003"), max_size=8),
       st.sampled_from(["fence", "tag", "json"]))
def test_a_blank_command_is_invalid(blank, form):
    text = {"fence": f"```bash\n{blank}\n```", "tag": f"<bash>{blank}</bash>",
            "json": json.dumps({"name": "bash", "arguments": {"command": blank}})}[form]
    got = parse_action(text)
    assert got.kind == "invalid" and got.error
