"""The shared action parser: every accepted form, the ambiguity rules, malformed input."""

from __future__ import annotations

import json

import pytest
from rockroll.gem.actions import TOOL_FORMATS, Action, format_error_message, parse_action

FENCE = "```"


def bash(cmd: str) -> Action:
    return Action(kind="bash", command=cmd)


# ---- fenced blocks -------------------------------------------------------------------------
@pytest.mark.parametrize("lang", ["bash", "sh", "shell", "console", "BASH"])
def test_fenced_bash_languages(lang):
    assert parse_action(f"Let me look.\n{FENCE}{lang}\nls -la\n{FENCE}\nThen decide.") == bash("ls -la")


def test_fenced_multiline_command_keeps_inner_newlines_and_indent():
    text = f"{FENCE}bash\nfor f in *; do\n    echo $f\ndone\n{FENCE}"
    assert parse_action(text) == bash("for f in *; do\n    echo $f\ndone")


def test_indented_fence_is_dedented():
    text = f"1. run:\n   {FENCE}bash\n   cd /tmp\n   ls\n   {FENCE}"
    assert parse_action(text) == bash("cd /tmp\nls")


def test_tilde_fence_and_trailing_info():
    assert parse_action("~~~bash\npwd\n~~~") == bash("pwd")
    assert parse_action(f"{FENCE}bash title=run\npwd\n{FENCE}") == bash("pwd")


def test_plain_and_other_language_fences_are_prose():
    text = f"Here is the file:\n{FENCE}python\nprint('hi')\n{FENCE}\n{FENCE}\nsome output\n{FENCE}\n<bash>python x.py</bash>"
    assert parse_action(text) == bash("python x.py")
    assert parse_action(f"{FENCE}python\nprint(1)\n{FENCE}").kind == "invalid"


def test_nested_backticks_need_a_longer_fence():
    inner = f"cat > README.md <<'EOF'\n{FENCE}python\nx = 1\n{FENCE}\nEOF"
    assert parse_action(f"````bash\n{inner}\n````") == bash(inner)
    # with a three-backtick fence the inner bare ``` closes the block (CommonMark), and the
    # rest ("EOF" and a stray ```) is prose containing an unclosed plain fence: not an action
    action = parse_action(f"{FENCE}bash\n{inner}\n{FENCE}")
    assert action == bash(f"cat > README.md <<'EOF'\n{FENCE}python\nx = 1")


def test_inline_backticks_inside_command():
    assert parse_action(f"{FENCE}bash\necho `date` ``x``\n{FENCE}") == bash("echo `date` ``x``")


def test_one_line_fence_is_not_a_block():
    assert parse_action(f"{FENCE}bash ls{FENCE}").kind == "invalid"


def test_unclosed_and_empty_bash_blocks_are_invalid():
    action = parse_action(f"{FENCE}bash\nrm -rf build")
    assert action.kind == "invalid" and "unclosed" in action.error
    action = parse_action(f"{FENCE}bash\n\n   \n{FENCE}")
    assert action.kind == "invalid" and "empty" in action.error


# ---- tags ----------------------------------------------------------------------------------
def test_bash_tag():
    assert parse_action("I will <bash>\ngrep -r foo .\n</bash> now") == bash("grep -r foo .")


def test_bash_tag_malformed():
    assert "unclosed" in parse_action("<bash>ls").error
    assert "empty" in parse_action("<bash>  </bash>").error


# ---- JSON tool calls -----------------------------------------------------------------------
def test_json_tool_call_plain():
    call = {"name": "bash", "arguments": {"command": "ls /"}}
    assert parse_action(json.dumps(call)) == bash("ls /")
    assert parse_action(f"Calling the tool: {json.dumps(call)} and waiting.") == bash("ls /")


def test_json_tool_call_openai_function_with_string_arguments():
    call = {
        "type": "function",
        "function": {"name": "bash", "arguments": json.dumps({"command": "echo 'hi'"})},
    }
    assert parse_action(json.dumps(call)) == bash("echo 'hi'")


