"""sort3: sort three numbers, with one retry after a wrong answer (docs/env-contract.md)."""

from rockroll.gem.actions import parse_action
from rockroll.gem.core import GemEnv

FORMATS = ["<answer>a b c</answer>: the three numbers, smallest first"]


class Sort3Env(GemEnv):
    """Task ``i`` (any int) is three distinct digits drawn from a generator seeded by ``i``."""

    def __init__(self, *, image: str | None = None, **kwargs):  # make passes image= always
        super().__init__(**kwargs)  # max_turns, format_penalty, ... (GemEnv's)

    def _reset(self, task_id, options):
        if task_id is None:  # drawn with the env's RNG: the same seed gives the same task
            task_id = int(self.np_random.integers(1000))
        self.numbers = self._task_rng(task_id).choice(10, 3, replace=False).tolist()
        self.wrong = 0
        return f"Sort {' '.join(map(str, self.numbers))}. Reply {FORMATS[0]}", {"task_id": task_id}

    def _step(self, action):
        act = parse_action(action)  # Action(kind="answer", answer="1 2 3"), or kind="invalid", error=why
        if act.kind != "answer":
            return self._format_error(act.error or f"{act.kind} is not an action here", FORMATS)
        if act.answer.split() == [str(n) for n in sorted(self.numbers)]:
            return "correct", 1.0, True, {"success": True}
        self.wrong += 1
        if self.wrong == 2:
            return "wrong again", 0.0, True, {"success": False}
        return "wrong: try once more, smallest first", 0.0, False, {}
