"""Policy model and tokenizer: Hugging Face checkpoints, or tiny ones built from a config.

No weights can be downloaded on the CPU machines, so a run without ``model.name_or_path``
gets a tiny Llama (random init) and a tokenizer built over the text the environments print:
a byte-level BPE (``tokenizer.kind: bpe``: every string encodes, nothing becomes unknown) or
a word-level one (``kind: word``: each move one token, the small action spaces of the CPU
examples; a word it never saw is spelled in its letters, so only characters beyond printable
ASCII that it never saw become ``<|unk|>``). Both are ordinary Hugging Face objects saved to folders, so the same
``from_pretrained(folder)`` path serves tiny CPU runs and real checkpoints on GPU.
"""

from __future__ import annotations

import json
import re
import string
from pathlib import Path
from typing import Any

from .config import ConfigError, EnvConfig, ModelConfig, TokenizerConfig
from .envs import make_env

SPECIAL_TOKENS = ["<|pad|>", "<|bos|>", "<|end|>", "<|user|>", "<|assistant|>", "<|unk|>"]
# Lower-case words, Capitalised words, or any single other character (board cells, spaces,
# punctuation): the board "P_O_" is four tokens, "FrozenLake" is "Frozen" + "Lake".
PRETOKENIZE = r"<\|[a-z]+\|>|[a-z]+|[A-Z][a-z]+|[\s\S]"


PROBE_ACTIONS = ["Right", "Down", "blah", "Left", "Up", "Down", "Right", "Down", "Right"]


def _env_texts(envs: list[EnvConfig], episodes: int = 8, actions: Any = None) -> list[str]:
    """Text the envs print: a few episodes of each, stepped with every direction and garbage
    (``actions(env, i, turn)``: the action of episode ``i``'s ``turn`` instead, None ends it)."""
    texts = []
    for spec in envs:
        env = make_env(spec)
        for i in range(episodes):
            # without task_ids the seed picks the task: tool envs' ids are names, not 0..n
            options = {"task_id": spec.task_ids[i % len(spec.task_ids)]} if spec.task_ids else None
            obs, info = env.reset(seed=i, options=options)
            texts.append(obs)
            if info.get("tools"):  # what the chat template writes of them: their schemas, its framing
                texts += [json.dumps(t) for t in info["tools"]] + [TOOLS_HEADER, "<tool_response></tool_response>"]
            for turn in range(len(PROBE_ACTIONS) if actions is None else 32):
                action = PROBE_ACTIONS[turn] if actions is None else actions(env, i, turn)
                if action is None:
                    break
                try:
                    obs, _, term, trunc, _ = env.step(action)
                except Exception:  # noqa: BLE001  (ResetNeeded after the end)
                    break
                texts.append(obs)
                if term or trunc:
                    break
        env.close()
    return texts


def build_word_tokenizer(envs: list[EnvConfig], folder: str | Path) -> Any:
    """Build, save to ``folder`` and return a word-level ``PreTrainedTokenizerFast`` over the
    printable characters and the words the envs print."""
    pattern = re.compile(PRETOKENIZE)
    words = set(string.printable) | {"Up", "Down", "Left", "Right", "answer", "\u221a"}
    for text in _env_texts(envs):
        words.update(pattern.findall(text))
    return save_word_tokenizer(words, folder)


BPE_EPISODES = 24  # episodes per env the BPE is trained over: more text than the word list needs


def _probe_action(env: Any, i: int, turn: int) -> str | None:
    """Episode ``i``'s action at ``turn`` for the BPE's texts: the env's expert move when it
    has one (``expert_action``: feedback that only valid moves bring), else a direction or
    garbage, by a fixed RNG, so observations after valid and invalid replies are both read."""
    import random

    rng = random.Random(i * 1000 + turn)
    expert = getattr(env.unwrapped if hasattr(env, "unwrapped") else env, "expert_action", None)
    if expert is not None and i % 2 == 0:
        try:
            return expert()
        except Exception:  # noqa: BLE001  (no expert move from this state)
            pass
    return rng.choice(PROBE_ACTIONS + ["\\boxed{%d}" % rng.randint(0, 99), "".join(rng.choices(string.printable, k=8))])


