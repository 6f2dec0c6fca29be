"""Training engines for the policy: plain PyTorch, or DeepSpeed ZeRO, behind one interface.

``PolicyEngine``: ``module`` (the :class:`ActorModule`), ``device`` (where its inputs go),
``forward(input_ids, attn)`` -> (logits, values), ``backward(loss, last=...)`` (accumulate the
gradients of one micro-batch; ``last``: the mini-batch's final one), ``step()`` (clip, optimizer
step, zero the gradients; returns the grad norm), ``sync_state_dict()`` (the LM's weights for
the generator, on CPU), ``save(dir)`` / ``load(dir)``.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..config import EngineConfig
from .lora import lm_state_dict, load_trainable_state, trainable_state, with_lora


class ActorModule(nn.Module):
    """The causal LM (with LoRA adapters when ``lora`` is a ``LoRAConfig`` of rank > 0), plus
    a scalar value head when the algorithm needs a critic (PPO)."""

    def __init__(self, lm: nn.Module, with_value: bool, lora: Any = None):
        super().__init__()
        self.lm = with_lora(lm, lora)
        self.value_head = nn.Linear(lm.config.hidden_size, 1) if with_value else None
        if self.value_head is not None:
            nn.init.zeros_(self.value_head.weight)
            nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids, attention_mask, logits_to_keep: int = 0):
        """Logits (of the last ``logits_to_keep`` positions; 0: all) and values (all positions)."""
        out = self.lm(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=logits_to_keep,
                      output_hidden_states=self.value_head is not None, use_cache=False)
        values = None
        if self.value_head is not None:
            values = self.value_head(out.hidden_states[-1].float()).squeeze(-1)
        return out.logits, values


def _clone(sd: dict[str, Any], device: Any) -> dict[str, Any]:
    """Detached copies of ``sd``'s tensors on ``device`` (None: the CPU)."""
    return {k: v.detach().to(device or "cpu", copy=True) for k, v in sd.items()}


class TorchPolicy:
    def __init__(self, module: ActorModule, cfg: EngineConfig):
        # on the GPU when there is one (before the optimizer is built over its parameters)
        self.module, self.cfg = module.to("cuda" if torch.cuda.is_available() else "cpu"), cfg
        self.optimizer = torch.optim.AdamW(_trainable(module), lr=cfg.lr, betas=tuple(cfg.betas),
                                           weight_decay=cfg.weight_decay)

    @property
    def device(self) -> torch.device:
        return next(self.module.parameters()).device

    def forward(self, input_ids, attention_mask, logits_to_keep: int = 0):
        return self.module(input_ids, attention_mask, logits_to_keep)

    def backward(self, loss, *, last: bool = True) -> None:
        loss.backward()  # gradients add up in .grad until step()

    def step(self) -> float:
        norm = torch.nn.utils.clip_grad_norm_(_trainable(self.module),
                                              self.cfg.grad_clip if self.cfg.grad_clip > 0 else float("inf"))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def sync_state_dict(self, device: Any = None) -> dict[str, Any]:
        """A copy of the weights a generator loads, on ``device``: None (the CPU) for what
        crosses processes or goes to disk, the policy's own device for a generator in this
        process (a device-to-device copy, no round trip through host memory). With LoRA: the
        merged weights, under the base model's names (:func:`~.lora.lm_state_dict`)."""
        return _clone(lm_state_dict(self.module.lm), device)

    def save(self, folder: Path) -> None:
        # with LoRA only the adapters (and a value head): the frozen base is the model's own
        torch.save({"module": trainable_state(self.module), "optimizer": self.optimizer.state_dict()},
                   folder / "policy.pt")

    def load(self, folder: Path) -> None:
        state = torch.load(folder / "policy.pt", map_location="cpu", weights_only=False)
        load_trainable_state(self.module, state["module"])
        self.optimizer.load_state_dict(state["optimizer"])


