"""Text grid games in the style of ROLL's agentic baselines: Sokoban and FrozenLake.

Both are procedurally generated from the env's RNG (or ``task_id``) and solvable by
construction. The model moves with the words ``Up``, ``Down``, ``Left``, ``Right``
(any case), optionally inside ``<answer>...</answer>``, up to ``max_actions_per_turn`` moves
per turn separated by ``||`` or commas (``<answer>Left || Up</answer>``). In each separated
piece the first direction word counts ("I go left" -> Left); pieces without one are ignored;
moves beyond ``max_actions_per_turn`` are dropped (``info["dropped_moves"]``). A reply with
no direction word at all is a format error. ``info["success"]`` tells whether the puzzle was
solved.

Both take ``difficulty="easy" | "medium" | "hard"``: a preset of the generator's knobs
(:data:`SOKOBAN_DIFFICULTIES`, :data:`FROZENLAKE_DIFFICULTIES`) -- larger rooms, more boxes
and longer optimal solutions; larger lakes with more holes. A knob given explicitly wins over
the preset (``difficulty="hard", num_boxes=1``), so a preset is a starting point, not a cage.
Slipperiness is its own kwarg (``is_slippery``), as in ROLL's agentic baselines.
"""

from __future__ import annotations

import copy
import re
from collections import deque
from typing import Any, ClassVar

import numpy as np

from .actions import parse_action
from .core import GemEnv

__all__ = [
    "DIRECTIONS",
    "board_blind_baselines",
    "FROZENLAKE_DIFFICULTIES",
    "SOKOBAN_DIFFICULTIES",
    "FrozenLakeEnv",
    "SokobanEnv",
    "generate_frozenlake",
    "generate_frozenlake_random",
    "generate_sokoban",
    "MOVE_KINDS",
    "move_kind",
    "parse_moves",
    "shortest_path",
]

DIRECTIONS: dict[str, tuple[int, int]] = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}
_DIRECTION_WORD = re.compile(r"\b(up|down|left|right)\b", re.IGNORECASE)
_SEPARATOR = re.compile(r"\|\||,")
Cell = tuple[int, int]

#: The knobs each Sokoban ``difficulty`` sets. Without a difficulty the defaults below apply
#: (the knobs' values from before presets existed, so a seed keeps naming the same puzzle).
SOKOBAN_DIFFICULTIES: dict[str, dict[str, Any]] = {
    "easy": {"size": (6, 6), "num_boxes": 1, "search_depth": 10},
    "medium": {"size": (7, 7), "num_boxes": 2, "search_depth": 20},
    "hard": {"size": (8, 8), "num_boxes": 3, "search_depth": 30},
}
_SOKOBAN_DEFAULTS = {"size": (6, 6), "num_boxes": 1, "search_depth": 20}
#: The knobs each FrozenLake ``difficulty`` sets.
FROZENLAKE_DIFFICULTIES: dict[str, dict[str, Any]] = {
    "easy": {"size": 4, "p": 0.8},
    "medium": {"size": 6, "p": 0.75},
    "hard": {"size": 8, "p": 0.7},
}
_FROZENLAKE_DEFAULTS = {"size": 4, "p": 0.8}


def _knobs(
    presets: dict[str, dict[str, Any]], difficulty: str | None, defaults: dict[str, Any], **explicit: Any
) -> dict[str, Any]:
    """The generator's knobs: those given explicitly (not None), else the difficulty's preset,
    else the defaults."""
    if difficulty is not None and difficulty not in presets:
        raise ValueError(f"difficulty must be one of {', '.join(map(repr, presets))} or None, got {difficulty!r}")
    knobs = {**defaults, **presets.get(difficulty, {})}
    knobs.update({name: value for name, value in explicit.items() if value is not None})
    return knobs


def parse_moves(text: str, max_moves: int) -> tuple[list[str], int]:
    """Moves named in ``text`` (see module docstring) and how many were dropped over the limit."""
    parsed = parse_action(text)
    body = parsed.answer if parsed.kind == "answer" and parsed.answer else text
    moves = []
    for piece in _SEPARATOR.split(body):
        match = _DIRECTION_WORD.search(piece)
        if match:
            moves.append(match.group(1).capitalize())
    return moves[:max_moves], max(0, len(moves) - max_moves)