def test_json_tool_call_list_and_tool_calls_key_and_parameters():
    call = {"name": "bash", "parameters": {"command": "whoami"}}
    assert parse_action(json.dumps([call])) == bash("whoami")
    assert parse_action(json.dumps({"tool_calls": [call]})) == bash("whoami")
    assert parse_action(f"<tool_call>\n{json.dumps(call)}\n</tool_call>") == bash("whoami")
    assert parse_action(f"{FENCE}json\n{json.dumps(call)}\n{FENCE}") == bash("whoami")


def test_json_tool_call_unicode():
    call = {"name": "bash", "arguments": {"command": "echo 'héllo wörld ✓ 你好'"}}
    assert parse_action(json.dumps(call, ensure_ascii=False)) == bash("echo 'héllo wörld ✓ 你好'")
    assert parse_action(json.dumps(call)) == bash("echo 'héllo wörld ✓ 你好'")


def test_json_that_is_not_a_tool_call_is_ignored():
    text = 'package.json has {"name": "demo", "version": "1.0"}\n<bash>npm test</bash>'
    assert parse_action(text) == bash("npm test")


@pytest.mark.parametrize(
    "text, fragment",
    [
        ('<tool_call>{"name": "bash", "arguments": {"command": }</tool_call>', "not valid JSON"),
        ('<tool_call>{"name": "bash"', "unclosed <tool_call>"),
        ('{"name": "bash", "arguments": "{not json"}', "arguments are not valid JSON"),
        ('{"name": "bash", "arguments": {"command": ""}}', "non-empty"),
        ('{"name": "bash", "arguments": {"cmd": "ls"}}', "non-empty"),
        ('{"name": "bash", "arguments": ["ls"]}', "must be a JSON object"),
        ('{"name": "python", "arguments": {"code": "1"}}', "unknown tool 'python'"),
        ('{"tool_calls": []}', "empty tool call list"),
        ('<tool_call>"just a string"</tool_call>', "must be a JSON object"),
    ],
)
def test_malformed_tool_calls(text, fragment):
    action = parse_action(text)
    assert action.kind == "invalid" and fragment in action.error


def test_truncated_json_without_tool_shape_is_no_action():
    action = parse_action('{"name": "bash", "arguments": {"command": "ls"')
    assert action.kind == "invalid" and action.error == "no action found in the reply"


# ---- submit --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, answer",
    [
        ("All done.\n<submit/>", None),
        ("<submit />", None),
        ("<submit></submit>", None),
        ("<submit> 42 </submit>", "42"),
        ("I fixed it.\nsubmit\n", None),
        ("  SUBMIT  ", None),
        ('{"name": "submit", "arguments": {}}', None),
        ('{"name": "submit", "arguments": {"answer": 7}}', "7"),
        ('{"name": "submit", "arguments": null}', None),
    ],
)
def test_submit_forms(text, answer):
    assert parse_action(text) == Action(kind="submit", answer=answer)


def test_submit_word_inside_a_sentence_or_command_is_not_submit():
    assert parse_action("I will submit later").kind == "invalid"
    assert parse_action(f"{FENCE}bash\nsubmit\n{FENCE}") == bash("submit")


# ---- answers -------------------------------------------------------------------------------
def test_boxed_answers_last_wins_and_nested_braces():
    assert parse_action(r"First \boxed{1}, no wait: \boxed{\frac{3}{4}}.") == Action(
        kind="answer", answer=r"\frac{3}{4}"
    )
    assert parse_action(r"\boxed{ {a}{b} }").answer == "{a}{b}"


def test_answer_tag_and_mixed_order():
    assert parse_action("<answer> Left </answer>") == Action(kind="answer", answer="Left")
    assert parse_action(r"<answer>1</answer> then \boxed{2}").answer == "2"
    assert parse_action(r"\boxed{2} then <answer>1</answer>").answer == "1"


