"""A multi-task mixture on the real envs, the way ROLL's RLVR runs weigh them: math 40 / code 30 /
SWE 30, rollouts through the trainer's RolloutManager. Each env scores with its own verifier: a
policy that answers every math problem right on even sample seeds and wrong on odd ones gets 1 and
0 there, and its bare `submit` scores 0 on Code and SWE, whose hidden tests it did not touch. The
SWE episodes run in real sandboxes from the hub's per-task pools."""

import re
from fractions import Fraction

import pytest

from rockroll.trainer.config import load_config
from rockroll.trainer.engines.sampling import GenOutput
from rockroll.trainer.models import load_tokenizer
from rockroll.trainer.rollout.manager import PromptTemplate, RolloutManager
from rockroll.trainer.envs import make_env

MATH, CODE, SWE = "rock/Math-v0", "rock/Code-v0", "rock/SWE-v0"


class MathOracleEngine:
    """Says `\\boxed{answer}` to a math problem it recognises (right on even sample seeds, off by
    one on odd ones) and `submit` to anything else. It knows the answers from the live math envs."""

    def __init__(self, tok, stop_id, math_envs):
        self.tok, self.stop_id, self.math_envs = tok, stop_id, math_envs
        self.version = 0
        self.math_replies: list[tuple[str, str, bool]] = []  # (question, reply, meant to be right)

    def _reply(self, prompt_text: str, seed: int) -> str:
        for env in list(self.math_envs):
            if env.question and env.question in prompt_text:
                right = seed % 2 == 0
                answer = Fraction(env.answer) + (0 if right else 1)
                reply = f"\\boxed{{{answer}}}"
                self.math_replies.append((env.question, reply, right))
                return reply
        return "submit"

    def generate(self, prompts, sampling):
        outs = []
        for prompt, seed in zip(prompts, sampling.seeds or [0] * len(prompts)):
            text = self._reply(self.tok.decode(prompt, skip_special_tokens=True), seed)
            ids = self.tok.encode(text, add_special_tokens=False) + [self.stop_id]
            outs.append(GenOutput(ids, [-0.5] * len(ids), "stop"))
        return outs

    def load_weights(self, state_dict, version):
        self.version = version


@pytest.fixture(scope="module")
def mixture(swe_hub, tmp_path_factory):
    data = {
        "seed": 5,
        "envs": [{"id": MATH, "weight": 0.4, "kwargs": {"difficulty": 1}},
                 {"id": CODE, "weight": 0.3},
                 {"id": SWE, "weight": 0.3, "kwargs": {"hub": swe_hub}}],
        "rollout": {"group_size": 2, "batch_groups": 12, "max_turns": 2, "batch_wait_ms": 10_000},
        "algorithm": {"dynamic_sampling": False},
        "generation": {"max_new_tokens": 40},
    }
    cfg = load_config(data)
    tok = load_tokenizer(cfg.tokenizer, cfg.envs, tmp_path_factory.mktemp("tok"))
    template = PromptTemplate(tok, cfg.tokenizer)
    math_envs = []

    def factory(spec):
        env = make_env(spec)
        if spec.id == MATH:
            math_envs.append(env)
        return env

    engine = MathOracleEngine(tok, template.stop_id, math_envs)
    mgr = RolloutManager(cfg, engine, template, env_factory=factory)
    mgr.start()
    try:
        groups, metrics = mgr.get_batch(0, timeout=600)
    finally:
        mgr.close()
    return groups, metrics, engine


def test_mixture_draws_every_env(mixture):
    groups, _, _ = mixture
    counts = {e: sum(g.env_id == e for g in groups) for e in (MATH, CODE, SWE)}
    assert len(groups) == 12 and all(counts.values()), counts


def test_each_env_scores_with_its_own_verifier(mixture):
    groups, metrics, engine = mixture
    for g in groups:
        for s in g.samples:
            assert s.infra_error is None and s.env_id == g.env_id
            first_obs, reply = s.transcript[0][1], s.transcript[1][1]
            if g.env_id == MATH:
                (right,) = {r for q, text, r in engine.math_replies if q in first_obs and text == reply}
                assert s.reward == float(right) and s.success == right, s.transcript
            else:
                assert reply == "submit" and s.reward == 0.0 and not s.success
    swe = [s for g in groups if g.env_id == SWE for s in g.samples]
    # the SWE grader really ran the task's hidden tests on the untouched buggy repo
    graded = r"Submitted\. Tests that had to be fixed: 0/\d+ pass\. Tests that had to keep passing: (\d+)/\1 pass"
    assert swe and all(re.match(graded, s.transcript[-1][1]) for s in swe), [s.transcript[-1] for s in swe]
    math_success = metrics[f"env/{MATH}/success"]
    assert 0.0 < math_success < 1.0
    assert metrics[f"env/{SWE}/success"] == 0.0 and metrics[f"env/{CODE}/success"] == 0.0
