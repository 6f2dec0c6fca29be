"""A tiny GEM env shipped inside its hub package: the answer is the number of lines of a
file that exists only in the env's image."""

import json

from rockroll.gem.core import GemEnv
from rockroll.sandbox import SandboxSpec, open_sandbox


class CounterEnv(GemEnv):
    """Answer with the number of lines in /opt/counter/data.txt."""

    def __init__(self, *, image: str, tasks_file: str | None = None, private_dir: str | None = None, **kwargs):
        super().__init__(**kwargs)  # private_dir: what a package with `private` files is given
        self.image, self.tasks_file, self.private_dir = image, tasks_file, private_dir
        self.tasks = [json.loads(l) for l in open(tasks_file)] if tasks_file else []
        self.answer = None

    def _reset(self, task_id, options):
        with open_sandbox(SandboxSpec(image=self.image, memory_mb=256)) as sb:
            text = sb.read_file("/opt/counter/data.txt").decode()
        self.answer = len(text.splitlines())
        return f"How many lines?\n{text}", {"tasks": len(self.tasks)}

    def _step(self, action):
        if not action.strip().isdigit():
            return self._format_error("not a number", ["<integer>"])
        ok = int(action) == self.answer
        return ("correct" if ok else "wrong"), float(ok), True, {}
