"""logquiz: answer a question about /workspace/access.log, exploring it with bash.

A complete env package's code, to copy (docs/env-contract.md): a ``GemEnv`` subclass with
``_reset`` (pick a task, give the agent a fresh sandbox of the env's image) and ``_step``
(run a command, or grade an answer). The hub constructs it as
``LogQuizEnv(image="hub:logquiz@1.0.0", tasks_file=<host path>, max_turns=6, **make_kwargs)``.
"""

from __future__ import annotations

from typing import Any

from rockroll.gem.actions import TOOL_FORMATS, parse_action
from rockroll.gem.core import GemEnv, InfraError
from rockroll.gem.tools import check_task_id, format_command_result
from rockroll.sandbox import SandboxError, SandboxSpec, open_sandbox

from logquiz_checker import grade, load_tasks

FORMATS = [TOOL_FORMATS[0], "<answer>...</answer> with your final answer"]


class LogQuizEnv(GemEnv):
    """Questions about a web server's access log; reward 1.0 for the right answer."""

    # a sandbox that fails is the env's failure: reported in info["infra_error"], not a 0 reward
    infra_errors = (InfraError, SandboxError)

    def __init__(self, *, image: str, tasks_file: str, task_ids: list[str] | None = None,
                 command_timeout: float = 10.0, **kwargs: Any):
        super().__init__(**kwargs)  # max_turns, format_penalty, ... (GemEnv's)
        self.image = image
        self.tasks = load_tasks(tasks_file)
        if task_ids is not None:
            for task_id in task_ids:
                check_task_id(task_id, self.task_ids, "task_ids")
            self.tasks = [t for t in self.tasks if t.id in set(task_ids)]
        self.command_timeout = command_timeout
        self.task = None
        self._sandbox = None  # opened on the first reset, reset to the image on the next ones

    @property
    def task_ids(self) -> list[str]:
        return [t.id for t in self.tasks]

    def _reset(self, task_id, options):
        if task_id is None:  # drawn with the env's RNG: the same seed gives the same task
            self.task = self.tasks[int(self.np_random.integers(len(self.tasks)))]
        else:
            check_task_id(task_id, self.task_ids)
            self.task = {t.id: t for t in self.tasks}.get(task_id)
            if self.task is None:
                raise ValueError(f"unknown task_id {task_id!r}; ids: {', '.join(self.task_ids)}")
        if self._sandbox is None:
            self._sandbox = open_sandbox(SandboxSpec(image=self.image, memory_mb=256, pids=64))
        else:
            self._sandbox.reset()  # back to the image: nothing of the last episode is left
        prompt = (f"{self.task.question}\nThe log is /workspace/access.log (your working folder). "
                  f"Explore it with one bash command a turn, then give your answer.\nFormats: "
                  + "; ".join(FORMATS))
        return prompt, {"task_id": self.task.id}

    def _step(self, action: str):
        act = parse_action(action)
        if act.kind == "bash":
            result = self._sandbox.run(act.command, timeout=self.command_timeout)
            return format_command_result(result, self.max_obs_chars), 0.0, False, {}
        if act.kind == "answer":
            reward = grade(self.task, act.answer)
            return ("correct" if reward else "wrong"), reward, True, {"success": reward == 1.0}
        return self._format_error(act.error or f"{act.kind} is not an action here", FORMATS)

    def close(self):
        if self._sandbox is not None:
            self._sandbox.close()
            self._sandbox = None
        super().close()