def test_unbalanced_or_empty_answers():
    assert parse_action(r"\boxed{3").kind == "invalid"
    assert "empty" in parse_action("<answer>  </answer>").error


def test_tool_action_wins_over_answer_and_answers_in_code_are_ignored():
    assert parse_action(r"The answer is \boxed{4}. <bash>echo 4</bash>") == bash("echo 4")
    assert parse_action(f"{FENCE}latex\n\\boxed{{9}}\n{FENCE}").kind == "invalid"


@pytest.mark.parametrize("text, answer", [
    # what SmolLM2-135M-Instruct writes on Math-v0 before any training
    ("First, we multiply 7 by 6: 7 * 6 = 42.\n\nSo, the final answer is 102.", "102"),
    ("**Answer:** Down", "Down"),
    ("The answer is $3.5$.", "3.5"),
    ("The answer is: \\(3/4\\)", "3/4"),
    ("answer = -18, because 5 - 23 is -18", "-18"),
    ("the answer is 7 since 3 + 4 = 7", "7"),
    ("Answer: 42\nI checked it twice.", "42"),
    ("My answer is 3. No wait, the answer is 4.", "4"),  # the last statement counts
])
def test_a_stated_answer_is_read_from_free_form_prose(text, answer):
    assert parse_action(text) == Action(kind="answer", answer=answer)


def test_a_stated_answer_yields_to_boxed_and_tags_and_code_hides_it():
    assert parse_action(r"The answer is 3, so \boxed{4}").answer == "4"
    assert parse_action("<answer>Left</answer>. The answer is Right.").answer == "Left"
    assert parse_action(f"{FENCE}text\nanswer: 5\n{FENCE}").kind == "invalid"
    for prose in ("I do not know the answer.", "answers vary", "The answer is: ", "Answer: **"):
        assert parse_action(prose) == Action(kind="invalid", error="no action found in the reply"), prose


# ---- ambiguity -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text",
    [
        f"{FENCE}bash\nls\n{FENCE}\n{FENCE}bash\npwd\n{FENCE}",
        f"{FENCE}bash\nls\n{FENCE}\n<submit/>",
        "<bash>ls</bash><bash>pwd</bash>",
        '<bash>ls</bash> {"name": "bash", "arguments": {"command": "pwd"}}',
        json.dumps(
            {
                "tool_calls": [
                    {"name": "bash", "arguments": {"command": "a"}},
                    {"name": "submit", "arguments": {}},
                ]
            }
        ),
    ],
)
def test_more_than_one_action_is_invalid(text):
    action = parse_action(text)
    assert action.kind == "invalid" and "exactly one action" in action.error


def test_multiple_with_a_broken_one_mentions_the_problem():
    action = parse_action(f"<bash>ls</bash>\n{FENCE}bash\n")
    assert action.kind == "invalid" and "unclosed" in action.error


# ---- degenerate input ----------------------------------------------------------------------
@pytest.mark.parametrize("text", ["", "   \n\t", "hello there", "```", "<bash", "{", "[[[", "\\boxed"])
def test_no_action(text):
    action = parse_action(text)
    assert action.kind == "invalid" and action.error and not action.valid


def test_non_string_input():
    assert parse_action(None).kind == "invalid"  # type: ignore[arg-type]
    assert parse_action(b"ls").kind == "invalid"  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "text",
    [
        "`" * 1_000_000,
        "```bash\n" * 150_000,
        "<bash>" * 150_000,
        "\\boxed{" * 150_000,
        '{"name": "bash", ' * 60_000,
        "{" * 1_000_000,
        "a" * 1_000_000,
        "<tool_call>" * 90_000,
        "submit " * 150_000,
        "x\n" * 500_000,
        '{"a": "b"} ' * 100_000,
        '{"a": "' * 100_000,
    ],
    ids=[
        "backticks",
        "fences",
        "bash-tags",
        "boxed",
        "json-prefixes",
        "braces",
        "letters",
        "tool-tags",
        "submits",
        "lines",
        "json-values",
        "json-unclosed",
    ],
)
def test_huge_inputs_parse(text):
    # Only that it finishes (the suite's timeout guards against catastrophic backtracking).
    assert isinstance(parse_action(text), Action)


