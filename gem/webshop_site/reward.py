"""WebShop's reward (``web_agent_site/engine/goal.py::get_reward``), standard library only.

The formula is WebShop's, term for term::

    reward = r_type * (attribute matches + option matches + r_price)
                    / (len(goal attributes) + len(goal options) + 1)

- ``r_type`` (:func:`type_reward`): 1.0 when the purchase's ``query`` equals the goal's, or
  two breadcrumb levels of ``product_category`` agree, or more than 0.2 of the goal title's
  nouns are in the purchase's title; else 0.5; then 0.1 when that noun share is under 0.1,
  and 0.0 when it is 0.
- attribute matches (:func:`attribute_reward`): a goal attribute matches when some
  attribute of the purchase scores over 85 in ``token_set_ratio``, else when it is a
  substring of the title, the bullet points or the description.
- option matches (:func:`option_reward`): each *purchased* option value (colours normalised
  with :func:`normalize_color`) matches when, for ``size``, it is one of the goal's values
  exactly, otherwise when it scores over 85 against one of them; failing that, when it is
  a substring of the title, bullet points or description.
- ``r_price``: the price paid is at most the goal's ``price_upper``.

Two of WebShop's tools are replaced, with the same role: thefuzz's ``token_set_ratio`` is
:func:`token_set_ratio` here (rapidfuzz's algorithm over an exact Indel similarity), and
spaCy's noun tagging of titles is the catalogue's own list of each title's nouns
(``product["nouns"]``: the generator knows which words are nouns).
"""

from __future__ import annotations

import re

from .catalog import COLOR_SET

__all__ = ["attribute_reward", "get_reward", "normalize_color", "option_reward", "token_set_ratio", "type_reward"]

EXACT_MATCH_OPTS = ["size"]  # WebShop's goal.py
_NON_ALNUM = re.compile(r"[^a-z0-9]+")


def normalize_color(value: str) -> str:
    """WebShop's ``normalize_color``: the first colour of :data:`COLOR_SET` found in
    ``value``, else ``value`` unchanged."""
    for color in COLOR_SET:
        if color in value:
            return color
    return value


def _process(text: str) -> str:
    # fuzz's default processing: lower case, anything not a letter or digit becomes a space
    return _NON_ALNUM.sub(" ", text.lower()).strip()


def _ratio(a: str, b: str) -> float:
    """rapidfuzz's ``fuzz.ratio``: 100 * (1 - Indel distance / (len(a) + len(b))), where the
    Indel distance is len(a) + len(b) - 2 * (longest common subsequence)."""
    if not a and not b:
        return 100.0
    prev = [0] * (len(b) + 1)
    for ca in a:
        cur = [0]
        for j, cb in enumerate(b):
            cur.append(prev[j] + 1 if ca == cb else max(prev[j + 1], cur[j]))
        prev = cur
    return 100.0 * 2 * prev[-1] / (len(a) + len(b))


def token_set_ratio(a: str, b: str) -> int:
    """thefuzz's ``fuzz.token_set_ratio`` (0..100): compare the shared words with each side's
    rest; 100 when the words of one side are all in the other."""
    ta, tb = set(_process(a).split()), set(_process(b).split())
    if not ta or not tb:
        return 0
    common = " ".join(sorted(ta & tb))
    diff_ab, diff_ba = " ".join(sorted(ta - tb)), " ".join(sorted(tb - ta))
    if common and (not diff_ab or not diff_ba):
        return 100
    ab = f"{common} {diff_ab}".strip()
    ba = f"{common} {diff_ba}".strip()
    scores = [_ratio(ab, ba)]
    if common:
        scores += [_ratio(common, ab), _ratio(common, ba)]
    return int(round(max(scores)))


def _in_text(value: str, product: dict) -> bool:
    return (value in product["Title"].lower() or value in " ".join(product["BulletPoints"]).lower()
            or value in product["Description"].lower())


def type_reward(product: dict, goal: dict) -> dict:
    """``r_type`` and what decided it (WebShop's ``get_type_reward``)."""
    query_match = product["query"] == goal["query"]
    bought = {x.strip() for x in product["product_category"].split("›")}
    wanted = {x.strip() for x in goal["product_category"].split("›")}
    category_match = len(bought & wanted) >= 2
    desired = goal["nouns"]
    title_score = 0.2 if not desired else len(set(product["nouns"]) & set(desired)) / len(desired)
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return {"r_type": r_type, "query_match": query_match, "category_match": category_match,
            "title_score": title_score}


def attribute_reward(product: dict, goal: dict) -> tuple[float, int]:
    """``(r_att, matches)``: the share of the goal's attributes the product has."""
    matches = 0
    for g_attr in goal["attributes"]:
        if any(token_set_ratio(p_attr, g_attr) > 85 for p_attr in product["Attributes"]) or _in_text(g_attr, product):
            matches += 1
    return matches / len(goal["attributes"]), matches


def option_reward(product: dict, goal_options: list[str], purchased: dict[str, str]) -> tuple[float | None, int]:
    """``(r_option, matches)``: how many purchased option values the goal asked for
    (``r_option`` None when the goal names no option)."""
    purchased = {k: normalize_color(v) for k, v in purchased.items()}
    goal_options = [normalize_color(o) for o in goal_options]
    matches = 0
    for key, value in purchased.items():
        if key.lower() in EXACT_MATCH_OPTS:
            matched = value in goal_options
        else:
            matched = any(token_set_ratio(g, value) > 85 for g in goal_options)
        if matched or _in_text(value, product):
            matches += 1
    return (matches / len(goal_options) if goal_options else None), matches


def get_reward(product: dict, goal: dict, price: float, options: dict[str, str]) -> tuple[float, dict]:
    """The reward of buying ``product`` at ``price`` with ``options`` selected, for ``goal``,
    and its terms (WebShop's ``verbose`` info)."""
    r_type = type_reward(product, goal)
    r_price = price <= goal["price_upper"]
    r_att, n_att = attribute_reward(product, goal)
    goal_options = list(goal["goal_options"].values())
    r_option, n_opt = option_reward(product, goal_options, options)
    denominator = len(goal["attributes"]) + len(goal_options) + 1
    total = (n_att + n_opt + r_price) / denominator * r_type["r_type"]
    info = {**r_type, "r_att": r_att, "w_att": len(goal["attributes"]) / denominator,
            "r_price": r_price, "w_price": 1 / denominator}
    if r_option is not None:
        info.update(r_option=r_option, w_option=len(goal_options) / denominator)
    return total, info
