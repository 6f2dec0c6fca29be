"""openai-chat-agent: a chat agent on the official ``openai`` client that plays a text program.

    python3 openai_chat_agent.py TASK_FILE PROGRAM [ARG...]

It runs ``PROGRAM`` to see where things stand, sends the task (TASK_FILE) and the program's
output to the model as the user, types the model's reply into the program (``PROGRAM REPLY``)
and sends what it prints next, keeping the whole conversation, until the program says it
is over. The program's protocol: print the state; exit 0 while it goes on, 100 when it is
over (anything else is a failure, and this agent exits with it). ``OPENAI_BASE_URL`` /
``OPENAI_API_KEY`` come from the environment, as for every OpenAI program; ``AGENT_MODEL``
names the model (default ``rockroll``), ``AGENT_MAX_TURNS`` bounds the calls (default 50),
``AGENT_HISTORY=N`` keeps only the first message and the last N exchanges (a sliding window,
as agents do to bound their prompts; default: the whole conversation).

Shipped with rockroll (``rockroll.gem.agents``) and installed into env images with its
client; the ``corridor`` task set of ``rock/Agent-v0`` is played with it. Python 3.8+ stdlib + openai.
"""

import os
import subprocess
import sys

import openai

OVER = 100


def play(program, *args):
    """The program's output and exit code after one move (or none: the state)."""
    done = subprocess.run(list(program) + list(args), capture_output=True, text=True, errors="replace")
    if done.returncode not in (0, OVER):
        sys.stderr.write(done.stderr)
        sys.exit(done.returncode)
    return done.stdout.strip(), done.returncode


def main(task_file, program):
    with open(task_file) as f:
        task = f.read().strip()
    client = openai.OpenAI()
    model = os.environ.get("AGENT_MODEL", "rockroll")
    state, code = play(program)
    window = os.environ.get("AGENT_HISTORY")
    first, exchanges = {"role": "user", "content": task + "\n" + state}, []
    for _ in range(int(os.environ.get("AGENT_MAX_TURNS", "50"))):
        if code == OVER:
            return 0
        if window is not None:
            exchanges = exchanges[max(0, len(exchanges) - 2 * int(window)):]
        messages = [first] + exchanges
        reply = client.chat.completions.create(model=model, messages=messages).choices[0].message.content or ""
        state, code = play(program, reply.strip())
        exchanges += [{"role": "assistant", "content": reply}, {"role": "user", "content": state}]
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: openai_chat_agent.py TASK_FILE PROGRAM [ARG...]")
    sys.exit(main(sys.argv[1], sys.argv[2:]))