def test_huge_command_round_trips():
    cmd = "echo " + "y" * 1_000_000
    assert parse_action(f"{FENCE}bash\n{cmd}\n{FENCE}") == bash(cmd)


def test_format_error_message_lists_formats():
    message = format_error_message(TOOL_FORMATS, "no action found in the reply")
    assert message.startswith("Invalid action: no action found in the reply")
    assert all(f"- {form}" in message for form in TOOL_FORMATS)
    assert format_error_message(["x"]).startswith("Invalid action format.")


# ---- quoting: the construct that starts first owns its whole span -----------------------------
def call(command: str) -> str:
    return json.dumps({"name": "bash", "arguments": {"command": command}})


@pytest.mark.parametrize(
    "command",
    [
        "echo '<bash>rm -rf x</bash>' > t.html",
        "echo '<submit/>' >> notes.txt",
        "printf '<submit>done</submit>\\n<tool_call>{}'",
        "echo '```bash' > README.md",
        'echo \'{"name": "bash", "arguments": {"command": "rm -rf /"}}\' > call.json',
        "grep -n '^submit$' log.txt",
    ],
)
def test_tags_and_json_inside_a_json_tool_call_are_its_command(command):
    assert parse_action(call(command)) == bash(command)
    assert parse_action(f"Running it:\n{call(command)}\nthen I look.") == bash(command)
    assert parse_action(f"<tool_call>\n{call(command)}\n</tool_call>") == bash(command)


def test_a_closing_tag_inside_a_tagged_command_ends_the_tag():
    # Tags cannot be escaped: the first closing tag ends the span. For a tool call that
    # leaves broken JSON, an error -- never another command.
    action = parse_action(f"<tool_call>{call('echo </tool_call>')}</tool_call>")
    assert action.kind == "invalid" and "not valid JSON" in action.error


def test_the_reported_wrong_command_cases():
    text = '{"name":"bash","arguments":{"command":"echo \'<bash>rm -rf x</bash>\' > t.html"}}'
    assert parse_action(text) == bash("echo '<bash>rm -rf x</bash>' > t.html")
    text = '{"name":"bash","arguments":{"command":"echo done <submit/>"}}'
    assert parse_action(text) == bash("echo done <submit/>")


def test_json_and_fences_inside_a_bash_tag_are_its_command():
    command = f"echo '{call('rm -rf /')}' > call.json"
    assert parse_action(f"<bash>{command}</bash>") == bash(command)
    heredoc = f"cat > a.md <<'EOF'\n{FENCE}bash\nrm -rf x\n{FENCE}\n<submit/>\nsubmit\nEOF"
    assert parse_action(f"Writing the doc.\n<bash>\n{heredoc}\n</bash>") == bash(heredoc)


def test_tags_and_json_inside_a_fenced_block_are_its_command():
    command = f"echo '<bash>rm -rf x</bash>' '<submit/>' '{call('pwd')}'"
    assert parse_action(f"{FENCE}bash\n{command}\n{FENCE}") == bash(command)
    # quoted code of another language is opaque too: nothing in it is an action
    assert parse_action(f"{FENCE}html\n<bash>rm -rf x</bash>\n{FENCE}\n<bash>ls</bash>") == bash("ls")


def test_a_submit_answer_holds_its_content_verbatim():
    code = f"{FENCE}python\ndef f():\n    return '<bash>ls</bash>'\n{FENCE}"
    assert parse_action(f"Done.\n<submit>\n{code}\n</submit>") == Action(kind="submit", answer=code)
    answer = json.dumps({"name": "submit", "arguments": {"answer": "<bash>ls</bash>"}})
    assert parse_action(answer) == Action(kind="submit", answer="<bash>ls</bash>")


