"""SFT data: trajectories as token ids with a mask on the assistant's tokens, from three sources.

- **Expert episodes** (:func:`expert_examples`): an env that knows a good move offers
  ``expert_action() -> str`` (the reply an expert gives in the current state; ``ValueError``
  when it has none), and ``action_words`` (the replies a noisy expert draws from). The episode
  is framed by :class:`~.manager.PromptTemplate` exactly as a rollout frames it (the first
  prompt, each reply and its stop token, each next turn), so SFT trains on the very token
  layout RL samples. ``epsilon``: the fraction of moves taken at random, so the data is
  imperfect as real data is; ``habit_rate``: the fraction replaced by one fixed reply
  ``habit``, a teacher whose errors are systematic (a model that copies the data keeps
  them); ``habit_episodes``: the fraction of episodes played by the habit alone (a teacher
  that misreads some tasks from the first move on: failed episodes, whole). Experts:
  FrozenLake and Sokoban (shortest solutions,
  :meth:`rockroll.gem.grid.FrozenLakeEnv.expert_action`, ``SokobanEnv.expert_action``) and
  WebShop (:meth:`rockroll.gem.webshop.WebShopEnv.expert_action`).
- **Model-service records** (:func:`record_examples`, ``records.jsonl``,
  docs/modelservice.md): token-exact, the recorded ``prompt_ids`` and ``completion_ids`` as
  they are when this tokenizer renders the recorded request to the same ``prompt_ids``;
  otherwise the messages and the recorded reply are re-rendered with the chat template.
- **Chat transcripts** (:func:`messages_examples`): one JSON object per line with OpenAI
  ``messages`` (and optionally ``tools``); every assistant turn is trained on.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..config import EnvConfig
from .manager import PromptTemplate, is_request, request_ids

__all__ = ["SFTExample", "expert_examples", "messages_examples", "record_examples", "render_messages"]


@dataclass
class SFTExample:
    token_ids: list[int]
    mask: list[int]  # 1 on the assistant's tokens (the loss's), 0 on the prompt's
    source: str  # expert:<env id>, records, messages
    success: bool | None = None  # expert episodes: whether it reached the goal

    def __post_init__(self):
        if len(self.token_ids) != len(self.mask):
            raise ValueError("token_ids and mask differ in length")


def _unwrapped(env: Any) -> Any:
    return getattr(env, "unwrapped", env)


def expert_examples(spec: EnvConfig, template: PromptTemplate, env_factory: Callable[[EnvConfig], Any], *,
                    episodes: int, epsilon: float, seed: int, max_turns: int, task_ids: list[Any] | None = None,
                    keep_failed: bool = True, habit: str | None = None, habit_rate: float = 0.0,
                    habit_episodes: float = 0.0) -> list[SFTExample]:
    """``episodes`` episodes of ``spec``'s env played by its expert (tasks cycling through
    ``task_ids``, else ``spec.task_ids``, else drawn by the seeds), each move random with
    probability ``epsilon``, else ``habit`` with probability ``habit_rate``; a fraction
    ``habit_episodes`` of the episodes is ``habit`` at every move. ``TypeError`` when the env
    has no expert.

    An agent env (``rock/Agent-v0``: each observation's ``info`` is the agent's model call,
    :func:`~.manager.is_request`) is framed as a rollout frames it: each prompt is the call
    rendered by the tokenizer's chat template, a call that extends the sequence so far merges
    into it (its new tokens are prompt, mask 0), one that does not closes the example and
    starts another (a rollout's new segment)."""
    rng = random.Random(seed)
    tasks = task_ids or spec.task_ids
    out = []
    for j in range(episodes):
        env = env_factory(spec)
        try:
            core = _unwrapped(env)
            if not callable(getattr(core, "expert_action", None)):
                raise TypeError(f"env {spec.id} has no expert (an expert_action() method): "
                                "use sft.sources of kind records or messages for it")
            options = {"task_id": tasks[j % len(tasks)]} if tasks else None
            obs, info = env.reset(seed=seed * 100_003 + j, options=options)
            agent = is_request(info)
            ids = template.request(info) if agent else template.first(obs, info.get("tools"))
            mask, done = [0] * len(ids), []
            success = False
            # drawn only when asked for, so that the other knobs' episodes stay what they were
            stuck = bool(habit_episodes) and rng.random() < habit_episodes
            for _ in range(max_turns):
                words = getattr(core, "action_words", ())
                draw = rng.random()
                if stuck:
                    action = habit
                elif epsilon and words and draw < epsilon:
                    action = rng.choice(list(words))
                elif habit_rate and draw < epsilon + habit_rate:
                    action = habit
                else:
                    try:
                        action = core.expert_action()
                    except ValueError:  # a random move left no solution (a box in a corner): failed here
                        break
                reply = template.tok.encode(action, add_special_tokens=False) + [template.stop_id]
                ids += reply
                mask += [1] * len(reply)
                obs, _, term, trunc, info = env.step(action)
                success = bool(info.get("success", False))
                if term or trunc:
                    break
                if not agent:
                    nxt = template.next(obs, reply_stopped=True)
                else:
                    nxt = template.request(info)
                    if len(nxt) > len(ids) and nxt[: len(ids)] == ids:
                        nxt = nxt[len(ids):]
                    else:  # the agent rewrote its history: a new segment
                        done.append((ids, mask))
                        ids, mask = list(nxt), [0] * len(nxt)
                        continue
                ids += nxt
                mask += [0] * len(nxt)
        finally:
            env.close()
        if success or keep_failed:
            out += [SFTExample(i, m, f"expert:{spec.id}", success) for i, m in done + [(ids, mask)]]
    return out


def render_messages(template: PromptTemplate, messages: list[dict], tools: list[dict] | None = None
                    ) -> tuple[list[int], list[int]]:
    """``messages`` through the tokenizer's chat template, the assistant turns masked 1 up to
    and including the stop token (what the template writes after it, ChatML's newline, is
    0). Each assistant turn is the rendering of the conversation up to it minus that of the
    conversation before it with the generation prompt; ``ValueError`` when the template does
    not render a conversation as an extension of its beginning, or there is no assistant turn."""
    ids: list[int] = []
    mask: list[int] = []
    turns = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    if not turns:
        raise ValueError("no assistant message to train on")
    for i in turns:
        head = template.render(messages[:i], generation=True, tools=tools)
        full = template.render(messages[: i + 1], generation=False, tools=tools)
        if head[: len(ids)] != ids or full[: len(head)] != head:
            raise ValueError("the chat template does not render the conversation as an extension of its "
                             "beginning: its assistant turns cannot be told from the rest")
        ids, mask = ids + head[len(ids):], mask + [0] * (len(head) - len(ids))
        reply = full[len(head):]
        k = reply.index(template.stop_id) + 1 if template.stop_id in reply else len(reply)
        ids, mask = ids + reply, mask + [1] * k + [0] * (len(reply) - k)
    return ids, mask


def _jsonl(path: str | Path) -> list[dict]:
    rows = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not JSON ({e.msg})") from None
    return rows


def messages_examples(path: str | Path, template: PromptTemplate) -> list[SFTExample]:
    """Chat transcripts, one ``{"messages": [...], "tools": [...]?}`` per line."""
    out = []
    for n, row in enumerate(_jsonl(path), 1):
        if not isinstance(row.get("messages"), list):
            raise ValueError(f"{path}:{n}: no 'messages' list")
        try:
            ids, mask = render_messages(template, row["messages"], row.get("tools"))
        except ValueError as e:
            raise ValueError(f"{path}:{n}: {e}") from None
        out.append(SFTExample(ids, mask, "messages"))
    return out


def record_examples(path: str | Path, template: PromptTemplate) -> tuple[list[SFTExample], dict[str, int]]:
    """The answered calls of a model-service ``records.jsonl``, and counts of how each was
    read (``exact``: recorded ids as they are; ``rendered``: re-rendered; ``skipped``: an
    error or no answer)."""
    tok, out = template.tok, []
    counts = {"exact": 0, "rendered": 0, "skipped": 0}
    for row in _jsonl(path):
        choice = (row.get("choices") or [{}])[0]
        if row.get("error") or not row.get("choices"):
            counts["skipped"] += 1
            continue
        kind, prompt_ids, completion_ids = row.get("kind", "chat"), row.get("prompt_ids"), row.get("completion_ids")
        mine = request_ids(tok, kind, row.get("messages"), row.get("tools"), row.get("prompt"))
        if prompt_ids and completion_ids and list(prompt_ids) == mine:  # the same tokenizer: token-exact
            ids, mask = list(prompt_ids) + list(completion_ids), [0] * len(prompt_ids) + [1] * len(completion_ids)
            counts["exact"] += 1
        elif kind == "chat":
            reply = {"role": "assistant", "content": choice.get("content") or "",
                     "tool_calls": choice.get("tool_calls") or None}
            ids, mask = render_messages(template, list(row["messages"]) + [reply], row.get("tools"))
            counts["rendered"] += 1
        else:
            done = tok.encode(choice.get("text") or "", add_special_tokens=False)
            ids, mask = mine + done, [0] * len(mine) + [1] * len(done)
            counts["rendered"] += 1
        out.append(SFTExample(ids, mask, "records"))
    return out, counts
