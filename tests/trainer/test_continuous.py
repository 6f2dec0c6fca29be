"""Continuous batching in the torch engine (trainer/scheduler.py): a request joins a running
batch at the next step and leaves it the step it finishes, with the tokens and log-probs it
would have had alone; weight loads happen between steps, every output labelled with the
version that generated it ("wait" and "abort" policies). A real one-layer Llama on CPU."""

import threading

import pytest
import torch

from rockroll.trainer.config import load_config
from rockroll.trainer.engines.sampling import SamplingParams
from rockroll.trainer.engines.generation import TransformersEngine
from rockroll.trainer.models import build_model

from _tiny import Held, TinyTok

SHORT = SamplingParams(temperature=1.0, max_new_tokens=3, stop_token_ids=[2])
LONG = SamplingParams(temperature=1.0, max_new_tokens=40, stop_token_ids=[])
P1, P2, P3 = [5, 6, 7], [9, 10, 11, 12, 13, 14, 15], [3, 4]


def _model(seed=0):
    cfg = load_config({"model": {"hidden_size": 64, "num_layers": 2, "num_heads": 2, "intermediate_size": 64}})
    return build_model(cfg.model, TinyTok(), seed=seed)


def _seeded(sp, seed):
    return SamplingParams(**{**sp.__dict__, "seeds": [seed]})


@pytest.fixture
def engine():
    eng = TransformersEngine(_model(), pad_token_id=0)
    yield eng
    eng.close()


def _alone(model_state, prompt, sp):
    """What ``prompt`` gives on an engine of its own with these weights."""
    m = _model()
    m.load_state_dict(model_state)
    eng = TransformersEngine(m, pad_token_id=0)
    try:
        return eng.generate([prompt], sp)[0]
    finally:
        eng.close()


def _held(engine, n):
    """The engine's loop held inside its ``n``-th decode step."""
    return Held(engine.batcher.stepper, "decode", n)


def _rows(held):
    """The rows decoded at each step so far."""
    return [len(tokens) for tokens, in held.calls]


def test_a_request_that_joins_a_running_batch_gets_what_it_gets_alone(engine):
    state = {k: v.clone() for k, v in engine.model.state_dict().items()}
    alone = {name: _alone(state, p, _seeded(sp, s)) for name, p, sp, s in
             [("long", P2, LONG, 3), ("a", P1, SHORT, 11), ("b", P3, LONG, 5)]}
    held = _held(engine, 3)
    long_fut = engine.submit(P2, _seeded(LONG, 3))
    with held:  # the others arrive while the long one is decoding: they join its batch mid-generation
        a, b = engine.submit(P1, _seeded(SHORT, 11)), engine.submit(P3, _seeded(LONG, 5))
    got = {"long": long_fut.result(), "a": a.result(), "b": b.result()}
    assert engine.batcher.joins == 2 and _rows(held)[:4] == [1, 1, 1, 3]
    for name, out in got.items():
        assert out.token_ids == alone[name].token_ids, name
        assert out.logprobs == pytest.approx(alone[name].logprobs, abs=1e-4), name
        assert out.version == 0
    assert len(got["long"].token_ids) == 40 and got["a"].finish_reason in ("stop", "length")


def test_rows_with_different_settings_in_one_batch_each_get_what_they_get_alone(engine):
    """One batch whose rows sample differently (temperature, greedy, top-k, top-p, allowed
    ids): rows are processed in groups of equal settings, and each draws with its own
    generator, so every request gets the tokens and log-probs it gets alone."""
    state = {k: v.clone() for k, v in engine.model.state_dict().items()}
    settings = [SamplingParams(temperature=0.7, top_k=5, max_new_tokens=6),
                SamplingParams(temperature=0, top_p=0.9, max_new_tokens=6),
                SamplingParams(temperature=1.0, top_p=0.8, max_new_tokens=6, allowed_token_ids=[3, 4, 5, 6, 2]),
                SamplingParams(temperature=0.7, top_k=5, max_new_tokens=6),  # the first's settings, its own seed
                SamplingParams(temperature=1.3, max_new_tokens=6)]
    requests = [(p, _seeded(sp, 20 + i)) for i, (p, sp) in enumerate(zip([P1, P2, P3, P2, P1], settings))]
    alone = [_alone(state, p, sp) for p, sp in requests]
    got = [f.result() for f in engine.batcher.submit_many(requests)]
    assert engine.batcher.max_rows == 5  # one batch
    for i, (out, ref) in enumerate(zip(got, alone)):
        assert out.token_ids == ref.token_ids, i
        assert out.logprobs == pytest.approx(ref.logprobs, abs=1e-4), i
    assert set(got[2].token_ids) <= {3, 4, 5, 6, 2}
    assert got[0].token_ids != got[3].token_ids or got[0].logprobs != got[3].logprobs  # own generators


def test_a_finished_request_leaves_the_batch_at_once(engine):
    """Submitted together, the 3-token request is answered at step <= 3 while the 40-token one
    goes on: its caller does not wait for the batch's longest reply."""
    resolved = {}
    futs = {"short": engine.submit(P1, _seeded(SHORT, 1)), "long": engine.submit(P2, _seeded(LONG, 2))}
    for name, f in futs.items():  # callbacks run in the scheduler thread, at the step the future resolves
        f.add_done_callback(lambda f, name=name: resolved.setdefault(name, engine.batcher.steps))
    short, long = futs["short"].result(), futs["long"].result()
    assert resolved["short"] <= len(short.token_ids) <= 3
    assert resolved["long"] >= 39 and len(long.token_ids) == 40


