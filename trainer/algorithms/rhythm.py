"""Attention-rhythm credit (Li et al. 2025, "Attention Illuminates LLM Reasoning: The
Preplan-and-Anchor Rhythm Enables Fine-Grained Policy Optimization", arXiv 2510.13554).

Pure functions of attention maps. The paper reads two signals off the attention of a
generated sequence:

- **WAAD** (windowed average attention distance) of query t: how far back it looks, each
  distance clipped at a window W, ``WAAD_t = sum_{s<=t} a[t,s] * min(t - s, W)``. A sharp drop
  from one token to the next marks a *pre-planning* token: a long-range look-up that opens a
  phrase, followed by local, phrase-internal attention (the sawtooth near the diagonal).
- **FAI** (future attention influence) of key s: the mean attention it receives from later
  queries, ``FAI_s = mean_{t>s} a[t,s]``. Top-FAI tokens are *anchors* that later reasoning keeps
  returning to.

and turns them into a per-token scale of the advantages (:func:`credit_scale`, 1 = unchanged)
that multiplies the output of any advantage estimator (:func:`scale_advantages`).

Coordinates. The trainer's tensors are aligned on *predicted* tokens (``Batch.mask``):
position t holds token t+1, chosen by the query at position t. So the action at t gets the
WAAD of attention row t (the look-back of the decision that chose it) and the FAI of column
t+1 (how much later decisions attend to the token it chose); :func:`action_signals` maps
sequence-level maps to that alignment.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["SCHEMES", "action_signals", "anchor_tokens", "credit_scale", "fai", "middle_layers", "next_action",
           "preplan_tokens", "prev_action", "scale_advantages", "top_fraction", "waad"]

SCHEMES = ("local_chunk", "global_anchor", "coupled")


def middle_layers(num_layers: int, count: int) -> list[int]:
    """``count`` layer indices spread evenly over the middle third of ``num_layers`` (all of
    it when it has fewer): where the paper finds the clearest local and global heads. A model
    with fewer than three layers has no middle third; its layers are used instead."""
    lo = num_layers // 3
    hi = max(lo + 1, -(-2 * num_layers // 3))  # ceil(2L/3), at least one layer
    span = list(range(lo, hi))
    if count >= len(span):
        return span
    return sorted({span[round(i * (len(span) - 1) / max(count - 1, 1))] for i in range(count)})


def waad(attn: Tensor, window: int) -> Tensor:
    """Windowed average attention distance of each query: (..., N, N) causal attention rows
    (query t, key s) -> (..., N), ``sum_{s<=t} a[t,s] * min(t - s, window)``."""
    n = attn.shape[-1]
    pos = torch.arange(n, device=attn.device)
    dist = (pos[:, None] - pos[None, :]).clamp(0, window)  # 0 above the diagonal (no attention there)
    return (attn * dist.to(attn.dtype)).sum(-1)


def fai(attn: Tensor, queries: Tensor) -> Tensor:
    """Future attention influence of each key: (B, N, N) attention and (B, N) bool ``queries``
    (the rows that count) -> (B, N), the mean of ``a[t, s]`` over counted queries t > s (0 for
    a key that no later counted query sees)."""
    n = attn.shape[-1]
    later = torch.ones(n, n, dtype=torch.bool, device=attn.device).tril(-1)  # [t, s]: t > s
    w = later & queries.bool()[:, :, None]
    count = w.sum(-2)
    return torch.where(count > 0, (attn * w).sum(-2) / count.clamp(min=1), 0.0)


def action_signals(attn: Tensor, mask: Tensor, window: int) -> tuple[Tensor, Tensor]:
    """WAAD and FAI of the response tokens, aligned with ``mask`` (B, N-1) (position t predicts
    token t+1; ``attn`` (B, N, N) is averaged over the heads and layers read).

    ``waad[t]``: row t, the look-back of the decision that chose token t+1. ``fai[t]``: column
    t+1, averaged over later *decision* rows (rows q > t+1 with ``mask[q]``), so observations
    and padding never count as the future that attends to a choice."""
    rows = torch.nn.functional.pad(mask.bool(), (0, 1))  # the last row predicts nothing
    return waad(attn, window)[:, :-1], fai(attn, rows)[:, 1:]


def next_action(mask: Tensor) -> Tensor:
    """(B, T) index of the next response position after each t (T where there is none)."""
    T = mask.shape[-1]
    pos = torch.where(mask.bool(), torch.arange(T, device=mask.device), T)
    after = torch.nn.functional.pad(pos[:, 1:], (0, 1), value=T)  # positions > t
    return after.flip(-1).cummin(-1).values.flip(-1)


def prev_action(mask: Tensor) -> Tensor:
    """(B, T) index of the previous response position before each t (-1 where there is none)."""
    T = mask.shape[-1]
    pos = torch.where(mask.bool(), torch.arange(T, device=mask.device), -1)
    before = torch.nn.functional.pad(pos[:, :-1], (1, 0), value=-1)  # positions < t
    return before.cummax(-1).values


def top_fraction(score: Tensor, eligible: Tensor, mask: Tensor, frac: float) -> Tensor:
    """(B, T) bool: per row, the ``ceil(frac * mask.sum())`` highest ``score``\\ s among the
    ``eligible`` positions (fewer when fewer are eligible); ties go to the earlier position."""
    # in float64 less a hair: 0.3 * 10 is 3.0000000000000004, whose ceil would pick 4
    k = (frac * mask.bool().sum(-1, keepdim=True).double() - 1e-9).ceil()
    s = torch.where(eligible, score.float(), -math.inf)
    order = torch.sort(s, dim=-1, descending=True, stable=True).indices
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(s.shape[-1], device=s.device).expand_as(order))
    return eligible & (rank < k)


def preplan_tokens(waad_a: Tensor, mask: Tensor, frac: float) -> Tensor:
    """Pre-planning tokens: the response tokens whose WAAD drops most to the next response
    token (a peak followed by a valley), a ``frac`` of the response at most; only real drops."""
    m = mask.bool()
    nxt = next_action(m)
    has_next = nxt < m.shape[-1]
    drop = waad_a - waad_a.gather(-1, nxt.clamp(max=m.shape[-1] - 1))
    return top_fraction(drop, m & has_next & (drop > 0), m, frac)


def anchor_tokens(fai_a: Tensor, mask: Tensor, frac: float) -> Tensor:
    """Anchor tokens: the top ``frac`` of the response tokens by FAI."""
    m = mask.bool()
    return top_fraction(fai_a, m, m, frac)


def credit_scale(waad_a: Tensor, fai_a: Tensor, mask: Tensor, *, scheme: str, top_k: float,
                 amplify_preplan: float, amplify_anchor: float, pass_fraction: float) -> Tensor:
    """Per-token advantage scale (B, T), 1 off the selected tokens and off the response.

    - ``local_chunk``: pre-planning tokens P (:func:`preplan_tokens`) get ``1 + amplify_preplan``.
    - ``global_anchor``: anchor tokens A (:func:`anchor_tokens`) get ``1 + amplify_anchor``.
    - ``coupled``: anchors get ``1 + amplify_anchor``; an anchor whose previous response token
      p is a pre-planning token (and is not one itself) passes ``pass_fraction`` of its extra
      credit to p, which planned it: anchor ``1 + (1 - f) g``, p ``+ f g``.
    """
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {', '.join(SCHEMES)}, not {scheme!r}")
    m = mask.bool()
    scale = torch.ones(m.shape, dtype=torch.float32, device=m.device)
    if scheme == "local_chunk":
        return scale + amplify_preplan * preplan_tokens(waad_a, m, top_k)
    anchors = anchor_tokens(fai_a, m, top_k)
    scale = scale + amplify_anchor * anchors
    if scheme == "global_anchor":
        return scale
    plan = preplan_tokens(waad_a, m, top_k)
    prev = prev_action(m)
    linked = anchors & ~plan & (prev >= 0) & plan.gather(-1, prev.clamp(min=0))
    passed = pass_fraction * amplify_anchor * linked.float()
    return (scale - passed).scatter_add(-1, prev.clamp(min=0), passed)


def scale_advantages(adv: Tensor, scale: Tensor) -> Tensor:
    """Advantages (B,) or (B, T) times a per-token ``scale`` (B, T): (B, T)."""
    if adv.dim() == 1:
        adv = adv.unsqueeze(-1).expand_as(scale)
    if adv.shape != scale.shape:
        raise ValueError(f"advantages of shape {tuple(adv.shape)} do not match the credit scale {tuple(scale.shape)}")
    return adv * scale.to(adv.dtype)