def test_json_data_that_is_not_a_tool_call_is_quoted():
    text = 'The page is {"html": "<bash>rm -rf x</bash>"}.\n<bash>cat page.json</bash>'
    assert parse_action(text) == bash("cat page.json")


def test_constructs_after_a_span_still_count():
    assert parse_action(f"{call('ls')}\n<bash>pwd</bash>").kind == "invalid"
    assert parse_action(f"<bash>echo '{{\"name\": 1}}'</bash> and {call('pwd')}").error.startswith("found 2 actions")


# ---- boundaries ----------------------------------------------------------------------------
# Each test below pins a case that a mutant of actions.py got past before (docs/testing.md,
# "Mutation score").
def test_json_list_in_a_fence_and_an_empty_list_is_data():
    call = {"name": "bash", "arguments": {"command": "ls"}}
    assert parse_action(f"{FENCE}json\n{json.dumps([call])}\n{FENCE}") == bash("ls")
    # an empty JSON list is quoted data, not an (empty) tool call list: the answer counts
    assert parse_action(f"{FENCE}json\n[]\n{FENCE}\n\\boxed{{3}}") == Action(kind="answer", answer="3")


def test_unclosed_tag_errors_name_the_missing_closer():
    assert parse_action("<bash>ls").error == "unclosed <bash> tag (missing </bash>)"
    assert parse_action('<tool_call>{"name": "bash"').error == "unclosed <tool_call> tag"


def test_unclosed_answer_tag_is_ignored():
    assert parse_action("<answer>5</answer> then <answer>7").answer == "5"


def test_backslash_commands_outside_boxed_open_nothing():
    # "\ldots" is not "\boxed{": the stray "}" after it closes nothing, the answer stays 1
    assert parse_action(r"\boxed{1} and \ldots then 9}").answer == "1"


def test_actions_are_frozen_and_hashable():
    assert len({bash("ls"), bash("ls")}) == 1
    with pytest.raises(AttributeError):
        bash("ls").command = "rm -rf /"


def test_unclosed_bash_fence_on_the_last_line():
    # no newline after the opening line: still a ```bash fence, and unclosed
    assert parse_action("run this:\n```bash").error == "unclosed ```bash block (missing the closing ```)"


def test_json_decode_failures_are_bounded_at_64():
    # every '{"x' line is a JSON candidate that fails to decode (a raw newline in a string)
    call = '{"name": "bash", "arguments": {"command": "ls"}}'
    assert parse_action('{"x\n' * 63 + call) == bash("ls")  # 63 failures: the call is still tried
    assert parse_action('{"x\n' * 64 + call).kind == "invalid"  # the 64 allowed are spent: prose


def test_last_answer_tag_wins():
    assert parse_action("<answer>1</answer> no, <answer>2</answer>").answer == "2"


def test_empty_bash_fence_is_empty_not_unclosed():
    assert parse_action(f"{FENCE}bash\n{FENCE}").error == "the ```bash block is empty"


def test_tool_call_json_in_another_language_fence_is_quoted_code():
    call = '{"name": "bash", "arguments": {"command": "ls"}}'
    assert parse_action(f"{FENCE}python\n{call}\n{FENCE}").error == "no action found in the reply"


def test_a_closing_tag_is_not_scanned_again():
    # the submit tag's span ends after </submit>; a JSON value that would start inside the
    # tag (at its '{"') is never decoded, so the tool call it would hold is prose
    text = '<submit>{"</submit>": 1, "name": "bash", "arguments": {"command": "ls"}}'
    assert parse_action(text) == Action(kind="submit", answer='{"')


def test_boxed_content_starting_with_a_brace():
    assert parse_action(r"\boxed{{1}}").answer == "{1}"


def test_several_actions_report_the_first_invalid_one():
    action = parse_action("<bash></bash> then <tool_call>nope</tool_call>")
    assert action.error.startswith("found 2 actions (invalid, invalid) (the <bash></bash> tag is empty)")
