"""A self-written agent on the official openai client (docs/agents.md): it plays the corridor
game of the `corridor` task set (./play in its working folder), one model call a move.

    python3 mover.py TASK_FILE
"""

import subprocess
import sys

import openai  # OPENAI_BASE_URL and OPENAI_API_KEY come from the sandbox's environment

task = open(sys.argv[1]).read()
client = openai.OpenAI()
state = subprocess.run(["./play"], capture_output=True, text=True).stdout
messages = [{"role": "user", "content": task + "\n" + state}]
for _ in range(8):
    reply = client.chat.completions.create(model="mine", messages=messages).choices[0].message.content
    done = subprocess.run(["./play", reply.strip()], capture_output=True, text=True)
    if done.returncode == 100:  # the game is over
        break
    messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": done.stdout}]
