"""Chat templates come from the tokenizer: the built word tokenizer carries a real Jinja chat
template (saved with it, read back by ``AutoTokenizer``), which shows the tools an env offers
(OpenAI function schemas in its reset ``info["tools"]``), and the rollout's first prompt is
``apply_chat_template`` of the observation with those tools."""

import json

import pytest
from transformers import AutoTokenizer

from rockroll.trainer.config import EnvConfig, load_config
from rockroll.trainer.models import WORD_CHAT_TEMPLATE, load_tokenizer
from rockroll.trainer.rollout.manager import PromptTemplate, RolloutManager
from _scripted import ScriptEngine, first_batch

TOOLS = [{"type": "function", "function": {"name": "move", "description": "Move one cell",
                                             "parameters": {"type": "object", "properties": {
                                                 "direction": {"type": "string"}}}}}]


TOOL_ENV = "test_chat_template:ToolEnv"


class ToolEnv:
    """One turn; offers ``TOOLS`` at reset."""

    def reset(self, seed=None, options=None):
        return "Where to?", {"tools": TOOLS}

    def step(self, action):
        return "ok", 1.0, True, False, {}

    def close(self):
        pass


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    # built over the envs' texts, the tools ToolEnv offers included
    load_tokenizer(load_config({}).tokenizer, [EnvConfig(id="rock/FrozenLake-v0"), EnvConfig(id=TOOL_ENV)], folder)
    return AutoTokenizer.from_pretrained(folder)  # what was saved, nothing set after loading


def _ids(x):
    return list(x if isinstance(x, list) else x["input_ids"])


def test_the_built_tokenizer_saves_its_jinja_chat_template(tok):
    assert tok.chat_template == WORD_CHAT_TEMPLATE
    messages = [{"role": "system", "content": "Walk."}, {"role": "user", "content": "P_G"},
                {"role": "assistant", "content": "Right"}, {"role": "user", "content": "_P"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "Walk.<|user|>P_G<|end|><|assistant|>Right<|end|><|user|>_P<|end|><|assistant|>"


def test_tools_tool_calls_and_tool_results_are_rendered(tok):
    messages = [{"role": "user", "content": "Go"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"type": "function", "function": {"name": "move", "arguments": {"direction": "Up"}}}]},
                {"role": "tool", "content": "moved"}]
    text = tok.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    schema = json.dumps(TOOLS[0])
    assert text == ('Tools (call one as <tool_call>{"name": ..., "arguments": {...}}</tool_call>):\n' + schema + "\n"
                    '<|user|>Go<|end|><|assistant|><tool_call>{"name": "move", "arguments": {"direction": "Up"}}'
                    "</tool_call><|end|><|user|><tool_response>moved</tool_response><|end|><|assistant|>")


def test_the_first_prompt_shows_the_tools_the_env_offers(tok):
    """An env whose reset info offers tools: the episode starts with the chat template's
    rendering of the observation with them, token for token."""
    cfg = load_config({"seed": 0, "envs": [{"id": "tools"}], "generation": {"max_new_tokens": 2},
                       "rollout": {"group_size": 2, "batch_groups": 1, "max_turns": 1, "batch_wait_ms": 10_000}})
    template = PromptTemplate(tok, cfg.tokenizer)
    mgr = RolloutManager(cfg, ScriptEngine(tok, ["Up"], stop_id=template.stop_id), template,
                         env_factory=lambda spec: ToolEnv())
    groups = first_batch(mgr, timeout=60)
    expected = _ids(tok.apply_chat_template([{"role": "user", "content": "Where to?"}], tools=TOOLS, tokenize=True,
                                            add_generation_prompt=True))
    for s in groups[0].samples:
        assert s.token_ids[: len(expected)] == expected and not any(s.mask[: len(expected)])
    assert tok.unk_token_id not in expected  # the word tokenizer was built over the tools and its template
    assert json.dumps(TOOLS[0]) in tok.decode(expected)
    prefixes = PromptTemplate(tok, load_config({"tokenizer": {"template": "prefixes"}}).tokenizer)
    with pytest.raises(ValueError, match="template: prefixes cannot show the tools"):
        prefixes.first("Where to?", TOOLS)
