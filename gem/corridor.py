"""``corridor``: the smallest agent-native task set, for ``rock/Agent-v0`` with the
``openai-chat-agent`` (a chat agent on the official ``openai`` client).

The game (``gem/data/corridor/play``, stdlib Python, put at ``./play`` in the sandbox's
workdir by each task's setup): a corridor of five cells, the player starts inside it, one
end is the goal; each reply of the model (``Left`` / ``Right``) moves one cell; the game
is over at either end or after four moves, won only at the goal. The agent plays it
through its model calls, keeping the conversation (so its calls extend one another and
merge into one multi-turn sample); the checker reads the game's state file. The goal word
(``left`` / ``right``) is the whole task: an untrained policy wins 3/8 of the games from the
middle, and a policy blind to the goal half of them at best. It is what the CPU run of the
model service learns (``examples/agent_corridor_cpu.yaml``).
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from .terminal import TerminalEnv, TerminalTask

__all__ = ["CORRIDOR_TASKS", "CorridorTasks"]

GAME = "/opt/corridor"
_MARKER = "ROCKROLL_CORRIDOR_EOF"


def _task(goal: str, start: int) -> TerminalTask:
    play = (resources.files(__package__) / "data" / "corridor" / "play").read_text()
    state = '{"pos": %d, "goal": "%s", "moves": 0, "won": false, "over": false}' % (start, goal)
    setup = (f"mkdir -p {GAME} && cat > {GAME}/play <<'{_MARKER}'\n{play}{_MARKER}\n"
             f"chmod 755 {GAME}/play && ln -sf {GAME}/play play && echo '{state}' > {GAME}/state.json")
    check = f"python3 -c 'import json, sys; sys.exit(not json.load(open(\"{GAME}/state.json\"))[\"won\"])'"
    moves = "; ".join([f"./play {goal.title()}"] * (start if goal == "left" else 4 - start))
    return TerminalTask(id=f"{goal}-{start}", category="corridor", instruction="Walk to the goal.", setup=setup,
                        check=check, solution=moves)


#: Goal left or right, from each inner cell.
CORRIDOR_TASKS = tuple(_task(goal, start) for goal in ("left", "right") for start in (1, 2, 3))


class CorridorTasks(TerminalEnv):
    """The corridor tasks (``task_ids`` picks some: ``left-2``, ...); a task set of
    ``rock/Agent-v0`` (``task_set="corridor"``)."""

    #: The replies a noisy expert draws from (``rock/Agent-v0``'s ``action_words``).
    agent_action_words = ("Left", "Right")

    def __init__(self, **kwargs: Any):
        super().__init__(tasks=CORRIDOR_TASKS, **kwargs)

    def agent_expert_reply(self, task: TerminalTask) -> str:
        """Every call of the agent is answered with the goal's direction (``Left`` for a
        ``left-*`` task)."""
        return task.id.split("-")[0].title()
