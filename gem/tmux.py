"""``rock/TerminalTmux-v0``: the ``rock/Terminal-v0`` tasks, driven as terminal benchmarks
drive an agent: through a tmux session, with keys in and screen captures out.

The agent's shell is a tmux pane in the sandbox (``tmux new-session``: a real terminal,
``TERM``, job control, full-screen programs). A ``bash`` action (any of ``TOOL_FORMATS``) is
typed into the pane and Enter pressed; ``<keys>C-c</keys>`` sends tmux key names as they are
(``C-c``, ``Up``, ``Escape``, ``q``...). After each action the env waits for the screen to
settle (two equal captures, at most ``settle_s`` seconds) and the observation is the pane's
visible screen (``capture-pane -p``). ``submit`` runs the task's hidden checker, as in
``rock/Terminal-v0``.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from rockroll.sandbox import AsyncSandbox

from .actions import TOOL_FORMATS, parse_action
from .core import InfraError
from .terminal import TerminalEnv, TerminalTask

__all__ = ["TmuxTerminalEnv"]

SOCKET = "/tmp/.rock-tmux"  # the env's tmux server (the agent may start its own beside it)
PANE = "agent"
KEYS = re.compile(r"<keys>(.*?)</keys>", re.S)
KEY_FORMATS = [*TOOL_FORMATS[:-1], "<keys>C-c</keys>: tmux key names, space-separated (C-c, Up, Escape, q...)",
               TOOL_FORMATS[-1]]


class TmuxTerminalEnv(TerminalEnv):
    """Terminal tasks through tmux; see the module docstring. ``rows``/``cols``: the pane's
    size; ``settle_s``: the longest wait for the screen to stop changing after an action."""

    def __init__(self, *, rows: int = 24, cols: int = 100, settle_s: float = 10.0, **kwargs: Any):
        super().__init__(**kwargs)
        self.rows, self.cols, self.settle_s = int(rows), int(cols), float(settle_s)

    def _tmux(self, *args: str) -> str:
        return "tmux -S " + SOCKET + " " + " ".join(shlex.quote(a) for a in args)

    async def _setup(self, sandbox: AsyncSandbox, task: TerminalTask) -> str:
        first = await super()._setup(sandbox, task)
        # The prompt names the directory only: the same screen for the same task, whatever
        # sandbox (its hostname) the episode got.
        start = (f"cd {shlex.quote(sandbox.spec.workdir)} && TERM=xterm-256color "
                 + self._tmux("new-session", "-d", "-s", PANE, "-x", str(self.cols), "-y", str(self.rows),
                              "env PS1='\\w\\$ ' bash --norc --noprofile"))
        result = await self._run(sandbox, start, timeout=30)
        if result.exit_code != 0:
            raise InfraError(f"tmux did not start in the sandbox (exit {result.exit_code}): {result.stderr[-500:]}")
        screen = await self._screen(sandbox)
        intro = first.split("\n\nAct with", 1)[0]
        formats = "\n".join(f"- {form}" for form in KEY_FORMATS)
        return (f"{intro}\n\nYou type into a terminal (a tmux pane, {self.cols}x{self.rows}); after each action "
                f"you see its screen. Act with exactly one action per reply, in one of these formats:\n"
                f"{formats}\n\nThe screen:\n{screen}")

    async def _screen(self, sandbox: AsyncSandbox, keys: str = "") -> str:
        """Send ``keys`` (a shell fragment of tmux commands), then wait for the screen to
        settle and capture it, in one command."""
        capture = self._tmux("capture-pane", "-p", "-t", PANE)
        polls = max(1, int(self.settle_s / 0.2))
        script = (f"{keys}\nprev=; i=0; while [ $i -lt {polls} ]; do sleep 0.2; i=$((i+1)); "
                  f"cur=$({capture}) || exit 3; [ $i -ge 2 ] && [ \"$cur\" = \"$prev\" ] && break; prev=$cur; done; "
                  "printf '%s\\n' \"$cur\"")
        result = await self._run(sandbox, script, timeout=self.settle_s + 30)
        if result.exit_code != 0:
            raise InfraError(f"the tmux pane is gone (exit {result.exit_code}): {result.stderr[-500:]}")
        return result.stdout.rstrip("\n")

    async def _act(self, text: str) -> tuple[str, float, bool, dict[str, Any]]:
        sandbox = self._lease.sandbox
        keys = KEYS.search(text)
        if keys:
            names = keys.group(1).split()
            if not names:
                return self._format_error("<keys></keys> names no key", KEY_FORMATS)
            return await self._screen(sandbox, self._tmux("send-keys", "-t", PANE, *names)), 0.0, False, {}
        action = parse_action(text)
        if action.kind == "bash":
            typed = self._tmux("send-keys", "-t", PANE, "-l", "--", action.command) + " && " + \
                self._tmux("send-keys", "-t", PANE, "Enter")
            return await self._screen(sandbox, typed), 0.0, False, {}
        if action.kind == "invalid":
            return self._format_error(action.error, KEY_FORMATS)
        return await super()._act(text)  # submit (graded) or an answer (a format error)