def build_bpe_tokenizer(envs: list[EnvConfig], folder: str | Path, vocab_size: int = 1024) -> Any:
    """Build, save to ``folder`` and return a byte-level BPE ``PreTrainedTokenizerFast``
    trained over the envs' texts (resets, and observations after expert, random and garbage
    replies), with :data:`SPECIAL_TOKENS` kept whole and :data:`WORD_CHAT_TEMPLATE`. Every
    byte is in its vocabulary, so any text encodes and decodes back unchanged: none becomes
    ``<|unk|>`` (the token exists, for templates that name it, but is never produced)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    texts = _env_texts(envs, episodes=BPE_EPISODES, actions=_probe_action)
    texts += PROBE_ACTIONS + [TOOLS_HEADER, "<tool_call></tool_call>", "<tool_response></tool_response>", string.printable]
    tok.train_from_iterator(texts, trainer=trainer)
    return _save_fast(tok, folder)


def save_word_tokenizer(words: Any, folder: str | Path) -> Any:
    """A word-level ``PreTrainedTokenizerFast`` over :data:`SPECIAL_TOKENS` and ``words`` (each a
    piece of :data:`PRETOKENIZE`: a word or one character), saved to ``folder``. A small word
    list makes a small action space (the learning tests' policies choose among a dozen tokens)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab: dict[str, int] = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for w in sorted(words):
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|unk|>"))
    # with every printable character in the vocabulary (the built tokenizer's), an unseen word
    # is spelled out; a hand-picked small vocabulary keeps the plain split (an unseen word one
    # <|unk|>): the learning tests' measured bounds rest on those exact sequences
    spell = set(string.printable) <= set(vocab)
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(known_words_pattern(vocab) if spell else PRETOKENIZE),
                                             behavior="isolated")
    tok.decoder = decoders.Fuse()
    return _save_fast(tok, folder)


def known_words_pattern(vocab: Any) -> str:
    """The word tokenizer's split: a piece of :data:`PRETOKENIZE` that is in ``vocab`` stays
    whole (the same tokens as that split gives), any other falls apart into its characters,
    each a token of the printable ASCII the vocabulary always holds. So a word an env prints
    only later (a retry's feedback, a new env's text) reads as its letters, not ``<|unk|>``."""
    words = sorted((w for w in vocab if len(w) > 1), key=lambda w: (-len(w), w))
    whole = "|".join(re.escape(w) for w in words)
    # a word counts only as a whole lower-case run or Capitalised word, as PRETOKENIZE cuts them
    return (f"(?:{whole})(?![a-z])|[\\s\\S]" if whole else r"[\s\S]")


def _save_fast(tok: Any, folder: str | Path) -> Any:
    """``tok`` (a ``tokenizers.Tokenizer`` over :data:`SPECIAL_TOKENS`) as a Hugging Face
    tokenizer folder with :data:`WORD_CHAT_TEMPLATE`, which ``AutoTokenizer`` loads."""
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<|pad|>", bos_token="<|bos|>", eos_token="<|end|>",
        unk_token="<|unk|>", additional_special_tokens=["<|user|>", "<|assistant|>"],
    )
    hf.chat_template = WORD_CHAT_TEMPLATE
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(folder)
    return hf