def _add(cell: Cell, d: tuple[int, int], k: int = 1) -> Cell:
    return cell[0] + k * d[0], cell[1] + k * d[1]


# ---- Sokoban -------------------------------------------------------------------------------
def _carve_room(rng: np.random.Generator, h: int, w: int) -> set[Cell]:
    """Floor cells from a random walk carving small shapes (gym-sokoban's topology idea)."""
    shapes = [
        [(0, 0)],
        [(0, -1), (0, 0), (0, 1)],
        [(-1, 0), (0, 0), (1, 0)],
        [(0, 0), (0, 1), (1, 0), (1, 1)],
    ]
    floor: set[Cell] = set()
    pos = (int(rng.integers(1, h - 1)), int(rng.integers(1, w - 1)))
    d = list(DIRECTIONS.values())[int(rng.integers(4))]
    for _ in range(int(1.5 * (h + w))):
        if rng.random() < 0.35:
            d = list(DIRECTIONS.values())[int(rng.integers(4))]
        for dy, dx in shapes[int(rng.integers(len(shapes)))]:
            y, x = pos[0] + dy, pos[1] + dx
            if 1 <= y <= h - 2 and 1 <= x <= w - 2:
                floor.add((y, x))
        pos = (min(max(pos[0] + d[0], 1), h - 2), min(max(pos[1] + d[1], 1), w - 2))
    return floor


def _reverse_search(
    floor: set[Cell], targets: list[Cell], max_depth: int, max_states: int = 100_000
) -> tuple[bool, int, list[tuple[Cell, frozenset[Cell]]]]:
    """Breadth-first search *backwards* from the solved room (boxes on targets, player anywhere).

    A reverse move walks the player and may pull the box behind it; each undoes a forward
    move, so every state found is solvable, and its BFS depth is exactly its optimal forward
    solution length. Returns ``(all_off, depth, states)``: the deepest layer (<= ``max_depth``)
    of states with every box off target -- or, if there are none, with at least one off.
    """
    solved = frozenset(targets)
    frontier = [(p, solved) for p in sorted(floor) if p not in solved]
    seen = set(frontier)
    best: tuple[bool, int, list[tuple[Cell, frozenset[Cell]]]] = (False, 0, [])
    dirs = list(DIRECTIONS.values())
    for depth in range(1, max_depth + 1):
        layer = []
        for player, boxes in frontier:
            for d in dirs:
                nxt = _add(player, d)
                if nxt not in floor or nxt in boxes:
                    continue
                behind = _add(player, d, -1)
                successors = [(nxt, boxes)]
                if behind in boxes:
                    successors.append((nxt, (boxes - {behind}) | {player}))
                for state in successors:
                    if state not in seen:
                        seen.add(state)
                        layer.append(state)
        if not layer:
            break
        all_off = [st for st in layer if not st[1] & solved]
        some_off = [st for st in layer if st[1] != solved]
        if all_off:
            best = (True, depth, all_off)
        elif some_off and not best[0]:
            best = (False, depth, some_off)
        frontier = layer
        if len(seen) > max_states:
            break
    return best


def generate_sokoban(
    rng: np.random.Generator, size: tuple[int, int] = (6, 6), num_boxes: int = 1, search_depth: int = 20
) -> dict[str, Any]:
    """A solvable room: ``{"size", "floor", "targets", "boxes", "player", "optimal_moves"}``.

    Cells are ``[row, col]``. The puzzle is drawn uniformly from the hardest states that a
    reverse search of ``search_depth`` moves reaches, so its optimal solution is at most
    ``search_depth`` moves (``optimal_moves``, exact).
    """
    h, w = size
    if h < 4 or w < 4 or num_boxes < 1 or search_depth < 1:
        raise ValueError(
            f"need size >= (4, 4), num_boxes >= 1, search_depth >= 1; got {size}, {num_boxes}, {search_depth}"
        )
    for attempt in range(300):
        floor = _carve_room(rng, h, w)
        cells = sorted(floor)
        if len(cells) < num_boxes + 2:
            continue
        targets = sorted(cells[int(i)] for i in rng.permutation(len(cells))[:num_boxes])
        all_off, depth, layer = _reverse_search(floor, targets, search_depth)
        if not layer or (not all_off and attempt < 100):  # prefer rooms where every box moved
            continue
        player, boxes = sorted(layer, key=lambda st: (st[0], sorted(st[1])))[int(rng.integers(len(layer)))]
        return {
            "size": [h, w],
            "floor": [list(c) for c in cells],
            "targets": [list(c) for c in targets],
            "boxes": [list(c) for c in sorted(boxes)],
            "player": list(player),
            "optimal_moves": depth,
        }
    raise RuntimeError(f"could not generate a Sokoban room of size {size} with {num_boxes} boxes")