def _trainable(module: nn.Module) -> list[nn.Parameter]:
    """The parameters an optimizer steps: all of them, or LoRA's adapters (and a value head)."""
    return [p for p in module.parameters() if p.requires_grad]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DeepSpeedPolicy:
    """DeepSpeed ZeRO (stage 0-3). On CPU: gloo, world size 1, a torch AdamW client optimizer
    (DeepSpeed's fused optimizers need compiled ops). Multi-GPU runs start under the
    ``deepspeed`` launcher, which sets RANK/WORLD_SIZE/MASTER_ADDR itself."""

    def __init__(self, module: ActorModule, cfg: EngineConfig, batch_size: int):
        """``batch_size``: sequences per optimizer step (one mini-batch)."""
        try:
            import deepspeed
        except ImportError as e:
            raise RuntimeError("engine.kind=deepspeed needs the train extra: pip install 'rockroll[train]'") from e
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("LOCAL_RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        cpu = not torch.cuda.is_available()
        if not torch.distributed.is_initialized():
            deepspeed.init_distributed(dist_backend="gloo" if cpu else "nccl", auto_mpi_discovery=False)
        self.cfg = cfg
        # Nominal sizes for DeepSpeed's bookkeeping: the real number of micro-batches varies
        # (groups may lose samples), so backward() marks the accumulation boundary itself.
        batch_size = max(batch_size, 1)
        micro = min(cfg.micro_batch_size or batch_size, batch_size)
        ds_config = {
            "train_micro_batch_size_per_gpu": micro,
            "gradient_accumulation_steps": -(-batch_size // micro),
            "gradient_clipping": cfg.grad_clip,
            "zero_optimization": {"stage": cfg.zero_stage},
            "zero_allow_untested_optimizer": True,
            "bf16": {"enabled": next(module.parameters()).dtype == torch.bfloat16},
            "steps_per_print": 10**9,
            "wall_clock_breakdown": False,
        }
        optimizer = torch.optim.AdamW(_trainable(module), lr=cfg.lr, betas=tuple(cfg.betas),
                                      weight_decay=cfg.weight_decay)
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=module, optimizer=optimizer, config=ds_config, dist_init_required=False)
        self.module = self.engine.module

    @property
    def device(self) -> torch.device:
        return self.engine.device

    def forward(self, input_ids, attention_mask, logits_to_keep: int = 0):
        return self.engine(input_ids, attention_mask, logits_to_keep)

    def backward(self, loss, *, last: bool = True) -> None:
        # DeepSpeed reduces gradients (and ZeRO-2/3 partition them) at the boundary it is told;
        # the loss is already normalised over the mini-batch, so no 1/gradient_accumulation_steps.
        self.engine.set_gradient_accumulation_boundary(last)
        self.engine.backward(loss, scale_wrt_gas=False)

    def step(self) -> float:
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else 0.0

    def sync_state_dict(self, device: Any = None) -> dict[str, Any]:
        """As :meth:`TorchPolicy.sync_state_dict`; ZeRO-3 gathers the partitions first."""
        if self.cfg.zero_stage == 3:
            import deepspeed

            params = list(self.module.lm.parameters())
            with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
                return _clone(lm_state_dict(self.module.lm), device)
        return _clone(lm_state_dict(self.module.lm), device)

    def save(self, folder: Path) -> None:
        torch.distributed.barrier()  # data parallel: rank 0 has prepared `folder` (checkpoint.save_checkpoint)
        # with LoRA the frozen base stays out (it is the model's own, rebuilt on resume)
        self.engine.save_checkpoint(str(folder / "deepspeed"), tag="ckpt", exclude_frozen_parameters=True)

    def load(self, folder: Path) -> None:
        frozen = any(not p.requires_grad for p in self.module.parameters())
        self.engine.load_checkpoint(str(folder / "deepspeed"), tag="ckpt", load_module_strict=not frozen)


def make_policy(module: ActorModule, cfg: EngineConfig, batch_size: int):
    if cfg.kind == "deepspeed":
        return DeepSpeedPolicy(module, cfg, batch_size)
    return TorchPolicy(module, cfg)