# The built word tokenizer's chat template (saved with it, read by apply_chat_template like any
# model's): system text as is, user turns <|user|>...<|end|>, assistant turns
# <|assistant|>...<|end|>. Tools (OpenAI function schemas) are listed after the system text, an
# assistant's tool calls written as Hermes <tool_call>{...}</tool_call> (what the model service's
# default parser reads back), tool results as a user turn of <tool_response>s.
TOOLS_HEADER = 'Tools (call one as <tool_call>{"name": ..., "arguments": {...}}</tool_call>):'
WORD_CHAT_TEMPLATE = (
    "{%- for m in messages %}"
    "{%- if m['role'] == 'system' %}{{ m['content'] }}{% endif %}"
    "{%- if loop.first and tools %}"
    + TOOLS_HEADER +
    "{% for t in tools %}{{ '\\n' }}{{ t | tojson }}{% endfor %}{{ '\\n' }}{% endif %}"
    "{%- if m['role'] == 'user' %}<|user|>{{ m['content'] }}<|end|>"
    "{%- elif m['role'] == 'assistant' %}<|assistant|>{{ m['content'] or '' }}"
    "{%- for c in m['tool_calls'] or [] %}<tool_call>"
    "{{ {'name': c['function']['name'], 'arguments': c['function']['arguments']} | tojson }}</tool_call>"
    "{%- endfor %}<|end|>"
    "{%- elif m['role'] == 'tool' %}<|user|><tool_response>{{ m['content'] }}</tool_response><|end|>"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|assistant|>{% endif %}")


def model_folder(cfg: ModelConfig) -> str | None:
    """What ``from_pretrained`` loads for the policy: the warm start (``init_from``), the
    pretrained model of ``name_or_path`` (imported once and digest-checked:
    :func:`~rockroll.trainer.model_store.resolve_model`), or None for a tiny Llama. A name that
    names nothing is a :class:`ConfigError` whose one line says how to get it."""
    if cfg.init_from:
        return cfg.init_from
    if not cfg.name_or_path:
        return None
    from .model_store import ModelError, resolve_model

    try:
        return resolve_model(cfg.name_or_path, progress=lambda msg: print(f"rockroll: {msg}", flush=True))
    except ModelError as e:
        raise ConfigError("model.name_or_path", str(e)) from None


def load_tokenizer(cfg: TokenizerConfig, envs: list[EnvConfig], default_dir: str | Path,
                   model_dir: str | None = None) -> Any:
    """The tokenizer: ``cfg.name_or_path``'s, the pretrained model's own (``model_dir``, from
    :func:`model_folder`: a warm start's is the one SFT trained with, so ``add_tokens`` must be
    tokens of it already), or one built over ``envs``' texts into ``cfg.build_dir`` (else
    ``default_dir``) and reused. A pretrained model never gets a built tokenizer: its
    embeddings are indexed by its own vocabulary."""
    from transformers import AutoTokenizer

    if cfg.name_or_path:
        tok = AutoTokenizer.from_pretrained(cfg.name_or_path)
    elif model_dir:
        tok = AutoTokenizer.from_pretrained(model_dir)
        missing = [t for t in cfg.add_tokens if len(tok.encode(t, add_special_tokens=False)) != 1]
        if missing:
            raise ConfigError("tokenizer.add_tokens", f"{missing} are not tokens of the model's tokenizer "
                              f"({model_dir}): the model has no embeddings for them; add them to the SFT run")
    else:
        folder = Path(cfg.build_dir or default_dir)
        if not (folder / "tokenizer.json").is_file():
            if cfg.kind == "bpe":
                build_bpe_tokenizer(envs, folder, cfg.vocab_size)
            else:
                build_word_tokenizer(envs, folder)
        tok = AutoTokenizer.from_pretrained(folder)  # with its chat template (WORD_CHAT_TEMPLATE)
        tok.add_tokens(list(cfg.add_tokens))  # matched before the word split: each one token
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def allowed_token_ids(tokenizer: Any, texts: list[str]) -> list[int] | None:
    """The ids of ``generation.allowed_tokens`` (None: no restriction); each text must be
    exactly one token of ``tokenizer``."""
    if not texts:
        return None
    ids = []
    for text in texts:
        enc = tokenizer.encode(text, add_special_tokens=False)
        if len(enc) != 1 or enc[0] == tokenizer.unk_token_id:
            raise ConfigError("generation.allowed_tokens", f"{text!r} is not one token of the tokenizer ({enc}); "
                              "with a built tokenizer, list it in tokenizer.add_tokens to keep it whole")
        ids.append(enc[0])
    return sorted(set(ids))


def _dtype(name: str):
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def build_model(cfg: ModelConfig, tokenizer: Any, seed: int) -> Any:
    """The policy: ``from_pretrained`` of :func:`model_folder`, or a tiny randomly initialised Llama."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    folder = model_folder(cfg)
    if folder:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=_dtype(cfg.dtype))
    else:
        torch.manual_seed(seed)
        mc = LlamaConfig(
            vocab_size=len(tokenizer), hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
            num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_heads,
            intermediate_size=cfg.intermediate_size, max_position_embeddings=cfg.max_position_embeddings,
            pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=True, attention_dropout=0.0,
        )
        model = LlamaForCausalLM(mc).to(_dtype(cfg.dtype))
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    return model
