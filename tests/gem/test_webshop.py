"""rock/WebShop-v0: WebShop's reward term by term on hand-built cases, the seeded catalogue and
its held-out split, the pages and action grammar, the shop as a real HTTP server inside a
no-network sandbox, the expert (held-out reward >= 0.95) against a random agent, invalid
actions, a mid-episode snapshot resumed on a product page, check_env, and 64 envs at once."""

from __future__ import annotations

import random

import gymnasium
import numpy as np
import pytest
import rockroll  # noqa: F401 - registers the rock/ ids
from gymnasium.utils.env_checker import check_env
from rockroll.gem.webshop import WebShopEnv, page_from_html, parse_webshop_action
from rockroll.gem.webshop_site.catalog import TEST_PRODUCT_EVERY, TEST_TASKS, generate_catalog, make_goal
from rockroll.gem.webshop_site.reward import get_reward, normalize_color, token_set_ratio, type_reward
from rockroll.gem.webshop_site.server import Shop, route
from rockroll.sandbox.sync import run_sync

HELD_OUT = list(range(0, TEST_TASKS, 25))  # 20 held-out tasks


# ------------------------------------------------------------------------------ the reward, by hand
def _product(**kw) -> dict:
    base = {"asin": "B0TEST0001", "Title": "Acme Classic Memory Foam Sneakers", "name": "Acme Classic Memory Foam Sneakers",
            "query": "men's sneakers", "product_category": "clothing, shoes & jewelry › men › shoes › fashion sneakers",
            "Attributes": ["memory foam", "rubber sole", "lace up"], "BulletPoints": ["Comfortable all day."],
            "Description": "A shoe.", "options": {"size": ["9", "10"], "color": ["black", "navy blue"]},
            "price": 40.0, "nouns": ["acme", "sneakers"]}
    return {**base, **kw}


def _goal(**kw) -> dict:
    base = {"query": "men's sneakers", "product_category": "clothing, shoes & jewelry › men › shoes › fashion sneakers",
            "name": "Zed Sport Rubber Sole Sneakers", "nouns": ["zed", "sneakers"],
            "attributes": ["memory foam", "rubber sole"], "goal_options": {"color": "black", "size": "10"},
            "price_upper": 50.0}
    return {**base, **kw}


def test_reward_all_terms_met_is_one():
    reward, info = get_reward(_product(), _goal(), 40.0, {"color": "black", "size": "10"})
    assert reward == 1.0 and info["r_type"] == 1.0 and info["r_att"] == 1.0 and info["r_option"] == 1.0
    assert info["w_att"] == info["w_option"] == 2 / 5 and info["w_price"] == 1 / 5


def test_reward_attribute_term():
    # one of two attributes missing: (1 + 2 + 1) / 5
    reward, info = get_reward(_product(Attributes=["memory foam", "lace up"]), _goal(), 40.0,
                              {"color": "black", "size": "10"})
    assert reward == pytest.approx(4 / 5) and info["r_att"] == 0.5
    # ...found in the title instead of the attribute list: matched (WebShop looks there too)
    reward, _ = get_reward(_product(Attributes=["memory foam"], Title="Acme Rubber Sole Sneakers"), _goal(), 40.0,
                           {"color": "black", "size": "10"})
    assert reward == 1.0
    # fuzzy: word order and punctuation do not matter, a different word does
    assert token_set_ratio("Rubber-Sole", "sole rubber") == 100
    assert token_set_ratio("slip resistant", "water resistant") <= 85


def test_reward_option_term():
    g = _goal()
    # size matches exactly only: "10" is not "10.5", though they are fuzzy-close
    assert get_reward(_product(), g, 40.0, {"color": "black", "size": "10.5"})[0] == pytest.approx(4 / 5)
    # no options chosen: none matched
    assert get_reward(_product(), g, 40.0, {})[0] == pytest.approx(3 / 5)
    # colours are normalised: "jet black" is black
    assert normalize_color("jet black") == "black"
    assert get_reward(_product(), g, 40.0, {"color": "jet black", "size": "10"})[0] == 1.0
    # a wrong colour
    assert get_reward(_product(), g, 40.0, {"color": "navy blue", "size": "10"})[0] == pytest.approx(4 / 5)


def test_reward_price_term():
    reward, info = get_reward(_product(), _goal(), 50.01, {"color": "black", "size": "10"})
    assert reward == pytest.approx(4 / 5) and info["r_price"] is False
    assert get_reward(_product(), _goal(), 50.0, {"color": "black", "size": "10"})[0] == 1.0  # "lower than": <=


