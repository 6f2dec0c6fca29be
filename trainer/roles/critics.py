"""AsyPPO's mini-critics (Liu et al. 2025, arXiv 2510.01656) as a batch role.

:class:`CriticsRole` holds ``algorithm.critics.count`` small value models of their own (not
heads on the policy): before the policy's update it annotates each state with the critics'
mean value (``values``, GAE's baseline) and their spread (``value_std``, which
:func:`~rockroll.trainer.algorithms.pg.uncertainty_masks` turns into the loss reconstruction); after it, each
critic trains with its own optimizer on a disjoint shard of the step's responses, dealt out
*within* each prompt (the paper's group-level non-overlapping division, section 4.1): response
i of every group goes to critic i mod M, so every critic sees every prompt (they stay in
"perceptual synchrony" and their disagreement measures value uncertainty, not which prompts
each happened to see) while no two critics see the same response, which keeps them diverse
although they may start from one checkpoint. A group with fewer responses than critics leaves
the last critics without a share of it.

The critics are small *pretrained* models in the paper (M = 2, 0.6B-4B of the policy's
family): ``algorithm.critics.name_or_path`` loads one. The default (null) is a tiny
random-initialised Llama of ``algorithm.critics.*`` dims, so that tests and CPU runs need no
download; it learns values from scratch and is no stand-in for the paper's critics.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from ..algorithms import pg as A
from ..config import ModelConfig, TrainConfig
from ..engines.offload import Offloadable, cpu_copy
from ..models import build_model
from ..rollout.types import Group
from .update import Batch, collate

__all__ = ["Critic", "CriticsRole", "shard_of_rows", "shards"]


class Critic(nn.Module):
    """A value model: a causal LM's backbone (its hidden states, no vocabulary projection)
    and a scalar head, V(s_t) for every position t."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.backbone = lm.base_model
        self.head = nn.Linear(lm.config.hidden_size, 1)

    def forward(self, input_ids, attention_mask):
        h = self.backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        return self.head(h.float()).squeeze(-1)


def shards(groups: list[Group], count: int) -> list[list[Group]]:
    """Each group's responses dealt out among ``count`` critics (AsyPPO, arXiv 2510.01656,
    section 4.1): critic i gets responses i, i + count, ... of every group, so every critic
    sees every prompt and no two see the same response. A group with no response for a critic
    is left out of its shard."""
    return [[dataclasses.replace(g, samples=g.samples[i::count]) for g in groups if g.samples[i::count]]
            for i in range(count)]


def shard_of_rows(groups: list[Group], count: int) -> torch.Tensor:
    """(B,) long: the critic whose shard each row of ``collate(groups)`` is in (every row of an
    episode split into rows goes with its response), as :func:`shards` deals them."""
    return torch.tensor([j % count for g in groups for j, s in enumerate(g.samples) for _ in s.rows()],
                        dtype=torch.long)


