"""LoRA adapters (``peft``) on the policy LM, and what the rest of the trainer sees of them.

Only the engine holds the adapters. Everything downstream of it (the generator, the batch
roles, vLLM, ``model.init_from``) keeps loading plain weights under the base model's own
names: :func:`lm_state_dict` merges each adapted layer (``W + B A * alpha / r``, peft's own
delta) into its base weight and drops peft's prefixes, so a sync is the same dict, with the
same keys, with or without LoRA. Checkpoints keep only what trains (:func:`trainable_state`):
the base is rebuilt from ``model.name_or_path`` on resume, exactly as it was.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

__all__ = ["is_lora", "lm_state_dict", "save_lm", "trainable_state", "with_lora"]

ADAPTER = "default"  # peft's name for the one adapter


def with_lora(lm: Any, cfg: Any) -> Any:
    """``lm`` with LoRA adapters on ``cfg.target_modules`` (``cfg``: a ``LoRAConfig``), its
    base weights frozen; ``lm`` itself when ``cfg`` is None or ``cfg.r`` is 0."""
    if cfg is None or not cfg.r:
        return lm
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as e:
        raise RuntimeError("model.lora needs the train extra: pip install 'rockroll[train]' (peft)") from e
    # frozen embeddings: with gradient checkpointing, a checkpointed block whose input needs no
    # grad would give its adapters none (peft's own advice; free without checkpointing)
    lm.enable_input_require_grads()
    missing = [t for t in cfg.target_modules if not any(n.split(".")[-1] == t for n, _ in lm.named_modules())]
    if missing:
        from ..config import ConfigError

        raise ConfigError("model.lora.target_modules", f"{missing} name no module of {type(lm).__name__}")
    with warnings.catch_warnings():  # peft 0.21 reads a property Transformers 5 deprecated: not ours to fix
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        return get_peft_model(lm, LoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                                             target_modules=list(cfg.target_modules), bias="none"))


def is_lora(lm: Any) -> bool:
    return hasattr(lm, "peft_config")


@torch.no_grad()
def lm_state_dict(lm: Any) -> dict[str, torch.Tensor]:
    """The LM's weights under the base model's names: with LoRA, every adapted layer's weight
    merged with its adapter (the adapters themselves left out); without, ``lm.state_dict()``."""
    if not is_lora(lm):
        return lm.state_dict()
    from peft.tuners.lora import LoraLayer

    base = lm.get_base_model()
    deltas = {f"{name}.base_layer.weight": mod.get_delta_weight(ADAPTER)
              for name, mod in base.named_modules() if isinstance(mod, LoraLayer) and ADAPTER in mod.lora_A}
    out = {}
    for key, value in base.state_dict().items():
        if ".lora_" in key:
            continue
        if key in deltas:
            value = value + deltas[key].to(value.dtype)
        out[key.replace(".base_layer.", ".")] = value
    return out


def trainable_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What a checkpoint keeps of ``module``: every tensor when all of it trains, else only the
    trainable parameters (LoRA's adapters, a value head) and the buffers of those modules."""
    params = dict(module.named_parameters())
    if all(p.requires_grad for p in params.values()):
        return module.state_dict()
    return {k: v for k, v in module.state_dict().items() if k in params and params[k].requires_grad}


def load_trainable_state(module: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load what :func:`trainable_state` saved: every trainable tensor must be there (a
    checkpoint of another LoRA shape is an error, not a half-loaded model)."""
    missing, unexpected = module.load_state_dict(state, strict=False)
    trainable = {k for k, p in module.named_parameters() if p.requires_grad}
    lost = sorted(set(missing) & trainable)
    if lost or unexpected:
        raise RuntimeError(f"the checkpoint does not fit this model (model.lora changed?): missing {lost[:4]}, "
                           f"unexpected {list(unexpected)[:4]}")


def save_lm(lm: Any, folder: Path) -> None:
    """``lm`` as a model folder ``from_pretrained`` loads: with LoRA the merged weights (what
    ``model.init_from`` and vLLM read) and the adapter alone in ``folder/adapter``."""
    folder = Path(folder)
    if not is_lora(lm):
        lm.save_pretrained(folder)
        return
    lm.get_base_model().save_pretrained(folder, state_dict=lm_state_dict(lm))
    lm.save_pretrained(folder / "adapter")
