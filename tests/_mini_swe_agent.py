"""mini-swe-agent on a real ``swe-toolz`` task, for the tests that run it (through a proxied
model service, tests/gem/test_mini_swe_agent.py, or as ``rock/Agent-v0``,
tests/gem/test_agent_env.py): the task, and what a model says to it in mini-swe-agent's
text format (a THOUGHT, then one ```` ```mswea_bash_command ```` block per reply; the
agent submits with ``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``)."""

import base64
import shlex

from rockroll.gem.agents import AGENTS
from rockroll.gem.swe import SWETask, hub_swe_tasks

AGENT = AGENTS["mini-swe-agent"]
PACKAGE = "toolz==0.12.1"


def toolz_task(swe_hub: str, swe_agent_variant) -> SWETask:
    """The first toolz task of the hub, its variant with the agent built if it is missing
    (the ``swe_agent_variant`` fixture)."""
    swe_agent_variant(PACKAGE, AGENT.name)
    return sorted((t for t in hub_swe_tasks(swe_hub) if t.repo == "toolz"), key=lambda t: t.id)[0]


def reply(thought: str, command: str) -> str:
    return f"THOUGHT: {thought}\n\n```mswea_bash_command\n{command}\n```"


SUBMIT = reply("Done.", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")


def gold_fix(task: SWETask) -> list[str]:
    """Look around, apply the task's reference fix (read from the hub's hidden task data),
    run a test that was failing, submit: four replies."""
    fix = base64.b64encode(task.patch.encode()).decode()
    return [
        reply("Let me see the repository.", "git status --short && ls"),
        reply("The bug is in the library code; this patch fixes it.", f"echo {fix} | base64 -d | git apply"),
        reply("Run a test that was failing.",
              f"python3 -m pytest -q -p no:cacheprovider {shlex.quote(task.fail_to_pass[0])} 2>&1 | tail -1"),
        SUBMIT,
    ]


def wrong_fix(task: SWETask) -> list[str]:
    """A change to the buggy file that fixes nothing (a comment), then submit: two replies."""
    bug_file = task.extra["mutation"]["file"]
    return [
        reply("A comment should do.", f"printf '\\n# checked\\n' >> {shlex.quote(bug_file)} && git diff --stat"),
        SUBMIT,
    ]