class _GridEnv(GemEnv):
    """Shared turn logic of the grid games: parse moves, apply them, render the board."""

    title: ClassVar[str] = ""
    rules: ClassVar[str] = ""
    action_words: ClassVar[tuple[str, ...]] = tuple(DIRECTIONS)  # the moves a noisy expert draws from
    legend: ClassVar[str] = ""

    def __init__(
        self, *, max_turns: int, max_actions_per_turn: int, format_penalty: float, render_mode: str | None
    ):
        super().__init__(
            max_turns=max_turns, format_penalty=format_penalty, max_obs_chars=4096, render_mode=render_mode
        )
        if max_actions_per_turn < 1:
            raise ValueError(f"max_actions_per_turn must be >= 1, got {max_actions_per_turn}")
        self.max_actions_per_turn = int(max_actions_per_turn)
        self.success = False

    def _board(self) -> str:
        raise NotImplementedError

    def _move(self, name: str) -> tuple[float, bool, str]:
        """Apply one move: (reward, terminated, note for the model)."""
        raise NotImplementedError

    def _accepted(self) -> list[str]:
        n = self.max_actions_per_turn
        return [
            "one of the words Up, Down, Left, Right, e.g. <answer>Left</answer>",
            f"up to {n} moves separated by '||' or ',', e.g. <answer>Left || Up</answer>",
        ]

    def _view(self) -> str:
        return f"{self._board()}\n{self.legend}"

    def _intro(self) -> str:
        return (
            f"{self.title}\n{self.rules}\n\n{self._view()}\n\nReply with your moves: "
            f"Up, Down, Left or Right, up to {self.max_actions_per_turn} per turn, "
            "e.g. <answer>Left || Up</answer>."
        )

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        moves, dropped = parse_moves(action, self.max_actions_per_turn)
        if not moves:
            obs, reward, terminated, info = self._format_error(
                "no move (Up, Down, Left, Right) found in the reply", self._accepted()
            )
            return f"{obs}\n\n{self._view()}", reward, terminated, {**info, "success": False}
        total, terminated, notes, done_moves = 0.0, False, [], []
        for name in moves:
            reward, terminated, note = self._move(name)
            total += reward
            done_moves.append(name)
            if note:
                notes.append(note)
            if terminated:
                break
        text = f"Moves: {', '.join(done_moves)}." + (f" {' '.join(notes)}" if notes else "")
        if dropped:
            text += f" ({dropped} extra moves ignored: at most {self.max_actions_per_turn} per turn.)"
        info = {"success": self.success, "moves": done_moves, "dropped_moves": dropped}
        # the board alone: the legend was in the intro (and comes back after a format error),
        # so the position the next move depends on is the last thing before the reply
        return f"{text}\n\n{self._board()}", round(total, 6), terminated, info

    def _render_text(self) -> str:
        return self._view()