def test_reward_type_term():
    shoe = {"color": "black", "size": "10"}
    lamp = _product(query="led desk lamp", product_category="tools › lighting › desk lamps", nouns=["acme", "lamp"])
    # another type, nothing in common: the whole reward is 0, whatever the other terms say
    info = type_reward(lamp, _goal())
    assert info == {"r_type": 0.0, "query_match": False, "category_match": False, "title_score": 0.0}
    assert get_reward(lamp, _goal(), 40.0, shoe)[0] == 0.0
    # the same query alone, no shared noun: title_score 0 still wins (r_type 0)
    assert type_reward(_product(nouns=["acme", "shoes"]), _goal())["r_type"] == 0.0
    # no query nor category match, and a noun share of exactly 0.2: half
    goal = _goal(nouns=["a", "b", "c", "d", "sneakers"])
    other = _product(query="x", product_category="a › b", nouns=["sneakers"])
    assert type_reward(other, goal)["r_type"] == 0.5
    assert get_reward(other, goal, 40.0, shoe)[0] == pytest.approx(0.5)
    # a noun share under 0.1: 0.1
    goal = _goal(nouns=[*"abcdefghijk", "sneakers"])
    assert type_reward(other, goal)["r_type"] == 0.1
    # two breadcrumb levels in common are a category match
    assert type_reward(_product(query="x", product_category="clothing, shoes & jewelry › men › socks"),
                       _goal())["category_match"]


# ------------------------------------------------------------------------------ catalogue and tasks
def test_catalogue_is_seeded_and_large():
    a, b = generate_catalog(0, 3000), generate_catalog(0, 3000)
    assert a == b and len(a) == 3000 and len({p["asin"] for p in a}) == 3000
    assert generate_catalog(1, 3000) != a
    assert make_goal(a, 7) == make_goal(b, 7) and make_goal(a, 7) != make_goal(a, 8)
    assert len({p["category"] for p in a}) >= 10
    for p in a[:50]:
        assert p["Attributes"] and p["options"] and set(p["nouns"]) <= set(p["Title"].lower().split())


def test_held_out_tasks_target_products_no_training_task_targets():
    products = generate_catalog(0, 3000)
    index = {p["asin"]: i for i, p in enumerate(products)}
    test = {make_goal(products, t)["asin"] for t in range(TEST_TASKS)}
    train = {make_goal(products, t)["asin"] for t in range(TEST_TASKS, TEST_TASKS + 3000)}
    assert all(index[a] % TEST_PRODUCT_EVERY == 0 for a in test)
    assert not test & train and len(test) > 200
    goal = make_goal(products, 3)
    assert f"price lower than {goal['price_upper']:.2f} dollars" in goal["instruction_text"]
    for name, value in goal["goal_options"].items():
        assert f"{name}: {value}" in goal["instruction_text"]
    with pytest.raises(ValueError, match="int >= 0"):
        make_goal(products, -1)


# ------------------------------------------------------------------------------ pages and actions
@pytest.fixture(scope="module")
def shop(tmp_path_factory):
    return Shop(str(tmp_path_factory.mktemp("shop") / "shop.db"), 0, 3000)


def test_search_is_bm25_over_the_catalogue(shop):
    goal = shop.goal(3)
    hits = shop.search(" ".join([goal["query"], *goal["attributes"]]))
    assert len(hits) == 50 and all(h["category"] == goal["category"] for h in hits[:10])
    assert shop.search("") == [] and shop.search("zzzz qqqq") == []


def test_pages_in_text_mode_with_bracketed_clickables(shop):
    status, html = route(shop, "/3/search?q=yoga+mat&page=2")
    page = page_from_html("/3/search?q=yoga+mat&page=2", html)
    lines = page.text.splitlines()
    assert status == 200 and lines[:4] == ["Instruction:", shop.goal(3)["instruction_text"], "[Back to Search]",
                                           "Page 2 (Total results: 50)"]
    assert lines[4] == "[< Prev] [Next >]" and page.kind == "search"
    asins = [c for c in page.clickables if c.upper() in shop.by_asin]
    assert len(asins) == 10 and f"[{asins[0].upper()}]" in lines
    status, html = route(shop, page.clickables[asins[0]])
    item = page_from_html(page.clickables[asins[0]], html)
    assert item.kind == "item" and {"buy now", "description", "features", "reviews", "< prev"} <= set(item.clickables)
    assert "[Buy Now]" in item.text.splitlines() and item.search_url is None
    assert route(shop, "/3/item/NOPE")[0] == 404 and route(shop, "/x")[0] == 404


def test_action_grammar():
    assert parse_webshop_action("search[red shoes]") == ("search", "red shoes")
    assert parse_webshop_action("Thought: the second.\nAction: click[B0ABC] ") == ("click", "B0ABC")
    assert parse_webshop_action("<answer>CLICK[< Prev]</answer>") == ("click", "< Prev")
    assert parse_webshop_action("click[a] then click[Next >]") == ("click", "Next >")
    for bad in ("buy it", "click[]", "search []", "click[\n]"):
        assert parse_webshop_action(bad) is None


