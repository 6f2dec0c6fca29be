"""Trainer configuration: dataclasses loaded from YAML and validated.

Every section is a dataclass; :func:`load_config` builds them from a mapping and every
problem is a :class:`ConfigError` naming the dotted key (``rollout.group_size: must be >= 1``,
``algorithm.clip: unknown key``), so a typo in a YAML file never silently falls back to a
default.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "AlgorithmConfig", "CheckpointConfig", "ConfigError", "CriticsConfig", "CurriculumConfig", "EngineConfig", "EnvConfig",
    "EvalConfig", "GenerationConfig", "IPAConfig", "JudgeConfig", "LoggingConfig", "ModelConfig", "RAFTConfig", "RayConfig",
    "RewardConfig", "RhythmConfig", "RoleResources", "RolloutConfig", "TokenizerConfig", "TrainConfig", "VerifierConfig",
    "config_to_dict", "load_config",
]

TURN_CREDIT = ("outcome", "discounted")
IPA_RETURNS = ("absolute", "group_normalized")
AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")


class ConfigError(ValueError):
    """A bad configuration; the message starts with the dotted key at fault."""

    def __init__(self, key: str, problem: str):
        self.key = key
        super().__init__(f"{key}: {problem}" if key else problem)


def _check(cond: bool, key: str, problem: str) -> None:
    if not cond:
        raise ConfigError(key, problem)


@dataclass
class LoRAConfig:
    """LoRA adapters (``peft``) on the policy, for SFT and RL alike: only the adapters (and
    PPO's value head) train; the generator and the batch roles get the merged weights
    (``W + B A * alpha / r``) at each sync; checkpoints hold the adapters and their optimizer
    state (the base is rebuilt from ``model.name_or_path``); ``rockroll sft`` writes the merged
    model folder (what ``model.init_from`` loads) and the adapter beside it (``adapter/``)."""

    r: int = 0  # the adapters' rank (0: off, full fine-tuning)
    alpha: float = 16.0  # the scale's numerator: the update is B A * alpha / r
    dropout: float = 0.0  # dropout on the adapters' input (0: the sampled and trained distributions agree)
    # the linear layers that get adapters, by name (Llama's attention and MLP projections)
    target_modules: list[str] = field(default_factory=lambda: [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])

    def validate(self, p: str) -> None:
        _check(self.r >= 0, f"{p}.r", "must be >= 0 (0: off)")
        _check(self.alpha > 0, f"{p}.alpha", "must be > 0")
        _check(0 <= self.dropout < 1, f"{p}.dropout", "must be in [0, 1)")
        _check(bool(self.target_modules) and all(isinstance(t, str) and t for t in self.target_modules),
               f"{p}.target_modules", "must be a non-empty list of module names")


@dataclass
class ModelConfig:
    """The policy. ``name_or_path`` loads a pretrained model: a folder, a ``.gguf`` file or a
    folder imported once under ``$ROCKROLL_HOME/models`` (``rockroll model import``), an imported
    name, or a packaged name such as ``smollm2-135m-instruct`` (imported from its package on
    first use: :mod:`rockroll.trainer.model_store`); its tokenizer and chat template come with
    it. Without it a tiny Llama is built from the dims below (CPU runs, tests). ``init_from``:
    the model folder ``rockroll sft`` wrote (a warm start): its weights and its tokenizer, in
    place of ``name_or_path`` (which the SFT stage of the same YAML started from)."""

    # a pretrained model: folder, .gguf file, imported or packaged name (null: a tiny Llama of the dims below)
    name_or_path: str | None = None
    # the model folder an SFT stage wrote (weights and tokenizer; it replaces name_or_path, which that SFT
    # stage of the same config started from; null: name_or_path or a fresh tiny Llama)
    init_from: str | None = None
    hidden_size: int = 128  # tiny model (no name_or_path): width
    num_layers: int = 2  # tiny model: decoder layers
    num_heads: int = 2          # tiny model: attention heads; head dim = hidden_size / num_heads (64: what vLLM
    #                             kernels expect)
    intermediate_size: int = 256  # tiny model: MLP width
    max_position_embeddings: int = 2048  # tiny model: the context length it is built for
    dtype: str = "float32"  # weights' dtype (float32, bfloat16, float16), loaded or built, and the vLLM engine's
    # recompute activations in the backward pass instead of keeping them: less memory, more compute
    gradient_checkpointing: bool = False
    lora: LoRAConfig = field(default_factory=LoRAConfig)  # LoRA adapters (r: 0, off: full fine-tuning)

    def validate(self, p: str) -> None:
        for k in ("hidden_size", "num_layers", "num_heads", "intermediate_size", "max_position_embeddings"):
            _check(getattr(self, k) >= 1, f"{p}.{k}", "must be >= 1")
        _check(self.hidden_size % self.num_heads == 0, f"{p}.num_heads", "must divide hidden_size")
        _check(self.dtype in ("float32", "bfloat16", "float16"), f"{p}.dtype",
               "must be one of float32, bfloat16, float16")
        self.lora.validate(f"{p}.lora")


@dataclass
class TokenizerConfig:
    """``name_or_path`` loads a tokenizer folder/hub id; without it one is built over the
    environments' texts and saved to ``build_dir``, with a Jinja chat template of its own
    (``models.WORD_CHAT_TEMPLATE``): ``kind: bpe``, a byte-level BPE of ``vocab_size`` tokens
    (any text encodes, none becomes ``<|unk|>``), or ``kind: word``, one token per word the envs
    printed while it was built (each move one token: what the tiny CPU examples' constrained
    decoding and their measured learning bounds rest on; a word seen only later is spelled out
    in its letters, so printable ASCII never becomes ``<|unk|>``: only characters beyond it do).

    How turns are framed (``rollout.PromptTemplate``): ``template: chat`` renders the
    conversation with the tokenizer's own chat template (``apply_chat_template``, with the
    tools an env offers), ``system`` as the system message (none when empty). ``template:
    prefixes`` is for a tokenizer without a chat template (a base model's): it joins
    ``user_prefix``, ``user_suffix`` and ``assistant_prefix`` around each observation by hand
    (``system`` then is raw text before the first turn); those keys are read only then. The
    policy's replies end with ``stop``, the template's end-of-turn token.
    ``add_tokens``: strings a built tokenizer keeps whole, one token each (a whole answer
    such as ``\\boxed{7}``, so ``generation.allowed_tokens`` can name it)."""

    # a pretrained tokenizer (folder or hub id); null: the pretrained model's own (model.name_or_path,
    # model.init_from), else a tokenizer built over the envs' texts
    name_or_path: str | None = None
    # the built tokenizer: word (one token per word seen: one-token moves; an unseen word is its letters)
    # or bpe (byte-level BPE: every text encodes, nothing is unknown)
    kind: str = "word"
    vocab_size: int = 1024  # kind bpe: the BPE's vocabulary size (special tokens and the 256 bytes included)
    build_dir: str | None = None  # where the built tokenizer is saved and reused (null: <logging.dir>/tokenizer)
    template: str = "chat"  # chat: the tokenizer's chat template frames the turns; prefixes: the three keys below do
    system: str = ""  # the system message (chat; none when empty), or raw text before the first turn (prefixes)
    user_prefix: str = "<|user|>"  # prefixes only: text before each observation
    user_suffix: str = "<|end|>"  # prefixes only: text after each observation
    assistant_prefix: str = "<|assistant|>"  # prefixes only: text before each reply (the generation prompt)
    # the end-of-turn token a reply ends with (must end an assistant turn of the chat template; empty: the
    # tokenizer's eos token, e.g. a built tokenizer's <|end|>, ChatML's <|im_end|>)
    stop: str = ""
    # built tokenizer only: strings kept whole, one token each (e.g. \boxed{7})
    add_tokens: list[str] = field(default_factory=list)

    def validate(self, p: str) -> None:
        _check(self.template in ("chat", "prefixes"), f"{p}.template", "must be chat or prefixes")
        _check(self.kind in ("word", "bpe"), f"{p}.kind", "must be word or bpe")
        _check(self.vocab_size >= 512, f"{p}.vocab_size", "must be >= 512 (the 256 bytes and the merges)")
        for key in ("user_prefix", "user_suffix", "assistant_prefix"):  # the chat template frames turns
            _check(self.template == "prefixes" or getattr(self, key) == getattr(TokenizerConfig, key), f"{p}.{key}",
                   "read only with template: prefixes (a tokenizer without a chat template); "
                   "with template: chat the tokenizer's chat template frames the turns: remove it")
        _check(not (self.add_tokens and self.name_or_path), f"{p}.add_tokens",
               "only for a built tokenizer (a pretrained model's embeddings have no rows for them)")
        _check(all(isinstance(t, str) and t for t in self.add_tokens), f"{p}.add_tokens", "must be non-empty strings")


@dataclass
class EnvConfig:
    """One entry of the task mixture: a gymnasium id, its kwargs, its sampling weight and
    (optionally) a fixed list of task ids, so a run can train on a small learnable set."""

    id: str = "rock/FrozenLake-v0"  # a gymnasium id (rock/...), a gem-llm id (gem:...) or an entry point module:Class
    weight: float = 1.0  # sampling weight among the mixture's entries
    kwargs: dict[str, Any] = field(default_factory=dict)  # keyword arguments of the env (gymnasium.make(id, **kwargs))
    # tasks to train and evaluate on, as reset(options={'task_id': ...}), or {range: [start, stop]} (null: the env draws)
    task_ids: list[Any] | None = None
    hub: str | None = None  # the hub the id is read from (filled from the run's `hubs` when it loads)

    def validate(self, p: str) -> None:
        _check(bool(self.id), f"{p}.id", "must be a gymnasium id")
        _check(self.weight > 0, f"{p}.weight", "must be > 0")
        _check(self.task_ids is None or len(self.task_ids) > 0, f"{p}.task_ids", "must not be empty")


@dataclass
class CurriculumConfig:
    """Initialized sampling, a rollback curriculum (see :mod:`rockroll.trainer.rollout.curriculum`):
    groups of a task start from states saved along one of its successful episodes, first one
    turn before the goal, then earlier as the success rate at the current start rises."""

    enabled: bool = False  # start groups from states along a task's successful episode (needs envs with task_ids)
    promote_at: float = 0.8  # mean group success at the current start that moves it one turn earlier
    window: int = 4          # groups started at a level that the mean is taken over

    def validate(self, p: str) -> None:
        _check(0 < self.promote_at <= 1, f"{p}.promote_at", "must be in (0, 1]")
        _check(self.window >= 1, f"{p}.window", "must be >= 1")


@dataclass
class RolloutConfig:
    """How episodes are played and grouped (:mod:`rockroll.trainer.rollout`): every env runs
    its own loop, generation requests are batched, a group is ``group_size`` episodes of one
    task, a step trains on ``batch_groups`` finished groups, and ``async_ratio`` bounds how
    stale (in policy versions) a sample may be."""

    group_size: int = 8            # G rollouts per task (one GRPO group)
    redundant: int = 0             # r extra envs per group: the first G finished complete it
    async_ratio: int = 0           # alpha: a sample started at version v is used at step t iff t - v <= alpha
    max_turns: int = 8  # an episode stops (truncated) after this many replies
    batch_groups: int = 4          # groups per training step
    max_concurrent_groups: int = 0  # groups in flight at once (0: batch_groups * (async_ratio + 1))
    max_batch_size: int = 64       # most requests in one generate() call
    batch_wait_ms: float = 5.0     # how long a partial generation batch waits for more requests
    max_seq_len: int = 2048        # an episode stops (truncated) before its tokens exceed this
    env_threads: int = 0           # >0: blocking env.step runs in a thread pool of this size
    infra_error_streak: int = 0    # episodes dropped for infrastructure errors in a row (none valid
    #                                between) before the run fails; 0: twice a batch's episodes
    # Spare groups: start this many groups beyond a step's batch_groups and train on the first
    # that finish ("first": faster, biased toward short episodes) or on a random batch_groups of
    # them once all are in ("quorum": unbiased; spares then only cover dropped groups).
    spare_groups: int = 0
    spare_selection: str = "first"  # which spares a step trains on: first or quorum (see spare_groups)
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)  # initialized sampling (rollback curriculum)

    def validate(self, p: str) -> None:
        for k in ("group_size", "max_turns", "batch_groups", "max_batch_size", "max_seq_len"):
            _check(getattr(self, k) >= 1, f"{p}.{k}", "must be >= 1")
        for k in ("redundant", "async_ratio", "max_concurrent_groups", "env_threads", "spare_groups",
                  "infra_error_streak"):
            _check(getattr(self, k) >= 0, f"{p}.{k}", "must be >= 0")
        _check(self.spare_selection in ("first", "quorum"), f"{p}.spare_selection", "must be first or quorum")
        _check(self.batch_wait_ms >= 0, f"{p}.batch_wait_ms", "must be >= 0")
        self.curriculum.validate(f"{p}.curriculum")


@dataclass
class IPAConfig:
    """Chunk-level IPA (``algorithm.name: grpo``, :mod:`rockroll.trainer.algorithms.credit`), as
    the ROME paper defines it (arXiv 2512.24873, section 3.2.4): a chunk is one turn; its return
    is gamma^(K-k) * R, absolute, no group baseline (Eq 7); the loss is TOPR-style (Eq 9): a
    positive chunk's tokens get G * grad log pi with no ratio, a negative chunk's
    sg(clip(rho, 0, 1)) * G * grad log pi, rho the geometric mean of pi_theta / pi_old over the
    chunk; a chunk whose geometric mean of pi_old / mu exceeds ``mask_threshold`` is masked
    out of the loss (Eq 8, one-sided)."""

    enabled: bool = False  # IPA's chunk returns and chunk loss replace grpo's (algorithm.name: grpo)
    gamma: float = 1.0  # chunk k of K gets the return gamma^(K-1-k) * R (0-based k; the last chunk gets R)
    # Eq 8's H: a chunk whose geometric-mean ratio pi_old / mu (to the generator) is above this is masked out
    mask_threshold: float = 5.0
    # absolute: Eq 7, gamma^Delta * R (the paper); group_normalized: gamma^Delta * the GRPO-normalised R
    # (rockroll before issue #40: learned the tiny two-turn task on 3 of 3 seeds where absolute did on 1)
    returns: str = "absolute"

    def validate(self, p: str) -> None:
        _check(0 < self.gamma <= 1, f"{p}.gamma", "must be in (0, 1]")
        _check(self.mask_threshold >= 1, f"{p}.mask_threshold", "must be >= 1 (the on-policy ratio is 1)")
        _check(self.returns in IPA_RETURNS, f"{p}.returns", f"must be one of {', '.join(IPA_RETURNS)}")


@dataclass
class RhythmConfig:
    """Attention-rhythm credit (:mod:`rockroll.trainer.algorithms.rhythm`, arXiv 2510.13554): an
    eager-attention copy of the policy reads WAAD (from the ``head_fraction`` most local heads)
    and FAI (from the ``head_fraction`` most global heads) of ``layers`` layers of the middle
    third off each sampled sequence, and scales the advantages of its pre-planning and anchor
    tokens. ``scheme``: local_chunk (pre-planning tokens: top |WAAD_t - WAAD_{t+1}|),
    global_anchor (top-FAI tokens) or coupled (anchors, passing ``pass_fraction`` of their
    extra credit to a pre-planning token within ``couple_within`` tokens before them).
    ``top_k``: the fraction of a response's tokens selected as pre-planning / anchor tokens;
    ``amplify_*``: a selected token's scale is 1 + amplify. ``window``: WAAD's distance clip;
    FAI averages the attention from the tokens ``fai_window_low`` to ``fai_window_high`` later."""

    enabled: bool = False  # scale advantages by the attention rhythm (an eager-attention copy reads every batch)
    scheme: str = "coupled"  # local_chunk, global_anchor or coupled (above)
    top_k: float = 0.4  # fraction of a response's tokens selected as pre-planning / anchor tokens
    window: int = 10  # WAAD's distance clip, in tokens
    fai_window_low: int = 10  # FAI of token s: mean attention from tokens s + this ... (the paper's H_lo)
    fai_window_high: int = 100  # ... to s + this (the paper's H_hi)
    # layers of the middle third read (the paper: 5); a model whose middle third has fewer gives all of it
    layers: int = 5
    head_fraction: float = 0.3  # WAAD from this fraction of heads that look least far back, FAI from the farthest
    amplify_preplan: float = 0.5  # local_chunk: a pre-planning token's scale is 1 + this
    amplify_anchor: float = 0.5  # global_anchor, coupled: an anchor token's scale is 1 + this
    # coupled: the share of an anchor's extra credit passed to the pre-planning token that planned it
    pass_fraction: float = 0.5
    couple_within: int = 3  # coupled: a pre-planning token at most this many tokens before the anchor (k: 1..3)
    # coupled: the anchor's own WAAD must be <= this (the paper's tau); null: no threshold
    couple_waad_max: float | None = None

    def validate(self, p: str) -> None:
        from .algorithms.rhythm import SCHEMES

        _check(self.scheme in SCHEMES, f"{p}.scheme", f"must be one of {', '.join(SCHEMES)}")
        _check(0 < self.top_k <= 1, f"{p}.top_k", "must be in (0, 1]")
        _check(self.window >= 1, f"{p}.window", "must be >= 1")
        _check(self.layers >= 1, f"{p}.layers", "must be >= 1")
        _check(1 <= self.fai_window_low <= self.fai_window_high, f"{p}.fai_window_low",
               "need 1 <= fai_window_low <= fai_window_high")
        _check(0 < self.head_fraction <= 0.5, f"{p}.head_fraction",
               "must be in (0, 0.5] (the local and the global heads are apart)")
        _check(self.couple_within >= 1, f"{p}.couple_within", "must be >= 1")
        for k in ("amplify_preplan", "amplify_anchor"):
            _check(getattr(self, k) >= 0, f"{p}.{k}", "must be >= 0")
        _check(0 <= self.pass_fraction <= 1, f"{p}.pass_fraction", "must be in [0, 1]")
        # a key the scheme never reads, set away from its default, would silently do nothing
        reads = {"local_chunk": ("amplify_preplan",), "global_anchor": ("amplify_anchor",),
                 "coupled": ("amplify_anchor", "pass_fraction", "couple_within", "couple_waad_max")}[self.scheme]
        for k in ("amplify_preplan", "amplify_anchor", "pass_fraction", "couple_within", "couple_waad_max"):
            _check(k in reads or getattr(self, k) == getattr(RhythmConfig, k), f"{p}.{k}",
                   f"not used by scheme={self.scheme}: remove it")


@dataclass
class CriticsConfig:
    """AsyPPO's mini-critics (``algorithm.name: asyppo``, :mod:`rockroll.trainer.roles.critics`):
    ``count`` small value models of their own (``name_or_path``: a pretrained checkpoint, as
    in the paper; null: a tiny random Llama of these dims, the CPU default), each trained with
    its own optimizer on a disjoint shard of every batch: each prompt's responses are dealt out
    among them, so every critic sees every prompt. Their mean value is the GAE baseline; the
    spread (std) of their values per state reshapes the policy loss: the states where they
    agree most (the ``mask_quantile`` fraction of the batch's response states with the lowest
    std; the paper: 20 %) get advantage 0, those where they disagree most (the
    ``1 - entropy_quantile`` fraction with the highest std; the paper's Fig 7c ablation: 40 %)
    are left out of the entropy bonus (``algorithm.entropy_coef``)."""

    count: int = 2  # mini-critics, each trained on its own share of every prompt's responses (>= 2)
    # a pretrained checkpoint each critic starts from (the paper: 0.6B-4B of the policy's family);
    # null: a tiny random-initialised Llama of the dims below (the CPU default, no download)
    name_or_path: str | None = None
    hidden_size: int = 64  # tiny critic: width
    num_layers: int = 1  # tiny critic: decoder layers
    num_heads: int = 1  # tiny critic: attention heads (must divide hidden_size)
    intermediate_size: int = 128  # tiny critic: MLP width
    lr: float = 1e-3  # each critic's AdamW learning rate
    mask_quantile: float = 0.2      # fraction of states, lowest critic std first, whose advantage is 0 (0: none)
    # states above this quantile of critic std get no entropy bonus (1: none); 0.6: the paper's
    # best filtering ratio (Fig 7c: the top 40 % most uncertain states out of the entropy bonus)
    entropy_quantile: float = 0.6

    def validate(self, p: str) -> None:
        _check(self.count >= 2, f"{p}.count", "must be >= 2 (AsyPPO's uncertainty is their disagreement)")
        for k in ("hidden_size", "num_layers", "num_heads", "intermediate_size"):
            _check(getattr(self, k) >= 1, f"{p}.{k}", "must be >= 1")
        _check(self.hidden_size % self.num_heads == 0, f"{p}.num_heads", "must divide hidden_size")
        _check(self.lr > 0, f"{p}.lr", "must be > 0")
        _check(0 <= self.mask_quantile <= 1, f"{p}.mask_quantile", "must be in [0, 1]")
        _check(0 <= self.entropy_quantile <= 1, f"{p}.entropy_quantile", "must be in [0, 1]")


@dataclass
class RAFTConfig:
    """RAFT (``algorithm.name: raft``): per group, the ``top_k`` samples of highest reward are
    accepted (0: no rank limit), and only those whose reward is above ``min_reward`` (null: no
    threshold); the policy trains by maximum likelihood on the accepted samples."""

    top_k: int = 1  # samples accepted per group, highest reward first (0: no rank limit)
    min_reward: float | None = None  # accept only rewards above this (null: no threshold)

    def validate(self, p: str) -> None:
        _check(self.top_k >= 0, f"{p}.top_k", "must be >= 0")
        _check(self.top_k > 0 or self.min_reward is not None, f"{p}.top_k",
               "0 (no rank limit) needs a min_reward, else every sample is accepted")


@dataclass
class AlgorithmConfig:
    """The advantage estimator and policy loss (``name``, a row of
    :data:`rockroll.trainer.algorithms.ALGORITHMS`) and the credit options. A key the chosen
    algorithm does not read, set away from its default, is a ConfigError naming it."""

    name: str = "grpo"  # grpo, ppo, reinforce_pp, topr, cispo, asyppo or raft (algorithms.ALGORITHMS)
    clip_low: float = 0.2  # the clipped ratio's lower bound is 1 - clip_low
    clip_high: float = 0.28  # the clipped ratio's upper bound is 1 + clip_high
    dual_clip: float | None = None  # c > 1: a negative-advantage token's loss is capped at c * |A| (null: off)
    # k3 KL to the frozen initial policy, times this, in the loss (reinforce_pp: in the reward); 0: no reference
    kl_coef: float = 0.0
    # how per-token losses reduce to one: token-mean, seq-mean-token-mean or seq-mean-token-sum
    loss_agg: str = "token-mean"
    # divide group-centred rewards by the group's std (false: Dr.GRPO, the mean baseline only)
    std_normalize: bool = True
    # drop and refill groups whose advantages are all zero (every episode earned the same)
    dynamic_sampling: bool = False
    # dynamic sampling gives up (the rollout fails with ZeroAdvantageError) once this many
    # batches' worth of groups in a row (x rollout.batch_groups) had zero advantage: a policy
    # that always earns the same (collapsed, or the task solved) would otherwise be sampled forever.
    # Generous: early in a sparse-reward run most groups fail alike (the FrozenLake example
    # drops 40 in a row before its first success on some seeds)
    dynamic_sampling_max_batches: int = 100
    format_penalty: float | None = None  # reward of an unparsable reply: overrides each env's format_penalty when set
    tis_cap: float = 2.0                 # PPO clip loss: truncated IS weight pi_old / pi_behav (0: off)
    ppo_epochs: int = 1  # passes over each step's batch
    mini_batches: int = 1  # optimizer steps per pass: the batch is split into this many
    # outcome: every token of an episode shares one advantage from its summed reward;
    # discounted: each turn's tokens get the group-normalised discounted return-to-go of the
    # per-turn rewards (gamma), see credit.turn_advantages
    turn_credit: str = "outcome"
    gamma: float = 1.0                   # ppo: GAE; turn_credit=discounted: per-turn discount
    lam: float = 0.95  # GAE's lambda (ppo, asyppo)
    vf_coef: float = 0.5  # weight of the value head's squared error in the loss (ppo)
    ipa: IPAConfig = field(default_factory=IPAConfig)  # chunk-level IPA credit (grpo only)
    rhythm: RhythmConfig = field(default_factory=RhythmConfig)  # attention-rhythm credit
    # entropy bonus: loss -= entropy_coef * H(pi) over response tokens (the entropy is logged always)
    entropy_coef: float = 0.0
    critics: CriticsConfig = field(default_factory=CriticsConfig)   # AsyPPO's mini-critics (asyppo only)
    raft: RAFTConfig = field(default_factory=RAFTConfig)            # RAFT's acceptance rule (raft only)

    @property
    def spec(self):
        """This algorithm's entry of :data:`rockroll.trainer.algorithms.table.ALGORITHMS`."""
        from .algorithms.table import ALGORITHMS  # imported here: importing the config needs no torch

        return ALGORITHMS[self.name]

    @property
    def estimator(self):
        """The advantage estimator that runs (a :class:`~.algorithms.table.Part`), credit options applied."""
        return self.spec.select(self.turn_credit, self.ipa.enabled)[0]

    @property
    def policy_loss(self):
        """The policy loss that runs (a :class:`~.algorithms.table.Part`): ``topr``, ``cispo``,
        ``ipa`` (grpo with ``ipa.enabled``) or ``ppo_clip`` (grpo, ppo, reinforce_pp): PPO's
        clipped ratio to the proximal policy."""
        return self.spec.select(self.turn_credit, self.ipa.enabled)[1]

    @property
    def advantages(self) -> str:
        """The name of :attr:`estimator`."""
        return self.estimator.name

    @property
    def loss(self) -> str:
        """The name of :attr:`policy_loss`."""
        return self.policy_loss.name

    def validate(self, p: str) -> None:
        from .algorithms.table import ALGORITHMS

        _check(self.name in ALGORITHMS, f"{p}.name", f"must be one of {', '.join(ALGORITHMS)}")
        _check(self.loss_agg in AGG_MODES, f"{p}.loss_agg", f"must be one of {', '.join(AGG_MODES)}")
        _check(0 <= self.clip_low < 1, f"{p}.clip_low", "must be in [0, 1)")
        _check(self.clip_high >= 0, f"{p}.clip_high", "must be >= 0")
        _check(self.dual_clip is None or self.dual_clip > 1, f"{p}.dual_clip", "must be > 1 (or null)")
        _check(self.kl_coef >= 0, f"{p}.kl_coef", "must be >= 0")
        _check(self.tis_cap >= 0, f"{p}.tis_cap", "must be >= 0")
        _check(self.ppo_epochs >= 1, f"{p}.ppo_epochs", "must be >= 1")
        _check(self.mini_batches >= 1, f"{p}.mini_batches", "must be >= 1")
        _check(self.dynamic_sampling_max_batches >= 1, f"{p}.dynamic_sampling_max_batches", "must be >= 1")
        _check(0 < self.gamma <= 1, f"{p}.gamma", "must be in (0, 1]")
        _check(0 <= self.lam <= 1, f"{p}.lam", "must be in [0, 1]")
        _check(self.turn_credit in TURN_CREDIT, f"{p}.turn_credit", f"must be one of {', '.join(TURN_CREDIT)}")
        self.ipa.validate(f"{p}.ipa")
        self.rhythm.validate(f"{p}.rhythm")
        _check(self.entropy_coef >= 0, f"{p}.entropy_coef", "must be >= 0")
        self.critics.validate(f"{p}.critics")
        self.raft.validate(f"{p}.raft")
        # A combination the trainer would silently ignore is an error naming the ignored key.
        spec = self.spec
        _check(not self.ipa.enabled or spec.ipa, f"{p}.ipa.enabled",
               f"IPA (chunk credit and loss) runs with algorithm.name="
               f"{' or '.join(n for n, s in ALGORITHMS.items() if s.ipa)} only, not {self.name}")
        _check(self.turn_credit == "outcome" or spec.turn_credit, f"{p}.turn_credit",
               f"discounted needs algorithm.name {' or '.join(n for n, s in ALGORITHMS.items() if s.turn_credit)} "
               f"(group-normalised advantages), not {self.name}")
        _check(not (self.ipa.enabled and self.turn_credit == "discounted") or self.ipa.gamma == 1.0,
               f"{p}.ipa.gamma", "unused with turn_credit=discounted (algorithm.gamma discounts the turns)")
        # TOPR weighs each sequence by the sign of its one return: a per-token scale has no place in it
        _check(not self.rhythm.enabled or self.loss != "topr", f"{p}.rhythm.enabled",
               f"rhythm credit scales per-token advantages; algorithm.name={self.name} takes one return per sequence")
        # Keys only some losses/advantages read: a non-default value elsewhere would do nothing.
        reads = spec.reads(self.turn_credit, self.ipa.enabled)
        defaults = AlgorithmConfig()
        for key in ("clip_low", "clip_high", "dual_clip", "tis_cap", "std_normalize", "gamma", "lam", "vf_coef"):
            _check(key in reads or getattr(self, key) == getattr(defaults, key), f"{p}.{key}",
                   f"not used by algorithm.name={self.name}{' with ipa.enabled' if self.ipa.enabled else ''}: "
                   "remove it")
        for key, used in (("critics", spec.critics), ("raft", spec.advantages.name == "raft")):
            _check(used or getattr(self, key) == getattr(defaults, key), f"{p}.{key}",
                   f"not used by algorithm.name={self.name}: remove it")


@dataclass
class EngineConfig:
    """Where the policy trains: plain PyTorch, or DeepSpeed ZeRO (``zero_stage`` 0-3)."""

    kind: str = "torch"  # torch or deepspeed
    zero_stage: int = 1  # deepspeed: ZeRO stage (1 partitions optimizer state, 2 also gradients, 3 also parameters)
    lr: float = 1e-3  # AdamW learning rate
    weight_decay: float = 0.0  # AdamW weight decay
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # AdamW betas
    grad_clip: float = 1.0  # gradient-norm clip per optimizer step (0: off)
    # sequences per forward/backward: a mini-batch's micro-batches accumulate their gradients
    # into one optimizer step, exactly as one pass would (0: the whole mini-batch at once)
    micro_batch_size: int = 0
    # micro_batch_size 0: a mini-batch whose fp32 logits (rows x longest row x vocabulary x 4 bytes)
    # exceed this many MiB is cut into as many micro-batches as keep each within it. A real model's
    # 49k vocabulary makes logits the memory of an update (16 seven-turn episodes of SmolLM2 in one
    # forward took 12 GB); a tiny model's never come near it (0: never cut)
    logits_mib: float = 256.0

    def validate(self, p: str) -> None:
        _check(self.kind in ("torch", "deepspeed"), f"{p}.kind", "must be torch or deepspeed")
        _check(self.zero_stage in (0, 1, 2, 3), f"{p}.zero_stage", "must be 0, 1, 2 or 3")
        _check(self.lr > 0, f"{p}.lr", "must be > 0")
        _check(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), f"{p}.betas",
               "must be two numbers in [0, 1)")
        _check(self.grad_clip >= 0, f"{p}.grad_clip", "must be >= 0")
        _check(self.micro_batch_size >= 0, f"{p}.micro_batch_size", "must be >= 0")
        _check(self.logits_mib >= 0, f"{p}.logits_mib", "must be >= 0")


@dataclass
class GenerationConfig:
    """How replies are sampled (:mod:`rockroll.trainer.sampling`): temperature, the repetition
    penalty, min-p, top-k, top-p and the allowed tokens define one distribution, used alike by the generator and the
    trainer's log-probs."""

    backend: str = "transformers"  # transformers (in process, CPU or GPU) or vllm (extra vllm)
    temperature: float = 1.0  # sampling temperature; the trainer's log-probs are taken under it too
    top_p: float = 1.0  # nucleus sampling: the smallest set of tokens holding this mass (1: off)
    # sample among the k most likely tokens (0: off). top-k / top-p truncate the distribution the
    # generator samples from; the trainer's log-probs are taken under the same truncation
    # (trainer/sampling.py), so ratios are unbiased
    top_k: int = 0
    # min-p sampling: tokens less likely than min_p times the likeliest are removed, before top-k and
    # top-p as vLLM orders them (0: off); the trainer's log-probs are taken under it too
    min_p: float = 0.0
    # the repetition penalty (CTRL's, as vLLM and Transformers apply it; 1: off): a token already in
    # the context, prompt or reply, has its logit divided by it when positive, multiplied when
    # negative; the trainer's log-probs apply it at every position to that position's context
    repetition_penalty: float = 1.0
    max_new_tokens: int = 4  # longest reply per turn, in tokens
    gpu_memory_utilization: float = 0.5  # vllm only: the share of the GPU's memory the engine may take
    # Constrained decoding: the reply may use only these texts, each one token of the tokenizer
    # (empty: the whole vocabulary). Generator and trainer both renormalise over them, so the
    # learned log-probs are those of the distribution sampled from. For action-space tasks and
    # a policy trained from scratch, which has no prior for the reply format.
    allowed_tokens: list[str] = field(default_factory=list)
    # Continuous batching (queue scheduling): each request joins the engine's running batch and
    # leaves it when done; false (and under deterministic: true, whose batches must not depend
    # on timing): the rollout sends one blocking batch call at a time.
    continuous: bool = True
    # What a weight load does to requests in flight (continuous engines): "wait" lets them
    # finish on the old weights first; "abort" restarts them on the new ones (same seed).
    on_weight_load: str = "wait"
    # transformers backend: the KV of finished replies kept (at most this many MiB; 0: off) for
    # the prompt that extends one, an episode's next turn, which then prefills its new tokens
    # only (trainer/engines/prefix.py); cleared at every weight load
    prefix_cache_mb: float = 1024

    def validate(self, p: str) -> None:
        _check(self.backend in ("transformers", "vllm"), f"{p}.backend", "must be transformers or vllm")
        _check(self.on_weight_load in ("wait", "abort"), f"{p}.on_weight_load", "must be wait or abort")
        _check(self.prefix_cache_mb >= 0, f"{p}.prefix_cache_mb", "must be >= 0")
        _check(all(isinstance(t, str) and t for t in self.allowed_tokens), f"{p}.allowed_tokens",
               "must be a list of non-empty strings")
        _check(self.temperature > 0, f"{p}.temperature", "must be > 0")
        _check(0 < self.top_p <= 1, f"{p}.top_p", "must be in (0, 1]")
        _check(self.top_k >= 0, f"{p}.top_k", "must be >= 0 (0: off)")
        _check(0 <= self.min_p < 1, f"{p}.min_p", "must be in [0, 1) (0: off)")
        _check(self.repetition_penalty > 0, f"{p}.repetition_penalty", "must be > 0 (1: off)")
        _check(self.max_new_tokens >= 1, f"{p}.max_new_tokens", "must be >= 1")


@dataclass
class CheckpointConfig:
    """Checkpoints of the whole run (model, optimizer, rollout buffer, step, RNG, the batch
    roles' state) in ``dir``, every ``every`` steps and at the end; a rerun resumes from the
    latest."""

    dir: str | None = None  # folder of the run's checkpoints (null: none saved, none resumed)
    every: int = 0          # steps between checkpoints (0: only at the end)
    resume: bool = True     # continue from the latest checkpoint in ``dir`` if there is one
    keep: int = 2  # newest checkpoints kept; older ones are deleted

    def validate(self, p: str) -> None:
        _check(self.every >= 0, f"{p}.every", "must be >= 0")
        _check(self.keep >= 1, f"{p}.keep", "must be >= 1")


@dataclass
class LoggingConfig:
    """What a run writes to its folder (:mod:`rockroll.trainer.runlog`)."""

    # the run folder: metrics.jsonl, eval.jsonl, tb/, curve.png, transcripts/ (and a built tokenizer)
    dir: str = "runs/default"
    tensorboard: bool = True  # write TensorBoard events under <dir>/tb
    plot: bool = True  # draw <dir>/curve.png (reward and success per step, evaluations as points)
    transcripts: int = 2    # sample transcripts written per step
    progress: bool = True  # a progress bar on stderr
    plot_every: int = 10  # steps between redraws of curve.png

    def validate(self, p: str) -> None:
        _check(self.transcripts >= 0, f"{p}.transcripts", "must be >= 0")
        _check(self.plot_every >= 1, f"{p}.plot_every", "must be >= 1")


@dataclass
class EvalConfig:
    """Evaluation with the current weights every ``every`` steps (0: never), before step 0 and
    after the last step: ``episodes`` per env from each task's first observation, on a fixed
    list of seeds, at the generation temperature (``temperature``: another one; 0 is greedy).
    Written to ``<logging.dir>/eval.jsonl`` with
    the success rate's 95 % Wilson interval (``eval/success_lo``, ``eval/success_hi``), the
    episode count and the seed.

    ``task_ids``: held-out tasks the evaluation cycles through for every env, disjoint from
    each env's training ``envs[].task_ids`` (a ConfigError names the overlap), so its number
    measures generalisation, not memory; null: each env's own ``task_ids`` (or, without them,
    the tasks its seeds draw: then training may meet them too)."""

    every: int = 0  # steps between evaluations (0: none at all)
    episodes: int = 32  # episodes per env at each evaluation
    seed: int = 1_000_003  # the env and sampling seeds of the evaluation episodes (the same at every evaluation)
    # held-out tasks to evaluate every env on, disjoint from envs[].task_ids, or {range: [start, stop]}
    # (null: the envs' own task_ids)
    task_ids: list[Any] | None = None
    # the sampling temperature of evaluation episodes (null: generation.temperature; 0: greedy)
    temperature: float | None = None

    def validate(self, p: str) -> None:
        _check(self.every >= 0, f"{p}.every", "must be >= 0")
        _check(self.temperature is None or self.temperature >= 0, f"{p}.temperature", "must be >= 0")
        _check(self.episodes >= 1, f"{p}.episodes", "must be >= 1")
        _check(self.task_ids is None or len(self.task_ids) > 0, f"{p}.task_ids", "must not be empty")


SFT_SOURCES = ("expert", "records", "messages")


@dataclass
class SFTSource:
    """One source of SFT data (``sft.sources``): ``kind: expert`` plays ``episodes`` episodes
    of every env whose env has an expert (``expert_action()``, :mod:`rockroll.trainer.rollout.sft_data`)
    on the env's training ``task_ids``, a fraction ``epsilon`` of the moves random
    (``action_words``) so the data is imperfect, and a fraction ``habit_rate`` replaced by one
    fixed reply ``habit`` (a teacher with a habit: errors that are systematic, not random;
    random moves leave the expert's move the likeliest in every state, so greedy decoding of
    a model that copied them undoes them, while a habit above 1/2 becomes its move), and a
    fraction ``habit_episodes`` of the episodes played by the habit alone (a teacher that
    misreads a task from its first move: whole failed episodes, which a copy samples as often);
    ``kind: records``, the model service's
    ``records.jsonl`` at ``path``; ``kind: messages``, chat transcripts in the OpenAI ``messages``
    JSONL format at ``path``."""

    kind: str = "expert"  # expert (episodes played by the envs' experts), records (records.jsonl) or messages
    path: str | None = None  # records, messages: the JSONL file
    episodes: int = 64  # expert: episodes per env
    epsilon: float = 0.0  # expert: the fraction of moves taken at random instead of the expert's
    keep_failed: bool = True  # expert: keep episodes that failed (with epsilon > 0 some do), else drop them
    habit: str | None = None  # expert: the one reply of the teacher's habit (a move of the env, e.g. Right)
    habit_rate: float = 0.0  # expert: the fraction of moves replaced by the habit
    habit_episodes: float = 0.0  # expert: the fraction of episodes played by the habit alone, every move

    def validate(self, p: str) -> None:
        _check(self.kind in SFT_SOURCES, f"{p}.kind", f"must be one of {', '.join(SFT_SOURCES)}")
        _check(self.kind == "expert" or bool(self.path), f"{p}.path", f"kind {self.kind} needs the JSONL file")
        _check(self.episodes >= 1, f"{p}.episodes", "must be >= 1")
        _check(0.0 <= self.epsilon <= 1.0, f"{p}.epsilon", "must be in [0, 1]")
        _check(0.0 <= self.habit_rate <= 1.0, f"{p}.habit_rate", "must be in [0, 1]")
        _check(0.0 <= self.habit_episodes <= 1.0, f"{p}.habit_episodes", "must be in [0, 1]")
        _check(not (self.habit_rate or self.habit_episodes) or bool(self.habit), f"{p}.habit",
               "habit_rate or habit_episodes > 0 needs the habit's reply")
        _check(self.epsilon + self.habit_rate <= 1.0, f"{p}.habit_rate", "epsilon + habit_rate must be <= 1")


@dataclass
class SFTConfig:
    """The supervised warm start, ``rockroll sft CONFIG`` (:mod:`rockroll.trainer.sft`): the
    policy of this config (model, tokenizer, engine) trained for ``steps`` steps on the
    ``sources``' trajectories, the loss the mean negative log-likelihood of the assistant's
    tokens only; each step takes ``batch_size`` sequences, run in micro-batches packed up to
    ``tokens_per_micro_batch`` tokens (length-sorted, so little padding). It evaluates as
    ``eval`` says (success on the envs, and the NLL of ``heldout_nll_episodes`` expert episodes
    per env on ``eval.task_ids``), checkpoints in ``<checkpoint.dir>/sft`` and resumes from there, logs in ``<logging.dir>/sft``,
    and writes the model and tokenizer to ``output_dir``, which ``model.init_from`` names."""

    sources: list[SFTSource] = field(default_factory=lambda: [SFTSource()])  # where the trajectories come from
    steps: int = 100  # optimizer steps of SFT
    batch_size: int = 16  # sequences per optimizer step
    tokens_per_micro_batch: int = 4096  # micro-batches are packed up to this many tokens (padding included)
    lr: float | None = None  # the learning rate of SFT (null: engine.lr)
    output_dir: str | None = None  # where the warm-start model folder goes (null: <logging.dir>/sft/model)
    # expert episodes per env on eval.task_ids whose NLL each evaluation measures (eval/nll; null:
    # eval.episodes, 0: none): with a real model on a CPU their forward costs as much as generating
    heldout_nll_episodes: int | None = None

    def validate(self, p: str) -> None:
        _check(len(self.sources) >= 1, f"{p}.sources", "needs at least one source")
        for i, src in enumerate(self.sources):
            src.validate(f"{p}.sources[{i}]")
        _check(self.steps >= 0, f"{p}.steps", "must be >= 0")
        _check(self.batch_size >= 1, f"{p}.batch_size", "must be >= 1")
        _check(self.tokens_per_micro_batch >= 1, f"{p}.tokens_per_micro_batch", "must be >= 1")
        _check(self.lr is None or self.lr > 0, f"{p}.lr", "must be > 0")
        _check(self.heldout_nll_episodes is None or self.heldout_nll_episodes >= 0, f"{p}.heldout_nll_episodes",
               "must be >= 0 (or null: eval.episodes)")


PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


@dataclass
class RoleResources:
    """What each actor of one role asks of Ray (``ray.roles.<role>``) and whom it shares a
    placement-group bundle with: ``colocate: trainer`` puts actor i of this role into the
    bundle of the trainer's actor i % num_trainers, so their fractional GPUs are one device
    that they share by turns (see :mod:`rockroll.trainer.roles.placement`). ``offload``: the role
    keeps its models and optimizer state in host memory outside its turns (the trainer and
    batch roles, on a device they share: :mod:`rockroll.trainer.engines.offload`)."""

    num_cpus: float = 0.0  # CPUs each actor of the role asks for
    num_gpus: float = 0.0  # GPUs each actor asks for: a fraction of one (shared by turns) or whole GPUs
    # a role whose placement-group bundles this role's actors join (null: bundles of its own)
    colocate: str | None = None
    offload: bool = False  # keep models and optimizer state in host memory outside the role's turns
    # custom Ray resources each actor asks for (a node offers them with `ray start --resources`):
    # how a cluster keeps env workers and their sandboxes on CPU nodes, the learner on a GPU node
    resources: dict[str, float] = field(default_factory=dict)

    def validate(self, p: str) -> None:
        _check(self.num_cpus >= 0, f"{p}.num_cpus", "must be >= 0")
        _check(self.num_gpus >= 0, f"{p}.num_gpus", "must be >= 0")
        for name, amount in self.resources.items():
            _check(name not in ("CPU", "GPU", "memory", "object_store_memory"), f"{p}.resources.{name}",
                   "is one of Ray's own resources: use num_cpus / num_gpus")
            _check(amount > 0, f"{p}.resources.{name}", "must be > 0")
        # Ray shares a GPU between actors only by fractions of one; more than one is whole GPUs
        _check(self.num_gpus <= 1 or self.num_gpus == int(self.num_gpus), f"{p}.num_gpus",
               "must be a fraction of one GPU or a whole number of GPUs")


@dataclass
class RayConfig:
    """Run the training loop over Ray actors (:mod:`rockroll.trainer.roles.ray`): one policy
    trainer, ``num_generators`` generation engines, ``num_env_workers`` env workers that split
    ``rollout.batch_groups`` between them. ``address``: a running cluster to join; null starts
    a local Ray on 127.0.0.1. ``weight_sync``: ``object_store`` (one state dict in Ray's object
    store) or ``collective`` (torch.distributed broadcast: gloo on CPU, NCCL on GPU).
    ``num_trainers``: data-parallel ranks of the policy (DeepSpeed ZeRO over one process group).
    ``roles``: per role (``trainer``, ``generator``, ``env_worker``, and each batch role by its
    ``name``: ``reference``...), the resources of each of its actors and what it is colocated
    with; when set, every actor is placed in one placement group (``placement_strategy``).
    ``num_reward_actors``: actors of the reward role (when ``reward`` has verifiers or a judge),
    shared by the env workers."""

    enabled: bool = False  # run the loop over Ray actors (false: every role in this process)
    num_env_workers: int = 1  # env-worker actors; they split rollout.batch_groups between them
    num_generators: int = 1  # generation engines, at most num_env_workers (each serves one or more env workers)
    address: str | None = None  # a running Ray cluster to join (null: start a local Ray on 127.0.0.1)
    weight_sync: str = "object_store"  # how new weights reach the generators: object_store or collective
    num_gpus: float = 0.0  # GPUs of each trainer, generator and batch-role actor (ray.roles may set a role's own)
    num_trainers: int = 1  # data-parallel policy ranks (needs engine.kind: deepspeed)
    # per role: its actors' resources and colocation (empty: no placement group)
    roles: dict[str, RoleResources] = field(default_factory=dict)
    placement_strategy: str = "PACK"  # the placement group's strategy: PACK, SPREAD, STRICT_PACK or STRICT_SPREAD
    num_reward_actors: int = 1  # reward-role actors (with verifiers or a judge), shared by the env workers
    # an env worker lost with its node is replaced; with none left, how long the run waits for a
    # replacement to be placed (a node that returns or joins) before it stops with an error
    env_worker_wait_s: float = 300.0

    def validate(self, p: str) -> None:
        _check(self.num_env_workers >= 1, f"{p}.num_env_workers", "must be >= 1")
        _check(1 <= self.num_generators <= self.num_env_workers, f"{p}.num_generators",
               "must be in [1, num_env_workers] (a generator serves one or more env workers)")
        _check(self.weight_sync in ("object_store", "collective"), f"{p}.weight_sync",
               "must be object_store or collective")
        _check(self.num_gpus >= 0, f"{p}.num_gpus", "must be >= 0")
        _check(self.num_trainers >= 1, f"{p}.num_trainers", "must be >= 1")
        _check(self.env_worker_wait_s > 0, f"{p}.env_worker_wait_s", "must be > 0")
        _check(self.placement_strategy in PLACEMENT_STRATEGIES, f"{p}.placement_strategy",
               f"must be one of {', '.join(PLACEMENT_STRATEGIES)}")
        _check(1 <= self.num_reward_actors <= self.num_env_workers, f"{p}.num_reward_actors",
               "must be in [1, num_env_workers] (a reward actor serves one or more env workers)")
        for name, role in self.roles.items():
            key = f"{p}.roles.{name}"
            role.validate(key)
            target = role.colocate
            _check(target != name, f"{key}.colocate", "a role cannot be colocated with itself")
            # one level: a bundle belongs to a role that is placed on its own
            _check(target is None or self.roles.get(target, RoleResources()).colocate is None, f"{key}.colocate",
                   f"{target} is itself colocated with {self.roles.get(target, RoleResources()).colocate}: "
                   "name that role instead")
        for name, role in self.roles.items():
            if role.offload:
                self._check_offload(name, role, f"{p}.roles.{name}.offload")

    def _check_offload(self, name: str, role: RoleResources, key: str) -> None:
        """Offloading is time-division sharing of a device: it means something only for a role
        that has turns (the generator serves the rollout all along, env workers and the reward
        role hold no model of the step) on a GPU that another role of its bundle uses too;
        alone on a device it would only add two copies per step, so it is refused, not ignored."""
        _check(name not in ("generator", "env_worker", "reward"), key,
               f"the {name} role has no turn to end (only the trainer and the batch roles offload)")
        anchor = role.colocate or name
        mates = [n for n, r in self.roles.items() if n != name and (r.colocate or n) == anchor and r.num_gpus > 0]
        _check(0 < role.num_gpus < 1 and bool(mates), key,
               "needs a GPU shared with another role: a fraction of one (0 < num_gpus < 1) in a bundle where "
               "another role has GPUs too (colocate)")


JUDGE_FIELDS = ("question", "answer", "transcript", "env_id", "task_id", "reward")
DEFAULT_JUDGE_TEMPLATE = ("Rate the answer to the task below from 0 to 10. Reply with the number only.\n\n"
                          "Task:\n{question}\n\nAnswer:\n{answer}")


@dataclass
class VerifierConfig:
    """A rule-based verifier: ``fn`` (``module:function``) is called as
    ``fn(question, answer, transcript, **kwargs) -> float`` on every finished episode; its
    value times ``weight`` is added to the episode's reward. An exception is an infra error."""

    fn: str = ""  # module:function, called as fn(question, answer, transcript, **kwargs) -> float
    name: str = ""          # the metric's name (default: the function's)
    weight: float = 1.0  # the value times this is added to the reward
    kwargs: dict[str, Any] = field(default_factory=dict)  # extra keyword arguments of fn

    def validate(self, p: str) -> None:
        _check(":" in self.fn and all(self.fn.split(":", 1)), f"{p}.fn", "must be module:function")


@dataclass
class JudgeConfig:
    """LLM-as-judge (:mod:`rockroll.trainer.rollout.reward`): ``template`` (``str.format`` fields among
    question, answer, transcript, env_id, task_id, reward) is sent as the user message (after
    ``system``, when set) to ``backend``: ``openai``, any OpenAI-compatible endpoint at ``url``
    (``.../v1``; the API key from the environment variable ``api_key_env``), called through the
    model service's proxy mode; or ``local``, a Transformers engine over the checkpoint folder
    ``model`` (the judge's own weights and tokenizer), its requests batched. The first match of
    ``score_regex`` (its first group) in the reply is the score, mapped from ``score_range``
    to [0, 1], times ``weight``, added to the reward. A timeout, an HTTP error or a reply
    without a score in range is an infra error: the episode is dropped, never scored 0."""

    backend: str = ""        # local or openai ("": no judge)
    url: str | None = None  # openai: the endpoint (.../v1)
    api_key_env: str = "OPENAI_API_KEY"  # openai: the environment variable holding the API key
    model: str = ""          # openai: the model name sent; local: a checkpoint folder
    system: str = ""  # the system message before the template's (none when empty)
    # the user message: str.format over question, answer, transcript, env_id, task_id, reward
    template: str = DEFAULT_JUDGE_TEMPLATE
    score_regex: str = r"(-?\d+(?:\.\d+)?)"  # its first match's first group in the reply is the score
    score_range: list[float] = field(default_factory=lambda: [0.0, 10.0])  # [low, high] of the score, mapped to [0, 1]
    weight: float = 1.0  # the mapped score times this is added to the reward
    max_tokens: int = 8  # longest judge reply, in tokens
    temperature: float = 0.0  # the judge's sampling temperature (0: greedy)
    allowed_tokens: list[str] = field(default_factory=list)  # local: constrained decoding, as generation's
    max_concurrency: int = 16   # judge calls in flight at once
    max_batch_size: int = 16    # local: requests per engine call
    timeout_s: float = 60.0     # seconds per judge call, retries included
    retries: int = 2            # openai: retries of a call on 429/5xx and connection errors, with back-off

    def validate(self, p: str) -> None:
        import re
        import string

        _check(self.backend in ("", "local", "openai"), f"{p}.backend", "must be local or openai (or empty: no judge)")
        if not self.backend:
            return
        _check(self.backend != "openai" or bool(self.url), f"{p}.url", "the openai backend needs the endpoint's URL")
        _check(self.backend != "local" or bool(self.model), f"{p}.model",
               "the local backend needs a checkpoint folder (weights and tokenizer)")
        _check(not self.allowed_tokens or self.backend == "local", f"{p}.allowed_tokens", "only for backend: local")
        try:
            fields = {f for _, f, _, _ in string.Formatter().parse(self.template) if f is not None}
        except ValueError as e:
            raise ConfigError(f"{p}.template", f"not a format string: {e}") from None
        unknown = sorted(f for f in fields if f not in JUDGE_FIELDS)
        _check(not unknown, f"{p}.template", f"unknown field(s) {unknown}: use {', '.join(JUDGE_FIELDS)}")
        try:
            groups = re.compile(self.score_regex).groups
        except re.error as e:
            raise ConfigError(f"{p}.score_regex", f"not a regular expression: {e}") from None
        _check(groups >= 1, f"{p}.score_regex", "needs a group around the score")
        _check(len(self.score_range) == 2 and self.score_range[0] < self.score_range[1], f"{p}.score_range",
               "must be [low, high] with low < high")
        _check(self.max_tokens >= 1, f"{p}.max_tokens", "must be >= 1")
        _check(self.temperature >= 0, f"{p}.temperature", "must be >= 0")
        for k in ("max_concurrency", "max_batch_size"):
            _check(getattr(self, k) >= 1, f"{p}.{k}", "must be >= 1")
        _check(self.timeout_s > 0, f"{p}.timeout_s", "must be > 0")
        _check(self.retries >= 0, f"{p}.retries", "must be >= 0")


@dataclass
class RewardConfig:
    """The reward role, run on each finished episode in the rollout: the env's own reward
    stays, and each verifier's and the judge's weighted scores are added to it (on the last
    turn), each recorded in ``Sample.reward_parts``."""

    # rule-based verifiers, each weighted score added to the reward
    verifiers: list[VerifierConfig] = field(default_factory=list)
    judge: JudgeConfig = field(default_factory=JudgeConfig)  # an LLM judge (backend empty: none)

    @property
    def active(self) -> bool:
        return bool(self.verifiers or self.judge.backend)

    def validate(self, p: str) -> None:
        for i, v in enumerate(self.verifiers):
            v.validate(f"{p}.verifiers[{i}]")
        self.judge.validate(f"{p}.judge")


@dataclass
class TrainConfig:
    """A whole training run: the top level of a YAML config, one section per part of the
    run (each a dataclass below); ``envs`` is a list, ``ray.roles`` a mapping by role name."""

    steps: int = 100  # training steps in all: a resumed run goes on from its checkpoint up to this many (--steps N)
    seed: int = 0  # seeds the model's init, task and env sampling and generation (Ray env workers mix in their index)
    deterministic: bool = False  # torch's deterministic algorithms, and no continuous batching (its batches vary)
    model: ModelConfig = field(default_factory=ModelConfig)  # the policy model
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)  # the tokenizer and how turns are framed
    # the task mixture: one entry per env, sampled by weight
    envs: list[EnvConfig] = field(default_factory=lambda: [EnvConfig()])
    rollout: RolloutConfig = field(default_factory=RolloutConfig)  # how episodes are played, grouped and batched
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)  # advantages, policy loss and credit
    engine: EngineConfig = field(default_factory=EngineConfig)  # where the policy trains, and its optimizer
    generation: GenerationConfig = field(default_factory=GenerationConfig)  # sampling and the generation backend
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)  # saving and resuming
    # the run folder: metrics, TensorBoard, curve, transcripts
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)  # evaluation on the same fresh episodes each time
    # Ray actors and their placement (off: every role in this process)
    ray: RayConfig = field(default_factory=RayConfig)
    # verifiers and an LLM judge whose scores are added to the env's reward
    reward: RewardConfig = field(default_factory=RewardConfig)
    hubs: list[str] = field(default_factory=list)  # env hubs (folder, s3://...) the env ids are read from,
    #                                                 after the built-in ids and $ROCKROLL_HUB's
    sft: SFTConfig = field(default_factory=SFTConfig)  # the supervised warm start (rockroll sft; train ignores it)

    def validate(self, p: str = "") -> None:
        _check(self.steps >= 0, "steps", "must be >= 0")
        _check(all(isinstance(h, str) and h for h in self.hubs), "hubs", "must be hub URLs or folders")
        _check(len(self.envs) >= 1, "envs", "needs at least one environment")
        for i, env in enumerate(self.envs):
            env.validate(f"envs[{i}]")
        for name in ("model", "tokenizer", "rollout", "algorithm", "engine", "generation",
                     "checkpoint", "logging", "eval", "ray", "reward", "sft"):
            getattr(self, name).validate(name)
        if self.ray.enabled:  # every env worker fills its share of a step's groups
            _check(self.ray.num_env_workers <= self.rollout.batch_groups, "ray.num_env_workers",
                   "must be <= rollout.batch_groups")
        if self.algorithm.spec.critics:  # a critic without a share of each prompt's responses would never train
            _check(self.algorithm.critics.count <= self.rollout.group_size, "algorithm.critics.count",
                   "must be <= rollout.group_size (each prompt's responses are split among the critics)")
        if self.ray.num_trainers > 1:  # data parallel: ZeRO's process group over the trainer actors
            key = "ray.num_trainers"
            _check(self.ray.enabled, key, "data-parallel ranks are Ray actors: needs ray.enabled")
            _check(self.engine.kind == "deepspeed", key, "data-parallel training needs engine.kind: deepspeed")
            _check(self.rollout.batch_groups * self.rollout.group_size >= self.ray.num_trainers
                   * self.algorithm.mini_batches, key, "every rank needs a share of each mini-batch: must be <= "
                   "rollout.batch_groups * rollout.group_size / algorithm.mini_batches")
        if self.ray.roles.get("trainer", RoleResources()).offload:  # the torch engine's module and optimizer
            _check(self.engine.kind == "torch", "ray.roles.trainer.offload",
                   "needs engine.kind: torch (DeepSpeed places its own state: its zero_optimization offload)")
        _check(not (self.model.init_from and self.tokenizer.name_or_path), "tokenizer.name_or_path",
               "model.init_from brings its own tokenizer (the one SFT trained with): remove it")
        for i, env in enumerate(self.envs):  # held-out: no evaluation task is trained on
            shared = _task_keys(self.eval.task_ids) & _task_keys(env.task_ids)
            _check(not shared, "eval.task_ids", f"must be disjoint from envs[{i}].task_ids (held-out tasks), "
                   f"both list {sorted(shared)}")
        if self.rollout.curriculum.enabled:  # a saved trajectory belongs to one task of one env
            key = "rollout.curriculum.enabled"
            _check(any(e.task_ids for e in self.envs), key, "needs an env with task_ids")
            _check(len({e.id for e in self.envs}) == len(self.envs), key, "needs distinct env ids")