class SokobanEnv(_GridEnv):
    """Push every box (X) onto a target (O). Rewards follow gym-sokoban, as ROLL does.

    Per move: -0.1; pushing a box onto a target +1, off a target -1; all boxes on targets
    +10 and the episode terminates (``info["success"] = True``). A turn's reward is the sum
    over its moves; a reply with no move gets ``format_penalty``. Rooms are ``size`` (rows,
    cols, walls included) with ``num_boxes`` boxes, generated by searching backwards from the
    solved state (pulling boxes), so a solution always exists; its optimal length is at most
    ``search_depth`` moves and is reported as ``info["optimal_moves"]`` at reset.
    ``difficulty`` (:data:`SOKOBAN_DIFFICULTIES`) sets the knobs not given; without it they
    default to ``(6, 6)``, 1 box, depth 20.
    """

    title = "Sokoban."
    rules = "You are P. Push boxes (X) onto targets (O); you can push a box but not pull it, and not push two at once."
    legend = "Legend: # wall, _ floor, O target, X box, \u221a box on target, P player, S player on target."

    def __init__(
        self,
        size: int | tuple[int, int] | None = None,
        num_boxes: int | None = None,
        search_depth: int | None = None,
        *,
        difficulty: str | None = None,
        max_turns: int = 20,
        max_actions_per_turn: int = 3,
        format_penalty: float = -0.1,
        render_mode: str | None = None,
    ):
        super().__init__(
            max_turns=max_turns,
            max_actions_per_turn=max_actions_per_turn,
            format_penalty=format_penalty,
            render_mode=render_mode,
        )
        knobs = _knobs(SOKOBAN_DIFFICULTIES, difficulty, _SOKOBAN_DEFAULTS,
                       size=size, num_boxes=num_boxes, search_depth=search_depth)
        size = knobs["size"]
        self.difficulty = difficulty
        self.size = (size, size) if isinstance(size, int) else tuple(size)
        self.num_boxes, self.search_depth = int(knobs["num_boxes"]), int(knobs["search_depth"])
        self.room: dict[str, Any] = {}

    def _reset(self, task_id: Any | None, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        self.room = generate_sokoban(self._task_rng(task_id), self.size, self.num_boxes, self.search_depth)
        self.success = False
        return self._intro(), {"success": False, "optimal_moves": self.room["optimal_moves"]}

    def _move(self, name: str) -> tuple[float, bool, str]:
        d = DIRECTIONS[name]
        floor = {tuple(c) for c in self.room["floor"]}
        targets = {tuple(c) for c in self.room["targets"]}
        boxes = [tuple(c) for c in self.room["boxes"]]
        player = tuple(self.room["player"])
        nxt, reward, note = _add(player, d), -0.1, ""
        if nxt not in floor:
            return reward, False, f"{name} is blocked by a wall."
        if nxt in boxes:
            beyond = _add(nxt, d)
            if beyond not in floor or beyond in boxes:
                return reward, False, f"The box cannot be pushed {name.lower()}."
            boxes[boxes.index(nxt)] = beyond
            reward += (beyond in targets) - (nxt in targets)
        self.room["boxes"], self.room["player"] = [list(b) for b in boxes], list(nxt)
        if all(b in targets for b in boxes):
            self.success = True
            return reward + 10.0, True, "All boxes are on targets: solved!"
        return reward, False, note

    def expert_action(self, max_states: int = 200_000) -> str:
        """The first move of a shortest solution from the current state (breadth-first over
        player and box positions, at most ``max_states`` states; ties by Up, Down, Left,
        Right): the expert of the trainer's SFT data. ``ValueError`` when the episode is over
        or no solution is found (a box pushed into a corner)."""
        floor = {tuple(c) for c in self.room["floor"]}
        targets = {tuple(c) for c in self.room["targets"]}
        start = (tuple(self.room["player"]), frozenset(tuple(b) for b in self.room["boxes"]))
        if start[1] <= targets:
            raise ValueError("no expert move: the episode is over")
        first: dict[Any, str | None] = {start: None}
        queue = deque([start])
        while queue and len(first) < max_states:
            state = queue.popleft()
            player, boxes = state
            for name, d in DIRECTIONS.items():
                nxt = _add(player, d)
                if nxt not in floor:
                    continue
                moved = boxes
                if nxt in boxes:
                    beyond = _add(nxt, d)
                    if beyond not in floor or beyond in boxes:
                        continue
                    moved = (boxes - {nxt}) | {beyond}
                child = (nxt, moved)
                if child in first:
                    continue
                first[child] = first[state] or name
                if moved <= targets:
                    return first[child]
                queue.append(child)
        raise ValueError("no expert move: no solution found from this state")

    def _board(self) -> str:
        h, w = self.room["size"]
        floor = {tuple(c) for c in self.room["floor"]}
        targets = {tuple(c) for c in self.room["targets"]}
        boxes = {tuple(c) for c in self.room["boxes"]}
        player = tuple(self.room["player"])
        rows = []
        for y in range(h):
            row = ""
            for x in range(w):
                c = (y, x)
                if c == player:
                    row += "S" if c in targets else "P"
                elif c in boxes:
                    row += "\u221a" if c in targets else "X"
                else:
                    row += "O" if c in targets else ("_" if c in floor else "#")
            rows.append(row)
        return "\n".join(rows)

    def _get_state(self) -> dict[str, Any]:
        return {"room": copy.deepcopy(self.room), "success": self.success}

    def _set_state(self, state: dict[str, Any]) -> None:
        self.room = copy.deepcopy(state["room"])
        self.success = bool(state["success"])


# ---- FrozenLake ----------------------------------------------------------------------------
def shortest_path(grid: list[str], start: Cell, goal: Cell) -> list[str] | None:
    """The moves of a shortest path from ``start`` to ``goal`` around the holes (H) of a
    FrozenLake map (breadth-first; ties by Up, Down, Left, Right), or None without one."""
    n = len(grid)
    came: dict[Cell, tuple[Cell, str] | None] = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if cell == goal:
            moves = []
            while came[cell] is not None:
                cell, name = came[cell]
                moves.append(name)
            return moves[::-1]
        for name, d in DIRECTIONS.items():
            y, x = _add(cell, d)
            if 0 <= y < n and 0 <= x < n and grid[y][x] != "H" and (y, x) not in came:
                came[(y, x)] = (cell, name)
                queue.append((y, x))
    return None


#: What one move does on a FrozenLake map (:func:`move_kind`), the order of a mistakes table.
MOVE_KINDS = ("shortest", "hole", "dead end", "away")


def move_kind(grid: list[str], cell: Cell, goal: Cell, move: str) -> str:
    """What ``move`` from ``cell`` does on a FrozenLake map whose goal is reachable from there:
    ``"shortest"``, it keeps to a shortest path (or reaches the goal); ``"hole"``, it steps into
    a hole; ``"dead end"``, onto a safe cell nearer the goal by the grid distance but off every
    shortest path (the trap of reading one cell ahead); ``"away"``, onto a safe cell no nearer,
    or into the edge. With a turn budget of the shortest path every kind but the first loses."""
    n, d = len(grid), DIRECTIONS[move]
    nxt = (min(max(cell[0] + d[0], 0), n - 1), min(max(cell[1] + d[1], 0), n - 1))
    if grid[nxt[0]][nxt[1]] == "H":
        return "hole"
    here, after = shortest_path(grid, cell, goal), shortest_path(grid, nxt, goal)
    if here is None:
        raise ValueError(f"the goal {goal} is not reachable from {cell}")
    if after is not None and len(after) == len(here) - 1:
        return "shortest"
    nearer = abs(goal[0] - nxt[0]) + abs(goal[1] - nxt[1]) < abs(goal[0] - cell[0]) + abs(goal[1] - cell[1])
    return "dead end" if nearer else "away"


def _reachable(grid: list[str], start: Cell, goal: Cell) -> bool:
    return shortest_path(grid, start, goal) is not None


def generate_frozenlake(rng: np.random.Generator, size: int = 4, p: float = 0.8) -> list[str]:
    """A ``size`` x ``size`` map of S(tart), F(rozen), H(ole), G(oal) with a path from S to G."""
    if size < 2 or not 0 < p <= 1:
        raise ValueError(f"need size >= 2 and 0 < p <= 1, got size={size}, p={p}")
    while True:  # terminates with probability 1: p > 0 makes an all-frozen map possible
        frozen = rng.random((size, size)) < p
        grid = ["".join("F" if f else "H" for f in row) for row in frozen]
        grid[0] = "S" + grid[0][1:]
        grid[-1] = grid[-1][:-1] + "G"
        if _reachable(grid, (0, 0), (size - 1, size - 1)):
            return grid


def generate_frozenlake_random(rng: np.random.Generator, size: int = 4, p: float = 0.8,
                               min_distance: int = 2) -> tuple[list[str], Cell, Cell]:
    """A ``size`` x ``size`` map whose start and goal are drawn among all cells (distinct, at
    least ``min_distance`` moves apart around the holes): ``(grid, start, goal)``."""
    if size < 2 or not 0 < p <= 1 or not 1 <= min_distance <= 2 * (size - 1):
        raise ValueError(f"need size >= 2, 0 < p <= 1 and 1 <= min_distance <= {2 * (size - 1)}, "
                         f"got size={size}, p={p}, min_distance={min_distance}")
    while True:  # terminates with probability 1, as generate_frozenlake
        frozen = rng.random((size, size)) < p
        a, b = rng.choice(size * size, 2, replace=False)
        start, goal = (int(a) // size, int(a) % size), (int(b) // size, int(b) % size)
        rows = [["F" if f else "H" for f in row] for row in frozen]
        rows[start[0]][start[1]], rows[goal[0]][goal[1]] = "S", "G"
        grid = ["".join(row) for row in rows]
        path = shortest_path(grid, start, goal)
        if path is not None and len(path) >= min_distance:
            return grid, start, goal


class FrozenLakeEnv(_GridEnv):
    """Walk from the start to the goal (G) without falling into a hole (O).

    Reward 1.0 on reaching the goal, 0.0 otherwise; reaching the goal or a hole terminates.
    With ``is_slippery`` a move goes in the intended direction or one of the two
    perpendicular ones, 1/3 each (gymnasium's FrozenLake), drawn from ``self.np_random``.
    Maps are ``size`` x ``size`` with frozen probability ``p``, regenerated until the goal
    is reachable. ``difficulty`` (:data:`FROZENLAKE_DIFFICULTIES`) sets the knobs not given;
    without it they default to size 4, ``p=0.8``.

    ``turn_budget``: None, ``max_turns`` turns for every map; an int ``k``, each map's turns
    are those of its shortest path (:func:`shortest_path`, ``max_actions_per_turn`` moves a
    turn) plus ``k``, told in the intro: with 0 only a policy that reads the board wins (one
    that ignores it must guess the one route), on random maps where a fixed route fails.

    ``goal``: ``"corner"``, the start top left and the goal bottom right (gymnasium's layout);
    ``"random"``, both drawn among the cells of each map, at least ``min_distance`` moves apart
    (:func:`generate_frozenlake_random`): with ``turn_budget=0`` a policy blind to the board
    wins a few percent of the maps (measured in docs/results/reading-frozenlake-4x4.md), one that reads it all.
    ``show_offset``: each board is followed by where the goal lies from the player ("The goal
    is 2 down and 1 left."): text a small model reads at once, while the holes on the way
    are still only on the board.
    """

    title = "FrozenLake."
    rules = "You are P. Walk to the goal G across the frozen lake (_) without stepping into a hole (O)."
    legend = "Legend: _ frozen, O hole, G goal, P player, X player in a hole, \u221a player on the goal."
    _PERPENDICULAR: ClassVar[dict[str, tuple[str, str]]] = {
        "Up": ("Left", "Right"),
        "Down": ("Right", "Left"),
        "Left": ("Down", "Up"),
        "Right": ("Up", "Down"),
    }

    def __init__(
        self,
        size: int | None = None,
        p: float | None = None,
        is_slippery: bool = False,
        *,
        difficulty: str | None = None,
        max_turns: int = 20,
        max_actions_per_turn: int = 3,
        format_penalty: float = -0.1,
        render_mode: str | None = None,
        turn_budget: int | None = None,
        goal: str = "corner",
        min_distance: int = 2,
        show_offset: bool = False,
    ):
        super().__init__(
            max_turns=max_turns,
            max_actions_per_turn=max_actions_per_turn,
            format_penalty=format_penalty,
            render_mode=render_mode,
        )
        if turn_budget is not None and turn_budget < 0:
            raise ValueError(f"turn_budget must be >= 0 or None, got {turn_budget}")
        self.turn_budget = turn_budget
        if goal not in ("corner", "random"):
            raise ValueError(f"goal must be 'corner' or 'random', got {goal!r}")
        self.goal_mode, self.min_distance, self.show_offset = goal, int(min_distance), bool(show_offset)
        knobs = _knobs(FROZENLAKE_DIFFICULTIES, difficulty, _FROZENLAKE_DEFAULTS, size=size, p=p)
        self.difficulty = difficulty
        self.size, self.p, self.is_slippery = int(knobs["size"]), float(knobs["p"]), bool(is_slippery)
        self.grid: list[str] = []
        self.player: list[int] = [0, 0]
        self.goal: Cell = (self.size - 1, self.size - 1)

    def _reset(self, task_id: Any | None, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        rng = self._task_rng(task_id)
        if self.goal_mode == "random":
            self.grid, start, self.goal = generate_frozenlake_random(rng, self.size, self.p, self.min_distance)
        else:
            self.grid, start, self.goal = generate_frozenlake(rng, self.size, self.p), (0, 0), (self.size - 1, self.size - 1)
        self.player, self.success = list(start), False
        if self.turn_budget is None:
            return self._intro(), {"success": False}
        moves = len(shortest_path(self.grid, start, self.goal) or [])
        self.max_turns = -(-moves // self.max_actions_per_turn) + self.turn_budget
        return f"{self._intro()}\nYou have {self.max_turns} turns.", {"success": False, "max_turns": self.max_turns}

    def _move(self, name: str) -> tuple[float, bool, str]:
        actual = name
        if self.is_slippery:
            left, right = self._PERPENDICULAR[name]
            actual = (left, name, right)[int(self.np_random.integers(3))]
        d = DIRECTIONS[actual]
        y = min(max(self.player[0] + d[0], 0), self.size - 1)
        x = min(max(self.player[1] + d[1], 0), self.size - 1)
        self.player = [y, x]
        slip = f"You slipped and moved {actual.lower()}. " if actual != name else ""
        if self.grid[y][x] == "H":
            return 0.0, True, slip + "You fell into a hole."
        if self.grid[y][x] == "G":
            self.success = True
            return 1.0, True, slip + "You reached the goal!"
        return 0.0, False, slip.strip()

    def expert_action(self) -> str:
        """The first move of a shortest path from the player to the goal around the holes
        (:func:`shortest_path`): the expert of the trainer's SFT data
        (:mod:`rockroll.trainer.rollout.sft_data`). ``ValueError`` once the episode is over."""
        y, x = self.player
        path = None if self.grid[y][x] in "HG" else shortest_path(self.grid, (y, x), self.goal)
        if not path:
            raise ValueError("no expert move: the episode is over")
        return path[0]

    def _offset(self) -> str:
        dy, dx = self.goal[0] - self.player[0], self.goal[1] - self.player[1]
        parts = [f"{abs(d)} {word}" for d, word in ((dy, "down" if dy > 0 else "up"), (dx, "right" if dx > 0 else "left"))
                 if d]
        return f"The goal is {' and '.join(parts)}." if parts else "You are on the goal."

    def _board(self) -> str:
        if self.show_offset:
            return f"{self._grid_text()}\n{self._offset()}"
        return self._grid_text()

    def _grid_text(self) -> str:
        rows = []
        for y, line in enumerate(self.grid):
            row = ""
            for x, cell in enumerate(line):
                if [y, x] == self.player:
                    row += {"H": "X", "G": "\u221a"}.get(cell, "P")
                else:
                    row += {"H": "O", "G": "G"}.get(cell, "_")
            rows.append(row)
        return "\n".join(rows)

    def _get_state(self) -> dict[str, Any]:
        return {"grid": list(self.grid), "player": list(self.player), "success": self.success,
                "max_turns": self.max_turns, "goal": list(self.goal)}

    def _set_state(self, state: dict[str, Any]) -> None:
        self.grid, self.player = list(state["grid"]), list(state["player"])
        self.success = bool(state["success"])
        self.goal = tuple(state.get("goal", (self.size - 1, self.size - 1)))  # type: ignore[assignment]
        self.max_turns = int(state.get("max_turns", self.max_turns))  # a map's own budget (turn_budget)


def board_blind_baselines(envs: list[FrozenLakeEnv], depth: int | None = None) -> dict[str, float]:
    """How often a policy that never reads the board wins the maps of ``envs`` (reset, one move
    a turn, each within its ``max_turns``): ``random``, a uniform choice of the four moves
    (exact: every sequence of up to ``depth`` moves weighted 4^-k); ``best_fixed_route``, the
    best single sequence of moves. Every policy blind to the board is a mixture of fixed
    sequences, so none wins more often than the best one. ``depth`` (default: the longest
    budget, which makes both exact) bounds the sequences searched.
    """
    n = len(envs)
    depth = depth or max(env.max_turns for env in envs)
    size = envs[0].size
    holes = np.array([[[c == "H" for c in row] for row in env.grid] for env in envs])  # (n, size, size)
    goal = np.array([env.goal for env in envs])
    budget = np.array([env.max_turns for env in envs])
    start = np.array([env.player for env in envs])
    moves = list(DIRECTIONS.values())
    random_win = np.zeros(n)

    def move(pos, alive, d, k):  # every map's next cell, whether it is still playing, whether it won now
        y = np.clip(pos[:, 0] + d[0], 0, size - 1)
        x = np.clip(pos[:, 1] + d[1], 0, size - 1)
        active = alive & (k < budget)
        hit = active & (y == goal[:, 0]) & (x == goal[:, 1])
        return np.stack([y, x], 1), active & ~hit & ~holes[np.arange(n), y, x], hit

    def walk(pos, alive, k, prob):  # the uniform policy: every sequence, weighted 4^-k
        if k == depth or not alive.any():
            return
        for d in moves:
            nxt, still, hit = move(pos, alive, d, k)
            random_win[:] += (prob / 4) * hit
            walk(nxt, still, k + 1, prob / 4)

    def search(pos, alive, k):  # the most maps won along one path of the tree
        if k == depth or not alive.any():
            return 0
        top = 0
        for d in moves:
            nxt, still, hit = move(pos, alive, d, k)
            top = max(top, int(hit.sum()) + search(nxt, still, k + 1))
        return top

    alive = np.ones(n, bool)
    walk(start.copy(), alive, 0, 1.0)
    best = search(start.copy(), alive, 0)
    return {"random": float(random_win.mean()), "best_fixed_route": best / n,
            "max_budget": int(budget.max()), "mean_budget": float(budget.mean())}


def local_reader_success(envs: list[FrozenLakeEnv]) -> float:
    """How often a policy that reads perfectly what is next to it wins the maps of ``envs``
    (reset, one move a turn, each within its ``max_turns``), exactly: at each turn it knows
    which of the four neighbours are holes or the edge and where the goal lies, and picks
    uniformly among the moves onto a safe cell that bring it closer to the goal (else among
    the safe moves, else any). It never looks two cells ahead, so it walks into dead ends a
    shortest path goes around: the ceiling of one-step reading on maps where the budget is
    the shortest path (``turn_budget=0``)."""
    def win(env: FrozenLakeEnv, cell: Cell, left: int) -> float:
        if left == 0:
            return 0.0
        n, goal = env.size, env.goal
        steps = {name: (y, x) for name, d in DIRECTIONS.items()
                 if 0 <= (y := cell[0] + d[0]) < n and 0 <= (x := cell[1] + d[1]) < n}
        safe = {name: c for name, c in steps.items() if env.grid[c[0]][c[1]] != "H"}
        dist = abs(goal[0] - cell[0]) + abs(goal[1] - cell[1])
        closer = {name: c for name, c in safe.items() if abs(goal[0] - c[0]) + abs(goal[1] - c[1]) < dist}
        choices = list((closer or safe or steps).values())
        total = 0.0
        for c in choices:
            if env.grid[c[0]][c[1]] == "H":
                continue
            total += 1.0 if c == tuple(goal) else win(env, c, left - 1)
        return total / len(choices)

    return float(np.mean([win(env, tuple(env.player), env.max_turns) for env in envs]))
