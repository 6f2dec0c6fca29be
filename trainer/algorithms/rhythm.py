"""Attention-rhythm credit (Li et al. 2025, "Attention Illuminates LLM Reasoning: The
Preplan-and-Anchor Rhythm Enables Fine-Grained Policy Optimization", arXiv 2510.13554).

Pure functions of attention maps. The paper reads two signals off the attention of a
generated sequence, each from its own kind of head (:func:`split_heads`: the 30 % of the
heads that look least far back are *local*, the 30 % that look farthest *global*; heads of 5
layers of the middle third, :func:`middle_layers`):

- **WAAD** (windowed average attention distance) of token t, from the local heads: how far
  back its query looks, each distance clipped at a window W,
  ``WAAD_t = sum_{s<=t} a[t,s] * min(t - s, W)``. A large change
  ``Delta_t = |WAAD_t - WAAD_{t+1}|`` marks a *pre-planning* token: a long-range look-up that
  opens a phrase next to local, phrase-internal attention (the sawtooth near the diagonal).
- **FAI** (future attention influence) of token s, from the global heads: the mean attention
  it receives from the queries H_lo to H_hi tokens later,
  ``FAI_s = mean_{t in [s + H_lo, s + H_hi]} a[t,s]`` (H = [10, 100]). Top-FAI tokens are
  *anchors* that later reasoning keeps returning to. The near future (t < s + H_lo) is left
  out: every token is attended by its immediate successors, which says nothing of its reach.

and turns them into a per-token scale of the advantages (:func:`credit_scale`, 1 = unchanged)
that multiplies the output of any advantage estimator (:func:`scale_advantages`).

Coordinates. In the paper WAAD_t and FAI_t belong to token t: row t and column t of the map
(its query and its key). The trainer's tensors are aligned on *predicted* tokens
(``Batch.mask``): position t holds token t+1, so the action at t gets row t+1 and column t+1
(:func:`action_signals`). (Before issue #40 it got row t, the look-back of the query that
*chose* it: one token early against the paper.)
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["SCHEMES", "action_signals", "anchor_tokens", "credit_scale", "fai", "head_spans", "middle_layers",
           "next_action", "preplan_tokens", "prev_action", "scale_advantages", "split_heads", "top_fraction", "waad"]

SCHEMES = ("local_chunk", "global_anchor", "coupled")


def middle_layers(num_layers: int, count: int) -> list[int]:
    """``count`` layer indices spread evenly over the middle third of ``num_layers`` (the
    paper reads 5 of them; all of the middle third when it has fewer): where the paper finds
    the clearest local and global heads. A model with fewer than three layers has no middle
    third; its layers are used instead."""
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


def fai(attn: Tensor, queries: Tensor, lo: int = 10, hi: int = 100) -> Tensor:
    """Future attention influence of each key: (B, N, N) attention and (B, N) bool ``queries``
    (the rows that count) -> (B, N), the mean of ``a[t, s]`` over counted queries t with
    ``s + lo <= t <= s + hi`` (the paper's H = [10, 100]); 0 for a key that no counted query in
    that range sees (too close to the end of the sequence to have a measured influence)."""
    n = attn.shape[-1]
    pos = torch.arange(n, device=attn.device)
    gap = pos[:, None] - pos[None, :]  # [t, s]: t - s
    w = (gap >= max(lo, 1)) & (gap <= hi) & queries.bool()[:, :, None]
    count = w.sum(-2)
    return torch.where(count > 0, (attn * w).sum(-2) / count.clamp(min=1), 0.0)


def head_spans(attn: Tensor, rows: Tensor) -> Tensor:
    """How far back each head looks: (B, h, N, N) maps and (B, N) bool ``rows`` (the queries
    that count) -> (B, h), the mean over counted rows of ``sum_s a[t,s] * (t - s)`` (unclipped)."""
    n = attn.shape[-1]
    pos = torch.arange(n, device=attn.device)
    dist = (pos[:, None] - pos[None, :]).clamp(min=0).to(attn.dtype)
    per_row = (attn * dist).sum(-1)  # (B, h, N)
    r = rows.to(attn.dtype)[:, None, :]
    return (per_row * r).sum(-1) / r.sum(-1).clamp(min=1)


def split_heads(attn: Tensor, rows: Tensor, frac: float) -> tuple[Tensor, Tensor]:
    """The paper's local and global heads, per sequence: of the h heads of (B, h, N, N)
    ``attn`` ranked by :func:`head_spans`, the mean map of the ``ceil(frac * h)`` that look
    least far back (local: WAAD's) and of the ``ceil(frac * h)`` that look farthest (global:
    FAI's), each (B, N, N). Ties go to the earlier head."""
    h = attn.shape[1]
    k = max(1, math.ceil(frac * h - 1e-9))
    order = torch.sort(head_spans(attn, rows), dim=-1, stable=True).indices  # (B, h), shortest first
    pick = lambda idx: attn.gather(1, idx[:, :, None, None].expand(-1, -1, *attn.shape[2:])).mean(1)  # noqa: E731
    return pick(order[:, :k]), pick(order[:, h - k:])


def action_signals(local_attn: Tensor, global_attn: Tensor, mask: Tensor, window: int, *,
                   fai_lo: int = 10, fai_hi: int = 100) -> tuple[Tensor, Tensor]:
    """WAAD and FAI of the response tokens, aligned with ``mask`` (B, N-1) (position t holds
    token t+1): ``waad[t]`` is row t+1 of the local heads' map (token t+1's own look-back),
    ``fai[t]`` column t+1 of the global heads' map, averaged over the rows of later *response*
    tokens in [t+1+fai_lo, t+1+fai_hi], so observations and padding never count as the future
    that attends to a choice."""
    tokens = torch.nn.functional.pad(mask.bool(), (1, 0))  # token q is a response token iff mask[q-1]
    return waad(local_attn, window)[:, 1:], fai(global_attn, tokens, fai_lo, fai_hi)[:, 1:]


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
    """Pre-planning tokens: the response tokens whose WAAD changes most to the next response
    token, Delta_t = |WAAD_t - WAAD_{t+1}| (the paper's definition: a peak next to a valley,
    either way), a ``frac`` of the response at most; only real changes (Delta > 0)."""
    m = mask.bool()
    nxt = next_action(m)
    has_next = nxt < m.shape[-1]
    delta = (waad_a - waad_a.gather(-1, nxt.clamp(max=m.shape[-1] - 1))).abs()
    return top_fraction(delta, m & has_next & (delta > 0), m, frac)


def anchor_tokens(fai_a: Tensor, mask: Tensor, frac: float) -> Tensor:
    """Anchor tokens: the top ``frac`` of the response tokens by FAI, among those with a
    measured influence (FAI > 0: some response token in the FAI window attends to them)."""
    m = mask.bool()
    return top_fraction(fai_a, m & (fai_a > 0), m, frac)


def coupled_preplan(waad_a: Tensor, plan: Tensor, anchors: Tensor, mask: Tensor, *, within: int,
                    waad_max: float | None) -> Tensor:
    """(B, T) long: for each anchor coupled to a pre-planning token, that token's position;
    -1 elsewhere. Coupled (the paper's temporal coupling): the anchor is local itself
    (WAAD <= ``waad_max`` tau; null: no threshold) and a pre-planning token lies within the
    ``within`` (k) positions before it (the nearest is taken); an anchor that is its own
    pre-planning token is not coupled (the two coincide)."""
    m = mask.bool()
    T = m.shape[-1]
    out = torch.full(m.shape, -1, dtype=torch.long, device=m.device)
    ok = anchors & ~plan & m
    if waad_max is not None:
        ok = ok & (waad_a <= waad_max)
    pos = torch.arange(T, device=m.device).expand_as(m)
    for d in range(within, 0, -1):  # the nearest last: it overwrites the farther ones
        p = pos - d
        hit = ok & (p >= 0) & plan.gather(-1, p.clamp(min=0)) & m.gather(-1, p.clamp(min=0))
        out = torch.where(hit, p, out)
    return out


def credit_scale(waad_a: Tensor, fai_a: Tensor, mask: Tensor, *, scheme: str, top_k: float,
                 amplify_preplan: float, amplify_anchor: float, pass_fraction: float,
                 couple_within: int = 3, couple_waad_max: float | None = None) -> Tensor:
    """Per-token advantage scale (B, T), 1 off the selected tokens and off the response.

    - ``local_chunk``: pre-planning tokens P (:func:`preplan_tokens`) get ``1 + amplify_preplan``.
    - ``global_anchor``: anchor tokens A (:func:`anchor_tokens`) get ``1 + amplify_anchor``.
    - ``coupled``: anchors get ``1 + amplify_anchor``; an anchor coupled to a pre-planning token
      p (:func:`coupled_preplan`: p within ``couple_within`` positions before it, its own WAAD
      <= ``couple_waad_max``) passes ``pass_fraction`` of its extra credit to p, which planned
      it: anchor ``1 + (1 - f) g``, p ``+ f g``.
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
    src = coupled_preplan(waad_a, plan, anchors, m, within=couple_within, waad_max=couple_waad_max)
    linked = src >= 0
    passed = pass_fraction * amplify_anchor * linked.float()
    return (scale - passed).scatter_add(-1, src.clamp(min=0), passed)


def scale_advantages(adv: Tensor, scale: Tensor) -> Tensor:
    """Advantages (B,) or (B, T) times a per-token ``scale`` (B, T): (B, T)."""
    if adv.dim() == 1:
        adv = adv.unsqueeze(-1).expand_as(scale)
    if adv.shape != scale.shape:
        raise ValueError(f"advantages of shape {tuple(adv.shape)} do not match the credit scale {tuple(scale.shape)}")
    return adv * scale.to(adv.dtype)