def _task_keys(task_ids: list[Any] | None) -> set[str]:
    """Task ids as comparable keys (ids may be ints, names or lists)."""
    return {json.dumps(t, sort_keys=True, default=str) for t in task_ids or []}


# ----------------------------------------------------------------------------- loading


def _convert(tp: Any, value: Any, key: str) -> Any:
    """``value`` as type ``tp`` (a dataclass, list[...], dict, X | None, scalar)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _convert(inner[0], value, key)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, key)
    if origin is list:
        _check(isinstance(value, list), key, f"must be a list, got {type(value).__name__}")
        (item_tp,) = typing.get_args(tp) or (Any,)
        return [_convert(item_tp, v, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict or tp is dict:
        _check(isinstance(value, dict), key, f"must be a mapping, got {type(value).__name__}")
        _, item_tp = typing.get_args(tp) or (str, Any)
        return {k: _convert(item_tp, v, f"{key}.{k}") for k, v in value.items()}
    if tp is Any:
        return value
    if tp is bool:
        _check(isinstance(value, bool), key, f"must be true or false, got {value!r}")
        return value
    if tp is int:
        _check(isinstance(value, int) and not isinstance(value, bool), key, f"must be an integer, got {value!r}")
        return value
    if tp is float:
        _check(isinstance(value, (int, float)) and not isinstance(value, bool), key,
               f"must be a number, got {value!r}")
        return float(value)
    if tp is str:
        _check(isinstance(value, str), key, f"must be a string, got {value!r}")
        return value
    return value


# Keys that no longer mean anything, with what to use instead: loading one is a ConfigError,
# never a silent no-op (an old YAML file must not quietly train something else).
REMOVED_KEYS = {
    "algorithm.ipa.ratio_low": "IPA now masks a chunk one-sided on pi_old / mu (the ROME paper's Eq 8); "
                               "use algorithm.ipa.mask_threshold (H, default 5)",
    "algorithm.ipa.ratio_high": "IPA now masks a chunk one-sided on pi_old / mu (the ROME paper's Eq 8); "
                                "use algorithm.ipa.mask_threshold (H, default 5)",
}


def _build(cls: type, data: Any, prefix: str) -> Any:
    if data is None:
        data = {}
    _check(isinstance(data, dict), prefix or "config", f"must be a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if dotted in REMOVED_KEYS:  # a key that once meant something: say what replaced it
            raise ConfigError(dotted, f"removed: {REMOVED_KEYS[dotted]}")
        if key not in names:
            close = [n for n in names if n.startswith(str(key)[:3])]
            hint = f" (did you mean {', '.join(sorted(close))}?)" if close else ""
            raise ConfigError(dotted, f"unknown key{hint}")
        if key == "task_ids" and isinstance(value, dict):
            value = _task_id_range(value, dotted)
        kwargs[key] = _convert(hints[key], value, dotted)
    return cls(**kwargs)


def _task_id_range(value: dict, key: str) -> list[int]:
    """``task_ids: {range: [start, stop]}``: the integer ids start .. stop - 1, for task sets
    too large to list (20 000 FrozenLake maps to train on)."""
    bounds = value.get("range")
    _check(set(value) == {"range"} and isinstance(bounds, list) and len(bounds) == 2
           and all(isinstance(b, int) and not isinstance(b, bool) for b in bounds) and bounds[0] < bounds[1],
           key, f"must be a list of task ids or {{range: [start, stop]}} with integers start < stop, got {value!r}")
    return list(range(bounds[0], bounds[1]))


def load_config(source: str | Path | dict[str, Any], overrides: dict[str, Any] | None = None) -> TrainConfig:
    """A validated :class:`TrainConfig` from a YAML file path or a mapping.

    ``overrides`` maps dotted keys to values (``{"rollout.group_size": 4}``), applied first.
    """
    if isinstance(source, dict):
        data = _deepcopy(source)
    else:
        import yaml

        path = Path(source)
        if not path.is_file():
            raise ConfigError("", f"config file {path} not found")
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError("", f"{path}: not valid YAML: {e}") from None
    for dotted, value in (overrides or {}).items():
        _set_dotted(data, dotted, value)
    cfg = _build(TrainConfig, data, "")
    cfg.validate()
    return cfg


def _set_dotted(data: Any, dotted: str, value: Any) -> None:
    """``data[a][b]... = value`` for ``dotted`` = "a.b...": missing sections are created, an
    integer part indexes a list (``envs.0.id``); anything else is a ConfigError naming the key."""
    parts = dotted.split(".")
    node = data
    for i, part in enumerate(parts):
        key, last = ".".join(parts[: i + 1]), i == len(parts) - 1
        if isinstance(node, list):
            _check(part.isdigit() and int(part) < len(node), key,
                   f"not an index of this list of {len(node)} items")
            part = int(part)
        else:
            parent = ".".join(parts[:i]) or "config"
            _check(isinstance(node, dict), parent, f"is {node!r}, not a section: cannot set {dotted}")
        if last:
            node[part] = value
        elif isinstance(node, dict):
            node = node.setdefault(part, {})
        else:
            node = node[part]


def _deepcopy(x: Any) -> Any:
    import copy

    return copy.deepcopy(x)


def config_to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)
