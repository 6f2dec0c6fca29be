"""The built tokenizers (``tokenizer.kind``): the byte-level BPE reads every env's text back
unchanged and never produces ``<|unk|>``; the word tokenizer keeps each move one token."""

from __future__ import annotations

import random
import string

import pytest

pytest.importorskip("transformers")

from transformers import AutoTokenizer  # noqa: E402

from rockroll.registry.builtin import BUILTIN_ENVS  # noqa: E402
from rockroll.trainer.config import EnvConfig, load_config  # noqa: E402
from rockroll.trainer.envs import make_env  # noqa: E402
from rockroll.trainer.models import SPECIAL_TOKENS, build_bpe_tokenizer, load_tokenizer  # noqa: E402

# Built-in ids that need images built beforehand (a SWE hub, an agent's image) are read through
# the task sets they wrap: the corridor is a TerminalEnv task set of rock/Agent-v0.
NEEDS_IMAGES = {"rock/SWE-v0", "rock/Agent-v0"}
ENVS = [EnvConfig(id=i) for i in sorted(BUILTIN_ENVS) if i not in NEEDS_IMAGES] + [
    EnvConfig(id="rockroll.gem.corridor:CorridorTasks")]
# what no env printed while the BPE was built: other scripts, emoji, control characters
UNSEEN = ["Ünïcödé ✓ 日本語 🚀", "\x00\x01\t\r\n", "snake_case-and/paths/../x.py:42", "<|user|>x<|end|>"]


def _texts(spec: EnvConfig, episodes: int = 2) -> list[str]:
    """Resets and observations after a few replies (valid moves, an invalid one, feedback)."""
    env = make_env(spec)
    out = []
    try:
        for i in range(episodes):
            obs, _ = env.reset(seed=100 + i)  # other seeds than the build's: tasks it never saw
            out.append(obs)
            for action in ["Up", "\\boxed{3}", "ls -la", "Left", "nonsense!"]:
                obs, _, term, trunc, _ = env.step(action)
                out.append(obs)
                if term or trunc:
                    break
    finally:
        env.close()
    return out


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bpe")
    build_bpe_tokenizer(ENVS, folder, vocab_size=1024)
    return AutoTokenizer.from_pretrained(folder)  # a normal tokenizer folder


@pytest.mark.parametrize("spec", ENVS, ids=lambda s: s.id)
def test_bpe_round_trips_every_builtin_envs_texts_with_no_unknown_token(bpe, spec):
    texts = _texts(spec)
    assert texts and all(isinstance(t, str) for t in texts)
    for text in texts:
        ids = bpe.encode(text, add_special_tokens=False)
        assert bpe.unk_token_id not in ids
        assert bpe.decode(ids) == text


def test_bpe_reads_text_no_env_printed_and_keeps_the_chat_tokens_whole(bpe):
    rng = random.Random(0)
    texts = UNSEEN + ["".join(rng.choices(string.printable + "éß∑√→", k=40)) for _ in range(20)]
    for text in texts:
        ids = bpe.encode(text, add_special_tokens=False)
        assert bpe.unk_token_id not in ids and bpe.decode(ids) == text
    for special in SPECIAL_TOKENS:
        assert len(bpe.encode(special, add_special_tokens=False)) == 1
    chat = bpe.apply_chat_template([{"role": "user", "content": "Ünï ✓"}, {"role": "assistant", "content": "Up"}],
                                   tokenize=True, return_dict=False)
    assert chat.count(bpe.convert_tokens_to_ids("<|end|>")) == 2
    assert bpe.decode(chat) == "<|user|>Ünï ✓<|end|><|assistant|>Up<|end|>"


def test_word_tokenizer_spells_unseen_ascii_words_and_only_bpe_keeps_the_rest(tmp_path):
    """A newcomer's plain config (the word tokenizer) never reads printable ASCII as ``<|unk|>``: a
    word the envs never printed while it was built (a new env's feedback) falls apart into its
    letters, and a word it saw is still one token, as before; so each move stays one token
    and ``generation.allowed_tokens`` can name the moves. What only ``kind: bpe`` keeps:
    characters outside printable ASCII that no env printed (Ünïcödé, control bytes)."""
    envs = [EnvConfig(id="rock/FrozenLake-v0")]
    word = load_tokenizer(load_config({}).tokenizer, envs, tmp_path / "word")
    feedback = "Unrecognised reply: try Up or Down; frobnicate_x(42) != Lefty.\n\tThe quick brown fox."
    ids = word.encode(feedback, add_special_tokens=False)
    assert word.unk_token_id not in ids and word.decode(ids) == feedback
    for text in UNSEEN[2:]:  # paths, snake_case, the template's own tokens
        assert word.unk_token_id not in word.encode(text, add_special_tokens=False), text
    assert [word.convert_ids_to_tokens(i) for i in word.encode("Lefty Up", add_special_tokens=False)] == [
        "L", "e", "f", "t", "y", " ", "Up"]  # Left is a word, Lefty is not: its letters
    assert word.unk_token_id in word.encode(UNSEEN[0], add_special_tokens=False)  # Ünïcödé: bpe's business
    assert all(len(word.encode(m, add_special_tokens=False)) == 1 for m in ["Up", "Down", "Left", "Right"])
    cfg = load_config({"tokenizer": {"kind": "bpe", "vocab_size": 512, "add_tokens": ["\\boxed{7}"]}}).tokenizer
    bpe = load_tokenizer(cfg, envs, tmp_path / "bpe")
    assert bpe.decode(bpe.encode(UNSEEN[0], add_special_tokens=False)) == UNSEEN[0]
    assert len(bpe.encode("\\boxed{7}", add_special_tokens=False)) == 1  # add_tokens: kept whole as with word


def test_a_run_trains_with_a_built_bpe_and_reads_its_feedback(tmp_path):
    """``tokenizer.kind: bpe`` end to end: one GRPO step and an evaluation on FrozenLake with
    free-text replies; every token of every transcript decodes back (no ``<|unk|>``)."""
    import json

    from rockroll.trainer.controller import train

    out = train({"steps": 1, "seed": 0, "deterministic": True,
                 "model": {"hidden_size": 32, "num_layers": 1, "num_heads": 1, "intermediate_size": 64},
                 "tokenizer": {"kind": "bpe", "vocab_size": 512, "build_dir": str(tmp_path / "tok")},
                 "envs": [{"id": "rock/FrozenLake-v0", "kwargs": {"max_actions_per_turn": 1}, "task_ids": [0, 1]}],
                 "rollout": {"group_size": 2, "batch_groups": 1, "max_turns": 2, "batch_wait_ms": 10_000},
                 "generation": {"max_new_tokens": 3}, "eval": {"every": 1, "episodes": 2, "task_ids": [5]},
                 "logging": {"dir": str(tmp_path / "run"), "progress": False, "tensorboard": False, "plot": False,
                             "transcripts": 2}})
    tok = out["tokenizer"]
    assert len(tok) >= 512 and tok.unk_token_id is not None  # the BPE (its <|unk|> exists, never produced)
    rows = [json.loads(line) for line in (tmp_path / "run" / "transcripts" / "step_000000.jsonl").read_text().splitlines()]
    assert rows and all("<|unk|>" not in r["text"] for r in rows)
    assert all(obs in r["text"] for r in rows for role, obs in r["transcript"] if role == "env")
