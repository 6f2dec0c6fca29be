"""``rock/Terminal-v0``: do a job in a Linux sandbox with bash; a hidden checker grades it.

Each task has an instruction, a setup script (prepares files, repositories, processes),
a checker script and an oracle solution (used by the tests to prove every task is
solvable and every checker fails on the untouched setup). The checker is written into the
sandbox only at ``submit`` and runs there from the workdir: reward 1.0 iff it exits 0,
``info["checker_output"]`` holds what it printed.

The bundled tasks (``gem/data/terminal/tasks.txt``, in the format of
:func:`rockroll.gem.tools.parse_records`) cover files, text processing, git (local repos),
processes and packaging; pass ``tasks=`` for your own.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources
from typing import Any, Sequence

from rockroll.sandbox import AsyncSandbox

from .actions import TOOL_FORMATS, Action
from .core import InfraError, truncate_observation
from .tools import Evaluation, SandboxToolEnv, parse_records, select_tasks

__all__ = ["TerminalEnv", "TerminalTask", "load_terminal_tasks"]


@dataclass(frozen=True)
class TerminalTask:
    """One terminal job. Scripts are bash, run from the sandbox's workdir."""

    id: str
    category: str
    instruction: str
    setup: str
    check: str
    solution: str


@functools.cache
def load_terminal_tasks() -> tuple[TerminalTask, ...]:
    """The bundled tasks (parsed once per process)."""
    text = (resources.files(__package__) / "data" / "terminal" / "tasks.txt").read_text()
    return tuple(TerminalTask(**record) for record in parse_records(text))


def _first_observation(task: TerminalTask, workdir: str) -> str:
    formats = "\n".join(f"- {form}" for form in TOOL_FORMATS)
    return (
        f"You are in a Linux sandbox (bash, no network); the working directory is {workdir}.\n\n"
        f"Task:\n{task.instruction}\n\n"
        f"Act with exactly one action per reply, in one of these formats:\n{formats}\n"
        "Each command's exit code, stdout and stderr come back to you. When the task is done, "
        "submit: your work is then checked, and the episode ends."
    )


class TerminalEnv(SandboxToolEnv):
    """Terminal tasks in a sandbox; see the module docstring. ``task_ids`` picks a subset."""

    def __init__(
        self,
        *,
        tasks: Sequence[TerminalTask] | None = None,
        task_ids: Sequence[str] | None = None,
        check_timeout: float = 60.0,
        **kwargs: Any,
    ):
        tasks = select_tasks(load_terminal_tasks() if tasks is None else tasks, task_ids)
        super().__init__(tasks, **kwargs)
        self.check_timeout = float(check_timeout)

    async def _setup(self, sandbox: AsyncSandbox, task: TerminalTask) -> str:
        if task.setup.strip():
            result = await self._env_run(sandbox, "setup.sh", "set -e\n" + task.setup)
            if not result.ok:
                # A task that cannot be prepared is the environment's failure, not the model's.
                raise InfraError(f"setup of task {task.id!r} failed (exit {result.exit_code}): {result.stderr[-2000:]}")
        return _first_observation(task, sandbox.spec.workdir)

    def agent_instruction(self, task: TerminalTask) -> str:
        return task.instruction

    def expert_commands(self, task: TerminalTask) -> list[str]:
        return [task.solution]  # the oracle solution, one bash script

    async def _evaluate(self, sandbox: AsyncSandbox, task: TerminalTask, action: Action, text: str) -> Evaluation:
        result = await self._env_run(sandbox, "check.sh", task.check, timeout=self.check_timeout)
        passed = result.ok
        output = truncate_observation((result.stdout + result.stderr).strip(), 4000)
        verdict = "passed" if passed else ("timed out" if result.timed_out else "failed")
        observation = f"Submitted. The checker {verdict}." + (f"\n{output}" if output else "")
        info = {"checker_exit_code": result.exit_code, "checker_output": output, "success": passed}
        return Evaluation(1.0 if passed else 0.0, observation, info)
