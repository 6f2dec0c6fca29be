"""openai-tool-agent: a small tool-calling agent on the official ``openai`` client.

    python3 openai_tool_agent.py TASK_FILE

It reads its task from TASK_FILE, then loops: ask the model (``OPENAI_BASE_URL`` /
``OPENAI_API_KEY`` from the environment, as every OpenAI program does), run each ``bash``
tool call the model makes and send back its output, until the model answers without a
tool call or ``AGENT_MAX_TURNS`` model calls were made. Exit 0 then; the grader decides
how well it went. Environment: ``AGENT_MODEL`` (default ``rockroll``), ``AGENT_STREAM=1``
(streamed calls), ``AGENT_TOOL_TIMEOUT`` (seconds per command, default 60).

Shipped with rockroll (``rockroll.gem.agents``) and installed into env images with its
client; it is the agent ``rock/Agent-v0`` runs by default. Python 3.8+ stdlib + openai.
"""

import json
import os
import subprocess
import sys

import openai

SYSTEM = ("You are an autonomous agent in a Linux sandbox (no network). Solve the task with the bash tool: "
          "each call runs one command in the working directory and returns its exit code and output. "
          "When the task is done, reply with a short summary and no tool call.")
TOOLS = [{"type": "function", "function": {
    "name": "bash", "description": "Run a bash command in the working directory; returns exit code, stdout, stderr.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
MAX_OUTPUT = 8000


def run_bash(command, timeout):
    """A command's outcome as the model reads it (never raises)."""
    try:
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=timeout,
                              errors="replace")
    except subprocess.TimeoutExpired:
        return "exit code: timeout (killed after %ss)" % timeout
    out = "exit code: %d\nstdout:\n%s\nstderr:\n%s" % (done.returncode, done.stdout, done.stderr)
    return out if len(out) <= MAX_OUTPUT else out[:MAX_OUTPUT // 2] + "\n[...]\n" + out[-MAX_OUTPUT // 2:]


def tool_result(call, timeout):
    """The tool message answering one tool call: a bad call is told to the model, not raised."""
    name = call["function"]["name"]
    try:
        args = json.loads(call["function"]["arguments"] or "{}")
        command = args["command"]
        if not isinstance(command, str):
            raise TypeError("command must be a string")
    except (ValueError, KeyError, TypeError) as e:
        content = "error: bad arguments for %s (%s); expected {\"command\": \"...\"}" % (name, e)
    else:
        content = run_bash(command, timeout) if name == "bash" else "error: unknown tool %r" % name
    return {"role": "tool", "tool_call_id": call["id"], "content": content}


def ask(client, model, messages, stream):
    """One model call: (content, tool calls as dicts)."""
    if not stream:
        msg = client.chat.completions.create(model=model, messages=messages, tools=TOOLS).choices[0].message
        calls = [{"id": c.id, "type": "function", "function": {"name": c.function.name,
                                                               "arguments": c.function.arguments}}
                 for c in msg.tool_calls or []]
        return msg.content, calls
    content, calls = [], {}
    for chunk in client.chat.completions.create(model=model, messages=messages, tools=TOOLS, stream=True):
        for choice in chunk.choices:
            content.append(choice.delta.content or "")
            for t in choice.delta.tool_calls or []:
                c = calls.setdefault(t.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
                c["id"] = t.id or c["id"]
                c["function"]["name"] += (t.function.name or "") if t.function else ""
                c["function"]["arguments"] += (t.function.arguments or "") if t.function else ""
    return "".join(content) or None, [calls[i] for i in sorted(calls)]


def main():
    with open(sys.argv[1]) as f:
        task = f.read()
    model = os.environ.get("AGENT_MODEL", "rockroll")
    max_turns = int(os.environ.get("AGENT_MAX_TURNS", "30"))
    timeout = float(os.environ.get("AGENT_TOOL_TIMEOUT", "60"))
    stream = os.environ.get("AGENT_STREAM") == "1"
    # No retries: a model call is not idempotent for a trainer (each one is a sample).
    client = openai.OpenAI(max_retries=0, timeout=float(os.environ.get("AGENT_CALL_TIMEOUT", "3600")))
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
    for _ in range(max_turns):
        content, calls = ask(client, model, messages, stream)
        turn = {"role": "assistant", "content": content}
        if calls:
            turn["tool_calls"] = calls
        messages.append(turn)
        if not calls:
            print(content or "")
            return 0
        messages.extend(tool_result(call, timeout) for call in calls)
    print("turn limit reached")
    return 0


if __name__ == "__main__":
    sys.exit(main())