# ------------------------------------------------------------------------------ the env, in a sandbox
@pytest.fixture(scope="module")
def env():
    env = gymnasium.make("rock/WebShop-v0", split="test").unwrapped
    yield env
    env.close()


def play(env, task_id, policy, max_turns=15):
    obs, info = env.reset(options={"task_id": task_id})
    reward, info = 0.0, {}
    for _ in range(max_turns):
        obs, reward, term, trunc, info = env.step(policy(env, obs))
        if term or trunc:
            break
    return reward, info


def test_the_shop_is_a_real_http_server_in_a_no_network_sandbox(env):
    env.reset(options={"task_id": 0})
    assert env.sandbox_spec.network is False
    check = ("import urllib.request as u; r = u.urlopen('http://127.0.0.1:3000/0/search?q=yoga+mat', timeout=10); "
             "print(r.status, r.headers['Content-Type'], r.read().decode().count('product-link'))")
    result = run_sync(env.sandbox.run(f'python3 -c "{check}"', timeout=60))
    assert result.stdout.split() == ["200", "text/html;", "charset=utf-8", "10"], result
    # the listener is the sandbox's own: its /proc shows a python3 shop bound to its loopback
    ps = run_sync(env.sandbox.run("ps -eo args", timeout=30)).stdout
    assert "webshop_site.server --port 3000" in ps


def test_expert_scores_on_held_out_tasks_and_a_random_agent_does_not(env):
    expert = [play(env, t, lambda e, o: e.expert_action()) for t in HELD_OUT]
    mean = float(np.mean([r for r, _ in expert]))
    assert mean >= 0.95, expert
    assert all(info["page"] == "done" for _, info in expert)

    rng = random.Random(0)

    def random_agent(e, obs):  # a random clickable, or a search of random catalogue words
        if e.page.search_url is not None:
            return f"search[{' '.join(rng.sample(obs.split(), 3))}]"
        return f"click[{rng.choice(list(e.page.clickables))}]"

    rand = [play(env, t, random_agent)[0] for t in HELD_OUT]
    assert float(np.mean(rand)) < 0.3 and float(np.mean(rand)) < mean - 0.6, rand


def test_invalid_actions_keep_the_page_with_a_format_penalty(env):
    obs, _ = env.reset(options={"task_id": 5})
    page = env.page.text
    for bad, why in (("I would buy it", "no search[...]"), ("click[Buy Now]", "not a clickable"),
                     ("click[Search]", "not a clickable")):
        obs, reward, term, trunc, info = env.step(bad)
        assert reward == env.format_penalty and not term and why in info["format_error"]
        assert obs.endswith(page) and env.page.text == page
    env.step("search[yoga mat]")
    _, reward, term, _, info = env.step("search[dog bed]")  # no search box on a results page
    assert reward == env.format_penalty and "no search box" in info["format_error"]


def test_snapshot_mid_episode_resumes_on_the_product_page(env):
    env.reset(options={"task_id": 11})
    while env.page.kind != "item":
        env.step(env.expert_action())
    product_page = env.page.text
    state = env.save_state()
    rest = []
    while True:
        obs, reward, term, *_ = env.step(env.expert_action())
        rest.append((obs, reward))
        if term:
            break
    assert rest[-1][1] == 1.0
    other = gymnasium.make("rock/WebShop-v0", split="test").unwrapped
    try:
        obs, info = other.reset(options={"state": state})
        assert info["resumed"] and info["task_id"] == 11 and obs == product_page and other.page.kind == "item"
        replay = []
        for _ in rest:
            obs, reward, term, *_ = other.step(other.expert_action())
            replay.append((obs, reward))
        assert replay == rest
    finally:
        other.close()


def test_seeded_resets_draw_training_tasks_and_ids_are_checked():
    env = WebShopEnv(num_train_tasks=100)
    try:
        env.reset(seed=4)
        first = env.task.id
        assert TEST_TASKS <= first < TEST_TASKS + 100 and env.split_of(first) == "train"
        env.reset(seed=4)
        assert env.task.id == first
        with pytest.raises(TypeError, match="int >= 0"):
            env.reset(options={"task_id": "3"})
        with pytest.raises(ValueError, match="int >= 0"):
            env.reset(options={"task_id": -1})
        env.reset(options={"task_id": np.int64(3)})
        assert env.task.id == 3 and type(env.task.id) is int
    finally:
        env.close()


def test_check_env(env):
    check_env(env, skip_render_check=True)