class CriticsRole(Offloadable):
    """:class:`~.base.BatchRole`: AsyPPO's mini-critics. ``annotate`` -> ``values`` (their
    mean) and ``value_std`` (their population std), (B, T) on predicted tokens; ``train``:
    each critic one optimizer step on its shard (:func:`shards`), regressing the returns R_t of
    the step, L_m = mean (V_m(s_t) - R_t)^2 over its response tokens (the paper's critic loss).
    R_t is the lambda-return of GAE from the annotated mean value (the baseline the policy
    used); with ``algorithm.lam: 1`` and ``gamma: 1`` it is the Monte-Carlo return, the
    outcome reward. ``lm`` (the policy's copy) is not used: the critics are models of their own.
    A checkpoint keeps the critics, their optimizers and the responses they last trained on
    (``seen``: [group id, response index] pairs per critic)."""

    trains = True  # train() steps the critics' optimizers (BatchRole.trains)

    def __init__(self, cfg: TrainConfig, lm: Any, tokenizer: Any):
        self.cfg, self.pad_id = cfg, tokenizer.pad_token_id
        c = cfg.algorithm.critics
        dims = ModelConfig(name_or_path=c.name_or_path, hidden_size=c.hidden_size, num_layers=c.num_layers,
                           num_heads=c.num_heads, intermediate_size=c.intermediate_size,
                           max_position_embeddings=cfg.model.max_position_embeddings, dtype=cfg.model.dtype)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        # a seed each: tiny critics built from scratch would otherwise start identical
        self.critics = [Critic(build_model(dims, tokenizer, cfg.seed + 1 + i)).to(device) for i in range(c.count)]
        self.optimizers = [torch.optim.AdamW(m.parameters(), lr=c.lr) for m in self.critics]
        # [group id, response index] of the responses each critic trained on, last step
        self.seen: list[list[list[int]]] = [[] for _ in self.critics]

    def _values(self, critic: Critic, batch: Batch) -> torch.Tensor:
        """V per predicted token (B, T) on the critic's device: the value of the state before
        token t+1, as the policy's value head gives it (``update.token_logp``), forwarded
        ``engine.micro_batch_size`` sequences at a time like the policy (0: all at once)."""
        dev = next(critic.parameters()).device
        step = self.cfg.engine.micro_batch_size or batch.size
        out = [critic(batch.input_ids[idx].to(dev), batch.attention_mask[idx].to(dev))[:, :-1]
               for idx in torch.arange(batch.size).split(step)]
        return torch.cat(out) if len(out) > 1 else out[0]

    def annotate(self, groups: list[Group]) -> dict[str, torch.Tensor]:
        batch = collate(groups, self.pad_id)
        with torch.no_grad():
            v = torch.stack([self._values(c.eval(), batch).cpu() for c in self.critics])
        return {"values": v.mean(0), "value_std": v.std(0, unbiased=False)}

    def train(self, groups: list[Group], aux: dict[str, torch.Tensor]) -> dict[str, float]:
        a = self.cfg.algorithm
        batch = collate(groups, self.pad_id)
        r_tok = A.outcome_on_last_token(batch.rewards, batch.mask)
        _, returns = A.gae(r_tok, aux["values"].cpu(), batch.mask, gamma=a.gamma, lam=a.lam)
        metrics, losses = {}, []
        count = len(self.critics)
        owner = shard_of_rows(groups, count)
        for i, (critic, opt) in enumerate(zip(self.critics, self.optimizers)):
            self.seen[i] = [[g.group_id, j] for g in groups for j in range(i, len(g.samples), count)]
            rows = (owner == i).nonzero().squeeze(-1)
            if not len(rows):
                continue
            mb = batch.select(rows)
            critic.train()
            v = self._values(critic, mb)
            loss = A.masked_mean((v - returns[rows].to(v.device)) ** 2, mb.mask.to(v.device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(critic.parameters(), self.cfg.engine.grad_clip or float("inf"))
            opt.step()
            metrics[f"critic/{i}/value_loss"] = float(loss.detach())
            losses.append(float(loss.detach()))
        if losses:
            metrics["critic/value_loss"] = sum(losses) / len(losses)
        return metrics

    def load_weights(self, state_dict: dict[str, Any], version: int) -> None:
        pass  # the critics are their own models; they learn from the returns, not the policy's weights

    def state_dict(self) -> dict[str, Any]:
        return cpu_copy({"critics": [c.state_dict() for c in self.critics],
                         "optimizers": [o.state_dict() for o in self.optimizers],
                         "seen": [[list(x) for x in s] for s in self.seen]})

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if len(state["critics"]) != len(self.critics):
            raise ValueError(f"the checkpoint holds {len(state['critics'])} critics, algorithm.critics.count is "
                             f"{len(self.critics)}: resume with the settings that wrote it")
        for critic, opt, c, o in zip(self.critics, self.optimizers, state["critics"], state["optimizers"]):
            critic.load_state_dict(c)
            opt.load_state_dict(o)  # its state follows the parameters' device
        self.seen = [[list(x) for x in s] for s in state["seen"]]

    def resident_state(self):
        return list(self.critics), list(self.optimizers)