def test_generate_from_many_threads_shares_one_running_batch(engine):
    outs = {}

    def call(i):
        outs[i] = engine.generate([[4 + i, 5, 6]], _seeded(LONG, i))[0]

    threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert engine.batcher.max_rows >= 2  # concurrent callers decoded together
    assert engine.batcher.steps < 4 * 39  # fewer steps than one request after another


def _other_weights(engine):
    return {k: v + 0.05 * torch.randn_like(v) if v.is_floating_point() else v
            for k, v in engine.model.state_dict().items()}


def test_weight_load_waits_for_requests_in_flight(engine):
    """on_load="wait": the request in flight finishes on the old weights (version 0, the
    tokens it has alone on them); one submitted during the load runs on the new (version 1)."""
    old = {k: v.clone() for k, v in engine.model.state_dict().items()}
    new = _other_weights(engine)
    held = _held(engine, 2)
    fut = engine.submit(P2, _seeded(LONG, 7))
    loader = threading.Thread(target=engine.load_weights, args=(new, 1))
    with held:
        loader.start()
        while not engine.batcher._loading:  # the load waits for the batch to drain
            threading.Event().wait(0.001)
        late = engine.submit(P1, _seeded(LONG, 8))
    loader.join()
    first, second = fut.result(), late.result()
    assert first.version == 0 and first.token_ids == _alone(old, P2, _seeded(LONG, 7)).token_ids
    assert second.version == 1 and second.token_ids == _alone(new, P1, _seeded(LONG, 8)).token_ids
    assert engine.batcher.requeued == 0 and max(_rows(held)) == 1  # the late one never joined the old batch


def test_weight_load_aborts_and_requeues_requests_in_flight():
    """on_load="abort": the load comes in after the step in progress; the request in flight
    restarts from its prompt on the new weights, so all of its tokens are the new version's
    (what it has alone on them)."""
    engine = TransformersEngine(_model(), pad_token_id=0, on_load="abort")
    try:
        new = _other_weights(engine)
        held = _held(engine, 2)
        fut = engine.submit(P2, _seeded(LONG, 7))
        loader = threading.Thread(target=engine.load_weights, args=(new, 1))
        with held:
            loader.start()
            while not engine.batcher._loads:  # the load is waiting for the step in progress
                threading.Event().wait(0.001)
        loader.join()
        out = fut.result()
        assert engine.batcher.requeued == 1
        assert out.version == 1 and out.token_ids == _alone(new, P2, _seeded(LONG, 7)).token_ids
        # 2 steps on the old weights, then all 40 again from the prompt on the new
        assert len(out.token_ids) == LONG.max_new_tokens and engine.batcher.steps == 2 + 39
    finally:
        engine.close()


def test_a_cancelled_request_frees_its_row(engine):
    """A cancelled caller's row leaves at the next step, not after its 200 tokens."""
    held = _held(engine, 2)
    fut, other = engine.batcher.submit_many([(P2, SamplingParams(max_new_tokens=200, seeds=[1])),
                                             (P1, _seeded(LONG, 2))])  # one batch from the first step
    with held:
        assert fut.cancel()
    assert len(other.result().token_ids) == 40
    assert not engine.batcher._rows
    assert _rows(held)[:2] == [2, 2] and set(_rows(held)[2:]) == {1}  # alone from the step after


def _rollout(continuous: bool):
    """Two steps of a rollout on a continuous engine over the simulated model (heavy-tailed
    reply lengths), its requests sent one by one (continuous) or as blocking batch calls."""
    from rockroll.trainer.engines.generation import ContinuousEngine
    from rockroll.trainer.rollout.manager import PromptTemplate, RolloutManager
    from _scripted import CharTok, SimStepper, first_batch

    cfg = load_config({
        "seed": 2, "envs": [{"id": "_synthetic:LatencyEnv", "kwargs": {"max_turns": 3}}],
        "rollout": {"group_size": 4, "batch_groups": 2, "max_turns": 3, "batch_wait_ms": 5},
        "generation": {"max_new_tokens": 64, "continuous": continuous}, "tokenizer": {"template": "prefixes"},
    })
    engine = ContinuousEngine(SimStepper(stop_id=0, word_id=ord("R"), step_s=0.0005, prefill_s=0.0005))
    mgr = RolloutManager(cfg, engine, PromptTemplate(CharTok(), cfg.tokenizer))
    try:
        groups = first_batch(mgr, timeout=120)
    finally:
        engine.close()
    return {g.group_id: [s.token_ids for s in g.samples] for g in groups}, engine.batcher, mgr.gen.calls


def test_the_rollout_sends_requests_into_the_running_batch_with_the_same_samples():
    """generation.continuous: each episode's request is submitted on its own and joins the
    running batch (joins > 0); blocking calls never join one (one call at a time). A group
    gets the same tokens either way (per-request seeds)."""
    blocking, b_batcher, b_calls = _rollout(False)
    continuous, c_batcher, c_calls = _rollout(True)
    assert b_batcher.joins == 0 and c_batcher.joins > 0
    assert c_calls > b_calls  # one call per request against one per batch
    common = set(blocking) & set(continuous)
    assert common
    for gid in common:
        assert sorted(blocking[gid]) == sorted(continuous[gid]), gid