def test_64_envs_at_once_on_the_local_backend():
    from rockroll.gem import make_vec

    n = 64
    vec = make_vec("rock/WebShop-v0", n, split="test")
    try:
        ids = [TEST_TASKS - 1 - i for i in range(n)]
        obs, infos = vec.reset(options=[{"task_id": t} for t in ids])
        assert all("[Search]" in o for o in obs)
        assert len({env.sandbox.id for env in vec.envs}) == n  # 64 sandboxes, a server in each
        rewards = np.zeros(n)
        done = np.zeros(n, bool)
        for _ in range(12):
            actions = [env.expert_action() if not d else "click[Back to Search]" for env, d in zip(vec.envs, done)]
            _, r, term, trunc, _ = vec.step(actions)
            rewards = np.where(done, rewards, r)
            done |= term | trunc
            if done.all():
                break
        assert done.all() and rewards.mean() >= 0.95, rewards
    finally:
        vec.close()


def test_expert_makes_sft_data_through_the_sft_stages_protocol(tmp_path):
    """``rockroll sft``'s expert source plays WebShop with its expert: every episode buys, and
    the assistant's tokens are the expert's actions."""
    from rockroll.trainer.config import EnvConfig, load_config
    from rockroll.trainer.envs import make_env
    from rockroll.trainer.models import load_tokenizer
    from rockroll.trainer.rollout.manager import PromptTemplate
    from rockroll.trainer.rollout.sft_data import expert_examples

    spec = EnvConfig(id="rock/WebShop-v0", task_ids=[500, 501, 502])
    tok = load_tokenizer(load_config({"tokenizer": {"kind": "bpe"}}).tokenizer, [spec], tmp_path)
    template = PromptTemplate(tok, load_config({}).tokenizer)
    examples = expert_examples(spec, template, make_env, episodes=3, epsilon=0.0, seed=0, max_turns=15)
    assert [ex.success for ex in examples] == [True] * 3
    said = tok.decode([t for t, m in zip(examples[0].token_ids, examples[0].mask) if m])
    assert said.startswith("search[") and "click[Buy Now]" in said
    noisy = expert_examples(spec, template, make_env, episodes=3, epsilon=0.3, seed=1, max_turns=15)
    assert len(noisy) == 3


def test_gem_llm_makes_it_as_rock_webshop():
    import gem  # gem-llm (the test extra); rockroll registers its rock: ids on this import
    from rockroll.gem.gemllm_plugin import RockEnv

    env = gem.make("rock:WebShop-v0", split="test")
    try:
        assert isinstance(env, RockEnv)
        obs, _ = env.reset(seed=0)
        assert "[Search]" in obs and "Instruction:" in obs
        core = env.env.unwrapped
        reward = 0.0
        for _ in range(15):
            obs, reward, term, trunc, info = env.step(core.expert_action())
            if term or trunc:
                break
        assert term and reward == 1.0 and "Thank you for shopping" in obs
    finally:
        env.close()


def test_hub_package_ships_the_shop_with_its_database_built(tmp_path):
    """gem/webshop_site is the hub package: its code in the image, the catalogue's database
    built at build time, gymnasium.make('rock/webshop-v1') playing on that image."""
    from importlib import resources

    from rockroll.envhub.build import build
    from rockroll.envhub.publish import publish
    from rockroll.envhub.pull import pull
    from rockroll.envhub.store import HubStore
    from rockroll.registry.hub import register_hub
    from rockroll.sandbox import SandboxSpec, open_sandbox

    hub = f"file://{tmp_path / 'hub'}"
    with resources.as_file(resources.files("rockroll.gem") / "webshop_site") as folder:
        publish(build(folder, hub=hub).manifest, HubStore(hub))
    assert "rock/webshop-v1" in register_hub(hub)
    pull("webshop@1.0.0", hub=hub)  # the bare hub: ref below means this hub's env
    with open_sandbox(SandboxSpec(image="hub:webshop@1.0.0")) as sb:
        r = sb.run("cd /opt/webshop && ls webshop_site && python3 -c \"import sqlite3; "
                   "print(sqlite3.connect('shop.db').execute('select count(*) from products').fetchone()[0])\"")
        assert r.exit_code == 0 and {"server.py", "start.sh", "get.sh"} <= set(r.stdout.split()), r
        assert r.stdout.split()[-1] == "3000"
    env = gymnasium.make("rock/webshop-v1", split="test").unwrapped
    try:
        assert env.sandbox_spec.image == "hub:webshop@1.0.0"
        reward, info = play(env, 42, lambda e, o: e.expert_action())
        assert reward == 1.0 and env.sandbox.spec.image == "hub:webshop@1.0.0"
    finally:
        env.close()
